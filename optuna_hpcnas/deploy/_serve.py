"""``hpcnas serve``: a deployed model over HTTP, KServe v1 and the Open Inference Protocol.

One process, one model, both protocols (``<name>`` is ``model`` unless ``--name`` says
otherwise; ``<v>`` is the optional ``/versions/1``):

* KServe v1 — ``GET /v1/models`` (``{"models": [name]}``), ``GET /v1/models/<name>``
  (readiness), ``POST /v1/models/<name>:predict``;
* Open Inference Protocol (v2) — ``GET /v2`` (server metadata), ``GET /v2/health/live``,
  ``GET /v2/health/ready``, ``GET /v2/models/<name><v>`` (metadata), ``GET
  /v2/models/<name><v>/ready``, ``POST /v2/models/<name><v>/infer``;
* ``GET /metrics`` — Prometheus: requests by route, method and status, latency histograms,
  instances per model call.

How a request flows: the body is read on the event loop (refused with 413 as soon as it is
known to be too large); a large body is parsed on a parse thread, a small one inline; its
batch joins the batcher's queue, which merges the requests waiting together into one model
call of at most ``max_batch`` instances (a larger request runs in chunks of ``max_batch``), on
one inference thread. Health and readiness never wait for the batcher, and memory stays
bounded by the chunk size whatever the request size. A Starlette app run by uvicorn (the
container's entry point). Needs numpy, onnxruntime, starlette, uvicorn and prometheus-client;
never torch.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
import logging
from pathlib import Path
import time
from typing import Any
from typing import TYPE_CHECKING

import numpy as np

from optuna_hpcnas.deploy._protocol import BadRequest
from optuna_hpcnas.deploy._protocol import DATATYPE
from optuna_hpcnas.deploy._protocol import DEFAULT_LIMITS
from optuna_hpcnas.deploy._protocol import parse_v1
from optuna_hpcnas.deploy._protocol import parse_v2
from optuna_hpcnas.deploy._protocol import ServeLimits
from optuna_hpcnas.deploy._protocol import v1_response
from optuna_hpcnas.deploy._protocol import v2_response

if TYPE_CHECKING:
    import onnxruntime
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

_logger = logging.getLogger(__name__)

_MODELS = {"int8": "model.int8.onnx", "fp32": "model.onnx"}
AUTO = "auto"


def measured_choice(report: dict[str, Any]) -> tuple[str, str]:
    """``(model, why)``: the one of FP32 and INT8 with the lower batch-1 p50 latency that
    ``report.json`` measured on the deploying machine; INT8 only when its held-out accuracy is
    within the deployment's margin of FP32's (FP32 when the report lacks the figures)."""
    try:
        fp32, int8 = report["fp32"], report["int8"]
        p50 = {"fp32": float(fp32["latency_p50_ms"]), "int8": float(int8["latency_p50_ms"])}
        accurate = float(int8["accuracy"]) >= float(fp32["accuracy"]) - float(
            report.get("margin") or 0.0
        )
    except (KeyError, TypeError, ValueError):
        return "fp32", "report.json holds no latency of both models"
    figures = f"p50 {p50['fp32']:.3f} ms FP32, {p50['int8']:.3f} ms INT8"
    if not accurate:
        return "fp32", f"INT8 is less accurate than FP32 by more than the margin ({figures})"
    model = "int8" if p50["int8"] < p50["fp32"] else "fp32"
    return model, f"the faster in report.json ({figures})"


VERSION = "1"  # the one version of the one model a server holds
# Bodies up to this size are parsed on the event loop: a thread hop costs more than parsing.
_INLINE_PARSE_BYTES = 64 * 1024


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest(400, f"Content-Length is {declared!r}, not an integer.") from None
        if size > limit:
            raise BadRequest(413, f"The body has {size} bytes, more than the {limit} allowed.")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():  # chunked bodies declare no length: count them
        total += len(chunk)
        if total > limit:
            raise BadRequest(413, f"The body has more than the {limit} bytes allowed.")
        chunks.append(chunk)
    return b"".join(chunks)


class _Metrics:
    """The server's Prometheus series, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        import prometheus_client as pc

        self.registry = pc.CollectorRegistry()
        self.requests = pc.Counter(
            "hpcnas_serve_requests",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = pc.Histogram(
            "hpcnas_serve_request_duration_seconds",
            "Seconds from the request's arrival to the end of its response, by route.",
            ["route"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.model_call = pc.Histogram(
            "hpcnas_serve_model_call_instances",
            "Instances per model call (requests that arrive together are merged).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.exposition: Callable[[], bytes] = lambda: pc.generate_latest(self.registry)
        self.content_type = pc.CONTENT_TYPE_LATEST


class _Instrumented:
    """ASGI middleware: every HTTP request counted and timed under its route's template."""

    def __init__(self, app: Any, *, metrics: _Metrics, routes: dict[Any, str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = self.routes.get(scope.get("endpoint"), "unmatched")
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


class _Batcher:
    """Model calls on one inference thread; batches that wait together become one call.

    Nothing waits for more requests to arrive: the first batch of the queue runs at once
    with the ones already behind it (up to ``max_batch`` instances), and the requests that
    come in while it runs form the next call.
    """

    def __init__(
        self, sess: onnxruntime.InferenceSession, *, max_batch: int, metrics: _Metrics
    ) -> None:
        self._sess = sess
        self._max_batch = max_batch
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcnas-infer")
        self._queue: deque[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def infer(self, batch: np.ndarray) -> np.ndarray:
        """The logits of ``batch``."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve())
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._queue.append((batch, future))
        assert self._wake is not None
        self._wake.set()
        return await future

    def _run(self, x: np.ndarray) -> np.ndarray:
        """Logits of ``x`` in model calls of at most ``max_batch`` instances."""
        from optuna_hpcnas.evaluation import _onnx

        outputs = []
        for start in range(0, len(x), self._max_batch):
            chunk = x[start : start + self._max_batch]
            self._metrics.model_call.observe(len(chunk))
            outputs.append(_onnx.run(self._sess, chunk))
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def _take(self) -> list[tuple[np.ndarray, asyncio.Future[np.ndarray]]]:
        group = [self._queue.popleft()]
        size = len(group[0][0])
        while self._queue and size + len(self._queue[0][0]) <= self._max_batch:
            group.append(self._queue.popleft())
            size += len(group[-1][0])
        return group

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                group = self._take()
                x = group[0][0] if len(group) == 1 else np.concatenate([b for b, _ in group])
                try:
                    logits = await loop.run_in_executor(self._executor, self._run, x)
                except Exception as e:  # one failed call fails its requests, not the server
                    for _, future in group:
                        if not future.done():
                            future.set_exception(e)
                    continue
                start = 0
                for batch, future in group:
                    if not future.done():  # a client that went away cancelled its future
                        future.set_result(logits[start : start + len(batch)])
                    start += len(batch)


class _Server:
    """The handlers of one app: one model, its limits, its batcher and parse thread."""

    def __init__(
        self, model_dir: Path, *, name: str, model: str, limits: ServeLimits, threads: int
    ) -> None:
        from optuna_hpcnas.deploy._pipeline import load_report
        from optuna_hpcnas.evaluation import _onnx

        report = load_report(model_dir)
        if model == AUTO:
            model, why = measured_choice(report)
            _logger.info("Serving the %s model: %s.", model.upper(), why)
        self.model = model
        path = model_dir / _MODELS[model]
        if not path.is_file():
            raise FileNotFoundError(f"No {path.name} in {str(model_dir)!r}.")
        self.name = name
        self.limits = limits
        self.shape = tuple(int(s) for s in report["input_shape"])
        self.input = dict(report.get("input") or {})
        self.series = _Metrics()
        sess = _onnx.session(path, threads=threads)
        self.classes = int(sess.get_outputs()[0].shape[-1])
        self.batcher = _Batcher(sess, max_batch=limits.max_batch, metrics=self.series)
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpcnas-parse")
        self._trim = _heap_trimmer()
        self._inflight = 0
        self._large_since_trim = False

    async def _parse(self, request: Request, parse: Callable[..., Any]) -> Any:
        body = await _read_body(request, self.limits.max_body_bytes)
        if len(body) <= _INLINE_PARSE_BYTES:
            return parse(body, self.shape, self.limits.max_instances)
        self._large_since_trim = True
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._parser, parse, body, self.shape, self.limits.max_instances
        )

    async def _handle(
        self,
        request: Request,
        parse: Callable[..., tuple[np.ndarray, dict[str, Any]]],
        respond: Callable[[np.ndarray, dict[str, Any]], dict[str, Any]],
    ) -> Response:
        """Parse, infer and answer one request of either protocol."""
        from starlette.responses import JSONResponse

        if (refused := self._unknown(request)) is not None:
            return refused
        self._inflight += 1
        try:
            try:
                batch, echo = await self._parse(request, parse)
            except BadRequest as e:
                return JSONResponse({"error": e.message}, e.status)
            try:
                logits = await self.batcher.infer(batch)
            except Exception:  # never let one request take the server down
                _logger.exception("Inference failed.")
                return JSONResponse({"error": "Inference failed."}, 500)
            return JSONResponse(respond(logits, echo))
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._large_since_trim and self._trim is not None:
                # Large bodies leave the C heap with free pages that glibc keeps; handing them
                # back once the server is idle brings its memory back near the baseline.
                self._large_since_trim = False
                asyncio.get_running_loop().run_in_executor(self._parser, self._trim)

    def _unknown(self, request: Request) -> Response | None:
        from starlette.responses import JSONResponse

        requested = request.path_params["name"]
        if requested != self.name:
            return JSONResponse(
                {"error": f"Unknown model {requested!r}; serving {self.name!r}."}, 404
            )
        version = request.path_params.get("version", VERSION)
        if version != VERSION:
            return JSONResponse({"error": f"Unknown version {version!r} of {self.name!r}."}, 404)
        return None

    # ------------------------------------------------------------------------ KServe v1
    async def v1_models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"models": [self.name]})

    async def v1_ready(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return self._unknown(request) or JSONResponse({"name": self.name, "ready": True})

    async def v1_predict(self, request: Request) -> Response:
        def parse(body: bytes, *args: Any) -> tuple[np.ndarray, dict[str, Any]]:
            return parse_v1(body, *args), {}

        return await self._handle(request, parse, lambda logits, _: v1_response(logits))

    # ------------------------------------------------------------------------ v2
    async def v2_server(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        from optuna_hpcnas import __version__

        return JSONResponse({"name": "optuna-hpcnas", "version": __version__, "extensions": []})

    async def v2_live(self, request: Request) -> Response:
        from starlette.responses import Response

        return Response(status_code=200)  # the protocol: 200 is true, the body empty

    async def v2_ready(self, request: Request) -> Response:
        from starlette.responses import Response

        return Response(status_code=200)  # the one model is loaded before the app exists

    async def v2_model_ready(self, request: Request) -> Response:
        from starlette.responses import Response

        return self._unknown(request) or Response(status_code=200)

    async def v2_metadata(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        from optuna_hpcnas.evaluation._onnx import INPUT_NAME
        from optuna_hpcnas.evaluation._onnx import OUTPUT_NAME

        if (refused := self._unknown(request)) is not None:
            return refused
        metadata: dict[str, Any] = {
            "name": self.name,
            "versions": [VERSION],
            "platform": "onnx_onnxv1",
            "inputs": [{"name": INPUT_NAME, "datatype": DATATYPE, "shape": [-1, *self.shape]}],
            "outputs": [{"name": OUTPUT_NAME, "datatype": DATATYPE, "shape": [-1, self.classes]}],
        }
        if "expects" in self.input:
            metadata["parameters"] = {"input": self.input["expects"]}
        return JSONResponse(metadata)

    async def v2_infer(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        binary = "inference-header-content-length" in request.headers
        if binary and self._unknown(request) is None:
            message = "Binary tensor data is not supported: send the data as JSON."
            return JSONResponse({"error": message}, 400)

        def respond(logits: np.ndarray, echo: dict[str, Any]) -> dict[str, Any]:
            return v2_response(logits, model_name=self.name, version=VERSION, echo=echo)

        return await self._handle(request, parse_v2, respond)

    async def metrics(self, request: Request) -> Response:
        from starlette.responses import Response

        return Response(self.series.exposition(), media_type=self.series.content_type)


def _heap_trimmer() -> Callable[[], Any] | None:
    """glibc's ``malloc_trim(0)``, or ``None`` where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


def _routes(server: _Server) -> list[tuple[str, Any, str]]:
    """``(path, endpoint, method)``; the first path of an endpoint is its metrics label."""
    v = "/versions/{version}"
    return [
        ("/v1/models", server.v1_models, "GET"),
        # Before the readiness route: "{name}" would match "digits:predict" too.
        ("/v1/models/{name}:predict", server.v1_predict, "POST"),
        ("/v1/models/{name}", server.v1_ready, "GET"),
        ("/v2", server.v2_server, "GET"),
        ("/v2/health/live", server.v2_live, "GET"),
        ("/v2/health/ready", server.v2_ready, "GET"),
        ("/v2/models/{name}/ready", server.v2_model_ready, "GET"),
        (f"/v2/models/{{name}}{v}/ready", server.v2_model_ready, "GET"),
        ("/v2/models/{name}/infer", server.v2_infer, "POST"),
        (f"/v2/models/{{name}}{v}/infer", server.v2_infer, "POST"),
        ("/v2/models/{name}", server.v2_metadata, "GET"),
        (f"/v2/models/{{name}}{v}", server.v2_metadata, "GET"),
        ("/metrics", server.metrics, "GET"),
    ]


def build_app(
    model_dir: str | Path,
    *,
    name: str = "model",
    model: str = AUTO,
    max_body_bytes: int = DEFAULT_LIMITS.max_body_bytes,
    max_instances: int = DEFAULT_LIMITS.max_instances,
    max_batch: int = DEFAULT_LIMITS.max_batch,
    threads: int = 1,
) -> Starlette:
    """The Starlette app serving ``model_dir`` (a ``deploy_model`` directory), both protocols.

    Args:
        model_dir: Directory with ``report.json`` and the ONNX files.
        name: Model name in the routes.
        model: ``"int8"`` (``model.int8.onnx``), ``"fp32"`` (``model.onnx``) or ``"auto"``:
            the faster of the two as ``report.json`` measured them (``measured_choice``).
        max_body_bytes: Larger request bodies get 413, checked before reading them whole.
        max_instances: Larger batches get 413.
        max_batch: Instances per model call (see ``ServeLimits``).
        threads: onnxruntime intra-op threads.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if model not in (*_MODELS, AUTO):
        raise ValueError(f"`model` is {model!r}, but must be one of {sorted((*_MODELS, AUTO))}.")
    limits = ServeLimits(
        max_body_bytes=max_body_bytes, max_instances=max_instances, max_batch=max_batch
    )
    server = _Server(Path(model_dir), name=name, model=model, limits=limits, threads=threads)
    routes = _routes(server)
    labels: dict[Any, str] = {}
    for path, endpoint, _ in routes:
        labels.setdefault(endpoint, path)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, exc.status_code)

    app = Starlette(
        routes=[Route(path, endpoint, methods=[method]) for path, endpoint, method in routes],
        middleware=[Middleware(_Instrumented, metrics=server.series, routes=labels)],
        exception_handlers={HTTPException: http_error},
    )
    app.state.hpcnas = server  # its batcher and limits, for tests and embedding applications
    return app


def serve(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    name: str = "model",
    model: str = AUTO,
    limits: ServeLimits = DEFAULT_LIMITS,
    threads: int = 1,
    access_log: bool = False,
) -> None:
    """Serve ``model_dir`` with uvicorn until interrupted (127.0.0.1 unless told otherwise)."""
    import uvicorn

    app = build_app(
        model_dir, name=name, model=model, max_body_bytes=limits.max_body_bytes,
        max_instances=limits.max_instances, max_batch=limits.max_batch, threads=threads,
    )  # fmt: skip
    _logger.info(
        "Serving %s (%s) on http://%s:%d: /v1/models/%s, /v2/models/%s, /metrics",
        model_dir, app.state.hpcnas.model, host, port, name, name,
    )  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``hpcnas serve DIR`` (address, name, model file, limits)."""
    d = DEFAULT_LIMITS
    parser.add_argument("model_dir", metavar="DIR", help="a directory written by hpcnas deploy")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (8080)")
    parser.add_argument("--name", default="model", help="model name in the routes (model)")
    parser.add_argument(
        "--model",
        choices=sorted((*_MODELS, AUTO)),
        default=AUTO,
        help="which ONNX file (auto: the faster of the two that report.json measured, INT8 "
        "only within the deployment's accuracy margin)",
    )
    parser.add_argument(
        "--max-body-bytes", type=_positive_int, default=d.max_body_bytes, metavar="N",
        help=f"larger request bodies get 413 ({d.max_body_bytes})",
    )  # fmt: skip
    parser.add_argument(
        "--max-instances", type=_positive_int, default=d.max_instances, metavar="N",
        help=f"larger batches get 413 ({d.max_instances})",
    )  # fmt: skip
    parser.add_argument(
        "--max-batch", type=_positive_int, default=d.max_batch, metavar="N",
        help="instances per model call: requests that arrive together are merged up to it, "
        f"larger ones run in chunks of it ({d.max_batch}; 1 turns batching off)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=_positive_int, default=1, metavar="N",
        help="onnxruntime intra-op threads (1)",
    )  # fmt: skip
    parser.add_argument("--access-log", action="store_true", help="log every request")


def serve_command(args: argparse.Namespace) -> int:
    """Run ``hpcnas serve`` from parsed ``add_serve_arguments`` arguments; the exit code."""
    d = DEFAULT_LIMITS
    try:
        limits = ServeLimits(
            max_body_bytes=getattr(args, "max_body_bytes", d.max_body_bytes),
            max_instances=getattr(args, "max_instances", d.max_instances),
            max_batch=getattr(args, "max_batch", d.max_batch),
        )
        serve(
            args.model_dir, host=args.host, port=args.port, name=args.name, model=args.model,
            limits=limits, threads=getattr(args, "threads", 1),
            access_log=getattr(args, "access_log", False),
        )  # fmt: skip
    except (FileNotFoundError, ValueError) as e:
        _logger.error("%s", e)
        return 2
    return 0
