"""``[distributed] processes``: ``hpcnas run`` starts its own ranks on this machine.

Models as small as MNIST-1D's use a second thread poorly (1.1-1.5x) but a second rank fully:
each rank is an evaluation group that trains its own candidate, as under ``mpirun -n 2``. So a
config may ask ``hpcnas run`` for several processes, and a user who types ``hpcnas run`` on a
laptop gets what ``mpirun -n <cores> hpcnas run`` gives, without knowing MPI. It is the same
job: this process re-runs its own command line under the ``mpirun`` of the MPI that mpi4py
was built with (``python -m mpi4py -m optuna_hpcnas ...``), forwards the signals it gets and
exits with the job's status. Under a launcher (``mpirun``, ``srun``) the launcher decides and
the setting is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any
from typing import TYPE_CHECKING

from optuna_hpcnas._process import alive
from optuna_hpcnas._process import start_time
from optuna_hpcnas._threads import available_cores
from optuna_hpcnas.distributed._groups import find_mpirun
from optuna_hpcnas.distributed._groups import launched_rank_and_size
from optuna_hpcnas.run._launch import LaunchError

if TYPE_CHECKING:
    from optuna_hpcnas.config import RunConfig

_logger = logging.getLogger(__name__)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
# The launching ``hpcnas run`` of the ranks it started: "pid:start time" (see ``follow_launcher``).
LAUNCHER_ENV = "HPCNAS_LAUNCHER"
# What mpich's mpiexec prints (on stdout or stderr, by version) when a rank died of a signal;
# mpiexec then exits with the signal's number, which a rank's own exit status could also be.
_KILLED_BY = re.compile(rb"KILLED BY SIGNAL: (\d+)|EXIT STRING: [^\n]*\(signal (\d+)\)")


def local_processes(config: RunConfig, *, cores: int | None = None) -> int:
    """The ranks ``[distributed] processes`` asks for: an integer as written; ``"auto"``: the
    CPUs this process may use (affinity, cgroup quota) divided by ``[training] threads`` (one
    thread per rank when unset), rounded down to whole evaluation groups."""
    wanted = config.distributed.processes
    if wanted != "auto":
        return int(wanted)
    usable = available_cores() if cores is None else cores
    per_rank = config.training.threads or 1
    group = max(1, config.distributed.group_size)
    return max(1, usable // per_rank // group * group)


def relaunch_command(config: RunConfig, argv: Sequence[str]) -> list[str] | None:
    """The ``mpirun`` command that runs ``hpcnas ARGV`` on ``local_processes(config)`` ranks,
    or ``None`` when this process runs the search itself (one process asked for, or already
    under a launcher).

    Raises:
        LaunchError: More than one process asked for by number, and no ``mpirun`` or no
            mpi4py here (``"auto"`` falls back to one process with a warning instead).
    """
    if launched_rank_and_size()[1] > 1:
        return None
    n = local_processes(config)
    if n <= 1:
        return None
    mpirun = find_mpirun()
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        missing = "mpirun" if mpirun is None else "mpi4py"
        if config.distributed.processes == "auto":
            _logger.warning(
                "[distributed] processes = 'auto' would start %d ranks, but %s is not "
                "installed (pip install 'optuna-hpcnas[mpi]'): running in one process.",
                n,
                missing,
            )
            return None
        raise LaunchError(
            f"[distributed] processes = {n} needs {missing}: pip install 'optuna-hpcnas[mpi]', "
            "or set processes = 1"
        )
    return [mpirun, "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "optuna_hpcnas", *argv]


def follow_launcher(*, interval: float = 1.0) -> threading.Thread | None:
    """In a rank that ``run_relaunched`` started: a daemon thread that sends this process
    SIGTERM once the launching ``hpcnas run`` is gone (killed with its process group, say), so
    the rank gives back its trial and exits instead of running on alone. ``None`` when this
    process was not started that way."""
    value = os.environ.get(LAUNCHER_ENV, "")
    pid_text, _, start = value.partition(":")
    if not pid_text.isdigit():
        return None
    pid = int(pid_text)

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(interval):
            if not alive(pid, start or None):
                _logger.warning("hpcnas run (pid %d) is gone: stopping this rank.", pid)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="hpcnas-launcher-watch", daemon=True)
    thread.start()
    return thread


def _relay(stream: Any, to: Any, killed: list[int]) -> None:
    """Copy one of the job's output streams to ours as it comes, noting a signal mpiexec
    reports."""
    out = getattr(to, "buffer", None)
    tail = b""
    while chunk := stream.read1(65536):
        if out is not None:
            out.write(chunk)
            out.flush()
        else:  # a text stream (captured output)
            to.write(chunk.decode(errors="replace"))
        tail = (tail + chunk)[-512:]
        found = _KILLED_BY.search(tail)
        if found is not None and not killed:
            killed.append(int(found.group(1) or found.group(2)))


def run_relaunched(command: Sequence[str]) -> int:
    """Run ``command`` (``relaunch_command``'s), forwarding SIGINT, SIGTERM and SIGUSR1 to
    it; its exit status, ``128 + N`` when a signal N ended it or one of its ranks. Each rank
    follows this process (``follow_launcher``) and stops when it is gone."""
    _logger.info("starting %s ranks: %s", command[2], " ".join(command))
    env = {**os.environ, LAUNCHER_ENV: f"{os.getpid()}:{start_time(os.getpid()) or ''}"}
    process = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    killed: list[int] = []
    relays = [
        threading.Thread(target=_relay, args=(stream, to, killed), daemon=True)
        for stream, to in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))
    ]
    for relay in relays:
        relay.start()

    def forward(signum: int, frame: object) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    on_main = threading.current_thread() is threading.main_thread()  # handlers live there
    previous = {s: signal.signal(s, forward) for s in _FORWARDED} if on_main else {}
    try:
        status = process.wait()
        for relay in relays:
            relay.join(timeout=10)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if status < 0:
        return 128 - status
    if status != 0 and killed:
        return 128 + killed[0]
    return status
