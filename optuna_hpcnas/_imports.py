"""``"package.module:attribute"`` strings, as configs name a user's function or class."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(spec: str) -> Any:
    """The object ``spec`` names (``"package.module:name"``, dots after the colon walk
    attributes). Raises ``ValueError`` with the reason when it cannot be imported."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{spec!r} must name an object as 'package.module:name'")
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{spec!r} cannot be imported: {e}") from None
    return target
