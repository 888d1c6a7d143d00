"""The server, both protocols, over real HTTP to uvicorn on 127.0.0.1."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
import http.client
import json
from pathlib import Path
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

from optuna_hpcnas.deploy import add_serve_arguments
from optuna_hpcnas.deploy import build_app
from tests.deploy_tests.conftest import raw_digits

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

MAX_BODY = 64 * 1024
MAX_INSTANCES = 50


class Server:
    """A uvicorn server on a free 127.0.0.1 port in a background thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def raw(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("content-type", "")
        finally:
            conn.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, Any]:
        status, data, content_type = self.raw(method, path, body, headers)
        assert content_type.startswith("application/json"), (status, data)
        return status, json.loads(data)

    def post(self, path: str, payload: Any, headers: dict | None = None) -> tuple[int, Any]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return self.request(
            "POST", path, body, {"Content-Type": "application/json", **(headers or {})}
        )

    def predict(self, payload: Any, name: str = "digits") -> tuple[int, Any]:
        return self.post(f"/v1/models/{name}:predict", payload)

    def infer(self, payload: Any, path: str = "/v2/models/digits/infer") -> tuple[int, Any]:
        return self.post(path, payload)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of ``/metrics`` by (name, sorted labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        status, data, content_type = self.raw("GET", "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(data.decode())
            for s in family.samples
        }


@pytest.fixture(scope="module")
def server(deployed: Any) -> Iterator[Server]:
    app = build_app(  # the INT8 file, whose logits `raw_test` holds
        deployed[0], name="digits", model="int8", max_body_bytes=MAX_BODY,
        max_instances=MAX_INSTANCES,
    )  # fmt: skip
    with Server(app) as running:
        yield running


@pytest.fixture(scope="module")
def raw_test(deployed: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Test digits as raw pixels (what a client sends), their labels and the int8 logits."""
    import onnxruntime as ort

    out, _, _, data = deployed
    x = raw_digits(data.test.tensors[0][:40].numpy(), data.preprocessing)
    sess = ort.InferenceSession(str(out / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    return x, data.test.tensors[1][:40].numpy(), sess.run(None, {"input": x})[0]


def v2_body(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    return {"inputs": [{**tensor, "data": x.ravel().tolist()}], **extra}


# ---------------------------------------------------------------------------- KServe v1
def test_v1_readiness_and_model_list(server: Server) -> None:
    assert server.request("GET", "/v1/models/digits") == (200, {"name": "digits", "ready": True})
    assert server.request("GET", "/v1/models") == (200, {"models": ["digits"]})
    status, body = server.request("GET", "/v1/models/other")
    assert status == 404 and "other" in body["error"]


def test_v1_predictions_match_the_int8_model(server: Server, raw_test: Any) -> None:
    x, labels, logits = raw_test
    status, body = server.predict({"instances": x.tolist()})
    assert status == 200
    predictions = body["predictions"]
    assert [p["class"] for p in predictions] == logits.argmax(1).tolist()
    for p in predictions:
        assert len(p["probabilities"]) == 10
        assert sum(p["probabilities"]) == pytest.approx(1.0, abs=1e-4)
        assert p["class"] == int(np.argmax(p["probabilities"]))
    # Mostly right on raw pixels: the model standardises them itself.
    assert np.mean([p["class"] for p in predictions] == labels) >= 0.8
    # A flat list of 64 numbers is the same instance.
    status, flat = server.predict({"instances": [x[0].ravel().tolist()]})
    assert status == 200 and flat["predictions"][0] == predictions[0]


def test_v1_inputs_are_accepted_beside_instances(server: Server, raw_test: Any) -> None:
    x = raw_test[0][:3]
    expected = server.predict({"instances": x.tolist()})
    assert expected[0] == 200
    assert server.predict({"inputs": x.tolist()}) == expected
    assert server.predict({"inputs": {"input": x.tolist()}}) == expected  # named form


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"instances": [NaN]}', 400, "not valid JSON"),
        (b'{"instances": [[Infinity]]}', 400, "not valid JSON"),
        ([[0.0] * 64], 422, '"instances" or "inputs"'),
        ({"instances": [[0.0] * 64], "inputs": [[0.0] * 64]}, 422, "one of them"),
        ({"inputs": {"x": [[0.0] * 64]}}, 422, "one input, 'input'"),
        ({"instances": []}, 422, "non-empty list"),
        ({"instances": "abc"}, 422, "non-empty list"),
        ({"inputs": None}, 422, "non-empty list"),
        ({"instances": [[0.0] * 63]}, 422, "takes [1, 8, 8]"),
        ({"instances": [[[0.0] * 8] * 8]}, 422, "shape [8, 8]"),
        ({"instances": [["a"] * 64]}, 422, "numbers only"),
        ({"instances": [[True] * 64]}, 422, "numbers only"),
        ({"instances": [[1.5] * 63 + [True]]}, 422, "not true or false"),
        ({"instances": [[1] * 63 + [False]]}, 422, "not true or false"),
        ({"instances": [[0.0] * 64, [0.0] * 32]}, 422, "inconsistent shapes"),
        ({"instances": [[1e300] * 64]}, 422, "finite float32"),
        ({"instances": [[0.0] * 64] * (MAX_INSTANCES + 1)}, 413, "more than the 50 allowed"),
    ],
)
def test_v1_bad_requests_get_a_json_error(
    server: Server, payload: Any, status: int, message: str
) -> None:
    got, body = server.predict(payload)
    assert got == status, body
    assert set(body) == {"error"} and message in body["error"]


def test_oversized_bodies(server: Server) -> None:
    # Declared too large: refused from the header, before the body is read.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    conn.putrequest("POST", "/v1/models/digits:predict")
    conn.putheader("Content-Length", str(10 * MAX_BODY))
    conn.endheaders()
    conn.send(b'{"instances": [')  # a fraction of what was declared
    response = conn.getresponse()
    assert response.status == 413 and "more than" in json.loads(response.read())["error"]
    conn.close()
    # Chunked, no length declared: counted while streaming.
    chunks = (b'{"instances": [' + b"0.0," * 2000 for _ in range(20))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    conn.request("POST", "/v2/models/digits/infer", body=chunks, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413
    conn.close()


def test_routes_and_methods(server: Server) -> None:
    assert server.request("GET", "/nowhere")[0] == 404
    status, body = server.request("GET", "/v1/models/digits:predict")
    assert status == 404 and "error" in body
    status, body = server.request("POST", "/v1/models/digits", b"{}")
    assert status == 405 and "error" in body
    status, body = server.request("GET", "/v2/models/digits/infer")
    assert status == 405 and "error" in body
    status, body = server.predict({"instances": [[0.0] * 64]}, name="model")
    assert status == 404 and "'model'" in body["error"]


def test_server_survives_bad_requests(server: Server) -> None:
    for payload in (b"\xff\xfe", b"[" * 10000, b'{"instances": [[[[[[1]]]]]]}'):
        assert 400 <= server.predict(payload)[0] < 500
        assert 400 <= server.infer(payload)[0] < 500
    assert server.raw("GET", "/v2/health/ready")[0] == 200
    assert server.predict({"instances": [[0.0] * 64]})[0] == 200


# ---------------------------------------------------------------------------- v2
def test_v2_with_a_protocol_client(server: Server, raw_test: Any) -> None:
    """Triton's HTTP client, written for any Open Inference Protocol server."""
    httpclient = pytest.importorskip("tritonclient.http")
    x, _, logits = raw_test
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("digits") and not client.is_model_ready("other")
        assert client.is_model_ready("digits", model_version="1")
        assert client.get_server_metadata()["name"] == "optuna-hpcnas"
        metadata = client.get_model_metadata("digits")
        assert metadata["inputs"] == [
            {"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}
        ]
        assert metadata["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
        assert metadata["versions"] == ["1"] and metadata["platform"] == "onnx_onnxv1"
        assert "raw digits pixels 0-16" in metadata["parameters"]["input"]
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=False)
        result = client.infer("digits", [tensor], request_id="req-7")
        np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-5, atol=1e-5)
        response = result.get_response()
        assert response["id"] == "req-7" and response["model_name"] == "digits"
        wanted = [httpclient.InferRequestedOutput("logits", binary_data=False)]
        again = client.infer("digits", [tensor], model_version="1", outputs=wanted)
        np.testing.assert_array_equal(again.as_numpy("logits"), result.as_numpy("logits"))
    finally:
        client.close()


def test_v2_protocol_json(server: Server, raw_test: Any) -> None:
    """The protocol's JSON as written in its specification, without a client library."""
    x, _, logits = raw_test
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/digits/ready"):
        assert server.raw("GET", path)[:2] == (200, b"")  # 200 is true; the body is empty
    assert server.raw("GET", "/v2/models/other/ready")[0] == 404
    assert server.raw("GET", "/v2/models/digits/versions/2/ready")[0] == 404
    status, body = server.infer(v2_body(x[:4], id="a"))
    assert status == 200
    assert body["model_name"] == "digits" and body["model_version"] == "1" and body["id"] == "a"
    (output,) = body["outputs"]
    assert output["name"] == "logits" and output["datatype"] == "FP32"
    assert output["shape"] == [4, 10]
    np.testing.assert_allclose(np.reshape(output["data"], (4, 10)), logits[:4], atol=1e-5)
    # Row-major data may also come nested, in the tensor's natural shape.
    nested = v2_body(x[:4])
    nested["inputs"][0]["data"] = x[:4].tolist()
    assert server.infer(nested)[1]["outputs"] == body["outputs"]
    status, metadata = server.request("GET", "/v2/models/digits/versions/1")
    assert status == 200 and metadata["inputs"][0]["shape"] == [-1, 1, 8, 8]
    status, metadata = server.request("GET", "/v2")
    assert status == 200 and metadata["extensions"] == []


def _v2_case(**changes: Any) -> dict[str, Any]:
    body = v2_body(np.zeros((2, 1, 8, 8), dtype=np.float32))
    tensor = body["inputs"][0]
    for key, value in changes.items():
        if key in ("outputs", "id"):
            body[key] = value
        elif value is None:
            del tensor[key]
        else:
            tensor[key] = value
    return body


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"inputs": [{"data": [NaN]}]}', 400, "not valid JSON"),
        ({"instances": [[0.0] * 64]}, 400, '"inputs" is one tensor'),
        ({"inputs": []}, 400, '"inputs" is one tensor'),
        (_v2_case(name="x"), 400, "Unknown input 'x'"),
        (_v2_case(datatype="FP64"), 400, "datatype is 'FP64'"),
        (_v2_case(datatype=None), 400, "datatype is None"),
        (_v2_case(shape=[2, 64]), 400, "takes [-1, 1, 8, 8]"),
        (_v2_case(shape=[0, 1, 8, 8]), 400, "Input shape is [0, 1, 8, 8]"),
        (_v2_case(shape=[True, 1, 8, 8]), 400, "Input shape is [True, 1, 8, 8]"),
        (_v2_case(shape=None), 400, "Input shape is None"),
        (_v2_case(data=[0.0] * 127), 400, "has 127 numbers, but shape [2, 1, 8, 8] needs 128"),
        (_v2_case(data=[]), 400, "non-empty list"),
        (_v2_case(data="abc"), 400, "non-empty list"),
        (_v2_case(data=["a"] * 128), 400, "numbers only"),
        (_v2_case(data=[0.5] * 127 + [True]), 400, "not true or false"),
        (_v2_case(data=[[0.0] * 64, [0.0] * 63]), 400, "inconsistent shapes"),
        (_v2_case(data=[1e300] * 128), 400, "finite float32"),
        (_v2_case(parameters={"binary_data_size": 512}), 400, "Binary tensor data"),
        (_v2_case(outputs=[{"name": "probabilities"}]), 400, "Unknown output"),
        (_v2_case(id=7), 400, '"id" is 7'),
        (_v2_case(shape=[MAX_INSTANCES + 1, 1, 8, 8]), 413, "more than the 50 allowed"),
    ],
)
def test_v2_bad_requests_get_the_protocols_error(
    server: Server, payload: Any, status: int, message: str
) -> None:
    got, body = server.infer(payload)
    assert got == status, body
    assert set(body) == {"error"} and message in body["error"]


def test_v2_errors_for_unknown_models_and_binary_bodies(server: Server) -> None:
    body = _v2_case()
    status, error = server.infer(body, path="/v2/models/other/infer")
    assert status == 404 and "'other'" in error["error"]
    status, error = server.infer(body, path="/v2/models/digits/versions/3/infer")
    assert status == 404 and "version '3'" in error["error"]
    status, error = server.post(
        "/v2/models/digits/infer", body, headers={"Inference-Header-Content-Length": "10"}
    )
    assert status == 400 and "Binary tensor data" in error["error"]
    assert server.request("GET", "/v2/models/other")[0] == 404


# ---------------------------------------------------------------------------- metrics, batching
def test_metrics_count_requests_by_route_and_status(server: Server) -> None:
    route = "/v1/models/{name}:predict"

    def count(status: str) -> float:
        key = (("method", "POST"), ("route", route), ("status", status))
        return server.metrics().get(("hpcnas_serve_requests_total", key), 0.0)

    ok, refused = count("200"), count("422")
    latency = server.metrics().get(
        ("hpcnas_serve_request_duration_seconds_count", (("route", route),)), 0.0
    )
    for _ in range(3):
        assert server.predict({"instances": [[1.0] * 64]})[0] == 200
    assert server.predict({"instances": []})[0] == 422
    assert server.raw("GET", "/nowhere")[0] == 404
    after = server.metrics()
    assert count("200") == ok + 3 and count("422") == refused + 1
    key = ("hpcnas_serve_request_duration_seconds_count", (("route", route),))
    assert after[key] == latency + 4
    unmatched = (("method", "GET"), ("route", "unmatched"), ("status", "404"))
    assert after[("hpcnas_serve_requests_total", unmatched)] >= 1
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/digits/versions/1/ready"):
        assert server.raw("GET", path)[0] == 200
    samples = server.metrics()
    for route in ("/v2/health/live", "/v2/health/ready", "/v2/models/{name}/ready"):
        key = (("method", "GET"), ("route", route), ("status", "200"))
        assert samples[("hpcnas_serve_requests_total", key)] >= 1, route


def _calls(running: Server) -> tuple[float, float]:
    samples = running.metrics()
    return (
        samples[("hpcnas_serve_model_call_instances_count", ())],
        samples[("hpcnas_serve_model_call_instances_sum", ())],
    )


def test_a_large_request_runs_in_chunks(deployed: Any, raw_test: Any) -> None:
    """``max_batch`` bounds each model call, so memory does not grow with the request."""
    x, _, logits = raw_test
    with Server(build_app(deployed[0], name="digits", model="int8", max_batch=16)) as running:
        status, body = running.predict({"instances": x[:37].tolist()})
        assert status == 200
        assert [p["class"] for p in body["predictions"]] == logits[:37].argmax(1).tolist()
        calls, instances = _calls(running)
        assert (calls, instances) == (3, 37)  # 16 + 16 + 5
        bucket = running.metrics()[("hpcnas_serve_model_call_instances_bucket", (("le", "16.0"),))]
        assert bucket == 3


def _blocked(app: Any) -> tuple[threading.Event, threading.Event]:
    """Make the model calls of ``app`` wait for ``release``; ``entered`` is set when one is."""
    batcher = app.state.hpcnas.batcher
    entered, release = threading.Event(), threading.Event()
    run = batcher._run

    def blocked_run(x: np.ndarray) -> np.ndarray:
        entered.set()
        assert release.wait(30)
        return run(x)

    batcher._run = blocked_run
    return entered, release


def test_requests_that_arrive_together_share_a_model_call(deployed: Any, raw_test: Any) -> None:
    x, _, logits = raw_test
    app = build_app(deployed[0], name="digits", model="int8")
    entered, release = _blocked(app)
    with Server(app) as running:
        results: dict[int, Any] = {}

        def send(i: int, rows: slice) -> None:
            results[i] = running.infer(v2_body(x[rows]))

        first = threading.Thread(target=send, args=(0, slice(0, 1)))
        first.start()
        assert entered.wait(30)  # the first call is running; the next ones queue behind it
        others = [
            threading.Thread(target=send, args=(i, slice(2 * i, 2 * i + 2))) for i in (1, 2, 3)
        ]
        for t in others:
            t.start()
        queue = app.state.hpcnas.batcher._queue
        deadline = time.monotonic() + 30
        while len(queue) < 3:
            assert time.monotonic() < deadline, "the requests did not queue"
            time.sleep(0.01)
        release.set()
        for t in (first, *others):
            t.join(30)
        assert _calls(running) == (2, 7)  # one call of 1, then one of 2 + 2 + 2
        for i in (1, 2, 3):  # each request got its own rows back
            status, body = results[i]
            data = np.reshape(body["outputs"][0]["data"], (2, 10))
            np.testing.assert_allclose(data, logits[2 * i : 2 * i + 2], atol=1e-5)


def test_probes_answer_while_the_model_is_busy(deployed: Any) -> None:
    """Health, readiness and metrics never wait behind inference (the probes' pool)."""
    app = build_app(deployed[0], name="digits")
    entered, release = _blocked(app)
    with Server(app) as running:
        busy = threading.Thread(target=running.predict, args=({"instances": [[0.0] * 64]},))
        busy.start()
        try:
            assert entered.wait(30)
            for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/digits/ready"):
                assert running.raw("GET", path)[0] == 200
            assert running.request("GET", "/v1/models/digits")[1]["ready"] is True
            assert running.raw("GET", "/metrics")[0] == 200
            assert busy.is_alive()  # the model call was still blocked all along
        finally:
            release.set()
            busy.join(30)


# ---------------------------------------------------------------------------- app and CLI
def test_fp32_model(deployed: Any) -> None:
    out, _, net, data = deployed
    import torch

    x = data.test.tensors[0][:5]
    with Server(build_app(out, model="fp32")) as running:
        raw = raw_digits(x.numpy(), data.preprocessing)
        status, body = running.predict({"instances": raw.tolist()}, name="model")
    assert status == 200
    with torch.no_grad():
        expected = torch.softmax(net(x), 1).numpy()
    got = np.array([p["probabilities"] for p in body["predictions"]])
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_build_app_errors(deployed: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`model` is 'fp16'"):
        build_app(deployed[0], model="fp16")
    with pytest.raises(FileNotFoundError, match="No report.json"):
        build_app(tmp_path)
    with pytest.raises(ValueError, match="`max_instances` is 0"):
        build_app(deployed[0], max_instances=0)
    with pytest.raises(ValueError, match="`max_batch` is True"):
        build_app(deployed[0], max_batch=True)


def test_serve_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["dir"])
    assert (args.model_dir, args.host, args.port, args.name, args.model) == (
        "dir",
        "127.0.0.1",
        8080,
        "model",
        "auto",
    )
    assert (args.max_body_bytes, args.max_instances, args.max_batch) == (8 * 2**20, 1024, 64)
    args = parser.parse_args(
        ["d", "--port", "9", "--host", "0.0.0.0", "--model", "fp32", "--max-body-bytes",
         "1000", "--max-instances", "8", "--max-batch", "1", "--threads", "2"]
    )  # fmt: skip
    assert (args.port, args.host, args.model) == (9, "0.0.0.0", "fp32")
    assert (args.max_body_bytes, args.max_instances, args.max_batch, args.threads) == (
        1000,
        8,
        1,
        2,
    )
    for bad in (["--model", "fp16"], ["--max-instances", "0"], ["--max-body-bytes", "1e6"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["d", *bad])
    assert "must be >= 1" in capsys.readouterr().err


def test_serving_needs_no_torch(deployed: Any) -> None:
    code = (
        "import sys; from optuna_hpcnas.deploy import build_app; "
        f"build_app({str(deployed[0])!r}); "
        "assert 'torch' not in sys.modules, 'serving imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_serve_command_in_a_process(deployed: Any) -> None:
    """The container's entry point: serve_command binds, answers, and stops on SIGTERM."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import argparse, sys; from optuna_hpcnas.deploy import add_serve_arguments, "
        "serve_command; p = argparse.ArgumentParser(); add_serve_arguments(p); "
        "sys.exit(serve_command(p.parse_args(sys.argv[1:])))"
    )
    args = [str(deployed[0]), "--port", str(port), "--name", "digits", "--model", "fp32"]
    args += ["--max-instances", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/models/digits")
                response = conn.getresponse()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.2)
        assert response.status == 200
        assert json.loads(response.read()) == {"name": "digits", "ready": True}
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request(
            "POST", "/v1/models/digits:predict", json.dumps({"instances": [[0] * 64] * 3})
        )
        response = conn.getresponse()  # the --max-instances flag holds
        assert response.status == 413 and "2 allowed" in json.loads(response.read())["error"]
        conn.close()
    finally:
        proc.terminate()
        # uvicorn shuts down cleanly, then re-raises the signal it caught.
        assert proc.wait(30) in (0, -signal.SIGTERM)


def test_serve_command_reports_a_bad_directory(tmp_path: Path) -> None:
    from optuna_hpcnas.deploy import serve_command

    args = argparse.Namespace(
        model_dir=str(tmp_path), host="127.0.0.1", port=1, name="model", model="int8"
    )
    assert serve_command(args) == 2


def test_auto_serves_the_faster_model_that_report_json_measured(deployed: Any) -> None:
    from optuna_hpcnas.deploy._serve import measured_choice

    def report(fp32: float, int8: float, acc8: float = 0.9) -> dict[str, Any]:
        return {
            "margin": 0.02,
            "fp32": {"latency_p50_ms": fp32, "accuracy": 0.9},
            "int8": {"latency_p50_ms": int8, "accuracy": acc8},
        }

    assert measured_choice(report(0.2, 0.1))[0] == "int8"
    assert measured_choice(report(0.1, 0.2))[0] == "fp32"
    model, why = measured_choice(report(0.2, 0.1, acc8=0.85))  # faster but not accurate
    assert model == "fp32" and "margin" in why
    assert measured_choice({"fp32": {}})[0] == "fp32"
    on_disk = json.loads((Path(deployed[0]) / "report.json").read_text())
    app = build_app(deployed[0])
    assert app.state.hpcnas.model == measured_choice(on_disk)[0]
    assert build_app(deployed[0], model="int8").state.hpcnas.model == "int8"
