"""Solve a ``QUBOProblem`` for one drawn surrogate with any ``dimod.Sampler``.

The default sampler is ``dwave.samplers.SimulatedAnnealingSampler``; ``dimod.ExactSolver``
or a D-Wave QPU (wrapped in an embedding composite) plug in unchanged. Keyword arguments the
sampler does not declare in ``sampler.parameters`` are not passed to it (so ``num_reads`` and
``seed`` reach annealers but not ``ExactSolver``).

Decoding keeps the code bits (slack variables are dropped), repairs infeasible samples with
``QUBOProblem.repair`` (one bit per group, then group-wise descent) and drops those it cannot
repair, removes already evaluated codes and duplicates, and sorts the rest by surrogate
energy. When every sample is an evaluated code (the surrogate is confident), the feasible,
unseen codes one group away from them take their place.

With ``SimulatedAnnealingSampler`` and no schedule of the caller's, ``solve`` passes the
anneal's inverse temperatures itself (``annealing_schedule``): dwave-samplers' default
geometric schedule without its hottest sweeps (computed in numpy: dwave-samplers loops over
every coupling in Python, 1.5 ms of a 30-bit ask).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
import math
import time
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

from qubo._bqm import QUBOProblem
from qubo._surrogate import QuadraticModel

if TYPE_CHECKING:
    import dimod  # imported where it runs, so that `import qubo` stays numpy-only


@dataclass(frozen=True)
class Solution:
    """Decoded, feasible, new codes (best surrogate energy first) and sampling facts.

    ``info`` holds ``n_variables`` (BQM size, slack included), ``n_samples``,
    ``feasible_rate`` (share of raw samples feasible before repair), ``n_repaired``,
    ``n_dropped``, ``n_neighbours`` (codes one group away from the samples, used when every
    sample was already evaluated), ``solve_time_s``, ``min_bqm_energy`` and ``sampler``.
    """

    codes: np.ndarray
    energies: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)


def default_sampler() -> dimod.Sampler:
    """``dwave.samplers.SimulatedAnnealingSampler()``."""
    from dwave.samplers import SimulatedAnnealingSampler

    return SimulatedAnnealingSampler()


# Sweeps of dwave-samplers' default schedule, and how much colder than its hot end ours starts.
_DEFAULT_SWEEPS = 1000
_HOT_START = 8.0
# Keyword arguments by which a caller sets the annealer's schedule itself.
_SCHEDULE_KEYS = frozenset(
    {"beta_range", "beta_schedule", "beta_schedule_type", "num_sweeps", "num_sweeps_per_beta"}
)


def _beta_range(bqm: dimod.BinaryQuadraticModel) -> tuple[float, float]:
    """dwave-samplers' default ``(hot, cold)`` inverse temperatures of ``bqm``, from its Ising
    form: hot flips a spin against its largest possible field with probability 1/2, cold
    excites the spins of the smallest non-zero bias with probability 0.01 in all (the
    formula of ``dwave.samplers.sa.sampler._default_ising_beta_range``, in numpy instead
    of a Python loop over the couplings)."""
    # A copy, not the ``bqm.spin`` view, whose vectors are read one bias at a time in Python.
    import dimod

    vectors = bqm.change_vartype(dimod.SPIN, inplace=False).to_numpy_vectors()
    irow, icol, qdata = vectors.quadratic
    h, j = np.abs(vectors.linear_biases), np.abs(qdata)
    field = h.copy()
    np.add.at(field, irow, j)
    np.add.at(field, icol, j)
    smallest = np.where(h > 0, h, np.inf)
    nonzero = j > 0
    np.minimum.at(smallest, irow[nonzero], j[nonzero])
    np.minimum.at(smallest, icol[nonzero], j[nonzero])
    smallest = smallest[np.isfinite(smallest)]
    if not len(smallest):
        return 0.1, 1.0  # every bias is zero: dwave-samplers' own fallback
    hot = math.log(2.0) / (2.0 * float(field.max()))
    low = float(smallest.min())
    count = int(np.sum(smallest == low))
    return hot, math.log(count / 0.01) / (2.0 * low)


def annealing_schedule(
    bqm: dimod.BinaryQuadraticModel,
    *,
    num_sweeps: int = _DEFAULT_SWEEPS,
    hot_start: float = _HOT_START,
) -> np.ndarray:
    """The inverse temperatures (one per sweep) ``solve`` gives ``SimulatedAnnealingSampler``:
    its default geometric schedule of ``num_sweeps`` betas for ``bqm``, without the betas
    below ``hot_start`` times its hot end (``hot_start=1``: the default schedule itself).

    The default hot end lets every spin flip against the largest field of the BQM, which the
    one-hot penalties set. There every read is still random, yet those sweeps cost the most:
    nearly every flip is accepted, and each accepted flip updates the fields of all its
    neighbours. Starting 8 times colder (the default) keeps the default's coldest 855 of
    1,000 betas on NAS-Bench-201 and on the dense quadratic and cuts the anneal's time by
    about 43 %; on the BQMs of real asks (those two, a quadratic with a budget, digits with
    a penalty; 4-6 seeds of 32 reads each) the reads' best and mean energies stayed those of
    the whole schedule within their noise, also 16 times colder, and 32 times colder they
    began to rise.

    Examples:
        >>> import dimod
        >>> bqm = dimod.BinaryQuadraticModel({0: 1.0, 1: -0.5}, {(0, 1): 2.0}, 0.0, "BINARY")
        >>> full, short = annealing_schedule(bqm, hot_start=1.0), annealing_schedule(bqm)
        >>> len(full), bool(short[0] >= 8 * full[0]), bool(short[-1] == full[-1])
        (1000, True, True)
    """
    if isinstance(num_sweeps, bool) or not isinstance(num_sweeps, int) or num_sweeps < 2:
        raise ValueError(f"`num_sweeps` is {num_sweeps!r}, but must be an integer >= 2.")
    if not hot_start >= 1.0:
        raise ValueError(f"`hot_start` is {hot_start!r}, but must be >= 1.")
    hot, cold = _beta_range(bqm)
    betas = np.geomspace(hot, cold, num_sweeps)
    if cold <= hot * hot_start:
        return betas
    return betas[betas >= hot * hot_start * (1.0 - 1e-12)]


def _schedule_kwargs(
    sampler: dimod.Sampler, bqm: dimod.BinaryQuadraticModel, given: Mapping[str, Any]
) -> dict[str, Any]:
    """``annealing_schedule`` for dwave-samplers' ``SimulatedAnnealingSampler`` when the
    caller set no schedule of its own; nothing for any other sampler."""
    try:
        from dwave.samplers import SimulatedAnnealingSampler
    except ImportError:  # pragma: no cover - dwave-samplers is a dependency
        return {}
    if not isinstance(sampler, SimulatedAnnealingSampler) or _SCHEDULE_KEYS & set(given):
        return {}
    return {"beta_schedule_type": "custom", "beta_schedule": annealing_schedule(bqm)}


def _feasible_codes(
    problem: QUBOProblem,
    model: QuadraticModel,
    raw: np.ndarray,
    feasible: np.ndarray,
    max_repairs: int,
) -> tuple[dict[bytes, np.ndarray], int, int]:
    """The distinct feasible samples, plus up to ``max_repairs`` distinct infeasible ones
    repaired; with the numbers repaired and dropped."""
    kept: dict[bytes, np.ndarray] = {}
    for x in raw[feasible]:
        kept.setdefault(x.tobytes(), x)
    n_repaired = n_dropped = 0
    tried: set[bytes] = set()
    for x in raw[~feasible]:
        key = x.tobytes()
        if key in tried:
            continue
        tried.add(key)
        if len(tried) > max_repairs:
            n_dropped += 1
            continue
        fixed = problem.repair(x, model)
        if problem.is_feasible(fixed):
            n_repaired += 1
            kept.setdefault(fixed.tobytes(), fixed)
        else:
            n_dropped += 1
    return kept, n_repaired, n_dropped


def solve(
    problem: QUBOProblem,
    model: QuadraticModel,
    *,
    sampler: dimod.Sampler | None = None,
    evaluated: Sequence[np.ndarray] = (),
    evaluated_penalty: float = 0.0,
    num_reads: int = 32,
    seed: int | None = None,
    max_repairs: int = 8,
    sampler_kwargs: Mapping[str, Any] | None = None,
) -> Solution:
    """Build the BQM of ``model``, sample it and decode.

    Examples:
        >>> import numpy as np
        >>> from qubo import OneHotEncoding, QUBOProblem, QuadraticModel
        >>> problem = QUBOProblem(OneHotEncoding(["a", "b"], [[0, 1, 2], [0, 1]]))
        >>> model = QuadraticModel(np.array([1.0, -1.0, 0.5, 0.0, 2.0]), np.zeros((5, 5)))
        >>> solve(problem, model, seed=0).codes[0].tolist()
        [0, 1, 0, 1, 0]
    """
    if sampler is None:
        sampler = default_sampler()
    if isinstance(num_reads, bool) or not isinstance(num_reads, int) or num_reads < 1:
        raise ValueError(f"`num_reads` is {num_reads!r}, but must be an integer >= 1.")
    n = problem.n_bits
    bqm = problem.build_bqm(model, evaluated=evaluated, evaluated_penalty=evaluated_penalty)
    kwargs: dict[str, Any] = {"num_reads": num_reads, "seed": seed}
    kwargs.update(_schedule_kwargs(sampler, bqm, sampler_kwargs or {}))
    kwargs.update(sampler_kwargs or {})
    accepted = set(getattr(sampler, "parameters", {}) or {})
    kwargs = {k: v for k, v in kwargs.items() if k in accepted and v is not None}
    start = time.perf_counter()
    sampleset = sampler.sample(bqm, **kwargs)
    samples = np.asarray(sampleset.record.sample)
    order = list(sampleset.variables)
    elapsed = time.perf_counter() - start
    columns = [order.index(i) for i in range(n)]
    raw = samples[:, columns].astype(np.uint8)
    if "num_occurrences" in sampleset.record.dtype.names:
        raw = np.repeat(raw, sampleset.record.num_occurrences, axis=0)
    feasible = problem.n_violations(raw) == 0 if len(raw) else np.zeros(0, dtype=bool)
    seen = {np.asarray(c, dtype=np.uint8).tobytes() for c in evaluated}
    kept, n_repaired, n_dropped = _feasible_codes(problem, model, raw, feasible, max_repairs)
    new = [x for key, x in kept.items() if key not in seen]
    n_neighbours = 0
    if not new and kept:
        # Every sample is an evaluated code: fall back to their best unseen neighbours.
        new = problem.neighbours(list(kept.values())[:8], exclude=seen)
        n_neighbours = len(new)
    codes = np.array(new, dtype=np.uint8).reshape(len(new), n)
    energies = model.energy(codes) if len(codes) else np.zeros(0)
    rank = np.argsort(energies, kind="stable")
    info = {
        "n_variables": int(bqm.num_variables),
        "n_samples": len(raw),
        "feasible_rate": float(feasible.mean()) if len(raw) else 0.0,
        "n_repaired": n_repaired,
        "n_dropped": n_dropped,
        "n_neighbours": n_neighbours,
        "solve_time_s": elapsed,
        "min_bqm_energy": float(sampleset.record.energy.min()) if len(raw) else float("nan"),
        "sampler": type(sampler).__name__,
    }
    return Solution(codes[rank], energies[rank], info)
