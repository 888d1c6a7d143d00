"""``iterate_batches``: every sample once per pass, and no training batch of one sample."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import torch
from torch.utils.data import Dataset
from torch.utils.data import TensorDataset

from optuna_hpcnas.data import iterate_batches


class _Plain(Dataset):
    """A dataset without the tensor fast path (the ``DataLoader`` branch)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 70), fast=st.booleans())
def test_shuffled_passes_have_no_lone_sample(n: int, batch: int, fast: bool) -> None:
    data = TensorDataset(torch.arange(n).float()[:, None], torch.arange(n)) if fast else _Plain(n)
    generator = torch.Generator().manual_seed(0)
    sizes = [len(y) for _, y in iterate_batches(data, batch, shuffle=True, generator=generator)]
    if n > 1 and batch > 1:
        assert min(sizes) >= 2
    seen = sum(sizes)
    assert seen == n or (seen == n - 1 and n % batch == 1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 70))
def test_evaluation_passes_see_every_sample_in_order(n: int, batch: int) -> None:
    data = TensorDataset(torch.arange(n).float()[:, None], torch.arange(n))
    labels = torch.cat([y for _, y in iterate_batches(data, batch)])
    assert labels.tolist() == list(range(n))
