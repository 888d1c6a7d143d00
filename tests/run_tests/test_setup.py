"""``agreed``: a setup step's error is one line, the same on every rank."""

from __future__ import annotations

import pytest

from optuna_hpcnas.distributed._groups import self_comm
from optuna_hpcnas.run._setup import agreed
from optuna_hpcnas.run._setup import SetupError


def test_a_step_that_works_returns_its_value() -> None:
    assert agreed(self_comm(), "cannot build", lambda: 42) == 42


def test_an_error_becomes_one_line_naming_the_step_and_the_error() -> None:
    def fails() -> None:
        raise ValueError("the flatten stem\n  makes 600 features")

    with pytest.raises(SetupError) as info:
        agreed(self_comm(), "cannot build the search for this data", fails)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "cannot build the search for this data: ValueError: the flatten stem makes 600 features"
    )


class _TwoRanks:
    """A communicator of two ranks whose other rank reports ``other``."""

    def __init__(self, other: str | None) -> None:
        self.other = other

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 2

    def allgather(self, obj: object) -> list[object]:
        return [obj, self.other]


def test_the_error_of_another_rank_is_raised_here_too() -> None:
    with pytest.raises(SetupError, match="rank 1 ran out"):
        agreed(_TwoRanks("warm-up: MemoryError: rank 1 ran out"), "warm-up", lambda: 1)  # type: ignore[arg-type]
    assert agreed(_TwoRanks(None), "warm-up", lambda: 1) == 1  # type: ignore[arg-type]


def test_interrupts_are_not_setup_errors() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        agreed(self_comm(), "warm-up", interrupted)
