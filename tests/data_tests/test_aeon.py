"""``[data] name = "aeon"``: the sets aeon ships and ``.ts`` file pairs, read offline."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from optuna_hpcnas.config import DataConfig
from optuna_hpcnas.data import DataError
from optuna_hpcnas.data._aeon import aeon_splits

pytest.importorskip("aeon")


def _ts(path: Path, rows: list[tuple[list[list[float]], str]], *, classes: bool = True) -> Path:
    """A ``.ts`` file: one row per series, its channels separated by ':', then the label;
    ``@equalLength false`` when the series differ in length."""
    equal = len({len(series[0]) for series, _ in rows}) == 1
    header = [
        "@problemName toy",
        "@timeStamps false",
        "@missing false",
        f"@univariate {'true' if len(rows[0][0]) == 1 else 'false'}",
        *([f"@dimensions {len(rows[0][0])}"] if len(rows[0][0]) > 1 else []),
        f"@equalLength {'true' if equal else 'false'}",
        f"@classLabel {'true a b' if classes else 'false'}",
        *([] if classes else ["@targetLabel true"]),
        "@data",
    ]
    body = [
        ":".join(",".join(str(v) for v in ch) for ch in series) + f":{y}" for series, y in rows
    ]
    path.write_text("\n".join(header + body) + "\n")
    return path


def _rows(n: int, length: int, channels: int, seed: int) -> list[tuple[list[list[float]], str]]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(channels, length)).round(3).tolist(), "ab"[i % 2]) for i in range(n)]


def _ramp(length: int, label: str, channels: int = 1) -> tuple[list[list[float]], str]:
    """One series ``0, 1, ..., length - 1`` on every channel."""
    return [[float(v) for v in range(length)] for _ in range(channels)], label


def _inputs(split: object) -> np.ndarray:
    return split.tensors[0].numpy()  # type: ignore[attr-defined]


def test_a_shipped_set_loads_by_name_with_the_archives_split() -> None:
    task = DataConfig(name="aeon", dataset="GunPoint").load()
    assert task.input_shape == (150, 1) and task.num_classes == 2 and task.domain == "sequence"
    assert task.sizes == (40, 10, 150)  # 50 training series, the archive's 150 test series
    motions = DataConfig(name="aeon", dataset="BasicMotions").load()
    assert motions.input_shape == (100, 6) and motions.num_classes == 4


def test_a_ts_pair_loads_its_test_twin(tmp_path: Path) -> None:
    train = _ts(tmp_path / "Toy_TRAIN.ts", _rows(30, 12, 3, 0))
    _ts(tmp_path / "Toy_TEST.ts", _rows(8, 12, 3, 1))
    task = DataConfig(name="aeon", path=str(train)).load()
    assert task.input_shape == (12, 3) and task.sizes == (24, 6, 8) and task.name == "Toy"
    alone = tmp_path / "Alone_TRAIN.ts"
    _ts(alone, _rows(30, 12, 1, 2))
    assert DataConfig(name="aeon", path=str(alone)).load().sizes == (18, 6, 6)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("ragged", r"unequal lengths \(7 to 26\); pad or resample"),
        ("ragged file", r"unequal lengths \(3 to 5\); pad or resample"),
        ("missing", r"1 series have missing values; impute"),
        ("regression", r"a regression set"),
        ("unknown", r"aeon ships no classification set 'NoSuchSet' \(nothing is downloaded\)"),
        ("no file", r"no such \.ts file"),
    ],
)
def test_what_cannot_be_searched_is_one_line(tmp_path: Path, kind: str, message: str) -> None:
    if kind == "ragged":
        config = DataConfig(name="aeon", dataset="JapaneseVowels", unequal_length="refuse")
    elif kind == "ragged file":
        rows = [_ramp(3, "a"), _ramp(5, "b"), _ramp(4, "a")]
        path = _ts(tmp_path / "R_TRAIN.ts", rows)
        config = DataConfig(name="aeon", path=str(path), unequal_length="refuse")
    elif kind == "unknown":
        config = DataConfig(name="aeon", dataset="NoSuchSet")
    elif kind == "no file":
        config = DataConfig(name="aeon", path=str(tmp_path / "none_TRAIN.ts"))
    else:
        rows = _rows(10, 6, 1, 0)
        if kind == "missing":
            rows[3][0][0][2] = "?"  # type: ignore[call-overload]
        path = _ts(tmp_path / "X_TRAIN.ts", rows, classes=kind != "regression")
        if kind == "regression":
            text = path.read_text().replace(":a\n", ":1.5\n").replace(":b\n", ":2.5\n")
            path.write_text(text)
        config = DataConfig(name="aeon", path=str(path), missing="refuse")
    with pytest.raises(DataError, match=message) as info:
        config.load()
    assert "\n" not in str(info.value)


def test_the_config_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="either `dataset`"):
        DataConfig(name="aeon")
    with pytest.raises(ValueError, match="either `dataset`"):
        DataConfig(name="aeon", dataset="GunPoint", path="x_TRAIN.ts")


@pytest.mark.parametrize("how", ["resize", "pad"])
def test_ragged_japanese_vowels_takes_the_longest_training_length(how: str) -> None:
    task = DataConfig(name="aeon", dataset="JapaneseVowels", unequal_length=how).load()
    assert task.input_shape == (26, 12) and task.num_classes == 9  # train 7-26, test 7-29
    for split in (task.train, task.valid, task.test):
        x = _inputs(split)
        assert x.shape[1:] == (26, 12) and not np.isnan(x).any()
    assert len(task.test) == 370


@pytest.mark.parametrize("how", ["resize", "pad"])
def test_a_longer_test_series_is_brought_to_the_training_length(tmp_path: Path, how: str) -> None:
    train = _ts(tmp_path / "R_TRAIN.ts", [_ramp(4, "a", 2), _ramp(6, "b", 2), _ramp(5, "a", 2)])
    _ts(tmp_path / "R_TEST.ts", [_ramp(9, "a", 2), _ramp(3, "b", 2)])
    splits, _ = aeon_splits(dataset=None, path=str(train), unequal_length=how)
    assert splits["train"][0].shape == (3, 6, 2) and splits["test"][0].shape == (2, 6, 2)
    longer = splits["test"][0][0, :, 0]
    if how == "resize":  # the whole ramp squeezed into 6 positions
        np.testing.assert_allclose(longer, np.linspace(0, 8, 6), rtol=1e-6)
    else:  # cut after its first 6 positions
        np.testing.assert_array_equal(longer, np.arange(6))


def test_resize_keeps_a_ramp_a_ramp_and_pad_appends_zeros(tmp_path: Path) -> None:
    train = _ts(tmp_path / "R_TRAIN.ts", [_ramp(4, "a"), _ramp(10, "b"), _ramp(7, "a")])
    resized, _ = aeon_splits(dataset=None, path=str(train), unequal_length="resize")
    short = resized["train"][0][0, :, 0]
    assert short.shape == (10,) and np.all(np.diff(short) > 0)
    assert short[0] == 0 and short[-1] == 3
    np.testing.assert_array_equal(resized["train"][0][1, :, 0], np.arange(10))
    padded, _ = aeon_splits(dataset=None, path=str(train), unequal_length="pad")
    np.testing.assert_array_equal(padded["train"][0][0, :, 0], [0, 1, 2, 3] + [0] * 6)


def test_one_length_is_left_as_it_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    train = _ts(tmp_path / "E_TRAIN.ts", _rows(6, 8, 2, 0))
    with caplog.at_level(logging.INFO, logger="optuna_hpcnas.data._aeon"):
        for how in ("resize", "pad", "refuse"):
            splits, _ = aeon_splits(dataset=None, path=str(train), unequal_length=how)
            expected = np.transpose(np.asarray([s for s, _ in _rows(6, 8, 2, 0)]), (0, 2, 1))
            np.testing.assert_allclose(splits["train"][0], expected, rtol=1e-6)
    assert not caplog.records


def test_missing_values_are_imputed_unless_refused(tmp_path: Path) -> None:
    rows = _rows(10, 6, 2, 0)
    rows[3][0][0][2] = "?"  # type: ignore[call-overload]
    rows[5][0][1] = ["?"] * 6  # type: ignore[list-item]  # a channel with no value at all
    path = _ts(tmp_path / "M_TRAIN.ts", rows)
    text = path.read_text().replace("@missing false", "@missing true")
    path.write_text(text)
    task = DataConfig(name="aeon", path=str(path)).load()
    assert task.input_shape == (6, 2)
    assert not any(np.isnan(_inputs(split)).any() for split in (task.train, task.valid))
    splits, _ = aeon_splits(dataset=None, path=str(path))
    x = splits["train"][0]
    values = [v for i, v in enumerate(rows[3][0][0]) if i != 2]
    assert x[3, 2, 0] == pytest.approx(np.mean(values), rel=1e-5)
    np.testing.assert_array_equal(x[5, :, 1], 0)
    with pytest.raises(DataError, match="2 series have missing values"):
        DataConfig(name="aeon", path=str(path), missing="refuse").load()


def test_a_treatment_is_logged_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [_ramp(4, "a"), _ramp(7, "b"), _ramp(5, "a")]
    rows[1][0][0][3] = "?"  # type: ignore[call-overload]
    train = _ts(tmp_path / "L_TRAIN.ts", rows)
    with caplog.at_level(logging.INFO, logger="optuna_hpcnas.data._aeon"):
        aeon_splits(dataset=None, path=str(train))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all(str(train) in line and "\n" not in line for line in lines)
    assert "missing values in 1 train series" in lines[0]
    assert "[data] missing = 'refuse'" in lines[0]
    assert "train series of 4 to 7 positions" in lines[1]
    assert "resized to 7 by linear interpolation (aeon's Resizer" in lines[1]
    assert "[data] unequal_length = 'pad' or 'refuse'" in lines[1]


@pytest.mark.parametrize(("key", "value"), [("unequal_length", "pad"), ("missing", "refuse")])
def test_the_treatments_belong_to_aeon(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"`{key}` is '{value}', but only"):
        DataConfig(name="digits", **{key: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"`{key}` is 'sideways', but must be one of"):
        DataConfig(name="aeon", dataset="GunPoint", **{key: "sideways"})  # type: ignore[arg-type]
    config = DataConfig(name="aeon", dataset="GunPoint", **{key: value})  # type: ignore[arg-type]
    assert DataConfig(**config.to_dict()) == config and config.to_dict()[key] == value
