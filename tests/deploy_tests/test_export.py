"""One ONNX export path: ``hpcnas export``'s files come from ``hpcnas deploy``'s exporter, for
every kind of model the search makes (images, 1xL images, sequences) and for recurrent cells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optuna_hpcnas.deploy._export import write_model_files

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _onnx_matches_torch(module: Any, path: Path, shape: tuple[int, ...]) -> list[str]:
    """Assert the ONNX file computes what ``module`` does; the graph's operator types."""
    x = np.random.default_rng(0).standard_normal((5, *shape)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], expected, rtol=1e-4, atol=1e-4)
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["input"]
    return [n.op_type for n in graph.node]


@pytest.mark.parametrize(
    ("preset", "shape", "seed"),
    [
        ("digits-small", (1, 1, 40), 1),  # a signal as a 1xL image: failed with dynamo=False
        ("sequence", (16, 8), 1),  # conv1d and transformer cells: failed with dynamo=False
    ],
)
def test_export_writes_onnx_for_every_kind_of_subnet(
    tmp_path: Path, preset: str, shape: tuple[int, ...], seed: int
) -> None:
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import SuperNet

    space = HierarchicalSearchSpace.preset(preset)
    arch = space.sample(np.random.default_rng(seed))
    net = SuperNet(space, input_shape=shape, num_classes=4, seed=0).subnet(arch).eval()
    written = write_model_files(net, shape, tmp_path)
    assert [p.name for p, _ in written.files] == ["model.pt2", "model.onnx"], arch.describe()
    _onnx_matches_torch(net, tmp_path / "model.onnx", shape)
    assert written.input["standardised_in_model"] is False


class _RecurrentNet(torch.nn.Module):  # type: ignore[misc]
    """A strided Conv1d front end and a GRU over a (length, features) signal."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 8, 5, stride=2, padding=2)
        self.gru = torch.nn.GRU(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: Any) -> Any:
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        out, _ = self.gru(h)
        return self.head(out[:, -1])


def test_export_handles_gru_and_conv1d(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = _RecurrentNet().eval()
    written = write_model_files(net, (40, 1), tmp_path)
    assert (tmp_path / "model.onnx") in [p for p, _ in written.files]
    ops = _onnx_matches_torch(net, tmp_path / "model.onnx", (40, 1))
    assert "GRU" in ops and "Conv" in ops
    # The file also quantizes as deploy does it (the GRU stays in float).
    from optuna_hpcnas.evaluation._onnx import quantize_int8

    calibration = np.random.default_rng(1).standard_normal((16, 40, 1)).astype(np.float32)
    quantize_int8(tmp_path / "model.onnx", tmp_path / "model.int8.onnx", calibration)
    sess = ort.InferenceSession(
        str(tmp_path / "model.int8.onnx"), providers=["CPUExecutionProvider"]
    )
    assert sess.run(None, {"input": calibration})[0].shape == (16, 10)


def test_raw_input_export_puts_the_standardisation_first(tmp_path: Path) -> None:
    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.supernet import SuperNet
    from tests.deploy_tests.conftest import digits_architecture
    from tests.deploy_tests.conftest import raw_digits

    data = load_digits_task(seed=0)
    space = HierarchicalSearchSpace.preset("digits-small")
    net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=0)
    net = net.subnet(digits_architecture()).eval()
    written = write_model_files(
        net, (1, 8, 8), tmp_path, preprocessing=data.preprocessing, input_form="raw"
    )
    assert written.input["standardised_in_model"] is True
    standardised = data.test.tensors[0][:16]
    raw = raw_digits(standardised.numpy(), data.preprocessing)
    with torch.no_grad():
        expected = net(standardised).numpy()
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    with torch.no_grad():
        got = program(torch.from_numpy(raw)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)  # both files take raw pixels
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": raw})[0], expected, atol=1e-4)


def test_unreadable_standardisation_only_matters_when_applied(tmp_path: Path) -> None:
    from optuna_hpcnas.deploy._export import ExportError

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 3)).eval()
    odd = {"mean": "per sample", "std": 1.0}  # a factory's own notes, not statistics
    written = write_model_files(net, (8,), tmp_path, onnx=False, preprocessing=odd)
    assert [p.name for p, _ in written.files] == ["model.pt2"]
    assert written.input["standardised_in_model"] is False
    with pytest.raises(ExportError, match="--input raw: preprocessing `mean` is 'per sample'"):
        write_model_files(net, (8,), tmp_path, preprocessing=odd, input_form="raw")
    with pytest.raises(ExportError, match="`input_form` is 'cooked'"):
        write_model_files(net, (8,), tmp_path, input_form="cooked")
