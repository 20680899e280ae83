"""What a binlog source yields: row changes with their coordinates, and the boundaries
of the transactions that hold them. The adapter in `connectors/mysql/binlog_source.py` turns
python-mysql-replication events into these; tests build them by hand.

Every event carries `start`, the position at which the event begins, and `end`, the
position right after it (the binlog's own `log_pos`). A transaction's identity is the
start of its first event (its GTID or BEGIN); resuming at the `end` of its commit event
re-reads nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc.position import BinlogPosition, unchecked_position


@dataclass(frozen=True, slots=True)
class TxBegin:
    """A transaction starts: a GTID event (MySQL, MariaDB) or a `BEGIN` query."""

    start: BinlogPosition
    end: BinlogPosition
    gtid: str | None = None
    # MariaDB's FL_STANDALONE: a single statement (DDL) with no COMMIT/XID after it.
    standalone: bool = False
    # The event itself opens a multi-statement transaction that only its commit (XID,
    # COMMIT, XA PREPARE) ends: MariaDB's GTID event without FL_STANDALONE. A MySQL GTID
    # event does not: a BEGIN query follows it, or the single statement it names.
    opens: bool = False


class RowInsert:
    """One inserted row image of a table (a Write_rows event holds one or more).

    `RowInsert(schema, table, values, end)`, equal and printed as the frozen dataclass it
    was; `end` is the position after its rows event. Written out rather than a dataclass
    because the decoder makes one per row of the binlog: it sets the slots by plain stores
    (a frozen dataclass's fields can only be set through their descriptors' calls) and
    keeps `end` as its file and offset, made a `BinlogPosition` when read (the assembler
    reads it only for the second half of a REPLACE): about 0.5 us a row (docs/hot-path.md,
    "The row path"; docs/benchmarks.md). Nothing sets a row's fields after it is made."""

    __slots__ = ("_end_file", "_end_pos", "schema", "table", "values")
    __match_args__ = ("schema", "table", "values", "end")

    schema: str
    table: str
    values: dict[str, Any]

    def __init__(self, schema: str, table: str, values: dict[str, Any], end: BinlogPosition):
        self.schema, self.table, self.values = schema, table, values
        self._end_file, self._end_pos = end.file, end.pos

    @property
    def end(self) -> BinlogPosition:
        return unchecked_position(self._end_file, self._end_pos)

    def __eq__(self, other: object) -> bool:
        if type(other) is not RowInsert:
            return NotImplemented
        return (self.schema, self.table, self.values, self._end_file, self._end_pos) == (
            other.schema,
            other.table,
            other.values,
            other._end_file,
            other._end_pos,
        )

    __hash__ = None  # type: ignore[assignment]  # as the dataclass's: `values` is a dict

    def __repr__(self) -> str:
        return f"RowInsert(schema={self.schema!r}, table={self.table!r}, values={self.values!r}, end={self.end!r})"


@dataclass(frozen=True, slots=True)
class RowChange:
    """An UPDATE or DELETE row image on a watched table; `kind` is "update" or "delete"."""

    kind: str
    schema: str
    table: str
    values: dict[str, Any]
    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class TxCommit:
    """The transaction committed: an XID event or a `COMMIT` query.

    `timestamp` is the commit event's header time (seconds since the epoch)."""

    end: BinlogPosition
    timestamp: int


@dataclass(frozen=True, slots=True)
class TxRollback:
    """A `ROLLBACK` written to the binlog (a transaction that also wrote a
    non-transactional table and rolled back)."""

    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class Savepoint:
    name: str
    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class RollbackToSavepoint:
    name: str
    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class Statement:
    """Any other query event (DDL, or DML logged as a statement). Outside an explicit
    BEGIN it is a complete transaction of its own. `schema` is the query's default
    database (what an unqualified table name means)."""

    sql: str
    end: BinlogPosition
    timestamp: int = 0
    schema: str = ""


@dataclass(frozen=True, slots=True)
class XaEnd:
    """`XA END <xid>`: the XA transaction's statements are over; its prepare follows."""

    xid: str
    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class XaPrepare:
    """The XA_prepare event (type 38) that ends an XA transaction's first event group:
    its rows are prepared, not committed; the outcome comes in a later group.
    `one_phase`: MySQL's `XA COMMIT ... ONE PHASE`, written as a prepare event that
    commits at once."""

    xid: str
    end: BinlogPosition
    timestamp: int
    one_phase: bool = False


@dataclass(frozen=True, slots=True)
class XaCommit:
    """`XA COMMIT <xid>`: the prepared transaction `xid` committed here (its own event
    group, maybe much later and after other transactions). With `one_phase`, the XA
    transaction open right now commits without a prepare."""

    xid: str
    start: BinlogPosition
    end: BinlogPosition
    timestamp: int
    one_phase: bool = False


@dataclass(frozen=True, slots=True)
class XaRollback:
    """`XA ROLLBACK <xid>`: the prepared transaction `xid` is rolled back; its rows are
    not events."""

    xid: str
    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The server is alive and has nothing new; `end` is where the stream stands."""

    end: BinlogPosition


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Facts about the server the source is connected to (first event of a stream)."""

    server_id: int
    flavor: str  # "mariadb" or "mysql"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServerStarted:
    """The binlog file `end.file` was opened by a server start: everything in earlier files
    was written before that start (the decoder reads it off the file's Format_description,
    connectors/mysql/binlog_control_events.py). `end`: that file's first position (4)."""

    end: BinlogPosition


SourceEvent = (
    TxBegin
    | RowInsert
    | RowChange
    | TxCommit
    | TxRollback
    | Savepoint
    | RollbackToSavepoint
    | Statement
    | XaEnd
    | XaPrepare
    | XaCommit
    | XaRollback
    | Heartbeat
    | ServerInfo
    | ServerStarted
)


def query_event(sql: str, start: BinlogPosition, end: BinlogPosition, timestamp: int, schema: str = "") -> SourceEvent:
    """What a binlog Query event means for transaction assembly: BEGIN / XA START open a
    transaction, COMMIT and ROLLBACK close one, SAVEPOINT and ROLLBACK TO mark and cut
    back, XA END / XA COMMIT / XA ROLLBACK act on an XA transaction, anything else is a
    statement (DDL, or DML logged as a statement). Shared by both binlog readers."""
    upper = sql.upper()
    if upper == "BEGIN" or upper.startswith("XA START"):
        return TxBegin(start, end)
    if upper == "COMMIT":
        return TxCommit(end, timestamp)
    if upper.startswith("XA "):
        xa = _xa_query(sql, upper, start, end, timestamp)
        if xa is not None:
            return xa
    if upper == "ROLLBACK":
        return TxRollback(end)
    if upper.startswith("SAVEPOINT"):
        return Savepoint(_savepoint_name(sql[len("SAVEPOINT") :]), end)
    if upper.startswith("ROLLBACK TO"):
        rest = sql[len("ROLLBACK TO") :].strip()
        if rest.upper().startswith("SAVEPOINT"):
            rest = rest[len("SAVEPOINT") :]
        return RollbackToSavepoint(_savepoint_name(rest), end)
    return Statement(sql, end, timestamp, schema)


def xid_text(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """An xid as the server writes it in `XA COMMIT`/`XA ROLLBACK` queries:
    X'<gtrid hex>',X'<bqual hex>',<formatID>."""
    return f"X'{gtrid.hex()}',X'{bqual.hex()}',{format_id}"


def recovered_xid(row: tuple) -> str:
    """The xid of an `XA RECOVER` row (formatID, gtrid_length, bqual_length, data) in
    `xid_text` form."""
    format_id, gtrid_len, _bqual_len, data = row
    raw = data if isinstance(data, bytes) else str(data).encode()
    return xid_text(int(format_id), raw[: int(gtrid_len)], raw[int(gtrid_len) :])


def _xa_query(sql: str, upper: str, start: BinlogPosition, end: BinlogPosition, timestamp: int) -> SourceEvent | None:
    verb = upper.split(None, 2)[1] if len(upper.split(None, 2)) > 1 else ""
    rest = sql[3:].strip()[len(verb) :].strip()
    if verb == "END":
        return XaEnd(_canonical_xid(rest), end)
    if verb == "COMMIT":
        one_phase = rest.upper().endswith("ONE PHASE")
        if one_phase:
            rest = rest[: -len("ONE PHASE")].strip()
        return XaCommit(_canonical_xid(rest), start, end, timestamp, one_phase)
    if verb == "ROLLBACK":
        return XaRollback(_canonical_xid(rest), end)
    return None


def _canonical_xid(text: str) -> str:
    """The xid of an XA query in `xid_text`'s form. The server writes X'..',X'..',n
    already; a hand-written binlog may carry 'gtrid'[,'bqual'[,n]] literals."""
    parts = [p.strip() for p in _split_xid(text)]
    if not parts or not parts[0]:
        return text
    values: list[bytes] = []
    for part in parts[:2]:
        if part[:2].upper() == "X'" and part.endswith("'"):
            values.append(bytes.fromhex(part[2:-1]) if _is_hex(part[2:-1]) else part.encode())
        elif len(part) >= 2 and part[0] == part[-1] and part[0] in "'\"":
            values.append(part[1:-1].encode())
        else:
            return text
    while len(values) < 2:
        values.append(b"")
    try:
        format_id = int(parts[2]) if len(parts) > 2 else 1
    except ValueError:
        return text
    return xid_text(format_id, values[0], values[1])


def _split_xid(text: str) -> list[str]:
    parts, current, quote = [], "", ""
    for ch in text:
        if quote:
            current += ch
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            current += ch
        elif ch == ",":
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _is_hex(text: str) -> bool:
    return len(text) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in text)


def _savepoint_name(text: str) -> str:
    return text.strip().strip("`").strip()
