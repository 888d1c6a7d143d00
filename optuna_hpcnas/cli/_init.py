"""``hpcnas init`` (the starters, package data) and ``hpcnas template`` (launch and
operations files)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
import sys
from typing import TYPE_CHECKING

from optuna_hpcnas.cli._common import CLIError

if TYPE_CHECKING:
    pass


_logger = logging.getLogger("optuna_hpcnas.cli")


# ---------------------------------------------------------------------------- template
def cmd_template(args: argparse.Namespace) -> int:
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


def cmd_init(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.is_dir():
        raise CLIError(f"{args.out!r} is a directory; give a file name such as nas.toml")
    if out.exists() and not args.force:
        raise CLIError(f"{args.out!r} exists; pass --force to overwrite it")
    out.write_text(starter(args.preset))
    print(f"wrote {out}; run it with: hpcnas run --config {out}")
    return 0
