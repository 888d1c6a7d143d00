"""``SearchMetrics``: the ``hpcnas_*`` Prometheus series, and the Optuna hooks that feed them.

The runner (or a user's ``study.optimize``) calls the small API of ``SearchMetrics``;
``MetricsCallback`` and ``TimedSampler`` wire it into plain Optuna. Under MPI every rank owns
its own ``SearchMetrics``; with ``PROMETHEUS_MULTIPROC_DIR`` set (see ``enable_multiprocess``)
the values of all ranks are merged when rank 0 serves ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
import time
from typing import Any
from typing import TYPE_CHECKING

from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial
    from prometheus_client import CollectorRegistry

# Every series, in base units (seconds, bytes, ratios in [0, 1]).
METRIC_NAMES = (
    "hpcnas_trials",
    "hpcnas_trials_finished_total",
    "hpcnas_search_target_trials",
    "hpcnas_search_progress_ratio",
    "hpcnas_evaluation_seconds",
    "hpcnas_sampler_ask_seconds",
    "hpcnas_rank_busy_seconds_total",
    "hpcnas_rank_compute_share_ratio",
    "hpcnas_checkpoint_bytes_total",
    "hpcnas_checkpoints_total",
    "hpcnas_best_value",
    "hpcnas_pareto_front_trials",
)

_EVAL_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_ASK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_STATES = tuple(s.name for s in TrialState)


def _state_name(state: TrialState | str) -> str:
    name = state.name if isinstance(state, TrialState) else str(state).upper()
    if name not in _STATES:
        raise ValueError(f"`state` is {state!r}, but must be one of {list(_STATES)}.")
    return name


def _check_seconds(name: str, seconds: float) -> float:
    check_number(name, seconds, positive=False, minimum=0)
    return float(seconds)


class SearchMetrics:
    """The Prometheus series of one search process (one MPI rank).

    Args:
        registry: Registry to register the series in; a private one by default (so two
            instances never collide). Serve it with ``serve_metrics``.

    Examples:
        >>> metrics = SearchMetrics()
        >>> metrics.trial_finished("COMPLETE", 2.5, rank=0)
        >>> metrics.observe_ask(0.004)
        >>> metrics.add_checkpoint_bytes(1024)
        >>> b"hpcnas_checkpoint_bytes_total 1024.0" in metrics.exposition()
        True
    """

    def __init__(self, *, registry: CollectorRegistry | None = None) -> None:
        try:
            import prometheus_client as pc
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(
                "Metrics need prometheus_client: pip install 'optuna-hpcnas[metrics]'."
            ) from e
        if registry is None:
            registry = pc.CollectorRegistry()
        elif not isinstance(registry, pc.CollectorRegistry):
            raise TypeError(
                f"`registry` must be a prometheus_client.CollectorRegistry, but got {registry!r}."
            )
        self._registry = registry
        self._declare_search_series(pc, registry)
        self._declare_rank_series(pc, registry)
        for state in TrialState:
            self.trials.labels(state=state.name)
            if state.is_finished():
                self.trials_finished.labels(state=state.name)

    def _declare_search_series(self, pc: Any, r: CollectorRegistry) -> None:
        """Study-wide series: trials, target, progress, evaluation and ask seconds."""
        self.trials = pc.Gauge(
            "hpcnas_trials",
            "Trials of the study by state, as stored.",
            ["state"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.trials_finished = pc.Counter(
            "hpcnas_trials_finished",
            "Trials finished by this job, by final state.",
            ["state"],
            registry=r,
        )
        self.target_trials = pc.Gauge(
            "hpcnas_search_target_trials",
            "Number of trials the search is asked to run.",
            registry=r,
            multiprocess_mode="max",
        )
        self.progress = pc.Gauge(
            "hpcnas_search_progress_ratio",
            "Finished trials over the target number of trials (0 to 1).",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.evaluation_seconds = pc.Histogram(
            "hpcnas_evaluation_seconds",
            "Wall-clock seconds of one trial evaluation, by final state.",
            ["state"],
            buckets=_EVAL_BUCKETS,
            registry=r,
        )
        self.ask_seconds = pc.Histogram(
            "hpcnas_sampler_ask_seconds",
            "Seconds the sampler spent on one trial (ask and suggestions).",
            buckets=_ASK_BUCKETS,
            registry=r,
        )

    def _declare_rank_series(self, pc: Any, r: CollectorRegistry) -> None:
        """Per-rank and per-run series: busy time, compute share, checkpoints, best, front."""
        self.rank_busy_seconds = pc.Counter(
            "hpcnas_rank_busy_seconds",
            "Seconds each rank spent evaluating candidates.",
            ["rank"],
            registry=r,
        )
        self.compute_share = pc.Gauge(
            "hpcnas_rank_compute_share_ratio",
            "Share of its wall-clock time each rank spent computing (0 to 1).",
            ["rank"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.checkpoint_bytes = pc.Counter(
            "hpcnas_checkpoint_bytes",
            "Bytes written to checkpoints.",
            registry=r,
        )
        self.checkpoints = pc.Counter("hpcnas_checkpoints", "Checkpoints written.", registry=r)
        self.best_value = pc.Gauge(
            "hpcnas_best_value",
            "Best objective value so far (single-objective studies), by objective name.",
            ["objective"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.pareto_front = pc.Gauge(
            "hpcnas_pareto_front_trials",
            "Trials on the Pareto front (multi-objective studies).",
            registry=r,
            multiprocess_mode="mostrecent",
        )

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (what ``/metrics`` answers)."""
        from prometheus_client import generate_latest

        return generate_latest(self._registry)

    # ------------------------------------------------------------------ events
    def observe_ask(self, seconds: float) -> None:
        """Record the seconds the sampler needed for one trial."""
        self.ask_seconds.observe(_check_seconds("seconds", seconds))

    def trial_finished(self, state: TrialState | str, seconds: float, *, rank: int = 0) -> None:
        """Record one finished evaluation: its final state and wall-clock seconds."""
        name = _state_name(state)
        seconds = _check_seconds("seconds", seconds)
        self.trials_finished.labels(state=name).inc()
        self.evaluation_seconds.labels(state=name).observe(seconds)
        self.rank_busy_seconds.labels(rank=str(int(rank))).inc(seconds)

    def set_compute_share(self, rank: int, share: float) -> None:
        """Set the share (0 to 1) of its time ``rank`` spent computing."""
        share = _check_seconds("share", share)
        if share > 1.0:
            raise ValueError(f"`share` is {share!r}, but must be in [0, 1].")
        self.compute_share.labels(rank=str(int(rank))).set(share)

    def add_checkpoint_bytes(self, n: int) -> None:
        """Record one checkpoint of ``n`` bytes."""
        check_int("n", n, 0)
        self.checkpoint_bytes.inc(n)
        self.checkpoints.inc()

    def set_target(self, n_trials: int | None) -> None:
        """The number of trials the search aims for (``None``: unbounded)."""
        check_int("n_trials", n_trials, 1, allow_none=True)
        self.target_trials.set(float(n_trials) if n_trials else 0.0)

    def update_from_study(self, study: Study, *, n_trials: int | None = None) -> None:
        """Refresh the study-wide series (trials by state, progress, best) from the storage."""
        trials = study.get_trials(deepcopy=False)
        counts = dict.fromkeys(_STATES, 0)
        for t in trials:
            counts[t.state.name] += 1
        for name, count in counts.items():
            self.trials.labels(state=name).set(count)
        if n_trials is not None:
            self.set_target(n_trials)
            finished = sum(1 for t in trials if t.state.is_finished())
            self.progress.set(min(1.0, finished / n_trials))
        completed = [t for t in trials if t.state == TrialState.COMPLETE]
        if not completed:
            return
        if len(study.directions) == 1:
            names = study.metric_names or ["objective"]
            self.best_value.labels(objective=names[0]).set(study.best_value)
        else:
            self.pareto_front.set(len(study.best_trials))


class MetricsCallback:
    """An Optuna callback for ``study.optimize`` that feeds a ``SearchMetrics``.

    Args:
        metrics: The series to update.
        n_trials: The trial target, for ``hpcnas_search_progress_ratio``.
        rank: The rank this process evaluates on.
        refresh_seconds: Study-wide series are re-read from the storage at most this often.

    Examples:
        >>> import optuna
        >>> metrics = SearchMetrics()
        >>> study = optuna.create_study()
        >>> study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3,
        ...                callbacks=[MetricsCallback(metrics, n_trials=3)])
    """

    def __init__(
        self,
        metrics: SearchMetrics,
        *,
        n_trials: int | None = None,
        rank: int = 0,
        refresh_seconds: float = 5.0,
    ) -> None:
        if not isinstance(metrics, SearchMetrics):
            raise TypeError(f"`metrics` must be a SearchMetrics, but got {metrics!r}.")
        check_int("n_trials", n_trials, 1, allow_none=True)
        self._metrics = metrics
        self._n_trials = n_trials
        self._rank = rank
        self._refresh = _check_seconds("refresh_seconds", refresh_seconds)
        self._last_refresh = -math.inf
        self._started = time.monotonic()
        self._busy = 0.0

    def __call__(self, study: Study, trial: FrozenTrial) -> None:
        seconds = 0.0
        if trial.datetime_start is not None and trial.datetime_complete is not None:
            seconds = max(0.0, (trial.datetime_complete - trial.datetime_start).total_seconds())
        self._metrics.trial_finished(trial.state, seconds, rank=self._rank)
        self._busy += seconds
        wall = time.monotonic() - self._started
        if wall > 0:
            self._metrics.set_compute_share(self._rank, min(1.0, self._busy / wall))
        now = time.monotonic()
        if now - self._last_refresh >= self._refresh:
            self._last_refresh = now
            self._metrics.update_from_study(study, n_trials=self._n_trials)


class TimedSampler(BaseSampler):
    """Wrap a sampler and record its seconds per trial in ``hpcnas_sampler_ask_seconds``.

    The time of ``infer_relative_search_space``, ``sample_relative``, ``sample_independent``
    and ``before_trial`` is summed per trial and observed when the trial ends.

    Examples:
        >>> import optuna
        >>> metrics = SearchMetrics()
        >>> sampler = TimedSampler(optuna.samplers.RandomSampler(seed=0), metrics=metrics)
        >>> optuna.create_study(sampler=sampler).optimize(
        ...     lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    """

    def __init__(self, sampler: BaseSampler, *, metrics: SearchMetrics) -> None:
        if not isinstance(sampler, BaseSampler):
            raise TypeError(f"`sampler` must be an Optuna sampler, but got {sampler!r}.")
        if not isinstance(metrics, SearchMetrics):
            raise TypeError(f"`metrics` must be a SearchMetrics, but got {metrics!r}.")
        self._sampler = sampler
        self._metrics = metrics
        self._spent: dict[int, float] = {}

    @property
    def sampler(self) -> BaseSampler:
        """The wrapped sampler."""
        return self._sampler

    def _add(self, trial_number: int, start: float) -> None:
        self._spent[trial_number] = self._spent.get(trial_number, 0.0) + (
            time.perf_counter() - start
        )

    def __getattr__(self, name: str) -> Any:
        # Sampler-specific attributes (e.g. a GA sampler's population size) stay reachable.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sampler, name)

    def reseed_rng(self) -> None:
        self._sampler.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        start = time.perf_counter()
        self._sampler.before_trial(study, trial)
        self._add(trial.number, start)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        start = time.perf_counter()
        try:
            return self._sampler.infer_relative_search_space(study, trial)
        finally:
            self._add(trial.number, start)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return self._sampler.sample_relative(study, trial, search_space)
        finally:
            self._add(trial.number, start)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        start = time.perf_counter()
        try:
            return self._sampler.sample_independent(study, trial, param_name, param_distribution)
        finally:
            self._add(trial.number, start)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._sampler.after_trial(study, trial, state, values)
        spent = self._spent.pop(trial.number, None)
        if spent is not None:
            self._metrics.observe_ask(spent)
