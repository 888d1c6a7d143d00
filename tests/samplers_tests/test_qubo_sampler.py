from __future__ import annotations

import itertools

import dimod
import numpy as np
import optuna
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import QUBOSampler
from qubo import LinearBudget

optuna.logging.set_verbosity(optuna.logging.WARNING)

_CHOICES = {f"g{i}": list(range(4)) for i in range(3)}


def _black_box(seed: int = 0) -> tuple[dict[tuple[str, int], float], np.ndarray]:
    rng = np.random.default_rng(seed)
    return {(g, v): float(rng.normal()) for g, vs in _CHOICES.items() for v in vs}, rng.normal(
        0, 0.5, (3, 3, 4, 4)
    )


def _value(params: dict, lin: dict, quad: np.ndarray) -> float:
    names = list(_CHOICES)
    out = sum(lin[(n, params[n])] for n in names)
    for a, b in itertools.combinations(range(3), 2):
        out += quad[a, b, params[names[a]], params[names[b]]]
    return float(out)


def _objective(lin: dict, quad: np.ndarray):  # type: ignore[no-untyped-def]
    def objective(trial: optuna.Trial) -> float:
        params = {n: trial.suggest_categorical(n, vs) for n, vs in _CHOICES.items()}
        return _value(params, lin, quad)

    return objective


def _last_global(study: optuna.Study) -> dict:
    """The sampling facts of the last ask that annealed (local asks do not)."""
    infos = [t.system_attrs.get(_keys.QUBO_INFO) for t in study.trials]
    return [i for i in infos if i and i["step"] == "global"][-1]


@pytest.mark.parametrize("surrogate", ["bayes", "fm"])
def test_finds_optimum_of_small_quadratic(surrogate: str) -> None:
    lin, quad = _black_box(0)
    best = min(
        _value(dict(zip(_CHOICES, combo)), lin, quad)
        for combo in itertools.product(*_CHOICES.values())
    )
    sampler = QUBOSampler(seed=0, n_startup_trials=8, surrogate=surrogate)
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective(lin, quad), n_trials=40)
    assert study.best_value == pytest.approx(best)
    # 64 codes, 40 trials: the sampler never repeats one.
    assert len({tuple(t.params.values()) for t in study.trials}) == 40
    assert study.trials[-1].system_attrs[_keys.QUBO_INFO]["n_observations"] == 39
    info = _last_global(study)
    assert info["n_bits"] == 12
    assert 0.0 <= info["feasible_rate"] <= 1.0


def test_maximize_direction() -> None:
    lin, quad = _black_box(1)
    study = optuna.create_study(
        direction="maximize", sampler=QUBOSampler(seed=1, n_startup_trials=8)
    )
    study.optimize(_objective(lin, quad), n_trials=30)
    worst = max(
        _value(dict(zip(_CHOICES, combo)), lin, quad)
        for combo in itertools.product(*_CHOICES.values())
    )
    assert study.best_value == pytest.approx(worst)


def test_deterministic_with_seed() -> None:
    lin, quad = _black_box(2)

    def run() -> list[dict]:
        study = optuna.create_study(sampler=QUBOSampler(seed=3, n_startup_trials=4))
        study.optimize(_objective(lin, quad), n_trials=10)
        return [t.params for t in study.trials]

    assert run() == run()


def test_two_workers_share_one_study_without_duplicates() -> None:
    storage = optuna.storages.InMemoryStorage()
    lin, quad = _black_box(3)
    a = optuna.create_study(storage=storage, study_name="s", sampler=QUBOSampler(seed=0))
    b = optuna.load_study(storage=storage, study_name="s", sampler=QUBOSampler(seed=0))
    objective = _objective(lin, quad)
    seen = []
    for _ in range(12):
        # Both workers ask before either tells: the running trial must not be repeated.
        ta, tb = a.ask(), b.ask()
        va, vb = objective(ta), objective(tb)
        seen += [tuple(ta.params.values()), tuple(tb.params.values())]
        a.tell(ta, va)
        b.tell(tb, vb)
    assert len(set(seen[10:])) == len(seen[10:])  # after the start-up phase
    assert len(a.trials) == 24


def test_hierarchical_space_samples_are_consistent() -> None:
    space = HierarchicalSearchSpace(
        num_cells=2,
        operators=("conv", "maxpool3x3", "identity"),
        widths=(8, 16),
        kernel_sizes=(3, 5),
        data_parallel=(1, 2, 4),
        pipeline_stages=(1, 2),
        max_ranks=4,
    )
    study = optuna.create_study(sampler=QUBOSampler(seed=0, n_startup_trials=5))

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        return float(sum(c.width or 0 for c in arch.cells) + arch.cluster.ranks)

    study.optimize(objective, n_trials=15)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    for t in study.trials:
        arch = space.from_params(t.params)  # raises if a micro parameter is inconsistent
        assert space.is_feasible(arch)
    later = [t for t in study.trials if _keys.QUBO_INFO in t.system_attrs]
    assert later
    # The relative params came from the QUBO for the whole architecture.
    assert later[-1].system_attrs[_keys.QUBO_INFO]["n_bits"] == space.encoding.n_bits


def test_budget_is_respected() -> None:
    lin, quad = _black_box(4)
    costs = {(n, v): float(v) for n, vs in _CHOICES.items() for v in vs}
    sampler = QUBOSampler(
        seed=0, n_startup_trials=5, budgets=[LinearBudget("flops", costs=costs, limit=4.0)]
    )
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective(lin, quad), n_trials=15)
    for t in study.trials[5:]:
        assert sum(t.params.values()) <= 4
    assert _last_global(study)["n_variables"] > 12  # slack variables


def test_exact_solver_plugs_in() -> None:
    sampler = QUBOSampler(seed=0, n_startup_trials=3, solver=dimod.ExactSolver())
    study = optuna.create_study(sampler=sampler)
    study.optimize(
        lambda t: (t.suggest_int("a", 0, 3) - 2) ** 2 + t.suggest_categorical("b", [1, 0, 2]),
        n_trials=10,
    )
    assert study.best_value == 0
    assert _last_global(study)["sampler"] == "ExactSolver"


def test_too_many_binary_variables() -> None:
    study = optuna.create_study(sampler=QUBOSampler(max_binary_variables=256))

    def objective(trial: optuna.Trial) -> float:
        return float(sum(trial.suggest_int(f"x{i}", 0, 99) for i in range(3)))

    study.optimize(objective, n_trials=1)
    with pytest.raises(ValueError, match=r"300 binary variables.*`max_binary_variables`=256"):
        study.optimize(objective, n_trials=1)


def test_floats_need_discretize_floats() -> None:
    study = optuna.create_study(sampler=QUBOSampler())
    with pytest.raises(ValueError, match=r"'lr' is FloatDistribution.*discretize_floats"):
        study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True), n_trials=1)
    study = optuna.create_study(sampler=QUBOSampler(seed=0, discretize_floats=7))
    study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True), n_trials=12)
    grid = np.geomspace(1e-4, 1e-1, 7)
    assert all(np.isclose(grid, t.params["lr"]).any() for t in study.trials[10:])


def _two_objectives(t: optuna.Trial) -> tuple[float, float]:
    """Cost against error over 4 decisions of 5 levels: more of each costs more and errs
    less, with diminishing returns, so the exact front is a curve, not a line."""
    x = [t.suggest_int(f"x{i}", 0, 4) for i in range(4)]
    weights = (1.0, 2.0, 3.0, 4.0)
    cost = sum(w * v for w, v in zip(weights, x))
    error = sum(w * np.exp(-0.6 * v) for w, v in zip(weights[::-1], x))
    return float(cost), float(error)


def _hypervolume(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area both objectives (minimised) dominate up to ``reference``, in 2-D."""
    front = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_second = 0.0, reference[1]
    for first, second in front:
        if second < best_second:
            area += (reference[0] - first) * (best_second - second)
            best_second = second
    return area


def test_several_objectives_are_searched_as_parego_does() -> None:
    grid = [
        _two_objectives(optuna.trial.FixedTrial({f"x{i}": v for i, v in enumerate(x)}))
        for x in itertools.product(range(5), repeat=4)
    ]
    reference = (max(p[0] for p in grid) + 1, max(p[1] for p in grid) + 1)
    exact = _hypervolume(grid, reference)
    shares = {}
    for name, sampler in (
        ("qubo", QUBOSampler(seed=0, num_reads=8)),
        ("random", optuna.samplers.RandomSampler(seed=0)),
    ):
        study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
        study.optimize(_two_objectives, n_trials=40)
        front = [tuple(t.values) for t in study.best_trials]
        shares[name] = _hypervolume(front, reference) / exact
    assert shares["qubo"] > shares["random"] and shares["qubo"] > 0.9, shares


def test_parego_scalarisation() -> None:
    from optuna_hpcnas.samplers._qubo import parego_scalarise

    rng = np.random.default_rng(0)
    assert parego_scalarise(np.array([[3.0], [1.0]]), rng) == [3.0, 1.0]  # one objective
    values = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [1.0, 1.0]])
    for _ in range(20):  # a dominated point never scores below a point dominating it
        scalar = parego_scalarise(values, rng)
        assert scalar[3] > max(scalar[:3])


def test_empty_space_and_bad_arguments() -> None:
    study = optuna.create_study(sampler=QUBOSampler(n_startup_trials=0))
    study.optimize(lambda t: 1.0, n_trials=3)  # nothing to suggest: no error
    with pytest.raises(ValueError, match="`n_startup_trials` is -1"):
        QUBOSampler(n_startup_trials=-1)
    with pytest.raises(TypeError, match="`max_binary_variables` is 2.5, but must be an int"):
        QUBOSampler(max_binary_variables=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`surrogate` is 'gp'"):
        QUBOSampler(surrogate="gp")
    with pytest.raises(TypeError, match="`solver` must be a dimod.Sampler"):
        QUBOSampler(solver=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`discretize_floats` is 1"):
        QUBOSampler(discretize_floats=1)


def test_the_sampler_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from optuna_hpcnas.samplers import QUBOSampler\n"
        "QUBOSampler(seed=0)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_failed_and_pruned_codes_are_not_proposed_again() -> None:
    def objective(trial: optuna.Trial) -> float:
        a = trial.suggest_categorical("a", ["x", "y"])
        b = trial.suggest_int("b", 0, 1)
        if (a, b) == ("x", 0):
            raise RuntimeError("out of memory")
        if (a, b) == ("y", 1):
            raise optuna.TrialPruned()
        return float(b)

    study = optuna.create_study(sampler=QUBOSampler(seed=0, n_startup_trials=1))
    study.enqueue_trial({"a": "x", "b": 0})
    study.enqueue_trial({"a": "y", "b": 1})
    study.enqueue_trial({"a": "y", "b": 0})
    study.optimize(objective, n_trials=4, catch=(RuntimeError,))
    # The fourth trial comes from the QUBO and must be the one code not seen yet.
    assert study.trials[3].params == {"a": "x", "b": 1}
    assert _keys.QUBO_INFO in study.trials[3].system_attrs


def test_running_trial_is_skipped_before_it_suggests() -> None:
    storage = optuna.storages.InMemoryStorage()
    a = optuna.create_study(storage=storage, study_name="s", sampler=QUBOSampler(seed=0))
    b = optuna.load_study(storage=storage, study_name="s", sampler=QUBOSampler(seed=1))
    dists = {
        "a": optuna.distributions.CategoricalDistribution(["x", "y"]),
        "b": optuna.distributions.IntDistribution(0, 1),
    }
    for i, params in enumerate([("x", 0), ("x", 1), ("y", 0), ("y", 0), ("x", 0)]):
        a.add_trial(
            optuna.trial.create_trial(params=dict(zip("ab", params)), distributions=dists, value=i)
        )
    first = a.ask()
    # Optuna draws relative params at the first suggest: "b" is proposed but not stored yet.
    # ("y", 1) is the one code not evaluated yet.
    assert first.suggest_categorical("a", ["x", "y"]) == "y"
    assert first.params == {"a": "y"}
    second = b.ask(dists)
    info = storage.get_trial_system_attrs(second._trial_id)[_keys.QUBO_INFO]
    assert info["fallback"] is True  # ("y", 1) is taken by the running trial: nothing is new
    assert first.suggest_int("b", 0, 1) == 1


def _changed_from_incumbent(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> int:
    earlier = [t for t in study.trials[: trial.number] if t.value is not None]
    best = min(earlier, key=lambda t: t.value)
    assert all(t.params != trial.params for t in earlier)
    return sum(trial.params[n] != best.params[n] for n in _CHOICES)


def test_asks_rank_annealed_codes_and_the_incumbents_ring_by_expected_improvement() -> None:
    lin, quad = _black_box(1)
    study = optuna.create_study(sampler=QUBOSampler(seed=0, n_startup_trials=5, num_reads=8))
    study.optimize(_objective(lin, quad), n_trials=24)
    steps = []
    for trial in study.trials[5:]:
        info = trial.system_attrs[_keys.QUBO_INFO]
        assert "solve_time_s" in info  # every ask anneals the draw
        assert info["n_pool"] >= info["n_local"] >= 1
        assert np.isfinite(info["log_ei"])
        steps.append(info["step"])
        if info["step"] == "local":
            assert _changed_from_incumbent(study, trial) == info["radius"] >= 1
    assert {"local", "global"} <= set(steps)


def test_without_a_posterior_every_other_ask_refines_the_incumbent() -> None:
    # After start-up and one global ask per group (3).
    lin, quad = _black_box(1)
    sampler = QUBOSampler(seed=0, n_startup_trials=5, num_reads=8, surrogate="fm")
    study = optuna.create_study(sampler=sampler)
    study.optimize(_objective(lin, quad), n_trials=24)
    for trial in study.trials[5:]:
        info = trial.system_attrs[_keys.QUBO_INFO]
        local = trial.number % 2 == 1 and trial.number >= 5 + 3  # start-up and 3 groups
        assert info["step"] == ("local" if local else "global")
        if info["step"] != "local":
            continue
        # The nearest unseen ring around the incumbent.
        assert _changed_from_incumbent(study, trial) == info["radius"] >= 1


def test_asks_run_with_the_given_blas_threads() -> None:
    from threadpoolctl import threadpool_info

    from qubo import BayesianQuadratic

    seen: list[int] = []

    class Recording(BayesianQuadratic):
        def fit(self, bits, values):  # type: ignore[no-untyped-def]
            seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
            return super().fit(bits, values)

    lin, quad = _black_box(0)
    for threads in (1, 2):
        seen.clear()
        sampler = QUBOSampler(seed=0, n_startup_trials=3, surrogate=Recording(), threads=threads)
        optuna.create_study(sampler=sampler).optimize(_objective(lin, quad), n_trials=5)
        assert seen and set(seen) == {threads}
    with pytest.raises(ValueError, match="`threads` is 0"):
        QUBOSampler(threads=0)
