from __future__ import annotations

import re
import threading
import time
import urllib.request

import optuna
import pytest

from optuna_hpcnas.metrics import METRIC_NAMES
from optuna_hpcnas.metrics import MetricsCallback
from optuna_hpcnas.metrics import SearchMetrics
from optuna_hpcnas.metrics import serve_metrics
from optuna_hpcnas.metrics import TimedSampler


def _value(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}`` of a Prometheus text exposition, or None."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def test_every_series_is_exposed_in_base_units() -> None:
    metrics = SearchMetrics()
    metrics.trial_finished("COMPLETE", 1.5, rank=1)
    metrics.observe_ask(0.01)
    metrics.set_compute_share(1, 0.75)
    metrics.add_checkpoint_bytes(4096)
    metrics.set_target(10)
    text = metrics.exposition().decode()
    for name in METRIC_NAMES:
        assert f"# HELP {name} " in text, name
    assert _value(text, "hpcnas_trials_finished_total", state="COMPLETE") == 1.0
    # Every state has a series from the start, so dashboards show zeros, not gaps.
    assert _value(text, "hpcnas_trials_finished_total", state="FAIL") == 0.0
    assert _value(text, "hpcnas_trials", state="RUNNING") == 0.0
    assert _value(text, "hpcnas_evaluation_seconds_sum", state="COMPLETE") == 1.5
    assert _value(text, "hpcnas_rank_busy_seconds_total", rank="1") == 1.5
    assert _value(text, "hpcnas_rank_compute_share_ratio", rank="1") == 0.75
    assert _value(text, "hpcnas_checkpoint_bytes_total") == 4096.0
    assert _value(text, "hpcnas_checkpoints_total") == 1.0
    assert _value(text, "hpcnas_sampler_ask_seconds_count") == 1.0
    assert _value(text, "hpcnas_search_target_trials") == 10.0


def test_two_instances_do_not_collide() -> None:
    a, b = SearchMetrics(), SearchMetrics()
    a.add_checkpoint_bytes(10)
    assert _value(b.exposition().decode(), "hpcnas_checkpoint_bytes_total") == 0.0


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda m: m.trial_finished("DONE", 1.0), ValueError),
        (lambda m: m.trial_finished("COMPLETE", -1.0), ValueError),
        (lambda m: m.observe_ask("fast"), TypeError),
        (lambda m: m.observe_ask(float("nan")), ValueError),
        (lambda m: m.set_compute_share(0, 1.5), ValueError),
        (lambda m: m.add_checkpoint_bytes(-1), ValueError),
        (lambda m: m.add_checkpoint_bytes(1.5), TypeError),
    ],
)
def test_invalid_values_are_refused(call, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        call(SearchMetrics())


def test_callback_and_timed_sampler_follow_a_study() -> None:
    metrics = SearchMetrics()
    sampler = TimedSampler(optuna.samplers.RandomSampler(seed=0), metrics=metrics)
    study = optuna.create_study(sampler=sampler)
    study.set_metric_names(["loss"])

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -1, 1)
        if trial.number == 2:
            raise optuna.TrialPruned()
        return x * x

    callback = MetricsCallback(metrics, n_trials=8, refresh_seconds=0)
    study.optimize(objective, n_trials=6, callbacks=[callback])
    text = metrics.exposition().decode()
    assert _value(text, "hpcnas_trials", state="COMPLETE") == 5.0
    assert _value(text, "hpcnas_trials", state="PRUNED") == 1.0
    assert _value(text, "hpcnas_trials_finished_total", state="PRUNED") == 1.0
    assert _value(text, "hpcnas_search_progress_ratio") == pytest.approx(6 / 8)
    assert _value(text, "hpcnas_best_value", objective="loss") == pytest.approx(study.best_value)
    assert _value(text, "hpcnas_sampler_ask_seconds_count") == 6.0
    share = _value(text, "hpcnas_rank_compute_share_ratio", rank="0")
    assert share is not None and 0.0 <= share <= 1.0


def test_scrape_during_a_run_sees_values_move() -> None:
    metrics = SearchMetrics()
    study = optuna.create_study(directions=["maximize", "minimize"])
    gate = threading.Semaphore(0)
    scraped = threading.Event()

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        x = trial.suggest_float("x", 0, 1)
        return x, x * x

    def on_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        gate.release()  # let the scraper look after every trial
        scraped.wait(timeout=30)
        scraped.clear()

    with serve_metrics(metrics, port=0) as server:
        assert server.host == "127.0.0.1"
        worker = threading.Thread(
            target=study.optimize,
            args=(objective,),
            kwargs={
                "n_trials": 4,
                "callbacks": [MetricsCallback(metrics, n_trials=4, refresh_seconds=0), on_trial],
            },
        )
        worker.start()
        seen = []
        for _ in range(4):
            assert gate.acquire(timeout=60)
            with urllib.request.urlopen(server.url, timeout=10) as response:
                text = response.read().decode()
            seen.append(
                (
                    _value(text, "hpcnas_trials_finished_total", state="COMPLETE"),
                    _value(text, "hpcnas_search_progress_ratio"),
                )
            )
            scraped.set()
        worker.join(timeout=60)
    # The counters were 1..4 and the progress 0.25..1.0 as the run went on.
    assert [s[0] for s in seen] == [1.0, 2.0, 3.0, 4.0]
    assert [s[1] for s in seen] == [0.25, 0.5, 0.75, 1.0]
    assert _value(metrics.exposition().decode(), "hpcnas_pareto_front_trials") >= 1.0  # type: ignore[operator]


def test_server_refuses_bad_port() -> None:
    with pytest.raises(ValueError, match="port"):
        serve_metrics(SearchMetrics(), port=70000)


def test_server_binds_loopback_only() -> None:
    with serve_metrics(SearchMetrics(), port=0) as server:
        start = time.monotonic()
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
        assert time.monotonic() - start >= 0
        assert server._server.server_address[0] == "127.0.0.1"
