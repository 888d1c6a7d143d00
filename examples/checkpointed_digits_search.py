"""A digits weight-sharing search that survives kill -9 and Slurm preemption.

Run it, stop it any way you like (Ctrl-C, ``kill -9``, ``scancel --signal=USR1``), run the same
command again: finished trials stay, the interrupted trial is retried, and the supernet, its
optimizer and the RNGs continue from the newest valid checkpoint in the same database.

    python examples/checkpointed_digits_search.py --storage sqlite:///nas.db --trials 40
"""

from __future__ import annotations

import argparse
from typing import Any

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
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.supernet import SuperNet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storage", default="sqlite:///nas.db")
    parser.add_argument("--trials", type=int, default=40, help="completed trials to reach")
    parser.add_argument("--steps", type=int, default=20, help="SGD steps per trial")
    args = parser.parse_args()

    config = CheckpointConfig(
        every_n_steps=args.steps, full_every=10, every_p_trials=10, heartbeat_interval=10
    )
    storage = heartbeat_storage(args.storage, config)
    study = optuna.create_study(
        study_name="digits-nas", storage=storage, direction="maximize", load_if_exists=True
    )
    store = RDBArtifactStore(storage)
    space = HierarchicalSearchSpace.preset("digits-small")
    data = load_digits_task(seed=0)
    x, y = data.train.tensors  # type: ignore[attr-defined]
    xv, yv = data.valid.tensors  # type: ignore[attr-defined]
    net = SuperNet(space, input_shape=data.input_shape, num_classes=data.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    batches = torch.Generator().manual_seed(0)
    policy = CheckpointPolicy(
        study=study,
        artifact_store=store,
        config=config,
        architecture_state=lambda t: net.subnet(space.from_params(t.params)).state_dict(),
    )

    step = 0
    latest = policy.supernet.load_latest()
    if latest is not None:
        step = restore_training_state(latest, net, opt, generators={"batches": batches})["step"]
        print(f"resumed from checkpoint {latest.info.checkpoint_id} (step {step})")

    def state() -> tuple[dict[str, Any], dict[str, Any]]:
        return training_state(net, opt, generators={"batches": batches}, extra={"step": step})

    def save_now() -> None:
        tensors, metadata = state()
        policy.supernet.save(tensors, step=step, metadata=metadata)

    with PreemptionGuard.from_config(config, checkpoint=save_now) as guard:

        def objective(trial: optuna.Trial) -> float:
            nonlocal step
            arch = space.suggest(trial)
            with guard.watch(trial):
                for _ in range(args.steps):
                    idx = torch.randint(0, len(x), (64,), generator=batches)
                    loss = torch.nn.functional.cross_entropy(net(x[idx], arch), y[idx])
                    opt.zero_grad(set_to_none=True)  # unsampled operators stay untouched
                    loss.backward()
                    opt.step()
                    step += 1
                    policy.on_step(step, state)
                    guard.check()
            net.eval()
            with torch.no_grad():
                accuracy = float((net(xv, arch).argmax(-1) == yv).float().mean())
            net.train()
            return accuracy

        done = optuna.study.MaxTrialsCallback(
            args.trials, states=(optuna.trial.TrialState.COMPLETE,)
        )
        study.optimize(objective, callbacks=[done, policy, guard])
    print(f"best accuracy {study.best_value:.3f} with {study.best_params}")


if __name__ == "__main__":
    main()
