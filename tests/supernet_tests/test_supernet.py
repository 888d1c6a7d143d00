from __future__ import annotations

import numpy as np
import pytest
import torch

from optuna_hpcnas import Architecture
from optuna_hpcnas import CellConfig
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.supernet import layer_recipes
from optuna_hpcnas.supernet import SuperNet


def _image_space() -> HierarchicalSearchSpace:
    return HierarchicalSearchSpace(
        num_cells=3,
        operators=(
            "conv",
            "sepconv",
            "dilconv5x5",
            "maxpool3x3",
            "avgpool3x3",
            "identity",
            "transformer",
            "attention",
        ),
        widths=(8, 16),
        kernel_sizes=(3, 5),
        expansion_ratios=(1, 2),
        num_heads=(1, 2),
    )


def _sequence_space() -> HierarchicalSearchSpace:
    return HierarchicalSearchSpace.preset(
        "sequence", widths=(8, 16), data_parallel=(1,), pipeline_stages=(1,)
    )


CASES = [
    (HierarchicalSearchSpace.preset("digits-small"), (1, 8, 8)),
    (_image_space(), (2, 6, 6)),
    (_sequence_space(), (10, 5)),
]


@pytest.mark.parametrize("space,shape", CASES)
def test_subnet_computes_the_supernet_path(space: HierarchicalSearchSpace, shape: tuple) -> None:
    torch.manual_seed(0)
    net = SuperNet(space, input_shape=shape, num_classes=3, seed=1)
    # Some training steps so BN statistics and weights are not at their initial values.
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    for _ in range(3):
        loss = net(torch.randn(8, *shape), space.sample(rng)).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    x = torch.randn(5, *shape)
    outputs = []
    for _ in range(12):
        arch = space.sample(rng)
        sub = net.subnet(arch)
        assert not any(isinstance(m, SuperNet) for m in sub.modules())
        expected = net(x, arch)
        torch.testing.assert_close(sub(x), expected, atol=1e-5, rtol=1e-4)
        outputs.append(expected)
    # Different architectures compute different functions.
    assert len({round(float(o.detach().sum()), 4) for o in outputs}) > 6


def test_subnet_owns_its_weights() -> None:
    space, shape = CASES[0]
    net = SuperNet(space, input_shape=shape, num_classes=10).eval()
    arch = next(iter(space.enumerate()))
    x = torch.randn(3, *shape)
    before = net(x, arch).clone()
    sub = net.subnet(arch)
    with torch.no_grad():
        for p in sub.parameters():
            p.add_(1.0)
    torch.testing.assert_close(net(x, arch), before)
    supernet_storage = {p.untyped_storage().data_ptr() for p in net.parameters()}
    assert not supernet_storage & {p.untyped_storage().data_ptr() for p in sub.parameters()}


@pytest.mark.parametrize("topology", ["chain", "residual", "dense"])
def test_layer_recipes_rebuild_fresh_layers_alone(topology: str) -> None:
    space, shape = CASES[1]
    cells = (
        CellConfig("conv", kernel=5, width=8),
        CellConfig("transformer", expansion=2, heads=2),
        CellConfig("sepconv", kernel=3, width=16),
    )
    arch = Architecture(topology, cells)
    assert space.contains(arch)
    fresh = SuperNet(space, input_shape=shape, num_classes=4, seed=7).eval().layers(arch)
    recipes = layer_recipes(space, arch, input_shape=shape, num_classes=4, seed=7)
    assert [r.index for r in recipes] == list(range(len(cells) + 2))
    x = torch.randn(2, *shape)
    h1, h2 = x, x
    for recipe, layer in zip(recipes, fresh):
        built = recipe.build().eval()
        h1, h2 = built(h1), layer(h2)
        torch.testing.assert_close(h1, h2)
    assert h1.shape == (2, 4)


def test_weights_are_seeded_by_position_not_by_space() -> None:
    small = HierarchicalSearchSpace(num_cells=2, operators=("conv3x3", "identity"), widths=(8,))
    large = HierarchicalSearchSpace(
        num_cells=3, operators=("maxpool3x3", "conv3x3", "identity"), widths=(8,)
    )
    a = SuperNet(small, input_shape=(1, 5, 5), num_classes=3, seed=3)
    b = SuperNet(large, input_shape=(1, 5, 5), num_classes=3, seed=3)
    c = SuperNet(small, input_shape=(1, 5, 5), num_classes=3, seed=4)
    for i in range(2):
        wa = a.cells[i]["conv3x3"].weight
        torch.testing.assert_close(wa, b.cells[i]["conv3x3"].weight)
        assert not torch.equal(wa, c.cells[i]["conv3x3"].weight)
    assert not torch.equal(a.cells[0]["conv3x3"].weight, a.cells[1]["conv3x3"].weight)


def test_only_the_sampled_path_gets_gradients() -> None:
    space, shape = CASES[0]
    net = SuperNet(space, input_shape=shape, num_classes=10)
    arch = Architecture(
        "chain",
        (
            CellConfig("conv3x3", kernel=3, width=16),
            CellConfig("identity"),
            CellConfig("sepconv3x3", kernel=3, width=32),
        ),
    )
    net(torch.randn(4, *shape), arch).sum().backward()
    conv = net.cells[0]["conv3x3"].weight.grad
    assert conv is not None
    assert conv[:16].abs().sum() > 0 and conv[16:].abs().sum() == 0  # width 16 of 32
    assert net.cells[1]["conv3x3"].weight.grad is None
    assert net.cells[2]["sepconv3x3"].pointwise.grad is not None


def test_batch_norm_statistics_update_through_slices() -> None:
    space, shape = CASES[0]
    net = SuperNet(space, input_shape=shape, num_classes=10).train()
    arch = Architecture(
        "chain", (CellConfig("conv3x3", kernel=3, width=16),) + (CellConfig("identity"),) * 2
    )
    bn = net.cells[0]["conv3x3"].bn
    net(torch.randn(16, *shape), arch)
    assert not torch.allclose(bn.running_mean[:16], torch.zeros(16))
    torch.testing.assert_close(bn.running_mean[16:], torch.zeros(16))


def test_bad_inputs_raise_clear_errors() -> None:
    space, shape = CASES[0]
    with pytest.raises(ValueError, match="input_shape"):
        SuperNet(space, input_shape=(8, 8), num_classes=10)
    with pytest.raises(ValueError, match="num_classes"):
        SuperNet(space, input_shape=shape, num_classes=1)
    with pytest.raises(TypeError, match="HierarchicalSearchSpace"):
        SuperNet("digits-small", input_shape=shape, num_classes=10)  # type: ignore[arg-type]
    net = SuperNet(space, input_shape=shape, num_classes=10)
    with pytest.raises(ValueError, match="shape"):
        net.check_input(torch.zeros(2, 3, 8, 8))
    foreign = Architecture("chain", (CellConfig("conv5x5", width=16),) * 3)
    with pytest.raises(ValueError, match="not in this search space"):
        net.subnet(foreign)


def test_heads_that_do_not_divide_a_width_become_the_largest_that_do() -> None:
    from optuna_hpcnas.supernet._ops import effective_heads

    assert [effective_heads(4, w) for w in (6, 12, 25, 1)] == [3, 4, 1, 1]
    space = HierarchicalSearchSpace(
        num_cells=2,
        operators=("conv3x3", "attention"),
        widths=(6, 12),
        num_heads=(3, 4),
        topologies=("chain",),
    )
    net = SuperNet(space, input_shape=(1, 4, 4), num_classes=2).eval()
    x = torch.randn(2, 1, 4, 4)
    narrow = CellConfig("conv3x3", kernel=3, width=6)
    four, three = (
        Architecture("chain", (narrow, CellConfig("attention", heads=h))) for h in (4, 3)
    )
    # width 6 with 4 heads runs as 3 heads: the same function as asking for 3
    assert torch.allclose(net(x, four), net(x, three))
    assert torch.allclose(net.subnet(four)(x), net(x, four), atol=1e-5)


def test_pooling_matches_torch_pooling() -> None:
    from optuna_hpcnas.supernet._ops import PoolOp

    x = torch.randn(2, 3, 5, 5)
    cell = CellConfig("avgpool3x3")
    avg = PoolOp("avg")(x, cell)
    torch.testing.assert_close(
        avg, torch.nn.functional.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
    )
    mx = PoolOp("max")(x, cell)
    torch.testing.assert_close(mx, torch.nn.functional.max_pool2d(x, 3, 1, 1))
    assert mx.is_contiguous()
