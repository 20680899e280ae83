"""User-level locks: GET_LOCK, RELEASE_LOCK, IS_USED_LOCK, IS_FREE_LOCK as MySQL 5.7+
keeps them (sql/item_func.cc, the MDL-based user locks; reference manual "Locking
Functions"): a lock belongs to a session, a session may hold several and take one it holds
again (each GET_LOCK counts, each RELEASE_LOCK uncounts), and every lock of a session is
released when the session ends (a KILL too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class UserLocks:
    def __init__(self) -> None:
        self._held: dict[str, tuple[int, int]] = {}  # name (lower-cased) -> (session id, count)
        self._cond = threading.Condition()

    @staticmethod
    def _key(name: str) -> str:
        return name.lower()  # lock names are case-insensitive

    def get(self, name: str, timeout: float, session: int, cancelled: Callable[[], bool]) -> int | None:
        """1 when taken, 0 on timeout; a negative timeout waits forever. None when the
        waiting session is killed (MySQL returns NULL then)."""
        key = self._key(name)
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._cond:
            while True:
                holder = self._held.get(key)
                if holder is None or holder[0] == session:
                    self._held[key] = (session, (holder[1] if holder else 0) + 1)
                    return 1
                if cancelled():
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return 0
                self._cond.wait(0.05 if left is None else min(left, 0.05))

    def release(self, name: str, session: int) -> int | None:
        """1 released (one count), 0 held by another session, NULL when nobody holds it."""
        key = self._key(name)
        with self._cond:
            holder = self._held.get(key)
            if holder is None:
                return None
            if holder[0] != session:
                return 0
            if holder[1] > 1:
                self._held[key] = (session, holder[1] - 1)
            else:
                del self._held[key]
                self._cond.notify_all()
            return 1

    def holder(self, name: str) -> int | None:
        with self._cond:
            held = self._held.get(self._key(name))
            return held[0] if held else None

    def release_all(self, session: int) -> None:
        with self._cond:
            for key in [k for k, (s, _n) in self._held.items() if s == session]:
                del self._held[key]
            self._cond.notify_all()
