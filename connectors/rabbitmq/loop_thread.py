"""An asyncio event loop in a daemon thread, called from synchronous code: the relay is
synchronous, aiormq (the exchange sink's client) is asyncio. The streams sink keeps its own
copy (`stream_sink._Loop`) while that module is being changed; the two are the same."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop and wait for its result (at most `timeout` seconds)."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        return future.result(timeout + 5)

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
