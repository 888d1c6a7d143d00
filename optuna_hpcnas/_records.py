"""What this package reads and writes in an Optuna storage, beyond Optuna's own calls.

One module for the trial records (the architecture of a trial, read back whoever wrote it),
the run records (the trial budget, the data a run searched on, per-rank utilisation) and every
call into Optuna's private API, so an Optuna upgrade touches this file only. The key names
themselves are in ``optuna_hpcnas._keys``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
import datetime
import json
import time
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas._journal_batch import append_trial_attrs
from optuna_hpcnas._journal_batch import journal_storage
from optuna_hpcnas._journal_batch import JournalBatch
from optuna_hpcnas._process import this_process
from optuna_hpcnas.search_space import Architecture

if TYPE_CHECKING:
    import numpy as np
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.search_space import HierarchicalSearchSpace

# Optuna's prefix of artifact records in study/trial system attributes (optuna.artifacts).
OPTUNA_ARTIFACTS_PREFIX = "artifacts:"


# ---------------------------------------------------------------------------- trial records
def record_architecture(trial: optuna.Trial, arch: Architecture) -> None:
    """Store ``arch`` in the trial's user attributes (JSON and a one-line description)."""
    user = {
        _keys.OBJECTIVE_ARCH: arch.to_json(),
        _keys.OBJECTIVE_ARCH_DESCRIPTION: arch.describe(),
    }
    set_trial_attrs(trial, user=user, system={})


def architecture_of(user_attrs: Mapping[str, Any]) -> Architecture | None:
    """The ``Architecture`` stored in ``user_attrs`` (``arch`` JSON, or the dict of older
    runs under ``architecture``), or ``None``."""
    for key in (_keys.OBJECTIVE_ARCH, "architecture"):
        value = user_attrs.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue  # a description, not JSON
        if isinstance(value, dict):
            try:
                return Architecture.from_dict(value)
            except ValueError:
                continue
    return None


def summary_of(user_attrs: Mapping[str, Any]) -> str | None:
    """A one-line description (``Architecture.describe()``) from ``user_attrs``, or ``None``."""
    text = user_attrs.get(_keys.OBJECTIVE_ARCH_DESCRIPTION)
    if isinstance(text, str):
        return text
    legacy = user_attrs.get("architecture")
    if isinstance(legacy, str) and not legacy.lstrip().startswith("{"):
        return legacy
    arch = architecture_of(user_attrs)
    return arch.describe() if arch is not None else None


def finished_architectures(study: optuna.Study, size: int) -> list[Architecture]:
    """The architectures of the last ``size`` complete trials of ``study``."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        arch = architecture_of(t.user_attrs)
        if arch is not None:
            out.append(arch)
    return out[-size:]


def set_trial_system_attr(trial: optuna.Trial, key: str, value: Any) -> None:
    trial.storage.set_trial_system_attr(trial._trial_id, key, value)


def set_trial_attrs(
    trial: optuna.Trial, *, user: Mapping[str, Any], system: Mapping[str, Any]
) -> None:
    """Several user and system attributes of ``trial``: one transaction on an RDB storage
    (Optuna commits each ``set_trial_*_attr`` on its own, about ten commits per trial on a
    SQLite file), one append on a journal, one call per key on the others."""
    _set_attrs(trial.storage, trial._trial_id, user=user, system=system)
    cached = getattr(trial, "_cached_frozen_trial", None)  # what ``trial.user_attrs`` reads
    if cached is not None:
        cached.user_attrs.update(user)
        cached.system_attrs.update(system)


def set_trial_system_attrs(storage: Any, trial_id: int, system: Mapping[str, Any]) -> None:
    """Several system attributes of trial ``trial_id``: one transaction on an RDB storage (a
    pruner's verdict writes two or three at once, on the trial's critical path)."""
    _set_attrs(storage, trial_id, user={}, system=system)


def _set_attrs(
    storage: Any, trial_id: int, *, user: Mapping[str, Any], system: Mapping[str, Any]
) -> None:
    rdb = rdb_backend(storage)
    journal = journal_storage(storage)
    if journal is not None:
        append_trial_attrs(journal, trial_id, user=dict(user), system=dict(system))
        return
    if rdb is None:
        for key, value in user.items():
            storage.set_trial_user_attr(trial_id, key, value)
        for key, value in system.items():
            storage.set_trial_system_attr(trial_id, key, value)
        return
    _write_trial_rows(rdb, trial_id, user=user, system=system)


def _write_trial_rows(
    rdb: Any,
    trial_id: int,
    *,
    params: Sequence[tuple[str, float, Any]] = (),
    known: Mapping[str, Any] | None = None,
    user: Mapping[str, Any],
    system: Mapping[str, Any],
) -> None:
    """Parameters and attributes of one trial in one transaction: one read of the trial (is it
    still running?) and one multi-row upsert per attribute table, where Optuna's
    ``_set_trial_param_without_commit`` and ``_set_trial_attr_without_commit`` read the trial
    again for every key (two statements each: a dozen round trips per ask and per tell).

    Written by hand because Optuna has no multi-row form; the upserts are Optuna's own
    (``ON CONFLICT`` on SQLite and PostgreSQL, ``ON DUPLICATE KEY`` on MySQL) with a list of
    rows, and any other database takes Optuna's path key by key. ``known`` is the study's
    distribution of each parameter name already seen (Optuna's cache); the others are read
    and checked for compatibility as Optuna does.
    """
    from optuna import distributions
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    known = known or {}
    with _create_scoped_session(rdb.scoped_session, True) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
        rdb.check_trial_is_updatable(trial_id, trial.state)
        for name, value, distribution in params:
            previous = known.get(name)
            if previous is None:
                record = (
                    session.query(models.TrialParamModel.distribution_json)
                    .join(models.TrialModel)
                    .filter(models.TrialModel.study_id == trial.study_id)
                    .filter(models.TrialParamModel.param_name == name)
                    .first()
                )
                if record is not None:
                    previous = distributions.json_to_distribution(record[0])
            if previous is not None:
                distributions.check_distribution_compatibility(previous, distribution)
            session.add(
                models.TrialParamModel(
                    trial_id=trial_id,
                    param_name=name,
                    param_value=value,
                    distribution_json=distributions.distribution_to_json(distribution),
                )
            )
        for model, attrs in (
            (models.TrialUserAttributeModel, user),
            (models.TrialSystemAttributeModel, system),
        ):
            if attrs:
                _upsert_attrs(rdb, session, model, trial_id, attrs)


def _upsert_attrs(
    rdb: Any, session: Any, model: Any, trial_id: int, attrs: Mapping[str, Any]
) -> None:
    """``attrs`` of one trial in one statement (``_write_trial_rows``)."""
    _upsert_attr_rows(rdb, session, model, [(trial_id, k, v) for k, v in attrs.items()])


def _upsert_attr_rows(
    rdb: Any, session: Any, model: Any, attrs: Sequence[tuple[int, str, Any]]
) -> None:
    """``(trial_id, key, value)`` attributes of one or several trials in one statement."""
    import sqlite3

    rows = [
        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
        for trial_id, key, value in attrs
    ]
    dialect = rdb.engine.name
    if dialect == "mysql":
        from sqlalchemy.dialects import mysql

        insert = mysql.insert(model).values(rows)
        session.execute(insert.on_duplicate_key_update(value_json=insert.inserted.value_json))
    elif dialect == "postgresql" or (
        dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24)
    ):
        from sqlalchemy.dialects import postgresql
        from sqlalchemy.dialects import sqlite

        insert = (postgresql if dialect == "postgresql" else sqlite).insert(model).values(rows)
        session.execute(
            insert.on_conflict_do_update(
                index_elements=[model.trial_id, model.key],
                set_={"value_json": insert.excluded.value_json},
            )
        )
    else:
        for trial_id, key, value in attrs:
            rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)


def suggest_architecture(space: HierarchicalSearchSpace, trial: optuna.Trial) -> Architecture:
    """``space.suggest(trial)``, then ``record_architecture``: on an RDB storage the
    parameters and the record are written in one transaction at the end (Optuna commits every
    ``trial.suggest_*`` on its own: a dozen commits per ask of a NAS space, each a round trip
    to a server or a turn of SQLite's one write lock); elsewhere one write each, as they come.
    A trial finished meanwhile (another worker's sweep) raises ``UpdateFinishedTrialError``
    there and nothing of it is written."""
    rdb = rdb_backend(trial.storage)
    if rdb is None:
        arch = space.suggest(trial)
        record_architecture(trial, arch)
        return arch
    storage = trial.storage
    held = _HeldParams(storage)
    trial.storage = held  # type: ignore[assignment]  # only Trial._suggest writes through it
    try:
        arch = space.suggest(trial)
    finally:
        trial.storage = storage
    user = {
        _keys.OBJECTIVE_ARCH: arch.to_json(),
        _keys.OBJECTIVE_ARCH_DESCRIPTION: arch.describe(),
    }
    _write_params_and_attrs(rdb, trial, held.params, user)
    return arch


class _HeldParams:
    """A trial's storage that keeps the parameters ``Trial._suggest`` sets (in order) instead
    of writing each; everything else goes to the storage."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self.params: list[tuple[str, float, Any]] = []

    def set_trial_param(self, trial_id: int, name: str, value: float, distribution: Any) -> None:
        self.params.append((name, value, distribution))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


def _write_params_and_attrs(
    rdb: Any,
    trial: optuna.Trial,
    params: list[tuple[str, float, Any]],
    user: Mapping[str, Any],
) -> None:
    # Optuna's cache of each parameter's distribution in the study (as its set_trial_param)
    studies = getattr(trial.storage, "_studies", None)
    known = studies[trial.study._study_id].param_distribution if studies else {}
    _write_trial_rows(rdb, trial._trial_id, params=params, known=known, user=user, system={})
    for name, _, distribution in params:
        known.setdefault(name, distribution)
    trial._cached_frozen_trial.user_attrs.update(user)


def rdb_backend(storage: Any) -> Any:
    """The ``RDBStorage`` behind ``storage`` (Optuna wraps it in a cache), else ``None``."""
    from optuna.storages import RDBStorage

    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, RDBStorage) else None


# ---------------------------------------------------------------------------- the trial queue
def add_budget(
    study: optuna.Study,
    n: int,
    fixed: Sequence[tuple[str | None, Mapping[str, Any]]] = (),
) -> None:
    """Queue ``n`` WAITING trials: the run's trial budget.

    Unlike ``study.enqueue_trial({})`` they carry no ``fixed_params``, so the sampler samples
    them like any new trial; leaders pop them atomically, so the study ends with exactly
    the budget whatever the number of groups. The first ``len(fixed)`` carry those
    ``(name, parameters)``, as ``study.enqueue_trial(params)`` writes them, a published
    model's name as the user attribute ``reference_model``.
    """
    import optuna
    from optuna.trial import TrialState

    for i in range(n):
        marker: dict[str, Any] = {_keys.RUN_BUDGET_TRIAL: True}
        user: dict[str, Any] = {}
        if i < len(fixed):
            name, params = fixed[i]
            marker["fixed_params"] = dict(params)
            if name is not None:
                user[_keys.OBJECTIVE_REFERENCE] = name
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.WAITING, system_attrs=marker, user_attrs=user
            )
        )


def record_budget(study: optuna.Study, total: int) -> None:
    """The number of budget trials the study's runs asked for in all (before they are queued:
    a run killed while queuing is resumed with its whole budget)."""
    set_study_system_attr(study, _keys.RUN_BUDGET, int(total))


def recorded_budget(study: optuna.Study) -> int | None:
    """``record_budget``'s number (``None`` for studies of older versions)."""
    value = study_system_attrs(study).get(_keys.RUN_BUDGET)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def queued_budget(study: optuna.Study) -> int:
    """Budget trials in the study, whatever their state (retries are not counted: they
    carry ``failed_trial``)."""
    return sum(
        1
        for t in study.get_trials(deepcopy=False)
        if t.system_attrs.get(_keys.RUN_BUDGET_TRIAL) and "failed_trial" not in t.system_attrs
    )


def pop_waiting_trial(study: optuna.Study, claim: str | None = None) -> optuna.Trial | None:
    """The next WAITING trial, taken atomically (``None`` when the queue is empty).

    Optuna pops with a read-check-write of the trial's state. PostgreSQL and MySQL lock the
    row (``SELECT ... FOR UPDATE``); on SQLite, ``optuna_hpcnas.storages.open_storage`` makes
    every transaction ``BEGIN IMMEDIATE``, so the check and the write hold SQLite's own write
    lock. (No file lock of ours: opening and closing the database file in a process that has
    SQLite connections to it drops SQLite's POSIX locks and lets another process delete the
    write-ahead log under it.) As ``study.ask`` does, the cache is dropped first so the sampler
    sees the trials other workers finished meanwhile. With ``claim`` on an RDB storage, the
    token is written into the trial in the pop's own transaction (``claimed_trial_id``), and
    so is this process as the trial's owner (the record a sweep reads to fail the trial at
    once when this process is gone, ``storages.recover_expired_trials``): a worker killed
    right after its pop, before its heartbeat or lease began, leaves no anonymous trial. A
    journal storage records only which writer took a trial, and Optuna's pop counts a claim
    won when the trial is the one this thread owns after it: with ``claim`` this thread's
    last claim is forgotten first (``_forget_journal_claim``), so a trial it gave back and
    another writer took first does not read as won; a lost answer is found from the journal
    itself (``claimed_trial_id``).
    """
    import optuna

    study._thread_local.cached_all_trials = None
    rdb = rdb_backend(study._storage)
    if claim is None or rdb is None:
        if claim is not None:
            _forget_journal_claim(study)
        trial_id = study._pop_waiting_trial_id()
    else:
        trial_id = _pop_claimed(study, rdb, claim)
    return None if trial_id is None else optuna.trial.Trial(study, trial_id)


def _pop_claimed(study: optuna.Study, rdb: Any, claim: str) -> int | None:
    """Optuna's RDB pop (``set_trial_state_values(RUNNING)`` on the first WAITING trial still
    waiting under its row lock), with ``claim`` and the owner written in the same
    transaction."""
    import datetime

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import TrialState

    waiting = study._storage.get_all_trials(
        study._study_id, deepcopy=False, states=(TrialState.WAITING,)
    )
    for candidate in waiting:
        with _create_scoped_session(rdb.scoped_session, True) as session:
            row = models.TrialModel.find_or_raise_by_id(
                candidate._trial_id, session, for_update=True
            )
            if row.state != TrialState.WAITING:
                continue
            row.state = TrialState.RUNNING
            row.datetime_start = datetime.datetime.now()
            model = models.TrialSystemAttributeModel
            owner = {"number": row.number, **this_process()}
            attrs = {_keys.RUN_CLAIM: claim, _keys.STORAGES_OWNER: owner}
            _upsert_attrs(rdb, session, model, row.trial_id, attrs)
        return candidate._trial_id
    return None


def claimed_trial_id(
    study: optuna.Study, claim: str, journal_from: int | None = None
) -> int | None:
    """The RUNNING trial an earlier ``pop_waiting_trial(study, claim)`` took, if it did (its
    answer lost with the connection). RDB storages: the trial carrying ``claim``; journal
    storages, given ``journal_from`` (``journal_position`` before the pop): the trial whose
    first state change since is this thread's claim, read from the journal itself (Optuna's
    replay records a claim's owner only when the claiming thread reads it back, and another
    thread of the process may have read it first); others: ``None``."""
    from optuna.trial import TrialState

    rdb = rdb_backend(study._storage)
    if rdb is None:
        owned = None if journal_from is None else _journal_claim_since(study, journal_from)
        if owned is None:
            return None
        trial = study._storage.get_trial(owned)
        return owned if trial.state == TrialState.RUNNING else None
    from optuna.storages._rdb import models

    session = rdb.scoped_session()
    try:
        row = (
            session.query(models.TrialModel.trial_id)
            .join(models.TrialSystemAttributeModel)
            .filter(models.TrialModel.study_id == study._study_id)
            .filter(models.TrialModel.state == TrialState.RUNNING)
            .filter(models.TrialSystemAttributeModel.key == _keys.RUN_CLAIM)
            .filter(models.TrialSystemAttributeModel.value_json == json.dumps(claim))
            .one_or_none()
        )
    finally:
        session.close()
    return None if row is None else int(row[0])


def journal_position(study: optuna.Study) -> int | None:
    """How far this process has read the study's journal (no storage call); ``None`` off a
    journal storage."""
    from optuna_hpcnas._journal_batch import journal_storage

    storage = journal_storage(study._storage)
    if storage is None:
        return None
    with storage._thread_lock:
        return storage._replay_result.log_number_read


def _journal_claim_since(study: optuna.Study, start: int) -> int | None:
    """The trial whose first state change in the journal from ``start`` on is this thread's
    claim (``first_state_logs``), if one is; ``None`` off a journal storage."""
    from optuna.trial import TrialState

    from optuna_hpcnas._journal_batch import first_state_logs
    from optuna_hpcnas._journal_batch import journal_storage

    storage = journal_storage(study._storage)
    if storage is None:
        return None
    worker = storage._replay_result.worker_id
    for trial_id, log in first_state_logs(storage, start).items():
        if log["worker_id"] == worker and TrialState(log["state"]) == TrialState.RUNNING:
            return int(trial_id)
    return None


def _forget_journal_claim(study: optuna.Study) -> None:
    """On a journal storage, forget which trial this thread took last (no storage call):
    its next claim, once read from the journal, is then the only trial it owns. Optuna's
    replay keeps the owner per worker in a private table and has no call for this."""
    from optuna.storages import JournalStorage

    storage = study._storage
    if not isinstance(storage, JournalStorage):
        return
    with storage._thread_lock:
        replay = storage._replay_result
        replay._worker_id_to_owned_trial_id.pop(replay.worker_id, None)


class PopClaim:
    """One pop of the budget queue that can be tried again after a lost answer (call it
    through ``OutageWindow.call``, which asks ``recover`` before a second try): a try that
    took a trial but whose answer never came back is found on the storage instead of taking
    a second one. Build it on the thread that pops (journal storages record the taker by
    thread).
    """

    def __init__(self, study: optuna.Study, token: str) -> None:
        self.study = study
        self.token = token
        self._journal_from: int | None = None  # the journal's position before the first try

    def __call__(self) -> optuna.Trial | None:
        if self._journal_from is None:
            self._journal_from = journal_position(self.study)
        return pop_waiting_trial(self.study, claim=self.token)

    def recover(self) -> tuple[bool, optuna.Trial | None]:
        import optuna

        trial_id = claimed_trial_id(self.study, self.token, self._journal_from)
        if trial_id is None:
            return False, None
        return True, optuna.trial.Trial(self.study, trial_id)


class TellOnce:
    """``study.tell(trial, values)`` (or ``state=``) that can be tried again after a lost
    answer (through ``OutageWindow.call``): before a second try ``recover`` reads the trial;
    finished in the told state, the lost try committed it and nothing is told again;
    finished in another state, another worker failed it meanwhile and
    ``UpdateFinishedTrialError`` is raised, as the tell itself would have.
    """

    def __init__(
        self, study: optuna.Study, trial: optuna.Trial, state: Any, values: list[float] | None
    ) -> None:
        self.study = study
        self.trial = trial
        self.state = state
        self.values = values

    def __call__(self) -> None:
        # ``study.tell`` without its last step, a second read of the whole trial to return a
        # copy nobody here reads (six statements on an RDB storage, on the next ask's path)
        from optuna.study._tell import _tell_with_warning
        from optuna.trial import TrialState

        if self.state == TrialState.COMPLETE:  # as study.tell(trial, values)
            _tell_with_warning(self.study, self.trial, self.values)
        else:
            _tell_with_warning(self.study, self.trial, state=self.state)

    def recover(self) -> tuple[bool, None]:
        from optuna.exceptions import UpdateFinishedTrialError

        frozen = self.trial.storage.get_trial(self.trial._trial_id)
        if not frozen.state.is_finished():
            return False, None
        if frozen.state == self.state:
            return True, None
        raise UpdateFinishedTrialError(
            f"Trial {self.trial.number} is {frozen.state.name} already; its result is not told."
        )


def budget_room(trials: Sequence[FrozenTrial]) -> int:
    """The WAITING trials of ``trials`` a batch of finished trials may fill: those queued
    without parameters (a published model or a retry keeps its own)."""
    from optuna.trial import TrialState

    return sum(
        1 for t in trials if t.state == TrialState.WAITING and "fixed_params" not in t.system_attrs
    )


class PublishFinished:
    """Write trials finished elsewhere (scored on a local copy of the study) into ``study``:
    into its WAITING budget trials queued without parameters (``budget``; at most all but
    ``reserve`` of them, the rest of the batch is dropped), or as new trials. Returns the
    numbers written. Call it through ``OutageWindow.call``: ``recover`` finds a lost try's
    writes by ``claim``, written into every trial it fills.

    An RDB storage gets the whole batch in one transaction: each budget trial taken under
    its row lock in trial order (two writers never deadlock), its state, times, parameters,
    values and attributes written as Optuna's ``_create_new_trial`` writes a template's.
    Written by hand because Optuna has no call that fills a queued trial, nor any that
    writes several trials at once. A journal (file or Redis) gets the batch in at most two
    appends (``JournalBatch``). Other storages (the gRPC proxy) get Optuna's public calls,
    trial by trial.

    Args:
        study: The study to write into.
        trials: The finished trials (any storage's ``FrozenTrial``), oldest first.
        claim: A token unique to this batch.
        budget: Fill budget trials (the run has ``n_trials``) rather than add new ones.
        reserve: Budget trials left WAITING (one-shot finalists take them).
    """

    def __init__(
        self,
        study: optuna.Study,
        trials: Sequence[FrozenTrial],
        *,
        claim: str,
        budget: bool,
        reserve: int = 0,
    ) -> None:
        self.study = study
        self.trials = list(trials)
        self.claim = claim
        self.budget = budget
        self.reserve = reserve
        # storages without transactions: the numbers written so far, and the budget trial
        # claimed but not written yet when a try failed (the next try writes it first)
        self._written: list[int] = []
        self._claimed: int | None = None
        self._journal: JournalBatch | None = None

    def __call__(self) -> list[int]:
        rdb = rdb_backend(self.study._storage)
        targets = self._targets() if self.budget else []
        if rdb is not None:
            return self._rdb(rdb, targets)
        journal = journal_storage(self.study._storage)
        if journal is not None:
            return self._journal_batch(journal, targets)
        return self._one_by_one(targets)

    def _journal_batch(self, journal: Any, targets: list[int]) -> list[int]:
        """The batch as a few journal appends; a retry goes on from what landed."""
        if self._journal is None:
            self._journal = JournalBatch(
                journal,
                self.study._study_id,
                self.trials,
                system_attrs=[self._system_attrs(t) for t in self.trials],
                claim=self.claim,
                claim_key=_keys.RUN_CLAIM,
            )
        return self._journal.budget(targets) if self.budget else self._journal.new()

    def recover(self) -> tuple[bool, list[int] | None]:
        rdb = rdb_backend(self.study._storage)
        if rdb is None:
            return False, None  # ``__call__`` goes on from the last trial written
        numbers = [
            t.number
            for t in self.study._storage.get_all_trials(self.study._study_id, deepcopy=False)
            if t.system_attrs.get(_keys.RUN_CLAIM) == self.claim
        ]
        return (True, numbers) if numbers else (False, None)

    def _targets(self) -> list[int]:
        """The budget trials this batch may fill, in trial order."""
        from optuna.trial import TrialState

        waiting = self.study._storage.get_all_trials(
            self.study._study_id, deepcopy=False, states=(TrialState.WAITING,)
        )
        plain = [t._trial_id for t in waiting if "fixed_params" not in t.system_attrs]
        return plain[: max(0, len(plain) - self.reserve)]

    def _system_attrs(self, trial: FrozenTrial) -> dict[str, Any]:
        return {**trial.system_attrs, _keys.RUN_CLAIM: self.claim}

    def _rdb(self, rdb: Any, targets: list[int]) -> list[int]:
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(rdb.scoped_session, True) as session:
            rows = (
                self._new_rows(session) if not self.budget else self._budget_rows(session, targets)
            )
            self._write_rows(rdb, session, rows)
            return [row.number for row in rows]

    def _new_rows(self, session: Any) -> list[Any]:
        """New trial rows, numbered as Optuna numbers them (under the study's row lock)."""
        from optuna.storages._rdb import models
        import sqlalchemy

        study_id = self.study._study_id
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        count = (
            session.query(sqlalchemy.func.count(models.TrialModel.trial_id))
            .filter(models.TrialModel.study_id == study_id)
            .scalar()
        )
        rows = [
            models.TrialModel(
                study_id=study_id,
                number=count + i,
                state=t.state,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
            )
            for i, t in enumerate(self.trials)
        ]
        session.add_all(rows)
        session.flush()  # their ids
        return rows

    def _budget_rows(self, session: Any, targets: list[int]) -> list[Any]:
        """Budget trial rows still WAITING, taken under their row locks in trial order (a
        row another writer took meanwhile is skipped: its lock released, it is no longer
        WAITING), given each finished trial's state and times."""
        from optuna.storages._rdb import models
        from optuna.trial import TrialState

        rows: list[Any] = []
        left = list(targets)
        while left and len(rows) < len(self.trials):
            chunk, left = (
                left[: len(self.trials) - len(rows)],
                left[len(self.trials) - len(rows) :],
            )
            rows += (
                session.query(models.TrialModel)
                .filter(models.TrialModel.trial_id.in_(chunk))
                .filter(models.TrialModel.state == TrialState.WAITING)
                .order_by(models.TrialModel.trial_id)
                .with_for_update()
                .all()
            )
        for row, trial in zip(rows, self.trials):
            row.state = trial.state
            row.datetime_start = trial.datetime_start
            row.datetime_complete = trial.datetime_complete
        return rows

    def _write_rows(self, rdb: Any, session: Any, rows: list[Any]) -> None:
        """Each row's parameters, values, intermediate values and attributes: one multi-row
        statement per table (Optuna writes a trial's rows key by key)."""
        from optuna import distributions
        from optuna.storages._rdb import models

        children: list[Any] = []
        user: list[tuple[int, str, Any]] = []
        system: list[tuple[int, str, Any]] = []
        for row, trial in zip(rows, self.trials):
            for name, value in trial.params.items():
                distribution = trial.distributions[name]
                children.append(
                    models.TrialParamModel(
                        trial_id=row.trial_id,
                        param_name=name,
                        param_value=distribution.to_internal_repr(value),
                        distribution_json=distributions.distribution_to_json(distribution),
                    )
                )
            for objective, value in enumerate(trial.values or ()):
                stored, kind = models.TrialValueModel.value_to_stored_repr(value)
                children.append(
                    models.TrialValueModel(
                        trial_id=row.trial_id, objective=objective, value=stored, value_type=kind
                    )
                )
            for step, value in trial.intermediate_values.items():
                model = models.TrialIntermediateValueModel
                stored, intermediate = model.intermediate_value_to_stored_repr(value)
                children.append(
                    model(
                        trial_id=row.trial_id,
                        step=step,
                        intermediate_value=stored,
                        intermediate_value_type=intermediate,
                    )
                )
            user += [(row.trial_id, k, v) for k, v in trial.user_attrs.items()]
            system += [(row.trial_id, k, v) for k, v in self._system_attrs(trial).items()]
        session.add_all(children)
        for model, attrs in (
            (models.TrialUserAttributeModel, user),
            (models.TrialSystemAttributeModel, system),
        ):
            if attrs:
                _upsert_attr_rows(rdb, session, model, attrs)

    def _one_by_one(self, targets: list[int]) -> list[int]:
        """Public calls: each trial claimed (budget) or created, then written; a retry goes
        on from the first trial not written."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        storage, study_id = self.study._storage, self.study._study_id
        taken = iter(targets)
        for trial in self.trials[len(self._written) :]:
            if not self.budget:
                created = storage.create_new_trial(study_id, template_trial=trial)
                self._written.append(storage.get_trial_number_from_id(created))
                continue
            trial_id, self._claimed = self._claimed, None
            if trial_id is not None and storage.get_trial(trial_id).state.is_finished():
                self._written.append(storage.get_trial_number_from_id(trial_id))
                continue  # the lost try's last write had landed
            for candidate in taken if trial_id is None else ():
                try:
                    if storage.set_trial_state_values(candidate, TrialState.RUNNING):
                        trial_id = candidate
                        break
                except UpdateFinishedTrialError:
                    continue
            if trial_id is None:
                break
            self._claimed = trial_id
            for name, value in trial.params.items():
                distribution = trial.distributions[name]
                storage.set_trial_param(
                    trial_id, name, distribution.to_internal_repr(value), distribution
                )
            for step, value in trial.intermediate_values.items():
                storage.set_trial_intermediate_value(trial_id, step, value)
            _set_attrs(storage, trial_id, user=trial.user_attrs, system=self._system_attrs(trial))
            storage.set_trial_state_values(trial_id, trial.state, trial.values)
            self._written.append(storage.get_trial_number_from_id(trial_id))
            self._claimed = None
        return list(self._written)


def return_to_queue(trial: optuna.Trial) -> bool:
    """Put a RUNNING trial that was asked but never evaluated back in the queue (WAITING).

    It keeps the parameters its ask suggested, so whoever pops it next evaluates the same
    architecture (Optuna's ``Trial`` returns a parameter already set instead of sampling).
    Returns ``False`` if the trial had already finished (another worker recovered it).
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    try:
        if not trial.storage.set_trial_state_values(trial._trial_id, TrialState.WAITING):
            return False
    except UpdateFinishedTrialError:
        return False
    _forget_heartbeat(trial)
    return True


def _forget_heartbeat(trial: optuna.Trial) -> None:
    """Delete the heartbeat record of a trial put back in the queue (RDB storages).

    Optuna takes a RUNNING trial with an old heartbeat for a dead worker's; without this, the
    next worker to pop the trial would race every other worker's sweep until its first
    heartbeat, and lose the trial when a sweep came first.
    """
    rdb = rdb_backend(trial.storage)
    if rdb is None:
        return
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(rdb.scoped_session, True) as session:
        session.query(models.TrialHeartbeatModel).filter(
            models.TrialHeartbeatModel.trial_id == trial._trial_id
        ).delete()


def has_heartbeat(storage: Any) -> bool:
    """Whether ``storage`` (an Optuna storage object, or a URL string) sends heartbeats."""
    from optuna.storages import BaseStorage
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.storages._heartbeat import is_heartbeat_enabled

    # study._storage wraps an RDBStorage in Optuna's _CachedStorage, which forwards heartbeats.
    return (
        isinstance(storage, BaseStorage)
        and isinstance(storage, BaseHeartbeat)
        and is_heartbeat_enabled(storage)
    )


# ---------------------------------------------------------------------------- run records
def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    return study._storage.get_study_system_attrs(study._study_id)


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, key, value)


def record_run_data(study: optuna.Study, data: Mapping[str, Any]) -> None:
    """The ``[data]`` table a run searched on, so ``hpcnas export`` rebuilds the same task."""
    set_study_system_attr(study, _keys.RUN_DATA, json.dumps(dict(data), sort_keys=True))


def run_data_of(study: optuna.Study) -> dict[str, Any] | None:
    text = study_system_attrs(study).get(_keys.RUN_DATA)
    return json.loads(text) if isinstance(text, str) else None


def store_utilisation(study: optuna.Study, reports: Sequence[Mapping[str, Any]]) -> None:
    """Append one run's per-rank time shares (``RankUtilisation.to_dict()``) to the study."""
    previous = study_system_attrs(study).get(_keys.DISTRIBUTED_UTILISATION)
    runs = json.loads(previous) if isinstance(previous, str) else []
    runs.append({"ranks": [dict(r) for r in reports], "finished_at": time.time()})
    set_study_system_attr(study, _keys.DISTRIBUTED_UTILISATION, json.dumps(runs))
    sync = sum(int(r.get("sync_bytes", 0)) for r in reports)
    set_study_system_attr(study, _keys.DISTRIBUTED_SYNC_BYTES, int(sync))


def utilisation_from_study(study: optuna.Study) -> list[dict[str, Any]]:
    """The per-rank utilisation records of every run, oldest first."""
    text = study_system_attrs(study).get(_keys.DISTRIBUTED_UTILISATION)
    return json.loads(text) if isinstance(text, str) else []


def compute_shares(study: optuna.Study) -> dict[int, float]:
    """Rank -> share of its search loop spent computing, from the last run (the figure
    ``bench/distributed_throughput.py`` prints; runs stored before loops were measured give
    the share of the whole process)."""
    runs = utilisation_from_study(study)
    if not runs or not isinstance(runs[-1], dict):
        return {}
    out = {}
    for i, r in enumerate(runs[-1].get("ranks", [])):
        shares = r.get("loop_shares") or r.get("shares", {})
        out[int(r.get("rank", i))] = float(shares.get("compute", 0.0))
    return out


def group_of(trial: FrozenTrial) -> int:
    """The evaluation group that ran ``trial`` (0 for a one-process run)."""
    return int(trial.system_attrs.get(_keys.DISTRIBUTED_GROUP, 0))


# ---------------------------------------------------------------------------- Optuna internals
def process_constraints_after_trial(
    constraints_func: Any, study: optuna.Study, trial: FrozenTrial, state: Any
) -> None:
    """Evaluate and store ``constraints_func`` exactly as TPESampler, GPSampler and
    NSGAIISampler do, so ``FrozenTrial.constraints`` reads it back for every sampler."""
    from optuna.samplers._base import _process_constraints_after_trial

    _process_constraints_after_trial(constraints_func, study, trial, state)


def non_domination_ranks(losses: np.ndarray) -> np.ndarray:
    """Non-domination rank (0 = the Pareto front) of each row of ``losses`` (every column
    minimised), by Optuna's fast non-dominated sort, the one NSGA-II and ``study.best_trials``
    use. Equal rows share a rank.

    Examples:
        >>> import numpy as np
        >>> non_domination_ranks(np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])).tolist()
        [0, 0, 1]
    """
    from optuna.study._multi_objective import _fast_non_domination_rank

    return _fast_non_domination_rank(losses)


def retry_callback(
    storage: Any, max_retry: int | None
) -> tuple[Callable[[optuna.Study, FrozenTrial], None], int | None]:
    """What queues a failed trial's retry, and how many retries of one trial it allows: the
    storage's own ``heartbeat_stale_trial_callback`` (an RDB storage with heartbeats), else a
    ``RetryHeartbeatStaleTrialCallback(max_retry)``."""
    import warnings

    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    getter = getattr(storage, "get_heartbeat_stale_trial_callback", None)
    own = getter() if getter is not None else None
    if own is not None:
        return own, getattr(own, "_max_retry", max_retry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry), max_retry


def retry_system_attrs(failed: FrozenTrial, dropped: Sequence[str]) -> dict[str, Any]:
    """The system attributes of ``failed``'s retry, as ``RetryHeartbeatStaleTrialCallback``
    writes them (``failed_trial``: the first trial of the chain; ``retry_history``: every
    trial retried so far), without the keys in ``dropped`` (this trial's own records)."""
    attrs: dict[str, Any] = {"failed_trial": failed.number, "retry_history": []}
    attrs.update({k: v for k, v in failed.system_attrs.items() if k not in dropped})
    attrs["retry_history"] = [*attrs["retry_history"], failed.number]
    return attrs


def fail_with_retry(
    storage: Any,
    trial_id: int,
    *,
    records: Mapping[str, Any],
    max_retry: int | None,
    dropped: Sequence[str],
) -> tuple[int, int | None] | None:
    """On an RDB storage, in one transaction: if trial ``trial_id`` is RUNNING, write
    ``records`` into its system attributes, add its retry (WAITING, unless ``max_retry``
    retries of its chain were made), record the retry's number under
    ``hpcnas:storages:retry`` and FAIL it. Returns ``(trial number, retry number or None)``;
    ``None`` when the trial was not RUNNING (another caller failed it, or it finished).

    The transaction is the claim: the trial's row is locked (``SELECT ... FOR UPDATE`` on
    PostgreSQL and MySQL; ``BEGIN IMMEDIATE`` on a SQLite file opened by ``open_storage``),
    so of several sweepers one sees it RUNNING, and a process killed half-way leaves nothing
    (the trial stays RUNNING for the next sweep). Raises ``TypeError`` on other storages.
    """
    import optuna
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import TrialState

    rdb = rdb_backend(storage)
    if rdb is None:
        raise TypeError(f"`storage` is {storage!r}, but must be an RDB storage.")
    system = models.TrialSystemAttributeModel
    with _create_scoped_session(rdb.scoped_session) as session:
        study_id = session.query(models.TrialModel.study_id).filter_by(trial_id=trial_id).scalar()
        if study_id is None:
            raise KeyError(f"no trial with id {trial_id}")
        # the study first, as Optuna locks it to number a new trial: one lock order
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        row = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        if row.state != TrialState.RUNNING:
            return None
        failed = rdb._build_frozen_trial_from_trial_model(row)
        attrs = retry_system_attrs(failed, dropped)
        retry_number: int | None = None
        if max_retry is None or len(attrs["retry_history"]) <= max_retry:
            template = optuna.trial.create_trial(
                state=TrialState.WAITING,
                params=failed.params,
                distributions=failed.distributions,
                user_attrs=failed.user_attrs,
                system_attrs=attrs,
            )
            retry_number = rdb._get_prepared_new_trial(study_id, template, session).number
        for key, value in {**records, _keys.STORAGES_RETRY: retry_number}.items():
            rdb._set_trial_attr_without_commit(session, system, trial_id, key, value)
        row.state = TrialState.FAIL
        row.datetime_complete = datetime.datetime.now()
        number = int(row.number)
    return number, retry_number


def stale_trial_ids(storage: Any, study_id: int) -> list[int]:
    """RUNNING trials whose Optuna heartbeat is older than the storage's grace period (what
    ``optuna.storages.fail_stale_trials`` fails); ``[]`` without heartbeats."""
    if not has_heartbeat(storage):
        return []
    return list(storage._get_stale_trial_ids(study_id))


def trials_with_heartbeat(storage: Any, trial_ids: list[int]) -> set[int]:
    """Ids among ``trial_ids`` with an Optuna heartbeat record (left to Optuna's own sweep)."""
    from optuna.storages import RDBStorage
    from optuna.storages._rdb import models

    if not trial_ids or not has_heartbeat(storage):
        return set()
    backend = getattr(storage, "_backend", storage)  # Optuna's _CachedStorage wraps RDBStorage
    if not isinstance(backend, RDBStorage):
        return set()
    # Optuna has no public "has this trial a heartbeat" query; its model is the one source.
    session = backend.scoped_session()
    try:
        rows = (
            session.query(models.TrialHeartbeatModel.trial_id)
            .filter(models.TrialHeartbeatModel.trial_id.in_(trial_ids))
            .all()
        )
    finally:
        session.close()
    return {int(row[0]) for row in rows}


def grpc_proxy_server(storage: Any, host: str, port: int) -> Any:
    """Optuna's gRPC storage servicer on ``host:port``, not started. Built here rather than
    with ``run_grpc_proxy_server`` so that a taken port is an error (``so_reuseport`` off: gRPC
    would otherwise share the port with another proxy silently)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from optuna.storages._grpc.auto_generated import api_pb2_grpc
    from optuna.storages._grpc.servicer import OptunaStorageProxyService

    server = grpc.server(ThreadPoolExecutor(max_workers=10), options=[("grpc.so_reuseport", 0)])
    api_pb2_grpc.add_StorageServiceServicer_to_server(OptunaStorageProxyService(storage), server)
    server.add_insecure_port(f"{host}:{port}")
    return server
