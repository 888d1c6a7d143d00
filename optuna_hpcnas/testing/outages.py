"""Storage outages on purpose: throw-away servers that can be stopped and started again, or
frozen with SIGSTOP and thawed (a PostgreSQL cluster by ``initdb`` + ``pg_ctl`` in a temporary
directory, a Redis server, each on a free port of 127.0.0.1) and :func:`run_outage_scenario`,
which runs ``hpcnas run`` as a user types it (``hpcnas init``, the file edited), takes the
server away in the middle of the search and brings it back, then ``hpcnas resume`` when the
run gave up, and counts what was lost or done twice.

Used by the outage tests (``tests/storages_tests/test_outage_servers.py``) and
``bench/storage_outage.py``. A testing helper like ``optuna_hpcnas.testing.storages``:
nothing else in the package imports it.

Examples:
    .. code-block:: python

        with PostgresServer() as server:
            url = server.url  # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
            server.stop()  # pg_ctl stop -m fast
            server.start()  # the same data directory and port
            server.freeze()  # SIGSTOP: connections stay open, nothing answers
            server.thaw()
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
import datetime
import glob
import os
from pathlib import Path
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import Any

_START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_bin() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (newest under ``/usr/lib/postgresql``, else
    on ``PATH``), or ``None``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version_key)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parts[-3]
    return tuple(int(p) for p in version.split(".") if p.isdigit())


class _Server(abc.ABC):
    """Start, stop and start again; ``close`` removes everything."""

    url: str

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server (again) on its port."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it, keeping its data."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop it and remove its data."""

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _signal_if_alive(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``, skipping a process that has exited since it was listed."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


class PostgresServer(_Server):
    """A PostgreSQL cluster of its own on a free port (trust authentication, fsync off).

    PostgreSQL refuses to run as root: as root the cluster belongs to, and runs as,
    ``user`` (``runuser``).

    Args:
        port: The port (default: a free one).
        user: The system user that runs the server when this process is root.
    """

    def __init__(self, *, port: int | None = None, user: str = "postgres") -> None:
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise FileNotFoundError("PostgreSQL's initdb/pg_ctl not found (install postgresql)")
        self._bin = bin_dir
        self.port = port if port is not None else free_port()
        self._root = Path(tempfile.mkdtemp(prefix="hpcnas-pg-"))
        self._as: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise FileNotFoundError("running as root, and runuser is missing")
            entry = pwd.getpwnam(user)
            os.chown(self._root, entry.pw_uid, entry.pw_gid)
            self._as = [runuser, "-u", user, "--"]
        self._data = self._root / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        if not self._data.exists():
            self._run(
                str(self._bin / "initdb"), "-D", str(self._data), "-A", "trust",
                "-U", "postgres", "--no-sync",
            )  # fmt: skip
        options = (
            f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off"
        )
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(self._data), "-o", options,
            "-l", str(self._root / "server.log"), "-w", "-t", str(int(_START_TIMEOUT_S)), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast`` (or ``immediate``, a crash): connections are cut."""
        self._run(str(self._bin / "pg_ctl"), "-D", str(self._data), "-m", mode, "-w", "stop")

    def _postmaster(self) -> int:
        """The postmaster's pid: the first line of ``postmaster.pid``."""
        return int((self._data / "postmaster.pid").read_text().split("\n", 1)[0])

    def _children(self, postmaster: int) -> list[int]:
        """The postmaster's children (backends, checkpointer, ...: ``/proc/*/stat`` with its
        pid as parent)."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # exited meanwhile
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return children

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every backend: the server holds its connections
        open and answers nothing, as a frozen host does (the kernel still accepts and
        acknowledges). The postmaster first, so that it forks no backend meanwhile; its
        children are listed once it is stopped, and one that has exited since is skipped."""
        postmaster = self._postmaster()
        os.kill(postmaster, signal.SIGSTOP)
        for pid in self._children(postmaster):
            _signal_if_alive(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``: the backends first, then the postmaster."""
        postmaster = self._postmaster()
        for pid in self._children(postmaster):
            _signal_if_alive(pid, signal.SIGCONT)
        os.kill(postmaster, signal.SIGCONT)

    def close(self) -> None:
        if (self._data / "postmaster.pid").exists():
            try:
                self.thaw()  # a frozen server cannot stop
            except (OSError, ValueError):
                pass
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self._root, ignore_errors=True)


class RedisServer(_Server):
    """A Redis server of its own on a free port whose data survives a stop and a start (an
    append-only file in a temporary directory, synced at every write), as a production Redis
    restarted after a crash or an out-of-memory kill keeps its journal.

    Args:
        port: The port (default: a free one).
    """

    def __init__(self, *, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found (install redis)")
        self._binary = binary
        self.port = port if port is not None else free_port()
        self._root = Path(tempfile.mkdtemp(prefix="hpcnas-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [
                self._binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self._root), "--save", "", "--appendonly", "yes",
                "--appendfsync", "always",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._answers():
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {self.port} did not answer")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def freeze(self) -> None:
        """SIGSTOP: the server holds its connections open and answers nothing, as a frozen
        host or a network partition does (the kernel still accepts and acknowledges)."""
        assert self._proc is not None, "the server is not running"
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``."""
        assert self._proc is not None, "the server is not running"
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM: clients are cut; the append-only file keeps every write."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=60)
            self._proc = None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)  # a frozen server dies on SIGKILL too
            self._proc.kill()
            self._proc.wait(timeout=60)
            self._proc = None
        shutil.rmtree(self._root, ignore_errors=True)


# ---------------------------------------------------------------------------- the scenario
# A search of a few seconds a trial on one core: digits, tiny supernet, no pruning.
_TINY: dict[str, dict[str, Any]] = {
    "data": {"max_samples": 300},
    "sampler": {"name": "random", "seed": 0},
    "pruner": {"name": "none"},
    "stages": {"stages": [{"name": "quick", "steps": 8, "lr": 1e-3}], "eval_every": 4},
    "training": {"epochs": 1, "paths_per_batch": 2, "warmup_max_batches": 2, "threads": 1},
    "objective": {"batch_size": 32, "latency_repeats": 1},
}


@dataclass(frozen=True)
class OutageResult:
    """What one run through an outage did.

    Attributes:
        exit_status: ``hpcnas run``'s exit status.
        output: Its stdout and stderr, interleaved.
        outage_s: How long the server was down.
        stop_to_exit_s: From the server's stop to the run's exit.
        resume_after_s: From the server's start to the first trial the run wrote after it
            (``None``: nothing written after it).
        resumed: ``hpcnas resume``'s exit status and output, when the run did not finish.
        n_trials: The budget.
        finished: Budget trials finished (COMPLETE or PRUNED).
        left: Trials RUNNING or WAITING at the end.
        failed: FAIL trials (a run that rode the outage out has none).
        duplicated: Trials whose evaluation was done twice: retries of a trial that had
            finished (COMPLETE or PRUNED).
        unfinished: One line per trial left RUNNING or WAITING (number, state, start, its
            system attributes), for a failing test's message.
    """

    exit_status: int
    output: str
    outage_s: float
    stop_to_exit_s: float
    resume_after_s: float | None
    resumed: tuple[int, str] | None
    n_trials: int
    finished: int
    left: int
    failed: int
    duplicated: int
    unfinished: str = ""

    @property
    def lost(self) -> int:
        """Budget trials neither finished nor left to run."""
        return self.n_trials - self.finished

    def lines(self, text: str) -> list[str]:
        return [line for line in self.output.splitlines() if text in line]


def hpcnas_command(ranks: int) -> list[str]:
    """``python -m optuna_hpcnas``, or under ``mpirun -n ranks`` (``python -m mpi4py``)."""
    if ranks == 1:
        return [sys.executable, "-m", "optuna_hpcnas"]
    from optuna_hpcnas.distributed._groups import find_mpirun

    mpirun = find_mpirun()
    if mpirun is None:
        raise FileNotFoundError("mpirun not found: install the `mpi` extra (mpi4py + mpich)")
    return [mpirun, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas"]


def write_outage_config(
    workdir: Path,
    url: str,
    *,
    n_trials: int,
    tolerance_s: float,
    heartbeat_s: int = 1,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """``hpcnas init`` in ``workdir``, its ``nas.toml`` edited for a short search on ``url``
    (and ``sections``, table by table)."""
    import tomli_w
    import tomllib

    subprocess.run(
        [sys.executable, "-m", "optuna_hpcnas", "init"], cwd=workdir, check=True,
        capture_output=True, timeout=120,
    )  # fmt: skip
    path = workdir / "nas.toml"
    config = tomllib.loads(path.read_text())
    for section, values in _TINY.items():
        config.setdefault(section, {}).update(values)
    config["study"].update({"name": "outage", "storage": url, "n_trials": n_trials})
    config["storage"]["outage_tolerance_s"] = tolerance_s
    grace = 3 * heartbeat_s
    config["checkpoints"] = {"heartbeat_interval": heartbeat_s, "grace_period": grace}
    for section, values in (sections or {}).items():
        config.setdefault(section, {}).update(values)
    path.write_text(tomli_w.dumps(config))
    return path


def _trials(url: str) -> list[Any]:
    import optuna

    from optuna_hpcnas.storages import open_storage

    storage = open_storage(url, must_exist=True)
    try:
        return optuna.load_study(study_name="outage", storage=storage).get_trials(deepcopy=False)
    finally:
        engine = getattr(storage, "engine", None)
        if engine is not None:
            engine.dispose()


def _finished_count(url: str) -> int:
    try:
        return sum(t.state.is_finished() for t in _trials(url))
    except Exception:  # not created yet
        return 0


class _Process:
    """A command whose output is collected by a thread (a full pipe never blocks it) and
    whose exit time is noted by whoever polls it."""

    def __init__(self, cmd: list[str], workdir: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.exited_at: float | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._chunks.append(line)

    def poll(self) -> int | None:
        status = self.proc.poll()
        if status is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return status

    def wait(self, timeout: float) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.poll()
        self._reader.join(timeout=10)
        return self.proc.returncode, "".join(self._chunks)


def run_outage_scenario(
    server: _Server,
    workdir: Path,
    *,
    ranks: int = 1,
    outage_s: float = 10.0,
    tolerance_s: float = 120.0,
    n_trials: int = 6,
    stop_after: int = 2,
    timeout: float = 300.0,
    sections: dict[str, dict[str, Any]] | None = None,
    freeze: bool = False,
) -> OutageResult:
    """``hpcnas run`` on ``server`` (started), the server stopped (``freeze``: frozen with
    SIGSTOP) once ``stop_after`` trials are finished and started again
    (thawed) ``outage_s`` later; ``hpcnas resume`` after a run that did not finish (once the
    trials it held are past their grace period)."""
    config = write_outage_config(
        workdir, server.url, n_trials=n_trials, tolerance_s=tolerance_s, sections=sections
    )
    run = _Process([*hpcnas_command(ranks), "run", "--config", str(config), "--no-progress"],
                   workdir)  # fmt: skip
    deadline = time.monotonic() + timeout
    while _finished_count(server.url) < stop_after:
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run ended before the outage: {run.wait(1)[1]}")
        time.sleep(0.2)
    if not freeze:
        pause, resume = server.stop, server.start
    elif isinstance(server, RedisServer | PostgresServer):
        pause, resume = server.freeze, server.thaw
    else:
        raise TypeError(f"a {type(server).__name__} does not freeze")
    pause()
    stopped = time.monotonic()
    while time.monotonic() - stopped < outage_s:
        run.poll()
        time.sleep(0.05)
    resume()
    back_wall = datetime.datetime.now()
    outage = time.monotonic() - stopped
    status, output = run.wait(max(1.0, deadline - time.monotonic()))
    assert run.exited_at is not None
    resumed = None
    if status != 0:
        time.sleep(3.5)  # past the grace period of the trials the run held
        again = [*hpcnas_command(ranks), "resume", "--config", str(config), "--no-progress"]
        resumed = _Process(again, workdir).wait(timeout)
    return _result(server.url, status, output, outage, run.exited_at - stopped, back_wall,
                   resumed, n_trials)  # fmt: skip


def _result(
    url: str,
    status: int,
    output: str,
    outage: float,
    stop_to_exit: float,
    back: datetime.datetime,
    resumed: tuple[int, str] | None,
    n_trials: int,
) -> OutageResult:
    from optuna.trial import TrialState

    trials = _trials(url)
    by_number = {t.number: t for t in trials}
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    writes = [
        stamp
        for t in trials
        for stamp in (t.datetime_start, t.datetime_complete)
        if stamp is not None and stamp >= back
    ]
    duplicated = sum(
        1
        for t in trials
        if t.state in done
        and "failed_trial" in t.system_attrs
        and by_number[t.system_attrs["failed_trial"]].state in done
    )
    return OutageResult(
        exit_status=status,
        output=output,
        outage_s=outage,
        stop_to_exit_s=stop_to_exit,
        resume_after_s=(min(writes) - back).total_seconds() if writes else None,
        resumed=resumed,
        n_trials=n_trials,
        finished=sum(t.state in done for t in trials),
        left=sum(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials),
        failed=sum(t.state == TrialState.FAIL for t in trials),
        duplicated=duplicated,
        unfinished="\n".join(
            f"trial {t.number} {t.state.name} started {t.datetime_start} {t.system_attrs}"
            for t in trials
            if not t.state.is_finished()
        ),
    )
