"""A bench result stored for the docs: ``bench/readme_figures.py`` writes the figures of
README.md and docs/ from these files, each naming the command that wrote it and the day."""

from __future__ import annotations

import json
from pathlib import Path
import sys
import time
from typing import Any


def store_result(path: Path, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path``, with ``command`` (this process's command line, as typed
    from the checkout's root) and ``date``."""
    command = " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    stored = {**record, "command": command, "date": time.strftime("%Y-%m-%d")}
    path.write_text(json.dumps(stored, indent=1) + "\n")
