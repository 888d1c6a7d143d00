"""Load test of a storage, as Optuna tests its own: many worker processes on one study.

``run_load_test(url, sampler="evolutionary", n_workers=16, n_trials=50)`` starts ``n_workers``
processes (``multiprocessing`` spawn: a fresh interpreter each, as separate jobs would be),
each opening ``url`` with :func:`open_storage` and running ``n_trials`` trials of the
``digits-small`` search space with a cheap deterministic objective (a hash of the
architecture). Afterwards :func:`check_load_study` verifies that exactly
``n_workers * n_trials`` trials are COMPLETE, trial numbers are ``0..N-1`` without gaps or
repeats, and each trial's value, intermediate value, parameters and attributes agree with its
architecture; it also counts architectures evaluated twice while unseen ones remained.

Used by ``tests/storages_tests`` (small sizes, every backend) and ``bench/storage_load.py``
(16 x 50 with EvolutionarySampler, 8 x 20 with QUBOSampler). A testing helper like
``optuna.testing``: it imports the samplers, which the storages never do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from collections.abc import Mapping
import contextlib
from dataclasses import dataclass
import functools
import hashlib
import multiprocessing
import os
import socket
import threading
import time
import traceback
from typing import Any
from typing import TYPE_CHECKING
import uuid

from optuna_hpcnas import _keys
from optuna_hpcnas._validation import check_int
from optuna_hpcnas.samplers import SamplerConfig
from optuna_hpcnas.storages._open import describe_storage
from optuna_hpcnas.storages._open import open_storage

if TYPE_CHECKING:
    import optuna

    from optuna_hpcnas.search_space import Architecture
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

_PRESET = "digits-small"


def architecture_score(arch: Architecture) -> float:
    """A deterministic value in [0, 1) per architecture (no training: the load is the storage)."""
    digest = hashlib.sha256(arch.to_json().encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _objective(space: HierarchicalSearchSpace, worker: int, trial: optuna.Trial) -> float:
    arch = space.suggest(trial)
    value = architecture_score(arch)
    trial.set_user_attr(_keys.OBJECTIVE_ARCH, arch.to_json())
    trial.set_user_attr(_keys.LOADTEST_WORKER, worker)
    trial.set_user_attr(_keys.LOADTEST_NUMBER, trial.number)
    trial.report(value, 0)
    return value


def _worker(
    url: str,
    study_name: str,
    sampler: str,
    n_trials: int,
    seed: int,
    index: int,
    barrier: Any,
    errors: Any,
) -> None:
    try:
        import optuna

        from optuna_hpcnas.search_space import HierarchicalSearchSpace

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=study_name,
            storage=open_storage(url),
            sampler=SamplerConfig(name=sampler, seed=seed + index).build(),
        )
        space = HierarchicalSearchSpace.preset(_PRESET)
        barrier.wait()
        study.optimize(functools.partial(_objective, space, index), n_trials=n_trials)
    except BaseException:
        barrier.abort()
        errors.put(f"worker {index}:\n{traceback.format_exc()}")
        raise SystemExit(1) from None


@dataclass(frozen=True)
class LoadTestResult:
    """What one load test saw: sizes, time, trial states and the problems found."""

    storage: str
    sampler: str
    n_workers: int
    n_trials: int
    wall_s: float
    states: dict[str, int]
    n_unique_architectures: int
    repeated_architectures: int
    problems: tuple[str, ...]

    @property
    def expected(self) -> int:
        return self.n_workers * self.n_trials

    @property
    def n_complete(self) -> int:
        return self.states.get("COMPLETE", 0)

    @property
    def trials_per_s(self) -> float:
        return self.n_complete / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def ok(self) -> bool:
        return not self.problems


def run_load_test(
    url: str,
    *,
    sampler: str = "evolutionary",
    n_workers: int = 16,
    n_trials: int = 50,
    seed: int = 0,
    timeout: float = 1800.0,
) -> LoadTestResult:
    """Run ``n_workers`` processes x ``n_trials`` trials on ``url``, then check the study.

    Workers start together (a barrier after their imports), so the storage sees them at once;
    ``wall_s`` runs from the barrier to the last worker's exit. A worker that fails or a
    timeout is reported in ``problems``, never raised.
    """
    import optuna

    for name, value in (("n_workers", n_workers), ("n_trials", n_trials)):
        check_int(name, value, 1)
    SamplerConfig(name=sampler, seed=seed)  # a bad name fails here, not in every worker
    study_name = f"load-{sampler}-{uuid.uuid4().hex[:8]}"
    optuna.create_study(storage=open_storage(url), study_name=study_name, direction="maximize")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_workers + 1, timeout=timeout)
    errors = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(url, study_name, sampler, n_trials, seed, i, barrier, errors),
            name=f"load-worker-{i}",
        )
        for i in range(n_workers)
    ]
    for p in procs:
        p.start()
    problems: list[str] = []
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        problems.append("workers did not all start")
    start = time.perf_counter()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    wall = time.perf_counter() - start
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            problems.append(f"{p.name} did not finish within {timeout:.0f} s")
        elif p.exitcode != 0:
            problems.append(f"{p.name} exited with {p.exitcode}")
    while not errors.empty():
        problems.append(errors.get())
    fresh = optuna.load_study(study_name=study_name, storage=open_storage(url))
    report = check_load_study(fresh, n_workers=n_workers, n_trials=n_trials)
    return LoadTestResult(
        storage=describe_storage(url),
        sampler=sampler,
        n_workers=n_workers,
        n_trials=n_trials,
        wall_s=wall,
        states=report.states,
        n_unique_architectures=report.n_unique,
        repeated_architectures=report.repeated,
        problems=tuple(problems) + report.problems,
    )


@dataclass(frozen=True)
class StudyCheck:
    """The findings of :func:`check_load_study`."""

    states: dict[str, int]
    n_unique: int
    repeated: int
    problems: tuple[str, ...]


def check_load_study(study: optuna.Study, *, n_workers: int, n_trials: int) -> StudyCheck:
    """Check a load-test study: counts, numbering, and each trial against its architecture.

    ``repeated`` counts trials whose architecture an earlier trial (by number) already had,
    while the space still held unseen ones (the samplers should avoid those).
    """
    from optuna_hpcnas.search_space import HierarchicalSearchSpace

    space = HierarchicalSearchSpace.preset(_PRESET)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    expected = n_workers * n_trials
    states = dict(Counter(t.state.name for t in trials))
    problems: list[str] = []
    if states.get("COMPLETE", 0) != expected or len(trials) != expected:
        problems.append(f"expected {expected} COMPLETE trials, found {states}")
    numbers = [t.number for t in trials]
    if numbers != list(range(len(trials))):
        dupes = sorted(n for n, c in Counter(numbers).items() if c > 1)
        problems.append(f"trial numbers are not 0..{len(trials) - 1} (repeated: {dupes[:10]})")
    if len({t._trial_id for t in trials}) != len(trials):
        problems.append("trial ids repeat")
    per_worker: Counter[Any] = Counter()
    seen: set[str] = set()
    repeated = 0
    cardinality = space.cardinality()
    for t in trials:
        per_worker[t.user_attrs.get(_keys.LOADTEST_WORKER)] += 1
        problem = _check_trial(space, t)
        if problem:
            problems.append(f"trial {t.number}: {problem}")
            continue
        key = t.user_attrs[_keys.OBJECTIVE_ARCH]
        if key in seen and len(seen) < cardinality:
            repeated += 1
        seen.add(key)
    wrong = {w: c for w, c in per_worker.items() if c != n_trials}
    if set(per_worker) != set(range(n_workers)) or wrong:
        problems.append(f"trials per worker differ from {n_trials}: {dict(per_worker)}")
    return StudyCheck(states, len(seen), repeated, tuple(problems[:50]))


def _check_trial(space: HierarchicalSearchSpace, t: optuna.trial.FrozenTrial) -> str | None:
    if t.value is None:
        return f"no value (state {t.state.name})"
    try:
        arch = space.from_params(t.params)
    except (KeyError, ValueError, TypeError) as e:
        return f"params do not decode: {e}"
    if t.user_attrs.get(_keys.OBJECTIVE_ARCH) != arch.to_json():
        return "stored architecture differs from its params"
    score = architecture_score(arch)
    if t.value != score:
        return f"value {t.value} is not the score {score} of its params"
    if t.intermediate_values != {0: score}:
        return f"intermediate values {t.intermediate_values} differ from {{0: {score}}}"
    if t.user_attrs.get(_keys.LOADTEST_NUMBER) != t.number:
        return f"ran as number {t.user_attrs.get(_keys.LOADTEST_NUMBER)}, stored as {t.number}"
    for name, dist in t.distributions.items():
        try:
            dist.to_internal_repr(t.params[name])  # a categorical raises for a foreign value
        except ValueError:
            return f"param {name}={t.params[name]!r} outside its distribution"
    return None


# ------------------------------------------------------------------ backends for benchmarks

BACKEND_KINDS = ("sqlite", "postgresql", "mysql", "journal-redis", "journal-file", "grpc")
DEFAULT_SERVER_URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mysql": "mysql+pymysql://root@127.0.0.1:3306/test",
    "journal-redis": "redis://127.0.0.1:6379",
}


@contextlib.contextmanager
def provision_backend(
    kind: str,
    workdir: str,
    *,
    server_urls: Mapping[str, str] | None = None,
    proxy_over: str = "postgresql",
) -> Iterator[str]:
    """A fresh, empty storage of ``kind`` for one benchmark run; removed afterwards.

    PostgreSQL and MySQL get a new database on the server (``server_urls`` names an admin
    URL per kind), the Redis journal a free database number (claimed, flushed afterwards),
    files go to ``workdir``, and ``"grpc"`` starts a proxy in this process over a fresh
    ``proxy_over`` storage (``"postgresql"``, ``"mysql"`` or ``"sqlite"``).
    """
    urls = {**DEFAULT_SERVER_URLS, **(server_urls or {})}
    if kind == "sqlite":
        yield f"sqlite:///{os.path.join(workdir, f'bench-{uuid.uuid4().hex[:8]}.db')}"
    elif kind == "journal-file":
        yield os.path.join(workdir, f"bench-{uuid.uuid4().hex[:8]}.journal")
    elif kind in ("postgresql", "mysql"):
        yield from _fresh_database(urls[kind], kind)
    elif kind == "journal-redis":
        yield from _fresh_redis_db(urls[kind])
    elif kind == "grpc":
        from optuna_hpcnas.storages._proxy import start_storage_proxy

        with provision_backend(proxy_over, workdir, server_urls=server_urls) as inner:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            server = start_storage_proxy(inner, port=port)
            try:
                yield f"grpc://127.0.0.1:{port}"
            finally:
                server.stop(grace=None)
    else:
        raise ValueError(f"`kind` is {kind!r}, but must be one of {', '.join(BACKEND_KINDS)}.")


def _fresh_database(admin_url: str, kind: str) -> Iterator[str]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"hpcnas_bench_{uuid.uuid4().hex[:10]}"
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        force = " WITH (FORCE)" if kind == "postgresql" else ""
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name}{force}"))
        engine.dispose()


def _fresh_redis_db(admin_url: str) -> Iterator[str]:
    import redis

    base = admin_url.rstrip("/")
    token = uuid.uuid4().hex
    for db in range(1, 16):
        client = redis.Redis.from_url(f"{base}/{db}")
        if client.set("hpcnas-bench:claim", token, nx=True, ex=3600):
            if client.dbsize() == 1:
                break
            client.delete("hpcnas-bench:claim")  # someone's data is there: give it back
        client.close()
    else:
        raise RuntimeError(f"no free Redis database at {base}")
    try:
        yield f"{base}/{db}"
    finally:
        client.flushdb()
        client.close()
