"""Time series as users keep them: ``.ts`` files, read with aeon's own loader (extra ``aeon``).

``[data] name = "aeon"`` takes either ``dataset``, the name of a set aeon ships inside its
wheel (GunPoint, ItalyPowerDemand, BasicMotions, ...: read from disk, never downloaded), or
``path``, a ``*_TRAIN.ts`` file whose ``*_TEST.ts`` twin, when it exists beside it, is the
test split (the archive's own split). Series become ``(N, length, channels)`` arrays and
string labels class indices (sorted); the checks and splits are those of every array source
(``task_from_arrays``). Ragged series and missing values are refused with one line naming
aeon's transformers that fix them: the supernet takes one fixed length without gaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from optuna_hpcnas.data._arrays import DataError
from optuna_hpcnas.data._arrays import Splits


def shipped_datasets() -> list[str]:
    """The classification sets aeon's wheel carries (a ``<name>_TRAIN.ts`` on disk)."""
    root = _aeon_data_root()
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and _is_classification(p / f"{p.name}_TRAIN.ts")
    )


def _is_classification(file: Path) -> bool:
    """Whether a ``.ts`` file's header declares class labels (read without parsing data)."""
    if not file.is_file():
        return False
    with file.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.lower().startswith("@classlabel"):
                return line.split()[1].lower() == "true"
            if line.lower().startswith("@data"):
                return False
    return False


def aeon_splits(*, dataset: str | None, path: str | None) -> tuple[Splits, str]:
    """``{"train": (x, y), "test": (x, y)}`` (test when the set has one) and the source name
    for messages. ``x`` is ``(N, length, channels)`` float32, ``y`` class indices."""
    if dataset is not None:
        shipped = shipped_datasets()
        if dataset not in shipped:
            raise DataError(
                f"aeon ships no classification set {dataset!r} (nothing is downloaded); it "
                f"ships {', '.join(shipped)}; give `path` to a *_TRAIN.ts file instead"
            )
        train_file = _aeon_data_root() / dataset / f"{dataset}_TRAIN.ts"
    else:
        assert path is not None
        train_file = Path(path)
        if not train_file.is_file():
            raise DataError(f"{train_file}: no such .ts file.")
    test_file = train_file.with_name(train_file.name.replace("_TRAIN", "_TEST"))
    files = {"train": train_file}
    if test_file != train_file and test_file.is_file():
        files["test"] = test_file
    raw = {split: _read(file) for split, file in files.items()}
    classes = sorted({str(label) for _, labels in raw.values() for label in labels})
    index = {label: i for i, label in enumerate(classes)}
    splits = {
        split: (x, np.asarray([index[str(label)] for label in labels], dtype=np.int64))
        for split, (x, labels) in raw.items()
    }
    return splits, str(train_file)


def _aeon_data_root() -> Path:
    try:
        import aeon.datasets
    except ImportError:
        raise DataError(
            "[data] name = 'aeon' needs the aeon package: pip install 'optuna-hpcnas[aeon]'"
        ) from None
    return Path(aeon.datasets.__file__).parent / "data"


def _read(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One ``.ts`` file as ``(N, length, channels)`` float32 and its labels."""
    _aeon_data_root()  # the import error first, as one line
    from aeon.datasets import load_from_ts_file

    try:
        x, y, meta = load_from_ts_file(str(file), return_meta_data=True)
    except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
        message = " ".join(str(e).split())
        raise DataError(f"{file}: aeon cannot read it as a .ts file: {message}") from None
    if not meta.get("classlabel", True):
        raise DataError(
            f"{file}: a regression set (its header has no @classLabel): the search classifies"
        )
    if not isinstance(x, np.ndarray):  # aeon returns a list for series of unequal length
        lengths = sorted({int(np.shape(series)[-1]) for series in x})
        raise DataError(
            f"{file}: the series have unequal lengths ({lengths[0]} to {lengths[-1]}); pad "
            "or resample them to one length first (aeon.transformations.collection's Padder "
            "or Resizer; aeon's own equal-length versions end in _eq)"
        )
    missing = int(np.isnan(x).any(axis=(1, 2)).sum()) if x.dtype.kind == "f" else 0
    if missing:
        raise DataError(
            f"{file}: {missing} series have missing values; impute them first "
            "(aeon.transformations.collection's SimpleImputer)"
        )
    return np.ascontiguousarray(np.transpose(x, (0, 2, 1)), dtype=np.float32), _labels(y)


def _labels(y: Any) -> np.ndarray:
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise DataError(f"labels of shape {labels.shape}: a .ts classification file has one each")
    return labels
