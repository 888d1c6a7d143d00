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
import warnings

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.search_space import Architecture

_logger = logging.getLogger(__name__)


# The tasks that ship with the package, by domain: (input shape without batch, classes).
_DEFAULT_TASKS = {"image": ((1, 8, 8), 10), "sequence": ((16, 8), 4)}


def build_module(
    study: optuna.Study,
    arch: Architecture,
    *,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
) -> tuple[Any, tuple[int, ...]]:
    """The standalone subnet of ``arch`` (``SuperNet(...).subnet(arch)``) and its input shape.

    ``weights`` is a supernet ``state_dict`` saved with ``torch.save`` (read with
    ``weights_only=True``); without it the subnet inherits the weights of the newest supernet
    checkpoint ``hpcnas run`` saved in the study's database (``[checkpoints] enabled``), or
    keeps the supernet's initial weights when there is none.
    """
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

    space = HierarchicalSearchSpace.from_study(study)
    if space is None:
        raise ValueError(
            "the study records no search space (HierarchicalSearchSpace.suggest records it)"
        )
    shape, classes = _DEFAULT_TASKS[space.domain]
    shape = tuple(input_shape) if input_shape is not None else shape
    classes = num_classes if num_classes is not None else classes
    import torch

    from optuna_hpcnas.supernet import SuperNet

    net = SuperNet(space, input_shape=shape, num_classes=classes, seed=seed)
    if weights is not None:
        state = torch.load(str(weights), map_location="cpu", weights_only=True)
        net.load_state_dict(state)
    elif not _load_checkpoint(study, net):
        _logger.warning(
            "No supernet weights given (--weights) and no supernet checkpoint in the study: "
            "the module has initial weights; train it "
            "(optuna_hpcnas.evaluation.train_from_scratch) before use."
        )
    return net.eval().subnet(arch).eval(), shape


def export_architecture(
    study: optuna.Study,
    trial: FrozenTrial,
    arch: Architecture,
    out: Path,
    *,
    onnx: bool = True,
    input_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
    weights: str | Path | None = None,
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
        module, shape = build_module(
            study, arch, input_shape=input_shape, num_classes=num_classes, weights=weights
        )
    except ImportError as e:
        _logger.warning("No PyTorch module written (install optuna-hpcnas[torch]): %s.", e)
        return written
    import torch

    # Batch 2 in the example: a batch of 1 would be specialised into the program.
    example = (torch.randn(2, *shape),)
    program = torch.export.export(module, example, dynamic_shapes=({0: torch.export.Dim.AUTO},))
    path = out / "model.pt2"
    torch.export.save(program, str(path))
    written.append((path, f"torch.export program, input (N, {', '.join(map(str, shape))})"))
    if onnx:
        path = out / "model.onnx"
        try:
            with warnings.catch_warnings():
                # The tracer warns about Python branches on static shapes: constants here.
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                warnings.simplefilter("ignore", DeprecationWarning)  # torch's own exporter
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


def _load_checkpoint(study: optuna.Study, net: Any) -> bool:
    """Load the newest valid ``supernet`` checkpoint of the study into ``net``, if any."""
    try:
        from optuna_hpcnas.checkpoints import CheckpointManager
        from optuna_hpcnas.checkpoints import RDBArtifactStore

        store = RDBArtifactStore(study._storage)  # type: ignore[arg-type]
    except (ImportError, TypeError):
        return False  # not an RDB storage, or the checkpoint component is not installed
    latest = CheckpointManager(study=study, artifact_store=store).load_latest()
    if latest is None:
        return False
    try:
        prefix = "model."  # the layout of checkpoints.training_state
        net.load_state_dict(
            {k[len(prefix) :]: v for k, v in latest.state().items() if k.startswith(prefix)}
        )
    except RuntimeError as e:  # another input shape or class count than the search used
        _logger.warning(
            "Supernet checkpoint %s does not fit this module (%s): initial weights used.",
            latest.info.checkpoint_id,
            e,
        )
        return False
    _logger.info(
        "Inherited weights from supernet checkpoint %s (step %d).",
        latest.info.checkpoint_id,
        latest.step,
    )
    return True
