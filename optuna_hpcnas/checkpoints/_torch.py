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
    """Load what :func:`training_state` saved into ``model``/``optimizer``; returns metadata.

    A checkpoint whose content does not fit (no optimizer state, malformed optimizer metadata,
    a missing or misshapen tensor) raises :class:`CheckpointError` naming it and leaves
    ``model`` and ``optimizer`` as they were (``torch``'s ``load_state_dict`` may have copied
    part of it before it failed).
    """
    import copy

    import torch

    from optuna_hpcnas.checkpoints._manager import CheckpointError

    name = checkpoint.info.checkpoint_id
    state = checkpoint.state()
    meta = checkpoint.metadata
    optimizer_state = None
    if optimizer is not None:
        try:
            optimizer_state = _optimizer_state(state, meta)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(
                f"checkpoint {name!r} holds no usable optimizer state ({e!r})"
            ) from None
    saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    try:
        model.load_state_dict(
            {k[len(_MODEL) :]: v for k, v in state.items() if k.startswith(_MODEL)},
            strict=strict,
        )
        if optimizer is not None:
            optimizer.load_state_dict(optimizer_state)  # type: ignore[arg-type]
        for gen_name, gen in (generators or {}).items():
            gen.set_state(state[_RNG + gen_name])
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        model.load_state_dict(saved_model)
        if optimizer is not None and saved_optimizer is not None:
            optimizer.load_state_dict(saved_optimizer)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {name!r} does not fit this model: {first}") from None
    if _RNG + "torch" in state:
        torch.set_rng_state(state[_RNG + "torch"])
    return dict(meta)


def _optimizer_state(state: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer ``state_dict`` a checkpoint describes (``KeyError``/``TypeError``/
    ``ValueError`` when the metadata is not what :func:`training_state` writes)."""
    optimizer_meta = meta["optimizer"]
    scalars, groups = optimizer_meta["scalars"], optimizer_meta["param_groups"]
    if not isinstance(scalars, dict) or not isinstance(groups, list):
        raise TypeError("scalars must be an object and param_groups a list")
    per_param: dict[int, dict[str, Any]] = {}
    for idx, values in scalars.items():
        per_param.setdefault(int(idx), {}).update(values)
    for k, v in state.items():
        if k.startswith(_OPTIM):
            idx, key = k[len(_OPTIM) :].split(".", 1)
            per_param.setdefault(int(idx), {})[key] = v
    return {"state": per_param, "param_groups": groups}
