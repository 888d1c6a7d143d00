from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.supernet import cosine_lr
from optuna_hpcnas.supernet import recalibrate_batch_norm
from optuna_hpcnas.supernet import SuperNet
from optuna_hpcnas.supernet import SupernetTrainer
from optuna_hpcnas.supernet import SupernetTrainingConfig
from optuna_hpcnas.supernet import train_step

SPACE = HierarchicalSearchSpace(
    num_cells=2, operators=("conv3x3", "sepconv3x3", "maxpool3x3", "identity"), widths=(4, 8)
)
SHAPE = (1, 6, 6)


def _data(n: int = 48, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, *SHAPE, generator=g), torch.randint(0, 3, (n,), generator=g)
    )


def _net(seed: int = 0) -> SuperNet:
    return SuperNet(SPACE, input_shape=SHAPE, num_classes=3, seed=seed)


def test_k_paths_accumulate_the_mean_gradient() -> None:
    net = _net()
    x, y = _data(8).tensors
    archs = [SPACE.sample(np.random.default_rng(i)) for i in range(3)]
    expected: dict[str, torch.Tensor] = {}
    for arch in archs:
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x, arch), y).backward()
        for name, p in net.named_parameters():
            if p.grad is not None:
                expected[name] = expected.get(name, torch.zeros_like(p)) + p.grad / 3
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    result = train_step(net, optimizer, x, y, archs)
    assert result.finite and result.paths == 3
    for name, p in net.named_parameters():
        if name in expected:
            torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5)


def test_cosine_lr_starts_at_lr_halves_midway_and_ends_at_zero() -> None:
    assert cosine_lr(0.1, 0, 10) == 0.1
    assert cosine_lr(0.1, 5, 10) == pytest.approx(0.05, abs=1e-15)
    assert cosine_lr(0.1, 2.5, 10) == pytest.approx(0.05 * (1 + 2**-0.5))  # fractional epochs
    assert cosine_lr(0.1, 10, 10) == 0.0
    assert cosine_lr(0.1, 13, 10) == 0.0  # stays at 0 past the end instead of rising again
    lrs = [cosine_lr(2e-2, s, 7) for s in range(8)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError, match="`total` is 0"):
        cosine_lr(0.1, 0, 0)


def test_non_finite_loss_skips_the_update() -> None:
    net = _net()
    x, y = _data(8).tensors
    x[0, 0, 0, 0] = float("nan")
    before = {k: v.clone() for k, v in net.state_dict().items() if v.is_floating_point()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    result = train_step(net, optimizer, x, y, [SPACE.sample(np.random.default_rng(0))])
    assert not result.finite and np.isnan(result.loss)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p, before[name])


def test_bf16_autocast_keeps_fp32_parameters_and_optimizer_state() -> None:
    net = _net()
    trainer = SupernetTrainer(
        net, SupernetTrainingConfig(paths_per_batch=2, batch_size=16, precision="bf16")
    )
    history = trainer.fit(_data(), epochs=1)
    assert np.isfinite(history[0])
    assert all(p.dtype == torch.float32 for p in net.parameters())
    states = [s for s in trainer.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    with pytest.raises(ValueError, match="fp16"):
        SupernetTrainer(_net(), SupernetTrainingConfig(precision="fp16"))


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (torch.Tensor, str, int, float, bool))


def test_state_dict_round_trip_resumes_identically() -> None:
    config = SupernetTrainingConfig(paths_per_batch=2, batch_size=16, epochs=2, seed=5)
    data = _data()
    a = SupernetTrainer(_net(), config)
    a.fit(data, epochs=1)
    state = a.state_dict()
    assert _plain(state)
    b = SupernetTrainer(_net(seed=9), config)
    b.load_state_dict(state)
    assert b.steps == a.steps and b.epochs_done == 1
    a.fit(data, epochs=1)
    b.fit(data, epochs=1)
    for (name, pa), pb in zip(a.supernet.state_dict().items(), b.supernet.state_dict().values()):
        torch.testing.assert_close(pa, pb, msg=name)


def test_population_sampling_draws_from_the_population() -> None:
    config = SupernetTrainingConfig(sampling="population", paths_per_batch=6)
    trainer = SupernetTrainer(_net(), config)
    population = [SPACE.sample(np.random.default_rng(i)) for i in range(2)]
    assert len(set(trainer.sample_paths())) > 2  # uniform until a population is given
    trainer.set_population(population)
    assert set(trainer.sample_paths()) <= set(population)


def test_batch_norm_recalibration_uses_the_data_statistics() -> None:
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    data = torch.randn(64, 3) * 2 + 5
    used = recalibrate_batch_norm(model.eval(), [(data[:32], None), (data[32:], None)])
    assert used == 2 and not model.training
    bn = model[0]
    torch.testing.assert_close(bn.running_mean, data.mean(0), atol=1e-5, rtol=1e-5)
    assert bn.momentum == 0.1


def test_batch_norm_recalibration_of_a_subnet_is_the_plain_average_over_batches() -> None:
    # The cells' BatchNorms run through the sliced functional path: recalibration must give
    # the same statistics whether the data comes in one batch or in many (momentum=None is
    # the cumulative average there too, not an exponential one from the reset (0, 1)).
    space = HierarchicalSearchSpace(
        num_cells=2, operators=("conv3x3",), topologies=("chain",), widths=(4, 8)
    )
    arch = next(a for a in space.enumerate() if a.cells[0].width == 4)
    net = SuperNet(space, input_shape=SHAPE, num_classes=3)
    data = torch.randn(96, *SHAPE) * 3 + 2
    whole, split = net.subnet(arch), net.subnet(arch)
    recalibrate_batch_norm(whole, [(data, None)])
    recalibrate_batch_norm(split, [(data[i : i + 8], None) for i in range(0, 96, 8)])
    norms = [
        (a, b)
        for a, b in zip(whole.modules(), split.modules())
        if isinstance(a, torch.nn.modules.batchnorm._BatchNorm)
    ]
    assert len(norms) >= 3  # the stem's and both cells'
    for a, b in norms:
        assert int(b.num_batches_tracked) == 12
        # Downstream inputs were normalised with each batch's statistics: close, not equal.
        torch.testing.assert_close(a.running_mean, b.running_mean, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(a.running_var, b.running_var, atol=2e-2, rtol=2e-2)


def test_training_config_validation() -> None:
    assert (
        SupernetTrainingConfig(**{"paths_per_batch": 3, "precision": "bf16"}).paths_per_batch == 3
    )
    for bad in (
        {"paths_per_batch": 0},
        {"precision": "int8"},
        {"sampling": "greedy"},
        {"lr": 0.0},
        {"optimizer": "lamb"},
        {"momentum": 1.0},
    ):
        with pytest.raises(ValueError):
            SupernetTrainingConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SupernetTrainingConfig(epochs=1.5)  # type: ignore[arg-type]


def test_fair_sampling_trains_every_operator_equally() -> None:
    config = SupernetTrainingConfig(sampling="fair", paths_per_batch=8)
    trainer = SupernetTrainer(_net(), config)
    for _ in range(3):
        paths = trainer.sample_paths()
        assert all(SPACE.contains(p) for p in paths)
        for i in range(SPACE.num_cells):
            counts = {
                op: sum(p.cells[i].op == op for p in paths)
                for op in ("conv3x3", "sepconv3x3", "maxpool3x3", "identity")
            }
            assert set(counts.values()) == {2}  # 8 paths over 4 operators
