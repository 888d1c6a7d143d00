"""Finished trials written into an Optuna journal in a few appends instead of one per key.

Optuna's ``JournalStorage`` writes every key of a trial (each parameter, each attribute, the
state) as its own log and reads the journal back after each: a dozen round trips a trial.
For a batch of trials scored elsewhere, ``JournalBatch`` writes the same logs, in the same
format ``JournalStorage`` writes them, in at most two appends:

* new trials: one ``CREATE_TRIAL`` log each (as ``create_new_trial(template_trial=...)``
  writes it), all in one append;
* budget trials (WAITING, queued without parameters): first one append of the claims (their
  state set to RUNNING, as ``set_trial_state_values`` claims a queued trial), then the
  journal read once from where this writer stood before it: the trials whose first claim
  after that point is this writer's are its own (the journal's replay gives a queued trial
  to the first claim it reads, as Optuna's does); then one append of their parameters,
  intermediate values, attributes and final states.

Every trial written carries ``claim`` in its system attributes, so a try whose answer was
lost is found on the next try and not written twice. With ``BatchedRedisBackend`` (what
``open_storage`` builds for ``redis://``) an append of any length is one round trip and
lands whole; a backend that appends log by log may land a prefix of a batch, and the next
try writes the rest.

Written by hand because Optuna has no call that writes several trials, or several keys of
one trial, at once; it relies on the journal's log format of the Optuna versions this
package supports (``optuna>=5,<6``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from datetime import timezone
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.storages import JournalStorage
    from optuna.trial import FrozenTrial


def journal_storage(storage: Any) -> JournalStorage | None:
    """``storage`` if it is Optuna's ``JournalStorage``, else ``None``."""
    from optuna.storages import JournalStorage

    return storage if isinstance(storage, JournalStorage) else None


def _now() -> str:
    return datetime.now(tz=timezone.utc).isoformat(timespec="microseconds")


def _utc(moment: datetime | None) -> str | None:
    return (
        None
        if moment is None
        else moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
    )


def _log(storage: JournalStorage, op: Any, **fields: Any) -> dict[str, Any]:
    """A log as ``JournalStorage`` writes it, from this thread's writer."""
    return {"op_code": op, "worker_id": storage._replay_result.worker_id, **fields}


def _attr_logs(
    storage: JournalStorage, trial_id: int, user: dict[str, Any], system: dict[str, Any]
) -> list[dict[str, Any]]:
    """The logs of ``set_trial_user_attr`` and ``set_trial_system_attr``, one a key."""
    from optuna.storages.journal._storage import JournalOperation

    return [
        _log(storage, JournalOperation.SET_TRIAL_USER_ATTR, trial_id=trial_id, user_attr={k: v})
        for k, v in user.items()
    ] + [
        _log(
            storage, JournalOperation.SET_TRIAL_SYSTEM_ATTR, trial_id=trial_id, system_attr={k: v}
        )
        for k, v in system.items()
    ]


def _sync_past_refusals(storage: JournalStorage) -> bool:
    """Read the journal up to its end; ``True`` when the replay refused a log of this writer
    (a trial another writer finished in between), which it skips as it skips another
    writer's."""
    from optuna.exceptions import UpdateFinishedTrialError

    refused = False
    while True:
        try:
            storage._sync_with_backend()
            return refused
        except UpdateFinishedTrialError:
            refused = True


def first_state_logs(storage: JournalStorage, start: int) -> dict[int, dict[str, Any]]:
    """Each trial's first state change in the journal from log ``start`` on (a claim, a
    finish, a give-back): the log, its writer's ``worker_id`` in it. The replay gives a
    queued trial to the first claim it reads, so a writer whose claim is a trial's first
    state change after a point where the trial was WAITING owns it, whichever of the
    process's threads read that claim first (a storage call: the journal is read from
    ``start``)."""
    from optuna.storages.journal._storage import JournalOperation

    first: dict[int, dict[str, Any]] = {}
    for log in storage._backend.read_logs(start):
        if log["op_code"] == JournalOperation.SET_TRIAL_STATE_VALUES:
            first.setdefault(log["trial_id"], log)
    return first


class JournalBatch:
    """One batch of finished trials for one journal storage (see the module docstring).

    Call ``new`` or ``budget``; call it again after a failure (a lost answer, a storage
    away): it goes on from what landed.

    Args:
        storage: The study's ``JournalStorage``.
        study_id: The study's id in it.
        trials: The finished trials, oldest first.
        system_attrs: Each trial's system attributes as written (``claim`` among them).
        claim: The batch's token, under ``claim_key`` in every trial's system attributes.
        claim_key: The system attribute that carries ``claim``.
    """

    def __init__(
        self,
        storage: JournalStorage,
        study_id: int,
        trials: Sequence[FrozenTrial],
        *,
        system_attrs: Sequence[dict[str, Any]],
        claim: str,
        claim_key: str,
    ) -> None:
        self._storage = storage
        self._study_id = study_id
        self._trials = list(trials)
        self._system = list(system_attrs)
        self._claim = claim
        self._claim_key = claim_key
        # budget trials: the journal position before the first claim (None until then),
        # this writer's id, the trials it tried to claim
        self._start: int | None = None
        self._worker: str | None = None
        self._targets: list[int] = []

    # ------------------------------------------------------------------ the journal
    def _append(self, logs: list[dict[str, Any]]) -> None:
        if logs:
            self._storage._backend.append_logs(logs)

    def _sync(self) -> None:
        _sync_past_refusals(self._storage)

    def _log(self, op: Any, **fields: Any) -> dict[str, Any]:
        return _log(self._storage, op, **fields)

    def _landed(self) -> list[FrozenTrial]:
        """This batch's trials in the journal (synced), in trial order."""
        trials = self._storage._replay_result.get_all_trials(self._study_id, states=None)
        return [t for t in trials if t.system_attrs.get(self._claim_key) == self._claim]

    # ------------------------------------------------------------------ new trials
    def new(self) -> list[int]:
        """Create every trial of the batch; their numbers."""
        from optuna.storages.journal._storage import JournalOperation

        with self._storage._thread_lock:
            self._sync()
            done = len(self._landed())  # a lost try's append: a prefix of the batch
            logs = [
                self._log(JournalOperation.CREATE_TRIAL, **self._create_fields(trial, system))
                for trial, system in zip(self._trials[done:], self._system[done:])
            ]
            self._append(logs)
            self._sync()
            return [t.number for t in self._landed()]

    def _create_fields(self, trial: FrozenTrial, system: dict[str, Any]) -> dict[str, Any]:
        """``create_new_trial(template_trial=trial)``'s log, ``system`` its system
        attributes."""
        from optuna.distributions import distribution_to_json

        values = trial.values
        several = values is not None and len(values) > 1
        fields: dict[str, Any] = {
            "study_id": self._study_id,
            "state": trial.state,
            "value": None if several else trial.value,
            "values": values if several else None,
            "datetime_start": _utc(trial.datetime_start),
            "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
            "params": {
                k: trial.distributions[k].to_internal_repr(v) for k, v in trial.params.items()
            },
            "user_attrs": trial.user_attrs,
            "system_attrs": system,
            "intermediate_values": trial.intermediate_values,
        }
        if trial.datetime_complete is not None:
            fields["datetime_complete"] = _utc(trial.datetime_complete)
        return fields

    # ------------------------------------------------------------------ budget trials
    def budget(self, targets: Sequence[int]) -> list[int]:
        """Fill budget trials among ``targets`` (WAITING when the caller read them, in
        trial order): claim as many as the batch has trials in one append, again for those
        another writer claimed first while untried targets are left (as the RDB path skips a
        row taken meanwhile), then write the batch into the won trials in one append; their
        numbers (the batch's tail is dropped when fewer were won)."""
        wanted = len(self._trials)
        with self._storage._thread_lock:
            self._sync()
            replay = self._storage._replay_result
            if self._start is None:
                self._start, self._worker = replay.log_number_read, replay.worker_id
            elif self._lost_claims():
                self._targets = []  # the claims' append failed before it landed
            won = self._won()
            while len(won) < wanted and self._claim_more(targets, wanted - len(won)):
                won = self._won()
                self._sync()
            self._fill(won)
            self._sync()
            return [replay.get_trial(t).number for t in won]

    def _claim_more(self, targets: Sequence[int], count: int) -> bool:
        """Claim ``count`` targets still WAITING and not tried yet, in one append; ``False``
        when none is left."""
        from optuna.storages.journal._storage import JournalOperation
        from optuna.trial import TrialState

        replay = self._storage._replay_result
        tried = set(self._targets)
        fresh = [
            t
            for t in targets
            if t not in tried and replay.get_trial(t).state == TrialState.WAITING
        ][:count]
        self._targets += fresh
        claims = [
            self._log(
                JournalOperation.SET_TRIAL_STATE_VALUES,
                trial_id=t,
                state=TrialState.RUNNING,
                values=None,
                datetime_start=_now(),
            )
            for t in fresh
        ]
        self._append(claims)
        return bool(fresh)

    def _first_claims(self) -> dict[int, str]:
        """Each target's first claim (or finish) after the start: its writer's id."""
        assert self._start is not None
        targets = set(self._targets)
        first = first_state_logs(self._storage, self._start)
        return {t: log["worker_id"] for t, log in first.items() if t in targets}

    def _won(self) -> list[int]:
        """The targets whose first claim is this writer's, in trial order."""
        first = self._first_claims()
        return sorted(t for t, worker in first.items() if worker == self._worker)

    def _lost_claims(self) -> bool:
        """Claims were appended and none of them is in the journal."""
        return bool(self._targets) and self._worker not in self._first_claims().values()

    def _fill(self, won: list[int]) -> None:
        """The batch's keys and states, into the won trials not finished yet, in one
        append."""
        from optuna.distributions import distribution_to_json
        from optuna.storages.journal._storage import JournalOperation

        replay = self._storage._replay_result
        logs: list[dict[str, Any]] = []
        for trial_id, trial, system in zip(won, self._trials, self._system):
            if replay.get_trial(trial_id).state.is_finished():
                continue  # a lost try's append landed
            for name, value in trial.params.items():
                distribution = trial.distributions[name]
                logs.append(
                    self._log(
                        JournalOperation.SET_TRIAL_PARAM,
                        trial_id=trial_id,
                        param_name=name,
                        param_value_internal=distribution.to_internal_repr(value),
                        distribution=distribution_to_json(distribution),
                    )
                )
            for step, value in trial.intermediate_values.items():
                logs.append(
                    self._log(
                        JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE,
                        trial_id=trial_id,
                        step=step,
                        intermediate_value=value,
                    )
                )
            logs += _attr_logs(self._storage, trial_id, trial.user_attrs, system)
            logs.append(
                self._log(
                    JournalOperation.SET_TRIAL_STATE_VALUES,
                    trial_id=trial_id,
                    state=trial.state,
                    values=trial.values,
                    datetime_complete=_utc(trial.datetime_complete) or _now(),
                )
            )
        self._append(logs)


def append_trial_attrs(
    storage: JournalStorage, trial_id: int, *, user: dict[str, Any], system: dict[str, Any]
) -> None:
    """Several user and system attributes of one trial in one append (the logs Optuna's
    ``set_trial_user_attr`` and ``set_trial_system_attr`` write, one a key) and one read.
    ``UpdateFinishedTrialError`` for a finished trial, as Optuna's calls raise it, with
    nothing written."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages.journal._storage import UNUPDATABLE_MSG

    if not user and not system:
        return
    with storage._thread_lock:
        storage._sync_with_backend()
        trial = storage._replay_result.get_trial(trial_id)
        finished = UpdateFinishedTrialError(UNUPDATABLE_MSG.format(trial_number=trial.number))
        if trial.state.is_finished():
            raise finished
        storage._backend.append_logs(_attr_logs(storage, trial_id, user, system))
        if _sync_past_refusals(storage):  # another writer finished the trial meanwhile
            raise finished
