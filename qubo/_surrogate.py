"""Second-order surrogates of a black box over binary codes.

A surrogate is fitted on ``(bits, objective)`` pairs (objective minimised) and *draws* one
quadratic acquisition function, ``QuadraticModel``, which the BQM builder turns into a QUBO:

* ``BayesianQuadratic`` (BOCS-like): a Bayesian linear model over the bits and all their
  pairwise products with Gaussian priors; ``draw`` returns an exact Thompson sample of the
  posterior (Matheron's rule in the kernel form, so it costs O(N^3 + N n^2), not O(n^6)),
  tempered by ``exploration``. Prior scales and noise are chosen by marginal likelihood on a
  small grid.
* ``FactorizationMachine`` (FMQA-like): ``w0 + <w, x> + sum_{i<j} <v_i, v_j> x_i x_j``
  trained by full-batch Adam; ``draw`` refits on a bootstrap resample from a random start,
  which gives the diversity that annealing on a single point estimate lacks.

Pure numpy.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
import math

import numpy as np


@dataclass(frozen=True)
class QuadraticModel:
    """``offset + linear @ x + x @ quadratic @ x`` with ``quadratic`` strictly upper triangular.

    Examples:
        >>> import numpy as np
        >>> m = QuadraticModel(np.array([1.0, -2.0]), np.array([[0.0, 3.0], [0.0, 0.0]]))
        >>> m.energy(np.array([[1, 1], [0, 1]])).tolist()
        [2.0, -2.0]
    """

    linear: np.ndarray
    quadratic: np.ndarray
    offset: float = 0.0

    def __post_init__(self) -> None:
        linear = np.asarray(self.linear, dtype=float)
        quadratic = np.triu(np.asarray(self.quadratic, dtype=float), 1)
        n = linear.shape[0]
        if linear.ndim != 1 or quadratic.shape != (n, n):
            raise ValueError(
                f"`linear` has shape {linear.shape} and `quadratic` {quadratic.shape}; "
                "expected (n,) and (n, n)."
            )
        object.__setattr__(self, "linear", linear)
        object.__setattr__(self, "quadratic", quadratic)

    @property
    def n_bits(self) -> int:
        return int(self.linear.shape[0])

    def energy(self, bits: np.ndarray) -> np.ndarray:
        """Energies of the rows of ``bits`` (a 1-D array gives a 0-d array)."""
        x = np.asarray(bits, dtype=float)
        return self.offset + x @ self.linear + ((x @ self.quadratic) * x).sum(axis=-1)


def _check_data(bits: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(bits, dtype=float)
    y = np.asarray(values, dtype=float)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"Expected bits (N, n) and values (N,), got {x.shape} and {y.shape}.")
    if x.shape[0] == 0:
        raise ValueError("A surrogate needs at least one observation.")
    if not np.all(np.isfinite(y)):
        raise ValueError("Objective values must be finite.")
    return x, y


def _log_h(z: np.ndarray) -> np.ndarray:
    """``log(z Phi(z) + phi(z))``, the log expected improvement of a unit normal over ``-z``."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    near = z > -6.0
    zn = z[near]
    cdf = 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in zn])
    pdf = np.exp(-0.5 * zn**2) / math.sqrt(2.0 * math.pi)
    out[near] = np.log(np.maximum(zn * cdf + pdf, 1e-300))
    # Far in the tail: h(z) = phi(z) / z^2 * (1 - 3 / z^2 + 15 / z^4 - ...).
    zf = z[~near]
    inv = 1.0 / zf**2
    out[~near] = (
        -0.5 * zf**2
        - 0.5 * math.log(2.0 * math.pi)
        + np.log(inv * (1.0 - 3.0 * inv + 15.0 * inv**2))
    )
    return out


def _standardise(y: np.ndarray) -> np.ndarray:
    std = float(y.std())
    return (y - y.mean()) / (std if std > 0 else 1.0)


class Surrogate(abc.ABC):
    """Fits ``(bits, values)`` (values minimised) and draws one quadratic acquisition."""

    @abc.abstractmethod
    def draw(
        self, bits: np.ndarray, values: np.ndarray, rng: np.random.Generator
    ) -> QuadraticModel:
        """A quadratic model of ``values`` over ``bits`` (a posterior draw or a fit)."""


class BayesianQuadratic(Surrogate):
    """Bayesian linear regression on bits and pairwise products, sampled by Thompson sampling.

    Args:
        exploration: Scale of the posterior deviation in the draw: ``1.0`` is a Thompson
            sample, ``0.0`` the posterior mean, values between a tempered Thompson sample.
            The default 0.5 had the lowest regret at 50 and 100 trials in
            ``bench/qubo_regret.py``.
        noise_grid: Candidate noise variances (of the standardised objective).
        pairwise_share_grid: Candidate shares of the prior signal variance carried by the
            pairwise terms.

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> x = rng.integers(0, 2, size=(30, 6))
        >>> y = x[:, 0] * x[:, 1] - x[:, 2]
        >>> m = BayesianQuadratic(exploration=0.0).draw(x, y, rng)
        >>> bool(m.quadratic[0, 1] > 0.5 and m.linear[2] < -0.5)
        True
    """

    def __init__(
        self,
        *,
        exploration: float = 0.5,
        noise_grid: tuple[float, ...] = (1e-3, 1e-2, 0.05, 0.2),
        pairwise_share_grid: tuple[float, ...] = (0.1, 0.3, 0.6, 0.9),
    ) -> None:
        if isinstance(exploration, bool) or not isinstance(exploration, (int, float)):
            raise TypeError(f"`exploration` must be a float, but got {exploration!r}.")
        if not 0.0 <= exploration <= 10.0:
            raise ValueError(f"`exploration` is {exploration}, but must be in [0, 10].")
        for name, grid in (
            ("noise_grid", noise_grid),
            ("pairwise_share_grid", pairwise_share_grid),
        ):
            if not grid or any(not (float(v) > 0) for v in grid):
                raise ValueError(f"`{name}` is {grid!r}, but must hold positive numbers.")
        self._exploration = float(exploration)
        self._noise_grid = tuple(float(v) for v in noise_grid)
        self._share_grid = tuple(float(v) for v in pairwise_share_grid)

    def _posterior_basis(
        self, shared: np.ndarray, y: np.ndarray, ones: float
    ) -> tuple[float, float, float, np.ndarray, np.ndarray]:
        """Prior variances and noise by marginal likelihood, with the eigenbasis of the chosen
        kernel: ``(va, vb, noise, eigenvalues of va S + vb P, eigenvectors)``.

        For a fixed pairwise share the kernel is ``signal * M + noise * I``, so one
        eigendecomposition of ``M`` prices every signal and noise level of the grid.
        """
        pairs = shared * (shared - 1.0) / 2.0
        n_pairs = max(ones * (ones - 1.0) / 2.0, 1.0)
        best: tuple[float, float, float, float, np.ndarray, np.ndarray] | None = None
        signals = np.array([0.25, 0.5, 1.0, 2.0, 4.0])
        noises = np.array(self._noise_grid)
        for share in self._share_grid:
            ua = (1.0 - share) / max(ones, 1.0)
            ub = share / n_pairs
            lam, vec = np.linalg.eigh(ua * shared + ub * pairs)
            lam = np.maximum(lam, 0.0)
            z2 = (vec.T @ y) ** 2
            # eig[s, k, i] = signal_s * lam_i + noise_k
            eig = signals[:, None, None] * lam[None, None, :] + noises[None, :, None]
            loglik = -0.5 * (z2 / eig).sum(axis=-1) - 0.5 * np.log(eig).sum(axis=-1)
            s_idx, k_idx = np.unravel_index(int(np.argmax(loglik)), loglik.shape)
            value = float(loglik[s_idx, k_idx])
            if best is None or value > best[0]:
                signal = float(signals[s_idx])
                best = (value, signal * ua, signal * ub, float(noises[k_idx]), signal * lam, vec)
        assert best is not None
        return best[1], best[2], best[3], best[4], best[5]

    @property
    def exploration(self) -> float:
        return self._exploration

    def fit(self, bits: np.ndarray, values: np.ndarray) -> BayesianPosterior:
        """The posterior given ``(bits, values)``: its mean, predictive spread and draws."""
        x, y = _check_data(bits, values)
        y = _standardise(y)
        va, vb, noise, lam, vec = self._posterior_basis(x @ x.T, y, float(x.sum(axis=1).mean()))
        return BayesianPosterior(x, y, va, vb, noise, lam, vec)

    def draw(
        self, bits: np.ndarray, values: np.ndarray, rng: np.random.Generator
    ) -> QuadraticModel:
        return self.fit(bits, values).draw(rng, self._exploration)


@dataclass(frozen=True)
class BayesianPosterior:
    """The posterior of ``BayesianQuadratic`` on standardised values ``y`` at ``x``.

    ``va``/``vb`` are the prior variances of the linear and pairwise weights, ``noise`` the
    noise variance, and ``lam``/``vec`` the eigendecomposition of the kernel matrix
    ``va x x' + vb C(x x', 2)`` (the weights never appear: everything is in kernel form).
    """

    x: np.ndarray
    y: np.ndarray
    va: float
    vb: float
    noise: float
    lam: np.ndarray
    vec: np.ndarray

    def _solve(self, target: np.ndarray) -> np.ndarray:
        """``(K + noise I)^-1 target``."""
        return self.vec @ ((self.vec.T @ target) / (self.lam + self.noise))

    def _weights(self, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        linear = self.va * (self.x.T @ alpha)
        quadratic = self.vb * np.triu((self.x * alpha[:, None]).T @ self.x, 1)
        return linear, quadratic

    def mean(self) -> QuadraticModel:
        """The posterior mean as a quadratic model."""
        return QuadraticModel(*self._weights(self._solve(self.y)))

    def draw(self, rng: np.random.Generator, exploration: float = 1.0) -> QuadraticModel:
        """``mean + exploration * (Thompson sample - mean)``."""
        if exploration <= 0:
            return self.mean()
        # Matheron's rule: prior draw, corrected by the posterior update of its residual.
        # The draw is linear in the random parts, so scaling them by ``exploration`` gives
        # ``mean + exploration * (sample - mean)``.
        x, e = self.x, exploration
        n_obs, n = x.shape
        lin0: np.ndarray = e * np.asarray(rng.normal(0.0, math.sqrt(self.va), n))
        quad0 = e * np.triu(rng.normal(0.0, math.sqrt(self.vb), (n, n)), 1)
        prior_at_data = x @ lin0 + ((x @ quad0) * x).sum(axis=1)
        target = self.y - prior_at_data - e * rng.normal(0.0, math.sqrt(self.noise), n_obs)
        linear, quadratic = self._weights(self._solve(target))
        return QuadraticModel(lin0 + linear, quad0 + quadratic)

    def log_expected_improvement(self, bits: np.ndarray) -> np.ndarray:
        """Log of the expected improvement (noise-free) over the best standardised value
        seen, at the rows of ``bits``; ``-inf`` where the posterior is certain and no better.

        Computed in log space (an asymptotic series far in the tail), so codes whose
        improvement is astronomically unlikely still rank by how unlikely it is.
        """
        mean, sd = self.predict(bits)
        best = float(self.y.min())
        out = np.full(mean.shape, -np.inf)
        spread = sd > 1e-12
        certain = ~spread & (mean < best)
        out[certain] = np.log(best - mean[certain])
        z = (best - mean[spread]) / sd[spread]
        out[spread] = np.log(sd[spread]) + _log_h(z)
        return out

    def predict(self, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (noise-free) at the rows of ``bits``."""
        c = np.atleast_2d(np.asarray(bits, dtype=float))
        shared = c @ self.x.T
        k = self.va * shared + self.vb * shared * (shared - 1.0) / 2.0
        ones = c.sum(axis=1)
        prior = self.va * ones + self.vb * ones * (ones - 1.0) / 2.0
        projected = k @ self.vec
        mean = k @ self._solve(self.y)
        var = prior - (projected**2 / (self.lam + self.noise)).sum(axis=1)
        return mean, np.sqrt(np.maximum(var, 0.0))


class FactorizationMachine(Surrogate):
    """A factorization machine of rank ``rank`` trained by full-batch Adam.

    Args:
        rank: Dimension of the factor vectors.
        n_epochs: Adam steps per fit.
        learning_rate: Adam step size.
        l2: Weight decay of the linear and factor weights.
        bootstrap: Refit on a bootstrap resample for every draw (exploration).

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> x = rng.integers(0, 2, size=(40, 5))
        >>> y = 2.0 * x[:, 0] * x[:, 1] + x[:, 2]
        >>> m = FactorizationMachine(bootstrap=False).draw(x, y, rng)
        >>> bool(np.corrcoef(m.energy(x), y)[0, 1] > 0.9)
        True
    """

    def __init__(
        self,
        *,
        rank: int = 8,
        n_epochs: int = 300,
        learning_rate: float = 0.05,
        l2: float = 1e-3,
        bootstrap: bool = True,
    ) -> None:
        for name, value in (("rank", rank), ("n_epochs", n_epochs)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"`{name}` must be an int, but got {value!r}.")
            if value < 1:
                raise ValueError(f"`{name}` is {value}, but must be >= 1.")
        if not learning_rate > 0:
            raise ValueError(f"`learning_rate` is {learning_rate}, but must be > 0.")
        if not l2 >= 0:
            raise ValueError(f"`l2` is {l2}, but must be >= 0.")
        self._rank = rank
        self._n_epochs = n_epochs
        self._lr = float(learning_rate)
        self._l2 = float(l2)
        self._bootstrap = bool(bootstrap)

    def draw(
        self, bits: np.ndarray, values: np.ndarray, rng: np.random.Generator
    ) -> QuadraticModel:
        x, y = _check_data(bits, values)
        y = _standardise(y)
        if self._bootstrap and len(y) > 1:
            index = rng.integers(0, len(y), len(y))
            x, y = x[index], y[index]
        n_obs, n = x.shape
        params = [np.zeros(1), np.zeros(n), rng.normal(0.0, 0.1, (n, self._rank))]
        moments = [np.zeros_like(p) for p in params]
        squares = [np.zeros_like(p) for p in params]
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        for step in range(1, self._n_epochs + 1):
            w0, w, v = params
            xv = x @ v
            pred = w0[0] + x @ w + 0.5 * ((xv**2).sum(axis=1) - x @ (v**2).sum(axis=1))
            r = 2.0 * (pred - y) / n_obs
            grads = [
                np.array([r.sum()]),
                x.T @ r + self._l2 * w,
                x.T @ (r[:, None] * xv) - v * (x.T @ r)[:, None] + self._l2 * v,
            ]
            for p, g, m, s in zip(params, grads, moments, squares):
                m *= beta1
                m += (1 - beta1) * g
                s *= beta2
                s += (1 - beta2) * g * g
                p -= self._lr * (m / (1 - beta1**step)) / (np.sqrt(s / (1 - beta2**step)) + eps)
        w0, w, v = params
        return QuadraticModel(w, np.triu(v @ v.T, 1), float(w0[0]))
