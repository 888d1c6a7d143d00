"""Output directories of ``hpcnas export`` and ``hpcnas deploy``: staged, then moved in.

Every file is written into a hidden staging directory inside the output directory and moved
into place with ``os.replace`` only once the whole set is ready, so

* a refused or failed run leaves the output directory as it was (and removes it when the run
  created it);
* a name already in the directory that is a symbolic link (``model.onnx``, ``chart/``, ...)
  is replaced as a link: the file or directory it points to is never written.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
import os
from pathlib import Path
import shutil
import tempfile

STAGING_PREFIX = ".hpcnas-staging-"


class Staging:
    """A staging directory (``path``) and the output directory its entries move into."""

    def __init__(self, out: Path, path: Path) -> None:
        self.out = out
        self.path = path

    def remove(self, name: str) -> None:
        """Remove ``out/name`` (a link is removed, never followed); nothing if absent."""
        target = self.out / name
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)

    def commit(self, names: Sequence[str]) -> None:
        """Move the staged top-level entries ``names`` into the output directory, in order."""
        for name in names:
            source, target = self.path / name, self.out / name
            if not source.exists():
                raise FileNotFoundError(f"{name!r} was not staged.")
            if source.is_dir() and not target.is_symlink() and target.is_dir():
                # A real directory cannot be replaced in one rename: move it aside first.
                aside = Path(tempfile.mkdtemp(prefix="old-", dir=self.path))
                os.replace(target, aside / name)
            elif source.is_dir() and (target.is_symlink() or target.exists()):
                target.unlink()  # a link (to a file or a directory) or a plain file
            elif target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(
                    f"{str(target)!r} is a directory; cannot replace it with the file {name!r}."
                )
            os.replace(source, target)  # replaces a link itself, never what it points to


@contextmanager
def staged(out: str | Path) -> Iterator[Staging]:
    """A ``Staging`` in ``out`` (created); the staging directory is removed on exit, and
    ``out`` too when this call created it and nothing was committed to it.

    Examples:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> with staged(root / "deploy") as stage:
        ...     _ = (stage.path / "a.txt").write_text("a")
        ...     stage.commit(["a.txt"])
        >>> sorted(p.name for p in (root / "deploy").iterdir())
        ['a.txt']
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"The output {str(out)!r} exists and is not a directory.")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        yield Staging(out, path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()
