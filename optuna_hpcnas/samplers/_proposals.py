"""Reserving a proposal in the storage so that parallel workers do not evaluate it twice.

Both samplers read the study at the start of an ask and write their proposal at the end. Two
workers that ask at the same time would each miss the other's proposal, so a proposal is
*claimed* with a write-then-check protocol:

1. write the candidate to the trial system attribute ``hpcnas:samplers:proposal``;
2. read the trials that may have proposed since this ask's first read (those that were
   running then, and every trial created after this one) and take the next candidate if one
   of them stands for the same key.

Of two workers claiming one key, the later writer's check always sees the earlier write, so
at least one of them moves on: no two trials hold the same claim while candidates last. The
storage needs no lock or compare-and-set, so this works on every Optuna storage.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from typing import Any
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from optuna_hpcnas import _keys

if TYPE_CHECKING:
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

KeyFn = Callable[[dict[str, Any]], "Hashable | None"]
# Writes (each followed by a few reads) and candidates looked at per ask.
MAX_ROUNDS = 8
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


def _recent_trials(
    storage: BaseStorage, study_id: int, trial: FrozenTrial, pending: Iterable[int]
) -> list[FrozenTrial]:
    """Trials that may have proposed since ``trial``'s first read: ``pending`` (trial ids that
    were running then) and every trial numbered after ``trial``."""
    out = [storage.get_trial(trial_id) for trial_id in pending if trial_id != trial._trial_id]
    number = trial.number + 1
    while True:  # a few trials at most: those created while this one was sampling
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        except KeyError:
            return out
        out.append(storage.get_trial(trial_id))
        number += 1


def claim(
    storage: BaseStorage,
    study_id: int,
    trial: FrozenTrial,
    candidates: Iterable[dict[str, Any]],
    key_fn: KeyFn,
    pending: Iterable[int],
) -> tuple[dict[str, Any], int]:
    """The first of ``candidates`` that no other trial claimed, written to the storage, and
    the number of candidates passed over. Callers pass candidates that were unseen at their
    first read. Candidates known to be taken from an earlier check are skipped without a
    write (a slow ask can find many of its best candidates taken by faster workers); after
    ``MAX_ROUNDS`` writes or ``MAX_CANDIDATES`` candidates, the last one written is kept."""
    pending = list(pending)
    chosen: dict[str, Any] | None = None
    taken: set[Any] = set()
    skipped = rounds = 0
    for k, params in enumerate(candidates):
        key = key_fn(params)
        if chosen is not None and key is not None and key in taken:
            skipped += 1
            if k + 1 >= MAX_CANDIDATES:
                break
            continue
        chosen = params
        storage.set_trial_system_attr(trial._trial_id, _keys.SAMPLER_PROPOSAL, params)
        if key is None:
            return params, skipped
        recent = _recent_trials(storage, study_id, trial, pending)
        taken |= {key_fn(trial_params(t)) for t in recent}
        if key not in taken:
            return params, skipped
        skipped += 1
        rounds += 1
        if rounds >= MAX_ROUNDS or k + 1 >= MAX_CANDIDATES:
            break
    if chosen is None:
        raise ValueError("claim() needs at least one candidate.")
    return chosen, skipped
