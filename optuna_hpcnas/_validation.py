"""Argument checks shared by the configuration dataclasses and the samplers, with Optuna-style
messages that quote the value: ``TypeError`` for a wrong type, ``ValueError`` for a wrong
value."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import math
import numbers
from typing import Any

# The largest seed anything here accepts: numpy's legacy RandomState (Optuna's samplers) takes
# seeds below 2**32, and a group leader adds its group index to the sampler's seed.
MAX_SEED = 2**31 - 1


class ConfigError(ValueError):
    """A run configuration that cannot be used (unknown key or value, wrong type)."""


def check_int(
    name: str,
    value: Any,
    minimum: int,
    *,
    maximum: int | None = None,
    allow_none: bool = False,
) -> None:
    """An ``int`` (NumPy's integers too, never a ``bool``) in ``[minimum, maximum]``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` is {value!r}, but must be an int.")
    if int(value) < minimum:
        raise ValueError(f"`{name}` is {value}, but must be >= {minimum}.")
    if maximum is not None and int(value) > maximum:
        raise ValueError(f"`{name}` is {value}, but must be <= {maximum}.")


def check_seed(name: str, value: Any, *, allow_none: bool = False) -> None:
    check_int(name, value, 0, maximum=MAX_SEED, allow_none=allow_none)


def check_heartbeat(interval: Any, grace_period: Any, max_retry: Any) -> None:
    """Heartbeat settings of an RDB storage (``[checkpoints]``, ``open_storage``): seconds
    between heartbeats >= 1, a grace period (``None``: twice the interval) longer than the
    interval, retries per trial >= 0 (``None``: unlimited)."""
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise TypeError(f"`heartbeat_interval` is {interval!r}, but must be an int.")
    if interval < 1:
        raise ValueError(f"`heartbeat_interval` is {interval}, but must be >= 1.")
    for name, value in (("grace_period", grace_period), ("max_retry", max_retry)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` is {value!r}, but must be an int or None.")
        if value < 0:
            raise ValueError(f"`{name}` is {value}, but must be >= 0.")
    if grace_period is not None and grace_period <= interval:
        raise ValueError(
            f"`grace_period` is {grace_period}, but must be greater than "
            f"`heartbeat_interval` ({interval})."
        )


def check_number(
    name: str,
    value: Any,
    *,
    positive: bool = True,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
) -> None:
    """A finite int or float, ``> 0`` when ``positive`` and in ``[minimum, maximum]`` where
    given: NaN and infinity are refused, as they pass every comparison-based check and fail
    much later."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` is {value!r}, but must be a number.")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` is {value}, but must be a finite number.")
    if positive and value <= 0:
        raise ValueError(f"`{name}` is {value}, but must be > 0.")
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` is {value}, but must be >= {minimum}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"`{name}` is {value}, but must be <= {maximum}.")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` is {value!r}, but must be a bool.")


def check_str(
    name: str,
    value: Any,
    *,
    what: str = "a string",
    nonempty: bool = False,
    allow_none: bool = False,
) -> None:
    """A ``str`` (not blank when ``nonempty``); ``what`` says what it names in the message."""
    if value is None and allow_none:
        return
    if not isinstance(value, str) or (nonempty and not value.strip()):
        raise TypeError(f"`{name}` is {value!r}, but must be {what}.")


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}` is {value!r}, but must be one of {list(allowed)}.")


def check_table(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"`{name}` is {value!r}, but must be a table.")
