"""Request bodies and responses of the two serving protocols, as pure functions, and the
limits one request may carry (``ServeLimits``).

* KServe v1: ``{"instances": [...]}`` or ``{"inputs": [...]}`` (also ``{"inputs": {"input":
  [...]}}``) -> ``{"predictions": [{"class", "probabilities"}, ...]}``; errors 400 (not
  JSON), 422 (JSON, but not a batch the model takes), 413 (too large).
* Open Inference Protocol (KServe v2): one FP32 tensor ``input`` with ``shape`` and
  row-major ``data`` (flat or nested) -> the ``logits`` tensor; errors 400 with
  ``{"error": ...}`` as the protocol specifies, 413 when too large.

``hpcnas serve`` (``_serve``) calls these; they need numpy only. A number list holding
``true`` or ``false`` is refused: numpy would silently read it as 1 or 0.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import math
import time
from typing import Any

import numpy as np

from optuna_hpcnas.evaluation._onnx import INPUT_NAME
from optuna_hpcnas.evaluation._onnx import OUTPUT_NAME


@dataclass(frozen=True)
class ServeLimits:
    """What one request may carry, and how many instances one model call takes.

    ``max_body_bytes``: larger bodies get 413, from ``Content-Length`` before reading or while
    streaming; ``max_instances``: larger batches get 413; ``max_batch``: requests that arrive
    together are merged up to this many instances per model call, and a larger request runs
    in chunks of it (what bounds the memory of a large batch).
    """

    max_body_bytes: int = 8 * 2**20
    max_instances: int = 1024
    max_batch: int = 64

    def __post_init__(self) -> None:
        for field in ("max_body_bytes", "max_instances", "max_batch"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{field}` is {value!r}, but must be an integer >= 1.")


DEFAULT_LIMITS = ServeLimits()

DATATYPE = "FP32"


class BadRequest(Exception):
    """A request the server refuses: HTTP ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _reject_constant(value: str) -> float:
    raise ValueError(f"{value} is not a number")


def load_json(body: bytes) -> Any:
    """The JSON of ``body``; ``BadRequest(400)`` for anything that is not JSON."""
    try:
        # NaN and Infinity are not JSON; Python's parser would accept them.
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"The body is not valid JSON: {e}.") from None
    except RecursionError:  # "[[[[..." deeper than Python's parser recurses
        raise BadRequest(400, "The body is not valid JSON: nested too deeply.") from None


def _holds_bool(values: list[Any]) -> bool:
    return any(type(v) is bool for v in np.array(values, dtype=object).flat)


def _numbers(values: list[Any], body: bytes, status: int, what: str) -> np.ndarray:
    """``values`` (nested lists) as a numeric array, refusing ragged, non-numeric and boolean
    elements."""
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nesting
        raise BadRequest(status, f"The {what} have inconsistent shapes.") from None
    if array.dtype.kind not in "iuf":  # bool, str, object (ragged or mixed) are refused
        raise BadRequest(status, f"The {what} must hold numbers only.")
    # numpy reads [1.5, true] as [1.5, 1.0]; only a body that spells true/false can hold one.
    if (b"true" in body or b"false" in body) and _holds_bool(values):
        raise BadRequest(status, f"The {what} must hold numbers only, not true or false.")
    return array


def _float32(array: np.ndarray, status: int, what: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        batch = array.astype(np.float32)
    if not np.isfinite(batch).all():  # finite doubles may still overflow float32
        raise BadRequest(status, f"The {what} must be finite float32 numbers.")
    return batch


def parse_v1(body: bytes, input_shape: tuple[int, ...], max_instances: int) -> np.ndarray:
    """The batch of a KServe v1 ``:predict`` body, float32 ``(n, *input_shape)``.

    ``instances`` (or ``inputs``, as the protocol allows) is a list of instances, each nested
    lists of ``input_shape`` or a flat list of its ``prod(input_shape)`` numbers.
    """
    data = load_json(body)
    keys = [k for k in ("instances", "inputs") if isinstance(data, dict) and k in data]
    if len(keys) != 1:
        raise BadRequest(
            422, 'The body must be a JSON object with "instances" or "inputs" (one of them).'
        )
    key = keys[0]
    values = data[key]
    if key == "inputs" and isinstance(values, dict):  # named ("columnar") form
        if set(values) != {INPUT_NAME}:
            raise BadRequest(
                422, f'"inputs" names {sorted(values)}; the model has one input, {INPUT_NAME!r}.'
            )
        values = values[INPUT_NAME]
    if not isinstance(values, list) or not values:
        raise BadRequest(422, f'"{key}" must be a non-empty list.')
    if len(values) > max_instances:
        raise BadRequest(
            413, f'"{key}" has {len(values)} items, more than the {max_instances} allowed.'
        )
    batch = _numbers(values, body, 422, "instances")
    size = math.prod(input_shape)
    if batch.shape[1:] == (size,):
        batch = batch.reshape(len(batch), *input_shape)
    if batch.shape[1:] != tuple(input_shape):
        raise BadRequest(
            422,
            f"Each instance has shape {list(batch.shape[1:])}, but the model takes "
            f"{list(input_shape)} (or a flat list of {size} numbers).",
        )
    return _float32(batch, 422, "instances")


def v1_response(logits: np.ndarray) -> dict[str, Any]:
    """``{"predictions": [{"class": argmax, "probabilities": softmax}, ...]}``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    return {
        "predictions": [
            {"class": int(p.argmax()), "probabilities": [round(float(v), 6) for v in p]}
            for p in probs
        ]
    }


def _v2_tensor(data: Any) -> dict[str, Any]:
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest(
            400, f'The body must be a JSON object whose "inputs" is one tensor, {INPUT_NAME!r}.'
        )
    tensor: dict[str, Any] = inputs[0]
    if tensor.get("name") != INPUT_NAME:
        raise BadRequest(
            400, f"Unknown input {tensor.get('name')!r}; the model's input is {INPUT_NAME!r}."
        )
    if tensor.get("datatype") != DATATYPE:
        raise BadRequest(
            400, f"Input datatype is {tensor.get('datatype')!r}; the model takes {DATATYPE!r}."
        )
    parameters = tensor.get("parameters")
    if isinstance(parameters, dict) and "binary_data_size" in parameters:
        raise BadRequest(
            400, "Binary tensor data is not supported: send the data as JSON (binary_data=False)."
        )
    return tensor


def _v2_shape(tensor: dict[str, Any], input_shape: tuple[int, ...]) -> list[int]:
    shape = tensor.get("shape")
    expected = [-1, *input_shape]
    if (
        not isinstance(shape, list)
        or len(shape) != len(expected)
        or any(isinstance(s, bool) or not isinstance(s, int) for s in shape)
        or shape[1:] != expected[1:]
        or shape[0] < 1
    ):
        raise BadRequest(400, f"Input shape is {shape!r}; the model takes {expected}.")
    return shape


def parse_v2(
    body: bytes, input_shape: tuple[int, ...], max_instances: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """The batch of an Open Inference Protocol ``infer`` body and the response's echo
    (``id``, when the request has one)."""
    data = load_json(body)
    tensor = _v2_tensor(data)
    shape = _v2_shape(tensor, input_shape)
    if shape[0] > max_instances:
        raise BadRequest(
            413, f"The batch has {shape[0]} instances, more than the {max_instances} allowed."
        )
    requested = data.get("outputs")
    if requested is not None and (
        not isinstance(requested, list)
        or any(not isinstance(o, dict) or o.get("name") != OUTPUT_NAME for o in requested)
    ):
        raise BadRequest(400, f"Unknown output requested; the model's output is {OUTPUT_NAME!r}.")
    echo: dict[str, Any] = {}
    if "id" in data:
        if not isinstance(data["id"], str):
            raise BadRequest(400, f'"id" is {data["id"]!r}, but must be a string.')
        echo["id"] = data["id"]
    values = tensor.get("data")
    if not isinstance(values, list) or not values:
        raise BadRequest(400, 'The input\'s "data" must be a non-empty list of numbers.')
    array = _numbers(values, body, 400, "data")
    if array.size != math.prod(shape):
        raise BadRequest(
            400, f"The data has {array.size} numbers, but shape {shape} needs {math.prod(shape)}."
        )
    return _float32(array.reshape(shape), 400, "data"), echo


def v2_response(
    logits: np.ndarray, *, model_name: str, version: str, echo: dict[str, Any]
) -> dict[str, Any]:
    """The ``logits`` output tensor as an inference response."""
    return {
        "model_name": model_name,
        "model_version": version,
        **echo,
        "outputs": [
            {
                "name": OUTPUT_NAME,
                "shape": list(logits.shape),
                "datatype": DATATYPE,
                "data": logits.astype(np.float32).ravel().tolist(),
            }
        ],
    }


def parse_seconds(
    input_shape: tuple[int, ...],
    max_body_bytes: int,
    *,
    repeats: int = 3,
    sample_bytes: int = 2**20,
) -> float:
    """Seconds to parse a v1 body of ``max_body_bytes`` (numbers of 8 digits): how long a
    worker holds the interpreter lock on one request at most.

    The median of ``repeats`` parses of a body of at most ``sample_bytes``, scaled to
    ``max_body_bytes`` (parsing time grows linearly with the body: 0.046 s for 1 MiB and
    0.41 s for 8 MiB here).
    """
    per_instance = math.prod(input_shape) * len("0.1234567, ")
    count = max(1, min(max_body_bytes, sample_bytes) // per_instance)
    rng = np.random.default_rng(0)
    instances = np.round(rng.random((count, math.prod(input_shape))), 7).tolist()
    body = json.dumps({"instances": instances}).encode()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        parse_v1(body, input_shape, count)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * max(1.0, max_body_bytes / len(body))
