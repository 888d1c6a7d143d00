"""``[data] name = "aeon"``: the sets aeon ships and ``.ts`` file pairs, read offline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optuna_hpcnas.config import DataConfig
from optuna_hpcnas.data import DataError

pytest.importorskip("aeon")


def _ts(path: Path, rows: list[tuple[list[list[float]], str]], *, classes: bool = True) -> Path:
    """A ``.ts`` file: one row per series, its channels separated by ':', then the label."""
    header = [
        "@problemName toy",
        "@timeStamps false",
        "@missing false",
        f"@univariate {'true' if len(rows[0][0]) == 1 else 'false'}",
        *([f"@dimensions {len(rows[0][0])}"] if len(rows[0][0]) > 1 else []),
        "@equalLength true",
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
        ("missing", r"1 series have missing values; impute"),
        ("regression", r"a regression set"),
        ("unknown", r"aeon ships no classification set 'NoSuchSet' \(nothing is downloaded\)"),
        ("no file", r"no such \.ts file"),
    ],
)
def test_what_cannot_be_searched_is_one_line(tmp_path: Path, kind: str, message: str) -> None:
    if kind == "ragged":
        config = DataConfig(name="aeon", dataset="JapaneseVowels")
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
        config = DataConfig(name="aeon", path=str(path))
    with pytest.raises(DataError, match=message) as info:
        config.load()
    assert "\n" not in str(info.value)


def test_the_config_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="either `dataset`"):
        DataConfig(name="aeon")
    with pytest.raises(ValueError, match="either `dataset`"):
        DataConfig(name="aeon", dataset="GunPoint", path="x_TRAIN.ts")
