"""The lab's data directory, read by the server (the writer appends to it; see
testbed/mysql_lab/README in tests/README.md and the contract in docs/mysql-lab.md):

  binlog.index            one `./binlog.NNNNNN` per line (MySQL's index format)
  binlog.NNNNNN           binlog files as MySQL writes them
  binlog.NNNNNN.gtids     per transaction `<gtid or -> <start> <end>`, first line
                          `# previous <set>` (the file's Previous_gtids)
  lab_state.json          version, variables, gtid_executed/purged, XA, tables

Event header (libs/mysql/binlog/event/binlog_event.h, "Common header"): timestamp 4,
type 1, server_id 4, event_size 4, log_pos 4 (end of the event), flags 2. A file is only
ever served up to the end of its last whole event (a transaction being appended may be
half on disk).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEADER_LEN = 19
MAX_EVENT_SIZE = 1 << 30  # max_log_event_size (libs/mysql/binlog/event/binlog_event.h)
MAGIC = b"\xfebin"


@dataclass(frozen=True)
class EventHeader:
    timestamp: int
    type: int
    server_id: int
    size: int
    log_pos: int
    flags: int

    @classmethod
    def parse(cls, raw: bytes) -> EventHeader:
        return cls(*struct.unpack_from("<IBIIIH", raw, 0))


@dataclass(frozen=True)
class Transaction:
    gtid: str  # "-" for an anonymous transaction
    start: int
    end: int


class BinlogDir:
    """Reads the directory; caches each file's whole-event boundary scan."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._scan: dict[str, tuple[int, int]] = {}  # name -> (scanned to, file size seen)
        self._lock = threading.Lock()
        self._state: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    # -- lab_state.json ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """lab_state.json (re-read when it changed; {} before the writer made one)."""
        p = self.path / "lab_state.json"
        try:
            st = p.stat()
        except OSError:
            return {}
        # The writer replaces the file (a new inode each time): two writes within the
        # clock's granularity still differ in inode.
        key = (st.st_mtime_ns, st.st_ino, st.st_size)
        cached = self._state
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            return cached[1] if cached else {}
        self._state = (key, data)
        return data

    # -- files -------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The files the index lists, oldest first."""
        try:
            lines = (self.path / "binlog.index").read_text().splitlines()
        except OSError:
            return []
        return [os.path.basename(line.strip()) for line in lines if line.strip()]

    def file(self, name: str) -> Path:
        return self.path / name

    def whole_end(self, name: str) -> int:
        """The end of the last whole event of `name` (4 for a file holding only its
        magic; 0 when the file is missing)."""
        path = self.file(name)
        try:
            size = path.stat().st_size
        except OSError:
            return 0
        with self._lock:
            pos, seen = self._scan.get(name, (4, -1))
        if size == seen:
            return pos
        with path.open("rb") as fh:
            while pos + HEADER_LEN <= size:
                fh.seek(pos)
                head = fh.read(HEADER_LEN)
                if len(head) < HEADER_LEN:
                    break
                event_size = struct.unpack_from("<I", head, 9)[0]
                if event_size < HEADER_LEN or pos + event_size > size:
                    break
                pos += event_size
        with self._lock:
            self._scan[name] = (pos, size)
        return pos

    def read(self, name: str, start: int, end: int) -> bytes:
        with self.file(name).open("rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def events(
        self, name: str, start: int, end: int | None = None, limit: int | None = None
    ) -> list[tuple[int, bytes]]:
        """(position, raw event) of the whole events in [start, end); with `limit`, about
        that many bytes of them (at least one event, however large)."""
        stop = self.whole_end(name) if end is None else min(end, self.whole_end(name))
        if stop <= start:
            return []
        if limit is not None and stop - start > limit:
            head = self.read(name, start, start + HEADER_LEN)
            first = struct.unpack_from("<I", head, 9)[0]
            stop = start + max(limit, min(first, MAX_EVENT_SIZE))
        data = self.read(name, start, stop)
        out = []
        p = 0
        while p + HEADER_LEN <= len(data):
            size = struct.unpack_from("<I", data, p + 9)[0]
            if size < HEADER_LEN or p + size > len(data):
                break
            out.append((start + p, data[p : p + size]))
            p += size
        return out

    # -- the .gtids sidecar --------------------------------------------------------------

    def sidecar(self, name: str) -> tuple[str, list[Transaction]]:
        """(Previous_gtids text, the transactions written to `name` so far)."""
        try:
            lines = (self.path / f"{name}.gtids").read_text().splitlines()
        except OSError:
            return "", []
        previous = ""
        txs = []
        for line in lines:
            if line.startswith("# previous"):
                previous = line[len("# previous") :].strip()
                continue
            parts = line.split()
            if len(parts) == 3 and not line.startswith("#"):
                txs.append(Transaction(parts[0], int(parts[1]), int(parts[2])))
        return previous, txs
