from __future__ import annotations

import io
import logging

import optuna
import pytest

from optuna_hpcnas._cli_util import format_duration
from optuna_hpcnas._cli_util import mask_url
from optuna_hpcnas._cli_util import MaskingFilter
from optuna_hpcnas._cli_util import mpi_rank_and_size
from optuna_hpcnas._cli_util import ProgressReporter
from optuna_hpcnas._cli_util import warn_if_sqlite_shared
from optuna_hpcnas.config import parse_overrides


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql+psycopg://nas:pa:ss@db/x", "postgresql+psycopg://nas:***@db/x"),
        ("mysql+pymysql://root:@127.0.0.1/test", "mysql+pymysql://root:***@127.0.0.1/test"),
        ("postgresql://nas@db/x", "postgresql://nas@db/x"),
        ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
        (
            "use a=postgresql://u:p@h/d and b=mysql://v:q@h/d",
            "use a=postgresql://u:***@h/d and b=mysql://v:***@h/d",
        ),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_masking_filter_masks_library_log_records() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(MaskingFilter())
    logger = logging.getLogger("test_masking_filter")
    logger.addHandler(handler)
    try:
        logger.warning("cannot connect to %s", "postgresql://nas:hunter2@db/optuna")
    finally:
        logger.removeHandler(handler)
    assert "hunter2" not in stream.getvalue()
    assert "postgresql://nas:***@db/optuna" in stream.getvalue()


def test_parse_overrides_reads_toml_values() -> None:
    got = parse_overrides(["study.n_trials=20", "sampler.name=tpe", "x.flag=true", "x.l=[1, 2]"])
    assert got == {"study.n_trials": 20, "sampler.name": "tpe", "x.flag": True, "x.l": [1, 2]}
    with pytest.raises(ValueError, match="section.key=value"):
        parse_overrides(["n_trials"])
    with pytest.raises(ValueError, match="section.key=value"):
        parse_overrides(["bad key=1"])


def test_rank_from_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(
        "sys.modules", {k: v for k, v in __import__("sys").modules.items() if k != "mpi4py.MPI"}
    )
    assert mpi_rank_and_size() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("PMI_SIZE", "8")
    assert mpi_rank_and_size() == (3, 8)


def test_sqlite_shared_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert not warn_if_sqlite_shared("sqlite:///a.db", n_processes=1)
        assert not warn_if_sqlite_shared("postgresql://u:p@h/d", n_processes=8)
        assert warn_if_sqlite_shared("sqlite:///a.db", n_processes=4)
        assert warn_if_sqlite_shared("sqlite:///a.db", n_processes=1, running_trials=2)
    assert "used by 4 processes" in caplog.text
    assert "RUNNING" in caplog.text


def test_format_duration() -> None:
    assert format_duration(5) == "5s"
    assert format_duration(65) == "1m05s"
    assert format_duration(3725) == "1h02m05s"


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
