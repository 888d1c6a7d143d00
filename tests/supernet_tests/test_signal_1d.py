"""The ``signal-1d`` space holds the MNIST-1D paper's models (Greydanus 2020) and the
time-series baseline FCN (Wang et al. 2017): each is built from ``space.from_params`` and
compared with the published PyTorch modules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.search_space import Architecture
from optuna_hpcnas.search_space import CellConfig
from optuna_hpcnas.search_space import SIGNAL_1D_BASELINES
from optuna_hpcnas.search_space import SIGNAL_1D_PAPER_MODELS
from optuna_hpcnas.supernet import SuperNet


class PaperMLP(nn.Module):  # mnist1d's models.MLP(40, 10, hidden_size=100)
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(40, 100)
        self.linear2 = nn.Linear(100, 100)
        self.linear3 = nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear1(x).relu()
        h = self.linear2(h).relu()
        return self.linear3(h)


class PaperCNN(nn.Module):  # mnist1d's models.ConvBase(10, channels=25, linear_in=125)
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, 25, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(25, 25, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(25, 25, 3, stride=2, padding=1)
        self.linear = nn.Linear(125, 10)


class PaperGRU(nn.Module):  # mnist1d's models.GRU(1, 10, hidden_size=6, time_steps=40)
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(1, 6, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(2 * 6 * 40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.gru(x.view(*x.shape[:2], 1))
        return self.linear(output.reshape(output.shape[0], -1))


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def supernet() -> SuperNet:
    space = HierarchicalSearchSpace.preset("signal-1d")
    return SuperNet(space, input_shape=(40, 1), num_classes=10, seed=0).eval()


def _subnet(supernet: SuperNet, name: str) -> tuple[Architecture, nn.Module]:
    arch = supernet.space.from_params(SIGNAL_1D_PAPER_MODELS[name])
    assert supernet.space.contains(arch)
    return arch, supernet.subnet(arch).eval()


@pytest.mark.parametrize(
    ("name", "paper", "params"),
    [("mlp", PaperMLP, 15_210), ("cnn", PaperCNN, 5_210), ("gru", PaperGRU, 5_134)],
)
def test_the_papers_models_are_points_of_the_space(
    supernet: SuperNet, name: str, paper: type[nn.Module], params: int
) -> None:
    arch, sub = _subnet(supernet, name)
    assert _count(sub) == _count(paper()) == params
    x = torch.randn(4, 40, 1)
    assert sub(x).shape == (4, 10)
    assert torch.allclose(sub(x), supernet(x, arch), atol=1e-5)


def test_the_mlp_computes_the_papers_function(supernet: SuperNet) -> None:
    _, sub = _subnet(supernet, "mlp")
    paper = PaperMLP()
    cells = [layer.op for layer in list(sub)[1:3]]
    head = list(sub)[-1]
    with torch.no_grad():
        for cell, linear in zip(cells, (paper.linear1, paper.linear2)):
            cell.weight.copy_(linear.weight[:, :, None])
            cell.bias.copy_(linear.bias)
        head.weights["1"].copy_(paper.linear3.weight[:, None, :])
        head.bias.copy_(paper.linear3.bias)
    x = torch.randn(16, 40, 1)
    assert torch.allclose(sub(x), paper(x[..., 0]), atol=1e-5)


def test_the_gru_computes_the_papers_function(supernet: SuperNet) -> None:
    _, sub = _subnet(supernet, "gru")
    paper = PaperGRU()
    gru, head = list(sub)[1].op.gru, list(sub)[-1]
    with torch.no_grad():
        for name, value in paper.gru.named_parameters():
            getattr(gru, name).copy_(value)
        # the head averages per-position classifiers: its weight is 40 x the linear layer's
        head.weights["40"].copy_(40 * paper.linear.weight.view(10, 40, 12))
        head.bias.copy_(paper.linear.bias)
    x = torch.randn(16, 40, 1)
    assert torch.allclose(sub(x), paper(x[..., 0]), atol=1e-5)


def test_the_cnn_has_the_papers_layers(supernet: SuperNet) -> None:
    arch, sub = _subnet(supernet, "cnn")
    paper = PaperCNN()
    convs = [layer.op for layer in list(sub)[1:4]]
    for ours, theirs in zip(convs, (paper.conv1, paper.conv2, paper.conv3)):
        assert ours.weight.shape == theirs.weight.shape and ours.bias.shape == theirs.bias.shape
        assert ours.out_length(40, arch.cells[0]) in (19, 20)
    assert supernet.lengths(arch) == [40, 20, 10, 5, 5]  # the paper: 40, 19, 10, 5
    assert list(sub)[-1].weights["5"].numel() == paper.linear.weight.numel()


def test_every_path_of_the_space_is_its_own_standalone_model(supernet: SuperNet) -> None:
    """Strided, pooled and recurrent paths in every topology: the exported subnet computes
    what the supernet computes, and gradients reach the shared weights."""
    rng = np.random.default_rng(0)
    x = torch.randn(3, 40, 1)
    for _ in range(40):
        arch = supernet.space.sample(rng)
        supernet.train()
        supernet.zero_grad()
        supernet(x, arch).sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in supernet.parameters())
        supernet.eval()
        sub = supernet.subnet(arch).eval()
        assert torch.allclose(sub(x), supernet(x, arch), atol=1e-4), arch.describe()


def test_the_fcn_baseline_is_the_published_network_within_the_spaces_widths(
    supernet: SuperNet,
) -> None:
    """Wang et al.'s FCN: three same-padded Conv1d + BatchNorm + ReLU layers (kernels 8/5/3,
    capped at the space's 7; widths 128/256/128, capped at 100), global average pooling and a
    linear classifier, with no norm before the pooling (a convolutional path)."""
    arch = supernet.space.from_params(SIGNAL_1D_BASELINES["fcn"])
    assert supernet.space.contains(arch)
    sub = supernet.subnet(arch).eval()
    convs = [layer.op for layer in list(sub)[1:4]]
    assert [c.weight.shape[-1] for c in convs] == [7, 5, 3]
    assert [c.weight.shape[0] for c in convs] == [100, 100, 100]
    assert supernet.lengths(arch) == [40, 40, 40, 40, 40]  # no stride: same padding throughout
    published = nn.Sequential(
        nn.Conv1d(1, 100, 7, padding=3, bias=False),
        nn.BatchNorm1d(100),
        nn.ReLU(),
        nn.Conv1d(100, 100, 5, padding=2, bias=False),
        nn.BatchNorm1d(100),
        nn.ReLU(),
        nn.Conv1d(100, 100, 3, padding=1, bias=False),
        nn.BatchNorm1d(100),
        nn.ReLU(),
        nn.Linear(100, 10),
    )  # no conv bias: the paper's Keras layers carry one, which the BatchNorm after it cancels
    assert _count(sub) == _count(published)
    assert sub(torch.randn(4, 40, 1)).shape == (4, 10)


def test_the_head_normalises_after_attention_cells_only(supernet: SuperNet) -> None:
    """A pre-norm attention or transformer cell ends in the head's LayerNorm; a path of
    convolutions is pooled as it is, in the supernet and in the exported subnet alike."""
    fcn = supernet.space.from_params(SIGNAL_1D_BASELINES["fcn"])
    attention = dataclasses.replace(
        fcn, cells=(fcn.cells[0], CellConfig(op="attention", heads=2), *fcn.cells[2:])
    )
    assert supernet.space.contains(attention)
    assert not supernet.head_normalizes(fcn) and supernet.head_normalizes(attention)
    supernet.eval()
    x = torch.randn(3, 40, 1)
    for arch, normed in ((fcn, False), (attention, True)):
        sub = supernet.subnet(arch).eval()
        assert (sub[-1].norm is not None) == normed
        torch.testing.assert_close(sub(x), supernet(x, arch), atol=1e-5, rtol=1e-4)
    # the shared head holds the norm for the paths that use it: moving it moves only those
    with torch.no_grad():
        head = supernet._head(fcn)
        before = (supernet(x, fcn).clone(), supernet(x, attention).clone())
        head.norm.bias.add_(1.0)
        try:
            assert torch.equal(supernet(x, fcn), before[0])
            assert not torch.allclose(supernet(x, attention), before[1])
        finally:
            head.norm.bias.sub_(1.0)  # the fixture is shared
