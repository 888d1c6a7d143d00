"""Behaviour of ``EvolutionarySampler`` beyond Optuna's contract suites."""

from __future__ import annotations

from collections.abc import Callable
import math
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.storages import InMemoryStorage
from optuna.study import StudyDirection
from optuna.trial import TrialState
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import _records
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers._evolution._cache import Member
from optuna_hpcnas.samplers._evolution._selection import crowding_distances
from optuna_hpcnas.samplers._evolution._selection import selection_keys
from optuna_hpcnas.samplers._evolution._variation import mutate_value
from optuna_hpcnas.samplers._evolution._variation import neighbours

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = HierarchicalSearchSpace.preset("digits-small")


def _score(arch: Any) -> float:
    """A separable synthetic objective with a unique optimum (smaller is better)."""
    op_cost = {
        "conv3x3": 0.0,
        "sepconv3x3": 1.0,
        "dilconv3x3": 2.0,
        "maxpool3x3": 3,
        "identity": 4,
    }
    value = {"chain": 0.5, "residual": 0.0, "dense": 1.0}[arch.topology]
    for i, cell in enumerate(arch.cells):
        value += op_cost[cell.op] * (i + 1) + (0.0 if cell.width in (None, 32) else 0.7)
    return value


def _objective(space: HierarchicalSearchSpace = SPACE) -> Callable[[optuna.Trial], float]:
    def objective(trial: optuna.Trial) -> float:
        return _score(space.suggest(trial))

    return objective


def _origins(study: optuna.Study) -> list[dict[str, Any]]:
    return [t.system_attrs[_keys.EVOLUTION_ORIGIN] for t in study.trials]


def _arch_params(study: optuna.Study) -> list[tuple[tuple[str, Any], ...]]:
    return [tuple(sorted(t.params.items())) for t in study.trials]


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "quoted"),
    [
        ({"population_size": 1}, ValueError, "1"),
        ({"population_size": 2.5}, TypeError, "2.5"),
        ({"population_size": True}, TypeError, "True"),
        ({"population_size": 4, "tournament_size": 5}, ValueError, "5"),
        ({"tournament_size": 0}, ValueError, "0"),
        ({"tournament_size": "3"}, TypeError, "'3'"),
        ({"crossover_prob": 1.5}, ValueError, "1.5"),
        ({"crossover_prob": -0.1}, ValueError, "-0.1"),
        ({"crossover_prob": "0.5"}, TypeError, "'0.5'"),
        ({"mutation_scale": 0.0}, ValueError, "0.0"),
        ({"level_weights": {"cells": 1.0}}, ValueError, "'cells'"),
        ({"level_weights": {"operator": -1.0}}, ValueError, "-1.0"),
        ({"level_weights": {"operator": 0.0}}, ValueError, "0.0"),
        ({"level_weights": [1.0]}, TypeError, "[1.0]"),
        ({"n_startup_trials": 0}, ValueError, "0"),
        ({"consider_pruned_trials": 1}, TypeError, "1"),
        ({"avoid_duplicates": "yes"}, TypeError, "'yes'"),
        ({"independent_sampler": object()}, TypeError, "object"),
        ({"seed": 1.0}, TypeError, "1.0"),
    ],
)
def test_bad_arguments_raise_and_quote_the_value(
    kwargs: dict[str, Any], error: type[Exception], quoted: str
) -> None:
    with pytest.raises(error, match=None) as info:
        EvolutionarySampler(**kwargs)
    assert quoted in str(info.value)


# ---------------------------------------------------------------------- hierarchical space
def test_hierarchical_children_are_valid_one_decision_mutations() -> None:
    # Blind mutation (surrogate=None): every bred child is one decision from its parent.
    study = optuna.create_study(
        sampler=EvolutionarySampler(population_size=10, surrogate=None, seed=1)
    )
    study.optimize(_objective(), n_trials=80)
    by_number = {t.number: t for t in study.trials}
    mutations = 0
    for trial, origin in zip(study.trials, _origins(study)):
        child = SPACE.from_params(trial.params)  # every child is a valid architecture
        assert origin["params"] == trial.params
        if origin["operation"] == "mutation":
            mutations += 1
            parent = SPACE.from_params(by_number[origin["parent"]].params)
            assert SPACE.to_params(child) in neighbours(SPACE, parent)
            changed = {
                SPACE.decision(k).level.value
                for k in set(trial.params) | set(by_number[origin["parent"]].params)
                if trial.params.get(k) != by_number[origin["parent"]].params.get(k)
            }
            assert origin["level"] in changed
            assert origin["parent"] < trial.number
    assert mutations >= 50
    assert [o["operation"] for o in _origins(study)[:6]] == ["random"] * 5 + ["mutation"]


def test_level_weights_restrict_the_mutated_level() -> None:
    sampler = EvolutionarySampler(population_size=5, level_weights={"topology": 1.0}, seed=3)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective(), n_trials=25)
    by_number = {t.number: t for t in study.trials}
    for trial, origin in zip(study.trials[5:], _origins(study)[5:]):
        parent = by_number[origin["parent"]].params
        if origin["operation"] != "mutation":
            continue  # a neighbour or random draw when every topology was seen
        diff = {k for k in parent if parent[k] != trial.params.get(k)}
        assert diff == {"node.topology"}
        assert origin["level"] == "topology"


def test_evolution_beats_its_random_start_on_a_structured_objective() -> None:
    study = optuna.create_study(sampler=EvolutionarySampler(seed=0))
    study.optimize(_objective(), n_trials=150)
    values = [t.value for t in study.trials]
    optimum = min(_score(a) for a in SPACE.enumerate())
    assert min(values[:10]) > optimum
    assert min(values) == optimum
    assert np.mean(values[-30:]) < np.mean(values[:10])


def test_no_duplicate_while_unseen_neighbours_exist() -> None:
    tiny = HierarchicalSearchSpace(num_cells=1, operators=("conv3x3", "identity"), widths=(8, 16))
    assert tiny.cardinality() == 9
    sampler = EvolutionarySampler(population_size=3, tournament_size=2, seed=5)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective_tiny(tiny), n_trials=9)
    assert len(set(_arch_params(study))) == 9  # the whole space, no repeat
    study.optimize(_objective_tiny(tiny), n_trials=3)  # exhausted: duplicates are accepted
    assert len(study.trials) == 12
    assert len(set(_arch_params(study))) == 9


def _objective_tiny(space: HierarchicalSearchSpace) -> Callable[[optuna.Trial], float]:
    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        return float(arch.cells[0].width or 0) + len(arch.topology)

    return objective


@pytest.mark.parametrize("attempts", [16, 0])
def test_unseen_neighbour_is_proposed_when_mutations_repeat(
    attempts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every architecture but one neighbour of the best is seen; with no mutation attempt
    # left (0), the neighbour enumeration must still find it.
    monkeypatch.setattr("optuna_hpcnas.samplers._evolution._sampler._MAX_ATTEMPTS", attempts)
    tiny = HierarchicalSearchSpace(num_cells=1, operators=("conv3x3", "identity"), widths=(8, 16))
    archs = list(tiny.enumerate())
    best = archs[4]
    missing = neighbours(tiny, best)[-1]
    study = optuna.create_study(
        sampler=EvolutionarySampler(population_size=2, surrogate=None, seed=0)
    )
    study._storage.set_study_system_attr(study._study_id, _keys.SEARCH_SPACE, tiny.to_json())
    ordered = [a for a in archs if a != best] + [best]  # the best is the newest member
    for arch in ordered:
        params = tiny.to_params(arch)
        if params == missing:
            continue
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={k: tiny.distributions()[k] for k in params},
                value=0.0 if arch == best else 1.0,
            )
        )
    trial = study.ask()
    tiny.suggest(trial)
    assert trial.params == missing
    origin = study.trials[-1].system_attrs[_keys.EVOLUTION_ORIGIN]
    # A crowded space (8 of 9 seen) goes to the exact neighbour list after one mutation.
    assert origin["operation"] in (("neighbour",) if attempts == 0 else ("mutation", "neighbour"))
    assert origin["parent"] == study.trials[-2].number


# ---------------------------------------------------------------------- determinism, state
def test_seeded_runs_are_reproducible_and_seeds_differ() -> None:
    runs = []
    for seed in (7, 7, 8):
        study = optuna.create_study(sampler=EvolutionarySampler(population_size=6, seed=seed))
        study.optimize(_objective(), n_trials=30)
        runs.append(_arch_params(study))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


CHILD = """
import sys, json, optuna
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import EvolutionarySampler
optuna.logging.set_verbosity(optuna.logging.WARNING)
space = HierarchicalSearchSpace.preset("digits-small")
sampler = EvolutionarySampler(population_size=int(sys.argv[3]), seed=int(sys.argv[4]))
study = optuna.create_study(
    study_name="s", storage=sys.argv[1], sampler=sampler, load_if_exists=True
)
def objective(trial):
    arch = space.suggest(trial)
    return sum(len(c.op) * (i + 1) + (c.width or 0) / 8 for i, c in enumerate(arch.cells))
study.optimize(objective, n_trials=int(sys.argv[2]))
"""


def _child_objective(trial: optuna.Trial) -> float:
    arch = SPACE.suggest(trial)
    return sum(len(c.op) * (i + 1) + (c.width or 0) / 8 for i, c in enumerate(arch.cells))


def test_reproducible_across_processes(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    subprocess.run([sys.executable, "-c", CHILD, url, "25", "5", "11"], check=True)
    other = optuna.load_study(study_name="s", storage=url)
    mine = optuna.create_study(sampler=EvolutionarySampler(population_size=5, seed=11))
    mine.optimize(_child_objective, n_trials=25)
    assert _arch_params(mine) == _arch_params(other)


def test_two_processes_on_one_sqlite_study_make_distinct_valid_children(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    optuna.create_study(study_name="s", storage=url)
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, url, "30", "6", "0"]) for _ in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    study = optuna.load_study(study_name="s", storage=url)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 60
    for t in trials:
        SPACE.from_params(t.params)
    # Same seed in both processes, yet children differ: each trial's stream follows its
    # number, and running children are visible to the other worker through the storage.
    # Two asks at the very same instant can still meet (no cross-worker lock): allow one.
    assert len({tuple(sorted(t.params.items())) for t in trials}) >= 59
    evolved = [o for o in _origins(study) if o["operation"] != "random"]
    assert len(evolved) >= 40


def test_restarted_sampler_agrees_with_the_running_one() -> None:
    study = optuna.create_study(sampler=EvolutionarySampler(population_size=8, seed=4))
    study.optimize(_objective(), n_trials=30)
    trial_id = study._storage.create_new_trial(study._study_id)
    frozen = study._storage.get_trial(trial_id)
    restarted = EvolutionarySampler(population_size=8, seed=4)
    space = restarted.infer_relative_search_space(study, frozen)
    assert space == SPACE.distributions()
    fresh = restarted.sample_relative(study, frozen, space)
    running = study.sampler.sample_relative(study, frozen, space)
    assert fresh == running


def test_pickled_sampler_continues_identically() -> None:
    study = optuna.create_study(sampler=EvolutionarySampler(population_size=6, seed=2))
    study.optimize(_objective(), n_trials=20)
    copy = pickle.loads(pickle.dumps(study.sampler))
    study2 = optuna.create_study(sampler=copy)
    for t in study.trials:
        study2.add_trial(t)
    study.optimize(_objective(), n_trials=10)
    study2.optimize(_objective(), n_trials=10)
    assert _arch_params(study) == _arch_params(study2)


def test_reseed_rng_changes_the_stream() -> None:
    a, b = EvolutionarySampler(seed=1), EvolutionarySampler(seed=1)
    b.reseed_rng()
    runs = []
    for sampler in (a, b):
        study = optuna.create_study(sampler=sampler)
        study.optimize(_objective(), n_trials=5)
        runs.append(_arch_params(study))
    assert runs[0] != runs[1]


class _CountingStorage(InMemoryStorage):
    def __init__(self) -> None:
        super().__init__()
        self.calls = {"get_all_trials": 0, "get_trial": 0}

    def get_all_trials(self, study_id: int, deepcopy: bool = True, states: Any = None) -> Any:
        if states != (TrialState.WAITING,):  # Optuna polls the waiting queue on every ask
            self.calls["get_all_trials"] += 1
        return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)

    def get_trial(self, trial_id: int) -> Any:
        self.calls["get_trial"] += 1
        return super().get_trial(trial_id)


def test_storage_reads_per_ask_do_not_grow_with_finished_trials() -> None:
    storage = _CountingStorage()
    study = optuna.create_study(storage=storage)
    study.optimize(_objective(), n_trials=300)  # a long history, written by another sampler
    sampler = EvolutionarySampler(population_size=10, seed=0)
    late = optuna.load_study(study_name=study.study_name, storage=storage, sampler=sampler)
    late.optimize(_objective(), n_trials=1)  # catches up once
    assert storage.calls["get_all_trials"] >= 1
    per_ask = []
    for _ in range(3):
        before = dict(storage.calls)
        for _ in range(20):
            trial = late.ask()
            late.tell(trial, _score(SPACE.suggest(trial)))
        per_ask.append({k: storage.calls[k] - before[k] for k in before})
    # Optuna itself reads a few trials per ask; the sampler adds a constant number and never
    # lists the trials again.
    assert all(c["get_all_trials"] == 0 for c in per_ask)
    assert per_ask[0] == per_ask[1] == per_ask[2]


# ---------------------------------------------------------------------- enqueue, independent
def test_enqueued_trials_are_honoured_and_extra_params_use_the_independent_sampler() -> None:
    target = SPACE.to_params(list(SPACE.enumerate())[77])
    study = optuna.create_study(sampler=EvolutionarySampler(population_size=4, seed=0))

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        assert 1e-4 <= lr <= 1e-1
        return _score(SPACE.suggest(trial)) + lr

    study.optimize(objective, n_trials=10)
    study.enqueue_trial(target)
    study.optimize(objective, n_trials=3)
    enqueued = study.trials[10]
    assert {k: v for k, v in enqueued.params.items() if k != "lr"} == target
    assert _keys.EVOLUTION_ORIGIN not in enqueued.system_attrs
    assert len({t.params["lr"] for t in study.trials}) == 13
    for t in study.trials:
        SPACE.from_params({k: v for k, v in t.params.items() if k != "lr"})


# ---------------------------------------------------------------------- generic spaces
def test_generic_mutation_respects_bounds_steps_and_log_scale() -> None:
    rng = np.random.default_rng(0)
    log = FloatDistribution(1e-6, 1.0, log=True)
    moves = [mutate_value(log, 1e-3, rng, 0.1) for _ in range(300)]
    assert all(1e-6 <= m <= 1.0 for m in moves)
    ratios = np.log10(np.array(moves) / 1e-3)
    assert 0.3 < np.std(ratios) < 1.0  # ~0.1 of six decades, multiplicative
    stepped = FloatDistribution(-1.0, 1.0, step=0.25)
    for m in (mutate_value(stepped, 1.0, rng, 0.1) for _ in range(100)):
        assert m != 1.0 and -1.0 <= m <= 1.0 and (m + 1.0) / 0.25 == round((m + 1.0) / 0.25)
    ints = IntDistribution(0, 3)
    for m in (mutate_value(ints, 0, rng, 0.01) for _ in range(50)):
        assert isinstance(m, int) and m == 1  # a tiny move still changes an int by one step
    cat = CategoricalDistribution(["a", "b", "c"])
    assert {mutate_value(cat, "a", rng, 0.1) for _ in range(50)} == {"b", "c"}


def test_generic_space_is_optimised() -> None:
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -5, 5)
        n = trial.suggest_int("n", 0, 20)
        c = trial.suggest_categorical("c", ["a", "b", "c"])
        return (x - 1.0) ** 2 + (n - 7) ** 2 + (0 if c == "b" else 3)

    evo = optuna.create_study(
        sampler=EvolutionarySampler(population_size=10, surrogate=None, seed=0)
    )
    evo.optimize(objective, n_trials=150)
    ops = [t.system_attrs.get(_keys.EVOLUTION_ORIGIN, {}).get("operation") for t in evo.trials]
    assert ops.count("mutation") > 100
    assert evo.best_value < 0.5


# ---------------------------------------------------------------------- selection
def _m(
    number: int, value: float | None, *, steps: dict[int, float] | None = None, **kw: Any
) -> Member:
    return Member(
        number=number,
        order=(float(number), number),
        complete=value is not None,
        values=(value,) if value is not None else None,
        constraints=kw.get("constraints", {}),
        intermediate=steps or {},
        params={},
    )


def test_pruned_trials_are_normalised_by_stage() -> None:
    population = [
        _m(0, 1.0, steps={0: 5.0, 1: 3.0}),
        _m(1, 2.0, steps={0: 4.0, 1: 3.5}),
        _m(2, 3.0, steps={0: 6.0, 1: 4.0}),
        _m(3, None, steps={0: 3.0}),  # pruned at step 0, best of the four there
        _m(4, None, steps={0: 7.0, 1: 4.5}),  # pruned at step 1, worst there
        _m(5, None),  # pruned before reporting
    ]
    keys = selection_keys(population, [StudyDirection.MINIMIZE])
    fitness = [k[2] for k in keys]
    # Complete: quantiles of 1, 2, 3 among themselves.
    assert fitness[:3] == [0.0, 0.5, 1.0]
    # Step 0 has 5 reports (3, 4, 5, 6, 7): the pruned 3.0 is the best of them.
    assert fitness[3] == 0.0
    # Step 1 has 4 reports (3, 3.5, 4, 4.5): 4.5 is the worst.
    assert fitness[4] == 1.0
    assert fitness[5] == 1.0
    order = sorted(range(6), key=keys.__getitem__)
    assert order == [0, 3, 1, 2, 4, 5]  # the complete best wins a tie with the pruned best


def test_maximisation_and_constraints_in_selection() -> None:
    population = [
        _m(0, 10.0, constraints={"flops": 1.0}),  # best value, infeasible
        _m(1, 5.0, constraints={"flops": -1.0}),
        _m(2, 1.0, constraints={"flops": 0.0}),
        _m(3, 0.0, constraints={"flops": 0.5}),
        _m(4, 20.0),  # no constraint recorded: infeasible with infinite violation
    ]
    keys = selection_keys(population, [StudyDirection.MAXIMIZE])
    assert sorted(range(5), key=keys.__getitem__) == [1, 2, 3, 0, 4]


def test_pareto_ranks_and_crowding_match_brute_force() -> None:
    rng = np.random.default_rng(0)
    losses = rng.integers(0, 6, size=(40, 3)).astype(float)
    ranks = _records.non_domination_ranks(losses)
    for i in range(40):
        dominators = [
            j
            for j in range(40)
            if np.all(losses[j] <= losses[i]) and np.any(losses[j] < losses[i])
        ]
        expected = 0 if not dominators else 1 + max(ranks[j] for j in dominators)
        assert ranks[i] == expected
    front = np.array([[0.0, 4.0], [1.0, 2.0], [2.0, 1.0], [4.0, 0.0]])
    d = crowding_distances(front)
    assert math.isinf(d[0]) and math.isinf(d[3])
    assert d[1] == pytest.approx((2 - 0) / 4 + (4 - 1) / 4)
    assert d[2] == pytest.approx((4 - 1) / 4 + (2 - 0) / 4)


def test_multi_objective_selection_prefers_the_front_and_feasibility() -> None:
    def member(n: int, a: float, b: float, violation: float) -> Member:
        return Member(n, (float(n), n), True, (a, b), {"c": violation}, {}, {})

    population = [
        member(0, 1.0, 1.0, 0.0),  # dominates 1
        member(1, 2.0, 2.0, 0.0),
        member(2, 0.0, 0.0, 3.0),  # dominates everything but is infeasible
        member(3, 0.5, 3.0, 0.0),  # first front with 0
    ]
    keys = selection_keys(population, [StudyDirection.MINIMIZE, StudyDirection.MINIMIZE])
    order = sorted(range(4), key=keys.__getitem__)
    assert set(order[:2]) == {0, 3}
    assert order[2:] == [1, 2]


def test_multi_objective_study_with_constraints_runs_end_to_end() -> None:
    def objective(trial: optuna.Trial) -> tuple[float, float]:
        arch = SPACE.suggest(trial)
        size = sum(c.width or 0 for c in arch.cells)
        trial.set_constraint("size", size - 16)
        return _score(arch), float(size)

    study = optuna.create_study(
        directions=["minimize", "minimize"],
        sampler=EvolutionarySampler(
            population_size=10, crossover_prob=0.3, surrogate=None, seed=0
        ),
    )
    study.optimize(objective, n_trials=60)
    ops = {o["operation"] for o in _origins(study)}
    assert {"random", "mutation", "crossover"} <= ops

    def feasible(t: optuna.trial.FrozenTrial) -> bool:
        return all(v <= 0 for v in t.constraints.values())

    base_rate = np.mean([feasible(t) for t in study.trials])
    parents = [study.trials[o["parent"]] for o in _origins(study) if o["parent"] is not None]
    assert len(parents) >= 40
    # Tournaments prefer feasible members, so parents are feasible more often than trials.
    assert np.mean([feasible(p) for p in parents]) > base_rate
    assert len(study.best_trials) >= 2


def test_pruned_trials_are_parents() -> None:
    def objective(trial: optuna.Trial) -> float:
        arch = SPACE.suggest(trial)
        trial.report(_score(arch), step=0)
        if trial.number % 2:
            raise optuna.TrialPruned()
        trial.report(_score(arch) / 2, step=1)
        return _score(arch)

    for consider in (True, False):
        sampler = EvolutionarySampler(
            population_size=6, n_startup_trials=6, consider_pruned_trials=consider, seed=0
        )
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=40)
        parents = {o["parent"] for o in _origins(study) if o["parent"] is not None}
        pruned_parents = [p for p in parents if study.trials[p].state == TrialState.PRUNED]
        if consider:
            assert pruned_parents
            # Evolution starts once 6 trials finished, pruned ones included.
            assert _origins(study)[6]["operation"] != "random"
        else:
            assert not pruned_parents
            assert _origins(study)[6]["operation"] == "random"  # only 3 complete yet


# ---------------------------------------------------------------------- RDB
@pytest.mark.services
def test_two_workers_share_an_rdb_study(postgres_url: str) -> None:
    studies = [
        optuna.create_study(
            study_name="s",
            storage=postgres_url,
            sampler=EvolutionarySampler(population_size=5, seed=0),
            load_if_exists=True,
        )
        for _ in range(2)
    ]
    asked = []
    for _ in range(10):  # interleaved: both running at once, then told
        trials = [s.ask() for s in studies]
        archs = [SPACE.suggest(t) for t in trials]
        asked.extend(trials)
        for s, t, a in zip(studies, trials, archs):
            s.tell(t, _score(a))
    params = [tuple(sorted(t.params.items())) for t in asked]
    assert len(set(params)) == 20
    origins = [t.system_attrs[_keys.EVOLUTION_ORIGIN] for t in studies[0].trials]
    assert sum(o["operation"] != "random" for o in origins) >= 10


def test_surrogate_sees_the_newest_and_the_best_trials_and_the_given_threads() -> None:
    from threadpoolctl import threadpool_info

    from qubo import BayesianQuadratic

    fitted: list[tuple[int, list[int]]] = []

    class Recording(BayesianQuadratic):
        def draw(self, bits, values, rng):  # type: ignore[no-untyped-def]
            blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
            fitted.append((len(values), blas))
            return super().draw(bits, values, rng)

    dists = {f"x{i}": CategoricalDistribution(list(range(5))) for i in range(4)}
    rng = np.random.default_rng(0)
    values = rng.normal(size=400)
    values[7] = -10.0  # the best trial is among the oldest
    history = [
        optuna.trial.create_trial(
            params={k: int(rng.integers(5)) for k in dists}, distributions=dists, value=float(v)
        )
        for v in values
    ]
    for n_history, threads in ((60, 1), (400, 2)):
        fitted.clear()
        sampler = EvolutionarySampler(seed=0, surrogate=Recording(), threads=threads)
        study = optuna.create_study(sampler=sampler)
        study.add_trials(history[:n_history])
        trial = study.ask(dists)
        attrs = study._storage.get_trial_system_attrs(trial._trial_id)
        screened = attrs[_keys.EVOLUTION_ORIGIN]["operation"] == "screened"
        window = sampler._cache(study).window(100, 50, lambda ms: selection_keys(ms, [_MIN]))
        numbers = {m.number for m in window}
        # Every BLAS library loaded (NumPy's, SciPy's, torch's may differ) obeys the limit.
        n_fitted, blas = fitted[0]
        assert screened and n_fitted == len(window) and blas and set(blas) == {threads}
        if n_history <= 100:
            assert numbers == set(range(n_history))  # every trial while the study is small
        else:
            assert 100 < len(window) <= 150 and 7 in numbers
            assert set(range(n_history - 100, n_history)) <= numbers


_MIN = StudyDirection.MINIMIZE
