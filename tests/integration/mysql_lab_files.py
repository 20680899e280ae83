"""Small MySQL binlog files for the lab server's tests, built from tests/unit/binlog_bytes.py's
events (the lab's own writer, testbed/mysql_lab/binlog_writer.py, is tested on its own):
Format_description as MySQL 8.4 writes it, Previous_gtids, GTID + BEGIN + Table_map +
Write_rows v2 + XID transactions, Rotate; with the `.gtids` sidecar, the index and the state
file the server reads (the contract in docs/mysql-lab.md, "The data directory")."""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path

from testbed.mysql_lab.lab import default_state, write_state
from tests.unit.binlog_bytes import (
    UUID,
    Binlog,
    gtid_body,
    query_body,
    table_map_body,
    write_rows_body,
    xid_body,
)

SERVER_UUID = str(uuid.UUID(bytes=UUID))
# Post-header lengths of event types 1..42 as MySQL 8.4 writes them in its
# Format_description (libs/mysql/binlog/event/control_events.cpp,
# Format_description_event::Format_description_event: rows v1 8, rows v2 10, GTID 42, ...).
POST_HEADER_84 = bytes(
    [56, 13, 0, 8, 0, 0, 0, 0, 4, 0, 4, 0, 0, 0, 99, 0, 4, 26, 8, 0, 0, 0, 8, 8, 8, 2, 0, 0, 0, 10, 10, 10, 42, 42,
     0, 18, 52, 0, 10, 40, 0, 0]
)  # fmt: skip


def fde_body(version: str = "8.4.3", created: int = 1_700_000_000) -> bytes:
    """Format_description: binlog version 2, server version 50, created 4, header length 1,
    post-header lengths, checksum algorithm 1 (1 = CRC32; the CRC follows)."""
    return (
        struct.pack("<H", 4)
        + version.encode().ljust(50, b"\x00")
        + struct.pack("<IB", created, 19)
        + POST_HEADER_84
        + b"\x01"
    )


def gtid_set_encoding(last_gno: int) -> bytes:
    """Gtid_set::encode of `SERVER_UUID:1-last_gno` (empty when 0)."""
    if last_gno == 0:
        return struct.pack("<Q", 0)
    return struct.pack("<Q", 1) + UUID + struct.pack("<QQQ", 1, 1, last_gno + 1)


def executed(last_gno: int) -> str:
    """`SERVER_UUID:1-n` as MySQL prints it (`uuid:1` for one, "" for none)."""
    if last_gno == 0:
        return ""
    return f"{SERVER_UUID}:1" if last_gno == 1 else f"{SERVER_UUID}:1-{last_gno}"


class LabFiles:
    """Appends whole transactions to `dir`'s binlog files as the lab's writer does (one
    write and flush each), keeping the sidecar, the index and lab_state.json current."""

    def __init__(self, directory: Path, version: str = "8.4.3", server_id: int = 1):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.version = version
        self.gno = 0
        self.xid = 100
        self.seq = 0
        state = default_state(version, server_id, SERVER_UUID)
        state["tables"] = {
            "shop.outbox": [
                {"name": "id", "ordinal": 1, "column_type": "varchar(64)", "data_type": "varchar",
                 "nullable": False, "character_set": "utf8mb4", "key": "PRI"},
                {"name": "payload", "ordinal": 2, "column_type": "longblob", "data_type": "longblob",
                 "nullable": True, "character_set": None, "key": ""},
                {"name": "n", "ordinal": 3, "column_type": "int", "data_type": "int", "nullable": True,
                 "character_set": None, "key": ""},
            ]
        }  # fmt: skip
        self.state = state
        self._new_file()

    @property
    def name(self) -> str:
        return f"binlog.{self.seq:06d}"

    def _append(self, path: Path, data: bytes) -> None:
        with path.open("ab") as fh:
            fh.write(data)
            fh.flush()

    def _new_file(self) -> None:
        self.seq += 1
        log = Binlog()
        head = log.add(15, fde_body(self.version)) + log.add(35, gtid_set_encoding(self.gno))
        self.pos = log.pos
        (self.dir / self.name).write_bytes(b"\xfebin" + head)
        previous = executed(self.gno)
        (self.dir / f"{self.name}.gtids").write_text(f"# previous {previous}\n")
        self._append(self.dir / "binlog.index", f"./{self.name}\n".encode())
        self._save_state()

    def _save_state(self) -> None:
        """gtid_executed now; what a test changed in the file (update_state) stays."""
        path = self.dir / "lab_state.json"
        if path.exists():
            self.state = json.loads(path.read_text())
        self.state["gtid_executed"] = executed(self.gno)
        write_state(self.dir, self.state)

    def transaction(self, *event_ids: str) -> str:
        """One transaction inserting a row per id; returns its GTID."""
        self.gno += 1
        self.xid += 1
        log = Binlog(self.pos)
        data = log.add(33, gtid_body(self.gno))
        data += log.add(2, query_body("BEGIN"))
        data += log.add(19, table_map_body())
        data += log.add(30, write_rows_body([(e, b'{"k": 1}', i) for i, e in enumerate(event_ids)]))
        data += log.add(16, xid_body(self.xid))
        start, self.pos = self.pos, log.pos
        self._append(self.dir / self.name, data)
        gtid = f"{SERVER_UUID}:{self.gno}"
        self._append(self.dir / f"{self.name}.gtids", f"{gtid} {start} {self.pos}\n".encode())
        self._save_state()
        return gtid

    def rotate(self) -> None:
        """A Rotate event at the end of this file, then a new file."""
        log = Binlog(self.pos)
        nxt = f"binlog.{self.seq + 1:06d}"
        self._append(self.dir / self.name, log.add(4, struct.pack("<Q", 4) + nxt.encode()))
        self._new_file()
