"""Where a candidate trains and is scored: a holdout split, or stratified cross-validation.

On a few dozen samples a validation split of 6-20 ranks candidates by noise: one sample is
5-17 accuracy points. ``plan_validation`` keeps the holdout split when it is large enough to
rank (``MIN_VALIDATION`` samples, ``MIN_PER_CLASS`` of every class) and otherwise cuts train +
validation into stratified folds; the evaluation core trains one model per fold side by side
and pools their predictions, so every sample is scored once. It sits below the core
(``TrialEvaluator``) and above the data.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data import Subset
from torch.utils.data import TensorDataset

from optuna_hpcnas.data import joined
from optuna_hpcnas.data import TaskData

MIN_VALIDATION = 50
MIN_PER_CLASS = 5
# Below this many pooled samples one sample moves an accuracy by 5 points or more: candidates
# within a few samples of each other are not told apart by any protocol.
TOO_FEW_TO_RANK = 20


@dataclass(frozen=True)
class Folds:
    """The ``(train, valid)`` pairs a candidate is trained and scored on.

    Attributes:
        splits: One pair per model of a candidate (one for a holdout).
        kind: ``"holdout"`` or ``"cross-validation"``.
        reason: Why this kind was chosen (for the log).
    """

    splits: tuple[tuple[Dataset, Dataset], ...]
    kind: str
    reason: str = ""

    @property
    def validation_size(self) -> int:
        """Samples every score is pooled over."""
        return sum(_size(valid) for _, valid in self.splits)

    @property
    def too_few_to_rank(self) -> bool:
        return self.validation_size < TOO_FEW_TO_RANK

    @property
    def smallest_training_set(self) -> int:
        return min(_size(train) for train, _ in self.splits)

    def describe(self) -> str:
        """One line for the log: the kind, the sizes and the estimate's noise."""
        n = self.validation_size
        # the standard error of an accuracy near 0.8 on n samples: what ranks can resolve
        noise = math.sqrt(0.8 * 0.2 / max(n, 1))
        train, valid = self.splits[0]
        sizes = f"{_size(train)} train / {_size(valid)} validation"
        if self.kind == "holdout":
            text = f"validation: holdout, {sizes} samples"
        else:
            text = (
                f"validation: {len(self.splits)}-fold cross-validation of train + validation "
                f"({n} samples; a fold: {sizes}), predictions pooled ({self.reason})"
            )
        return f"{text}; an accuracy near 0.8 is measured to about +-{noise:.3f} (1 s.d.)"


def _size(dataset: Dataset) -> int:
    return len(dataset)  # type: ignore[arg-type]


def labels_of(dataset: Dataset) -> np.ndarray:
    """The labels of every sample of ``dataset`` (read from the tensors when it has them)."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[1].numpy().astype(np.int64)
    return np.asarray([int(torch.as_tensor(dataset[i][1])) for i in range(_size(dataset))])


def plan_validation(data: TaskData, *, validation: str, folds: int, seed: int) -> Folds:
    """The holdout split of ``data``, or ``folds`` stratified folds of train + validation.

    ``validation``: ``"holdout"``, ``"cross-validation"`` or ``"auto"`` (cross-validation
    when the validation split has fewer than ``MIN_VALIDATION`` samples or fewer than
    ``MIN_PER_CLASS`` of a class the training split has).
    """
    valid_labels = labels_of(data.valid)
    train_classes = np.unique(labels_of(data.train))
    counts = [int((valid_labels == c).sum()) for c in train_classes]
    reason = ""
    if validation == "auto":
        if len(valid_labels) < MIN_VALIDATION:
            reason = f"a holdout of {len(valid_labels)} samples is too few to rank"
        elif min(counts) < MIN_PER_CLASS:
            reason = f"the holdout has {min(counts)} sample(s) of a class"
        validation = "cross-validation" if reason else "holdout"
    pool = joined(data.train, data.valid)
    k = min(folds, _size(pool) // 2)
    if validation == "holdout" or k < 2:
        return Folds(((data.train, data.valid),), "holdout")
    return Folds(_stratified_folds(pool, k, seed), "cross-validation", reason or "asked for")


def _stratified_folds(pool: Dataset, k: int, seed: int) -> tuple[tuple[Dataset, Dataset], ...]:
    """``k`` folds of ``pool``, each class dealt round-robin from a shuffled order."""
    labels = labels_of(pool)
    rng = np.random.default_rng([seed, 7])
    fold_of = np.empty(len(labels), dtype=np.int64)
    offset = 0
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        fold_of[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)  # the next class starts where this one stopped: balanced sizes
    out = []
    for f in range(k):
        valid = np.flatnonzero(fold_of == f)
        train = np.flatnonzero(fold_of != f)
        out.append((_subset(pool, train), _subset(pool, valid)))
    return tuple(out)


def _subset(dataset: Dataset, index: np.ndarray) -> Dataset:
    if isinstance(dataset, TensorDataset):
        chosen = torch.from_numpy(index)
        return TensorDataset(*(t[chosen] for t in dataset.tensors))
    return Subset(dataset, index.tolist())
