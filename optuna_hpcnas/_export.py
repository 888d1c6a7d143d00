"""``hpcnas export``: a trial's architecture as files that run without optuna-hpcnas.

* ``architecture.json`` — the architecture (``Architecture.from_json`` reads it back);
* ``model.pt2`` — the subnet as a ``torch.export`` program: ``torch.export.load(path).module()``
  gives a runnable ``nn.Module`` with its weights, no Python class of ours needed, no pickle;
* ``model.onnx`` — the same graph for ONNX runtimes, where torch can export it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.search_space import Architecture

_logger = logging.getLogger(__name__)


def _build_module(
    study: optuna.Study, arch: Architecture, input_shape: tuple[int, ...] | None
) -> tuple[Any, tuple[int, ...]]:
    """The standalone subnet of ``arch`` and its example input shape (without batch)."""
    raise NotImplementedError("the supernet is not available in this build")


def export_architecture(
    study: optuna.Study,
    trial: FrozenTrial,
    arch: Architecture,
    out: Path,
    *,
    onnx: bool = True,
    input_shape: tuple[int, ...] | None = None,
) -> list[tuple[Path, str]]:
    """Write the files above into ``out``; returns ``(path, description)`` pairs."""
    written: list[tuple[Path, str]] = []
    meta = {
        "study": study.study_name,
        "trial": trial.number,
        "values": trial.values,
        "architecture": arch.to_dict(),
        "summary": arch.describe(),
    }
    path = out / "architecture.json"
    path.write_text(json.dumps(meta, indent=2) + "\n")
    written.append((path, "architecture and trial values"))
    try:
        module, shape = _build_module(study, arch, input_shape)
    except (ImportError, NotImplementedError) as e:
        _logger.warning("No PyTorch module written: %s.", e)
        return written
    import torch

    module.eval()
    example = (torch.randn(1, *shape),)
    program = torch.export.export(module, example)
    path = out / "model.pt2"
    torch.export.save(program, str(path))
    written.append((path, f"torch.export program, input (N, {', '.join(map(str, shape))})"))
    if onnx:
        path = out / "model.onnx"
        try:
            torch.onnx.export(
                module,
                example,
                str(path),
                input_names=["input"],
                output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                dynamo=False,
            )
        except Exception as e:  # ONNX export depends on the operators and installed extras
            _logger.warning("No ONNX file: torch could not export this module (%s).", e)
            path.unlink(missing_ok=True)
        else:
            written.append((path, "ONNX"))
    return written
