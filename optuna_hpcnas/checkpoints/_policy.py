"""What to checkpoint when, after the source articles.

* The supernet (weights, optimizer, RNG, sampler cursor) every ``N`` training steps, as an
  incremental chain with a full checkpoint every ``K``.
* Every ``P`` finished trials (a "generation"), the full state of the ``top_k`` best
  architectures so far, each in its own namespace ``arch-<trial number>``; architectures that
  fall out of the top are removed. The other trials keep only metadata: their parameters and
  values are in Optuna's trial table, and the generation record lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
import json
import logging
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas.checkpoints._config import CheckpointConfig
from optuna_hpcnas.checkpoints._manager import CheckpointInfo
from optuna_hpcnas.checkpoints._manager import CheckpointManager

if TYPE_CHECKING:
    import optuna
    from optuna.artifacts._protocol import ArtifactStore

_logger = logging.getLogger(__name__)

StateFn = Callable[[], tuple[Mapping[str, Any], Mapping[str, Any]]]
ArchitectureStateFn = Callable[["optuna.trial.FrozenTrial"], Mapping[str, Any]]


class CheckpointPolicy:
    """Supernet chain every N steps plus the top-k architectures every P finished trials.

    Pass it as an Optuna callback (``study.optimize(..., callbacks=[policy])``) and call
    :meth:`on_step` from the training loop.

    Args:
        study: The study.
        artifact_store: Where blobs go (an :class:`RDBArtifactStore` on the study's database).
        architecture_state: ``trial -> tensors`` of one architecture (for a weight-sharing
            supernet: the weights of that trial's path, taken when the generation closes).
            ``None`` stores metadata only.
        config: ``every_n_steps``, ``every_p_trials``, ``top_k``, chain and retention settings.
        namespace: Namespace of the supernet chain.
    """

    def __init__(
        self,
        *,
        study: optuna.Study,
        artifact_store: ArtifactStore,
        architecture_state: ArchitectureStateFn | None = None,
        config: CheckpointConfig | None = None,
        namespace: str = "supernet",
    ) -> None:
        if architecture_state is not None and not callable(architecture_state):
            raise TypeError(
                f"`architecture_state` is {architecture_state!r}, but must be callable or None."
            )
        self._config = config or CheckpointConfig()
        self._study = study
        self._store = artifact_store
        self._architecture_state = architecture_state
        self.supernet = CheckpointManager(
            study=study, artifact_store=artifact_store, namespace=namespace, config=self._config
        )

    def on_step(self, step: int, state_fn: StateFn) -> CheckpointInfo | None:
        """Save the supernet if ``step`` is a multiple of ``every_n_steps``."""
        return self.supernet.maybe_save(step, state_fn)

    def architecture_manager(self, trial_number: int) -> CheckpointManager:
        """The manager holding the full state of one architecture (trial)."""
        return CheckpointManager(
            study=self._study,
            artifact_store=self._store,
            namespace=f"arch-{trial_number}",
            config=self._config,
        )

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: closes a generation every ``every_p_trials`` finished trials."""
        import optuna

        finished = study.get_trials(
            deepcopy=False,
            states=(
                optuna.trial.TrialState.COMPLETE,
                optuna.trial.TrialState.PRUNED,
                optuna.trial.TrialState.FAIL,
            ),
        )
        if not finished or len(finished) % self._config.every_p_trials != 0:
            return
        self.close_generation(study, len(finished) // self._config.every_p_trials, finished)

    def top_trials(self, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
        """The ``top_k`` best complete trials (Pareto front, by number, if multi-objective)."""
        import optuna

        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if not complete:
            return []
        if len(study.directions) > 1:
            return sorted(study.best_trials, key=lambda t: t.number)[: self._config.top_k]
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0
        ranked = sorted(complete, key=lambda t: (sign * float(t.value), t.number))  # type: ignore[arg-type]
        return ranked[: self._config.top_k]

    def close_generation(
        self,
        study: optuna.Study,
        generation: int,
        finished: list[optuna.trial.FrozenTrial],
    ) -> dict[str, Any]:
        """Store the top-k states and the generation record; returns the record."""
        top = self.top_trials(study)
        top_numbers = [t.number for t in top]
        saved: dict[str, str] = {}
        if self._architecture_state is not None:
            for t in top:
                manager = self.architecture_manager(t.number)
                existing = manager.list_checkpoints()
                if existing:
                    saved[str(t.number)] = existing[-1].checkpoint_id
                    continue
                info = manager.save(
                    self._architecture_state(t),
                    step=t.number,
                    full=True,
                    metadata={"trial": t.number, "params": t.params, "values": t.values},
                )
                saved[str(t.number)] = info.checkpoint_id
            self._drop_fallen(study, set(top_numbers))
        record = {
            "generation": generation,
            "n_finished": len(finished),
            "top": top_numbers,
            "top_checkpoints": saved,
            "others": sorted(t.number for t in finished if t.number not in top_numbers),
        }
        study._storage.set_study_system_attr(
            study._study_id,
            f"{_keys.CHECKPOINT_GENERATION_PREFIX}{generation:06d}",
            json.dumps(record),
        )
        _logger.info("Generation %d closed; top trials %s.", generation, top_numbers)
        return record

    def _drop_fallen(self, study: optuna.Study, keep: set[int]) -> None:
        prefix = f"{_keys.CHECKPOINT_MANIFEST_PREFIX}arch-"
        stored: set[int] = set()
        for key, value in study._storage.get_study_system_attrs(study._study_id).items():
            if key.startswith(prefix) and value not in (None, "null"):
                stored.add(int(key[len(prefix) :].split(":", 1)[0]))
        for number in sorted(stored - keep):
            self.architecture_manager(number).remove_all()
