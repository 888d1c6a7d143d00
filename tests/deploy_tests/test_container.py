from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
import re
import shutil
import subprocess
from typing import Any

import pytest

from optuna_hpcnas.deploy import dockerfile
from optuna_hpcnas.deploy import helm_chart
from optuna_hpcnas.deploy import probe_timeout_seconds

yaml = pytest.importorskip("yaml")


def render(template: str, values: dict, *, release: str = "rel", chart: str = "chart") -> Any:
    """Helm's substitution for the plain ``{{ .X.y }}`` and ``| quote`` forms the chart uses."""

    def lookup(match: re.Match[str]) -> str:
        path, pipe = match.group(1), match.group(2)
        if path == ".Release.Name":
            value: Any = release
        elif path == ".Chart.Name":
            value = chart
        else:
            assert path.startswith(".Values."), path
            value = values
            for key in path[len(".Values.") :].split("."):
                value = value[key]
        if pipe == "quote":
            return json.dumps(str(value))
        return json.dumps(value) if isinstance(value, bool) else str(value)

    text = re.sub(r"\{\{\s*(\.[\w.]+)\s*(?:\|\s*(\w+)\s*)?\}\}", lookup, template)
    assert "{{" not in text, "a template expression the test renderer does not know"
    return yaml.safe_load(text)


def instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        if line.strip() and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op, rest.strip()))
    return out


def test_dockerfile_structure() -> None:
    text = dockerfile(model_dir_name="digits", name="digits", onnxruntime_version="1.32.0")
    ops = instructions(text)
    assert ops[0] == ("FROM", "python:3.11-slim")
    by_op: dict[str, list[str]] = {}
    for op, rest in ops:
        by_op.setdefault(op, []).append(rest)
    (install,) = [r for r in by_op["RUN"] if "pip install" in r]
    assert '"onnxruntime==1.32.0"' in install and '"optuna-hpcnas"' in install
    assert '"prometheus-client>=0.17"' in install  # the server's /metrics
    assert "torch" not in install
    assert any("useradd" in r and "10001" in r for r in by_op["RUN"])
    assert by_op["USER"] == ["10001"]
    (copy,) = by_op["COPY"]
    assert copy.endswith("model.onnx model.int8.onnx report.json /models/digits/")
    assert by_op["EXPOSE"] == ["8080"]
    (health,) = by_op["HEALTHCHECK"]
    probe = json.loads(health.split("CMD", 1)[1])
    assert probe[:2] == ["python", "-c"] and "127.0.0.1:8080/v2/models/digits/ready" in probe[2]
    compile(probe[2], "healthcheck", "exec")  # the probe is valid Python
    entry = json.loads(by_op["ENTRYPOINT"][0])
    assert entry == [
        "hpcnas", "serve", "/models/digits", "--host", "0.0.0.0", "--port", "8080",
        "--name", "digits",
    ]  # fmt: skip
    # USER comes before the entry point: the server never runs as root.
    assert [op for op, _ in ops].index("USER") < [op for op, _ in ops].index("ENTRYPOINT")


def test_dockerfile_from_a_wheel() -> None:
    text = dockerfile(
        model_dir_name="m",
        onnxruntime_version="1.20.1",
        package="optuna_hpcnas-0.1.0-py3-none-any.whl",
        port=9000,
        python="3.12",
    )
    assert "FROM python:3.12-slim" in text
    assert "COPY optuna_hpcnas-0.1.0-py3-none-any.whl /tmp/" in text
    assert '"/tmp/optuna_hpcnas-0.1.0-py3-none-any.whl"' in text
    assert "EXPOSE 9000" in text and "127.0.0.1:9000" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_dir_name": "../etc"}, "`model_dir_name` is '../etc'"),
        ({"port": 0}, "`port` is 0"),
        ({"onnxruntime_version": "latest; rm"}, "`onnxruntime_version`"),
        ({"python": "3"}, "`python` is '3'"),
        ({"name": "a b"}, "`name` is 'a b'"),
        ({"package": "x; rm -rf /"}, "`package`"),
    ],
)
def test_dockerfile_bad_arguments(kwargs: dict, message: str) -> None:
    args: dict = {"model_dir_name": "m", "onnxruntime_version": "1.20.1"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        dockerfile(**args)


def test_helm_chart_structure() -> None:
    files = helm_chart(
        name="digits",
        image="registry.local:5000/team/digits:1.2",
        port=9000,
        replicas=3,
        cpu="500m",
        memory="512Mi",
        model_name="digits",
        probe_timeout_s=4,
    )
    assert set(files) == {
        "Chart.yaml",
        "values.yaml",
        "templates/deployment.yaml",
        "templates/service.yaml",
    }
    chart = yaml.safe_load(files["Chart.yaml"])
    assert chart["apiVersion"] == "v2" and chart["name"] == "digits"
    assert chart["appVersion"] == "1.2" and chart["type"] == "application"
    values = yaml.safe_load(files["values.yaml"])
    assert values["image"] == {
        "repository": "registry.local:5000/team/digits",
        "tag": "1.2",
        "pullPolicy": "IfNotPresent",
    }
    deployment = render(files["templates/deployment.yaml"], values)
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    (container,) = pod["containers"]
    assert container["image"] == "registry.local:5000/team/digits:1.2"
    assert container["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert ready["httpGet"] == {"path": "/v2/models/digits/ready", "port": "http"}
    assert live["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    # Not Kubernetes' 1 s default: the timeout comes from measured latencies (deploy_model).
    assert ready["timeoutSeconds"] == live["timeoutSeconds"] == 4
    assert ready["failureThreshold"] == 3 and ready["periodSeconds"] == 5
    resources = {"cpu": "500m", "memory": "512Mi"}
    assert container["resources"] == {"requests": resources, "limits": resources}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels
    service = render(files["templates/service.yaml"], values)
    assert service["kind"] == "Service" and service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["port"] == 9000
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_helm_chart_image_without_tag() -> None:
    values = yaml.safe_load(helm_chart(name="m", image="localhost:5000/m")["values.yaml"])
    assert values["image"]["repository"] == "localhost:5000/m"
    assert values["image"]["tag"] == "latest"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Digits_Model"}, "`name` is 'Digits_Model'"),
        ({"image": "a b"}, "`image` is 'a b'"),
        ({"replicas": 0}, "`replicas` is 0"),
        ({"cpu": "lots"}, "`cpu` is 'lots'"),
        ({"memory": "1 GB"}, "`memory` is '1 GB'"),
        ({"port": 70000}, "`port` is 70000"),
        ({"probe_timeout_s": 0}, "`probe_timeout_s` is 0"),
        ({"probe_timeout_s": True}, "`probe_timeout_s` is True"),
    ],
)
def test_helm_chart_bad_arguments(kwargs: dict, message: str) -> None:
    args: dict = {"name": "m", "image": "m:1"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        helm_chart(**args)


def test_probe_timeout_from_a_measured_wait() -> None:
    # ten times the measured wait, rounded up, never below 2 s
    assert probe_timeout_seconds(0.0) == 2
    assert probe_timeout_seconds(0.31) == 4
    assert probe_timeout_seconds(1.2) == 12
    assert probe_timeout_seconds(0.5, factor=3) == 2
    with pytest.raises(ValueError, match="`worst_wait_s` is nan"):
        probe_timeout_seconds(float("nan"))


def test_helm_lint(tmp_path: Path) -> None:
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed (a tool check, not a service: never required)")
    for rel, text in helm_chart(name="digits", image="digits:1").items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    result = subprocess.run([helm, "lint", "--strict", str(tmp_path)], capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_docker_build(deployed: Any, tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed (a tool check, not a service: never required)")
    if subprocess.run([docker, "info"], capture_output=True).returncode != 0:
        pytest.skip("docker has no engine here (a tool check, not a service: never required)")
    # deploy put a wheel of this checkout into the context: optuna-hpcnas need not be on an
    # index
    context = tmp_path / "context"
    shutil.copytree(deployed[0], context)
    assert list(context.glob("optuna_hpcnas-*.whl"))
    result = subprocess.run(
        [docker, "build", "-t", "hpcnas-deploy-test:latest", str(context)], capture_output=True
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]


def test_the_container_installs_the_running_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna_hpcnas
    from optuna_hpcnas.deploy._wheel import package_for_container

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    context = tmp_path / "context"
    context.mkdir()
    name = package_for_container(context)  # from this checkout: a wheel beside the Dockerfile
    assert name.endswith(".whl") and (context / name).is_file()
    assert package_for_container(context) == name  # built once: the cache
    assert len(list((tmp_path / "cache").rglob("*.whl"))) == 1
    # installed from an index (no source tree beside the package): a pinned requirement
    site = tmp_path / "site-packages" / "optuna_hpcnas"
    site.mkdir(parents=True)
    monkeypatch.setattr(optuna_hpcnas, "__file__", str(site / "__init__.py"))
    monkeypatch.setattr(
        "optuna_hpcnas.deploy._wheel.importlib.metadata.distribution",
        lambda name: (_ for _ in ()).throw(importlib.metadata.PackageNotFoundError(name)),
    )
    assert package_for_container(context) == f"optuna-hpcnas=={optuna_hpcnas.__version__}"
