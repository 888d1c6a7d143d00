"""Tabular NAS benchmark helpers: load a table, run an Optuna sampler on it, score the run.

A table has one row per architecture of a ``HierarchicalSearchSpace`` (``arch_json``, every
param, ``valid_accuracy``, ``valid_logloss``, ``test_accuracy``, ``flops``, ``params``,
``latency_ms``). ``bench/make_digits_table.py`` builds the real one for
``preset("digits-small")``; ``synthetic_table`` makes a stand-in with the same columns.

Used by ``bench/evolution_vs_peers.py``; importable from other benchmarks
(``sys.path.insert(0, "bench")``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
import math
from pathlib import Path
import time
from typing import Any

import numpy as np
import optuna

from optuna_hpcnas import HierarchicalSearchSpace

DIGITS_TABLE = Path(__file__).parent / "data" / "digits_small.parquet"
OBJECTIVE = "valid_logloss"  # minimised; accuracy ties (many archs at the top) rank nothing


@dataclass
class NASTable:
    """A tabular benchmark: rows indexed by canonical architecture JSON."""

    space: HierarchicalSearchSpace
    rows: dict[str, dict[str, Any]]
    name: str

    @property
    def archs(self) -> list[str]:
        return list(self.rows)

    def column(self, name: str) -> np.ndarray:
        return np.array([r[name] for r in self.rows.values()], dtype=float)

    def best(self, *, flops_budget: float | None = None) -> dict[str, Any]:
        """The row with the lowest objective (among those within the FLOPs budget)."""
        rows = [
            r for r in self.rows.values() if flops_budget is None or r["flops"] <= flops_budget
        ]
        return min(rows, key=lambda r: r[OBJECTIVE])

    def worst(self, *, flops_budget: float | None = None) -> dict[str, Any]:
        rows = [
            r for r in self.rows.values() if flops_budget is None or r["flops"] <= flops_budget
        ]
        return max(rows, key=lambda r: r[OBJECTIVE])


def load_table(path: Path | str = DIGITS_TABLE, *, preset: str = "digits-small") -> NASTable:
    import pyarrow.parquet as pq

    space = HierarchicalSearchSpace.preset(preset)
    rows = {r["arch_json"]: r for r in pq.read_table(path).to_pylist()}
    expected = space.cardinality()
    if len(rows) != expected:
        raise ValueError(f"{path} has {len(rows)} architectures, but the space has {expected}.")
    return NASTable(space=space, rows=rows, name=Path(path).name)


def synthetic_table(preset: str = "digits-small", seed: int = 0) -> NASTable:
    """A stand-in table: additive effects per decision, pairwise interactions and noise."""
    space = HierarchicalSearchSpace.preset(preset)
    rng = np.random.default_rng(seed)
    effects: dict[tuple[str, Any], float] = {}
    pairs: dict[tuple[Any, ...], float] = {}
    rows: dict[str, dict[str, Any]] = {}
    for arch in space.enumerate():
        params = space.to_params(arch)
        items = sorted(params.items(), key=lambda kv: kv[0])
        loss = 0.3
        for kv in items:
            loss += effects.setdefault(kv, float(rng.gamma(1.0, 0.08)))
        for a, b in zip(items, items[1:]):
            loss += pairs.setdefault((a, b), float(rng.normal(0.0, 0.03)))
        loss = max(0.05, loss + float(rng.normal(0.0, 0.02)))
        flops = sum((c.width or 8) * (3 if c.op.startswith("conv") else 1) for c in arch.cells)
        rows[arch.to_json()] = {
            "arch_json": arch.to_json(),
            **params,
            "valid_logloss": loss,
            "valid_accuracy": float(np.clip(1.0 - 0.25 * loss, 0, 1)),
            "test_accuracy": float(np.clip(1.0 - 0.25 * loss + rng.normal(0, 0.01), 0, 1)),
            "flops": float(flops * 1e4),
            "params": float(flops * 100),
            "latency_ms": float(flops * 1e-3),
        }
    return NASTable(space=space, rows=rows, name=f"synthetic-{preset}-{seed}")


# ---------------------------------------------------------------------- running samplers
@dataclass
class Run:
    """Per-trial records of one study on a table."""

    objective: np.ndarray  # valid log-loss of each trial
    test_accuracy: np.ndarray
    flops: np.ndarray
    seconds: float


def fresh_space(table: NASTable) -> HierarchicalSearchSpace:
    """A copy of the table's space for one study. A space remembers where it recorded itself
    by ``(id(storage), study_id)``; a new in-memory storage can reuse a freed id, and a shared
    space would then not record itself in the new study, hiding it from the samplers."""
    return HierarchicalSearchSpace.from_json(table.space.to_json())


def run_single(
    table: NASTable,
    sampler: optuna.samplers.BaseSampler,
    n_trials: int,
    *,
    flops_budget: float | None = None,
) -> Run:
    """One single-objective study; with a budget, ``flops - budget`` is a constraint."""
    space = fresh_space(table)
    records: list[tuple[float, float, float]] = []

    def objective(trial: optuna.Trial) -> float:
        row = table.rows[space.suggest(trial).to_json()]
        if flops_budget is not None:
            trial.set_constraint("flops", float(row["flops"]) - flops_budget)
        records.append((row[OBJECTIVE], row["test_accuracy"], row["flops"]))
        return float(row[OBJECTIVE])

    study = optuna.create_study(sampler=sampler)
    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials)
    arr = np.array(records, dtype=float)
    return Run(arr[:, 0], arr[:, 1], arr[:, 2], time.perf_counter() - start)


def run_multi(table: NASTable, sampler: optuna.samplers.BaseSampler, n_trials: int) -> Run:
    """One two-objective study: (valid log-loss, FLOPs), both minimised."""
    space = fresh_space(table)
    records: list[tuple[float, float, float]] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        row = table.rows[space.suggest(trial).to_json()]
        records.append((row[OBJECTIVE], row["test_accuracy"], row["flops"]))
        return float(row[OBJECTIVE]), float(row["flops"])

    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials)
    arr = np.array(records, dtype=float)
    return Run(arr[:, 0], arr[:, 1], arr[:, 2], time.perf_counter() - start)


# ---------------------------------------------------------------------- scores
def regret_curve(
    table: NASTable, run: Run, *, flops_budget: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Best-so-far objective regret and the test-accuracy regret of that incumbent, per trial.

    With a budget only feasible trials count; before the first feasible one, the regret is
    that of the worst feasible architecture.
    """
    best = table.best(flops_budget=flops_budget)
    worst = table.worst(flops_budget=flops_budget)
    best_test = max(
        r["test_accuracy"]
        for r in table.rows.values()
        if flops_budget is None or r["flops"] <= flops_budget
    )
    value = np.where(
        (run.flops <= flops_budget) if flops_budget is not None else True,
        run.objective,
        np.inf,
    )
    incumbent = np.minimum.accumulate(value)
    idx = np.array([int(np.argmin(value[: i + 1])) for i in range(len(value))])
    regret = np.where(np.isfinite(incumbent), incumbent, worst[OBJECTIVE]) - best[OBJECTIVE]
    test_regret = np.where(
        np.isfinite(incumbent),
        best_test - run.test_accuracy[idx],
        best_test - worst["test_accuracy"],
    )
    return regret, test_regret


def mean_ci(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of its 95% Student-t interval."""
    from scipy import stats

    x = np.asarray(samples, dtype=float)
    if len(x) < 2:
        return float(x.mean()), math.nan
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(half)


def hypervolume_2d(points: np.ndarray, reference: Sequence[float]) -> float:
    """Area dominated by ``points`` (minimised) and bounded by ``reference``."""
    pts = points[np.all(points < np.asarray(reference), axis=1)]
    if len(pts) == 0:
        return 0.0
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    area = 0.0
    front: list[tuple[float, float]] = []
    best_y = math.inf
    for x, y in pts:
        if y < best_y:
            front.append((x, y))
            best_y = y
    for k, (x, y) in enumerate(front):
        right = front[k + 1][0] if k + 1 < len(front) else reference[0]
        area += (right - x) * (reference[1] - y)
    return float(area)


class HypervolumeScale:
    """Normalises (log-loss, FLOPs) to [0, 1]: FLOPs over the table's range, log-loss from the
    table's best to its 90th percentile (worse architectures are no trade-off anyone wants,
    and a few diverged ones would otherwise flatten every difference). Reference (1, 1)."""

    def __init__(self, table: NASTable) -> None:
        ll, fl = table.column(OBJECTIVE), table.column("flops")
        self.low = np.array([ll.min(), fl.min()])
        self.high = np.array([np.quantile(ll, 0.9), fl.max()])
        all_points = self.scale(np.stack([ll, fl], axis=1))
        self.optimum = hypervolume_2d(all_points, (1.0, 1.0))

    def scale(self, points: np.ndarray) -> np.ndarray:
        return (points - self.low) / (self.high - self.low)

    def ratio(self, run: Run, n: int) -> float:
        """Hypervolume of the first ``n`` trials over that of the whole table's front."""
        pts = self.scale(np.stack([run.objective[:n], run.flops[:n]], axis=1))
        return hypervolume_2d(pts, (1.0, 1.0)) / self.optimum


# ---------------------------------------------------------------------- ask time
def ms_per_ask_on_space(
    space: HierarchicalSearchSpace,
    make_sampler: Callable[[], optuna.samplers.BaseSampler],
    n_trials: int,
    *,
    n_asks: int = 10,
    seed: int = 0,
) -> float:
    """As ``ms_per_ask`` on any space (random history, a synthetic objective): shows how the
    ask time scales with the number of trials where duplicates are rare."""
    rng = np.random.default_rng(seed)
    dists = space.distributions()

    def value(params: dict[str, Any]) -> float:
        return float(sum(hash((k, v)) % 997 for k, v in params.items()) / 997.0)

    study = optuna.create_study(sampler=make_sampler())
    history = []
    for _ in range(n_trials):
        params = space.to_params(space.sample(rng))
        history.append(
            optuna.trial.create_trial(
                params=params, distributions={n: dists[n] for n in params}, value=value(params)
            )
        )
    study.add_trials(history)

    def one() -> float:
        start = time.perf_counter()
        trial = study.ask()
        space.suggest(trial)
        elapsed = time.perf_counter() - start
        study.tell(trial, value(trial.params))
        return elapsed

    one()
    return 1000.0 * float(np.mean([one() for _ in range(n_asks)]))


def ms_per_ask(
    table: NASTable,
    make_sampler: Callable[[], optuna.samplers.BaseSampler],
    n_trials: int,
    *,
    n_asks: int = 10,
    multi_objective: bool = False,
    seed: int = 0,
) -> float:
    """Milliseconds per ``ask`` + suggest once ``n_trials`` finished trials exist.

    The history is added with ``study.add_trials`` (random architectures of the table,
    repeated beyond its size), then one warm-up ask (a sampler may build caches there), then
    ``n_asks`` timed asks, each told at once.
    """
    space = table.space
    rng = np.random.default_rng(seed)
    archs = table.archs
    dists = space.distributions()
    directions = ["minimize", "minimize"] if multi_objective else ["minimize"]
    study = optuna.create_study(directions=directions, sampler=make_sampler())
    history = []
    for _ in range(n_trials):
        row = table.rows[archs[int(rng.integers(len(archs)))]]
        params = {n: row[n] for n in dists if row.get(n) is not None}
        values = [row[OBJECTIVE], float(row["flops"])] if multi_objective else [row[OBJECTIVE]]
        history.append(
            optuna.trial.create_trial(
                params=params,
                distributions={n: dists[n] for n in params},
                values=values,
            )
        )
    study.add_trials(history)

    def one() -> float:
        start = time.perf_counter()
        trial = study.ask()
        arch = space.suggest(trial)
        elapsed = time.perf_counter() - start
        row = table.rows[arch.to_json()]
        values = [row[OBJECTIVE], float(row["flops"])] if multi_objective else row[OBJECTIVE]
        study.tell(trial, values)
        return elapsed

    one()
    return 1000.0 * float(np.mean([one() for _ in range(n_asks)]))
