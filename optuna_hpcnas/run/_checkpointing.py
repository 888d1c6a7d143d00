"""Supernet checkpoints of a run (``[checkpoints] enabled``): in the study's own database on
RDB storages, in ``[checkpoints] artifact_store`` (a directory) on the others.

Every group leader restores the newest valid checkpoint at start (then the warm-up is
skipped); world rank 0 owns the chain: it saves the supernet (weights, optimizer, RNG, step
and trial counters) every ``every_n_steps`` supernet steps, at the end, and at once on
SIGTERM/SIGUSR1, and closes a generation (top-k architecture states) every
``every_p_trials`` finished trials.
"""

from __future__ import annotations

import logging
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _records

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.checkpoints import CheckpointConfig
    from optuna_hpcnas.supernet import SupernetTrainer

_logger = logging.getLogger(__name__)


class SupernetCheckpoints:
    """The checkpoint wiring of one leader.

    Args:
        study: The run's study (its storage holds the artifacts).
        trainer: The supernet and its optimizer.
        config: ``[checkpoints]``.
        owner: Whether this leader writes (world rank 0) or only restores.
    """

    def __init__(
        self,
        study: optuna.Study,
        trainer: SupernetTrainer,
        config: CheckpointConfig,
        *,
        owner: bool,
    ) -> None:
        from optuna_hpcnas.checkpoints import CheckpointPolicy
        from optuna_hpcnas.storages import artifact_store_for

        self.study = study
        self.trainer = trainer
        self.config = config
        self.owner = owner
        # the study's own database on RDB storages, else [checkpoints] artifact_store
        store = artifact_store_for(study._storage, artifact_store=config.artifact_store)
        self.policy = CheckpointPolicy(
            study=study,
            artifact_store=store,
            architecture_state=self._architecture_state,
            config=config,
        )
        self.saved_step = 0
        self.bytes_written = 0

    def restore(self) -> bool:
        """Load the newest valid supernet checkpoint; whether there was one."""
        from optuna_hpcnas.checkpoints import restore_training_state

        latest = self.policy.supernet.load_latest()
        if latest is None:
            _logger.info("No supernet checkpoint in the study yet: starting from the warm-up.")
            return False
        meta = restore_training_state(latest, self.trainer.supernet, self.trainer.optimizer)
        self.trainer.steps = self.saved_step = int(meta.get("supernet_steps", latest.step))
        _logger.info(
            "Restored the supernet from checkpoint %s (step %d, %d trial(s) finished when saved).",
            latest.info.checkpoint_id,
            latest.step,
            int(meta.get("trials_finished", 0)),
        )
        return True

    def save(self) -> None:
        """Save the supernet now (the owner; also on SIGTERM/SIGUSR1)."""
        if not self.owner:
            return
        import optuna

        from optuna_hpcnas.checkpoints import training_state

        finished = len(
            self.study.get_trials(
                deepcopy=False,
                states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED),
            )
        )
        steps = self.trainer.steps
        tensors, metadata = training_state(
            self.trainer.supernet,
            self.trainer.optimizer,
            extra={"supernet_steps": steps, "trials_finished": finished},
        )
        info = self.policy.supernet.save(tensors, step=steps, metadata=metadata)
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
        if not self.owner:
            return
        if self.trainer.steps - self.saved_step >= self.config.every_n_steps:
            self.save()
        self.policy(self.study, self.study._storage.get_trial(trial_id))

    def finish(self) -> None:
        if self.owner and self.trainer.steps > self.saved_step:
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
