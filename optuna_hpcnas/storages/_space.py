"""``out_of_space``: one line for an error a full or read-only disk caused, wherever it came
from (a file, SQLite, a database server), so ``hpcnas run`` ends with that line and exit
status 2 instead of a traceback. ``launch`` asks it about every error of a run."""

from __future__ import annotations

import errno

_ERRNO = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "a file reached the size limit",
    errno.EROFS: "the file system is read-only",
}
# What SQLite, PostgreSQL and MySQL say (in their exception's text) for the same causes.
_DATABASE = (
    ("database or disk is full", "the database's disk is full"),
    ("no space left on device", "the database server's disk is full"),
    ("could not extend file", "the database server's disk is full"),
    ("disk full", "the database server's disk is full"),
    ("the table is full", "the database server's disk is full"),
    ("attempt to write a readonly database", "the database is read-only"),
    ("read-only file system", "the file system is read-only"),
    # SQLite's answer to EFBIG and EDQUOT on its -wal file (SQLITE_FULL is ENOSPC only)
    (
        "disk i/o error",
        "SQLite could not write its files (a full disk, a quota or file-size limit, or a "
        "failing device)",
    ),
)


def out_of_space(error: BaseException) -> str | None:
    """``"<cause> (<detail>)"`` if ``error`` (or an error it was raised from) says that a disk
    is full or read-only, else ``None``.

    Examples:
        >>> import errno
        >>> out_of_space(OSError(errno.ENOSPC, "No space left on device", "/ckpt/a.tmp"))
        'no space left on the device (/ckpt/a.tmp)'
        >>> out_of_space(ValueError("x")) is None
        True
    """
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _ERRNO:
            where = e.filename if e.filename is not None else e.strerror
            return f"{_ERRNO[e.errno]} ({where})"
        text = str(e).lower()
        for needle, cause in _DATABASE:
            if needle in text:
                first = str(e).strip().splitlines()[0] if str(e).strip() else needle
                return f"{cause} ({first[:200]})"
        todo += [c for c in (e.__cause__, e.__context__, getattr(e, "orig", None)) if c]
    return None
