"""Flatten a torch training state (model, optimizer, RNG) into tensors + JSON, and back.

The checkpoint format stores flat ``name -> tensor`` maps only, so the optimizer's nested
``state_dict`` is split: tensors become ``optimizer.state.<param>.<key>`` records and the
scalars and ``param_groups`` go to the JSON metadata. Nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from optuna_hpcnas.checkpoints._manager import Checkpoint

_MODEL = "model."
_OPTIM = "optimizer.state."
_RNG = "rng."


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    generators: Mapping[str, torch.Generator] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, metadata)`` for :meth:`CheckpointManager.save`.

    Args:
        model: Its ``state_dict`` becomes ``model.<key>`` tensors.
        optimizer: Its state tensors become ``optimizer.state.<idx>.<key>``; scalars and
            ``param_groups`` go to the metadata.
        generators: Extra ``torch.Generator`` objects (data order, path sampling) saved as
            ``rng.<name>`` next to the global CPU RNG (``rng.torch``).
        extra: JSON metadata to add (step counters, sampler cursor).
    """
    import torch

    tensors: dict[str, Any] = {_MODEL + k: v for k, v in model.state_dict().items()}
    metadata: dict[str, Any] = dict(extra or {})
    if optimizer is not None:
        sd = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for idx, per_param in sd["state"].items():
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{_OPTIM}{idx}.{key}"] = value
                else:
                    scalars.setdefault(str(idx), {})[key] = value
        metadata["optimizer"] = {"param_groups": sd["param_groups"], "scalars": scalars}
    tensors[_RNG + "torch"] = torch.get_rng_state()
    for name, gen in (generators or {}).items():
        tensors[_RNG + name] = gen.get_state()
    return tensors, metadata


def restore_training_state(
    checkpoint: Checkpoint,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    generators: Mapping[str, torch.Generator] | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Load what :func:`training_state` saved into ``model``/``optimizer``; returns metadata."""
    import torch

    state = checkpoint.state()
    model.load_state_dict(
        {k[len(_MODEL) :]: v for k, v in state.items() if k.startswith(_MODEL)}, strict=strict
    )
    meta = checkpoint.metadata
    if optimizer is not None:
        if "optimizer" not in meta:
            raise ValueError(
                f"Checkpoint {checkpoint.info.checkpoint_id!r} holds no optimizer state."
            )
        per_param: dict[int, dict[str, Any]] = {}
        for idx, scalars in meta["optimizer"]["scalars"].items():
            per_param.setdefault(int(idx), {}).update(scalars)
        for k, v in state.items():
            if k.startswith(_OPTIM):
                idx, key = k[len(_OPTIM) :].split(".", 1)
                per_param.setdefault(int(idx), {})[key] = v
        optimizer.load_state_dict(
            {"state": per_param, "param_groups": meta["optimizer"]["param_groups"]}
        )
    if _RNG + "torch" in state:
        torch.set_rng_state(state[_RNG + "torch"])
    for name, gen in (generators or {}).items():
        gen.set_state(state[_RNG + name])
    return dict(meta)
