"""The optuna-hpcnas a deployment's container installs: the one that runs here, as a wheel in
the build context, so the image builds without a package index that has it.

Code that runs from a source tree (a checkout, an editable install: ``pyproject.toml`` beside
the package) is built with ``pip wheel``, once per source state (the wheel is cached under
the user's cache directory, keyed by the version and the sources' newest modification time).
An installed distribution that came from a local wheel file (its ``direct_url.json``, PEP 610)
has that file copied. A distribution from an index is pinned as ``optuna-hpcnas==<version>``
instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
from pathlib import Path
import shutil
import subprocess
import sys
import urllib.parse

_logger = logging.getLogger(__name__)

DISTRIBUTION = "optuna-hpcnas"


def _origin(dist: importlib.metadata.Distribution) -> Path | None:
    """The local path the distribution was installed from, if any."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        url = str(json.loads(text).get("url", ""))
    except ValueError:
        return None
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "file":
        return None
    return Path(urllib.parse.unquote(parsed.path))


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "optuna-hpcnas" / "wheels"


def _source_key(source: Path, version: str) -> str:
    """The version, the source path and the newest modification time of what a wheel holds
    (the packages and ``pyproject.toml``)."""
    files = [source / "pyproject.toml", *(source / "optuna_hpcnas").rglob("*"),
             *(source / "qubo").rglob("*")]  # fmt: skip
    newest = max((p.stat().st_mtime_ns for p in files if p.is_file()), default=0)
    return hashlib.sha256(f"{source.resolve()}|{version}|{newest}".encode()).hexdigest()[:16]


def _built_wheel(source: Path, version: str) -> Path | None:
    """A wheel built from ``source`` (cached), or ``None`` when pip cannot build one."""
    key = _source_key(source, version)
    cache = _cache_dir() / key
    found = sorted(cache.glob("*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(cache), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = sorted(cache.glob("*.whl"))
    if proc.returncode != 0 or not found:
        _logger.warning("Could not build a wheel of %s: %s", source, proc.stderr.strip()[-500:])
        return None
    return found[0]


def package_for_container(context: Path) -> str:
    """What the container's ``pip install`` takes: the file name of a wheel of the running
    optuna-hpcnas put into ``context``, else ``optuna-hpcnas==<version>``."""
    import optuna_hpcnas

    version = optuna_hpcnas.__version__
    source = Path(optuna_hpcnas.__file__).resolve().parent.parent
    wheel: Path | None = None
    if (source / "pyproject.toml").is_file():  # the code runs from a source tree
        wheel = _built_wheel(source, version)
    else:
        try:
            origin = _origin(importlib.metadata.distribution(DISTRIBUTION))
        except importlib.metadata.PackageNotFoundError:
            origin = None
        if origin is not None and origin.suffix == ".whl" and origin.is_file():
            wheel = origin
    if wheel is None:
        return f"{DISTRIBUTION}=={version}"
    shutil.copyfile(wheel, context / wheel.name)
    return wheel.name
