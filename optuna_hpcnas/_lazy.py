"""Lazy public names for packages whose modules import torch (PEP 562 ``__getattr__``), so
their torch-free parts (configuration classes) import without it."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
import importlib
from typing import Any


def lazy_attributes(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[name]`` (a module) on first use."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
