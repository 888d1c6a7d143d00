"""Serving under load: ``hpcnas serve`` with both protocols, batching on against off.

A digits model is trained for a few hundred steps and deployed (``deploy_model``, raw-pixel input),
or ``--model-dir`` names an existing deployment. Then, each against a fresh ``hpcnas serve``
process:

1. **load** — ``--requests`` requests (>= 2,000) of one raw held-out digit each, from
   ``--clients`` (16) concurrent clients with keep-alive connections, to KServe v1
   (``:predict``) and to the Open Inference Protocol (``/infer``); p50/p99 latency,
   throughput, instances per model call (from the server's own ``/metrics``), the server's
   RSS before and after. The peer in the same run is the same server with ``--max-batch 1``
   (every request its own model call): the ratio is what batching buys.
2. **large batches** — ``--large-requests`` (300) requests of 1,024 instances from 4 clients:
   RSS before, peak (``VmHWM``) and after an idle second, against the same load with
   ``--max-batch 1024`` (no chunking) as the peer.
3. **probes under load** — 16 clients sending bodies of 8 MiB (1,024 instances, long numbers)
   while a probe asks ``/v2/models/<name>/ready`` every 50 ms: probe p50/p99/max against the
   ``timeoutSeconds`` the chart got from ``deploy_model``'s measurements.

    OMP_NUM_THREADS=1 .venv/bin/python bench/serve_load.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/serve_load.py --arch wide --skip large probe
    OMP_NUM_THREADS=1 .venv/bin/python bench/serve_load.py --requests 4000 --model-dir deploy/

Clients and server share the machine (2 cores here): the figures are what one box does, and
the ratios within a run are steadier than the absolute numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
import http.client
import json
import os
from pathlib import Path
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any
import urllib.request

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")


ARCHS = {
    # the tests' small model: a model call costs ~25 us, far less than a request's handling
    "small": ("digits-small", (("conv3x3", 32), ("sepconv3x3", 32), ("maxpool3x3", None))),
    # a heavier one of cifar-like's cells on the same 8x8 digits, where merging calls pays
    "wide": (
        "cifar-like",
        (("conv5x5", 128), ("conv5x5", 128), ("conv3x3", 128)) + (("identity", None),) * 5,
    ),
}


def deploy_digits(out: Path, steps: int | None, arch_name: str) -> None:
    """A digits subnet trained for ``steps`` steps of 32 images (default: 6 passes over the
    1,078 training images, 204 steps) and deployed into ``out`` (raw-pixel input)."""
    import math

    import torch
    import torch.nn.functional as F

    from optuna_hpcnas import Architecture
    from optuna_hpcnas import CellConfig
    from optuna_hpcnas import ClusterConfig
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.data import stream_batches
    from optuna_hpcnas.deploy import deploy_model
    from optuna_hpcnas.supernet import SuperNet

    torch.manual_seed(0)
    data = load_digits_task(seed=0)
    preset, layout = ARCHS[arch_name]
    cells = tuple(CellConfig(op, width=width) for op, width in layout)
    arch = Architecture("residual", cells, ClusterConfig(1, 1, 64))
    space = HierarchicalSearchSpace.preset(preset)
    net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=0).subnet(arch).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    if steps is None:
        steps = 6 * math.ceil(data.sizes[0] / 32)
    batches = stream_batches(data.train, 32, generator=torch.Generator().manual_seed(0))
    for _, (x, y) in zip(range(steps), batches):
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    deploy_model(
        net.eval(), out=out, input_shape=(1, 8, 8), calibration=data.train, holdout=data.test,
        preprocessing=data.preprocessing, name="digits", latency_repeats=20,
    )  # fmt: skip


def raw_samples(n: int) -> np.ndarray:
    """``n`` raw digits (pixels 0-16), as a client has them."""
    from sklearn.datasets import load_digits

    images = load_digits().images.astype(np.float32)[:, None]
    return np.resize(images, (n, 1, 8, 8))


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


@contextmanager
def server(model_dir: Path, *flags: str) -> Iterator[tuple[int, int]]:
    """``hpcnas serve`` in its own process: ``(pid, port)`` once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hpcnas = str(Path(sys.executable).with_name("hpcnas"))
    proc = subprocess.Popen(
        [hpcnas, "serve", str(model_dir), "--port", str(port), "--name", "digits", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("hpcnas serve did not start") from None
                time.sleep(0.2)
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(30)


def v1_body(x: np.ndarray) -> bytes:
    return json.dumps({"instances": x.tolist()}).encode()


def v2_body(x: np.ndarray) -> bytes:
    tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
    return json.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]}).encode()


PATHS = {"v1": "/v1/models/digits:predict", "v2": "/v2/models/digits/infer"}
BODIES: dict[str, Callable[[np.ndarray], bytes]] = {"v1": v1_body, "v2": v2_body}


def drive(port: int, path: str, bodies: list[bytes], clients: int) -> tuple[np.ndarray, float]:
    """Send ``bodies`` from ``clients`` threads (keep-alive); per-request seconds, wall."""
    latencies = np.zeros(len(bodies))
    errors: list[str] = []

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Content-Type": "application/json"}
        for i in range(k, len(bodies), clients):
            start = time.perf_counter()
            conn.request("POST", path, bodies[i], headers)
            response = conn.getresponse()
            response.read()
            latencies[i] = time.perf_counter() - start
            if response.status != 200:
                errors.append(f"{response.status} on request {i}")
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return latencies, wall


def instances_per_call(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("hpcnas_serve_model_call_instances_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    calls = values.get("hpcnas_serve_model_call_instances_count", 0.0)
    return values.get("hpcnas_serve_model_call_instances_sum", 0.0) / calls if calls else 0.0


def load_phase(model_dir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    x = raw_samples(args.requests)
    rows = []
    servers = (("batching (--max-batch 64)", ()), ("peer: --max-batch 1", ("--max-batch", "1")))
    for label, flags in servers:
        for protocol in ("v1", "v2"):
            bodies = [BODIES[protocol](x[i : i + 1]) for i in range(args.requests)]
            with server(model_dir, *flags) as (pid, port):
                drive(port, PATHS[protocol], bodies[:64], args.clients)  # warm-up
                before = rss_mb(pid)
                latencies, wall = drive(port, PATHS[protocol], bodies, args.clients)
                after = rss_mb(pid)
                rows.append({
                    "protocol": protocol, "server": label, "requests": args.requests,
                    "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
                    "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
                    "per_s": args.requests / wall, "per_call": instances_per_call(port),
                    "rss_before": before, "rss_after": after,
                })  # fmt: skip
    return rows


def large_phase(model_dir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    body = v1_body(raw_samples(1024))
    rows = []
    servers = (
        ("chunked (--max-batch 64)", ()),
        ("peer: --max-batch 1024", ("--max-batch", "1024")),
    )
    for label, flags in servers:
        with server(model_dir, *flags) as (pid, port):
            drive(port, PATHS["v1"], [v1_body(raw_samples(1))] * 32, 4)
            before = rss_mb(pid)
            latencies, wall = drive(port, PATHS["v1"], [body] * args.large_requests, 4)
            time.sleep(1.0)
            rows.append({
                "server": label, "requests": args.large_requests, "rss_before": before,
                "rss_peak": rss_mb(pid, "VmHWM"), "rss_after": rss_mb(pid),
                "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
                "instances_per_s": 1024 * args.large_requests / wall,
            })  # fmt: skip
    return rows


def probe_phase(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Readiness probes while 16 clients send 8 MiB bodies."""
    rng = np.random.default_rng(0)
    numbers = rng.random(1024 * 64)
    # 1,024 instances whose numbers carry enough digits to fill just under 8 MiB.
    rows = (", ".join(f"{v:.110f}" for v in numbers[i * 64 : (i + 1) * 64]) for i in range(1024))
    body = ('{"instances": [[' + "], [".join(rows) + "]]}").encode()
    assert len(body) <= 8 * 2**20, len(body)
    report = json.loads((model_dir / "report.json").read_text())
    timeout = report.get("serving", {}).get("probe_timeout_s")
    probes: list[float] = []
    with server(model_dir) as (pid, port):
        before = rss_mb(pid)
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("GET", "/v2/models/digits/ready")
                conn.getresponse().read()
                conn.close()
                probes.append(time.perf_counter() - start)
                time.sleep(0.05)

        prober = threading.Thread(target=probe)
        prober.start()
        _, wall = drive(port, PATHS["v1"], [body] * args.probe_requests, 16)
        stop.set()
        prober.join()
        peak = rss_mb(pid, "VmHWM")
        time.sleep(1.0)
        after = rss_mb(pid)
    return {
        "bodies": args.probe_requests, "body_mb": len(body) / 2**20, "wall_s": wall,
        "probes": len(probes), "p50_ms": 1e3 * float(np.percentile(probes, 50)),
        "p99_ms": 1e3 * float(np.percentile(probes, 99)), "max_ms": 1e3 * max(probes),
        "timeout_s": timeout, "rss_peak": peak, "rss_after": after, "rss_before": before,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="a deployment of a digits model")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps without --model-dir (default: 6 passes over digits, 204)",
    )
    parser.add_argument("--arch", choices=sorted(ARCHS), default="small", help="the model")
    parser.add_argument("--requests", type=int, default=2048, help="per protocol (>= 2000)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--large-requests", type=int, default=300)
    parser.add_argument("--probe-requests", type=int, default=64)
    parser.add_argument("--skip", nargs="*", default=[], choices=["load", "large", "probe"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = Path(tmp) / "digits"
            deploy_digits(model_dir, args.steps, args.arch)
        if "load" not in args.skip:
            rows = load_phase(model_dir, args)
            print(
                f"\n{args.requests} requests of 1 raw digit per protocol, {args.clients} clients"
            )
            print(
                "| protocol | server | p50 ms | p99 ms | requests/s | instances per model call "
                "| RSS before MB | RSS after MB |\n|---|---|---:|---:|---:|---:|---:|---:|"
            )
            for r in rows:
                print(
                    f"| {r['protocol']} | {r['server']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                    f"| {r['per_s']:.0f} | {r['per_call']:.2f} | {r['rss_before']:.0f} "
                    f"| {r['rss_after']:.0f} |"
                )
            for protocol in ("v1", "v2"):
                on, off = (r for r in rows if r["protocol"] == protocol)
                print(f"{protocol}: batching / peer throughput {on['per_s'] / off['per_s']:.2f}x")
        if "large" not in args.skip:
            rows = large_phase(model_dir, args)
            print(f"\n{args.large_requests} requests of 1,024 instances (v1), 4 clients")
            print("| server | RSS before MB | RSS peak MB | RSS after MB | p50 ms | instances/s |")
            print("|---|---:|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['server']} | {r['rss_before']:.0f} | {r['rss_peak']:.0f} | "
                    f"{r['rss_after']:.0f} | {r['p50_ms']:.1f} | {r['instances_per_s']:.0f} |"
                )
        if "probe" not in args.skip:
            r = probe_phase(model_dir, args)
            print(
                f"\nreadiness under load: {r['bodies']} bodies of {r['body_mb']:.2f} MiB from 16 "
                f"clients in {r['wall_s']:.1f} s; {r['probes']} probes p50 {r['p50_ms']:.1f} ms, "
                f"p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms; chart timeoutSeconds "
                f"{r['timeout_s']}; server RSS {r['rss_before']:.0f} MB before, peak "
                f"{r['rss_peak']:.0f} MB, {r['rss_after']:.0f} MB an idle second after"
            )


if __name__ == "__main__":
    main()
