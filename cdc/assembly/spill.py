"""A list that moves to a temporary file once it grows past a limit.

A transaction's outbox rows must be held until its commit (only committed work is
published), but a single transaction can hold a million rows. Past `memory_limit` items
the buffer pickles them to an unnamed temporary file and keeps only their offsets
(8 bytes a row), so memory stays bounded whatever the transaction size. The file is
deleted by the OS when closed, even after kill -9.
"""

from __future__ import annotations

import pickle
import tempfile
from array import array
from collections.abc import Iterator
from typing import Any


class SpillBuffer:
    def __init__(self, memory_limit: int = 10_000, spill_dir: str | None = None):
        self._limit = memory_limit
        self._dir = spill_dir
        self._items: list[Any] = []
        self._file: Any = None
        self._offsets = array("q")
        self.spilled_total = 0  # rows ever written to disk, for metrics and tests

    def __len__(self) -> int:
        return len(self._offsets) if self._file is not None else len(self._items)

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def append(self, item: Any) -> None:
        if self._file is None:
            self._items.append(item)
            if len(self._items) > self._limit:
                self._spill()
            return
        self._file.seek(0, 2)  # an unfinished iteration may have left the file mid-way
        self._offsets.append(self._file.tell())
        pickle.dump(item, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self.spilled_total += 1

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(dir=self._dir)  # noqa: SIM115  # held until clear(), which closes it
        items, self._items = self._items, []
        for item in items:
            self.append(item)

    def truncate(self, length: int) -> None:
        """Keep the first `length` items (ROLLBACK TO SAVEPOINT)."""
        if self._file is None:
            del self._items[length:]
            return
        if length < len(self._offsets):
            self._file.seek(self._offsets[length])
            self._file.truncate()
            del self._offsets[length:]

    def __iter__(self) -> Iterator[Any]:
        if self._file is None:
            # the list's own iterator, not a generator over it: a generator's frame resumed
            # per item, on every outbox row of every transaction
            return iter(self._items)
        return self._spilled()

    def _spilled(self) -> Iterator[Any]:
        count = len(self._offsets)
        self._file.flush()
        self._file.seek(0)
        for _ in range(count):
            yield pickle.load(self._file)
        self._file.seek(0, 2)

    def clear(self) -> None:
        self._items = []
        if self._file is not None:
            self._file.close()
            self._file = None
            self._offsets = array("q")
