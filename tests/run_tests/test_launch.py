"""What world rank 0 does around the search: the SQLite-sharing warning and the progress
(lines, a bar, the /metrics series), read from the storage."""

from __future__ import annotations

import io
import logging

import optuna
import pytest

from optuna_hpcnas.run._launch import warn_if_sqlite_shared
from optuna_hpcnas.run._progress import ProgressReporter


def test_sqlite_shared_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert not warn_if_sqlite_shared("sqlite:///a.db", n_processes=1)
        assert not warn_if_sqlite_shared("postgresql://u:p@h/d", n_processes=8)
        assert not warn_if_sqlite_shared("sqlite:///a.db", n_processes=2)  # one machine's few
        assert warn_if_sqlite_shared("sqlite:///a.db", n_processes=8)
        assert warn_if_sqlite_shared("sqlite:///a.db", n_processes=1, running_trials=2)
    assert "used by 8 processes" in caplog.text and "by 2 processes" not in caplog.text
    assert "RUNNING" in caplog.text


def _study(url: str) -> optuna.Study:
    study = optuna.create_study(study_name="p", storage=url)
    return study


def test_progress_plain_lines_once_per_trial(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    study = _study(url)
    stream = io.StringIO()
    reporter = ProgressReporter(url, "p", n_trials=4, stream=stream, tty=False)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    reporter.poll(study)
    reporter.poll(study)  # nothing new: no new lines
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    reporter.poll(study)
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["0", "1", "2"]
    # two trials finished between two polls: each line counts at its own finish
    assert "[1/4 finished]" in lines[0] and "[2/4 finished]" in lines[1]
    assert "[3/4 finished]" in lines[-1]
    assert "COMPLETE" in lines[0] and "best=" in lines[0]


def test_progress_bar_on_tty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    study = _study(url)
    stream = io.StringIO()
    reporter = ProgressReporter(url, "p", n_trials=5, stream=stream, tty=True)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    reporter.poll(study)
    reporter.stop()
    out = stream.getvalue()
    assert "3/5" in out and "trial" in out and "best=" in out
    assert "COMPLETE" not in out  # a bar, not log lines


def test_progress_thread_follows_the_storage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    stream = io.StringIO()
    reporter = ProgressReporter(url, "p", n_trials=2, interval=0.05, stream=stream, tty=False)
    reporter.start()  # before the study exists: it waits for it
    study = _study(url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    reporter.stop()  # a last poll happens on stop
    assert len(stream.getvalue().splitlines()) == 2


def test_progress_feeds_metrics_from_the_storage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from optuna_hpcnas.metrics import SearchMetrics

    url = f"sqlite:///{tmp_path / 'p.db'}"
    study = _study(url)
    metrics = SearchMetrics()
    reporter = ProgressReporter(
        url, "p", n_trials=4, stream=io.StringIO(), display=False, metrics=metrics
    )
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    runs = [{"ranks": [{"rank": 0, "shares": {"compute": 0.8}}, {"rank": 1, "shares": {
        "compute": 0.6}}]}]  # fmt: skip
    study._storage.set_study_system_attr(
        study._study_id, "hpcnas:distributed:utilisation", json.dumps(runs)
    )
    reporter.poll(study)
    text = metrics.exposition().decode()
    assert 'hpcnas_trials{state="COMPLETE"} 2.0' in text
    assert "hpcnas_search_progress_ratio 0.5" in text
    assert 'hpcnas_trials_finished_total{state="COMPLETE"} 2.0' in text
    assert 'hpcnas_rank_compute_share_ratio{rank="1"} 0.6' in text
    assert 'hpcnas_evaluation_seconds_count{state="COMPLETE"} 2.0' in text
