"""Run configuration: one TOML file for a whole search (what ``hpcnas run --config`` reads).

Every table maps onto one frozen dataclass that validates its values at once; an unknown
table, key or value raises ``ConfigError`` naming the key and what is allowed. The tables
that configure a component take that component's own class, so the Python API and the file
accept the same fields: ``[objective]`` is ``ObjectiveConfig``, ``[training]`` is
``SupernetTrainingConfig`` (plus ``device`` and ``threads``), ``[stages]`` is ``StagePlan``,
``[export]`` is ``ScratchTrainingConfig``, ``[checkpoints]`` is ``CheckpointConfig`` and
``[distributed]`` is ``DistributedConfig``. Example::

    [study]
    name = "digits"
    storage = "sqlite:///nas.db"      # or the OPTUNA_STORAGE environment variable
    n_trials = 40

    [space]
    preset = "digits-small"

    [sampler]
    name = "evolutionary"
    seed = 0

    [pruner]
    name = "staged"

    [distributed]
    group_size = 2

``load_config(path, overrides=["distributed.group_size=4"])`` applies dotted overrides (TOML
values) on top of the file; ``hpcnas run --set`` uses the same parser.
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
import re
import sys
from typing import Any

from optuna_hpcnas._validation import check_bool
from optuna_hpcnas._validation import check_str

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from optuna_hpcnas._validation import check_choice
from optuna_hpcnas._validation import check_int
from optuna_hpcnas._validation import check_number
from optuna_hpcnas._validation import check_seed
from optuna_hpcnas._validation import check_table
from optuna_hpcnas._validation import ConfigError
from optuna_hpcnas.checkpoints._config import CheckpointConfig
from optuna_hpcnas.distributed._config import DistributedConfig
from optuna_hpcnas.evaluation._config import DIRECTIONS as OBJECTIVE_DIRECTIONS
from optuna_hpcnas.evaluation._config import ObjectiveConfig
from optuna_hpcnas.samplers._config import SamplerConfig

PRUNERS = ("none", "median", "successive_halving", "hyperband", "staged")
DIRECTIONS = ("maximize", "minimize")
DATASETS = ("digits", "mnist1d", "sequence", "npz", "aeon", "image_folder", "cifar10")
DEVICES = ("auto", "cpu", "cuda")
UNEQUAL_LENGTHS = ("resize", "pad", "refuse")
MISSING = ("impute", "refuse")
DEFAULT_STORAGE = "sqlite:///{name}.db"
# The most trials one run queues: its budget is a row per trial in the storage, written before
# the search starts (a billion-trial budget would spend minutes queueing and never search).
MAX_TRIALS = 100_000


def _table(name: str, value: Any) -> None:
    check_table(name, value)


@dataclass(frozen=True)
class StudyConfig:
    """``[study]``: the Optuna study.

    ``storage`` falls back to ``OPTUNA_STORAGE``, then to ``sqlite:///<name>.db`` in the
    working directory (logged). ``directions`` default to those of ``[objective]
    objectives``.
    """

    name: str = "hpcnas"
    storage: str | None = None
    directions: tuple[str, ...] | None = None
    n_trials: int | None = None
    timeout: float | None = None
    load_if_exists: bool = True
    enqueue: tuple[str | Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_str("name", self.name, what="a non-empty string", nonempty=True)
        check_str("storage", self.storage, what="a URL string", nonempty=True, allow_none=True)
        if self.directions is not None:
            directions = (
                (self.directions,) if isinstance(self.directions, str) else self.directions
            )
            object.__setattr__(self, "directions", tuple(directions))
            if not directions:
                raise ValueError("`directions` is empty; give at least one direction.")
            for d in directions:
                check_choice("directions", d, DIRECTIONS)
        check_int("n_trials", self.n_trials, 1, maximum=MAX_TRIALS, allow_none=True)
        check_number("timeout", self.timeout, allow_none=True)
        if self.n_trials is None and self.timeout is None:
            raise ValueError("Set `n_trials` or `timeout` (or both): the search must end.")
        check_bool("load_if_exists", self.load_if_exists)
        if isinstance(self.enqueue, (str, Mapping)) or not isinstance(self.enqueue, Sequence):
            raise TypeError(
                "`enqueue` must be a list of model names or parameter tables, "
                f"but got {self.enqueue!r}."
            )
        for entry in self.enqueue:
            if not isinstance(entry, (str, Mapping)):
                raise TypeError(
                    f"`enqueue` entries are model names or parameter tables, but got {entry!r}."
                )
        object.__setattr__(self, "enqueue", tuple(self.enqueue))

    def resolved_storage(self) -> str:
        """``storage``, else ``$OPTUNA_STORAGE``, else the SQLite file of the study."""
        if self.storage is not None:
            return self.storage
        return os.environ.get("OPTUNA_STORAGE") or DEFAULT_STORAGE.format(name=self.name)


@dataclass(frozen=True)
class SpaceConfig:
    """``[space]``: a named preset (with ``overrides``) or a JSON ``file`` written by
    ``HierarchicalSearchSpace.to_json``; ``target`` (``"onnx-cpu"``, ``"tensorrt"``,
    ``"npu-no-grouped"``) removes the operators that deployment target cannot run.
    ``[[space.operator]]`` tables add a user's operators to every cell's choices: ``name``,
    ``factory`` (``"package.module:function"`` returning an ``optuna_hpcnas.supernet.SharedOp``
    for ``(spec=, domain=, channels=)``) and any other ``OperatorSpec`` field (``family``
    defaults to the name, ``domains`` to the space's)."""

    preset: str | None = "digits-small"
    file: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    target: str | None = None
    operator: Sequence[Mapping[str, Any]] = ()

    def __post_init__(self) -> None:
        from optuna_hpcnas.search_space._presets import PRESETS

        if self.file is not None:
            check_str("file", self.file, what="a path string")
            object.__setattr__(self, "preset", None)
        elif self.preset not in PRESETS:
            raise ValueError(f"`preset` is {self.preset!r}, but must be one of {sorted(PRESETS)}.")
        _table("overrides", self.overrides)
        object.__setattr__(self, "overrides", dict(self.overrides))
        if self.target is not None:
            from optuna_hpcnas.search_space._targets import target_profile

            target_profile(self.target)  # an unknown name raises, naming the known ones
        if not isinstance(self.operator, Sequence) or isinstance(self.operator, str):
            raise TypeError(f"`operator` must be a list of tables, but got {self.operator!r}.")
        for table in self.operator:
            _table("operator", table)
            for key in ("name", "factory"):
                if not isinstance(table.get(key), str) or not table[key]:
                    raise ValueError(f"every [[space.operator]] needs a `{key}` string")
        object.__setattr__(self, "operator", tuple(dict(t) for t in self.operator))

    def _registry(self, domain: str) -> Any:
        """The built-in operators and the ``[[space.operator]]`` ones (factories imported)."""
        from optuna_hpcnas._imports import import_object
        from optuna_hpcnas.search_space import OperatorRegistry
        from optuna_hpcnas.search_space import OperatorSpec

        registry = OperatorRegistry.default()
        for table in self.operator:
            fields_ = {"family": table["name"], "domains": [domain], **table}
            factory = fields_["factory"] = import_object(table["factory"])
            if not callable(factory):
                raise ValueError(f"operator {table['name']!r}: {factory!r} is not callable")
            registry.register(OperatorSpec(**fields_))
        return registry

    def build(self) -> Any:
        """The ``HierarchicalSearchSpace``."""
        import json

        from optuna_hpcnas.search_space import HierarchicalSearchSpace
        from optuna_hpcnas.search_space._presets import PRESETS

        target = {} if self.target is None else {"target": self.target}
        try:
            if self.file is not None:
                try:
                    data = json.loads(Path(self.file).read_text())
                except (OSError, ValueError) as e:
                    raise ConfigError(f"[space] file {self.file!r}: {e}") from None
                data = {**data, **self.overrides}
            else:
                assert self.preset is not None
                data = {**PRESETS[self.preset], **self.overrides}
            registry = None
            if self.operator:
                own = [t["name"] for t in self.operator]
                data["operators"] = (*[o for o in data["operators"] if o not in own], *own)
                registry = self._registry(str(data.get("domain", "image")))
            return HierarchicalSearchSpace.from_dict({**data, **target}, registry=registry)
        except (TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"[space] {e}") from None


@dataclass(frozen=True)
class PrunerConfig:
    """``[pruner]``: ``name`` and constructor ``kwargs``. ``staged`` takes the ``[stages]``
    plan unless its kwargs give one."""

    name: str = "staged"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("name", self.name, PRUNERS)
        _table("kwargs", self.kwargs)
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def build(self, stages: Any = None) -> Any:
        import optuna

        kw = dict(self.kwargs)
        try:
            if self.name == "none":
                return optuna.pruners.NopPruner()
            if self.name == "median":
                return optuna.pruners.MedianPruner(**kw)
            if self.name == "successive_halving":
                return optuna.pruners.SuccessiveHalvingPruner(**kw)
            if self.name == "hyperband":
                return optuna.pruners.HyperbandPruner(**kw)
            from optuna_hpcnas.pruners import StagedPruner

            if "plan" not in kw and stages is not None:
                kw["plan"] = stages
            return StagedPruner(**kw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"[pruner] kwargs: {e}") from None


@dataclass(frozen=True)
class DataConfig:
    """``[data]``: the task the search runs on.

    Args:
        name: ``digits`` (scikit-learn's, offline), ``mnist1d`` (MNIST-1D, made on this machine
            by the ``mnist1d`` package's generator: 4,000 training and 1,000 test signals of
            length 40; extra ``mnist1d``), ``sequence`` (synthetic), ``npz`` (arrays
            ``x_train, y_train`` and optionally ``x_valid, y_valid, x_test, y_test`` in
            ``path``), ``aeon`` (time series in aeon's ``.ts`` format: a set aeon ships,
            ``dataset``, or a ``*_TRAIN.ts`` file, ``path``, whose ``*_TEST.ts`` twin is the
            test split; extra ``aeon``), ``image_folder`` (``root/train/<class>/*.png``,
            optional ``val/`` and ``test/``) or ``cifar10`` (CIFAR-10's files already in
            ``root``; never downloaded).
        path: The ``.npz`` file, or the ``*_TRAIN.ts`` file.
        dataset: ``name = "aeon"``: a classification set aeon ships (``"GunPoint"``,
            ``"ItalyPowerDemand"``, ``"BasicMotions"``, ...), read offline.
        root: The image folder or the CIFAR-10 directory.
        factory: ``"package.module:function"`` returning a ``TaskData`` (called with
            ``seed=`` and ``factory_kwargs``); replaces ``name``.
        factory_kwargs: Keyword arguments of ``factory``.
        validation_fraction: Share of the training data held out for validation when the
            source has no validation split (and for the test split when it has none).
        seed: Seed of the splits.
        generator_seed: Seed of a generated data set's own generator (``mnist1d``: the
            package's 42, the published draw, when ``None``); another value is another draw.
        normalize: Standardise inputs with the training statistics (per channel for images).
        image_size: ``[height, width]`` images are resized to (``image_folder``); default:
            the size of the first image, every other must match.
        max_samples: Use at most this many training samples (``None``: all).
        unequal_length: ``name = "aeon"``: what becomes of series of unequal length.
            ``"resize"``: resampled by linear interpolation to the longest training length
            (aeon's ``Resizer``); ``"pad"``: zeros appended up to it (aeon's ``Padder``;
            longer test series are cut, ``Truncator``); ``"refuse"``: one-line error. Sets of
            one length are left as they are.
        missing: ``name = "aeon"``: what becomes of missing values, before any resizing or
            padding. ``"impute"``: the mean of their series and channel (aeon's
            ``SimpleImputer``; 0 for a channel with no value); ``"refuse"``: one-line error.
    """

    name: str = "digits"
    path: str | None = None
    dataset: str | None = None
    root: str | None = None
    factory: str | None = None
    factory_kwargs: Mapping[str, Any] = field(default_factory=dict)
    validation_fraction: float = 0.2
    seed: int = 0
    generator_seed: int | None = None
    normalize: bool = True
    image_size: tuple[int, int] | None = None
    max_samples: int | None = None
    unequal_length: str = "resize"
    missing: str = "impute"

    def __post_init__(self) -> None:
        check_choice("name", self.name, DATASETS)
        for key in ("path", "root", "dataset"):
            check_str(
                key, getattr(self, key), what="a path string", nonempty=True, allow_none=True
            )
        if self.factory is not None and (
            not isinstance(self.factory, str) or not re.fullmatch(r"[\w.]+:[\w.]+", self.factory)
        ):
            raise ValueError(
                f"`factory` is {self.factory!r}, but must look like 'package.module:function'."
            )
        if self.factory is None:
            if self.name == "npz" and self.path is None:
                raise ValueError("[data] name = 'npz' needs `path` (the .npz file).")
            if self.name == "aeon" and (self.path is None) == (self.dataset is None):
                raise ValueError(
                    "[data] name = 'aeon' needs either `dataset` (a set aeon ships, e.g. "
                    "'GunPoint') or `path` (a *_TRAIN.ts file), not both."
                )
            if self.name in ("image_folder", "cifar10") and self.root is None:
                raise ValueError(f"[data] name = {self.name!r} needs `root` (a directory).")
        _table("factory_kwargs", self.factory_kwargs)
        object.__setattr__(self, "factory_kwargs", dict(self.factory_kwargs))
        check_number("validation_fraction", self.validation_fraction)
        if not 0 < self.validation_fraction < 0.5:
            raise ValueError(
                f"`validation_fraction` is {self.validation_fraction}, but must be in (0, 0.5)."
            )
        check_seed("seed", self.seed)
        check_seed("generator_seed", self.generator_seed, allow_none=True)
        if self.generator_seed is not None and self.name != "mnist1d":
            raise ValueError(
                f"`generator_seed` is {self.generator_seed}, but only generated data sets "
                "(name = 'mnist1d') take one."
            )
        check_bool("normalize", self.normalize)
        if self.image_size is not None:
            size = tuple(self.image_size)
            if len(size) != 2 or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in size
            ):
                raise ValueError(
                    f"`image_size` is {self.image_size!r}, but must be [height, width]."
                )
            object.__setattr__(self, "image_size", size)
        check_int("max_samples", self.max_samples, 10, allow_none=True)
        check_choice("unequal_length", self.unequal_length, UNEQUAL_LENGTHS)
        check_choice("missing", self.missing, MISSING)
        defaults = {f.name: f.default for f in fields(self)}
        for key in ("unequal_length", "missing"):
            if getattr(self, key) != defaults[key] and self.name != "aeon":
                raise ValueError(
                    f"`{key}` is {getattr(self, key)!r}, but only time series read from .ts "
                    "files (name = 'aeon') take one."
                )

    def to_dict(self) -> dict[str, Any]:
        """The table (for the study's records; ``DataConfig(**d)`` reads it back)."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
        }

    def load(self) -> Any:
        """The ``TaskData`` (``optuna_hpcnas.data.load_task``)."""
        from optuna_hpcnas.data import load_task

        return load_task(self)


@dataclass(frozen=True)
class TrainingSection:
    """``[training]``: the supernet's warm-up (every ``SupernetTrainingConfig`` field) plus
    where and how wide the process computes.

    Args:
        supernet: ``paths_per_batch``, ``sampling``, ``optimizer``, ``lr``, ``momentum``,
            ``weight_decay``, ``batch_size``, ``epochs`` (warm-up epochs before the search),
            ``precision``, ``grad_clip``, ``bn_recalibration_batches``, ``seed``.
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads of each process; default: ``OMP_NUM_THREADS`` when
            set, else the cores of the node divided by the ranks on it.
        warmup_max_batches: Cap on warm-up batches per epoch (``None``: the whole set).
    """

    supernet: Any = None
    device: str = "auto"
    threads: int | None = None
    warmup_max_batches: int | None = None

    def __post_init__(self) -> None:
        from optuna_hpcnas.supernet import SupernetTrainingConfig

        if self.supernet is None:
            object.__setattr__(self, "supernet", SupernetTrainingConfig())
        check_choice("device", self.device, DEVICES)
        check_int("threads", self.threads, 1, allow_none=True)
        check_int("warmup_max_batches", self.warmup_max_batches, 1, allow_none=True)

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> TrainingSection:
        from optuna_hpcnas.supernet import SupernetTrainingConfig

        own = {f.name for f in fields(cls)} - {"supernet"}
        allowed = sorted(own | {f.name for f in fields(SupernetTrainingConfig)})
        unknown = [k for k in table if k not in allowed]
        if unknown:
            raise ConfigError(
                f"Unknown key `{unknown[0]}` in [training]; allowed keys: {allowed}."
            )
        supernet = SupernetTrainingConfig(**{k: v for k, v in table.items() if k not in own})
        return cls(supernet=supernet, **{k: v for k, v in table.items() if k in own})


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: Prometheus endpoint (served by the metrics component when installed)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 9464
    refresh_seconds: float = 2.0  # how often the study-wide series are re-read from storage

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        check_str("host", self.host)
        check_int("port", self.port, 0, maximum=65535, allow_none=True)
        check_number("refresh_seconds", self.refresh_seconds)


@dataclass(frozen=True)
class StorageConfig:
    """``[storage]``: how a run rides out its storage going away.

    ``outage_tolerance_s``: seconds a storage may stay unreachable (a database restarted, a
    fail-over, a Redis killed and restarted) while the run waits for it: every storage call
    of the run is tried again with capped exponential backoff on connection errors, training
    goes on, and results finished meanwhile are written once it is back. Past it every rank
    exits with status 75 and ``hpcnas resume`` continues. 0 gives up at the first connection
    error.
    """

    outage_tolerance_s: float = 120.0

    def __post_init__(self) -> None:
        check_number("outage_tolerance_s", self.outage_tolerance_s, positive=False)
        if self.outage_tolerance_s < 0:
            raise ValueError(
                f"`outage_tolerance_s` is {self.outage_tolerance_s}, but must be >= 0."
            )


def _stage_plan() -> Any:
    from optuna_hpcnas.pruners import StagePlan

    return StagePlan()


def _export_recipe() -> Any:
    from optuna_hpcnas.evaluation import ScratchTrainingConfig

    return ScratchTrainingConfig()


@dataclass(frozen=True)
class RunConfig:
    """A whole search: one field per TOML table."""

    study: StudyConfig
    space: SpaceConfig = field(default_factory=SpaceConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)
    stages: Any = field(default_factory=_stage_plan)
    training: TrainingSection = field(default_factory=TrainingSection)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    export: Any = field(default_factory=_export_recipe)
    storage: StorageConfig = field(default_factory=StorageConfig)

    def __post_init__(self) -> None:
        self.enqueued_params()  # a wrong entry is one line when the config is read
        given = self.study.directions
        if given is not None and len(given) != len(self.objective.objectives):
            raise ConfigError(
                f"[objective] objectives has {len(self.objective.objectives)} entries "
                f"({list(self.objective.objectives)}) but [study] directions has "
                f"{len(given)} ({list(given)}); give one direction per objective, or leave "
                "directions out."
            )

    def enqueued_params(self, searched: Any = None) -> list[dict[str, Any]]:
        """``[study] enqueue`` as Optuna parameters (``enqueued_models`` without names)."""
        return [params for _, params in self.enqueued_models(searched)]

    def enqueued_models(self, searched: Any = None) -> list[tuple[str | None, dict[str, Any]]]:
        """``[study] enqueue`` as ``(name, Optuna parameters)``, checked against the space:
        the first trials of a new study (``study.enqueue_trial``). A name is one of the
        preset's published models (``optuna_hpcnas.search_space.reference_models``); a table
        of parameters has no name (``None``).

        ``searched``: the space the run searches, when the data's shape left choices out of
        ``[space]`` (``fit_to_input``): models outside it are skipped, each logged.
        """
        import logging

        from optuna_hpcnas.search_space import reference_models

        if not self.study.enqueue:
            return []
        space = self.space.build()
        known = reference_models(self.space.preset)
        resolved: list[tuple[str | None, dict[str, Any]]] = []
        for entry in self.study.enqueue:
            if isinstance(entry, str):
                if entry not in known:
                    names = ", ".join(sorted(known)) or "none"
                    raise ConfigError(
                        f"[study] enqueue: {entry!r} is not a published model of the "
                        f"{self.space.preset or 'file'} space (it has: {names}); give a "
                        "table of parameters instead."
                    )
                params = known[entry]
            else:
                params = dict(entry)
            try:
                space.from_params(params)
            except ValueError as e:
                raise ConfigError(f"[study] enqueue: {entry!r}: {e}") from None
            if searched is not None and not _fits(searched, params):
                logging.getLogger(__name__).info(
                    "[study] enqueue: %r is left out: the data's shape rules out one of its "
                    "choices.",
                    entry if isinstance(entry, str) else params,
                )
                continue
            resolved.append((entry if isinstance(entry, str) else None, dict(params)))
        return resolved

    @property
    def directions(self) -> list[str]:
        """The study's directions: ``[study] directions``, else the objectives'."""
        if self.study.directions is not None:
            return list(self.study.directions)
        return [OBJECTIVE_DIRECTIONS[name] for name in self.objective.objectives]


def _fits(space: Any, params: Mapping[str, Any]) -> bool:
    try:
        space.from_params(params)
    except ValueError:
        return False
    return True


def _section_classes() -> dict[str, Any]:
    from optuna_hpcnas.evaluation import ScratchTrainingConfig
    from optuna_hpcnas.pruners import StagePlan

    return {
        "study": StudyConfig,
        "space": SpaceConfig,
        "sampler": SamplerConfig,
        "pruner": PrunerConfig,
        "stages": StagePlan,
        "training": TrainingSection.from_table,
        "objective": ObjectiveConfig,
        "data": DataConfig,
        "distributed": DistributedConfig,
        "checkpoints": CheckpointConfig,
        "metrics": MetricsConfig,
        "export": ScratchTrainingConfig,
        "storage": StorageConfig,
    }


SECTIONS = (
    "study",
    "space",
    "sampler",
    "pruner",
    "stages",
    "training",
    "objective",
    "data",
    "distributed",
    "checkpoints",
    "metrics",
    "export",
    "storage",
)


def _section(name: str, table: Any, build: Any) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{name}] must be a table, but got {table!r}.")
    if name == "export" and "epochs" in table:
        raise ConfigError(
            "[export] `epochs` is no longer a unit: the recipe is a budget of optimisation "
            "steps (`steps`, e.g. 2000), the same for 40 series or 40,000."
        )
    if isinstance(build, type):
        allowed = [f.name for f in fields(build)]
        for key in table:
            if key not in allowed:
                raise ConfigError(f"Unknown key `{key}` in [{name}]; allowed keys: {allowed}.")
    try:
        return build(**table) if isinstance(build, type) else build(table)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"[{name}] {e}") from None


_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+$")


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["study.n_trials=20", "sampler.name=tpe"]`` -> ``{"study.n_trials": 20, ...}``.

    Values are read as TOML values when they parse (numbers, booleans, arrays, quoted
    strings), else kept as plain strings.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ConfigError(
                f"Override {pair!r} must look like 'section.key=value' (e.g. study.n_trials=20)."
            )
        try:
            value: Any = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word is a string
        out[key] = value
    return out


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    for dotted, value in overrides.items():
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
    data: Mapping[str, Any],
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    *,
    values: Mapping[str, Any] | None = None,
) -> RunConfig:
    """A ``RunConfig`` from parsed TOML (``load_config`` without the file)."""
    data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    if overrides:
        pairs = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
        data = _apply_overrides(data, pairs)
    if values:
        data = _apply_overrides(data, values)
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"Unknown section [{unknown[0]}]; allowed sections: {list(SECTIONS)}.")
    if "study" not in data:
        raise ConfigError(
            "The [study] table is missing: give at least `n_trials` or `timeout` "
            "(`hpcnas init` writes a commented starter file)."
        )
    classes = _section_classes()
    kwargs = {k: _section(k, v, classes[k]) for k, v in data.items()}
    try:
        return RunConfig(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def load_config(
    path: str | os.PathLike[str],
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    *,
    values: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Read a TOML run configuration.

    Args:
        path: The TOML file.
        overrides: ``{"section.key": value}`` or ``["section.key=value", ...]`` (TOML values;
            a bare word is a string) applied on top of the file.
        values: ``{"section.key": value}`` applied last (typed values, e.g. command-line
            flags such as ``--n-trials``).

    Raises:
        ConfigError: A missing or unreadable file, invalid TOML, an unknown table, key or
            value (with the allowed ones).

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "nas.toml"
        >>> _ = p.write_text('[study]\\nn_trials = 4\\n[distributed]\\ngroup_size = 2\\n')
        >>> load_config(p, ["distributed.sync_interval=3"]).distributed.sync_interval
        3
    """
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"Configuration {str(path)!r} is a directory, not a TOML file.")
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"Configuration file {str(path)!r} does not exist.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"Configuration file {str(path)!r} cannot be read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return config_from_dict(data, overrides, values=values)


def with_overrides(config: RunConfig, **sections: Mapping[str, Any]) -> RunConfig:
    """A copy of ``config`` with some keys of some sections replaced (validated again)."""
    changed = {name: replace(getattr(config, name), **values) for name, values in sections.items()}
    return replace(config, **changed)


__all__ = [
    "ConfigError",
    "DataConfig",
    "MetricsConfig",
    "PrunerConfig",
    "RunConfig",
    "SamplerConfig",
    "SpaceConfig",
    "StorageConfig",
    "StudyConfig",
    "TrainingSection",
    "config_from_dict",
    "load_config",
    "parse_overrides",
    "with_overrides",
]
