"""What both NAS samplers share around their relative sampling (as Optuna's GA samplers share
``optuna.samplers._ga._base``): parameters outside the relative space, proposals for trials
that started before the study recorded its space, and the trial hooks."""

from __future__ import annotations

import abc
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_hpcnas._records import process_constraints_after_trial
from optuna_hpcnas.samplers._proposals import LateProposals


class ArchitectureSampler(BaseSampler, abc.ABC):
    """A sampler whose relative proposal is a whole architecture.

    Subclasses set ``_independent`` (the sampler of parameters outside the relative space),
    ``_late`` and ``_constraints_func``, and implement ``_late_proposal``.
    """

    _independent: BaseSampler
    _late: LateProposals
    _constraints_func: Callable[[FrozenTrial], Sequence[float]] | None

    @abc.abstractmethod
    def _late_proposal(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """A whole proposal for a trial that started before the study recorded its
        hierarchical space (see ``_proposals.LateProposals``); ``None`` without one."""

    def _check_independent(self, param_name: str, param_distribution: BaseDistribution) -> None:
        """Refuse a parameter the sampler cannot take (nothing by default)."""

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        self._check_independent(param_name, param_distribution)
        found, value = self._late.value(
            trial, param_name, param_distribution, lambda: self._late_proposal(study, trial)
        )
        if found:
            return value
        return self._independent.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._independent.before_trial(study, trial)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        if self._constraints_func is not None:
            process_constraints_after_trial(self._constraints_func, study, trial, state)
        self._late.forget(trial._trial_id)
        self._independent.after_trial(study, trial, state, values)
