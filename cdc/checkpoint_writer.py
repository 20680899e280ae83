"""Writes checkpoints off the relay's thread.

A checkpoint store's `save` may take long (an fsync on a busy disk, a Kafka round trip);
the relay must keep serving acknowledgements meanwhile. Periodic checkpoints are handed
to one writer thread (`submit`, never blocks); a checkpoint that must be durable before
the relay goes on (a new topic is about to be written; the last one at stop) is saved
with `save`, which waits for it.

Order is kept: one thread writes, in submission order, and a newer checkpoint replaces
an older one still waiting, so the store never ends with an older checkpoint than the
newest one handed over. A failure in the thread is raised on the next call.
"""

from __future__ import annotations

import threading

from cdc.checkpoint import Checkpoint
from cdc.ports import CheckpointStore


class CheckpointWriter:
    def __init__(self, store: CheckpointStore, background: bool = True):
        """`background=False` writes every checkpoint on the caller's thread (for
        deterministic tests of the relay's logic)."""
        self._store = store
        self._background = background
        self._cond = threading.Condition()
        self._pending: Checkpoint | None = None
        self._submitted = 0  # sequence of the newest checkpoint handed over
        self._written = 0  # sequence of the newest checkpoint made durable
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        if background:
            self._thread.start()

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._pending is None and not self._closed:
                    cond.wait()
                if self._pending is None:
                    return
                cp, seq, self._pending = self._pending, self._submitted, None
            try:
                self._store.save(cp)
            except BaseException as exc:  # surfaced to the relay's thread
                with cond:
                    self._error = exc
                    cond.notify_all()
                return
            with cond:
                self._written = seq
                cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, cp: Checkpoint) -> int:
        if not self._background:
            self._store.save(cp)
            return 0
        with self._cond:
            self._raise()
            self._submitted += 1
            self._pending = cp
            self._cond.notify_all()
            return self._submitted

    def save(self, cp: Checkpoint) -> None:
        """Hand `cp` over and wait until it (or a newer one) is durable."""
        if not self._background:
            self._store.save(cp)
            return
        seq = self.submit(cp)
        with self._cond:
            while self._written < seq and self._error is None:
                self._cond.wait()
            self._raise()

    def close(self) -> None:
        if not self._background:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._raise()
