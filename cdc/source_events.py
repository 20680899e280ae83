"""What a binlog source yields: row changes with their coordinates, and the boundaries
of the transactions that hold them. The adapter in `connectors/binlog_source.py` turns
python-mysql-replication events into these; tests build them by hand.

Every event carries `start`, the position at which the event begins, and `end`, the
position right after it (the binlog's own `log_pos`). A transaction's identity is the
start of its first event (its GTID or BEGIN); resuming at the `end` of its commit event
re-reads nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc.position import BinlogPosition


@dataclass(frozen=True, slots=True)
class TxBegin:
    """A transaction starts: a GTID event (MySQL, MariaDB) or a `BEGIN` query."""

    start: BinlogPosition
    end: BinlogPosition
    gtid: str | None = None
    # MariaDB's FL_STANDALONE: a single statement (DDL) with no COMMIT/XID after it.
    standalone: bool = False


@dataclass(frozen=True, slots=True)
class RowInsert:
    """One inserted row image of a table (a Write_rows event holds one or more)."""

    schema: str
    table: str
    values: dict[str, Any]
    end: BinlogPosition


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
    """Any other query event (DDL, for example). Outside an explicit BEGIN it is a
    complete transaction of its own."""

    sql: str
    end: BinlogPosition
    timestamp: int = 0


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


SourceEvent = (
    TxBegin | RowInsert | RowChange | TxCommit | TxRollback | Savepoint
    | RollbackToSavepoint | Statement | Heartbeat | ServerInfo
)


def query_event(sql: str, start: BinlogPosition, end: BinlogPosition, timestamp: int) -> SourceEvent:
    """What a binlog Query event means for transaction assembly: BEGIN / XA START open a
    transaction, COMMIT and ROLLBACK close one, SAVEPOINT and ROLLBACK TO mark and cut
    back, anything else is a statement (DDL, for example). Shared by both binlog readers."""
    upper = sql.upper()
    if upper == "BEGIN" or upper.startswith("XA START"):
        return TxBegin(start, end)
    if upper == "COMMIT":
        return TxCommit(end, timestamp)
    if upper == "ROLLBACK":
        return TxRollback(end)
    if upper.startswith("SAVEPOINT"):
        return Savepoint(_savepoint_name(sql[len("SAVEPOINT"):]), end)
    if upper.startswith("ROLLBACK TO"):
        rest = sql[len("ROLLBACK TO"):].strip()
        if rest.upper().startswith("SAVEPOINT"):
            rest = rest[len("SAVEPOINT"):]
        return RollbackToSavepoint(_savepoint_name(rest), end)
    return Statement(sql, end, timestamp)


def _savepoint_name(text: str) -> str:
    return text.strip().strip("`").strip()
