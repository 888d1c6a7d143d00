"""``hpcnas export``: a trial's architecture, trained, as files that run without optuna-hpcnas.

The architecture is trained before it is written (``mode``):

* ``"retrain"`` (the default): from scratch with the ``[export]`` recipe
  (``ScratchTrainingConfig``: Adam, cosine-decayed lr, a budget of optimisation steps) on the
  run's training and validation splits (the search has used the validation split to choose
  the architecture; the export learns from it too);
* ``"finetune"``: the same recipe, starting from the supernet's inherited weights (a
  ``--weights`` file, or the newest supernet checkpoint of the study);
* ``"untrained"``: no training at all (explicit only: such a model predicts at chance).

It is then scored on the held-out test split, which the search never saw. Files:

* ``architecture.json`` — the architecture, the trial values and the export's accuracies;
* ``model.pt2`` — the trained subnet as a ``torch.export`` program
  (``torch.export.load(path).module()``: a runnable module, no class of ours, no pickle);
* ``model.onnx`` — the same graph for ONNX runtimes, written by ``hpcnas deploy``'s exporter
  (``optuna_hpcnas.evaluation._onnx.export_onnx``: one export path for both commands).

Both take the model's own inputs (the task's standardised samples) unless ``input_form="raw"``
puts the recorded standardisation in front of them; ``architecture.json`` says which. The
files are staged and moved into ``out`` together (``deploy._outdir``): an existing symbolic
link there is replaced, never followed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
import json
import logging
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING
import warnings

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial
    from torch import nn

    from optuna_hpcnas.data import TaskData
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.search_space import Architecture

_logger = logging.getLogger(__name__)
MODES = ("retrain", "finetune", "untrained")
INPUTS = ("standardised", "raw")


class ExportError(ValueError):
    """An export that cannot be made (no weights to fine-tune from, a bad weights file, a
    training that diverged)."""


@dataclass(frozen=True)
class ExportResult:
    """What ``export_trial`` wrote and measured."""

    files: list[tuple[Path, str]] = field(default_factory=list)
    mode: str = "retrain"
    metrics: dict[str, Any] = field(default_factory=dict)
    module: Any = None


def trained_module(
    study: optuna.Study,
    arch: Architecture,
    data: TaskData,
    *,
    mode: str,
    recipe: ScratchTrainingConfig,
    weights: str | Path | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The subnet of ``arch`` for ``data``, trained as ``mode`` says, and its metrics
    (``train_model``'s keys; for ``untrained`` only the accuracies)."""
    from optuna_hpcnas.evaluation import evaluate
    from optuna_hpcnas.evaluation import NonFiniteLossError
    from optuna_hpcnas.evaluation import train_model
    from optuna_hpcnas.search_space import HierarchicalSearchSpace
    from optuna_hpcnas.supernet import Precision
    from optuna_hpcnas.supernet import SuperNet

    if mode not in MODES:
        raise ExportError(f"`mode` is {mode!r}, but must be one of {list(MODES)}.")
    if mode != "untrained" and Precision(recipe.precision) == Precision.FP16:
        raise ExportError(
            "[export] precision is 'fp16', which needs a GPU, but the export trains on the "
            "CPU: use 'bf16' or 'fp32'"
        )
    space = HierarchicalSearchSpace.from_study(study)
    if space is None:
        raise ExportError(
            "the study records no search space (HierarchicalSearchSpace.suggest records it)"
        )
    net = SuperNet(
        space, input_shape=data.input_shape, num_classes=data.num_classes, seed=recipe.seed
    )
    if mode != "retrain":
        inherited = _load_weights(study, net, weights)
        if not inherited and mode == "finetune":
            raise ExportError(
                "--finetune needs supernet weights: pass --weights FILE or run the search "
                "with [checkpoints] enabled = true; or drop --finetune to retrain from scratch"
            )
    module = net.subnet(arch)
    del net
    if mode == "untrained":
        _logger.warning("Exporting an untrained module (--untrained): it predicts at chance.")
        module.eval()
        valid, _ = evaluate(module, data.valid)
        test, _ = evaluate(module, data.test)
        return module, {"valid_accuracy": valid, "test_accuracy": test, "steps": 0}
    try:
        metrics = train_model(module, data, recipe)
    except NonFiniteLossError as e:  # the recipe's fault, not a bug: one line, no traceback
        raise ExportError(f"training diverged: {e}") from None
    return module.eval(), metrics


def export_trial(
    study: optuna.Study,
    trial: FrozenTrial,
    arch: Architecture,
    out: Path,
    *,
    data: TaskData,
    recipe: ScratchTrainingConfig,
    mode: str = "retrain",
    weights: str | Path | None = None,
    onnx: bool = True,
    input_form: str = "standardised",
) -> ExportResult:
    """Train ``arch`` (see the module docstring) and write its files into ``out``."""
    from optuna_hpcnas.deploy._outdir import staged

    if input_form not in INPUTS:
        raise ExportError(f"`input_form` is {input_form!r}, but must be one of {list(INPUTS)}.")
    module, metrics = trained_module(study, arch, data, mode=mode, recipe=recipe, weights=weights)
    meta = {
        "study": study.study_name,
        "trial": trial.number,
        "values": trial.values,
        "architecture": arch.to_dict(),
        "summary": arch.describe(),
        "export": {
            "mode": mode,
            "recipe": vars(recipe).copy(),
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "data": data.name,
            **{k: metrics[k] for k in ("valid_accuracy", "test_accuracy", "steps")},
        },
    }
    with staged(out) as stage:
        written = write_model_files(
            module.cpu().eval(), data.input_shape, stage.path, onnx=onnx,
            preprocessing=data.preprocessing, input_form=input_form,
        )  # fmt: skip
        meta["input"] = written.input
        (stage.path / "architecture.json").write_text(json.dumps(meta, indent=2) + "\n")
        names = ["architecture.json", *(path.name for path, _ in written.files)]
        if not onnx or "model.onnx" not in names:
            stage.remove("model.onnx")  # an older export's ONNX file would not match
        stage.commit(names)
    files = [(out / "architecture.json", "architecture, trial values, export accuracies")]
    files += [(out / path.name, what) for path, what in written.files]
    return ExportResult(files=files, mode=mode, metrics=metrics, module=module)


@dataclass(frozen=True)
class ModelFiles:
    """What ``write_model_files`` wrote (path, description) and what the models take."""

    files: list[tuple[Path, str]]
    input: dict[str, Any]


def write_model_files(
    module: nn.Module,
    shape: tuple[int, ...],
    out: Path,
    *,
    onnx: bool = True,
    preprocessing: Mapping[str, Any] | None = None,
    input_form: str = "standardised",
) -> ModelFiles:
    """``model.pt2`` (``torch.export``) and ``model.onnx`` (``export_onnx``, as ``hpcnas
    deploy`` writes it) into ``out``; with ``input_form="raw"`` both start with the standardisation
    recorded in ``preprocessing``."""
    import torch

    from optuna_hpcnas.deploy._preprocess import model_for_export
    from optuna_hpcnas.evaluation._onnx import export_onnx

    if input_form not in INPUTS:
        raise ExportError(f"`input_form` is {input_form!r}, but must be one of {list(INPUTS)}.")
    try:
        module, info = model_for_export(
            module, preprocessing, tuple(shape), standardise=input_form == "raw"
        )
    except ValueError as e:  # a task whose recorded standardisation cannot be applied
        raise ExportError(f"--input raw: {e}") from None
    written: list[tuple[Path, str]] = []
    # Batch 2 in the example: a batch of 1 would be specialised into the program.
    example = (torch.randn(2, *shape),)
    with warnings.catch_warnings():
        # nn.GRU keeps its weights in a list torch.export reads as attributes: harmless.
        warnings.filterwarnings(
            "ignore", message=".*were assigned during export", category=UserWarning
        )
        program = torch.export.export(
            module, example, dynamic_shapes=({0: torch.export.Dim.AUTO},)
        )
    path = out / "model.pt2"
    torch.export.save(program, str(path))
    written.append((path, f"torch.export program, input (N, {', '.join(map(str, shape))})"))
    if not onnx:
        return ModelFiles(written, info)
    path = out / "model.onnx"
    try:
        export_onnx(module, path, tuple(shape))
    except ImportError as e:
        _logger.warning("No ONNX file: %s", e)
    except Exception as e:  # torch raises many exporter error types
        _logger.warning("No ONNX file: torch could not export this module (%s).", e)
        path.unlink(missing_ok=True)
    else:
        written.append((path, "ONNX (opset 18, dynamic batch)"))
    return ModelFiles(written, info)


def _load_weights(study: optuna.Study, net: Any, weights: str | Path | None) -> bool:
    """Supernet weights from ``weights`` (a ``torch.save`` state_dict, read with
    ``weights_only=True``) or the study's newest checkpoint; whether any were loaded."""
    import torch

    if weights is not None:
        try:
            state = torch.load(str(weights), map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ExportError(f"--weights {str(weights)!r}: no such file") from None
        except Exception as e:  # not a torch file, or one that needs unpickling code
            raise ExportError(
                f"--weights {str(weights)!r} is not a supernet state_dict saved with "
                f"torch.save ({type(e).__name__})"
            ) from None
        if not isinstance(state, dict):
            raise ExportError(
                f"--weights {str(weights)!r} holds a {type(state).__name__}, not a state_dict"
            )
        try:
            net.load_state_dict(state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise ExportError(
                f"--weights {str(weights)!r} does not fit this supernet: {first}"
            ) from None
        return True
    return _load_checkpoint(study, net)


def _load_checkpoint(study: optuna.Study, net: Any) -> bool:
    """Load the newest valid ``supernet`` checkpoint of the study into ``net``, if any."""
    from optuna_hpcnas.storages import artifact_store_for
    from optuna_hpcnas.storages import StorageError

    try:
        from optuna_hpcnas.checkpoints import CheckpointManager

        store = artifact_store_for(study._storage, artifact_store=None)
    except (ImportError, TypeError, StorageError):
        return False  # no checkpoint store on this storage, or the component is missing
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
            "Supernet checkpoint %s does not fit this module (%s): not used.",
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
