"""SQLite keeps every told trial while other processes read the study or write beside the run.

Each test runs ``hpcnas run`` as a user types it, with ``-vv`` so each leader logs every trial
it tells right after the write; at the end every told result must be in the file with its
state. Before the fix, the first reader to close its connection deleted the run's write-ahead
log (the run had dropped SQLite's POSIX locks by closing a descriptor of its own on the file),
the run went on writing into the deleted log and ended with ``disk I/O error``.
"""

from __future__ import annotations

from collections.abc import Callable
import os
from pathlib import Path
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import optuna
import pytest

from tests.mpi_helpers import mpirun_path
from tests.run_configs import tiny_config
from tests.run_configs import write_config

HPCNAS = str(Path(sys.executable).with_name("hpcnas"))
DASHBOARD = str(Path(sys.executable).with_name("optuna-dashboard"))
_TOLD = re.compile(r"Trial (\d+) told (COMPLETE|PRUNED|FAIL)\.")
# A budget the runs cannot finish: they stop at the timeout, so the readers have the same time
# to read however fast the machine is.
N_TRIALS = 400
TIMEOUT_S = 20

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPTUNA_STORAGE"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _config(tmp_path: Path, name: str = "shared") -> Path:
    return write_config(
        tmp_path / "nas.toml",
        tiny_config(
            study={
                "name": name,
                "storage": "sqlite:///nas.db",
                "n_trials": N_TRIALS,
                "timeout": TIMEOUT_S,
            }
        ),
    )


def _start(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT)


def _told(log: Path) -> dict[int, str]:
    told: dict[int, str] = {}
    for number, state in _TOLD.findall(log.read_text(errors="replace")):
        assert int(number) not in told, f"trial {number} told twice"
        told[int(number)] = state
    return told


def _assert_kept(tmp_path: Path, told: dict[int, str], study_name: str = "shared") -> None:
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path / 'nas.db'}")
    states = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    assert told, "no trial was told"
    lost = {n: s for n, s in told.items() if states.get(n) != s}
    assert not lost, f"told but not kept (told state -> stored state): {lost} / {states}"


class _Readers:
    """Other processes reading the study in loops while the run writes, and a watch on the
    write-ahead log: it must exist while the run still has trials to tell (SQLite deletes it
    only when the last connection closes)."""

    def __init__(self, cwd: Path, run_logs: list[Path], readers: list[Callable[[], None]]):
        self._cwd = cwd
        self._logs = run_logs
        self._stop = threading.Event()
        self.reads = [0] * len(readers)  # reads finished while the run went on, per reader
        self.wal_missing: list[int] = []  # told count whenever the log was found missing
        self._threads = [
            threading.Thread(target=self._loop, args=(i, r)) for i, r in enumerate(readers)
        ]
        self._threads.append(threading.Thread(target=self._watch_wal))

    def __enter__(self) -> _Readers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _loop(self, index: int, read: Callable[[], None]) -> None:
        while not self._stop.is_set():
            read()
            if not self._stop.is_set():
                self.reads[index] += 1
            time.sleep(0.2)

    def _told_count(self) -> int:
        return sum(len(_TOLD.findall(p.read_text(errors="replace"))) for p in self._logs)

    def _watch_wal(self) -> None:
        wal = self._cwd / "nas.db-wal"
        seen = False
        while not self._stop.is_set():
            told = self._told_count()
            if wal.exists():
                seen = True
            elif seen:
                self.wal_missing.append(told)
            time.sleep(0.1)


def _cli_reader(cwd: Path, *args: str) -> Callable[[], None]:
    def read() -> None:
        subprocess.run([HPCNAS, *args], cwd=cwd, env=_env(), capture_output=True, timeout=120)

    return read


def _load_study_reader(cwd: Path) -> Callable[[], None]:
    code = (
        "import optuna, sys\n"
        "try:\n"
        "    s = optuna.load_study(study_name='shared', storage='sqlite:///nas.db')\n"
        "    for _ in range(5): s.get_trials()\n"
        "except KeyError: pass\n"
    )

    def read() -> None:
        subprocess.run(
            [sys.executable, "-c", code], cwd=cwd, env=_env(), capture_output=True, timeout=120
        )

    return read


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dashboard_reader(cwd: Path) -> Callable[[], None]:
    """optuna-dashboard opened, read and closed again, as a user looks in and leaves (one kept
    open the whole time would hold the log open itself and hide a deletion)."""

    def read() -> None:
        port = _free_port()
        server = subprocess.Popen(
            [DASHBOARD, "sqlite:///nas.db", "--host", "127.0.0.1", "--port", str(port)],
            cwd=cwd,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    for path in ("/api/studies", "/api/studies/1?after=0"):
                        url = f"http://127.0.0.1:{port}{path}"
                        urllib.request.urlopen(url, timeout=10).read()
                    return
                except OSError:
                    time.sleep(0.2)  # not up yet, or no study yet
        finally:
            server.terminate()
            server.wait(timeout=30)

    return read


def _run_with_readers(tmp_path: Path, argv: list[str]) -> None:
    config = _config(tmp_path)
    log = tmp_path / "run.log"
    readers = [
        _cli_reader(tmp_path, "best", "--config", config.name),
        _cli_reader(tmp_path, "status", "--config", config.name),
        _load_study_reader(tmp_path),
        _dashboard_reader(tmp_path),
    ]
    run = _start(argv, tmp_path, log)
    with _Readers(tmp_path, [log], readers) as watch:
        code = run.wait(timeout=600)
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "disk I/O error" not in text and "Traceback" not in text, text[-3000:]
    assert min(watch.reads) >= 1, f"reads finished during the run, per reader: {watch.reads}"
    told = _told(log)
    assert len(told) >= 5
    # From the first tell to the last the run holds connections, so the log must be there
    # (before, readers and the run's own start-up open and close the file; after, it ends).
    early = [n for n in watch.wal_missing if 0 < n < len(told)]
    assert early == [], "the write-ahead log was deleted under the running search"
    _assert_kept(tmp_path, told)


def test_readers_beside_a_run_lose_no_trial(tmp_path: Path) -> None:
    _run_with_readers(tmp_path, [HPCNAS, "-vv", "run", "--config", "nas.toml", "--no-progress"])


@pytest.mark.mpi
def test_readers_beside_an_mpirun_lose_no_trial(tmp_path: Path) -> None:
    argv = [mpirun_path(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas"]
    _run_with_readers(tmp_path, [*argv, "-vv", "run", "--config", "nas.toml", "--no-progress"])


def test_two_runs_on_one_new_file_keep_every_told_result(tmp_path: Path) -> None:
    _config(tmp_path)
    argv = [HPCNAS, "-vv", "run", "--config", "nas.toml", "--no-progress"]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    runs = [_start(argv, tmp_path, log) for log in logs]
    codes = [run.wait(timeout=600) for run in runs]
    texts = [log.read_text(errors="replace") for log in logs]
    for code, text in zip(codes, texts):
        assert code == 0, text[-3000:]
        assert "disk I/O error" not in text and "Traceback" not in text, text[-3000:]
    told = [_told(log) for log in logs]
    assert not set(told[0]) & set(told[1]), "both runs told the same trial"
    _assert_kept(tmp_path, {**told[0], **told[1]})
