"""Arrays to a ``TaskData``: the checks every array source shares (shape, labels, finite
values), the validation/test split where one is missing, per-channel standardisation."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from optuna_hpcnas.data._tasks import _split_indices
from optuna_hpcnas.data._tasks import TaskData


class DataError(ValueError):
    """A data set that cannot be used; the message names the file and the problem."""


Splits = dict[str, tuple[np.ndarray, np.ndarray]]


def task_from_arrays(
    splits: Splits, *, name: str, source: str, fraction: float, seed: int, normalize: bool
) -> TaskData:
    """Check the arrays, split off validation/test where missing, standardise, wrap."""
    for split, (x, y) in splits.items():
        _check_pair(source, split, x, y)
        if x.ndim == 2:  # (N, L): a signal of one feature
            splits[split] = (x[:, :, None], y)
    x_train, y_train = splits["train"]
    shape = tuple(x_train.shape[1:])
    for split, (x, _) in splits.items():
        if tuple(x.shape[1:]) != shape:
            raise DataError(
                f"{source}: {split} samples have shape {tuple(x.shape[1:])}, but train "
                f"samples have {shape}."
            )
    labels = np.concatenate([y for _, y in splits.values()])
    num_classes = int(labels.max()) + 1
    if num_classes < 2:
        raise DataError(f"{source}: every label is {int(labels.max())}; need >= 2 classes.")
    missing = [s for s in ("valid", "test") if s not in splits]
    if missing:
        fractions = [fraction] * len(missing)
        parts = _split_indices(y_train, [1 - sum(fractions), *fractions], seed)
        train_idx = parts[0]
        for split, idx in zip(missing, parts[1:]):
            splits[split] = (x_train[idx], y_train[idx])
        splits["train"] = (x_train[train_idx], y_train[train_idx])
        x_train, y_train = splits["train"]
    x_train = x_train.astype(np.float32)
    axes: tuple[int, ...]
    if len(shape) == 3:
        domain = "image"
        axes = (0, 2, 3)
    elif len(shape) == 2:
        domain = "sequence"
        axes = (0, 1)
    else:
        raise DataError(
            f"{source}: samples have shape {shape}; images need (channels, height, width), "
            "sequences (length, features) or (length,)."
        )
    mean = x_train.mean(axis=axes, keepdims=True) if normalize else 0.0
    std = x_train.std(axis=axes, keepdims=True) + 1e-8 if normalize else 1.0

    def dataset(split: str) -> TensorDataset:
        x, y = splits[split]
        x = (x.astype(np.float32) - mean) / std
        return TensorDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y))

    return TaskData(
        train=dataset("train"),
        valid=dataset("valid"),
        test=dataset("test"),
        input_shape=shape,
        num_classes=num_classes,
        domain=domain,
        name=name,
        preprocessing={
            "mean": np.asarray(mean).reshape(-1).tolist(),
            "std": np.asarray(std).reshape(-1).tolist(),
            "per": "channel" if domain == "image" else "feature",
        },
    )


def _check_pair(source: str, split: str, x: np.ndarray, y: np.ndarray) -> None:
    if x.ndim < 2:
        raise DataError(
            f"{source}: the {split} samples are an array of shape {x.shape}; need (N, ...) "
            "with one sample per row."
        )
    if len(x) != len(y):
        raise DataError(
            f"{source}: the {split} split has {len(x)} samples but {len(y)} labels "
            "(lengths must match)."
        )
    if len(x) == 0:
        raise DataError(f"{source}: the {split} split is empty.")
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{source}: {split} samples are {x.dtype}, not numbers.")
    if not np.all(np.isfinite(x)):
        raise DataError(f"{source}: {split} samples contain NaN or infinite values.")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(
            f"{source}: {split} labels must be a 1-D integer array, but are {y.dtype} of "
            f"shape {y.shape}."
        )
    if int(y.min()) < 0:
        raise DataError(f"{source}: a {split} label is {int(y.min())}; labels must be >= 0.")
