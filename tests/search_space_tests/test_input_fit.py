"""``fit_to_input``: the choices a sample shape rules out are left out, each said once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from optuna_hpcnas.search_space import fit_to_input
from optuna_hpcnas.search_space import HierarchicalSearchSpace
from optuna_hpcnas.search_space import MAX_POSITIONS
from optuna_hpcnas.search_space import pooling_factor
from optuna_hpcnas.search_space import stem_positions


def test_mnist1d_keeps_every_choice() -> None:
    space = HierarchicalSearchSpace.preset("signal-1d")
    fit = fit_to_input(space, (40, 1))
    assert fit.space is space and fit.notes == ()


def test_a_multichannel_signal_loses_the_flatten_stem_only() -> None:
    fit = fit_to_input(HierarchicalSearchSpace.preset("signal-1d"), (100, 6))
    assert fit.space.stems == ("none", "embed")
    assert fit.space.heads == ("mean", "flatten")
    assert len(fit.notes) == 1 and "600 features" in fit.notes[0]


def test_a_long_signal_is_pooled_and_loses_both_flatten_choices() -> None:
    fit = fit_to_input(HierarchicalSearchSpace.preset("signal-1d"), (1460, 1))
    assert "flatten" not in fit.space.stems and fit.space.heads == ("mean",)
    assert pooling_factor(1460) == 3 and stem_positions(1460) == 487
    assert any("windows of 3" in note for note in fit.notes)


def test_a_space_of_flatten_choices_only_gets_the_plain_ones() -> None:
    space = HierarchicalSearchSpace.preset("signal-1d", stems=("flatten",), heads=("flatten",))
    fit = fit_to_input(space, (2000, 16))
    assert fit.space.stems == ("none",) and fit.space.heads == ("mean",)


def test_images_are_left_alone() -> None:
    space = HierarchicalSearchSpace.preset("digits-small")
    assert fit_to_input(space, (3, 64, 64)).space is space


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 5000), features=st.integers(1, 16))
def test_every_fitted_space_builds_a_supernet(length: int, features: int) -> None:
    """The property behind the fitting: whatever the shape, the supernet can be built and
    no subnet runs over more than ``MAX_POSITIONS`` positions."""
    from optuna_hpcnas.supernet import SuperNet

    fit = fit_to_input(HierarchicalSearchSpace.preset("signal-1d"), (length, features))
    net = SuperNet(fit.space, input_shape=(length, features), num_classes=3)
    assert stem_positions(length) <= MAX_POSITIONS
    if length * features <= 100:
        assert "flatten" in fit.space.stems
    assert sum(p.numel() for p in net.parameters()) < 5_000_000


def test_the_supernet_still_refuses_an_unfitted_flatten_stem() -> None:
    from optuna_hpcnas.supernet import SuperNet

    with pytest.raises(ValueError, match="flatten stem"):
        SuperNet(HierarchicalSearchSpace.preset("signal-1d"), input_shape=(100, 6), num_classes=2)
