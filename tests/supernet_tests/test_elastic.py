"""The nested presets ``signal-elastic`` and ``digits-elastic``: every subnet is a slice of the
largest (so the supernet's weights can rank them), and the FCN and a ResNet-1D are points of
the signal one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.search_space import reference_models
from optuna_hpcnas.search_space import SIGNAL_ELASTIC_BASELINES
from optuna_hpcnas.supernet import SuperNet


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _largest(space: HierarchicalSearchSpace, layout: dict[str, Any]) -> Any:
    """The widest, deepest path with the largest kernels (stride 1), residual."""
    conv = next(op.name for op in space.operators if op.name != "identity")
    params: dict[str, Any] = {"node.topology": "residual", **layout}
    for i in range(space.num_cells):
        params[f"node.cell{i}.op"] = conv
        params[f"node.cell{i}.width"] = max(space.widths)
        params[f"node.cell{i}.kernel"] = max(space.decision(f"node.cell{i}.kernel").choices)
        if f"node.cell{i}.stride" in space.distributions():
            params[f"node.cell{i}.stride"] = 1
    return space.from_params({k: v for k, v in params.items() if k in space.distributions()})


def _convolutions(model: nn.Module) -> list[torch.Tensor | None]:
    """Each cell's convolution weight, or ``None`` for a skipped cell."""
    cells = list(model)[1:-1]
    return [getattr(cell.op, "weight", None) for cell in cells]


def _centre(weight: torch.Tensor, k: int) -> torch.Tensor:
    start = (weight.shape[-1] - k) // 2
    if weight.dim() == 3:
        return weight[..., start : start + k]
    return weight[..., start : start + k, start : start + k]


@pytest.mark.parametrize(
    ("preset", "input_shape", "layout"),
    [
        (
            "signal-elastic",
            (40, 1),
            {
                "cluster.data_parallel": 1,
                "cluster.pipeline_stages": 1,
                "cluster.micro_batch_size": 32,
            },
        ),
        ("digits-elastic", (1, 8, 8), {}),
    ],
)
def test_every_subnet_is_a_slice_of_the_largest(
    preset: str, input_shape: tuple[int, ...], layout: dict[str, Any]
) -> None:
    """A subnet's convolutions are the leading output and input channels and the centred
    kernel of the largest path's, cell by cell, and it computes what the supernet computes."""
    space = HierarchicalSearchSpace.preset(preset)
    supernet = SuperNet(space, input_shape=input_shape, num_classes=10, seed=0).eval()
    largest = _convolutions(supernet.subnet(_largest(space, layout)))
    assert all(w is not None for w in largest)
    rng = np.random.default_rng(0)
    x = torch.randn(3, *input_shape)
    for _ in range(25):
        arch = space.sample(rng)
        sub = supernet.subnet(arch).eval()
        for i, weight in enumerate(_convolutions(sub)):
            if weight is None:
                assert arch.cells[i].op == "identity"
                continue
            big = largest[i]
            assert big is not None
            w, c, k = weight.shape[0], weight.shape[1], weight.shape[-1]
            assert torch.equal(weight, _centre(big[:w, :c], k)), arch.describe()
        assert torch.allclose(sub(x), supernet(x, arch), atol=1e-4), arch.describe()


def test_the_fcn_and_a_resnet_are_points_of_the_signal_space() -> None:
    space = HierarchicalSearchSpace.preset("signal-elastic")
    assert sorted(reference_models("signal-elastic")) == ["fcn", "resnet"]
    supernet = SuperNet(space, input_shape=(40, 1), num_classes=10, seed=0).eval()
    fcn = space.from_params(SIGNAL_ELASTIC_BASELINES["fcn"])
    resnet = space.from_params(SIGNAL_ELASTIC_BASELINES["resnet"])
    assert space.contains(fcn) and space.contains(resnet)
    assert fcn.topology == "chain" and resnet.topology == "residual"
    shapes = [tuple(w.shape) for w in _convolutions(supernet.subnet(fcn)) if w is not None]
    assert shapes == [(128, 1, 7), (128, 128, 5), (128, 128, 3)]
    # Wang et al.'s FCN at the space's widths: convolutions without bias (the BatchNorm after
    # each cancels one), global average pooling, a linear classifier (no norm before it)
    published = nn.Sequential(
        nn.Conv1d(1, 128, 7, bias=False), nn.BatchNorm1d(128),
        nn.Conv1d(128, 128, 5, bias=False), nn.BatchNorm1d(128),
        nn.Conv1d(128, 128, 3, bias=False), nn.BatchNorm1d(128),
        nn.Linear(128, 10),
    )  # fmt: skip
    assert _count(supernet.subnet(fcn)) == _count(published)
    kernels = [w.shape[-1] for w in _convolutions(supernet.subnet(resnet)) if w is not None]
    widths = [w.shape[0] for w in _convolutions(supernet.subnet(resnet)) if w is not None]
    assert kernels == [7, 5, 3, 7, 5, 3] and widths == [64, 64, 64, 128, 128, 128]
    assert supernet.subnet(resnet)(torch.randn(2, 40, 1)).shape == (2, 10)


def test_the_image_space_is_small_enough_to_enumerate() -> None:
    space = HierarchicalSearchSpace.preset("digits-elastic")
    archs = list(space.enumerate())
    assert len(archs) == space.cardinality() == 2 * (1 + 2 * 2) ** 4
    assert len(set(archs)) == len(archs)
