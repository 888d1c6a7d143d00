"""Run configuration: one TOML file for a whole search (what ``hpcnas run --config`` reads).

Every table maps onto one frozen dataclass (``Cls(**table)``) that validates its values at
once; an unknown table, key or value raises ``ConfigError`` naming the key and what is
allowed. Example::

    [study]
    name = "digits"
    storage = "sqlite:///nas.db"      # or the OPTUNA_STORAGE environment variable
    directions = ["maximize"]
    n_trials = 40

    [space]
    preset = "digits-small"
    overrides = { max_ranks = 2 }

    [sampler]
    name = "tpe"
    seed = 0

    [distributed]
    group_size = 2
    sync_interval = 2

``load_config(path, overrides=["distributed.group_size=4"])`` applies dotted overrides (TOML
values) on top of the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from dataclasses import replace
import os
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from typing import Any

from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas.checkpoints._config import CheckpointConfig as _CheckpointSettings
from optuna_hpcnas.distributed._config import DistributedConfig

SAMPLERS = ("tpe", "random", "nsga2", "evolutionary", "qubo")
PRUNERS = ("none", "median", "successive_halving", "hyperband", "staged")
DIRECTIONS = ("maximize", "minimize")
METRICS = ("accuracy", "loss", "flops", "params", "latency")
DATASETS = ("digits", "sequence")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("adamw", "sgd")


class ConfigError(ValueError):
    """A run configuration that cannot be used (unknown key or value, wrong type)."""


def _table(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"`{name}` must be a table, but got {value!r}.")


@dataclass(frozen=True)
class StudyConfig:
    """``[study]``: the Optuna study. ``storage`` falls back to ``OPTUNA_STORAGE``; without
    either, one process uses an in-memory study and several processes are refused."""

    name: str = "hpcnas"
    storage: str | None = None
    directions: tuple[str, ...] = ("maximize",)
    n_trials: int | None = None
    timeout: float | None = None
    load_if_exists: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"`name` must be a non-empty string, but got {self.name!r}.")
        if self.storage is not None and not isinstance(self.storage, str):
            raise TypeError(f"`storage` must be a URL string, but got {self.storage!r}.")
        if isinstance(self.directions, str):
            object.__setattr__(self, "directions", (self.directions,))
        object.__setattr__(self, "directions", tuple(self.directions))
        if not self.directions:
            raise ValueError("`directions` is empty; give at least one direction.")
        for d in self.directions:
            check_choice("directions", d, DIRECTIONS)
        check_int("n_trials", self.n_trials, 1, allow_none=True)
        check_number("timeout", self.timeout, allow_none=True)
        if self.n_trials is None and self.timeout is None:
            raise ValueError("Set `n_trials` or `timeout` (or both): the search must end.")

    def resolved_storage(self) -> str | None:
        return self.storage if self.storage is not None else os.environ.get("OPTUNA_STORAGE")


@dataclass(frozen=True)
class SpaceConfig:
    """``[space]``: a named preset (with ``overrides``) or a JSON ``file`` written by
    ``HierarchicalSearchSpace.to_json``."""

    preset: str | None = "digits-small"
    file: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from optuna_hpcnas.search_space._presets import PRESETS

        if self.file is not None:
            if not isinstance(self.file, str):
                raise TypeError(f"`file` must be a path string, but got {self.file!r}.")
            object.__setattr__(self, "preset", None)
        elif self.preset not in PRESETS:
            raise ValueError(f"`preset` is {self.preset!r}, but must be one of {sorted(PRESETS)}.")
        _table("overrides", self.overrides)
        object.__setattr__(self, "overrides", dict(self.overrides))

    def build(self) -> Any:
        """The ``HierarchicalSearchSpace``."""
        from optuna_hpcnas.search_space import HierarchicalSearchSpace

        if self.file is not None:
            data = {**__import__("json").loads(Path(self.file).read_text()), **self.overrides}
            return HierarchicalSearchSpace.from_dict(data)
        assert self.preset is not None
        try:
            return HierarchicalSearchSpace.preset(self.preset, **self.overrides)
        except TypeError as e:
            raise ConfigError(f"[space] overrides: {e}") from None


@dataclass(frozen=True)
class SamplerConfig:
    """``[sampler]``: ``name`` and ``seed``; ``kwargs`` go to the sampler's constructor."""

    name: str = "tpe"
    seed: int | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("name", self.name, SAMPLERS)
        check_int("seed", self.seed, 0, allow_none=True)
        _table("kwargs", self.kwargs)
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def build(self, *, seed_offset: int = 0) -> Any:
        """The Optuna sampler (each group leader adds its group index to the seed, so
        leaders do not propose the same candidates)."""
        import optuna

        seed = None if self.seed is None else self.seed + seed_offset
        kwargs = dict(self.kwargs)
        if self.name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, **kwargs)
        if self.name == "random":
            return optuna.samplers.RandomSampler(seed=seed, **kwargs)
        if self.name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, **kwargs)
        import importlib

        try:
            samplers = importlib.import_module("optuna_hpcnas.samplers")
            cls = getattr(
                samplers, {"evolutionary": "EvolutionarySampler"}.get(self.name, "QUBOSampler")
            )
        except (ImportError, AttributeError):
            raise ConfigError(
                f"[sampler] name = {self.name!r} is not available in this installation "
                "(optuna_hpcnas.samplers lacks it)."
            ) from None
        return cls(seed=seed, **kwargs)


@dataclass(frozen=True)
class PrunerConfig:
    """``[pruner]``: ``name`` and constructor ``kwargs``."""

    name: str = "none"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("name", self.name, PRUNERS)
        _table("kwargs", self.kwargs)
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def build(self) -> Any:
        import optuna

        kw = dict(self.kwargs)
        if self.name == "none":
            return optuna.pruners.NopPruner()
        if self.name == "median":
            return optuna.pruners.MedianPruner(**kw)
        if self.name == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(**kw)
        if self.name == "hyperband":
            return optuna.pruners.HyperbandPruner(**kw)
        try:
            from optuna_hpcnas.pruners import StagedPruner
        except ImportError:
            raise ConfigError(
                "[pruner] name = 'staged' is not available in this installation "
                "(optuna_hpcnas.pruners lacks StagedPruner)."
            ) from None
        return StagedPruner(**kw)


@dataclass(frozen=True)
class TrainingConfig:
    """``[training]`` (alias ``[supernet]``): how each candidate is trained and scored.

    Per trial: ``supernet_steps`` single-path steps of the shared supernet on the candidate's
    path (SGD, ``supernet_lr``), then ``epochs`` epochs of ``steps_per_epoch`` optimizer
    steps (AdamW, ``lr``) fine-tuning the candidate's inherited layers in its engine, with
    the validation metric reported after each epoch (where the pruner decides). With
    ``[pruner] name = "staged"`` the pruner's stage plan sets the epochs and each epoch's
    learning rate instead (the articles' SGD rates: use ``optimizer = "sgd"``).
    """

    epochs: int = 2
    steps_per_epoch: int = 20
    lr: float = 1e-2
    weight_decay: float = 0.0
    supernet_steps: int = 10
    supernet_lr: float = 0.05
    optimizer: str = "adamw"
    momentum: float = 0.9
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("epochs", self.epochs, 1, allow_none=True)
        check_int("steps_per_epoch", self.steps_per_epoch, 1, allow_none=True)
        check_number("lr", self.lr)
        check_number("weight_decay", self.weight_decay, positive=False)
        check_int("supernet_steps", self.supernet_steps, 0, allow_none=True)
        check_number("supernet_lr", self.supernet_lr)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_number("momentum", self.momentum, positive=False)
        check_choice("device", self.device, DEVICES)
        check_int("seed", self.seed, 0, allow_none=True)


@dataclass(frozen=True)
class ObjectiveConfig:
    """``[objective]``: the value(s) returned per trial, one per study direction."""

    metrics: tuple[str, ...] = ("accuracy",)

    def __post_init__(self) -> None:
        if isinstance(self.metrics, str):
            object.__setattr__(self, "metrics", (self.metrics,))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if not self.metrics:
            raise ValueError("`metrics` is empty; give at least one metric.")
        for m in self.metrics:
            check_choice("metrics", m, METRICS)


@dataclass(frozen=True)
class DataConfig:
    """``[data]``: a built-in data set and its split."""

    name: str = "digits"
    validation_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("name", self.name, DATASETS)
        check_number("validation_fraction", self.validation_fraction)
        if not 0 < self.validation_fraction < 1:
            raise ValueError(
                f"`validation_fraction` is {self.validation_fraction}, but must be in (0, 1)."
            )
        check_int("seed", self.seed, 0, allow_none=True)


@dataclass(frozen=True)
class CheckpointConfig(_CheckpointSettings):
    """``[checkpoints]``: the checkpoint component's ``CheckpointConfig`` plus ``enabled``.

    ``enabled`` turns on supernet checkpoints (weights, optimizer, RNG, the runner's cursor)
    in the study's own database every ``every_n_steps`` supernet steps, the top-k
    architectures every ``every_p_trials`` finished trials, and a restore from the newest
    valid checkpoint at start. ``heartbeat_interval``, ``grace_period`` and ``max_retry``
    apply to every RDB storage, enabled or not: a killed worker's trial is retried when the
    search is run again. See ``optuna_hpcnas.checkpoints.CheckpointConfig`` for every key.
    """

    enabled: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"`enabled` must be a bool, but got {self.enabled!r}.")
        super().__post_init__()


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: Prometheus endpoint (served by the metrics component when installed)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9464
    refresh_seconds: float = 2.0  # how often the study-wide series are re-read from storage

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"`enabled` must be a bool, but got {self.enabled!r}.")
        if not isinstance(self.host, str):
            raise TypeError(f"`host` must be a string, but got {self.host!r}.")
        check_int("port", self.port, 0, allow_none=True)
        check_number("refresh_seconds", self.refresh_seconds)


@dataclass(frozen=True)
class RunConfig:
    """A whole search: one field per TOML table."""

    study: StudyConfig
    space: SpaceConfig = field(default_factory=SpaceConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        if len(self.objective.metrics) != len(self.study.directions):
            raise ConfigError(
                f"[objective] metrics has {len(self.objective.metrics)} entries "
                f"({list(self.objective.metrics)}) but [study] directions has "
                f"{len(self.study.directions)} ({list(self.study.directions)}); give one "
                "direction per metric."
            )


SECTIONS: dict[str, type] = {
    "study": StudyConfig,
    "space": SpaceConfig,
    "sampler": SamplerConfig,
    "pruner": PrunerConfig,
    "training": TrainingConfig,
    "supernet": TrainingConfig,
    "objective": ObjectiveConfig,
    "data": DataConfig,
    "distributed": DistributedConfig,
    "checkpoints": CheckpointConfig,
    "metrics": MetricsConfig,
}
_FIELD_OF_SECTION = {"supernet": "training"}


def _section(name: str, table: Any) -> Any:
    cls = SECTIONS[name]
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{name}] must be a table, but got {table!r}.")
    allowed = [f.name for f in fields(cls)]
    for key in table:
        if key not in allowed:
            raise ConfigError(f"Unknown key `{key}` in [{name}]; allowed keys: {allowed}.")
    try:
        return cls(**table)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"[{name}] {e}") from None


def _parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"Override {text!r} must look like `section.key=value`.")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    return key, value


def _apply_overrides(
    data: dict[str, Any], overrides: Mapping[str, Any] | Sequence[str]
) -> dict[str, Any]:
    pairs = (
        list(overrides.items())
        if isinstance(overrides, Mapping)
        else [_parse_override(o) for o in overrides]
    )
    for dotted, value in pairs:
        section, _, key = dotted.partition(".")
        if not key:
            raise ConfigError(f"Override key {dotted!r} must look like `section.key`.")
        if section not in SECTIONS:
            raise ConfigError(f"Unknown section [{section}]; allowed sections: {list(SECTIONS)}.")
        table = data.setdefault(section, {})
        parts = key.split(".")
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value
    return data


def config_from_dict(
    data: Mapping[str, Any], overrides: Mapping[str, Any] | Sequence[str] | None = None
) -> RunConfig:
    """A ``RunConfig`` from parsed TOML (``load_config`` without the file)."""
    data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    if overrides:
        data = _apply_overrides(data, overrides)
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"Unknown section [{unknown[0]}]; allowed sections: {list(SECTIONS)}.")
    if "supernet" in data and "training" in data:
        raise ConfigError("Give [training] or its alias [supernet], not both.")
    if "study" not in data:
        raise ConfigError("The [study] table is missing (it needs at least n_trials or timeout).")
    kwargs = {_FIELD_OF_SECTION.get(k, k): _section(k, v) for k, v in data.items()}
    try:
        return RunConfig(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def load_config(
    path: str | os.PathLike[str],
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> RunConfig:
    """Read a TOML run configuration.

    Args:
        path: The TOML file.
        overrides: ``{"section.key": value}`` or ``["section.key=value", ...]`` (TOML values;
            a bare word is a string) applied on top of the file.

    Raises:
        ConfigError: An unknown table, key or value, with the allowed ones.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "nas.toml"
        >>> _ = p.write_text('[study]\\nn_trials = 4\\n[distributed]\\ngroup_size = 2\\n')
        >>> load_config(p, ["distributed.sync_interval=3"]).distributed.sync_interval
        3
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"Configuration file {str(path)!r} does not exist.") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return config_from_dict(data, overrides)


def with_overrides(config: RunConfig, **sections: Mapping[str, Any]) -> RunConfig:
    """A copy of ``config`` with some keys of some sections replaced (validated again)."""
    changed = {}
    for name, values in sections.items():
        current = getattr(config, _FIELD_OF_SECTION.get(name, name))
        changed[_FIELD_OF_SECTION.get(name, name)] = replace(current, **values)
    return replace(config, **changed)


__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "MetricsConfig",
    "ObjectiveConfig",
    "PrunerConfig",
    "RunConfig",
    "SamplerConfig",
    "SpaceConfig",
    "StudyConfig",
    "TrainingConfig",
    "config_from_dict",
    "load_config",
    "with_overrides",
]
