"""Subprocess workers for the fault tests (run as ``python -m tests.checkpoints_tests._worker``).

Each mode is a small, real program: a weight-sharing search on sklearn digits with heartbeats,
checkpoints and a preemption guard; a checkpoint writer that can be frozen half-way through a
blob; a concurrent writer. The parent test kills or signals it and inspects the database.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path
import sys
import time
from typing import Any
from typing import BinaryIO

import numpy as np


def _touch(path: str, text: str = "") -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def digits() -> tuple[Any, Any, Any, Any]:
    """sklearn's digits as (N, 1, 8, 8), read from the file sklearn ships (importing sklearn
    costs seconds per worker on a loaded machine)."""
    import importlib.util

    import torch

    spec = importlib.util.find_spec("sklearn")
    assert spec is not None and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x = torch.from_numpy((data[:, :-1] - 4.88) / 6.0).reshape(-1, 1, 8, 8)
    y = torch.from_numpy(data[:, -1].astype(np.int64))
    return x[:1400], y[:1400], x[1400:], y[1400:]


def search(args: argparse.Namespace) -> None:
    """A digits search worker: resume, train paths, checkpoint, obey signals."""
    import optuna
    import torch

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.checkpoints import CheckpointPolicy
    from optuna_hpcnas.checkpoints import heartbeat_storage
    from optuna_hpcnas.checkpoints import PreemptionGuard
    from optuna_hpcnas.checkpoints import RDBArtifactStore
    from optuna_hpcnas.checkpoints import restore_training_state
    from optuna_hpcnas.checkpoints import training_state

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = CheckpointConfig(
        every_n_steps=4,
        full_every=3,
        every_p_trials=3,
        heartbeat_interval=1,
        grace_period=2,
        exit_deadline=args.deadline,
    )
    storage = heartbeat_storage(args.url, config)
    study = optuna.create_study(
        study_name="faults",
        storage=storage,
        load_if_exists=True,
        sampler=optuna.samplers.RandomSampler(seed=os.getpid()),
    )
    store = RDBArtifactStore(storage)
    from optuna_hpcnas.supernet import SuperNet

    space = HierarchicalSearchSpace.preset("digits-small")
    model = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=0)
    # Plain SGD with momentum by hand: torch.optim's first step imports torch._dynamo (seconds).
    momentum = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    xtr, ytr, xva, yva = digits()
    gen = torch.Generator().manual_seed(1)
    step = 0

    def path_weights(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return dict(model.subnet(space.from_params(trial.params)).state_dict())

    policy = CheckpointPolicy(
        study=study, artifact_store=store, architecture_state=path_weights, config=config
    )

    def state(reason: str) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, meta = training_state(
            model, generators={"data": gen}, extra={"step": step, "reason": reason}
        )
        tensors.update({f"momentum.{k}": v for k, v in momentum.items()})
        return tensors, meta

    latest = policy.supernet.load_latest()
    resumed_from = None
    if latest is not None:
        meta = restore_training_state(latest, model, generators={"data": gen})
        saved = latest.state()
        for k, v in momentum.items():
            v.copy_(saved[f"momentum.{k}"])
        step = int(meta["step"])
        resumed_from = latest.info.checkpoint_id
    with open(args.log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "resumed_step": step, "id": resumed_from}) + "\n")

    def save_now() -> None:
        tensors, meta = state(guard.received.name if guard.received else "signal")
        policy.supernet.save(tensors, step=step, metadata=meta)

    with PreemptionGuard.from_config(config, checkpoint=save_now) as guard:

        def objective(trial: optuna.Trial) -> float:
            nonlocal step
            arch = space.suggest(trial)
            with guard.watch(trial):
                for i in range(args.steps):
                    idx = torch.randint(0, len(xtr), (64,), generator=gen)
                    loss = torch.nn.functional.cross_entropy(model(xtr[idx], arch), ytr[idx])
                    model.zero_grad(set_to_none=True)
                    loss.backward()
                    with torch.no_grad():
                        for k, p in model.named_parameters():
                            if p.grad is not None:  # only the sampled path has gradients
                                momentum[k].mul_(0.9).add_(p.grad)
                                p.sub_(0.05 * momentum[k])
                    step += 1
                    policy.on_step(step, lambda: state("periodic"))
                    if trial.number == args.stop_at and i == args.steps // 2:
                        _touch(args.marker, json.dumps({"trial": trial.number, "step": step}))
                        if args.block:
                            time.sleep(600)  # never reaches a step boundary again
                        while True:  # keeps stepping until a signal arrives
                            time.sleep(0.02)
                            guard.check()
                    guard.check()
            with torch.no_grad():
                return float((model(xva, arch).argmax(-1) == yva).float().mean())

        study.optimize(
            objective,
            callbacks=[
                optuna.study.MaxTrialsCallback(
                    args.n_trials, states=(optuna.trial.TrialState.COMPLETE,)
                ),
                policy,
                guard,
            ],
        )


def stuck(args: argparse.Namespace) -> None:
    """A worker whose trial never reaches a step boundary (no torch: starts fast)."""
    import optuna

    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.checkpoints import heartbeat_storage
    from optuna_hpcnas.checkpoints import PreemptionGuard

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = CheckpointConfig(heartbeat_interval=1, grace_period=2, exit_deadline=args.deadline)
    study = optuna.create_study(study_name="faults", storage=heartbeat_storage(args.url, config))
    held = Path(args.marker).with_suffix(".held")  # what before_exit writes
    with PreemptionGuard.from_config(
        config, before_exit=lambda: held.write_text("written")
    ) as guard:

        def objective(trial: optuna.Trial) -> float:
            trial.suggest_int("x", 0, 100)
            with guard.watch(trial):
                _touch(args.marker, "{}")
                time.sleep(600)
            return 0.0

        study.optimize(objective, n_trials=1)


class _FreezingReader(io.RawIOBase):
    """Hands the store its bytes, then freezes once ``freeze_after`` bytes were read."""

    def __init__(self, inner: BinaryIO, freeze_after: int, marker: str) -> None:
        self._inner = inner
        self._left = freeze_after
        self._marker = marker

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self._left <= 0:
            _touch(self._marker, "frozen")
            time.sleep(600)
        data = self._inner.read(n)
        self._left -= len(data)
        return data


def write_then_freeze(args: argparse.Namespace) -> None:
    """Save one checkpoint, then freeze in the middle of writing the second one's blob."""
    import optuna

    from optuna_hpcnas.checkpoints import CheckpointManager
    from optuna_hpcnas.checkpoints import RDBArtifactStore

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="write", storage=args.url, load_if_exists=True)
    store = RDBArtifactStore(args.url, chunk_bytes=4096)
    manager = CheckpointManager(study=study, artifact_store=store)
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal(50_000).astype(np.float32)}
    manager.save(state, step=1)

    class Freezing:
        def open_reader(self, artifact_id: str) -> BinaryIO:
            return store.open_reader(artifact_id)

        def write(self, artifact_id: str, body: BinaryIO) -> None:
            store.write(artifact_id, _FreezingReader(body, 3 * 4096, args.marker))  # type: ignore[arg-type]

        def remove(self, artifact_id: str) -> None:
            store.remove(artifact_id)

    manager._store = Freezing()
    state["w"] = state["w"] + 1.0
    manager.save(state, step=2)


def expected_state(worker: int, step: int) -> dict[str, np.ndarray]:
    """Deterministic state of ``worker`` at ``step``: tensor ``t<k>`` changes every k+1 steps."""
    out = {}
    for k in range(4):
        version = step // (k + 1)
        rng = np.random.default_rng(1000 * worker + 10 * k + version)
        out[f"t{k}"] = rng.standard_normal(20_000 + 1000 * k).astype(np.float32)
    out["count"] = np.array([step], dtype=np.int64)
    return out


def concurrent_writer(args: argparse.Namespace) -> None:
    """One of several processes writing its own chain into the same study at once."""
    import optuna

    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.checkpoints import CheckpointManager
    from optuna_hpcnas.checkpoints import RDBArtifactStore

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(
        args.url, engine_kwargs={"connect_args": {"timeout": 60}} if "sqlite" in args.url else {}
    )
    study = optuna.load_study(study_name="concurrent", storage=storage)
    store = RDBArtifactStore(storage, chunk_bytes=16 * 1024)
    manager = CheckpointManager(
        study=study,
        artifact_store=store,
        namespace=f"worker-{args.worker}",
        config=CheckpointConfig(full_every=3, keep_chains=10),
    )
    while not Path(args.marker).exists():  # start together
        time.sleep(0.01)
    for step in range(1, args.steps + 1):
        manager.save(expected_state(args.worker, step), step=step)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode", choices=["search", "stuck", "write_then_freeze", "concurrent_writer"]
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--marker", default="")
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--n-trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stop-at", type=int, default=-1)
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--deadline", type=float, default=25.0)
    parser.add_argument("--worker", type=int, default=0)
    args = parser.parse_args(argv)
    {
        "search": search,
        "stuck": stuck,
        "write_then_freeze": write_then_freeze,
        "concurrent_writer": concurrent_writer,
    }[args.mode](args)


if __name__ == "__main__":
    main(sys.argv[1:])
