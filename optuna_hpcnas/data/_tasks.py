"""Classification tasks: scikit-learn's digits (ships offline) and a synthetic sequence task.

A task is a ``TaskData``: three ``torch.utils.data.Dataset`` splits plus the sample shape,
the number of classes and the domain. Any dataset works when each item is ``(x, y)`` with
``x`` a float tensor of ``input_shape`` (images ``(C, H, W)``, sequences ``(L, F)``) and
``y`` an integer class in ``[0, num_classes)``. ``TensorDataset`` splits take a fast path
(batches are tensor slices, no ``DataLoader``).
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset
from torch.utils.data import TensorDataset

from optuna_hpcnas._validation import check_int

DOMAINS = ("image", "sequence")


@dataclass(frozen=True)
class TaskData:
    """A classification task split into train / validation / test datasets.

    Examples:
        >>> data = load_digits_task()
        >>> data.input_shape, data.num_classes, len(data.train) + len(data.valid) + len(data.test)
        ((1, 8, 8), 10, 1797)
    """

    train: Dataset
    valid: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int
    domain: str = "image"
    name: str = "custom"
    preprocessing: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"`domain` is {self.domain!r}, but must be one of {list(DOMAINS)}.")
        check_int("num_classes", self.num_classes, 2)
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        for split in ("train", "valid", "test"):
            if not isinstance(getattr(self, split), Dataset):
                raise TypeError(
                    f"`{split}` must be a torch.utils.data.Dataset, "
                    f"but got {type(getattr(self, split)).__name__}."
                )

    @property
    def sizes(self) -> tuple[int, int, int]:
        """Number of samples of the train, validation and test splits."""
        return (len(self.train), len(self.valid), len(self.test))  # type: ignore[arg-type]

    def check(self) -> None:
        """Raise ``ValueError`` if a sample does not have ``input_shape`` or a valid label."""
        for split in ("train", "valid", "test"):
            dataset = getattr(self, split)
            if len(dataset) == 0:
                raise ValueError(f"The {split} split is empty.")
            x, y = dataset[0]
            shape = tuple(torch.as_tensor(x).shape)
            if shape != self.input_shape:
                raise ValueError(
                    f"A {split} sample has shape {shape}, but the task declares "
                    f"`input_shape`={self.input_shape}."
                )
            label = int(torch.as_tensor(y))
            if not 0 <= label < self.num_classes:
                raise ValueError(
                    f"A {split} label is {label}, but must be in [0, {self.num_classes})."
                )


def _split_indices(
    labels: np.ndarray, fractions: Sequence[float], seed: int
) -> tuple[np.ndarray, ...]:
    """A stratified split of ``range(len(labels))`` into ``len(fractions)`` parts."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in fractions]
    bounds = np.cumsum(fractions)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        cuts = np.round(bounds * len(idx)).astype(int)
        start = 0
        for k, end in enumerate(cuts):
            parts[k].extend(idx[start:end].tolist())
            start = end
    return tuple(np.sort(np.asarray(p, dtype=np.int64)) for p in parts)


def load_digits_task(*, seed: int = 0, fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> TaskData:
    """scikit-learn's 1,797 8x8 digits as ``(1, 8, 8)`` images, standardised with the train
    statistics; a stratified split fixed by ``seed`` (60/20/20 by default).
    """
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
        raise ValueError(
            f"`fractions` is {tuple(fractions)}, but must be 3 positive values summing to 1."
        )
    images, labels = _digits_arrays()
    train, valid, test = _split_indices(labels, fractions, seed)
    mean, std = float(images[train].mean()), float(images[train].std())
    x = torch.from_numpy((images - mean) / std).unsqueeze(1)
    y = torch.from_numpy(labels)
    return TaskData(
        train=TensorDataset(x[train], y[train]),
        valid=TensorDataset(x[valid], y[valid]),
        test=TensorDataset(x[test], y[test]),
        input_shape=(1, 8, 8),
        num_classes=10,
        domain="image",
        name="digits",
        preprocessing={"scale": "raw digits pixels 0-16", "mean": mean, "std": std},
    )


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits from scikit-learn's bundled CSV, read without importing scikit-learn
    (seconds on a busy machine); ``sklearn.datasets.load_digits`` if the file moved.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            raw = np.loadtxt(path, delimiter=",", dtype=np.float32)
            return raw[:, :-1].reshape(-1, 8, 8), raw[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


def make_sequence_task(
    *,
    num_samples: int = 2000,
    length: int = 16,
    features: int = 8,
    num_classes: int = 4,
    motif_length: int = 4,
    noise: float = 1.0,
    seed: int = 0,
) -> TaskData:
    """Synthetic sequences: Gaussian noise with one class motif planted at a random position.

    The class is which motif was planted; finding it needs local pattern detection (conv1d)
    or attention. Split 60/20/20, fixed by ``seed``.
    """
    if motif_length > length:
        raise ValueError(f"`motif_length` is {motif_length}, but must be <= `length` ({length}).")
    if num_samples < 10 * num_classes:
        raise ValueError(f"`num_samples` is {num_samples}, but must be >= 10 * num_classes.")
    rng = np.random.default_rng(seed)
    motifs = rng.normal(0.0, 2.0, size=(num_classes, motif_length, features))
    labels = rng.integers(num_classes, size=num_samples)
    x = rng.normal(0.0, noise, size=(num_samples, length, features))
    starts = rng.integers(length - motif_length + 1, size=num_samples)
    for i in range(num_samples):
        x[i, starts[i] : starts[i] + motif_length] += motifs[labels[i]]
    train, valid, test = _split_indices(labels, (0.6, 0.2, 0.2), seed)
    xt = torch.from_numpy(x.astype(np.float32))
    yt = torch.from_numpy(labels.astype(np.int64))
    return TaskData(
        train=TensorDataset(xt[train], yt[train]),
        valid=TensorDataset(xt[valid], yt[valid]),
        test=TensorDataset(xt[test], yt[test]),
        input_shape=(length, features),
        num_classes=num_classes,
        domain="sequence",
        name="sequence",
    )


def iterate_batches(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches of ``dataset``; tensor slices for a ``TensorDataset``.

    Shuffled (training) passes leave out a last batch of one sample when the set has more:
    BatchNorm cannot normalise a single value per channel, and the sample is one drawn at
    random, seen in the next pass.
    """
    n = len(dataset)  # type: ignore[arg-type]
    lone = shuffle and n > 1 and n % batch_size == 1
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        x, y = dataset.tensors
        order = torch.randperm(n, generator=generator) if shuffle else None
        for start in range(0, n - 1 if lone else n, batch_size):
            if order is None:
                yield x[start : start + batch_size], y[start : start + batch_size]
            else:
                idx = order[start : start + batch_size]
                yield x[idx], y[idx]
        return
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)
    for b, (x, y) in enumerate(loader):
        if lone and b * batch_size == n - 1:
            return
        yield x.float(), y.long()


def stream_batches(
    dataset: Dataset, batch_size: int, *, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled training batches of ``dataset`` without end, reshuffled at every pass: a
    recipe counts optimisation steps, not passes over the data."""
    while True:
        empty = True
        for batch in iterate_batches(dataset, batch_size, shuffle=True, generator=generator):
            empty = False
            yield batch
        if empty:
            raise ValueError("Cannot train on an empty dataset.")


def joined(first: Dataset, second: Dataset) -> Dataset:
    """The samples of both (tensors concatenated when both are ``TensorDataset`` pairs)."""
    if (
        isinstance(first, TensorDataset)
        and isinstance(second, TensorDataset)
        and len(first.tensors) == len(second.tensors) == 2
    ):
        return TensorDataset(*(torch.cat([a, b]) for a, b in zip(first.tensors, second.tensors)))
    from torch.utils.data import ConcatDataset

    return ConcatDataset([first, second])
