"""The KServe v1 server, over real HTTP to uvicorn on 127.0.0.1."""

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

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

MAX_BODY = 64 * 1024
MAX_INSTANCES = 50


class Server:
    """A uvicorn server on a free 127.0.0.1 port in a background thread."""

    def __init__(self, app: Any) -> None:
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

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read()
            assert response.getheader("content-type", "").startswith("application/json")
            return response.status, json.loads(data)
        finally:
            conn.close()

    def predict(self, payload: Any, name: str = "digits") -> tuple[int, Any]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return self.request(
            "POST", f"/v1/models/{name}:predict", body, {"Content-Type": "application/json"}
        )


@pytest.fixture(scope="module")
def server(deployed: Any) -> Iterator[Server]:
    app = build_app(
        deployed[0], name="digits", max_body_bytes=MAX_BODY, max_instances=MAX_INSTANCES
    )
    with Server(app) as running:
        yield running


def test_readiness(server: Server) -> None:
    assert server.request("GET", "/v1/models/digits") == (200, {"name": "digits", "ready": True})
    status, body = server.request("GET", "/v1/models/other")
    assert status == 404 and "other" in body["error"]


def test_predictions_match_the_int8_model(server: Server, deployed: Any) -> None:
    import onnxruntime as ort

    out, _, _, data = deployed
    x = data.test.tensors[0][:20].numpy()
    status, body = server.predict({"instances": x.tolist()})
    assert status == 200
    predictions = body["predictions"]
    assert len(predictions) == 20
    sess = ort.InferenceSession(str(out / "model.int8.onnx"), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {"input": x})[0]
    assert [p["class"] for p in predictions] == logits.argmax(1).tolist()
    for p in predictions:
        assert len(p["probabilities"]) == 10
        assert sum(p["probabilities"]) == pytest.approx(1.0, abs=1e-4)
        assert p["class"] == int(np.argmax(p["probabilities"]))
    # Mostly right: it is the trained model, not noise.
    labels = data.test.tensors[1][:20].numpy()
    assert np.mean(logits.argmax(1) == labels) >= 0.8
    # A flat list of 64 numbers is the same instance.
    status, flat = server.predict({"instances": [x[0].ravel().tolist()]})
    assert status == 200 and flat["predictions"][0] == predictions[0]


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"instances": [NaN]}', 400, "not valid JSON"),
        (b'{"instances": [[Infinity]]}', 400, "not valid JSON"),
        ({"inputs": [[0.0] * 64]}, 422, '"instances"'),
        ([[0.0] * 64], 422, '"instances"'),
        ({"instances": []}, 422, "non-empty list"),
        ({"instances": "abc"}, 422, "non-empty list"),
        ({"instances": [[0.0] * 63]}, 422, "takes [1, 8, 8]"),
        ({"instances": [[[0.0] * 8] * 8]}, 422, "shape [8, 8]"),
        ({"instances": [["a"] * 64]}, 422, "numbers only"),
        ({"instances": [[True] * 64]}, 422, "numbers only"),
        ({"instances": [[0.0] * 64, [0.0] * 32]}, 422, "inconsistent shapes"),
        ({"instances": [[1e300] * 64]}, 422, "finite float32"),
        ({"instances": [[0.0] * 64] * (MAX_INSTANCES + 1)}, 413, "more than the 50 allowed"),
    ],
)
def test_bad_requests_get_a_json_error(
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
    conn.request("POST", "/v1/models/digits:predict", body=chunks, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413
    conn.close()


def test_routes_and_methods(server: Server) -> None:
    assert server.request("GET", "/nowhere")[0] == 404
    status, body = server.request("GET", "/v1/models/digits:predict")
    assert status == 404 and "error" in body
    status, body = server.request("POST", "/v1/models/digits", b"{}")
    assert status == 405 and "error" in body
    status, body = server.predict({"instances": [[0.0] * 64]}, name="model")
    assert status == 404 and "'model'" in body["error"]


def test_server_survives_bad_requests(server: Server) -> None:
    for payload in (b"\xff\xfe", b"[" * 10000, b'{"instances": [[[[[[1]]]]]]}'):
        assert 400 <= server.predict(payload)[0] < 500
    assert server.request("GET", "/v1/models/digits")[0] == 200
    assert server.predict({"instances": [[0.0] * 64]})[0] == 200


def test_fp32_model(deployed: Any) -> None:
    out, _, net, data = deployed
    import torch

    x = data.test.tensors[0][:5]
    with Server(build_app(out, model="fp32")) as running:
        status, body = running.predict({"instances": x.numpy().tolist()}, name="model")
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


def test_serve_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["dir"])
    assert (args.model_dir, args.host, args.port, args.name, args.model) == (
        "dir",
        "127.0.0.1",
        8080,
        "model",
        "int8",
    )
    args = parser.parse_args(["d", "--port", "9", "--host", "0.0.0.0", "--model", "fp32"])
    assert (args.port, args.host, args.model) == (9, "0.0.0.0", "fp32")
    with pytest.raises(SystemExit):
        parser.parse_args(["d", "--model", "fp16"])


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
