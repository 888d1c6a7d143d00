"""What every ``hpcnas`` command shares: its one-line user error, the config a reading
command is given (or ``./nas.toml``), and the study it names in its storage."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import logging
import os
from pathlib import Path
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.config import RunConfig


_logger = logging.getLogger("optuna_hpcnas.cli")


STORAGE_ENV = "OPTUNA_STORAGE"


class CLIError(Exception):
    """A user error: printed as ``hpcnas: error: ...`` with exit status 2, no traceback."""


# ---------------------------------------------------------------------------- study lookup
def read_config(
    path: str, overrides: Sequence[str] | None = None, values: dict[str, Any] | None = None
) -> RunConfig:
    from optuna_hpcnas.config import ConfigError
    from optuna_hpcnas.config import load_config

    try:
        return load_config(path, overrides=overrides or None, values=values)
    except ConfigError as e:
        raise CLIError(str(e)) from None


DEFAULT_CONFIG = "nas.toml"


def given_config(args: argparse.Namespace) -> RunConfig | None:
    """The ``--config`` file of a reading command, parsed once; without ``--config`` and
    ``--storage``, ``./nas.toml`` when there is one (as ``hpcnas init`` writes it), else
    ``None``."""
    if not getattr(args, "config", None):
        if getattr(args, "storage", None) or not Path(DEFAULT_CONFIG).is_file():
            return None
        args.config = DEFAULT_CONFIG
        _logger.info("reading %s (no --config or --storage given)", DEFAULT_CONFIG)
    if getattr(args, "parsed_config", None) is None:
        args.parsed_config = read_config(args.config)
    return args.parsed_config


def resolve_storage(args: argparse.Namespace) -> tuple[str, str | None]:
    """``(storage URL, study name or None)``: ``--storage``, then the config's ``[study]``
    (which falls back to ``OPTUNA_STORAGE`` and the default SQLite file), then
    ``OPTUNA_STORAGE``."""
    config = given_config(args)
    storage = args.storage or (config.study.resolved_storage() if config else None)
    storage = storage or os.environ.get(STORAGE_ENV)
    if not storage:
        raise CLIError(
            "no storage given: pass --storage URL, set OPTUNA_STORAGE, or --config with "
            "[study] storage = '...'"
        )
    name = getattr(args, "study_name", None) or (config.study.name if config else None)
    return str(storage), name


def check_storage(url: str, *, must_exist: bool) -> optuna.storages.BaseStorage:
    """Open the storage of ``url`` (every Optuna storage, as optuna-dashboard spells them:
    RDB URLs, a journal file path, ``redis://``, ``grpc://``), or refuse one that cannot be a
    study's: a missing file (when reading), a directory, a file that is not a database or a
    journal, an unreachable server. One line, and no file is created when reading."""
    from optuna_hpcnas.storages import open_storage
    from optuna_hpcnas.storages import StorageError

    try:
        return open_storage(url, must_exist=must_exist)
    except StorageError as e:
        raise CLIError(str(e)) from None


def load_study(args: argparse.Namespace) -> optuna.Study:
    import optuna

    url, name = resolve_storage(args)
    storage = check_storage(url, must_exist=True)
    try:
        summaries = optuna.study.get_all_study_summaries(storage=storage)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CLIError(f"cannot open storage {mask_url(url)}: {type(e).__name__}: {first}") from e
    names = [s.study_name for s in summaries]
    if name is None:
        if len(names) != 1:
            raise CLIError(
                f"storage {mask_url(url)} holds {len(names)} studies {names}: "
                "choose one with --study-name"
            )
        name = names[0]
    elif name not in names:
        raise CLIError(f"no study {name!r} in {mask_url(url)}; studies there: {names or 'none'}")
    return optuna.load_study(study_name=name, storage=storage)


def quiet_exporter_logs() -> None:
    """The ONNX exporter's and optimiser's step-by-step logs (torch sets its loggers' levels
    when it is imported: call again after that)."""
    for name in ("onnxscript", "onnx_ir", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)
