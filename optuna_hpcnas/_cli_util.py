"""Helpers of the command line that are worth testing on their own: masking passwords in
every log record, and durations as people read them (``--set key=value`` is parsed by
``optuna_hpcnas.config.parse_overrides``).
"""

from __future__ import annotations

import logging

from optuna_hpcnas.storages import mask_url


class MaskingFilter(logging.Filter):
    """A logging filter that masks URL passwords in every record (ours and the libraries')."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_url(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def format_duration(seconds: float) -> str:
    """``3725`` -> ``'1h02m05s'``."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"
