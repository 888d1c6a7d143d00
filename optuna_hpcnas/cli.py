"""The ``hpcnas`` command: init, run, resume, status, best, export, dashboard, template.

``hpcnas run --config nas.toml`` runs a search from a TOML file (also as
``mpirun -n N python -m mpi4py -m optuna_hpcnas run --config nas.toml``); the other commands
read a study from its storage: ``--storage URL`` or ``OPTUNA_STORAGE`` (as Optuna's own CLI),
or the ``[study]`` table of ``--config``. A user error prints one line and exits with 2; a run
whose storage stayed away past ``[storage] outage_tolerance_s`` prints one line and exits with
75 (``EX_TEMPFAIL``: ``hpcnas resume`` continues it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import logging
import os
from pathlib import Path
import signal
import sys
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas._cli_util import format_duration
from optuna_hpcnas._cli_util import MaskingFilter
from optuna_hpcnas._summary import best_trials
from optuna_hpcnas._summary import describe_trial
from optuna_hpcnas._summary import export_choice
from optuna_hpcnas._summary import metric_names
from optuna_hpcnas._summary import study_status
from optuna_hpcnas._summary import trial_architecture
from optuna_hpcnas.distributed import launched_rank_and_size
from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from optuna_hpcnas.config import RunConfig

_logger = logging.getLogger("optuna_hpcnas.cli")
STORAGE_ENV = "OPTUNA_STORAGE"


class CLIError(Exception):
    """A user error: printed as ``hpcnas: error: ...`` with exit status 2, no traceback."""


# ---------------------------------------------------------------------------- study lookup
def _load_config(
    path: str, overrides: Sequence[str] | None = None, values: dict[str, Any] | None = None
) -> RunConfig:
    from optuna_hpcnas.config import ConfigError
    from optuna_hpcnas.config import load_config

    try:
        return load_config(path, overrides=overrides or None, values=values)
    except ConfigError as e:
        raise CLIError(str(e)) from None


DEFAULT_CONFIG = "nas.toml"


def _given_config(args: argparse.Namespace) -> RunConfig | None:
    """The ``--config`` file of a reading command, parsed once; without ``--config`` and
    ``--storage``, ``./nas.toml`` when there is one (as ``hpcnas init`` writes it), else
    ``None``."""
    if not getattr(args, "config", None):
        if getattr(args, "storage", None) or not Path(DEFAULT_CONFIG).is_file():
            return None
        args.config = DEFAULT_CONFIG
        _logger.info("reading %s (no --config or --storage given)", DEFAULT_CONFIG)
    if getattr(args, "parsed_config", None) is None:
        args.parsed_config = _load_config(args.config)
    return args.parsed_config


def resolve_storage(args: argparse.Namespace) -> tuple[str, str | None]:
    """``(storage URL, study name or None)``: ``--storage``, then the config's ``[study]``
    (which falls back to ``OPTUNA_STORAGE`` and the default SQLite file), then
    ``OPTUNA_STORAGE``."""
    config = _given_config(args)
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


# ---------------------------------------------------------------------------- status
def _cmd_status(args: argparse.Namespace) -> int:
    study = load_study(args)
    info = study_status(study)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    storage, _ = resolve_storage(args)
    states = "  ".join(f"{k} {v}" for k, v in info["by_state"].items() if v)
    print(f"study        {info['study']}  ({mask_url(storage)})")
    print(
        "objectives   "
        + ", ".join(f"{d} {n}" for d, n in zip(info["directions"], info["metric_names"]))
    )
    finished = sum(info["by_state"][s] for s in ("COMPLETE", "PRUNED", "FAIL"))
    if info["progress"] is not None:
        print(f"progress     {finished}/{info['target_trials']} ({100 * info['progress']:.0f}%)")
    print(f"trials       {info['trials']}  {states}")
    waiting = info["by_state"]["WAITING"]
    if waiting:
        # parameterless placeholders of the budget (or retries), not failures
        print(
            f"queued       {waiting} WAITING trials, the budget's rest: `hpcnas resume` runs "
            "them (Optuna and the dashboard list them as WAITING)"
        )
    if "elapsed_seconds" in info:
        print(
            f"time         {info['first_start']} -> {info['last_finish'] or 'running'}  "
            f"({format_duration(info['elapsed_seconds'])})"
        )
        if info["trials_per_minute"] is not None:
            print(
                f"throughput   {info['trials_per_minute']:.2f} trials/min, mean evaluation "
                f"{info['mean_evaluation_seconds'] or 0:.2f} s"
            )
        if info["mean_concurrency"] is not None:
            print(f"utilisation  {info['mean_concurrency']:.2f} evaluations running on average")
    if "utilisation" in info:
        shares = "  ".join(f"rank {k}: {100 * v:.1f}%" for k, v in info["utilisation"].items())
        print(f"compute      {shares}  (of each rank's search loop, last run)")
    if "best" in info:
        b = info["best"]
        print(f"best         trial {b['trial']}  {b['values'][0]:.6g}  {b['architecture']}")
    if "pareto_front_trials" in info:
        print(f"pareto front {info['pareto_front_trials']} trials (see `hpcnas best`)")
    return 0


# ---------------------------------------------------------------------------- best
def _cmd_best(args: argparse.Namespace) -> int:
    study = load_study(args)
    trials = best_trials(study, top=args.top)
    if not trials:
        raise CLIError(f"study {study.study_name!r} has no completed trial yet")
    names = metric_names(study)
    rows = []
    for t in trials:
        rows.append(
            {
                "trial": t.number,
                "flops": t.user_attrs.get(_keys.OBJECTIVE_FLOPS),
                "params": t.user_attrs.get(_keys.OBJECTIVE_PARAMS),
                "latency_s": t.user_attrs.get(_keys.OBJECTIVE_LATENCY),
                "stage": t.user_attrs.get(_keys.OBJECTIVE_STAGE),
                **dict(zip(names, t.values)),
                "architecture": describe_trial(study, t),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    title = "Pareto front" if len(study.directions) > 1 else f"top {len(rows)}"
    print(f"{title} of study {study.study_name!r} ({len(study.trials)} trials)")
    extra = [c for c in ("flops", "params", "latency_s", "stage") if c not in names]
    columns = ["trial", *names, *extra]
    columns = [c for c in columns if any(r[c] is not None for r in rows)]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    widths = {c: max(len(c), *(len(cell(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns) + "  architecture")
    for r in rows:
        print("  ".join(cell(r[c]).rjust(widths[c]) for c in columns) + "  " + r["architecture"])
    return 0


# ---------------------------------------------------------------------------- export
def _pick_trial(study: optuna.Study, number: int | None) -> FrozenTrial:
    from optuna.trial import TrialState

    if number is not None:
        # any trial that ran: a pruned one (a published model stopped early in the search)
        # is trained in full by the export like any other
        ran = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
        matches = [t for t in study.get_trials(deepcopy=False) if t.number == number]
        if not matches or matches[0].state not in ran:
            state = matches[0].state.name.lower() if matches else "not in the study"
            raise CLIError(
                f"trial {number} of {study.study_name!r} has not run ({state}): there is no "
                "architecture to export"
            )
        return matches[0]
    choice = export_choice(study)
    if choice is None:
        raise CLIError(f"study {study.study_name!r} has no completed trial yet")
    trial, why = choice
    if why is not None:
        _logger.info("%s (choose another with --trial).", why)
    if len(study.directions) > 1:
        _logger.info(
            "Multi-objective study: the Pareto-front trial best in %s (choose another with "
            "--trial).",
            metric_names(study)[0],
        )
    return trial


def _run_data(args: argparse.Namespace, study: optuna.Study) -> Any:
    """The task of the run: ``--config``'s ``[data]``, else the one the run recorded.

    A study record is data anyone who can write to the storage may have written, so a
    ``factory`` read back from it is never imported: factory data needs ``--config`` or the
    factory typed on this command line (``--data-factory``).
    """
    from dataclasses import replace

    from optuna_hpcnas._records import run_data_of
    from optuna_hpcnas.config import DataConfig

    typed_factory = getattr(args, "data_factory", None)
    config = _given_config(args)
    if config is not None:
        data = config.data
    else:
        recorded = run_data_of(study)
        if recorded is None:
            raise CLIError(
                f"study {study.study_name!r} records no data set (it was not made by "
                "`hpcnas run`): pass --config with the run's [data] table"
            )
        if recorded.get("factory") is not None and typed_factory is None:
            raise CLIError(
                f"study {study.study_name!r} was searched on data from the factory "
                f"{str(recorded['factory'])!r}; code named in a study record is never run: "
                "pass --config with the run's [data] table, or --data-factory "
                "package.module:function"
            )
        try:
            data = DataConfig(**recorded)
        except (TypeError, ValueError) as e:
            raise CLIError(
                f"study {study.study_name!r} records a [data] table that is not valid ({e}): "
                "pass --config with the run's [data] table"
            ) from None
    if typed_factory is not None:
        try:
            data = replace(data, factory=typed_factory)
        except ValueError as e:
            raise CLIError(f"--data-factory: {e}") from None
    return _load_data(data)


def _configure_threads(args: argparse.Namespace) -> None:
    """torch's threads for a command that trains or exports in this process: ``--config``'s
    ``[training] threads`` when given, else this process's share of the node."""
    from optuna_hpcnas._openmp import passive_openmp

    passive_openmp()  # before the config, whose [training] table loads torch
    config = _given_config(args)
    from optuna_hpcnas.run import configure_threads

    configure_threads(
        requested=config.training.threads if config is not None else None, ranks_on_node=1
    )


def _export_recipe(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    config = _given_config(args)
    recipe = config.export if config is not None else None
    if recipe is None:
        from optuna_hpcnas.evaluation import ScratchTrainingConfig

        recipe = ScratchTrainingConfig()
    return replace(recipe, steps=args.steps) if args.steps is not None else recipe


def _cmd_export(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy._export import export_trial
    from optuna_hpcnas.deploy._export import ExportError

    _configure_threads(args)
    study = load_study(args)
    trial = _pick_trial(study, args.trial)
    arch = trial_architecture(study, trial)
    if arch is None:
        raise CLIError(
            f"trial {trial.number} has no architecture: neither the user attribute "
            f"{_keys.OBJECTIVE_ARCH!r} nor a search space recorded in the study"
        )
    mode = "untrained" if args.untrained else "finetune" if args.finetune else "retrain"
    recipe = _export_recipe(args)
    data = _run_data(args, study)
    if mode != "untrained":
        print(
            f"training trial {trial.number} ({mode}, {recipe.steps} steps, Adam lr "
            f"{recipe.lr:g}, batch {recipe.batch_size}, on "
            f"{'train' if recipe.holdout else 'train + validation'}): {arch.describe()}",
            flush=True,
        )
    try:
        result = export_trial(
            study,
            trial,
            arch,
            Path(args.out),
            data=data,
            recipe=recipe,
            mode=mode,
            weights=args.weights,
            onnx=not args.no_onnx,
            input_form=args.input,
        )
    except ExportError as e:
        raise CLIError(str(e)) from None
    m = result.metrics
    print(
        f"exported trial {trial.number}: test accuracy {m['test_accuracy']:.4f} on "
        f"{len(data.test)} held-out samples (valid {m['valid_accuracy']:.4f})"
    )
    for path, what in result.files:
        print(f"  {path}  {what}")
    return 0


# ---------------------------------------------------------------------------- deploy / serve
def _cmd_deploy(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy import DeploymentRefused
    from optuna_hpcnas.deploy._from_study import choose_trial
    from optuna_hpcnas.deploy._from_study import deploy_trial
    from optuna_hpcnas.deploy._from_study import parse_limits

    _configure_threads(args)  # imports torch
    if args.verbose < 2:
        _quiet_exporter_logs()
    study = load_study(args)
    try:
        trial = choose_trial(study, number=args.trial, limits=parse_limits(args.limit))
    except ValueError as e:
        raise CLIError(str(e)) from None
    arch = trial_architecture(study, trial)
    if arch is None:
        raise CLIError(f"trial {trial.number} has no architecture recorded")
    recipe = _export_recipe(args)
    data = _run_data(args, study)
    mode = "finetune" if args.finetune else "retrain"
    print(f"deploying trial {trial.number} ({mode}, {recipe.steps} steps): {arch.describe()}")
    try:
        report = deploy_trial(
            study, trial, arch, data, out=args.out, recipe=recipe, mode=mode,
            weights=args.weights, holdout_fraction=args.holdout_fraction,
            margin=args.margin, target=args.target, name=args.name,
            standardise=args.input == "raw",
        )  # fmt: skip
    except DeploymentRefused as e:
        raise CLIError(f"deployment refused: {e}") from None
    except ValueError as e:  # bad target, fraction, weights
        raise CLIError(str(e)) from None
    print(report.format_table())
    print(f"next: hpcnas serve {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy import serve_command

    return serve_command(args)


def _storage_proxy(args: argparse.Namespace) -> int:
    from optuna_hpcnas.storages import storage_proxy_command

    return storage_proxy_command(args)


# ---------------------------------------------------------------------------- dashboard
def _artifact_store(args: argparse.Namespace, storage: Any, url: str) -> Any | None:
    """``--artifact-dir``, else the checkpoints in the study's own database (RDB storages)."""
    from optuna_hpcnas.storages import artifact_store_for
    from optuna_hpcnas.storages import StorageError

    try:
        store = artifact_store_for(storage, artifact_store=args.artifact_dir)
    except (StorageError, ImportError) as e:
        _logger.info("No artifact store for %s (%s): checkpoints not listed.", mask_url(url), e)
        return None
    _logger.info("Artifacts (checkpoints) from %s.", type(store).__name__)
    return store


def _cmd_dashboard(args: argparse.Namespace) -> int:
    storage, _ = resolve_storage(args)
    opened = check_storage(storage, must_exist=True)
    store = _artifact_store(args, opened, storage)
    if args.refresh_plots:
        import optuna

        from optuna_hpcnas.dashboard import save_dashboard_plots

        for summary in optuna.study.get_all_study_summaries(storage=opened):
            study = optuna.load_study(study_name=summary.study_name, storage=opened)
            save_dashboard_plots(study)
    from optuna_hpcnas.dashboard import launch_dashboard

    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"optuna-dashboard on http://{host}:{args.port}/ for {mask_url(storage)} (Ctrl-C stops)")
    sys.stdout.flush()
    launch_dashboard(opened, host=args.host, port=args.port, artifact_store=store)
    return 0


# ---------------------------------------------------------------------------- template
def _cmd_template(args: argparse.Namespace) -> int:
    from optuna_hpcnas import integrations as ig

    if args.kind == "all":
        for path in ig.write_all(args.out or "integrations"):
            print(path)
        return 0
    text: str
    if args.kind == "slurm":
        text = ig.slurm_script(
            config=args.config_path,
            nodes=args.nodes,
            ntasks_per_node=args.ranks_per_node,
            gpus_per_node=args.gpus_per_node or None,
            time_limit=args.time,
            partition=args.partition,
            account=args.account,
        )
    elif args.kind == "mpirun":
        text = ig.mpirun_script(default_ranks=args.nodes * args.ranks_per_node)
    elif args.kind == "mpijob":
        import yaml

        text = yaml.safe_dump(
            ig.mpijob_manifest(
                workers=args.nodes,
                slots_per_worker=args.ranks_per_node,
                gpus_per_worker=args.gpus_per_node or None,
            ),
            sort_keys=False,
        )
    elif args.kind == "grafana":
        text = json.dumps(ig.grafana_dashboard(), indent=2) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(ig.prometheus_scrape_config(), sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
        if args.kind in ("slurm", "mpirun"):
            Path(args.out).chmod(0o755)
        print(args.out)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------- init
def starter_presets() -> list[str]:
    """The presets ``hpcnas init --preset`` writes a starter for (``starters/*.toml``)."""
    from importlib.resources import files

    return sorted(
        p.name.removesuffix(".toml")
        for p in files("optuna_hpcnas").joinpath("starters").iterdir()
        if p.name.endswith(".toml")
    )


def starter(preset: str = "digits-small") -> str:
    """The commented config ``hpcnas init --preset PRESET`` writes (package data, with the
    values measured for the preset)."""
    from importlib.resources import files

    if preset not in starter_presets():
        raise ValueError(f"`preset` is {preset!r}, but must be one of {starter_presets()}.")
    return files("optuna_hpcnas").joinpath("starters", f"{preset}.toml").read_text()


STARTER = starter()


def _cmd_init(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.is_dir():
        raise CLIError(f"{args.out!r} is a directory; give a file name such as nas.toml")
    if out.exists() and not args.force:
        raise CLIError(f"{args.out!r} exists; pass --force to overwrite it")
    out.write_text(starter(args.preset))
    print(f"wrote {out}; run it with: hpcnas run --config {out}")
    return 0


# ---------------------------------------------------------------------------- run / resume
def _run_config(args: argparse.Namespace) -> RunConfig:
    """``--config`` with ``--set`` and the typed flags on top."""
    flags = {
        "study.n_trials": args.n_trials,
        "study.storage": args.storage or None,
        "study.name": args.study_name or None,
    }
    return _load_config(args.config, args.set, {k: v for k, v in flags.items() if v is not None})


def _cmd_run(args: argparse.Namespace, *, resume: bool) -> int:
    from optuna_hpcnas.distributed import finalize_mpi
    from optuna_hpcnas.run import follow_launcher
    from optuna_hpcnas.run import launch
    from optuna_hpcnas.run import LaunchError
    from optuna_hpcnas.run import relaunch_command
    from optuna_hpcnas.run import run_relaunched
    from optuna_hpcnas.run import StorageLost

    follow_launcher()  # a rank that `hpcnas run` started stops when that process is gone
    config = _run_config(args)
    try:
        command = relaunch_command(config, args.argv)
        if command is not None:  # [distributed] processes: this machine's ranks, as mpirun
            return run_relaunched(command)
        done = launch(config, resume=resume, progress=not args.no_progress)
    except StorageLost as e:  # every rank, each in its own time: no MPI_Abort
        print(f"hpcnas {args.command}: error: {mask_url(str(e))}", file=sys.stderr, flush=True)
        finalize_mpi(e.exit_status)
        return e.exit_status
    except LaunchError as e:
        raise CLIError(str(e)) from None
    if done.rank != 0:
        return 0
    name, storage = done.study_name, done.storage
    if not done.ran:
        print(f"study {name!r} has no trial left to run; see `hpcnas status`")
        return 0
    info = done.status or {}
    states = ", ".join(f"{v} {k.lower()}" for k, v in info.get("by_state", {}).items() if v)
    print(f"study {name!r}: {states}")
    waiting = info.get("by_state", {}).get("WAITING", 0)
    if waiting:
        print(f"{waiting} waiting trials are the budget's rest: `hpcnas resume` runs them")
    if "best" in info:
        b = info["best"]
        print(f"best: trial {b['trial']} {b['values'][0]:.6g}  {b['architecture']}")
    flag = "" if os.environ.get(STORAGE_ENV) == storage else f" --storage {mask_url(storage)}"
    print(f"next: hpcnas best{flag} --study-name {name}")
    print(f"      hpcnas dashboard{flag}")
    return 0


def _load_data(config: Any) -> Any:
    """The task of ``[data]`` (every rank loads its own), or its ``DataError`` as one
    ``CLIError`` line."""
    from optuna_hpcnas.data import DataError

    try:
        return config.load()
    except DataError as e:
        raise CLIError(f"[data] {e}") from None


# ---------------------------------------------------------------------------- parser
def _add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help=f"storage URL (default: ${STORAGE_ENV})")
    p.add_argument("--study-name", help="study name (default: the only study in the storage)")
    p.add_argument(
        "--config",
        help="a nas.toml whose [study] gives storage and name (default: ./nas.toml when "
        "there is one and no --storage is given)",
    )


def _add_init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="nas.toml", help="file to write (default: nas.toml)")
    p.add_argument(
        "--preset",
        default="digits-small",
        choices=starter_presets(),
        help="the search space and data the starter is written for (default: digits-small, "
        "scikit-learn's digits; signal-1d: MNIST-1D)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing file")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the search's nas.toml")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set study.n_trials=20 (repeatable)",
    )
    p.add_argument("--n-trials", type=int, help="same as --set study.n_trials=N")
    p.add_argument("--storage", help=f"storage URL (default: config, then ${STORAGE_ENV})")
    p.add_argument("--study-name", help="study name (default: from the config)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")


def _add_status_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_best_args(p: argparse.ArgumentParser) -> None:
    _add_status_args(p)
    p.add_argument("--top", type=int, default=5, help="how many (single objective)")


def _add_data_factory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-factory",
        metavar="MODULE:FUNCTION",
        help="the [data] factory to call (a factory recorded in the study is never run)",
    )


def _add_export_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    _add_data_factory_arg(p)
    p.add_argument("--trial", type=int, help="export this trial instead of the best")
    p.add_argument("--out", default="hpcnas-export", help="output directory")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX file")
    p.add_argument(
        "--input",
        choices=["standardised", "raw"],
        default="standardised",
        help="what the files take: the model's standardised inputs (default), or raw data "
        "with the recorded standardisation as the graph's first step",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimisation steps of the training (default: [export] steps, else 4000)",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--finetune",
        action="store_true",
        help="continue from the supernet's weights instead of retraining from scratch",
    )
    how.add_argument(
        "--untrained", action="store_true", help="write the module without any training"
    )
    p.add_argument(
        "--weights",
        help="supernet state_dict (torch.save, read with weights_only=True) for --finetune "
        "(default: the study's newest supernet checkpoint)",
    )


def _add_dashboard_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--artifact-dir", help="a FileSystemArtifactStore directory")
    p.add_argument(
        "--refresh-plots",
        action="store_true",
        help="recompute the Pareto-front and trajectory plots before serving",
    )


def _add_template_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "kind",
        choices=["slurm", "mpirun", "mpijob", "grafana", "prometheus", "all"],
        help="which file",
    )
    p.add_argument("--out", help="output file (directory for 'all'); default: stdout")
    p.add_argument("--config-path", default="nas.toml", help="config path used by the job")
    p.add_argument("--nodes", type=int, default=2, help="nodes of the job (default 2)")
    p.add_argument("--ranks-per-node", type=int, default=4, help="MPI ranks per node (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=4, help="0 for CPU-only nodes")
    p.add_argument("--time", default="24:00:00", help="Slurm time limit")
    p.add_argument("--partition", help="Slurm partition")
    p.add_argument("--account", help="Slurm account")


def _add_deploy_args(p: argparse.ArgumentParser) -> None:
    _add_study_args(p)
    _add_data_factory_arg(p)
    p.add_argument("--out", default="hpcnas-deploy", help="output directory")
    p.add_argument("--trial", type=int, help="deploy this trial instead of the best")
    p.add_argument(
        "--limit",
        action="append",
        metavar="NAME=VALUE",
        help="choose the best trial (of the Pareto front) within a cost limit: flops, params "
        "or latency (seconds); repeatable",
    )
    p.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.1,
        help="share of all samples, from the test split the search never saw, to verify on "
        "(default 0.1)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.02,
        help="refuse when the verified accuracy is more than this below the search's "
        "estimate (default 0.02)",
    )
    p.add_argument(
        "--target",
        help="onnx-cpu | tensorrt | npu-no-grouped (default: the space's target, else onnx-cpu)",
    )
    p.add_argument("--name", default="model", help="model name in the KServe routes")
    p.add_argument(
        "--input",
        choices=["raw", "standardised"],
        default="raw",
        help="what the models take: raw data, standardised by the graph itself (default), or "
        "inputs the client standardised upstream",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="optimisation steps of the training (default: [export] steps, else 4000)",
    )
    p.add_argument(
        "--finetune", action="store_true", help="train from the supernet's weights instead"
    )
    p.add_argument("--weights", help="supernet state_dict for --finetune (weights_only=True)")


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    from optuna_hpcnas.deploy import add_serve_arguments

    add_serve_arguments(p)


def _add_storage_proxy_args(p: argparse.ArgumentParser) -> None:
    from optuna_hpcnas.storages import add_storage_proxy_arguments

    add_storage_proxy_arguments(p)


# name -> (one-line help, description, argument adder)
_SUBCOMMANDS: dict[str, tuple[str, str, Any]] = {
    "init": ("write a commented starter nas.toml", "write a starter config", _add_init_args),
    "run": (
        "run a search from a TOML config",
        "run a search from a TOML config. Exit status: 0 done, 2 a user error, 75 the "
        "storage stayed unreachable past [storage] outage_tolerance_s (run `hpcnas resume` "
        "once it is back), 128+N a signal N",
        _add_run_args,
    ),
    "resume": (
        "continue a stopped search (same config)",
        "run exactly the trials a stopped search left (exit status as `hpcnas run`: 75 when "
        "the storage stays unreachable past [storage] outage_tolerance_s)",
        _add_run_args,
    ),
    "status": (
        "progress, trials by state, utilisation",
        "progress, trials by state, throughput and per-rank compute share",
        _add_status_args,
    ),
    "best": (
        "top architectures, or the Pareto front",
        "top architectures (single objective) or the Pareto front",
        _add_best_args,
    ),
    "export": (
        "the best architecture, trained, as files",
        "train the best architecture (retrained from scratch by default) and write it as a "
        "torch.export program and ONNX; prints its held-out test accuracy",
        _add_export_args,
    ),
    "deploy": (
        "the best architecture, trained, verified, as FP32/INT8 ONNX + container + chart",
        "train the chosen architecture, verify it on held-out data, write FP32 and INT8 ONNX "
        "models, benchmark them (report.json), a Dockerfile and a Helm chart",
        _add_deploy_args,
    ),
    "serve": (
        "serve a deployed model over HTTP (KServe v1 and v2)",
        "serve the INT8 (or FP32) model of an `hpcnas deploy` directory with the KServe v1 "
        "protocol and the Open Inference Protocol (v2), with Prometheus metrics on /metrics "
        "(127.0.0.1 by default); the container's entry point",
        _add_serve_args,
    ),
    "storage-proxy": (
        "an Optuna gRPC storage proxy for many workers",
        "serve a storage to many workers through Optuna's gRPC proxy (127.0.0.1 by default); "
        "workers use --storage grpc://HOST:PORT",
        _add_storage_proxy_args,
    ),
    "dashboard": (
        "optuna-dashboard on the study's storage",
        "serve optuna-dashboard (with the checkpoints as artifacts)",
        _add_dashboard_args,
    ),
    "template": (
        "write a Slurm / mpirun / Kubernetes / Grafana file",
        "write a launch or operations file",
        _add_template_args,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from optuna_hpcnas import __version__

    parser = argparse.ArgumentParser(
        prog="hpcnas",
        description="Neural architecture search with Optuna, from a laptop to an HPC cluster.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument("--version", action="version", version=f"optuna-hpcnas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, description, add_arguments) in _SUBCOMMANDS.items():
        add_arguments(sub.add_parser(name, help=text, description=description))
    return parser


def _quiet_exporter_logs() -> None:
    """The ONNX exporter's and optimiser's step-by-step logs (torch sets its loggers' levels
    when it is imported: call again after that)."""
    for name in ("onnxscript", "onnx_ir", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _setup_logging(verbose: int, quiet: bool, rank: int) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if rank != 0 and not verbose:
        level = logging.WARNING  # rank 0 speaks for the job
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(MaskingFilter())
    prefix = f"[rank {rank}] " if rank else ""
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if verbose < 2:
        _quiet_exporter_logs()
    import optuna

    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    optuna.logging.set_verbosity(level if verbose else max(level, logging.WARNING))


def _exit_on_signals() -> dict[signal.Signals, Any]:
    """``hpcnas run``/``resume``: SIGTERM and SIGUSR1 end the process with 128 + signal from
    its first moment, before the run's ``PreemptionGuard`` takes over around the trials (the
    data loading, the study's creation, the supernet warm-up: no trial is taken yet) and after
    it (the last checkpoint, the plots). Without it they would kill the process outright.
    Returns the handlers it replaced."""

    import threading

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return {}  # handlers can only be set there (main() run by a caller's thread)
    return {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGUSR1)}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hpcnas`` and ``python -m optuna_hpcnas``; returns the exit status."""
    from optuna_hpcnas._openmp import passive_openmp

    passive_openmp()  # before anything loads torch: its OpenMP reads the variable once
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `processes` re-runs
    if args.command is None:
        parser.print_help()
        return 2
    previous = _exit_on_signals() if args.command in ("run", "resume") else {}
    try:
        return _dispatch(args)
    finally:  # main() called in a process that goes on (tests, notebooks)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _dispatch(args: argparse.Namespace) -> int:
    rank, _ = launched_rank_and_size()
    _setup_logging(args.verbose, args.quiet, rank)
    commands = {
        "init": _cmd_init,
        "run": lambda a: _cmd_run(a, resume=False),
        "resume": lambda a: _cmd_run(a, resume=True),
        "status": _cmd_status,
        "best": _cmd_best,
        "export": _cmd_export,
        "deploy": _cmd_deploy,
        "serve": _serve,
        "storage-proxy": _storage_proxy,
        "dashboard": _cmd_dashboard,
        "template": _cmd_template,
    }
    try:
        return commands[args.command](args)
    except CLIError as e:
        print(f"hpcnas {args.command}: error: {mask_url(str(e))}", file=sys.stderr)
        if args.command in ("run", "resume") and launched_rank_and_size()[1] > 1:
            from optuna_hpcnas.distributed import finalize_mpi

            sys.stderr.flush()
            finalize_mpi(2)  # exit 2 on every rank, not python -m mpi4py's MPI_Abort
        return 2
    except KeyboardInterrupt:
        print("hpcnas: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpcnas best | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
