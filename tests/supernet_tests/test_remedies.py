"""The ranking remedies of supernet training: sandwich rule, in-place distillation,
progressive warm-up and few-shot split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.supernet import FewShotSuperNet
from optuna_hpcnas.supernet import SuperNet
from optuna_hpcnas.supernet import SupernetTrainer
from optuna_hpcnas.supernet import SupernetTrainingConfig
from optuna_hpcnas.supernet import train_step

SPACE = HierarchicalSearchSpace(
    num_cells=2, operators=("conv3x3", "maxpool3x3", "identity"), widths=(4, 8)
)
SHAPE = (1, 6, 6)


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, *SHAPE, generator=g), torch.randint(0, 3, (n,), generator=g)
    )


def _trainer(**options: object) -> SupernetTrainer:
    net = SuperNet(SPACE, input_shape=SHAPE, num_classes=3)
    config = SupernetTrainingConfig(batch_size=16, epochs=2, **options)  # type: ignore[arg-type]
    return SupernetTrainer(net, config)


def _size(net: SuperNet, arch: object) -> int:
    return sum(p.numel() for p in net.subnet(arch).parameters())  # type: ignore[arg-type]


def test_sample_with_fixed_values() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        arch = SPACE.sample(rng, fixed={"node.cell1.op": "maxpool3x3", "node.cell0.width": 8})
        params = SPACE.to_params(arch)
        assert params["node.cell1.op"] == "maxpool3x3"
        if params["node.cell0.op"] == "conv3x3":
            assert params["node.cell0.width"] == 8
    with pytest.raises(ValueError, match="node.cell9.op"):
        SPACE.sample(rng, fixed={"node.cell9.op": "conv3x3"})
    with pytest.raises(ValueError, match="choices"):
        SPACE.sample(rng, fixed={"node.cell0.op": "transformer"})


def test_sandwich_trains_the_largest_and_smallest_path() -> None:
    trainer = _trainer(sandwich=True, paths_per_batch=4)
    largest, smallest = trainer.extremes
    sizes = [_size(trainer.supernet, a) for a in SPACE.enumerate()]
    assert _size(trainer.supernet, largest) == max(sizes)
    assert _size(trainer.supernet, smallest) == min(sizes)
    for _ in range(3):
        paths = trainer.sample_paths()
        assert len(paths) == 4 and paths[:2] == [largest, smallest]


def test_in_place_distillation_learns_the_first_paths_soft_targets() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleDict({"t": nn.Linear(4, 3), "s": nn.Linear(4, 3)})

        def forward(self, x: torch.Tensor, arch: str) -> torch.Tensor:
            return self.heads[arch](x)

    torch.manual_seed(0)
    model = TwoHeads()
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(model, optimizer, x, y, ["t", "s"], distillation=1.0)  # type: ignore[list-item]
    student = model.heads["s"]
    teacher = F.softmax(model.heads["t"](x), dim=1).detach()
    expected = F.kl_div(F.log_softmax(student(x), dim=1), teacher, reduction="batchmean") / 2
    (want,) = torch.autograd.grad(expected, student.weight)
    assert student.weight.grad is not None
    torch.testing.assert_close(student.weight.grad, want)
    # the teacher learns the labels alone
    (want_t,) = torch.autograd.grad(
        F.cross_entropy(model.heads["t"](x), y) / 2, model.heads["t"].weight
    )
    torch.testing.assert_close(model.heads["t"].weight.grad, want_t)


def test_progressive_warm_up_grows_the_space_on_schedule() -> None:
    trainer = _trainer(progressive_epochs=4, paths_per_batch=8)
    largest = trainer.extremes[0]
    assert all(p == largest for p in trainer.sample_paths())
    trainer.epochs_done = 2
    middle = [p == largest for _ in range(10) for p in trainer.sample_paths()]
    assert 0 < sum(middle) < len(middle)
    trainer.epochs_done = 4
    late = [p == largest for _ in range(10) for p in trainer.sample_paths()]
    assert sum(late) < sum(middle)


def test_few_shot_split_gives_each_part_the_ops_of_its_branch() -> None:
    net = SuperNet(SPACE, input_shape=SHAPE, num_classes=3)
    few = FewShotSuperNet.split(net, "node.cell0.op")
    assert len(few.parts) == 3
    for part, op in zip(few.parts, few.choices):
        assert list(part.cells[0]) == [op]
        assert sorted(part.cells[1]) == sorted(SPACE.to_dict()["operators"])
    x = _data(4).tensors[0]
    arch = SPACE.sample(np.random.default_rng(0), fixed={"node.cell0.op": "conv3x3"})
    torch.testing.assert_close(few.eval()(x, arch), net.eval()(x, arch))
    with pytest.raises(ValueError, match="node.cell0.width"):
        FewShotSuperNet.split(net, "node.cell0.width")


def test_few_shot_trainer_splits_on_the_most_disagreeing_decision() -> None:
    trainer = _trainer(few_shot="auto", few_shot_epochs=1, paths_per_batch=2)
    trainer.fit(_data())
    assert isinstance(trainer.supernet, FewShotSuperNet)
    assert set(trainer.disagreement) == {"node.topology", "node.cell0.op", "node.cell1.op"}
    assert trainer.supernet.decision == max(trainer.disagreement, key=trainer.disagreement.get)
    assert all(0.0 <= v <= 2.0 for v in trainer.disagreement.values())
    # a path's step moves only the part that owns it
    before = [p.detach().clone() for p in trainer.supernet.parameters()]
    arch = trainer.sample_paths(1)[0]
    owner = trainer.supernet.part(arch)
    x, y = _data(8).tensors
    train_step(
        trainer.supernet, torch.optim.SGD(trainer.supernet.parameters(), lr=0.1), x, y, [arch]
    )
    owned = {id(p) for p in owner.parameters()}
    for p, old in zip(trainer.supernet.parameters(), before):
        if id(p) not in owned:
            assert torch.equal(p, old)
    # a checkpoint restores the split
    state = trainer.state_dict()
    other = _trainer(few_shot="auto", few_shot_epochs=1, paths_per_batch=2)
    other.load_state_dict(state)
    assert isinstance(other.supernet, FewShotSuperNet)
    torch.testing.assert_close(other.supernet.eval()(x, arch), trainer.supernet.eval()(x, arch))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"distillation": 0.5}, "sandwich"),
        ({"sandwich": True, "paths_per_batch": 1}, ">= 2"),
        ({"sandwich": True, "distillation": 1.5}, "<= 1"),
        ({"few_shot_max_parts": 1}, ">= 2"),
    ],
)
def test_remedy_options_are_checked(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SupernetTrainingConfig(**options)


def test_unknown_few_shot_decision_is_refused() -> None:
    with pytest.raises(ValueError, match="node.cell0.width"):
        _trainer(few_shot="node.cell0.width")
