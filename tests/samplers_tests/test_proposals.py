"""Claiming proposals (``samplers/_proposals.py``): interleaved claims never hold one key, seen
candidates are never claimed while free ones are offered, and trials that start before the
study records its space still claim a whole architecture (issue 16)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
import pytest

from optuna_hpcnas import _keys
from optuna_hpcnas import HierarchicalSearchSpace
from optuna_hpcnas.samplers import _proposals
from optuna_hpcnas.samplers import EvolutionarySampler
from optuna_hpcnas.samplers import QUBOSampler


def _key(params: dict[str, Any]) -> Any:
    return params.get("x")


def _claim(
    study: optuna.Study, trial: optuna.Trial, xs: list[int], **kwargs: Any
) -> tuple[dict[str, Any], int]:
    frozen = study._storage.get_trial(trial._trial_id)
    pending = [t._trial_id for t in study.get_trials(deepcopy=False) if not t.state.is_finished()]
    return _proposals.claim(
        study._storage,
        study._study_id,
        frozen,
        ({"x": x} for x in xs),
        _key,
        pending,
        **kwargs,
    )


def test_a_key_held_by_an_earlier_or_a_later_trial_is_passed_over() -> None:
    study = optuna.create_study()
    early, late = study.ask(), study.ask()
    assert _claim(study, late, [1, 2]) == ({"x": 1}, 0)
    # The earlier trial checks the later one (created after its first read) and moves on.
    assert _claim(study, early, [1, 2]) == ({"x": 2}, 1)
    proposals = [t.system_attrs[_keys.SAMPLER_PROPOSAL] for t in study.get_trials()]
    assert proposals == [{"x": 2}, {"x": 1}]
    # A third trial learns both keys from its check and skips them without another write.
    assert _claim(study, study.ask(), [1, 2, 3]) == ({"x": 3}, 2)


def test_seen_candidates_are_skipped_without_a_write() -> None:
    study = optuna.create_study()
    trial = study.ask()
    writes: list[Any] = []
    storage = study._storage
    set_attr = storage.set_trial_system_attr

    def spy(trial_id: int, key: str, value: Any) -> None:
        writes.append(value)
        set_attr(trial_id, key, value)

    storage.set_trial_system_attr = spy  # type: ignore[method-assign]
    params, skipped = _claim(study, trial, [1, 2, 3], seen=lambda key: key in (1, 2))
    assert (params, skipped) == ({"x": 3}, 2)
    assert writes == [{"x": 3}]


def test_a_claim_with_no_free_candidate_keeps_the_first() -> None:
    study = optuna.create_study()
    other, trial = study.ask(), study.ask()
    _claim(study, other, [5])
    assert _claim(study, trial, [7, 5], seen=lambda key: key == 7) == ({"x": 7}, 2)
    assert study._storage.get_trial(trial._trial_id).system_attrs[_keys.SAMPLER_PROPOSAL] == {
        "x": 7
    }
    with pytest.raises(ValueError, match="at least one candidate"):
        _claim(study, study.ask(), [])


class _FirstChoice(optuna.samplers.BaseSampler):
    """An independent sampler that draws the same value for every trial: what unclaimed
    draws of workers that start together amount to at worst."""

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: Any, trial: Any, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        assert isinstance(param_distribution, CategoricalDistribution)
        return param_distribution.choices[0]


@pytest.mark.parametrize("make", [EvolutionarySampler, QUBOSampler])
def test_trials_started_before_the_space_was_recorded_claim_whole_architectures(
    make: type,
) -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    study = optuna.create_study(sampler=make(seed=0, independent_sampler=_FirstChoice()))
    # Both trials start before any `space.suggest` recorded the space: nothing is relative.
    trials = [study.ask() for _ in range(4)]
    assert all(t.relative_params == {} for t in trials)
    archs = [space.suggest(t) for t in trials]
    assert len({a.to_json() for a in archs}) == len(archs)
    for t, arch in zip(trials, archs):
        proposal = study._storage.get_trial(t._trial_id).system_attrs[_keys.SAMPLER_PROPOSAL]
        assert space.from_params(proposal) == arch
    # Parameters outside the space still come from the independent sampler.
    assert study.ask().suggest_categorical("extra", ["a", "b"]) == "a"


def test_late_proposals_survive_pickling_empty() -> None:
    import pickle

    late = _proposals.LateProposals()
    late.record(1, {"x": 1})
    copy = pickle.loads(pickle.dumps(late))
    dist = CategoricalDistribution([1, 2])
    frozen = optuna.create_study().ask()._cached_frozen_trial
    assert late.value(frozen, "x", dist, lambda: None) == (False, None)
    frozen._trial_id = 1
    assert late.value(frozen, "x", dist, lambda: None) == (True, 1)
    assert copy.value(frozen, "x", dist, lambda: None) == (False, None)
    assert late.value(frozen, "x", CategoricalDistribution([3]), lambda: None) == (False, None)


@pytest.mark.parametrize("make", [EvolutionarySampler, QUBOSampler])
def test_a_small_space_is_covered_without_a_repeat(make: type) -> None:
    # Random draws hit seen architectures often here, so a draw must be checked against every
    # trial read (finished ones too), not only against the trials still running.
    space = HierarchicalSearchSpace(
        num_cells=2, operators=("conv3x3", "identity", "maxpool3x3"), topologies=("chain",)
    )
    n = space.cardinality()
    assert n == 9
    study = optuna.create_study(sampler=make(seed=0))
    study.optimize(lambda t: float(len(space.suggest(t).to_json())), n_trials=n)
    assert len({space.from_params(t.params).to_json() for t in study.trials}) == n
