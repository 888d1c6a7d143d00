"""The held-out split of deployment: samples the search never sees, to verify the chosen model.

It is a pure function of the data, the fraction and the seed, so ``hpcnas run`` (which
searches on what is left) and ``hpcnas deploy`` (which verifies on the held-out part) carve
the same samples without storing indices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch.utils.data import Dataset


def split_holdout(
    dataset: Dataset, *, fraction: float = 0.1, seed: int = 0
) -> tuple[Dataset, Dataset]:
    """``(rest, holdout)``: a stratified ``fraction`` of ``dataset`` held out.

    Every class keeps at least one sample on each side when it has two or more. A
    ``TensorDataset`` gives ``TensorDataset`` halves (the fast path of the training loops);
    any other ``(x, y)`` dataset gives ``Subset`` halves.

    Examples:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.zeros(100, 3), torch.arange(100) % 4)
        >>> rest, holdout = split_holdout(data, fraction=0.2)
        >>> len(rest), len(holdout)
        (80, 20)
    """
    from torch.utils.data import Subset
    from torch.utils.data import TensorDataset

    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise ValueError(f"`fraction` is {fraction!r}, but must be in (0, 1).")
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        labels = dataset.tensors[1].numpy()
    else:
        labels = np.array([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]
    if len(labels) < 2:
        raise ValueError(f"The dataset has {len(labels)} samples; at least 2 are needed.")
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        take = int(round(fraction * len(members)))
        if len(members) >= 2:
            take = min(max(take, 1), len(members) - 1)
        held.append(members[:take])
    holdout = np.sort(np.concatenate(held))
    rest = np.setdiff1d(np.arange(len(labels)), holdout)
    if isinstance(dataset, TensorDataset):
        return (
            TensorDataset(*(t[rest] for t in dataset.tensors)),
            TensorDataset(*(t[holdout] for t in dataset.tensors)),
        )
    return Subset(dataset, rest.tolist()), Subset(dataset, holdout.tolist())
