"""An incremental view of one study: the newest finished trials and the set of seen candidates.

Finished trials never change, so each is read from the storage once. On every ask the cache
reads only the trials created since the previous ask and re-reads those still running; a
fresh process catches up with one ``get_all_trials`` call. The cost of an ask therefore does
not grow with the number of finished trials.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from dataclasses import dataclass
import math
from typing import Any
from typing import TYPE_CHECKING

from optuna.trial import TrialState

from optuna_hpcnas import _keys
from optuna_hpcnas.samplers._proposals import trial_params

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.storages import BaseStorage
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.search_space import HierarchicalSearchSpace

# Above this many unread trials, one bulk read is cheaper than one read per trial.
_BULK_READ = 32
# Members ranked at once when the best so far are brought up to date.
_ELITE_CHUNK = 256

KeyFn = Callable[[dict[str, Any]], "Hashable | None"]


@dataclass(frozen=True)
class Member:
    """A finished (complete or pruned) trial as the selection needs it."""

    number: int
    order: tuple[float, int]
    complete: bool
    values: tuple[float, ...] | None
    constraints: dict[str, float]
    intermediate: dict[int, float]
    params: dict[str, Any]


def _member(trial: FrozenTrial) -> Member:
    finished = trial.datetime_complete
    stamp = finished.timestamp() if finished is not None else math.inf
    intermediate = {
        int(step): float(value)
        for step, value in trial.intermediate_values.items()
        if not math.isnan(value)
    }
    return Member(
        number=trial.number,
        order=(stamp, trial.number),
        complete=trial.state == TrialState.COMPLETE,
        values=tuple(trial.values) if trial.values is not None else None,
        constraints=dict(trial.constraints),
        intermediate=intermediate,
        params=dict(trial.params),
    )


def candidate_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters a trial stands for: the sampled child while it is still running."""
    params = trial_params(trial)
    origin = trial.system_attrs.get(_keys.EVOLUTION_ORIGIN)
    if trial.state in (TrialState.RUNNING, TrialState.WAITING) and isinstance(origin, dict):
        # Studies written before the shared proposal key carry the child in its origin.
        if isinstance(origin.get("params"), dict):
            params = {**origin["params"], **params}
    return params


class StudyCache:
    """What the sampler knows of one study; owned by one sampler object, guarded by its lock."""

    def __init__(self, storage: BaseStorage, study_id: int, *, consider_pruned: bool) -> None:
        self.storage = storage
        self._consider_pruned = consider_pruned
        self.study_id = study_id
        self.directions: list[StudyDirection] = list(storage.get_study_directions(study_id))
        self.space: HierarchicalSearchSpace | None = None
        self.space_final = False
        self.space_distributions: dict[str, BaseDistribution] | None = None
        self.space_cardinality = 0
        self._universe: dict[Hashable, int] | None = None  # key -> enumeration index
        self._universe_params: list[dict[str, Any]] = []
        self._unseen: set[int] = set()
        self.intersection: dict[str, BaseDistribution] | None = None
        self.n_finished = 0
        self.updated_for: int | None = None
        self._next_number = 0
        self._pending: dict[int, int] = {}  # number -> trial_id of RUNNING/WAITING trials
        self._newest: list[Member] = []  # newest finished trials, oldest first
        self.finished: list[Member] = []  # every finished parent candidate, in read order
        self._elite: list[int] = []  # positions in ``finished`` of the best so far
        self._elite_upto = 0  # ``finished`` members already weighed for the elite
        # One-decision neighbours by candidate key (hierarchical spaces; a pure function of
        # the architecture, so safe to keep for the life of the cache).
        self.neighbour_lists: dict[Hashable, list[dict[str, Any]]] = {}
        self._keep = 1
        self._params: dict[int, dict[str, Any]] = {}  # every trial's candidate params
        self._key_of: dict[int, Hashable] = {}
        self._seen: dict[Hashable, int] = {}
        self._key_fn: KeyFn | None = None
        self._key_signature: Hashable = None

    # ------------------------------------------------------------------ reading
    def update(self, current_number: int, keep: int) -> None:
        """Read trials numbered below ``current_number`` that are new or still running."""
        self._keep = max(self._keep, keep)
        if self.updated_for == current_number:
            return
        self.updated_for = current_number
        for trial_id in list(self._pending.values()):
            self._ingest(self.storage.get_trial(trial_id))
        if current_number - self._next_number > _BULK_READ:
            trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
            for t in trials:
                if self._next_number <= t.number < current_number:
                    self._ingest(t)
        else:
            for number in range(self._next_number, current_number):
                trial_id = self.storage.get_trial_id_from_study_id_trial_number(
                    self.study_id, number
                )
                self._ingest(self.storage.get_trial(trial_id))
        self._next_number = max(self._next_number, current_number)

    def _ingest(self, trial: FrozenTrial) -> None:
        number = trial.number
        self._set_params(number, candidate_params(trial))
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            self._pending[number] = trial._trial_id
            return
        self._pending.pop(number, None)
        self._intersect(trial)
        parent_states = (TrialState.COMPLETE, TrialState.PRUNED)
        if trial.state not in parent_states[: 2 if self._consider_pruned else 1]:
            return  # failed trials still count as seen, never as parents
        self.n_finished += 1
        member = _member(trial)
        self.finished.append(member)
        self._add_newest(member)

    def _add_newest(self, member: Member) -> None:
        newest = self._newest
        i = len(newest)
        while i > 0 and newest[i - 1].order > member.order:
            i -= 1
        newest.insert(i, member)
        if len(newest) > self._keep:
            del newest[: len(newest) - self._keep]

    def _intersect(self, trial: FrozenTrial) -> None:
        if trial.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            return
        dists = {k: v for k, v in trial.distributions.items() if not v.single()}
        if self.intersection is None:
            self.intersection = dists
        else:
            self.intersection = {k: v for k, v in self.intersection.items() if dists.get(k) == v}

    @property
    def pending_ids(self) -> list[int]:
        """Trial ids of the trials that were running or waiting at the last read."""
        return list(self._pending.values())

    def window(
        self, recent: int, best: int, keys: Callable[[list[Member]], list[Any]]
    ) -> list[Member]:
        """The newest ``recent`` finished members and the ``best`` best ones, in read order.

        The best are kept incrementally: the members read since the last call are weighed
        with the best so far by ``keys`` (smaller wins), so a call costs O(best + new), not
        O(finished). Up to ``recent`` members this is every finished member.
        """
        while self._elite_upto < len(self.finished):
            # In chunks: a fresh process catching up on a long study ranks a bounded set.
            upto = min(len(self.finished), self._elite_upto + _ELITE_CHUNK)
            pool = self._elite + list(range(self._elite_upto, upto))
            ranked = keys([self.finished[i] for i in pool])
            chosen = sorted(range(len(pool)), key=ranked.__getitem__)[:best]
            self._elite = sorted(pool[i] for i in chosen)
            self._elite_upto = upto
        start = max(0, len(self.finished) - recent)
        older = [i for i in self._elite if i < start]
        return [self.finished[i] for i in older] + self.finished[start:]

    def population(self, size: int) -> list[Member]:
        """The newest ``size`` finished trials, oldest first (completion time, then number)."""
        return self._newest[-size:]

    # ------------------------------------------------------------------ duplicates
    def _set_params(self, number: int, params: dict[str, Any]) -> None:
        if self._params.get(number) == params:
            return
        self._params[number] = params
        if self._key_fn is not None:
            self._set_key(number, self._key_fn(params))

    def _set_key(self, number: int, key: Hashable | None) -> None:
        old = self._key_of.pop(number, None)
        if old is not None:
            self._seen[old] -= 1
            if not self._seen[old]:
                del self._seen[old]
                if self._universe is not None and old in self._universe:
                    self._unseen.add(self._universe[old])
        if key is not None:
            self._key_of[number] = key
            self._seen[key] = self._seen.get(key, 0) + 1
            if self._universe is not None and key in self._universe:
                self._unseen.discard(self._universe[key])

    def unseen(self, every: Callable[[], list[tuple[Hashable, dict[str, Any]]]]) -> list[dict]:
        """Params of the candidates of ``every()`` (keyed; built once) never seen, in
        ``every`` order; kept up to date incrementally, so a call costs O(unseen)."""
        if self._universe is None:
            pairs = every()
            self._universe = {key: i for i, (key, _) in enumerate(pairs)}
            self._universe_params = [params for _, params in pairs]
            self._unseen = {i for key, i in self._universe.items() if key not in self._seen}
        return [self._universe_params[i] for i in sorted(self._unseen)]

    def use_keys(self, signature: Hashable, key_fn: KeyFn) -> None:
        """Key candidates with ``key_fn``; rebuilt (once) when ``signature`` changes."""
        if self._key_fn is not None and signature == self._key_signature:
            return
        self._key_fn, self._key_signature = key_fn, signature
        self._universe = None
        self._key_of.clear()
        self._seen.clear()
        for number, params in self._params.items():
            self._set_key(number, key_fn(params))

    def is_seen(self, key: Hashable | None) -> bool:
        return key is not None and key in self._seen

    def mark_seen(self, number: int, params: dict[str, Any]) -> None:
        """Record the child just proposed for ``number`` (before its trial finishes)."""
        self._set_params(number, params)

    @property
    def num_seen(self) -> int:
        return len(self._seen)
