"""Reading a trial's architecture back from its user attributes, whoever wrote them.

``SupernetObjective`` and ``record_trial`` write ``arch`` (JSON) and ``arch_description``;
older runs may hold ``architecture`` as a dict or a description string.
"""

from __future__ import annotations

import json
from typing import Any

from optuna_hpcnas import _keys
from optuna_hpcnas.search_space import Architecture


def architecture_of(user_attrs: dict[str, Any]) -> Architecture | None:
    """The ``Architecture`` stored in ``user_attrs``, or ``None``."""
    for key in (_keys.OBJECTIVE_ARCH, "architecture"):
        value = user_attrs.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue  # a description, not JSON
        if isinstance(value, dict):
            try:
                return Architecture.from_dict(value)
            except ValueError:
                continue
    return None


def summary_of(user_attrs: dict[str, Any]) -> str | None:
    """A one-line description (``Architecture.describe()``) from ``user_attrs``, or ``None``."""
    text = user_attrs.get(_keys.OBJECTIVE_ARCH_DESCRIPTION)
    if isinstance(text, str):
        return text
    legacy = user_attrs.get("architecture")
    if isinstance(legacy, str) and not legacy.lstrip().startswith("{"):
        return legacy
    arch = architecture_of(user_attrs)
    return arch.describe() if arch is not None else None
