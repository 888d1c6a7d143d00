"""Argument checks shared by the configuration dataclasses, with Optuna-style messages that
quote the value: ``TypeError`` for a wrong type, ``ValueError`` for a wrong value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, but got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` is {value}, but must be >= {minimum}.")


def check_number(
    name: str, value: Any, *, positive: bool = True, allow_none: bool = False
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, but got {value!r}.")
    if positive and value <= 0:
        raise ValueError(f"`{name}` is {value}, but must be > 0.")


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}` is {value!r}, but must be one of {list(allowed)}.")
