"""Argument checks shared by the configuration dataclasses, with Optuna-style messages that
quote the value: ``TypeError`` for a wrong type, ``ValueError`` for a wrong value."""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

# The largest seed anything here accepts: numpy's legacy RandomState (Optuna's samplers) takes
# seeds below 2**32, and a group leader adds its group index to the sampler's seed.
MAX_SEED = 2**31 - 1


def check_int(
    name: str,
    value: Any,
    minimum: int,
    *,
    maximum: int | None = None,
    allow_none: bool = False,
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, but got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{name}` is {value}, but must be >= {minimum}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"`{name}` is {value}, but must be <= {maximum}.")


def check_seed(name: str, value: Any, *, allow_none: bool = False) -> None:
    check_int(name, value, 0, maximum=MAX_SEED, allow_none=allow_none)


def check_number(
    name: str, value: Any, *, positive: bool = True, allow_none: bool = False
) -> None:
    """A finite int or float (``> 0`` when ``positive``): NaN and infinity are refused, as
    they pass every comparison-based check and fail much later."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, but got {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` is {value}, but must be a finite number.")
    if positive and value <= 0:
        raise ValueError(f"`{name}` is {value}, but must be > 0.")


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}` is {value!r}, but must be one of {list(allowed)}.")
