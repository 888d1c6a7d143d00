"""Small, fast run configurations for tests of ``hpcnas run`` (seconds on one core)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = {
    "study": {"name": "tiny", "n_trials": 4},
    "space": {"preset": "digits-small"},
    "data": {"name": "digits", "max_samples": 200},
    "sampler": {"name": "random", "seed": 0},
    "pruner": {"name": "staged"},
    "stages": {
        "stages": [
            {"name": "quick", "steps": 3, "lr": 1e-3, "promote": 0.5},
            {"name": "medium", "steps": 3, "lr": 1e-2},
        ],
        "eval_every": 3,
    },
    "training": {
        "epochs": 1,
        "paths_per_batch": 2,
        "sampling": "fair",
        "batch_size": 32,
        "warmup_max_batches": 3,
        "threads": 1,
    },
    "objective": {
        "optimizer": "adam",
        "batch_size": 32,
        "latency_repeats": 1,
    },
    "export": {"steps": 6, "latency_repeats": 1},
}


def tiny_config(**sections: dict[str, Any]) -> dict[str, Any]:
    """``TINY`` with the keys of ``sections`` replaced (section by section, key by key)."""
    out = copy.deepcopy(TINY)
    for name, values in sections.items():
        out.setdefault(name, {}).update(values)
    return out


def write_config(path: Path, data: dict[str, Any]) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(data))
    return path


def batched_one_shot_config(path: Path, url: str, **sections: dict[str, Any]) -> Path:
    """A one-shot run of 300 ``digits-elastic`` trials ("sig" on ``url``) whose candidates are
    told in batches of 200, so that a signal arrives with a batch held: written to ``path``.
    ``sections`` add keys (``distributed`` merged with the batch size)."""
    distributed = {"one_shot_batch": 200, **sections.pop("distributed", {})}
    return write_config(
        path,
        tiny_config(
            study={"name": "sig", "storage": url, "n_trials": 300},
            space={"preset": "digits-elastic"},
            training={"sandwich": True, "paths_per_batch": 3},
            objective={"mode": "one-shot", "finalists": 2},
            distributed=distributed,
            **sections,
        ),
    )
