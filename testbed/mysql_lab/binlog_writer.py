"""A writer of MySQL-format binary logs, as MySQL 5.7 / 8.0 / 8.4 / 9.x writes them, for the
MySQL lab (its server serves these files; no MySQL server can be installed here).

    w = MysqlBinlogWriter(dir, version="9.1.0")
    w.create_table("shop", "outbox", [Column("id", "varchar(64)", nullable=False, key="PRI"),
                                      Column("payload", "json")])
    with w.transaction() as tx:              # GTID (tagged: tag="blue", type 42), BEGIN .. XID
        tx.insert("shop", "outbox", [{"id": "e1", "payload": {"n": 1}}])
        tx.update("shop", "outbox", [(before, after)])
        tx.update_json_partial("shop", "outbox", [(before, after, {"payload": [JsonDiff(...)]})])
        tx.delete("shop", "outbox", [row])
    with w.xa_prepare(Xid(b"g1")) as tx: ...  # XA START .. XA END, XA_PREPARE
    w.xa_commit(Xid(b"g1"))                  # its own group: GTID, XA COMMIT
    w.rotate()                               # Rotate, a new file, the index updated
    w.position()                             # ("binlog.000002", 157)

The directory (the contract with `server.py`): `binlog.index` (`./binlog.000001` a line),
`binlog.NNNNNN` (magic `\\xfebin`, Format_description, Previous_gtids, transactions, a
Rotate at the end of a rotated file), `binlog.NNNNNN.gtids` (`# previous <set>`, then
`<gtid or -> <start> <end>` per transaction) and `lab_state.json` (rewritten atomically).
Each transaction is appended with one write and a flush, so a reader sees whole
transactions or checks each event's size against the bytes present.

What MySQL does and the writer does too: a Table_map before each statement's rows events,
rows split into events of at most `binlog_row_event_max_size` (8192) bytes, STMT_END_F on a
statement's last one, logical clock (last_committed, sequence_number) restarting in each
file, transaction_length counting the GTID event itself, Transaction_payload (zstd) around
all events after the GTID event when compression is on (not for XA, which MySQL does not
compress), PARTIAL_UPDATE_ROWS_EVENT for every UPDATE when partial JSON is on, an
XA transaction in two groups (prepare, then commit or rollback). An exception inside a
`transaction()` block writes nothing (a rollback leaves no trace in MySQL's binlog).

As MySQL 5.7 (`version="5.7.x"`): its Format_description (38 event types), GTID and
anonymous GTID events of 42 bytes (no commit timestamps, transaction length or server
versions), a 5.7 session's BEGIN, Table_maps without any optional metadata (5.7 has no
binlog_row_metadata: no column names, no signedness, no ENUM / SET values); partial JSON
(8.0.3), Transaction_payload (8.0.20), tagged GTIDs (8.3) and VECTOR (9.0) are refused.

The package shares no code with the relay (`cdc/`, `connectors/`) or the verifier
(`spark_jobs/`): the bytes it writes are what they are tested against.
"""

from __future__ import annotations

import json
import os
import time
import uuid as uuid_mod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.mysql_lab import events as ev
from testbed.mysql_lab.column_values import T_VECTOR, Column
from testbed.mysql_lab.gtids import GtidInfo, GtidSet, tagged_gtid_body, valid_tag
from testbed.mysql_lab.json_binary import JsonDiff
from testbed.mysql_lab.row_events import rows_events, table_map_body

__all__ = ["Column", "JsonDiff", "MysqlBinlogWriter", "Transaction", "Xid"]

MAGIC = b"\xfebin"
ROW_EVENT_MAX_SIZE = 8192  # binlog_row_event_max_size's default
BASENAME = "binlog"


@dataclass(frozen=True)
class Xid:
    """An XA transaction id (gtrid, bqual, formatID), as `XA START 'g','b',1` names it."""

    gtrid: bytes
    bqual: bytes = b""
    format_id: int = 1

    @staticmethod
    def of(value: Xid | str | bytes) -> Xid:
        if isinstance(value, Xid):
            return value
        return Xid(value.encode() if isinstance(value, str) else value)

    def sql(self) -> str:
        """How MySQL writes an xid into the binlog's XA statements (sql/xa.cc
        xid_t::serialize): X'<gtrid hex>',X'<bqual hex>',<formatID>."""
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{self.format_id}"


@dataclass
class _Table:
    table_id: int
    schema: str
    name: str
    columns: list[Column]


class Transaction:
    """The row changes of one transaction, each call one statement."""

    def __init__(self, writer: MysqlBinlogWriter):
        self._writer = writer
        self.statements: list[tuple[int, _Table, list]] = []

    def insert(self, schema: str, table: str, rows: list[dict]) -> None:
        self.statements.append((ev.WRITE_ROWS, self._writer.table(schema, table), list(rows)))

    def update(self, schema: str, table: str, pairs: list[tuple[dict, dict]]) -> None:
        """Full after images; with partial JSON on still a PARTIAL_UPDATE_ROWS_EVENT (as
        MySQL logs every UPDATE of such a session), its JSON columns stored whole."""
        kind = ev.PARTIAL_UPDATE_ROWS if self._writer.partial_json else ev.UPDATE_ROWS
        self.statements.append((kind, self._writer.table(schema, table), [(b, a, None) for b, a in pairs]))

    def update_json_partial(
        self, schema: str, table: str, changes: list[tuple[dict, dict, dict[str, list[JsonDiff]]]]
    ) -> None:
        """UPDATEs made with JSON_SET / JSON_REPLACE / JSON_REMOVE: each JSON column named in
        the third element is logged as those diffs (the after image's full document of it is
        then only the caller's record of the result). Needs partial_json=True."""
        if not self._writer.partial_json:
            raise ValueError("update_json_partial needs MysqlBinlogWriter(partial_json=True)")
        self.statements.append((ev.PARTIAL_UPDATE_ROWS, self._writer.table(schema, table), list(changes)))

    def delete(self, schema: str, table: str, rows: list[dict]) -> None:
        self.statements.append((ev.DELETE_ROWS, self._writer.table(schema, table), list(rows)))


class MysqlBinlogWriter:
    """See the module docstring. `row_metadata`: binlog_row_metadata, FULL (the default) or
    MINIMAL; not given on MySQL 5.7, which has no such variable; `gtids=False`: anonymous
    GTID events (gtid_mode OFF)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        version: str = "9.1.0",
        server_id: int = 1,
        server_uuid: str | None = None,
        checksum: bool = True,
        row_metadata: str | None = None,
        compression: bool = False,
        partial_json: bool = False,
        gtids: bool = True,
    ):
        self.mysql57 = ev.version_tuple(version) < (8, 0, 0)
        if self.mysql57 and row_metadata is not None:
            raise ValueError(f"MySQL {version} has no binlog_row_metadata (8.0.1 added it): leave row_metadata out")
        if self.mysql57 and (compression or partial_json):
            raise ValueError(f"MySQL {version} has neither binlog_transaction_compression nor partial JSON (8.0)")
        row_metadata = row_metadata or ("" if self.mysql57 else "FULL")
        if not self.mysql57 and row_metadata not in ("FULL", "MINIMAL"):
            raise ValueError(f"row_metadata must be FULL or MINIMAL, not {row_metadata!r}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / f"{BASENAME}.index").exists():
            raise FileExistsError(f"{self.dir} already holds a binlog; give the writer an empty directory")
        self.version = version
        self.version_tuple = ev.version_tuple(version)
        self.server_id = server_id
        self.server_uuid = str(uuid_mod.UUID(server_uuid) if server_uuid else uuid_mod.uuid4())
        self.checksum = checksum
        self.row_metadata = row_metadata
        self.compression = compression
        self.partial_json = partial_json
        self.gtids = gtids
        self.gtid_executed = GtidSet()
        self.xa_prepared: list[Xid] = []
        self._tables: dict[tuple[str, str], _Table] = {}
        self._next_table_id = 90
        self._xid = 100
        self._file_no = 0
        self._files: list[str] = []
        self._pos = 0
        self._sequence = 0
        self._rotate_to_new_file(first=True)

    # -- tables ---------------------------------------------------------------------------

    def create_table(self, schema: str, table: str, columns: list[Column]) -> None:
        """Define (or redefine, as after an ALTER TABLE: a new table id) a table. Written
        to lab_state.json; the binlog sees it at its first Table_map."""
        for c in columns:
            ct = c.binlog_type()
            if ct.code == T_VECTOR and self.version_tuple < (9, 0, 0):
                raise ValueError(f"column {c.name!r}: VECTOR needs MySQL 9.0 or later, the lab is {self.version}")
        self._next_table_id += 1
        self._tables[(schema, table)] = _Table(self._next_table_id, schema, table, list(columns))
        self._save_state()

    def table(self, schema: str, table: str) -> _Table:
        try:
            return self._tables[(schema, table)]
        except KeyError:
            raise KeyError(f"no table {schema}.{table}: call create_table first") from None

    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self, tag: str | None = None) -> Iterator[Transaction]:
        """GTID (tagged with `tag`: type 42), BEGIN, the statements, XID. Nothing is
        written if the block raises."""
        if tag is not None:
            if not self.gtids:
                raise ValueError("a tagged GTID needs gtids=True")
            if self.version_tuple < (8, 3, 0):
                raise ValueError(f"tagged GTIDs need MySQL 8.3 or later, the lab is {self.version}")
            tag = valid_tag(tag)
        if self.compression and self.version_tuple < (8, 0, 20):
            raise ValueError(f"Transaction_payload needs MySQL 8.0.20 or later, the lab is {self.version}")
        tx = Transaction(self)
        yield tx
        self._xid += 1
        body = [self._query("BEGIN")]
        body += self._statement_events(tx)
        body.append((ev.XID, ev.xid_body(self._xid), 0))
        self._write_group(body, tag or "", compress=self.compression)

    @contextmanager
    def xa_prepare(self, xid: Xid | str | bytes, one_phase: bool = False) -> Iterator[Transaction]:
        """XA START, the statements, XA END, XA_PREPARE (one_phase: `XA COMMIT .. ONE
        PHASE`, a transaction of its own)."""
        x = Xid.of(xid)
        tx = Transaction(self)
        yield tx
        body = [self._query(f"XA START {x.sql()}")]
        body += self._statement_events(tx)
        body.append(self._query(f"XA END {x.sql()}"))
        body.append((ev.XA_PREPARE, ev.xa_prepare_body(one_phase, x.format_id, x.gtrid, x.bqual), 0))
        self._write_group(body, "", compress=False)
        if not one_phase:
            self.xa_prepared.append(x)
            self._save_state()

    def xa_commit(self, xid: Xid | str | bytes) -> None:
        self._xa_outcome(Xid.of(xid), "COMMIT")

    def xa_rollback(self, xid: Xid | str | bytes) -> None:
        self._xa_outcome(Xid.of(xid), "ROLLBACK")

    def _xa_outcome(self, x: Xid, word: str) -> None:
        if x not in self.xa_prepared:
            raise KeyError(f"XA {x.sql()} is not prepared")
        self._write_group([self._query(f"XA {word} {x.sql()}")], "", compress=False)
        self.xa_prepared.remove(x)
        self._save_state()

    def _query(self, sql: str) -> tuple[int, bytes, int]:
        return (ev.QUERY, ev.query_body(sql, mysql57=self.mysql57), 0)

    def _statement_events(self, tx: Transaction) -> list[tuple[int, bytes, int]]:
        """Per statement: its Table_map, then rows events of at most ROW_EVENT_MAX_SIZE."""
        out: list[tuple[int, bytes, int]] = []
        full = self.row_metadata == "FULL"
        for kind, table, rows in tx.statements:
            if kind == ev.PARTIAL_UPDATE_ROWS and self.mysql57:
                raise ValueError(f"PARTIAL_UPDATE_ROWS_EVENT needs MySQL 8.0.3 or later, the lab is {self.version}")
            tm = table_map_body(
                table.table_id,
                table.schema,
                table.name,
                table.columns,
                full,
                self.version_tuple,
                optional_metadata=not self.mysql57,
            )
            out.append((ev.TABLE_MAP, tm, 0))
            for body in rows_events(table.table_id, table.columns, rows, kind, ROW_EVENT_MAX_SIZE):
                out.append((kind, body, 0))
        return out

    def _write_group(self, body: list[tuple[int, bytes, int]], tag: str, compress: bool) -> None:
        """GTID event + `body` appended at the end of the current file in one write."""
        now = time.time()
        ts, micros = int(now), int(now * 1_000_000)
        if self.gtids:
            sid = self.server_uuid
            gno = self.gtid_executed.last_gno(sid, tag) + 1
        start = self._pos
        if compress:
            inner = b"".join(
                ev.frame(kind, data, server_id=self.server_id, log_pos=0, timestamp=ts, checksum=False, flags=flags)
                for kind, data, flags in body
            )
            body = [(ev.TRANSACTION_PAYLOAD, ev.transaction_payload_body(inner, True), 0)]
        rest_size = sum(19 + len(data) + (4 if self.checksum else 0) for _, data, _ in body)
        self._sequence += 1
        length = 0
        while True:  # transaction_length counts the GTID event, whose size depends on it
            info = GtidInfo(
                self._sequence - 1,
                self._sequence,
                micros,
                micros,
                length,
                *(2 * [ev.server_version_number(self.version)]),
            )
            if not self.gtids:
                gtid_kind, gtid_data = ev.ANONYMOUS_GTID, ev.gtid_body(None, 0, info, self.mysql57)
            elif tag:
                gtid_kind, gtid_data = ev.GTID_TAGGED, tagged_gtid_body(sid, gno, tag, info)
            else:
                gtid_kind, gtid_data = ev.GTID, ev.gtid_body(sid, gno, info, self.mysql57)
            total = 19 + len(gtid_data) + (4 if self.checksum else 0) + rest_size
            if total == length:
                break
            length = total
        out = bytearray()
        pos = start
        for kind, data, flags in [(gtid_kind, gtid_data, 0), *body]:
            pos += 19 + len(data) + (4 if self.checksum else 0)
            out += ev.frame(
                kind, data, server_id=self.server_id, log_pos=pos, timestamp=ts, checksum=self.checksum, flags=flags
            )
        self._append(bytes(out))
        if self.gtids:
            self.gtid_executed = self.gtid_executed.add(sid, gno, tag)
            text = f"{sid}:{tag}:{gno}" if tag else f"{sid}:{gno}"
        else:
            text = "-"
        with open(self._sidecar(), "a", encoding="ascii") as f:
            f.write(f"{text} {start} {self._pos}\n")
        self._save_state()

    # -- files ----------------------------------------------------------------------------

    def position(self) -> tuple[str, int]:
        """(file name, end position) of what is written."""
        return self._files[-1], self._pos

    @property
    def current_file(self) -> Path:
        return self.dir / self._files[-1]

    def _sidecar(self) -> Path:
        return self.dir / f"{self._files[-1]}.gtids"

    def _append(self, data: bytes) -> None:
        with open(self.current_file, "ab") as f:
            f.write(data)
            f.flush()
        self._pos += len(data)

    def rotate(self) -> None:
        """FLUSH BINARY LOGS: a Rotate event naming the next file, that file started."""
        self._rotate_to_new_file(first=False)

    def _rotate_to_new_file(self, first: bool) -> None:
        next_name = f"{BASENAME}.{self._file_no + 1:06d}"
        now = int(time.time())
        crc = 4 if self.checksum else 0
        if not first:
            body = ev.rotate_body(next_name)
            end = self._pos + 19 + len(body) + crc
            self._append(
                ev.frame(ev.ROTATE, body, server_id=self.server_id, log_pos=end, timestamp=now, checksum=self.checksum)
            )
            self._close_current()
        self._file_no += 1
        self._files.append(next_name)
        self._sequence = 0
        # created: set in the first file a server writes after its start, 0 in the ones it
        # rotates to (control_events.h Format_description_event `created`)
        fde_body = ev.format_description_body(self.version, self.checksum, now if first else 0)
        # The Format_description of a checksum-aware server (5.6.1+) always ends with a CRC32,
        # with binlog_checksum=NONE too: algorithm byte 0, then the CRC of the event
        # (log_event.cc Format_description_log_event::write, "FD of checksum-aware server is
        # always checksum-equipped"; the real 5.7.20 event in binlog_bytes.py has it).
        fde_end = 4 + 19 + len(fde_body) + 4
        fde = ev.frame(
            ev.FORMAT_DESCRIPTION,
            fde_body,
            server_id=self.server_id,
            log_pos=fde_end,
            timestamp=now,
            checksum=True,
            flags=ev.LOG_EVENT_BINLOG_IN_USE_F,
        )
        pg_body = self.gtid_executed.encode()
        pg_end = fde_end + 19 + len(pg_body) + crc
        previous = ev.frame(
            ev.PREVIOUS_GTIDS, pg_body, server_id=self.server_id, log_pos=pg_end, timestamp=now, checksum=self.checksum
        )
        (self.dir / next_name).write_bytes(MAGIC + fde + previous)
        self._pos = pg_end
        self._sidecar().write_text(f"# previous {self.gtid_executed}\n", encoding="ascii")
        tmp = self.dir / f"{BASENAME}.index.tmp"
        tmp.write_text("".join(f"./{name}\n" for name in self._files), encoding="ascii")
        os.replace(tmp, self.dir / f"{BASENAME}.index")
        self._save_state()

    def _close_current(self) -> None:
        """MySQL clears LOG_EVENT_BINLOG_IN_USE_F of a file's Format_description when it
        closes the file (binlog.cc MYSQL_BIN_LOG::close); the checksum, computed without
        that flag, stays right."""
        with open(self.current_file, "r+b") as f:
            f.seek(4 + 17)
            flags = int.from_bytes(f.read(2), "little")
            f.seek(4 + 17)
            f.write((flags & ~ev.LOG_EVENT_BINLOG_IN_USE_F).to_bytes(2, "little"))

    # -- lab_state.json -------------------------------------------------------------------

    def _save_state(self) -> None:
        variables: dict[str, str] = {
            "log_bin": "ON",
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": self.row_metadata,
            "binlog_checksum": "CRC32" if self.checksum else "NONE",
            "gtid_mode": "ON" if self.gtids else "OFF",
            "enforce_gtid_consistency": "ON" if self.gtids else "OFF",
            "binlog_transaction_compression": "ON" if self.compression else "OFF",
            "binlog_row_value_options": "PARTIAL_JSON" if self.partial_json else "",
            "server_uuid": self.server_uuid,
            "server_id": str(self.server_id),
            "version": self.version,
            "log_bin_basename": str(self.dir / BASENAME),
            "binlog_row_event_max_size": str(ROW_EVENT_MAX_SIZE),
        }
        if self.mysql57:  # variables 8.0 added: 5.7 answers error 1193 for them
            for name in ("binlog_row_metadata", "binlog_transaction_compression", "binlog_row_value_options"):
                del variables[name]
        state: dict[str, object] = {
            "server_version": self.version,
            "server_id": self.server_id,
            "server_uuid": self.server_uuid,
            "gtid_executed": str(self.gtid_executed),
            "gtid_purged": "",
            "xa_prepared": [
                {"format_id": x.format_id, "gtrid": x.gtrid.hex(), "bqual": x.bqual.hex()} for x in self.xa_prepared
            ],
            "tables": {
                f"{t.schema}.{t.name}": [_column_state(c, i + 1) for i, c in enumerate(t.columns)]
                for t in self._tables.values()
            },
        }
        # keys the writer does not own (variables a test or the lab set) are kept
        path = self.dir / "lab_state.json"
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            existing = {}
        if not isinstance(existing, dict):
            existing = {}
        old_variables = existing.get("variables")
        state["variables"] = {**(old_variables if isinstance(old_variables, dict) else {}), **variables}
        state = {**existing, **state}
        tmp = self.dir / "lab_state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
        os.replace(tmp, path)


def _column_state(c: Column, ordinal: int) -> dict:
    ct = c.binlog_type()
    charset = None
    if ct.charset and ct.charset != "binary":
        charset = "utf8mb3" if ct.charset == "utf8" else ct.charset
    return {
        "name": c.name,
        "ordinal": ordinal,
        "column_type": c.column_type.lower(),
        "data_type": ct.data_type,
        "nullable": c.nullable,
        "character_set": charset,
        "key": c.key,
    }
