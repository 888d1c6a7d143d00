"""``BatchedRedisBackend``: Optuna's Redis journal backend with one round trip per append and
per read of up to ``read_chunk`` logs.

Optuna's ``JournalRedisBackend`` appends log by log (a script call each) and reads log by
log (a ``GET`` each): a batch of trials written in one append (``_journal_batch``), or a
worker catching up on a thousand logs of other workers, pays a round trip per log. This
subclass keeps its keys and its format (``{prefix}:log_number``, ``{prefix}:log:{n}``, one
JSON object each), so a journal written by either is read by the other, and changes only how
many logs travel per call: an append is one Lua script (atomic on the server: the batch's
logs land whole and contiguous), a read one ``MGET`` per chunk. Written by hand because the
backend Optuna ships has no multi-log call. A Redis Cluster (``use_cluster=True``) keeps
Optuna's log-by-log calls.
"""

from __future__ import annotations

from collections.abc import Generator
import json
from typing import Any

from optuna.storages.journal import JournalRedisBackend

# the logs of an append, numbered after the journal's last, in one script
_APPEND = """
local key = string.format('%s:log_number', ARGV[1])
redis.call('setnx', key, -1)
for i = 2, #ARGV do
    local n = redis.call('incr', key)
    redis.call('set', string.format('%s:log:%d', ARGV[1], n), ARGV[i])
end
"""


class BatchedRedisBackend(JournalRedisBackend):
    """``JournalRedisBackend`` whose appends and reads carry many logs per round trip.

    Args:
        url: The Redis URL.
        use_cluster: A Redis Cluster: Optuna's log-by-log calls.
        prefix: The journal's key prefix (Optuna's).
        read_chunk: Logs fetched per ``MGET``.
    """

    def __init__(
        self, url: str, use_cluster: bool = False, prefix: str = "", read_chunk: int = 1000
    ) -> None:
        super().__init__(url, use_cluster=use_cluster, prefix=prefix)
        self._read_chunk = read_chunk

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        if self._use_cluster:
            super().append_logs(logs)
            return
        if logs:
            self._redis.eval(_APPEND, 0, self._prefix, *(json.dumps(log) for log in logs))

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        if self._use_cluster:
            yield from super().read_logs(log_number_from)
            return
        last_bytes = self._redis.get(f"{self._prefix}:log_number")
        if last_bytes is None:
            return
        last = int(last_bytes)
        for first in range(log_number_from, last + 1, self._read_chunk):
            numbers = range(first, min(first + self._read_chunk, last + 1))
            keys = [self._key_log_id(n) for n in numbers]
            for number, raw in zip(numbers, self._redis.mget(keys)):
                # every log up to ``last`` is set (the script numbers and sets in one step);
                # one that Optuna's log-by-log append numbered and not set yet is waited for
                if raw is None:
                    yield from self._wait_for(number)
                    continue
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError:
                    if number != last:  # Optuna's read skips a damaged last log only
                        raise

    def _wait_for(self, number: int) -> Generator[dict[str, Any], None, None]:
        """Log ``number`` by Optuna's own wait-and-read (one log)."""
        for log in super().read_logs(number):
            yield log
            return
