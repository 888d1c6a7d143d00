from __future__ import annotations

import itertools

import dimod
import numpy as np
import pytest

from qubo import BayesianQuadratic
from qubo import conditional_pairs
from qubo import FactorizationMachine
from qubo import LinearBudget
from qubo import OneHotEncoding
from qubo import QuadraticModel
from qubo import QUBOProblem
from qubo import solve
from qubo._surrogate import _log_h


def _codes(enc: OneHotEncoding) -> np.ndarray:
    return np.array([enc.encode(values) for values in itertools.product(*enc.groups)])


def _random_model(n: int, rng: np.random.Generator, scale: float = 1.0) -> QuadraticModel:
    return QuadraticModel(rng.normal(0, scale, n), rng.normal(0, scale, (n, n)))


def _ground_states(bqm: dimod.BinaryQuadraticModel, n: int) -> np.ndarray:
    sampleset = dimod.ExactSolver().sample(bqm).lowest(atol=1e-9)
    columns = [list(sampleset.variables).index(i) for i in range(n)]
    return np.asarray(sampleset.record.sample)[:, columns]


@pytest.mark.parametrize("seed", range(6))
def test_exact_ground_state_is_feasible_brute_force_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [[3, 4, 4, 2], [2, 2, 3, 3, 3], [5, 5, 4]][seed % 3]
    enc = OneHotEncoding([f"g{i}" for i in range(len(sizes))], [range(s) for s in sizes])
    problem = QUBOProblem(enc)
    # Large coefficients stress the penalty scaling.
    model = _random_model(enc.n_bits, rng, scale=float(10 ** rng.integers(-1, 3)))
    codes = _codes(enc)
    best = codes[np.argmin(model.energy(codes))]
    ground = _ground_states(problem.build_bqm(model), enc.n_bits)
    assert all(problem.is_feasible(x) for x in ground)
    assert ground.tolist() == [best.tolist()]


@pytest.mark.parametrize("seed", range(4))
def test_ground_state_respects_conditional_activity(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # "op" in {conv, pool, id}; "width" applies to conv only (None = does not apply).
    enc = OneHotEncoding(
        ["op", "width", "k"], [["conv", "pool", "id"], [16, 32, 64, None], [3, 5]]
    )
    forbidden = conditional_pairs(enc, "width", "op", {"conv"})
    problem = QUBOProblem(enc, forbidden=forbidden)
    model = _random_model(enc.n_bits, rng, scale=5.0)
    codes = np.array([c for c in _codes(enc) if problem.is_feasible(c)])
    assert len(codes) == 3 * 2 + 2 * 2  # conv x 3 widths x 2 kernels + (pool, id) x 2 kernels
    best = codes[np.argmin(model.energy(codes))]
    ground = _ground_states(problem.build_bqm(model), enc.n_bits)
    assert ground.tolist() == [best.tolist()]
    values = enc.decode(ground[0])
    assert (values[1] is None) == (values[0] != "conv")


def test_ground_state_respects_forbidden_pairs() -> None:
    enc = OneHotEncoding(["dp", "pp"], [[1, 2, 4], [1, 2, 4]])
    forbidden = [(enc.bit(0, a), enc.bit(1, b)) for a in (1, 2, 4) for b in (1, 2, 4) if a * b > 4]
    problem = QUBOProblem(enc, forbidden=forbidden)
    # Reward the forbidden large layouts strongly.
    model = QuadraticModel(-np.arange(6.0) * 10, np.zeros((6, 6)))
    ground = _ground_states(problem.build_bqm(model), enc.n_bits)
    dp, pp = enc.decode(ground[0])
    assert dp * pp <= 4
    assert problem.is_feasible(ground[0])


def test_budget_with_slack_keeps_ground_state_feasible() -> None:
    enc = OneHotEncoding(["a", "b", "c"], [[0, 1, 2], [0, 1], [0, 1, 2]])
    costs = {(name, v): float(v) for name in enc.names for v in (0, 1, 2)}
    budget = LinearBudget(
        "flops", costs={k: c for k, c in costs.items() if k != ("b", 2)}, limit=2
    )
    problem = QUBOProblem(enc, budgets=[budget])
    # The unconstrained optimum (all largest values) costs 5.
    model = QuadraticModel(-np.array([0, 1, 2, 0, 1, 0, 1, 2.0]), np.zeros((8, 8)))
    bqm = problem.build_bqm(model)
    assert bqm.num_variables > enc.n_bits  # slack variables
    ground = _ground_states(bqm, enc.n_bits)
    codes = np.array([c for c in _codes(enc) if problem.is_feasible(c)])
    best = model.energy(codes).min()
    assert all(problem.is_feasible(x) for x in ground)
    assert {float(model.energy(x)) for x in ground} == {best}


@pytest.mark.parametrize("method", ["slack", "unbalanced"])
def test_annealing_decodes_only_feasible_new_codes(method: str) -> None:
    rng = np.random.default_rng(3)
    enc = OneHotEncoding(
        ["op0", "w0", "op1", "w1"],
        [["conv", "pool"], [8, 16, None], ["conv", "pool"], [8, 16, None]],
    )
    forbidden = conditional_pairs(enc, "w0", "op0", {"conv"}) + conditional_pairs(
        enc, "w1", "op1", {"conv"}
    )
    costs = {("w0", 8): 1.0, ("w0", 16): 2.0, ("w1", 8): 1.0, ("w1", 16): 2.0}
    budget = LinearBudget("flops", costs=costs, limit=3.0, method=method)
    problem = QUBOProblem(enc, forbidden=forbidden, budgets=[budget])
    model = _random_model(enc.n_bits, rng)
    evaluated = [enc.encode(["conv", 8, "pool", None])]
    solution = solve(problem, model, evaluated=evaluated, evaluated_penalty=0.5, seed=1)
    assert len(solution.codes) > 0
    assert all(problem.is_feasible(x) for x in solution.codes)
    assert evaluated[0].tolist() not in solution.codes.tolist()
    assert np.all(np.diff(solution.energies) >= 0)
    assert 0.0 <= solution.info["feasible_rate"] <= 1.0
    assert solution.info["n_variables"] >= enc.n_bits


def test_solve_is_deterministic_with_seed_and_accepts_exact_solver() -> None:
    rng = np.random.default_rng(0)
    enc = OneHotEncoding(["a", "b", "c"], [range(3), range(3), range(4)])
    problem = QUBOProblem(enc)
    model = _random_model(enc.n_bits, rng)
    a = solve(problem, model, seed=5)
    b = solve(problem, model, seed=5)
    assert a.codes.tolist() == b.codes.tolist()
    exact = solve(problem, model, sampler=dimod.ExactSolver())
    codes = _codes(enc)
    assert exact.codes[0].tolist() == codes[np.argmin(model.energy(codes))].tolist()
    assert exact.info["sampler"] == "ExactSolver"


def test_repair_fixes_one_hot_and_conditions() -> None:
    enc = OneHotEncoding(["op", "w"], [["conv", "pool"], [8, None]])
    problem = QUBOProblem(enc, forbidden=conditional_pairs(enc, "w", "op", {"conv"}))
    model = QuadraticModel(np.array([0.0, 1.0, 0.0, 0.0]), np.zeros((4, 4)))
    fixed = problem.repair(np.array([1, 1, 0, 1]), model)
    assert problem.is_feasible(fixed)
    assert enc.decode(fixed) in (["conv", 8], ["pool", None])
    # Already feasible codes come back unchanged.
    assert problem.repair(fixed, model).tolist() == fixed.tolist()


@pytest.mark.parametrize("surrogate", [BayesianQuadratic(), FactorizationMachine()])
def test_surrogates_rank_a_quadratic_black_box(surrogate: object) -> None:
    rng = np.random.default_rng(0)
    enc = OneHotEncoding(["a", "b", "c"], [range(4), range(4), range(4)])
    truth = _random_model(enc.n_bits, rng)
    codes = _codes(enc)
    train = codes[rng.choice(len(codes), 40, replace=False)]
    drawn = surrogate.draw(train, truth.energy(train), rng)  # type: ignore[attr-defined]
    assert np.corrcoef(drawn.energy(codes), truth.energy(codes))[0, 1] > 0.6


def test_thompson_draws_differ_but_mean_is_deterministic() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (10, 6))
    y = rng.normal(size=10)
    a = BayesianQuadratic(exploration=1.0).draw(x, y, np.random.default_rng(1))
    b = BayesianQuadratic(exploration=1.0).draw(x, y, np.random.default_rng(2))
    assert not np.allclose(a.linear, b.linear)
    m1 = BayesianQuadratic(exploration=0.0).draw(x, y, np.random.default_rng(1))
    m2 = BayesianQuadratic(exploration=0.0).draw(x, y, np.random.default_rng(2))
    np.testing.assert_allclose(m1.linear, m2.linear)
    # A tempered draw lies between: half the deviation of the full sample with the same rng.
    half = BayesianQuadratic(exploration=0.5).draw(x, y, np.random.default_rng(1))
    np.testing.assert_allclose(half.linear - m1.linear, 0.5 * (a.linear - m1.linear), atol=1e-9)


def test_posterior_mean_recovers_an_exact_quadratic() -> None:
    # 4 groups of 2: a quadratic over one-hot codes has 11 free coefficients (a constant, one
    # per group, one per pair of groups). Given 13 of the 16 codes without noise, the mean
    # must predict the other 3, and be sure of it.
    rng = np.random.default_rng(3)
    enc = OneHotEncoding(["a", "b", "c", "d"], [range(2)] * 4)
    codes = _codes(enc)
    truth = _random_model(enc.n_bits, rng)
    y = truth.energy(codes)
    order = rng.permutation(len(codes))
    train, held = order[:13], order[13:]
    posterior = BayesianQuadratic().fit(codes[train], y[train])
    scale, shift = y[train].std(), y[train].mean()
    mean, sd = posterior.predict(codes[held])
    np.testing.assert_allclose(mean * scale + shift, y[held], atol=0.05 * scale)
    assert sd.max() < 0.1
    np.testing.assert_allclose(posterior.mean().energy(codes[held]), mean, atol=1e-9)


def test_thompson_draws_are_reproducible_with_a_seed() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, (12, 6))
    posterior = BayesianQuadratic().fit(x, rng.normal(size=12))
    a, b = (posterior.draw(np.random.default_rng(7)) for _ in range(2))
    c = posterior.draw(np.random.default_rng(8))
    np.testing.assert_array_equal(a.linear, b.linear)
    np.testing.assert_array_equal(a.quadratic, b.quadratic)
    assert not np.allclose(a.quadratic, c.quadratic)


def test_log_expected_improvement_matches_the_closed_form() -> None:
    from scipy.stats import norm

    rng = np.random.default_rng(1)
    enc = OneHotEncoding(["a", "b", "c"], [range(4), range(4), range(4)])
    codes = _codes(enc)
    train = codes[rng.choice(len(codes), 12, replace=False)]
    posterior = BayesianQuadratic().fit(train, _random_model(enc.n_bits, rng).energy(train))
    mean, sd = posterior.predict(codes)
    best = posterior.y.min()
    z = (best - mean) / np.maximum(sd, 1e-300)
    expected = (best - mean) * norm.cdf(z) + sd * norm.pdf(z)
    got = posterior.log_expected_improvement(codes)
    unseen = sd > 1e-6
    assert unseen.sum() > 40
    np.testing.assert_allclose(np.exp(got[unseen]), expected[unseen], rtol=1e-6, atol=1e-12)
    # Far in the tail, where the closed form underflows, the log still orders the codes.
    tail = np.array([-40.0, -20.0, -10.0, -6.5, -6.0, -5.5])
    log_h = _log_h(tail)
    assert np.all(np.isfinite(log_h)) and np.all(np.diff(log_h) > 0)
    direct = np.log(-5.5 * norm.cdf(-5.5) + norm.pdf(-5.5))
    assert log_h[-1] == pytest.approx(direct, abs=1e-6)
    assert _log_h(np.array([-6.0 - 1e-9]))[0] == pytest.approx(log_h[-2], abs=5e-3)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="empty"):
        QUBOProblem(OneHotEncoding([], []))
    enc = OneHotEncoding(["a"], [[0, 1]])
    with pytest.raises(ValueError, match="1 or 2 bit positions"):
        QUBOProblem(enc, forbidden=[(0, 1, 1, 5)])
    with pytest.raises(ValueError, match="cannot be met"):
        QUBOProblem(enc, budgets=[LinearBudget("f", costs={("a", 0): 2, ("a", 1): 3}, limit=1)])
    with pytest.raises(ValueError, match="'magic'"):
        LinearBudget("f", costs={}, limit=1, method="magic")
    with pytest.raises(ValueError, match="unknown group 'z'"):
        QUBOProblem(enc, budgets=[LinearBudget("f", costs={("z", 0): 1}, limit=1)])
    with pytest.raises(ValueError, match="at least one observation"):
        BayesianQuadratic().draw(np.zeros((0, 2)), np.zeros(0), np.random.default_rng())
    with pytest.raises(ValueError, match="`exploration` is -1"):
        BayesianQuadratic(exploration=-1.0)
    with pytest.raises(ValueError, match="`rank` is 0"):
        FactorizationMachine(rank=0)
    with pytest.raises(ValueError, match="`num_reads` is 0"):
        solve(QUBOProblem(enc), QuadraticModel(np.zeros(2), np.zeros((2, 2))), num_reads=0)


def test_all_samples_evaluated_falls_back_to_unseen_neighbours() -> None:
    enc = OneHotEncoding(["a", "b"], [range(3), range(3)])
    problem = QUBOProblem(enc)
    model = QuadraticModel(np.array([-5.0, 0, 0, -5.0, 0, 1.0]), np.zeros((6, 6)))
    evaluated = [enc.encode([0, 0])]  # the surrogate's clear optimum
    solution = solve(problem, model, evaluated=evaluated, seed=0)
    assert solution.info["n_neighbours"] > 0
    decoded = [enc.decode(c) for c in solution.codes]
    # Energies -5, -5, -5 (ties in any order), then -4.
    assert sorted(decoded[:3]) == [[0, 1], [1, 0], [2, 0]]
    assert decoded[3:] == [[0, 2]]


def test_neighbours_are_feasible_one_group_changes_minus_the_excluded() -> None:
    enc = OneHotEncoding(["a", "b"], [[0, 1, 2], [0, 1]])
    problem = QUBOProblem(enc, forbidden=[(enc.bit(0, 2), enc.bit(1, 1))])
    centre = enc.encode([0, 1])
    found = {tuple(enc.decode(c)) for c in problem.neighbours([centre])}
    assert found == {(1, 1), (0, 0)}  # (2, 1) is forbidden; the centre itself is not listed
    excluded = problem.neighbours([centre], exclude=[enc.encode([1, 1]).tobytes()])
    assert [tuple(enc.decode(c)) for c in excluded] == [(0, 0)]


def test_posterior_predicts_its_mean_and_is_surest_at_the_data() -> None:
    rng = np.random.default_rng(0)
    enc = OneHotEncoding([f"g{i}" for i in range(4)], [list(range(3))] * 4)
    codes = np.array([enc.encode(list(rng.integers(0, 3, 4))) for _ in range(40)])
    truth = rng.normal(size=enc.n_bits)
    posterior = BayesianQuadratic().fit(codes, codes @ truth)
    mean, spread = posterior.predict(codes)
    assert np.allclose(mean, posterior.mean().energy(codes))
    assert np.allclose(posterior.draw(rng, 0.0).linear, posterior.mean().linear)
    far = np.array([enc.encode([v] * 4) for v in range(3)])
    assert spread.mean() < posterior.predict(far)[1].mean()


def _random_bqm(rng: np.random.Generator, n: int) -> dimod.BinaryQuadraticModel:
    linear = rng.normal(0, 1, n) * (rng.random(n) < 0.8)  # some zero biases
    quadratic = np.triu(rng.normal(0, 1, (n, n)) * (rng.random((n, n)) < 0.7), 1)
    return dimod.BinaryQuadraticModel(linear, quadratic, 0.0, "BINARY")


@pytest.mark.parametrize("seed", range(4))
def test_beta_range_is_dwave_samplers_default(seed: int) -> None:
    from dwave.samplers.sa.sampler import _default_ising_beta_range

    from qubo._solve import _beta_range

    bqm = _random_bqm(np.random.default_rng(seed), 12)
    ising = bqm.spin
    expected = _default_ising_beta_range(ising.linear, ising.quadratic)
    np.testing.assert_allclose(_beta_range(bqm), expected, rtol=1e-12)
    empty = dimod.BinaryQuadraticModel({0: 0.0, 1: 0.0}, {}, 0.0, "BINARY")
    assert _beta_range(empty) == (0.1, 1.0)


def test_annealing_schedule_is_the_default_without_its_hottest_sweeps() -> None:
    from qubo import annealing_schedule
    from qubo._solve import _beta_range

    bqm = _random_bqm(np.random.default_rng(7), 15)
    hot, cold = _beta_range(bqm)
    default = np.geomspace(hot, cold, 1000)
    np.testing.assert_array_equal(annealing_schedule(bqm, hot_start=1.0), default)
    betas = annealing_schedule(bqm, hot_start=16.0)
    np.testing.assert_array_equal(betas, default[-len(betas) :])
    assert betas[0] >= 16 * hot and default[-len(betas) - 1] < 16 * hot
    # What ``solve`` passes: the default's coldest betas from 8 times its hot end on.
    short = annealing_schedule(bqm)
    assert short[0] >= 8 * hot and short[-1] == cold and len(betas) < len(short) < 1000
    with pytest.raises(ValueError, match="hot_start"):
        annealing_schedule(bqm, hot_start=0.5)
    with pytest.raises(ValueError, match="num_sweeps"):
        annealing_schedule(bqm, num_sweeps=1)


def test_solve_gives_the_annealer_the_schedule_unless_the_caller_sets_one() -> None:
    from dwave.samplers import SimulatedAnnealingSampler

    from qubo import annealing_schedule

    calls: list[dict[str, object]] = []

    class Recording(SimulatedAnnealingSampler):  # type: ignore[misc]
        def sample(self, bqm: dimod.BinaryQuadraticModel, **kwargs: object) -> dimod.SampleSet:
            calls.append(dict(kwargs, bqm=bqm))
            return super().sample(bqm, **kwargs)

    rng = np.random.default_rng(2)
    enc = OneHotEncoding(["a", "b", "c"], [range(4), range(4), range(3)])
    problem = QUBOProblem(enc)
    model = _random_model(enc.n_bits, rng)
    solution = solve(problem, model, sampler=Recording(), seed=3)
    codes = _codes(enc)
    assert solution.codes[0].tolist() == codes[np.argmin(model.energy(codes))].tolist()
    assert calls[0]["beta_schedule_type"] == "custom"
    expected = annealing_schedule(calls[0]["bqm"])  # type: ignore[arg-type]
    np.testing.assert_array_equal(calls[0]["beta_schedule"], expected)
    solve(problem, model, sampler=Recording(), seed=3, sampler_kwargs={"num_sweeps": 200})
    assert "beta_schedule" not in calls[1] and calls[1]["num_sweeps"] == 200
