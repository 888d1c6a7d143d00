"""Who a process is (host, pid, start time) and whether it is gone, read from ``/proc``.

A pid alone is not an identity: pids are reused. With its start time (clock ticks since
boot, ``/proc/PID/stat``) a record names one process for the life of the machine, so a
process on the same host can be declared dead without waiting for a heartbeat to go stale.
"""

from __future__ import annotations

import os
from pathlib import Path
import socket
from typing import Any


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the state first), or
    ``None`` without ``/proc`` or such a process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``None`` if unknown)."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` (started at ``start``, when given) runs on this machine: not
    gone, not a zombie, not a newer process with the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat(pid)
    if fields is None:  # no /proc: the signal's answer is all there is
        return True
    return fields[0] != "Z" and (start is None or fields[19] == start)


def this_process() -> dict[str, Any]:
    """This process as a record: ``{"host", "pid", "start"}``."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": start_time(pid)}


def known_dead(record: Any) -> bool:
    """Whether ``record`` (``this_process()`` of some process) names a process of this host
    that is gone. ``False`` for another host's process or a record that cannot tell."""
    if not isinstance(record, dict) or record.get("host") != socket.gethostname():
        return False
    pid, start = record.get("pid"), record.get("start")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if not isinstance(start, str):  # a pid without its start time could be a newer process
        return False
    return not alive(pid, start)
