"""The standardisation a task records (``TaskData.preprocessing``), moved into the model.

A task standardises its samples, ``(x - mean) / std``, before the model sees them, and
records ``mean`` and ``std``. An exported model that starts with the same step takes the data
as it comes (digits pixels 0-16, a signal as recorded), so a client of the server never needs
to know the statistics. ``standardisation`` reads them into arrays that broadcast over one
sample; ``with_standardisation`` prepends them to a torch module.
"""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def _stats(preprocessing: Mapping[str, Any], key: str) -> np.ndarray:
    value = preprocessing[key]
    try:
        array = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"preprocessing `{key}` is {value!r}, not numbers.") from None
    if array.size == 0 or not np.isfinite(array).all():
        raise ValueError(f"preprocessing `{key}` is {value!r}, not finite numbers.")
    return array


def _shaped(values: np.ndarray, shape: tuple[int, ...], per: object, key: str) -> np.ndarray:
    """``values`` shaped to broadcast over one sample of ``shape``."""
    if values.size == 1:
        return values.reshape(())
    if values.size == math.prod(shape):
        return values.reshape(shape)
    channel_first = (values.size, *([1] * (len(shape) - 1)))
    if per == "channel" and values.size == shape[0]:
        return values.reshape(channel_first)
    if values.size == shape[-1]:  # per feature of a (length, features) sequence
        return values
    if values.size == shape[0]:
        return values.reshape(channel_first)
    raise ValueError(
        f"preprocessing `{key}` has {values.size} values, which fit neither one per channel "
        f"nor one per feature of inputs of shape {list(shape)}."
    )


def standardisation(
    preprocessing: Mapping[str, Any] | None, input_shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mean, std)`` as float32 arrays broadcasting over one sample, or ``None`` when the
    task records no standardisation (or the identity).

    Examples:
        >>> mean, std = standardisation({"mean": 4.9, "std": 6.0}, (1, 8, 8))
        >>> mean.shape, float(std)
        ((), 6.0)
    """
    if not preprocessing or ("mean" not in preprocessing and "std" not in preprocessing):
        return None
    if "mean" not in preprocessing or "std" not in preprocessing:
        raise ValueError(f"preprocessing {dict(preprocessing)!r} has one of mean and std only.")
    per = preprocessing.get("per")
    mean = _shaped(_stats(preprocessing, "mean"), input_shape, per, "mean")
    std = _shaped(_stats(preprocessing, "std"), input_shape, per, "std")
    if (std <= 0).any():
        raise ValueError(f"preprocessing `std` is {preprocessing['std']!r}; it must be > 0.")
    if not mean.any() and (std == 1).all():
        return None
    return mean.astype(np.float32), std.astype(np.float32)


def with_standardisation(model: torch.nn.Module, mean: np.ndarray, std: np.ndarray) -> Any:
    """``model`` preceded by ``(x - mean) / std``: a module that takes raw inputs."""
    import torch

    class Standardised(torch.nn.Module):
        mean: torch.Tensor
        std: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.from_numpy(np.array(mean, dtype=np.float32)))
            self.register_buffer("std", torch.from_numpy(np.array(std, dtype=np.float32)))
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model((x - self.mean) / self.std)

    return Standardised().eval()


def raw_inputs(inputs: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Standardised ``inputs`` (batch first) back to raw data: ``x * std + mean``."""
    return (inputs * std + mean).astype(np.float32)


def describe_input(
    preprocessing: Mapping[str, Any] | None,
    input_shape: tuple[int, ...],
    *,
    in_model: bool,
) -> dict[str, Any]:
    """What the exported model takes (``report.json``'s and ``architecture.json``'s
    ``input``): tensor name, datatype and shape, and whether to send raw data."""
    from optuna_hpcnas.evaluation._onnx import INPUT_NAME

    try:
        stats = standardisation(preprocessing, input_shape)
    except ValueError:
        if in_model:
            raise
        stats = None  # not applied, so not needed: the files take the model's own inputs
    info: dict[str, Any] = {
        "name": INPUT_NAME,
        "datatype": "FP32",
        "shape": [-1, *input_shape],
        "standardised_in_model": bool(in_model and stats is not None),
    }
    raw = str((preprocessing or {}).get("scale", "the data as recorded"))
    if stats is None:
        info["expects"] = "the data set's samples as they are (no standardisation recorded)"
    elif in_model:
        info["expects"] = f"raw data ({raw}); the model standardises it"
    else:
        info["expects"] = "standardised data: (x - mean) / std, computed before sending"
    if stats is not None:
        info["mean"] = np.asarray(preprocessing["mean"]).tolist()  # type: ignore[index]
        info["std"] = np.asarray(preprocessing["std"]).tolist()  # type: ignore[index]
    return info


def model_for_export(
    model: torch.nn.Module,
    preprocessing: Mapping[str, Any] | None,
    input_shape: tuple[int, ...],
    *,
    standardise: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """The module to export (``model``, preceded by the task's standardisation unless
    ``standardise`` is false) and the description of its input (``describe_input``)."""
    info = describe_input(preprocessing, input_shape, in_model=standardise)
    stats = standardisation(preprocessing, input_shape) if standardise else None
    if stats is not None:
        return with_standardisation(model, *stats), info
    return model, info
