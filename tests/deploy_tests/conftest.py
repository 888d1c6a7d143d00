"""A small trained digits model and one deployment of it, shared by the deploy tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def digits_architecture(first: str = "conv3x3", second: str = "sepconv3x3") -> Any:
    from optuna_hpcnas import Architecture
    from optuna_hpcnas import CellConfig
    from optuna_hpcnas import ClusterConfig

    return Architecture(
        "residual",
        (CellConfig(first, width=32), CellConfig(second, width=32), CellConfig("maxpool3x3")),
        ClusterConfig(1, 1, 64),
    )


def train_digits(arch: Any, *, epochs: int = 6) -> tuple[Any, Any]:
    """A subnet of ``arch`` trained on digits for a few epochs, and the task data."""
    import torch.nn.functional as F

    from optuna_hpcnas import HierarchicalSearchSpace
    from optuna_hpcnas.data import iterate_batches
    from optuna_hpcnas.data import load_digits_task
    from optuna_hpcnas.supernet import SuperNet

    torch.manual_seed(0)
    data = load_digits_task(seed=0)
    space = HierarchicalSearchSpace.preset("digits-small")
    net = SuperNet(space, input_shape=(1, 8, 8), num_classes=10, seed=0).subnet(arch).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for x, y in iterate_batches(data.train, 32, shuffle=True, generator=generator):
            optimizer.zero_grad()
            F.cross_entropy(net(x), y).backward()
            optimizer.step()
    return net.eval(), data


def raw_digits(x: Any, preprocessing: Any) -> np.ndarray:
    """Standardised digits back to the raw pixels scikit-learn ships (integers 0-16)."""
    raw = np.asarray(x) * preprocessing["std"] + preprocessing["mean"]
    pixels = np.round(raw)
    assert np.abs(raw - pixels).max() < 1e-3 and pixels.min() >= 0 and pixels.max() <= 16
    return pixels.astype(np.float32)


@pytest.fixture(scope="session")
def trained() -> tuple[Any, Any]:
    return train_digits(digits_architecture())


@pytest.fixture(scope="session")
def deployed(trained: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(directory, report, model, data)`` of one deploy_model run."""
    from optuna_hpcnas.deploy import deploy_model
    from optuna_hpcnas.evaluation import evaluate

    net, data = trained
    out: Path = tmp_path_factory.mktemp("deploy") / "digits"
    estimate, _ = evaluate(net, data.valid)
    report = deploy_model(
        net,
        out=out,
        input_shape=(1, 8, 8),
        calibration=data.train,
        holdout=data.test,
        estimate=estimate,
        margin=0.05,
        preprocessing={**data.preprocessing, "layout": "NCHW"},
        name="digits",
        metadata={"trial": 7},
        latency_repeats=20,
    )
    return out, report, net, data
