from __future__ import annotations

import numpy as np
import optuna
import pytest

from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.search_space import target_names
from optuna_hpcnas.search_space import target_profile


def test_builtin_targets() -> None:
    assert {"onnx-cpu", "tensorrt", "npu-no-grouped"} <= set(target_names())
    assert target_profile("onnx-cpu").grouped_conv
    assert not target_profile("npu-no-grouped").grouped_conv


def test_npu_target_removes_grouped_convolutions() -> None:
    space = HierarchicalSearchSpace.preset("cifar-like", target="npu-no-grouped")
    names = [spec.name for spec in space.operators]
    assert "sepconv3x3" not in names and "sepconv5x5" not in names
    assert "dilconv3x3" not in names and "avgpool3x3" not in names
    assert {"conv3x3", "conv5x5", "maxpool3x3", "identity", "attention"} <= set(names)
    # Nothing the search proposes may use them, whichever sampler runs it.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        arch = space.suggest(study.ask())
        assert all(cell.op in names for cell in arch.cells)
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert all(c.op in names for c in space.sample(rng).cells)


def test_target_shrinks_the_space() -> None:
    full = HierarchicalSearchSpace.preset("digits-small")
    cpu = HierarchicalSearchSpace.preset("digits-small", target="onnx-cpu")
    npu = HierarchicalSearchSpace.preset("digits-small", target="npu-no-grouped")
    assert cpu.operators == full.operators
    assert npu.cardinality() < full.cardinality()
    # conv3x3 (2 widths) + maxpool + identity: 4 cell configs; 3 cells, 3 topologies.
    assert npu.cardinality() == 3 * 4**3
    assert all(npu.contains(a) for a in npu.enumerate())
    assert sum(full.contains(a) for a in npu.enumerate()) == npu.cardinality()


def test_target_round_trips() -> None:
    space = HierarchicalSearchSpace.preset("cifar-like", target="npu-no-grouped")
    assert space.target == "npu-no-grouped"
    again = HierarchicalSearchSpace.from_json(space.to_json())
    assert again == space and again.target == "npu-no-grouped"
    assert HierarchicalSearchSpace.from_dict(space.to_dict()).operators == space.operators
    assert space.to_dict()["target"] == "npu-no-grouped"
    # A space without a target serialises as before targets existed (studies compare JSON).
    assert "target" not in HierarchicalSearchSpace.preset("cifar-like").to_dict()
    assert space != HierarchicalSearchSpace.preset("cifar-like")


def test_unknown_target() -> None:
    with pytest.raises(ValueError, match="Unknown deployment target 'fpga'.*onnx-cpu"):
        HierarchicalSearchSpace.preset("digits-small", target="fpga")
    with pytest.raises(TypeError, match="`target` is 3, but must be a string"):
        HierarchicalSearchSpace.preset("digits-small", target=3)


def test_target_that_leaves_no_operator() -> None:
    with pytest.raises(ValueError, match="'npu-no-grouped' cannot run any of `operators`"):
        HierarchicalSearchSpace(
            num_cells=2, operators=("sepconv3x3", "dilconv3x3"), target="npu-no-grouped"
        )
