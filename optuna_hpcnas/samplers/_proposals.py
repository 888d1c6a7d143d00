"""Reserving a proposal in the storage so that parallel workers do not evaluate it twice.

Both samplers read the study at the start of an ask and write their proposal at the end. Two
workers that ask at the same time would each miss the other's proposal, so a proposal is
*claimed* with a write-then-check protocol:

1. write the candidate to the trial system attribute ``hpcnas:samplers:proposal``;
2. read the trials that may have proposed since this ask's first read (those that were
   running then, and every trial created after this one) and take the next candidate if one
   of them stands for the same key.

Of two workers claiming one key, the later writer's check always sees the earlier write
(every Optuna storage reads its own and others' committed writes), so at least one of them
moves on. A trial that had finished before the first read is not read again: its key is among
the caller's ``seen`` keys, never written. So no two trials hold one key while the candidates
offer a free one, and the samplers end their candidates with every unseen one. The storage
needs no lock or compare-and-set, so this works on every Optuna storage.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
import itertools
import threading
from typing import Any
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas._records import rdb_backend

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

KeyFn = Callable[[dict[str, Any]], "Hashable | None"]
# Candidates looked at per ask: a bound on the cost of one claim. Only candidates another
# worker holds (or that were seen) are passed over, so it binds only when that many trials
# run at once or the space is as good as exhausted.
MAX_CANDIDATES = 256


def trial_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters a trial stands for: for a running trial, the proposal made for it (and
    any enqueued ``fixed_params``) under the parameters it has already suggested."""
    params = dict(trial.params)
    if trial.state in (TrialState.RUNNING, TrialState.WAITING):
        proposal = trial.system_attrs.get(_keys.SAMPLER_PROPOSAL)
        if isinstance(proposal, dict):
            params = {**proposal, **params}
        fixed = trial.system_attrs.get("fixed_params")
        if isinstance(fixed, dict):
            params = {**params, **fixed}
    return params


# Trials created after the asking one that a claim's check reads one at a time before it
# reads the study once instead (a run's budget queues all its trials up front).
_WALK = 8


def _recent_trials(
    storage: BaseStorage, study_id: int, trial: FrozenTrial, pending: Iterable[int]
) -> list[FrozenTrial]:
    """Trials that may have proposed since ``trial``'s first read: ``pending`` (trial ids that
    were running then) and every trial numbered after ``trial``.

    On an RDB storage one read of the study (its cache fetches only the unfinished and new
    rows; one trial read alone costs as many statements). Elsewhere the trials after
    ``trial`` one by one, usually none or a few created meanwhile, and one read of the study
    past ``_WALK`` of them, so an ask never costs a call per queued trial."""
    pending = list(pending)
    if rdb_backend(storage) is None:
        later: list[FrozenTrial] = []
        for number in range(trial.number + 1, trial.number + 1 + _WALK):
            try:
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            except KeyError:  # the walk ended: the pending ones are read alone too
                mine = trial._trial_id
                return [storage.get_trial(i) for i in pending if i != mine] + later
            later.append(storage.get_trial(trial_id))
    ids = set(pending)
    return [
        t
        for t in storage.get_all_trials(study_id, deepcopy=False)
        if t._trial_id != trial._trial_id and (t._trial_id in ids or t.number > trial.number)
    ]


def claim(
    storage: BaseStorage,
    study_id: int,
    trial: FrozenTrial,
    candidates: Iterable[dict[str, Any]],
    key_fn: KeyFn,
    pending: Iterable[int],
    seen: Callable[[Hashable], bool] | None = None,
) -> tuple[dict[str, Any], int]:
    """The first of ``candidates`` that was not ``seen`` at the first read and that no other
    trial holds, written to the storage, and the number of candidates passed over.

    ``seen`` tells the keys of the trials read before (finished ones are not read again, so
    only this check keeps their candidates out). Candidates seen, or known to be taken from an
    earlier check, are passed over without a write (a slow ask can find many of its best
    candidates taken by faster workers). Callers end ``candidates`` with every unseen one (or
    random draws where the space is too large to list), so a claim fails only when none of
    the first ``MAX_CANDIDATES`` is free: then the first candidate is kept, a duplicate.
    """
    pending = list(pending)
    first: dict[str, Any] | None = None
    taken: set[Any] = set()
    skipped = 0
    for params in itertools.islice(candidates, MAX_CANDIDATES):
        key = key_fn(params)
        if first is None:
            first = params
        if key is not None and (key in taken or (seen is not None and seen(key))):
            skipped += 1
            continue
        storage.set_trial_system_attr(trial._trial_id, _keys.SAMPLER_PROPOSAL, params)
        if key is None:
            return params, skipped
        recent = _recent_trials(storage, study_id, trial, pending)
        taken |= {key_fn(trial_params(t)) for t in recent}
        if key not in taken:
            return params, skipped
        skipped += 1
    if first is None:
        raise ValueError("claim() needs at least one candidate.")
    storage.set_trial_system_attr(trial._trial_id, _keys.SAMPLER_PROPOSAL, first)
    return first, skipped


class LateProposals:
    """Whole proposals for trials that started before the study recorded its search space.

    A sampler draws a trial's relative sample when the trial starts. A trial started before
    the first ``space.suggest`` recorded the ``HierarchicalSearchSpace`` has an empty relative
    search space, so its parameters would come one by one from the independent sampler,
    unclaimed: workers that start together could draw one architecture twice. Instead, the
    first such parameter asks the sampler for a whole proposal (claimed like any other) and
    the trial's later parameters are read from it. Owned by one sampler; thread-safe.
    """

    def __init__(self, keep: int = 1024) -> None:
        # Bounds the memory of trials asked and never told (after_trial forgets the others).
        self._keep = keep
        self._lock = threading.Lock()
        self._params: dict[int, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_keep": self._keep}  # a copy (another process) starts with no trial

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_keep"])  # type: ignore[misc]

    def record(self, trial_id: int, params: dict[str, Any]) -> None:
        """Remember ``params`` as the proposal of ``trial_id`` (its relative sample)."""
        with self._lock:
            self._params[trial_id] = params
            if len(self._params) > self._keep:
                del self._params[next(iter(self._params))]

    def value(
        self,
        trial: FrozenTrial,
        name: str,
        distribution: BaseDistribution,
        propose: Callable[[], dict[str, Any] | None],
    ) -> tuple[bool, Any]:
        """``(True, value)`` of ``name`` in the trial's proposal, made by ``propose()`` on the
        first call (``None``: nothing to propose, e.g. no recorded space); ``(False, None)``
        when the proposal has no valid value for ``name``."""
        with self._lock:
            params = self._params.get(trial._trial_id)
        if params is None:
            params = propose()
            if params is None:
                return False, None
            self.record(trial._trial_id, params)
        if name not in params:
            return False, None
        try:
            internal = distribution.to_internal_repr(params[name])
        except (ValueError, TypeError):
            return False, None
        if not distribution._contains(internal):
            return False, None
        return True, params[name]

    def forget(self, trial_id: int) -> None:
        with self._lock:
            self._params.pop(trial_id, None)
