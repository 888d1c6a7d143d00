"""The command line's own helpers: masking passwords in log records, durations, ``--set``."""

from __future__ import annotations

import io
import logging

import pytest

from optuna_hpcnas._cli_util import format_duration
from optuna_hpcnas._cli_util import MaskingFilter
from optuna_hpcnas.config import parse_overrides


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


def test_format_duration() -> None:
    assert format_duration(5) == "5s"
    assert format_duration(65) == "1m05s"
    assert format_duration(3725) == "1h02m05s"
