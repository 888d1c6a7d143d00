from __future__ import annotations

import numpy as np
import pytest

from optuna_hpcnas.deploy import split_holdout

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402


def test_stratified_disjoint_and_deterministic() -> None:
    from optuna_hpcnas.data import load_digits_task

    train = load_digits_task().train
    rest, holdout = split_holdout(train, fraction=0.1, seed=3)
    assert isinstance(rest, TensorDataset) and isinstance(holdout, TensorDataset)
    assert len(rest) + len(holdout) == len(train)
    assert abs(len(holdout) - 0.1 * len(train)) <= 10
    # Disjoint and complete: every training image lands on exactly one side.
    key = {tuple(x.flatten().tolist()) for x in train.tensors[0]}
    sides = [{tuple(x.flatten().tolist()) for x in d.tensors[0]} for d in (rest, holdout)]
    assert not (sides[0] & sides[1]) and sides[0] | sides[1] == key
    counts = np.bincount(holdout.tensors[1].numpy(), minlength=10)
    assert counts.min() >= 1 and counts.max() - counts.min() <= 2
    again = split_holdout(train, fraction=0.1, seed=3)[1]
    assert torch.equal(again.tensors[0], holdout.tensors[0])
    other = split_holdout(train, fraction=0.1, seed=4)[1]
    assert not torch.equal(other.tensors[0], holdout.tensors[0])


class _Pairs(Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i % 3


def test_any_dataset_and_small_classes() -> None:
    rest, holdout = split_holdout(_Pairs(), fraction=0.2)
    assert len(rest) == 24 and len(holdout) == 6
    assert sorted(int(holdout[i][1]) for i in range(6)) == [0, 0, 1, 1, 2, 2]
    # A two-sample class keeps one on each side even at a small fraction.
    tiny = TensorDataset(torch.arange(4.0)[:, None], torch.tensor([0, 0, 1, 1]))
    rest, holdout = split_holdout(tiny, fraction=0.01)
    assert len(holdout) == 2 and len(rest) == 2


def test_bad_fraction() -> None:
    with pytest.raises(ValueError, match="`fraction` is 1.0"):
        split_holdout(_Pairs(), fraction=1.0)
    with pytest.raises(ValueError, match="at least 2"):
        split_holdout(TensorDataset(torch.zeros(1, 1), torch.zeros(1)), fraction=0.5)
