"""The project's ground-truth tables (``bench/data/ground_truth_<task>.parquet``): reading them,
the per-architecture means over training seeds, and their noise ceiling.

A table has one row per (architecture, training seed): ``arch_json``, ``seed``, the validation
and test accuracy and log-loss of the architecture trained alone, ``flops``, ``params``,
``cpu_seconds`` and ``steps``. The Parquet schema's metadata holds the command that built it,
the recipe, the CPU seconds in all and a content hash of the rows (``content_hash``).

The noise ceiling is what the table itself can resolve: Kendall tau between the means of two
disjoint halves of the seeds (every split into halves, averaged), over all architectures and
within the top 10 % by the full mean. No fidelity can be expected to beat it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
TOP_SHARE = 0.1  # "the top 10 %" of every fidelity figure


def table_path(task: str, directory: Path = DATA) -> Path:
    return directory / f"ground_truth_{task}.parquet"


def content_hash(rows: Sequence[dict[str, Any]]) -> str:
    """SHA-256 of the rows in a canonical order and encoding (independent of file layout)."""
    canonical = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()


def write_table(rows: Sequence[dict[str, Any]], path: Path, metadata: dict[str, Any]) -> None:
    """Write ``rows`` atomically, with ``metadata`` and the rows' content hash in the schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ordered = sorted(rows, key=lambda r: (r["arch_index"], r["seed"]))
    table = pa.Table.from_pylist(ordered)
    meta = {**metadata, "content_hash": content_hash(ordered), "rows": len(ordered)}
    table = table.replace_schema_metadata({"ground_truth": json.dumps(meta)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)  # atomic: a kill never leaves half a table


def read_table(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and the metadata of a table; raises ``ValueError`` when the rows do not match
    the recorded content hash."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(b"ground_truth")
    meta = json.loads(raw) if raw else {}
    rows = table.to_pylist()
    if meta and meta.get("content_hash") != content_hash(rows):
        raise ValueError(f"{path}: the rows do not match the table's content hash.")
    return rows, meta


def read_with_shards(task: str, directory: Path = DATA) -> tuple[list[dict[str, Any]], dict]:
    """The rows of a table and of its shards still being built (one row per architecture and
    seed), and the table's metadata (a shard's while the table has none)."""
    path = table_path(task, directory)
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    for part in [*sorted(directory.glob(f"{path.stem}.shard*.parquet")), path]:
        if part.exists():
            found, meta = read_table(part)
            rows.update({(r["arch_index"], r["seed"]): r for r in found})
    return list(rows.values()), meta


@dataclass(frozen=True)
class GroundTruth:
    """Per-architecture statistics over the seeds of a table (architectures with every seed)."""

    archs: list[str]  # arch_json, in arch_index order
    seeds: list[int]
    loss: np.ndarray  # (seeds, archs) validation log-loss
    accuracy: np.ndarray  # (seeds, archs) validation accuracy
    test_accuracy: np.ndarray  # (seeds, archs)
    flops: np.ndarray  # (archs,)
    params: np.ndarray  # (archs,)
    cpu_seconds: np.ndarray  # (seeds, archs)

    @property
    def mean_loss(self) -> np.ndarray:
        return np.asarray(self.loss.mean(axis=0))

    @property
    def sem_loss(self) -> np.ndarray:
        n = self.loss.shape[0]
        return (
            np.asarray(self.loss.std(axis=0, ddof=1) / math.sqrt(n)) if n > 1 else self.loss[0] * 0
        )

    def top(self, share: float = TOP_SHARE) -> np.ndarray:
        """Indices of the best ``share`` by mean validation log-loss (at least 2)."""
        n = max(2, round(share * len(self.archs)))
        return np.argsort(self.mean_loss, kind="stable")[:n]

    def rank_of(self, arch_json: str) -> int:
        """1-based rank of an architecture by mean validation log-loss (1 = the best)."""
        order = np.argsort(self.mean_loss, kind="stable")
        return int(np.nonzero(order == self.archs.index(arch_json))[0][0]) + 1


def ground_truth(rows: Sequence[dict[str, Any]]) -> GroundTruth:
    """The largest complete part of a table, as arrays: the seeds and the architectures that
    have a row for each of those seeds, chosen for the most rows (at least two seeds where
    any two seeds share an architecture, so that a noise ceiling can be measured). A table
    still being built (300 architectures of 3 seeds, 20 of a fourth) gives 300 x 3."""
    by_arch: dict[int, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_arch.setdefault(int(r["arch_index"]), {})[int(r["seed"])] = r
    coverage: dict[int, int] = {}
    for runs in by_arch.values():
        for seed in runs:
            coverage[seed] = coverage.get(seed, 0) + 1
    # the k seeds that cover most architectures, for every k: the rectangle with most rows
    by_coverage = sorted(coverage, key=lambda seed: (-coverage[seed], seed))
    best: tuple[bool, int, int] = (False, 0, 0)
    seeds: list[int] = []
    complete: list[int] = []
    for k in range(1, len(by_coverage) + 1):
        chosen = sorted(by_coverage[:k])
        archs = [i for i in sorted(by_arch) if all(s in by_arch[i] for s in chosen)]
        score = (k >= 2 and bool(archs), k * len(archs), k)
        if archs and score > best:
            best, seeds, complete = score, chosen, archs
    if not complete:
        raise ValueError("No architecture of the table has a row for every seed.")

    def grid(key: str) -> np.ndarray:
        return np.array([[float(by_arch[i][s][key]) for i in complete] for s in seeds])

    return GroundTruth(
        archs=[by_arch[i][seeds[0]]["arch_json"] for i in complete],
        seeds=seeds,
        loss=grid("valid_logloss"),
        accuracy=grid("valid_accuracy"),
        test_accuracy=grid("test_accuracy"),
        flops=grid("flops")[0],
        params=grid("params")[0],
        cpu_seconds=grid("cpu_seconds"),
    )


def kendall_tau(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    from scipy import stats

    return float(stats.kendalltau(np.asarray(a), np.asarray(b)).statistic)


def taus(scores: Sequence[float] | np.ndarray, truth: GroundTruth) -> tuple[float, float]:
    """Kendall tau of ``scores`` (lower is better, one per architecture of ``truth``) against
    the mean validation log-loss, over all architectures and within the top 10 %."""
    scores, reference, top = np.asarray(scores), truth.mean_loss, truth.top()
    return kendall_tau(scores, reference), kendall_tau(scores[top], reference[top])


def noise_ceiling(truth: GroundTruth) -> tuple[float, float]:
    """Kendall tau between the means of two disjoint halves of the seeds, averaged over every
    split (a half of ``floor(n / 2)`` seeds against the rest), overall and within the top 10 %
    by the full mean. Needs at least two seeds."""
    n = len(truth.seeds)
    if n < 2:
        raise ValueError("A noise ceiling needs at least two seeds.")
    top = truth.top()
    overall, within = [], []
    for half in itertools.combinations(range(n), n // 2):
        rest = [k for k in range(n) if k not in half]
        a, b = truth.loss[list(half)].mean(axis=0), truth.loss[rest].mean(axis=0)
        overall.append(kendall_tau(a, b))
        within.append(kendall_tau(a[top], b[top]))
    return float(np.mean(overall)), float(np.mean(within))


def held_out_top_ceiling(truth: GroundTruth, share: float = TOP_SHARE) -> float:
    """The noise ceiling within the top ``share``, the top chosen on one seed held out:
    Kendall tau between the means of two disjoint halves of the other seeds, within the
    best ``share`` by the held-out seed, averaged over every held-out seed and split.

    ``noise_ceiling`` chooses the top by the mean of all seeds, which is the sum of the two
    halves: among architectures selected for a low sum, one half's luck is the other's bad
    luck, so that tau is biased below zero even where the top can be ordered. Choosing on a
    seed neither half holds removes that bias. Needs at least three seeds."""
    n = len(truth.seeds)
    if n < 3:
        raise ValueError("A held-out top ceiling needs at least three seeds.")
    count = max(2, round(share * len(truth.archs)))
    within = []
    for held in range(n):
        top = np.argsort(truth.loss[held], kind="stable")[:count]
        rest = [k for k in range(n) if k != held]
        for half in itertools.combinations(rest, len(rest) // 2):
            other = [k for k in rest if k not in half]
            a, b = truth.loss[list(half)].mean(axis=0), truth.loss[other].mean(axis=0)
            within.append(kendall_tau(a[top], b[top]))
    return float(np.mean(within))
