"""Policy benchmark: bytes stored over a real digits search, ours vs a torch.save per trial.

A weight-sharing search on sklearn digits with the real ``SuperNet`` (``digits-small`` space):
each trial suggests an architecture, trains the shared weights on that path for ``--steps``
SGD steps and reports validation accuracy. The usual practice (Ray Tune's per-trial
checkpointing, a hand-rolled Optuna callback) writes a full ``torch.save`` of model and
optimizer after every finished trial. Ours is ``CheckpointPolicy``: the supernet every N steps
as incremental Arrow checkpoints with a full one every K, plus the full state of the top-3
architectures every P finished trials. Both can resume the search from any trial boundary when
N equals the steps per trial; larger N trades resume granularity for bytes.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/checkpoint_policy.py --trials 60
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from typing import BinaryIO

from _checkpoint_common import DigitsSupernetTrainer
from _checkpoint_common import n_params
from _checkpoint_common import table
import optuna
import torch

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.checkpoints import CheckpointConfig
from optuna_hpcnas.checkpoints import CheckpointManager
from optuna_hpcnas.checkpoints import CheckpointPolicy
from optuna_hpcnas.checkpoints import RDBArtifactStore
from optuna_hpcnas.checkpoints import training_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--steps", type=int, default=20, help="SGD steps per trial")
    parser.add_argument("--p", type=int, default=10, help="top-3 states every P trials")
    parser.add_argument("--preset", default="digits-small")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    tmp = tempfile.mkdtemp()
    url = f"sqlite:///{os.path.join(tmp, 'study.db')}"
    space = HierarchicalSearchSpace.preset(args.preset)
    trainer = DigitsSupernetTrainer(space)
    study = optuna.create_study(
        storage=url, direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0)
    )
    store = RDBArtifactStore(url)
    s = args.steps
    # (label, N, K): N = steps per trial keeps per-trial resume granularity.
    variants = [
        ("N=1 trial, K=10", s, 10),
        ("N=1 trial, K=20", s, 20),
        ("N=2 trials, K=10", 2 * s, 10),
        ("N=5 trials, K=10", 5 * s, 10),
    ]
    managers = {
        label: CheckpointManager(
            study=study,
            artifact_store=store,
            namespace=f"supernet-{i}",
            config=CheckpointConfig(every_n_steps=n, full_every=k, keep_chains=2),
        )
        for i, (label, n, k) in enumerate(variants)
    }
    written = {label: 0 for label in managers}
    n_ckpt = {label: 0 for label in managers}

    def arch_state(trial: optuna.trial.FrozenTrial) -> dict[str, torch.Tensor]:
        return dict(trainer.net.subnet(space.from_params(trial.params)).state_dict())

    counting = CountingStore(store)
    policy = CheckpointPolicy(
        study=study,
        artifact_store=counting,
        architecture_state=arch_state,
        config=CheckpointConfig(every_p_trials=args.p, top_k=3),
        namespace="unused",
    )
    baseline_bytes = 0
    baseline_files = 0

    def torch_save_per_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal baseline_bytes, baseline_files
        buf = io.BytesIO()
        torch.save(trainer.torch_state(), buf)
        baseline_bytes += buf.tell()
        baseline_files += 1

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        for _ in range(s):
            trainer.train_step(arch)
            for label, manager in managers.items():
                if trainer.step % manager.config.every_n_steps == 0:
                    tensors, meta = training_state(
                        trainer.net, trainer.opt, extra={"step": trainer.step}
                    )
                    info = manager.save(tensors, step=trainer.step, metadata=meta)
                    written[label] += info.size
                    n_ckpt[label] += 1
        return trainer.accuracy(arch)

    t0 = time.perf_counter()
    study.optimize(objective, n_trials=args.trials, callbacks=[torch_save_per_trial, policy])
    elapsed = time.perf_counter() - t0

    top_bytes, top_saves = counting.bytes, counting.writes

    # Resume check: the newest checkpoint of each variant reproduces the live supernet.
    live = trainer.net.state_dict()
    for label, manager in managers.items():
        ckpt = CheckpointManager(
            study=study, artifact_store=store, namespace=manager.namespace
        ).load_latest()
        assert ckpt is not None
        state = ckpt.state()
        if ckpt.step == trainer.step:
            assert all(torch.equal(state["model." + k], v) for k, v in live.items()), label

    print(
        f"digits search: preset {args.preset}, supernet {n_params(trainer.net):,} parameters, "
        f"{args.trials} trials x {s} SGD steps, top-3 every {args.p} trials "
        f"({elapsed:.0f} s; best accuracy {study.best_value:.3f}); top-3 states: "
        f"{top_saves} saves, {top_bytes / 1e6:.2f} MB of each 'ours' row"
    )
    rows = [
        [
            "torch.save per finished trial",
            baseline_files,
            f"{baseline_bytes / 1e6:.2f}",
            "1.00",
            "-",
            f"{baseline_bytes / 1e6:.2f}",
        ]
    ]
    for label, manager in managers.items():
        total = written[label] + top_bytes
        retained = sum(i.size for i in manager.list_checkpoints()) + live_top_bytes(policy, study)
        rows.append(
            [
                f"ours: {label} + top-3",
                f"{n_ckpt[label]}+{top_saves}",
                f"{total / 1e6:.2f}",
                f"{total / baseline_bytes:.2f}",
                f"{100 * (1 - total / baseline_bytes):.0f}%",
                f"{retained / 1e6:.2f}",
            ]
        )
    print(
        table(
            rows,
            ["policy", "checkpoints", "MB written", "ratio", "saved", "MB kept at end"],
        )
    )


class CountingStore:
    """Counts the bytes written through an artifact store (removed blobs included)."""

    def __init__(self, inner: RDBArtifactStore) -> None:
        self.inner = inner
        self.bytes = 0
        self.writes = 0

    def open_reader(self, artifact_id: str) -> BinaryIO:
        return self.inner.open_reader(artifact_id)

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        data = content_body.read()
        self.bytes += len(data)
        self.writes += 1
        self.inner.write(artifact_id, io.BytesIO(data))

    def remove(self, artifact_id: str) -> None:
        self.inner.remove(artifact_id)


def live_top_bytes(policy: CheckpointPolicy, study: optuna.Study) -> int:
    return sum(
        i.size
        for t in study.trials
        for i in policy.architecture_manager(t.number).list_checkpoints()
    )


if __name__ == "__main__":
    main()
