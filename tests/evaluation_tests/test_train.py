from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from optuna_hpcnas import Architecture
from optuna_hpcnas import CellConfig
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.data import load_digits_task
from optuna_hpcnas.data import make_sequence_task
from optuna_hpcnas.data import TaskData
from optuna_hpcnas.evaluation import count_flops
from optuna_hpcnas.evaluation import NonFiniteLossError
from optuna_hpcnas.evaluation import ScratchTrainingConfig
from optuna_hpcnas.evaluation import train_from_scratch
from optuna_hpcnas.evaluation import train_model


@pytest.fixture(scope="module")
def digits() -> TaskData:
    return load_digits_task()


def test_digits_split_is_fixed_disjoint_and_stratified(digits: TaskData) -> None:
    again = load_digits_task()
    other = load_digits_task(seed=1)
    xs = [d.tensors[0] for d in (digits.train, digits.valid, digits.test)]  # type: ignore[attr-defined]
    assert sum(len(x) for x in xs) == 1797
    torch.testing.assert_close(again.valid.tensors[0], xs[1])  # type: ignore[attr-defined]
    assert not torch.equal(other.valid.tensors[0], xs[1])  # type: ignore[attr-defined]
    rows = [{tuple(r.flatten().tolist()) for r in x} for x in xs]
    assert not rows[1] & rows[2]
    labels = digits.valid.tensors[1]  # type: ignore[attr-defined]
    counts = torch.bincount(labels, minlength=10)
    assert counts.min() >= 33 and counts.max() <= 38
    digits.check()


def test_sequence_task_is_learnable_shape(digits: TaskData) -> None:
    task = make_sequence_task(num_samples=200, length=12, features=4, num_classes=3, seed=2)
    x, y = task.train[0]
    assert tuple(x.shape) == (12, 4) == task.input_shape
    assert task.domain == "sequence" and 0 <= int(y) < 3
    with pytest.raises(ValueError, match="motif_length"):
        make_sequence_task(length=3, motif_length=4)


def test_task_check_reports_wrong_shapes() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 1, 7, 7), torch.zeros(4, dtype=torch.long))
    task = TaskData(ds, ds, ds, input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match=r"shape \(1, 7, 7\)"):
        task.check()


def test_train_from_scratch_is_deterministic_and_measures(digits: TaskData) -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = Architecture(
        "residual",
        (
            CellConfig("conv3x3", kernel=3, width=16),
            CellConfig("maxpool3x3", kernel=3),
            CellConfig("sepconv3x3", kernel=3, width=32),
        ),
    )
    kwargs: dict[str, Any] = {"steps": 34, "lr": 2e-2, "batch_size": 32}  # one pass
    a = train_from_scratch(space, arch, digits, seed=3, latency_repeats=2, **kwargs)
    b = train_from_scratch(space, arch, digits, seed=3, latency_repeats=2, **kwargs)
    for key in ("valid_accuracy", "valid_loss", "test_accuracy", "flops", "params"):
        assert a[key] == b[key], key
    assert a["valid_accuracy"] > 0.3  # far above chance after one pass
    assert a["latency_s"] > 0 and a["flops"] > 0 and a["params"] > 0
    assert a["trained_on"] == len(digits.train)  # a reference: the validation split held out
    c = train_from_scratch(space, arch, digits, seed=4, latency_repeats=0, **kwargs)
    assert c["valid_loss"] != a["valid_loss"] and np.isnan(c["latency_s"])
    small = Architecture("chain", (CellConfig("identity"),) * 3)
    d = train_from_scratch(space, small, digits, steps=0, latency_repeats=0)
    assert d["flops"] < a["flops"] and d["params"] < a["params"]


class _LinearTurningNaN(nn.Module):
    """A linear classifier of digits whose logits are NaN from its ``after``-th forward on
    (``dtype``: that of its last training forward)."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 10)
        self.after, self.calls = after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        logits = self.linear(x.flatten(1))
        if self.training:  # not the measurements after training
            self.dtype = logits.dtype
        return logits * float("nan") if self.calls >= self.after else logits


def test_train_model_follows_the_per_step_cosine_and_learns_digits(digits: TaskData) -> None:
    lrs: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    try:
        config = ScratchTrainingConfig(steps=68, lr=2e-2, batch_size=32, seed=1, holdout=True)
        result = train_model(_LinearTurningNaN(after=10**9), digits, config)
    finally:
        handle.remove()
    # The schedule of the loop before train_step: torch's CosineAnnealingLR stepped once per
    # batch over all batches (first step at `lr`, the last one step short of 0).
    steps = 68
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    expected = []
    for _ in range(steps):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx(expected, rel=1e-12, abs=1e-16)
    assert lrs[0] == 2e-2 and 0 < lrs[-1] < 1e-4
    assert result["valid_accuracy"] > 0.9 and result["test_accuracy"] > 0.9  # a linear model
    assert result["steps"] == 68 and result["latency_s"] > 0


def test_the_export_recipe_learns_from_train_and_validation(digits: TaskData) -> None:
    seen: list[int] = []
    config = ScratchTrainingConfig(steps=3, batch_size="auto", latency_repeats=0)
    result = train_model(
        _LinearTurningNaN(after=10**9), digits, config, on_step=lambda s, _: seen.append(s)
    )
    assert result["trained_on"] == len(digits.train) + len(digits.valid)  # type: ignore[arg-type]
    assert result["batch_size"] == 64 and seen == [1, 2, 3]


def test_a_capped_auto_batch_trains_longer_at_a_lower_rate(digits: TaskData) -> None:
    """``max_batch_size`` lowers the auto batch; rate and steps follow it as for small data:
    a batch of 16 instead of 64 halves the rate and doubles the steps."""
    lrs: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    try:
        config = ScratchTrainingConfig(steps=3, lr=4e-3, max_batch_size=16, latency_repeats=0)
        result = train_model(_LinearTurningNaN(after=10**9), digits, config)
    finally:
        handle.remove()
    assert result["batch_size"] == 16 and result["steps"] == 6 and len(lrs) == 6
    assert lrs[0] == pytest.approx(2e-3)
    fixed = ScratchTrainingConfig(steps=3, batch_size=32, max_batch_size=16, latency_repeats=0)
    assert train_model(_LinearTurningNaN(after=10**9), digits, fixed)["batch_size"] == 32


class _ConvBatchNorm(nn.Module):
    """A convolution, BatchNorm and a linear layer over digits' 8 x 8 images."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean(dim=(2, 3)))


def test_weight_averaging_ends_with_the_mean_weights_of_its_share_and_their_statistics(
    digits: TaskData,
) -> None:
    """``average = 0.25`` over 40 steps: the rate holds from step 31 at its cosine value
    there, the model ends with the mean of its weights after steps 31-40, and its BatchNorm
    statistics are those of these mean weights on the training set."""
    lrs: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    model = _ConvBatchNorm()
    snapshots: list[dict[str, torch.Tensor]] = []

    def keep(step: int, loss: float) -> None:
        if step > 30:
            snapshots.append({k: v.detach().clone() for k, v in model.named_parameters()})

    config = ScratchTrainingConfig(
        steps=40, lr=1e-2, batch_size=32, seed=0, latency_repeats=0, holdout=True, average=0.25
    )
    try:
        train_model(model, digits, config, on_step=keep)
    finally:
        handle.remove()
    plain = ScratchTrainingConfig(steps=40, lr=1e-2, batch_size=32)
    assert lrs[:31] == pytest.approx(
        [plain.lr * 0.5 * (1 + math.cos(math.pi * min(s, 30) / 40)) for s in range(31)]
    )
    assert lrs[30:] == [lrs[30]] * 10 and 0 < lrs[30] < lrs[0]
    assert len(snapshots) == 10
    for name, value in model.named_parameters():
        mean = torch.stack([s[name] for s in snapshots]).mean(dim=0)
        assert torch.allclose(value, mean, atol=1e-6), name
        assert not torch.allclose(value, snapshots[-1][name], atol=1e-6), name  # not the last
    x, _ = digits.train.tensors  # type: ignore[attr-defined]
    with torch.no_grad():
        pre_norm = model.conv(x[:256])  # the first of the training set's batches of 256
    running = model.norm.running_mean
    expected = [pre_norm.mean(dim=(0, 2, 3))]
    with torch.no_grad():
        for start in range(256, len(x), 256):
            chunk = x[start : start + 256]
            if len(chunk) > 1:
                expected.append(model.conv(chunk).mean(dim=(0, 2, 3)))
    assert torch.allclose(running, torch.stack(expected).mean(dim=0), atol=1e-5)


def test_no_weight_averaging_keeps_the_last_weights(digits: TaskData) -> None:
    """``average = 0`` (the default) and an explicit 0 train the same weights."""
    weights = []
    for config in (
        ScratchTrainingConfig(steps=12, batch_size=32, latency_repeats=0, holdout=True),
        ScratchTrainingConfig(steps=12, batch_size=32, latency_repeats=0, holdout=True, average=0),
    ):
        model = _ConvBatchNorm()
        train_model(model, digits, config)
        weights.append(model.state_dict())
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name


def test_train_model_stops_at_a_non_finite_loss_naming_the_step(digits: TaskData) -> None:
    model = _LinearTurningNaN(after=38)
    with pytest.raises(
        NonFiniteLossError, match=r"^non-finite loss at step 38 of 100: lower `lr`"
    ):
        train_model(model, digits, ScratchTrainingConfig(steps=100, latency_repeats=0))
    assert model.calls == 38  # stopped at once
    assert torch.isfinite(model.linear.weight).all()  # and the NaN step changed nothing


def test_train_model_clips_gradients_and_autocasts_as_configured(digits: TaskData) -> None:
    norms: list[float] = []

    def record(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    handle = register_optimizer_step_pre_hook(record)
    try:
        for grad_clip in (0.0, 0.5):
            model = _LinearTurningNaN(after=10**9)
            config = ScratchTrainingConfig(
                steps=34, lr=2e-2, grad_clip=grad_clip, latency_repeats=0
            )
            train_model(model, digits, config)
            assert model.dtype == torch.float32
    finally:
        handle.remove()
    unclipped, clipped = norms[: len(norms) // 2], norms[len(norms) // 2 :]
    assert max(unclipped) > 1.0 and max(clipped) <= 0.5 + 1e-5
    model = _LinearTurningNaN(after=10**9)
    result = train_model(
        model,
        digits,
        ScratchTrainingConfig(steps=68, lr=2e-2, precision="bf16", latency_repeats=0),
    )
    assert model.dtype == torch.bfloat16 and model.linear.weight.dtype == torch.float32
    assert result["valid_accuracy"] > 0.85
    with pytest.raises(ValueError, match="'fp16', which needs a GPU"):
        train_model(model, digits, ScratchTrainingConfig(precision="fp16"))


def test_flops_count_a_known_convolution() -> None:
    conv = torch.nn.Conv2d(2, 4, 3, padding=1, bias=False)
    assert count_flops(conv, (2, 5, 5)) == 2 * 4 * 2 * 9 * 25


def test_data_that_does_not_fit_the_space_fails_before_training(digits: TaskData) -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = next(iter(space.enumerate()))
    seq = make_sequence_task(num_samples=100, num_classes=2)
    with pytest.raises(ValueError, match="sequence"):
        train_from_scratch(space, arch, seq, steps=1)


def test_scratch_config_validates() -> None:
    assert ScratchTrainingConfig(**{"steps": 2, "lr": 0.1}).steps == 2
    default = ScratchTrainingConfig()
    assert default.grad_clip == 0 and default.precision == "fp32"  # off, as before they existed
    assert default.batch_size == "auto" and not default.holdout
    with pytest.raises(ValueError, match="lr"):
        ScratchTrainingConfig(lr=-1.0)
    with pytest.raises(TypeError, match="steps"):
        ScratchTrainingConfig(steps=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'auto'"):
        ScratchTrainingConfig(batch_size="big")
    with pytest.raises(ValueError, match="`batch_size` is 1, but must be >= 2"):
        ScratchTrainingConfig(batch_size=1)
    with pytest.raises(ValueError, match="`max_batch_size` is 1, but must be >= 2"):
        ScratchTrainingConfig(max_batch_size=1)
    with pytest.raises(ValueError, match="`grad_clip` is -1.0, but must be >= 0"):
        ScratchTrainingConfig(grad_clip=-1.0)
    with pytest.raises(ValueError, match="`grad_clip` is nan"):
        ScratchTrainingConfig(grad_clip=float("nan"))
    with pytest.raises(TypeError, match="`grad_clip` is '1', but must be a number"):
        ScratchTrainingConfig(grad_clip="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`precision` is 'fp8', but must be one of \['fp32'"):
        ScratchTrainingConfig(precision="fp8")
    with pytest.raises(ValueError, match="`average` is 1.0, but must be <= 0.9"):
        ScratchTrainingConfig(average=1.0)
    with pytest.raises(ValueError, match="`average` is -0.1"):
        ScratchTrainingConfig(average=-0.1)


def test_lazy_top_level_names_do_not_import_torch_eagerly() -> None:
    code = (
        "import sys, optuna_hpcnas; assert 'torch' not in sys.modules; "
        "net = optuna_hpcnas.SuperNet; assert 'torch' in sys.modules; print(net.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "SuperNet"


def test_sequence_preset_trains_from_scratch() -> None:
    space = HierarchicalSearchSpace.preset(
        "sequence", widths=(8, 16), data_parallel=(1,), pipeline_stages=(1,)
    )
    task = make_sequence_task(num_samples=120, length=8, features=4, num_classes=3)
    arch = space.sample(np.random.default_rng(3))
    result = train_from_scratch(space, arch, task, steps=10, latency_repeats=1)
    assert 0.0 <= result["valid_accuracy"] <= 1.0 and math.isfinite(result["valid_loss"])
    assert result["flops"] > 0
