"""``hpcnas serve``: a deployed model over HTTP with the KServe v1 protocol.

Routes (``<name>`` is ``model`` unless ``--name`` says otherwise):

* ``GET /v1/models/<name>`` — readiness: ``{"name": ..., "ready": true}``;
* ``POST /v1/models/<name>:predict`` — ``{"instances": [...]}`` -> ``{"predictions": [...]}``,
  one ``{"class": argmax, "probabilities": softmax}`` per instance.

A Starlette app run by uvicorn (the container's entry point). Needs numpy, onnxruntime,
starlette and uvicorn; never torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse

_logger = logging.getLogger(__name__)

_MODELS = {"int8": "model.int8.onnx", "fp32": "model.onnx"}


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise _BadRequest(400, f"Content-Length is {declared!r}, not an integer.") from None
        if size > limit:
            raise _BadRequest(413, f"The body has {size} bytes, more than the {limit} allowed.")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():  # chunked bodies declare no length: count them
        total += len(chunk)
        if total > limit:
            raise _BadRequest(413, f"The body has more than the {limit} bytes allowed.")
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(value: str) -> float:
    raise ValueError(f"{value} is not a number")


def parse_instances(body: bytes, input_shape: tuple[int, ...], max_instances: int) -> np.ndarray:
    """The ``instances`` of a KServe v1 request body as a float32 batch.

    An instance is either nested lists of ``input_shape`` or a flat list of its
    ``prod(input_shape)`` numbers. Raises ``_BadRequest`` (status 400/422) naming the problem.
    """
    try:
        # NaN and Infinity are not JSON; Python's parser would accept them.
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise _BadRequest(400, f"The body is not valid JSON: {e}.") from None
    except RecursionError:  # "[[[[..." deeper than Python's parser recurses
        raise _BadRequest(400, "The body is not valid JSON: nested too deeply.") from None
    if not isinstance(data, dict) or "instances" not in data:
        raise _BadRequest(422, 'The body must be a JSON object with "instances".')
    instances = data["instances"]
    if not isinstance(instances, list) or not instances:
        raise _BadRequest(422, '"instances" must be a non-empty list.')
    if len(instances) > max_instances:
        raise _BadRequest(
            413, f'"instances" has {len(instances)} items, more than the {max_instances} allowed.'
        )
    try:
        batch = np.asarray(instances)
    except ValueError:  # ragged nesting
        raise _BadRequest(422, "The instances have inconsistent shapes.") from None
    if batch.dtype.kind not in "iuf":  # bool, str, object (ragged or mixed) are refused
        raise _BadRequest(422, "The instances must hold numbers only.")
    size = math.prod(input_shape)
    if batch.shape[1:] == (size,):
        batch = batch.reshape(len(batch), *input_shape)
    if batch.shape[1:] != tuple(input_shape):
        raise _BadRequest(
            422,
            f"Each instance has shape {list(batch.shape[1:])}, but the model takes "
            f"{list(input_shape)} (or a flat list of {size} numbers).",
        )
    with np.errstate(over="ignore", invalid="ignore"):
        batch = batch.astype(np.float32)
    if not np.isfinite(batch).all():  # finite doubles may still overflow float32
        raise _BadRequest(422, "The instances must be finite float32 numbers.")
    return batch


def _predictions(logits: np.ndarray) -> list[dict[str, Any]]:
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    return [
        {"class": int(p.argmax()), "probabilities": [round(float(v), 6) for v in p]} for p in probs
    ]


def build_app(
    model_dir: str | Path,
    *,
    name: str = "model",
    model: str = "int8",
    max_body_bytes: int = 8 * 2**20,
    max_instances: int = 1024,
    threads: int = 1,
) -> Starlette:
    """The KServe v1 Starlette app serving ``model_dir`` (a ``deploy_model`` directory).

    Args:
        model_dir: Directory with ``report.json`` and the ONNX files.
        name: Model name in the routes.
        model: ``"int8"`` (``model.int8.onnx``) or ``"fp32"`` (``model.onnx``).
        max_body_bytes: Larger request bodies get 413, checked before reading them whole.
        max_instances: Larger batches get 413.
        threads: onnxruntime intra-op threads.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from optuna_hpcnas.deploy import _onnx
    from optuna_hpcnas.deploy._pipeline import load_report

    if model not in _MODELS:
        raise ValueError(f"`model` is {model!r}, but must be one of {sorted(_MODELS)}.")
    for field, value in (("max_body_bytes", max_body_bytes), ("max_instances", max_instances)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{field}` is {value!r}, but must be an integer >= 1.")
    report = load_report(model_dir)
    shape = tuple(report["input_shape"])
    path = Path(model_dir) / _MODELS[model]
    if not path.is_file():
        raise FileNotFoundError(f"No {path.name} in {str(model_dir)!r}.")
    sess = _onnx.session(path, threads=threads)

    def unknown(requested: str) -> JSONResponse:
        return JSONResponse({"error": f"Unknown model {requested!r}; serving {name!r}."}, 404)

    async def ready(request: Request) -> JSONResponse:
        requested = request.path_params["name"]
        if requested != name:
            return unknown(requested)
        return JSONResponse({"name": name, "ready": True})

    async def predict(request: Request) -> JSONResponse:
        requested = request.path_params["name"]
        if requested != name:
            return unknown(requested)
        try:
            body = await _read_body(request, max_body_bytes)
            batch = parse_instances(body, shape, max_instances)
        except _BadRequest as e:
            return JSONResponse({"error": e.message}, e.status)
        try:
            logits = await run_in_threadpool(_onnx.run, sess, batch)
        except Exception:  # never let one request take the server down
            _logger.exception("Inference failed.")
            return JSONResponse({"error": "Inference failed."}, 500)
        return JSONResponse({"predictions": _predictions(logits)})

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, exc.status_code)

    return Starlette(
        routes=[
            Route("/v1/models/{name}:predict", predict, methods=["POST"]),
            Route("/v1/models/{name}", ready, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )


def serve(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    name: str = "model",
    model: str = "int8",
) -> None:
    """Serve ``model_dir`` with uvicorn until interrupted (127.0.0.1 unless told otherwise)."""
    import uvicorn

    app = build_app(model_dir, name=name, model=model)
    _logger.info(
        "Serving %s (%s) on http://%s:%d/v1/models/%s", model_dir, model, host, port, name
    )
    uvicorn.run(app, host=host, port=port, log_level="info")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``hpcnas serve DIR [--port P] [--host H] [--name N] [--model M]``."""
    parser.add_argument("model_dir", metavar="DIR", help="a directory written by hpcnas deploy")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (8080)")
    parser.add_argument("--name", default="model", help="model name in the routes (model)")
    parser.add_argument(
        "--model", choices=sorted(_MODELS), default="int8", help="which ONNX file (int8)"
    )


def serve_command(args: argparse.Namespace) -> int:
    """Run ``hpcnas serve`` from parsed ``add_serve_arguments`` arguments; the exit code."""
    try:
        serve(args.model_dir, host=args.host, port=args.port, name=args.name, model=args.model)
    except (FileNotFoundError, ValueError) as e:
        _logger.error("%s", e)
        return 2
    return 0
