from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import optuna
import pytest

from optuna_hpcnas import Architecture
from optuna_hpcnas import CellConfig
from optuna_hpcnas import ClusterConfig
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas import Level
from optuna_hpcnas import OperatorRegistry
from optuna_hpcnas import OperatorSpec

PRESETS = ("digits-small", "cifar-like", "sequence")


def small_space(**overrides: object) -> HierarchicalSearchSpace:
    """Kernel, width, heads and a rank limit, yet small enough to enumerate."""
    kwargs: dict = dict(
        num_cells=2,
        operators=("conv", "transformer", "identity"),
        widths=(8, 16),
        kernel_sizes=(3, 5),
        num_heads=(2, 4),
        expansion_ratios=(2,),
        data_parallel=(1, 2),
        pipeline_stages=(1, 2),
        micro_batch_sizes=(8,),
        max_ranks=2,
    )
    kwargs.update(overrides)
    return HierarchicalSearchSpace(**kwargs)


def test_import_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, optuna_hpcnas, optuna_hpcnas.search_space;"
        "heavy = [m for m in ('torch', 'deepspeed', 'mpi4py', 'dimod', 'pyarrow')"
        " if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("name", PRESETS)
def test_presets_build(name: str) -> None:
    space = HierarchicalSearchSpace.preset(name)
    assert space.cardinality() > 0


def test_preset_sizes() -> None:
    assert HierarchicalSearchSpace.preset("digits-small").cardinality() <= 5_000
    assert HierarchicalSearchSpace.preset("cifar-like").cardinality() >= 10**6
    seq = HierarchicalSearchSpace.preset("sequence")
    assert {spec.name for spec in seq.operators} >= {"transformer", "attention", "conv1d"}


def test_cardinality_matches_enumeration() -> None:
    for space in (HierarchicalSearchSpace.preset("digits-small"), small_space()):
        archs = list(space.enumerate())
        assert len(archs) == space.cardinality()
        assert len(set(archs)) == len(archs)
        assert all(space.is_feasible(a) and space.contains(a) for a in archs)


def test_small_space_count_by_hand() -> None:
    # per cell: conv 2 kernels x 2 widths + transformer 2 heads x 1 expansion + identity = 7
    # layouts: (dp, pp) in {(1,1), (1,2), (2,1)} fit 2 ranks; (2,2) does not.
    assert small_space().cardinality() == 3 * 7**2 * 3


def test_enumerate_refuses_large_spaces() -> None:
    with pytest.raises(ValueError, match="max_size"):
        next(HierarchicalSearchSpace.preset("cifar-like").enumerate())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), preset=st.sampled_from(PRESETS))
def test_round_trips(seed: int, preset: str) -> None:
    space = HierarchicalSearchSpace.preset(preset)
    arch = space.sample(np.random.default_rng(seed))
    assert Architecture.from_json(arch.to_json()) == arch
    assert hash(Architecture.from_json(arch.to_json())) == hash(arch)
    assert space.from_params(space.to_params(arch)) == arch
    bits = space.encode(arch)
    assert bits.shape == (space.encoding.n_bits,)
    assert space.encoding.is_feasible(bits)
    assert space.decode(bits) == arch
    assert HierarchicalSearchSpace.from_json(space.to_json()) == space


def test_suggest_uses_hierarchical_names_and_conditions() -> None:
    space = small_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        arch = space.suggest(trial)
        study.tell(trial, 0.0)
        for i, cell in enumerate(arch.cells):
            assert trial.params[f"node.cell{i}.op"] == cell.op
            assert (f"node.cell{i}.kernel" in trial.params) == (cell.op == "conv")
            assert (f"node.cell{i}.heads" in trial.params) == (cell.op == "transformer")
        assert space.from_params(trial.params) == arch
        # the rank constraint is recorded for constrained samplers
        excess = arch.cluster.data_parallel * arch.cluster.pipeline_stages - 2
        assert trial.constraints["hpcnas.cluster_ranks"] == excess
    assert HierarchicalSearchSpace.from_study(study) == space


def test_constants_are_not_suggested() -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    trial = optuna.create_study().ask()
    arch = space.suggest(trial)
    assert not any(name.startswith("cluster.") for name in trial.params)
    assert arch.cluster == ClusterConfig(1, 1, 64)


def test_a_study_keeps_one_space() -> None:
    study = optuna.create_study()
    small_space().suggest(study.ask())
    with pytest.raises(ValueError, match="different HierarchicalSearchSpace"):
        HierarchicalSearchSpace.preset("digits-small").suggest(study.ask())


SAMPLERS = {
    "random": lambda: optuna.samplers.RandomSampler(seed=0),
    "tpe": lambda: optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=5),
    "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=6),
    "gp": lambda: optuna.samplers.GPSampler(seed=0, n_startup_trials=5),
}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_builtin_samplers_run_on_presets(preset: str, sampler: str) -> None:
    space = HierarchicalSearchSpace.preset(preset)

    def objective(trial: optuna.Trial) -> float:
        arch = space.suggest(trial)
        return float(sum((c.width or 1) * (c.kernel or 1) for c in arch.cells))

    study = optuna.create_study(sampler=SAMPLERS[sampler]())
    study.optimize(objective, n_trials=20)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 20
    assert all(space.contains(space.from_params(t.params)) for t in complete)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    level=st.sampled_from([None, *Level]),
    preset=st.sampled_from(["cifar-like", "sequence"]),
)
def test_mutate_changes_exactly_one_decision(seed: int, level: Level | None, preset: str) -> None:
    space = HierarchicalSearchSpace.preset(preset, max_ranks=4)
    rng = np.random.default_rng(seed)
    parent = space.sample(rng)
    params = space.to_params(parent)
    if level is not None and not any(space.decision(k).level == level for k in params):
        # e.g. every cell an identity or a pool: no micro parameter applies
        with pytest.raises(ValueError, match=f"at level '{level.value}'"):
            space.mutate(parent, rng, level=level)
        return
    child = space.mutate(parent, rng, level=level)
    assert space.contains(child) and space.is_feasible(child)
    before, after = space.to_params(parent), space.to_params(child)
    changed = [k for k in before.keys() & after.keys() if before[k] != after[k]]
    assert len(changed) == 1
    if level is not None:
        assert space.decision(changed[0]).level == level
    # keys appear or disappear only below a changed operator
    for key in before.keys() ^ after.keys():
        assert key.rsplit(".", 1)[0] + ".op" == changed[0]


def test_mutate_without_candidates_at_level() -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = next(space.enumerate())
    with pytest.raises(ValueError, match="'cluster'"):
        space.mutate(arch, np.random.default_rng(0), level="cluster")


def test_user_operator_registry() -> None:
    registry = OperatorRegistry.default()
    registry.register(
        OperatorSpec(
            "mbconv",
            "mbconv",
            {"image"},
            kernel_choices=(3, 5),
            has_width=True,
            has_expansion=True,
        )
    )
    space = HierarchicalSearchSpace(
        num_cells=2, operators=("mbconv", "identity"), kernel_sizes=(3, 5), registry=registry
    )
    assert space.cardinality() == 3 * (2 + 1) ** 2
    rebuilt = HierarchicalSearchSpace.from_json(space.to_json())  # metadata travels in JSON
    assert rebuilt == space
    with pytest.raises(ValueError, match="already registered"):
        registry.register(OperatorSpec("mbconv", "mbconv", {"image"}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operators": ()}, "`operators` is empty"),
        ({"operators": ("conv3x3", "warpdrive")}, "Unknown operator 'warpdrive'"),
        ({"widths": ()}, "`widths` is empty"),
        ({"widths": (16, 0)}, "`widths` contains 0"),
        ({"widths": (16, -8)}, "`widths` contains -8"),
        ({"pipeline_stages": (1, 4)}, "`pipeline_stages` contains 4"),
        ({"operators": ("conv3x3", "conv3x3")}, "duplicate"),
        ({"operators": ("conv",), "kernel_sizes": (3, 4)}, "`kernel_sizes` contains 4"),
        ({"operators": ("sepconv",), "kernel_sizes": (1,)}, "'sepconv' cannot take"),
        ({"topologies": ("ring",)}, "`topologies` contains 'ring'"),
        ({"operators": ("conv1d",)}, "'conv1d', which does not support the 'image'"),
        ({"operators": ("attention",), "widths": (30,), "num_heads": (4,)}, "`num_heads`"),
        ({"data_parallel": (4,), "max_ranks": 2}, "max_ranks"),
        ({"num_cells": 0}, "`num_cells` is 0"),
        ({"domain": "audio"}, "`domain` is 'audio'"),
    ],
)
def test_bad_definitions(kwargs: dict, message: str) -> None:
    args: dict = {"num_cells": 3, "operators": ("conv3x3", "identity")}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HierarchicalSearchSpace(**args)


def test_wrong_types() -> None:
    with pytest.raises(TypeError, match="num_cells"):
        HierarchicalSearchSpace(num_cells="3", operators=("conv3x3",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="operators"):
        HierarchicalSearchSpace(num_cells=3, operators="conv3x3")


def test_from_params_errors_name_the_problem() -> None:
    space = small_space()
    params = space.to_params(next(space.enumerate()))
    with pytest.raises(ValueError, match="'node.cell9.op' is not part"):
        space.from_params({**params, "node.cell9.op": "conv"})
    with pytest.raises(ValueError, match="'node.topology' is 'ring'"):
        space.from_params({**params, "node.topology": "ring"})
    missing = dict(params)
    del missing["node.cell1.op"]
    with pytest.raises(ValueError, match="'node.cell1.op' is missing"):
        space.from_params(missing)
    identity = {**params, "node.cell0.op": "identity"}
    with pytest.raises(ValueError, match="'node.cell0.kernel' is given, but it does not apply"):
        space.from_params(identity)


def test_contains_rejects_foreign_architectures() -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    arch = next(space.enumerate())
    assert not space.contains(Architecture("ring", arch.cells, arch.cluster))
    bad_cell = (CellConfig("identity", width=16), *arch.cells[1:])
    assert not space.contains(Architecture(arch.topology, bad_cell, arch.cluster))
    assert not space.contains(Architecture(arch.topology, arch.cells[:2], arch.cluster))


def test_decode_rejects_inconsistent_bits() -> None:
    space = small_space()
    bits = space.encode(next(space.enumerate())).copy()
    bits[space.encoding.slice(0)] = 0
    with pytest.raises(ValueError, match="exactly one bit"):
        space.decode(bits)


def test_architecture_json_is_canonical() -> None:
    arch = Architecture("dense", (CellConfig("conv3x3", kernel=3, width=16),), ClusterConfig())
    assert json.loads(arch.to_json())["cells"] == [{"op": "conv3x3", "kernel": 3, "width": 16}]
    with pytest.raises(ValueError, match="Not an architecture"):
        Architecture.from_json('{"cells": []}')


def test_fitting_keeps_only_layouts_the_ranks_can_run() -> None:
    space = HierarchicalSearchSpace.preset("cifar-like")  # dp and pp in (1, 2, 4)
    for ranks, dp, pp in (
        (1, [1], [1]),
        (2, [1, 2], [1]),
        (4, [1, 2, 4], [1]),
        (8, [1, 2, 4], [1, 2]),
    ):
        fitted = space.fitting(ranks)
        d = fitted.to_dict()
        assert (d["data_parallel"], d["pipeline_stages"]) == (dp, pp)
        assert all(
            a.cluster.ranks <= ranks
            for a in (fitted.sample(np.random.default_rng(i)) for i in range(50))
        )
    one = space.fitting(1)  # the layout is constant: not suggested at all
    suggested = {d.name for d in one.decisions if not d.is_constant}
    assert not suggested & {"cluster.data_parallel", "cluster.pipeline_stages"}
    assert space.fitting(16) is space
    with pytest.raises(ValueError, match="ranks"):
        space.fitting(0)
