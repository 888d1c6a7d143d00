"""``hpcnas export``, ``deploy``, ``serve``, ``storage-proxy`` and ``dashboard``: a study's
architectures trained into files, served, or shown."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import sys
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas import _keys
from optuna_hpcnas._summary import export_choice
from optuna_hpcnas._summary import metric_names
from optuna_hpcnas._summary import trial_architecture
from optuna_hpcnas.cli._common import check_storage
from optuna_hpcnas.cli._common import CLIError
from optuna_hpcnas.cli._common import given_config
from optuna_hpcnas.cli._common import load_study
from optuna_hpcnas.cli._common import quiet_exporter_logs
from optuna_hpcnas.cli._common import resolve_storage
from optuna_hpcnas.cli._run import load_data
from optuna_hpcnas.storages import mask_url

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


_logger = logging.getLogger("optuna_hpcnas.cli")


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
    config = given_config(args)
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
    return load_data(data)


def _configure_threads(args: argparse.Namespace) -> None:
    """torch's threads for a command that trains or exports in this process: ``--config``'s
    ``[training] threads`` when given, else this process's share of the node."""
    from optuna_hpcnas._openmp import passive_openmp

    passive_openmp()  # before the config, whose [training] table loads torch
    config = given_config(args)
    from optuna_hpcnas.run import configure_threads

    configure_threads(
        requested=config.training.threads if config is not None else None, ranks_on_node=1
    )


def _export_recipe(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    config = given_config(args)
    recipe = config.export if config is not None else None
    if recipe is None:
        from optuna_hpcnas.evaluation import ScratchTrainingConfig

        recipe = ScratchTrainingConfig()
    return replace(recipe, steps=args.steps) if args.steps is not None else recipe


def _schedule(recipe: Any, data: Any) -> str:
    """The steps, batch and rate ``train_model`` will use, the auto batch resolved."""
    from optuna_hpcnas.evaluation import training_set

    plan = recipe.schedule(len(training_set(data, recipe)))
    return f"{plan.steps} steps of {plan.batch_size}, Adam lr {plan.lr:.3g}"


def cmd_export(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy._export import export_trial
    from optuna_hpcnas.deploy._export import ExportError

    _configure_threads(args)  # imports torch
    if args.verbose < 2:
        quiet_exporter_logs()
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
            f"training trial {trial.number} ({mode}, {_schedule(recipe, data)}, on "
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
def cmd_deploy(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy import DeploymentRefused
    from optuna_hpcnas.deploy._from_study import choose_trial
    from optuna_hpcnas.deploy._from_study import deploy_trial
    from optuna_hpcnas.deploy._from_study import parse_limits

    _configure_threads(args)  # imports torch
    if args.verbose < 2:
        quiet_exporter_logs()
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


def cmd_serve(args: argparse.Namespace) -> int:
    from optuna_hpcnas.deploy import serve_command

    return serve_command(args)


def cmd_storage_proxy(args: argparse.Namespace) -> int:
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


def cmd_dashboard(args: argparse.Namespace) -> int:
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
