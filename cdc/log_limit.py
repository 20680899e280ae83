"""Rate-limited logging: at most one line per key per interval, and the count of the lines
held back said with the next one that is let through. For lines that can repeat at a rate
no operator can read (librdkafka's connection errors during an outage, dead letters of a
bad deployment), without losing the fact that they repeated."""

from __future__ import annotations

import time
from collections.abc import Callable


class LogLimiter:
    def __init__(self, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic, max_keys: int = 1000):
        self._interval = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> tuple[bool, int]:
        """(let this line through?, how many lines of `key` were held back before it)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False, 0
        if last is None and len(self._last) >= self._max_keys:
            self._last.clear()  # bounded memory; an old key may then repeat once early
            self._held.clear()
        self._last[key] = now
        return True, self._held.pop(key, 0)
