"""An asyncio event loop in a daemon thread, called from synchronous code: the relay is
synchronous, the brokers' clients are asyncio (rstream for the RabbitMQ streams sink, aiormq
for the exchange sink, nats-py for NATS: `connectors/nats/connection.py` names its methods)."""

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
        """Cancel every task left on the loop (a client's listeners and heartbeats of a failed
        connection, a publisher's tick) and wait for them, then stop: a task left pending is
        reported by asyncio at exit ("Task was destroyed but it is pending!")."""
        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), self.loop).result(5)
            except Exception:  # stopping anyway; the loop's thread is a daemon
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=3)
