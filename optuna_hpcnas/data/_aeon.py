"""Time series as users keep them: ``.ts`` files, read with aeon's own loader (extra ``aeon``).

``[data] name = "aeon"`` takes either ``dataset``, the name of a set aeon ships inside its
wheel (GunPoint, ItalyPowerDemand, BasicMotions, ...: read from disk, never downloaded), or
``path``, a ``*_TRAIN.ts`` file whose ``*_TEST.ts`` twin, when it exists beside it, is the
test split (the archive's own split). Series become ``(N, length, channels)`` arrays and
string labels class indices (sorted); the checks and splits are those of every array source
(``task_from_arrays``), which standardises them afterwards.

The supernet takes one fixed length without gaps, so ragged sets and missing values are
treated here, with aeon's own transformers, each treatment applied logged in one line:
``missing = "impute"`` fills each gap with its series' channel mean (``SimpleImputer``), then
``unequal_length = "resize"`` resamples every series by linear interpolation to the longest
training length (``Resizer``) or ``"pad"`` appends zeros up to it (``Padder``; longer test
series are cut to it, ``Truncator``). ``"refuse"`` raises one line instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
import warnings

import numpy as np

from optuna_hpcnas.data._arrays import DataError
from optuna_hpcnas.data._arrays import Splits

_logger = logging.getLogger(__name__)

# A collection as aeon's loader returns it: an (N, channels, length) array when every series
# has one length, else a list of (channels, length_i) arrays.
Collection = np.ndarray | list[np.ndarray]


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


def aeon_splits(
    *,
    dataset: str | None,
    path: str | None,
    unequal_length: str = "resize",
    missing: str = "impute",
) -> tuple[Splits, str]:
    """``{"train": (x, y), "test": (x, y)}`` (test when the set has one) and the source name
    for messages. ``x`` is ``(N, length, channels)`` float32, ``y`` class indices;
    ``unequal_length`` and ``missing`` are ``[data]``'s treatments (module docstring)."""
    train_file = _train_file(dataset, path)
    test_file = train_file.with_name(train_file.name.replace("_TRAIN", "_TEST"))
    files = {"train": train_file}
    if test_file != train_file and test_file.is_file():
        files["test"] = test_file
    raw = {split: _read(file) for split, file in files.items()}
    for split, (x, _) in raw.items():
        _refuse(files[split], x, unequal_length=unequal_length, missing=missing)
    xs = {split: x for split, (x, _) in raw.items()}
    if missing == "impute":
        xs = _impute(xs, source=train_file)
    if unequal_length != "refuse":
        xs = _equalise(xs, how=unequal_length, source=train_file)
    classes = sorted({str(label) for _, labels in raw.values() for label in labels})
    index = {label: i for i, label in enumerate(classes)}
    splits = {
        split: (
            np.ascontiguousarray(np.transpose(np.asarray(xs[split]), (0, 2, 1)), dtype=np.float32),
            np.asarray([index[str(label)] for label in labels], dtype=np.int64),
        )
        for split, (_, labels) in raw.items()
    }
    return splits, str(train_file)


def _train_file(dataset: str | None, path: str | None) -> Path:
    if dataset is not None:
        shipped = shipped_datasets()
        if dataset not in shipped:
            raise DataError(
                f"aeon ships no classification set {dataset!r} (nothing is downloaded); it "
                f"ships {', '.join(shipped)}; give `path` to a *_TRAIN.ts file instead"
            )
        return _aeon_data_root() / dataset / f"{dataset}_TRAIN.ts"
    assert path is not None
    train_file = Path(path)
    if not train_file.is_file():
        raise DataError(f"{train_file}: no such .ts file.")
    return train_file


def _aeon_data_root() -> Path:
    try:
        import aeon.datasets
    except ImportError:
        raise DataError(
            "[data] name = 'aeon' needs the aeon package: pip install 'optuna-hpcnas[aeon]'"
        ) from None
    return Path(aeon.datasets.__file__).parent / "data"


def _read(file: Path) -> tuple[Collection, np.ndarray]:
    """One ``.ts`` file as aeon's float collection (channels first) and its labels."""
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
    if isinstance(x, np.ndarray):
        return x.astype(np.float64, copy=False), _labels(y)
    return [np.asarray(series, dtype=np.float64) for series in x], _labels(y)


def _series_with_gaps(x: Collection) -> int:
    """How many series of ``x`` hold a missing value (NaN)."""
    return sum(bool(np.isnan(series).any()) for series in x)


def _lengths(x: Collection) -> list[int]:
    return [int(series.shape[-1]) for series in x]


def _refuse(file: Path, x: Collection, *, unequal_length: str, missing: str) -> None:
    """The one-line refusals of ``unequal_length = "refuse"`` and ``missing = "refuse"``."""
    lengths = sorted(set(_lengths(x)))
    if unequal_length == "refuse" and len(lengths) > 1:
        raise DataError(
            f"{file}: the series have unequal lengths ({lengths[0]} to {lengths[-1]}); pad "
            "or resample them: [data] unequal_length = 'resize' or 'pad' (aeon's Resizer or "
            "Padder), or aeon's own equal-length versions, ending in _eq"
        )
    gaps = _series_with_gaps(x) if missing == "refuse" else 0
    if gaps:
        raise DataError(
            f"{file}: {gaps} series have missing values; impute them: [data] missing = "
            "'impute' (aeon's SimpleImputer)"
        )


def _impute(xs: dict[str, Collection], *, source: Path) -> dict[str, Collection]:
    """Gaps filled with their series' channel mean (aeon's ``SimpleImputer``); a channel
    with no value at all, which the mean leaves empty, is filled with 0."""
    gaps = {split: _series_with_gaps(x) for split, x in xs.items()}
    if not any(gaps.values()):
        return xs
    from aeon.transformations.collection import SimpleImputer

    imputer = SimpleImputer(strategy="mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an all-NaN channel
        filled = {split: imputer.fit_transform(x) if gaps[split] else x for split, x in xs.items()}
    filled = {
        split: np.nan_to_num(x, nan=0.0)
        if isinstance(x, np.ndarray)
        else [np.nan_to_num(s, nan=0.0) for s in x]
        for split, x in filled.items()
    }
    found = ", ".join(f"{n} {split}" for split, n in gaps.items() if n)
    _logger.info(
        "%s: missing values in %s series; filled with the mean of their series and channel, "
        "0 where a channel has no value (aeon's SimpleImputer; [data] missing = 'refuse').",
        source,
        found,
    )
    return filled


def _equalise(xs: dict[str, Collection], *, how: str, source: Path) -> dict[str, Collection]:
    """Every split at the longest training length: resampled by linear interpolation
    (``how = "resize"``, aeon's ``Resizer``) or padded with zeros (``"pad"``, aeon's
    ``Padder``; longer test series cut by its ``Truncator``). Equal lengths stay as they are."""
    lengths = {split: _lengths(x) for split, x in xs.items()}
    if len({n for split_lengths in lengths.values() for n in split_lengths}) == 1:
        return xs
    from aeon.transformations.collection.unequal_length import Padder
    from aeon.transformations.collection.unequal_length import Resizer
    from aeon.transformations.collection.unequal_length import Truncator

    target = max(lengths["train"])
    if how == "resize":
        done, tools, other = f"resized to {target} by linear interpolation", "Resizer", "pad"
        out = {split: Resizer(resized_length=target).fit_transform(x) for split, x in xs.items()}
    else:
        done, tools, other = f"padded with zeros to {target}", "Padder", "resize"
        # With error_on_long=False the Padder leaves a longer (test) series as it is instead
        # of raising, and the Truncator cuts it: no split outgrows the training length.
        out = {
            split: Truncator(truncated_length=target).fit_transform(
                Padder(padded_length=target, fill_value=0, error_on_long=False).fit_transform(x)
            )
            for split, x in xs.items()
        }
        if any(n > target for n in lengths.get("test", [])):
            done, tools = f"{done}, longer test series cut to {target}", "Padder and Truncator"
    found = "; ".join(
        f"{split} series of {min(n)}{f' to {max(n)}' if max(n) > min(n) else ''} positions"
        for split, n in lengths.items()
    )
    _logger.info(
        "%s: %s; %s (aeon's %s; [data] unequal_length = '%s' or 'refuse').",
        source,
        found,
        done,
        tools,
        other,
    )
    return out


def _labels(y: Any) -> np.ndarray:
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise DataError(f"labels of shape {labels.shape}: a .ts classification file has one each")
    return labels
