"""Supernet checkpoints of a run (``[checkpoints] enabled``): in the study's own database on
RDB storages, in ``[checkpoints] artifact_store`` (a directory) on the others.

Every group leader owns a chain of its own (namespace ``supernet`` for group 0,
``supernet-g<i>`` for group ``i``): it saves its supernet and optimizer state (weights,
optimizer, RNG, step and trial counters) after the warm-up, every ``every_n_steps`` supernet
steps, at the end and at once on SIGTERM/SIGUSR1, and restores the newest valid checkpoint of
its own chain at start (group 0's when its own has none, e.g. after the number of groups
changed), then skips the warm-up. World rank 0 also closes a generation (top-k architecture
states) every ``every_p_trials`` finished trials. Every read and write goes through the
leader's ``StudyCalls``.
"""

from __future__ import annotations

import logging
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _records

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.checkpoints import Checkpoint
    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.run._calls import StudyCalls
    from optuna_hpcnas.supernet import SupernetTrainer

_logger = logging.getLogger(__name__)


class SupernetCheckpoints:
    """The checkpoint wiring of one leader.

    Args:
        calls: The leader's storage calls (its study's storage holds the artifacts).
        trainer: The supernet and its optimizer.
        config: ``[checkpoints]``.
        group: Index of this leader's evaluation group (its chain's namespace).
        generations: Whether this leader closes the generations (world rank 0).
    """

    def __init__(
        self,
        calls: StudyCalls,
        trainer: SupernetTrainer,
        config: CheckpointConfig,
        *,
        group: int = 0,
        generations: bool = True,
    ) -> None:
        from optuna_hpcnas.checkpoints import CheckpointPolicy
        from optuna_hpcnas.storages import artifact_store_for

        study = calls.study
        self.calls = calls
        self.study = study
        self.trainer = trainer
        self.config = config
        self.generations = generations
        self.namespace = chain_namespace(group)
        # the study's own database on RDB storages, else [checkpoints] artifact_store
        store = artifact_store_for(study._storage, artifact_store=config.artifact_store)
        self.policy = CheckpointPolicy(
            study=study,
            artifact_store=store,
            architecture_state=self._architecture_state,
            config=config,
            namespace=self.namespace,
        )
        self._first_chain = CheckpointPolicy(
            study=study, artifact_store=store, config=config, namespace=chain_namespace(0)
        ).supernet
        self.saved_step = 0
        self.bytes_written = 0

    def restore(self) -> bool:
        """Load the newest valid supernet checkpoint; whether there was one."""
        from optuna_hpcnas.checkpoints import restore_training_state
        from optuna_hpcnas.supernet import FewShotSuperNet

        def apply(checkpoint: Checkpoint) -> None:
            steps = supernet_steps(checkpoint)  # checked before anything is restored
            few_shot = str(checkpoint.metadata.get("few_shot", ""))
            if few_shot and not isinstance(self.trainer.supernet, FewShotSuperNet):
                self.trainer.split_on(few_shot)  # the parts first, then their weights
            meta = restore_training_state(
                checkpoint, self.trainer.supernet, self.trainer.optimizer
            )
            self.trainer.steps = self.saved_step = steps
            restored.append(meta)

        restored: list[dict[str, Any]] = []
        latest = self.calls.checkpoint(self.policy.supernet.load_latest, accept=apply)
        if latest is None and self.namespace != chain_namespace(0):
            # another number of groups than before
            latest = self.calls.checkpoint(self._first_chain.load_latest, accept=apply)
        if latest is None:
            _logger.info("No supernet checkpoint in the study yet: starting from the warm-up.")
            return False
        meta = restored[-1]
        _logger.info(
            "Restored the supernet from checkpoint %s (step %d, %d trial(s) finished when saved).",
            latest.info.checkpoint_id,
            latest.step,
            int(meta.get("trials_finished", 0)),
        )
        return True

    def save(self) -> None:
        """Save this leader's supernet now (also on SIGTERM/SIGUSR1)."""
        import optuna

        from optuna_hpcnas.checkpoints import training_state

        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        finished = len(self.calls.checkpoint(self.study.get_trials, deepcopy=False, states=states))
        steps = self.trainer.steps
        tensors, metadata = training_state(
            self.trainer.supernet,
            self.trainer.optimizer,
            extra={
                "supernet_steps": steps,
                "trials_finished": finished,
                "few_shot": getattr(self.trainer.supernet, "decision", ""),
            },
        )
        info = self.calls.checkpoint(
            self.policy.supernet.save, tensors, step=steps, metadata=metadata
        )
        self.saved_step = steps
        self.bytes_written += info.size
        _logger.info(
            "Saved supernet checkpoint %s (step %d, %s, %d bytes).",
            info.checkpoint_id,
            info.step,
            info.kind,
            info.size,
        )

    def after_trial(self, trial_id: int) -> None:
        """Every ``every_n_steps`` steps a supernet checkpoint; the policy's generations."""
        if self.trainer.steps - self.saved_step >= self.config.every_n_steps:
            self.save()
        if self.generations:
            trial = self.calls.checkpoint(self.study._storage.get_trial, trial_id)
            self.calls.checkpoint(self.policy, self.study, trial)

    def finish(self) -> None:
        if self.trainer.steps > self.saved_step:
            self.save()  # the last trials' steps

    def _architecture_state(self, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        """The inherited weights of one trial's path (the top-k states of a generation)."""
        arch = _records.architecture_of(trial.user_attrs)
        if arch is None:
            return {}
        layers = self.trainer.supernet.layers(arch)
        return {
            f"layer{i}.{k}": v.detach().cpu()
            for i, layer in enumerate(layers)
            for k, v in layer.state_dict().items()
        }


def supernet_steps(checkpoint: Checkpoint) -> int:
    """The supernet's optimizer steps a checkpoint records (its manifest's step if its
    metadata has none); :class:`CheckpointError` when that is not a count."""
    from optuna_hpcnas.checkpoints import CheckpointError

    steps = checkpoint.metadata.get("supernet_steps", checkpoint.step)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= 10**12:
        raise CheckpointError(
            f"checkpoint {checkpoint.info.checkpoint_id!r} records supernet_steps = "
            f"{steps!r}, not a step count"
        )
    return steps


def chain_namespace(group: int) -> str:
    """The checkpoint namespace of a group's supernet chain (``supernet`` for group 0, the
    one ``hpcnas export --finetune`` reads)."""
    return "supernet" if group == 0 else f"supernet-g{group}"
