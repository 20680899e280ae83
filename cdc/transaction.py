"""Transaction assembly: rows are held until their transaction's commit event.

The binlog only holds committed transactions, with one exception that matters here: a
transaction that also wrote a non-transactional (MyISAM) table and then rolled back is
written with a `ROLLBACK` query at its end, and `ROLLBACK TO SAVEPOINT` may appear inside
one. Rows are therefore released only on the commit event (XID, or a `COMMIT` query),
discarded on `ROLLBACK`, and cut back on `ROLLBACK TO SAVEPOINT`. A stream that ends, or
reconnects, mid-transaction releases nothing of it: the resume point is always the end
of the last complete transaction (go-mysql: "we can't save the position until meeting
XIDEvent which tells the whole transaction is over").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from cdc.errors import ConfigError
from cdc.identity import EventIdentity, TxIdentity
from cdc.outbox import DeadLetter, OutboxEvent, OutboxMapper, OutboxTable
from cdc.position import BinlogPosition
from cdc.source_events import (
    RollbackToSavepoint, RowChange, RowInsert, Savepoint, SourceEvent, Statement, TxBegin,
    TxCommit, TxRollback,
)
from cdc.spill import SpillBuffer

log = logging.getLogger(__name__)

ON_CHANGE_POLICIES = ("ignore", "warn", "stop")


class OutboxChangeRefused(ConfigError):
    """An UPDATE or DELETE on an outbox table, with `on_change = "stop"` configured."""


@dataclass(slots=True)
class CommittedTransaction:
    identity: TxIdentity
    end: BinlogPosition  # resume here to read the next transaction
    size: int  # outbox rows it holds
    _rows: SpillBuffer | None
    _mapper: OutboxMapper | None
    _tables: dict[tuple[str, str], OutboxTable] | None

    def items(self) -> Iterator[OutboxEvent | DeadLetter]:
        """The transaction's events in row order, mapped with the commit's identity."""
        if not self.size or self._rows is None:
            return
        mapper, tables = self._mapper, self._tables
        assert mapper is not None and tables is not None
        for row_index, (table_key, values) in enumerate(self._rows):
            yield mapper.map(tables[table_key], values, EventIdentity(self.identity, row_index))

    def release(self) -> None:
        """Free the held rows (and the spill file) once they are handed on."""
        if self._rows is not None:
            self._rows.clear()
            self._rows = None


class TransactionAssembler:
    """Feeds on source events; returns a `CommittedTransaction` at each commit.

    Transactions that hold no outbox row are returned too (with size 0), so the position
    can move past them."""

    def __init__(
        self,
        tables: list[OutboxTable],
        mapper: OutboxMapper,
        source_name: str,
        server_id: int = 0,
        on_change: str = "ignore",
        memory_limit: int = 10_000,
        spill_dir: str | None = None,
        on_ignored_change: Callable[[RowChange], None] | None = None,
    ):
        if on_change not in ON_CHANGE_POLICIES:
            raise ConfigError(f"outbox.on_change must be one of {ON_CHANGE_POLICIES}, got {on_change!r}")
        self._tables = {(t.schema, t.table): t for t in tables}
        self._mapper = mapper
        self._source = source_name
        self.server_id = server_id
        self._on_change = on_change
        self._on_ignored_change = on_ignored_change
        self._memory_limit = memory_limit
        self._spill_dir = spill_dir
        self._rows = SpillBuffer(memory_limit, spill_dir)
        self._savepoints: dict[str, int] = {}
        self._start: BinlogPosition | None = None
        self._gtid: str | None = None
        self._explicit = False  # a BEGIN was seen: a Statement does not end the transaction
        self._standalone = False
        self.resume_point: BinlogPosition | None = None
        self.discarded_rows = 0  # rows dropped by ROLLBACK / ROLLBACK TO SAVEPOINT / a cut stream

    @property
    def in_transaction(self) -> bool:
        return self._start is not None

    def watches(self, schema: str, table: str) -> bool:
        return (schema, table) in self._tables

    def reset(self) -> None:
        """Forget a partial transaction (the stream was cut or is being reopened)."""
        self.discarded_rows += len(self._rows)
        self._rows.clear()
        self._savepoints.clear()
        self._start = None
        self._gtid = None
        self._explicit = False
        self._standalone = False

    def feed(self, event: SourceEvent) -> CommittedTransaction | None:
        kind = type(event)
        if kind is RowInsert:
            if self._start is None:
                return None
            key = (event.schema, event.table)
            if key in self._tables:
                self._rows.append((key, event.values))
            return None
        if kind is TxBegin:
            if self._start is not None and event.gtid is None and not self._explicit and not len(self._rows):
                self._explicit = True  # the BEGIN query that follows a GTID event
                return None
            if self._start is not None:
                self.reset()  # a transaction never closed: the stream was cut
            self._start = event.start
            self._gtid = event.gtid
            self._standalone = event.standalone
            self._explicit = event.gtid is None
            return None
        if kind is TxCommit:
            return self._complete(event.end, event.timestamp)
        if kind is TxRollback:
            self.reset()
            self.resume_point = event.end
            return None
        if kind is Savepoint:
            self._savepoints[event.name] = len(self._rows)
            return None
        if kind is RollbackToSavepoint:
            keep = self._savepoints.get(event.name)
            if keep is not None:
                self.discarded_rows += len(self._rows) - keep
                self._rows.truncate(keep)
            return None
        if kind is Statement:
            if self._start is None:
                self.resume_point = event.end
                return None
            if self._standalone or not self._explicit:
                return self._complete(event.end, event.timestamp)
            return None
        if kind is RowChange:
            if self._start is not None and (event.schema, event.table) in self._tables:
                self._outbox_change(event)
            return None
        return None

    def _outbox_change(self, event: RowChange) -> None:
        if self._on_change == "stop":
            raise OutboxChangeRefused(
                f"{event.kind.upper()} on outbox table {event.schema}.{event.table} at {event.end}: "
                "outbox rows are only inserted (set outbox.on_change = \"ignore\" or \"warn\" to allow "
                "the insert-then-delete pattern)"
            )
        if self._on_change == "warn":
            log.warning("ignoring %s on outbox table %s.%s at %s", event.kind.upper(), event.schema, event.table, event.end)
        if self._on_ignored_change is not None:
            self._on_ignored_change(event)

    def _complete(self, end: BinlogPosition, timestamp: int) -> CommittedTransaction:
        assert self._start is not None
        identity = TxIdentity(self._source, self._start, self._gtid, self.server_id, timestamp * 1000)
        size = len(self._rows)
        rows = self._rows if size else None
        if size:
            self._rows = SpillBuffer(self._memory_limit, self._spill_dir)
        self._savepoints.clear()
        self._start = None
        self._gtid = None
        self._explicit = False
        self._standalone = False
        self.resume_point = end
        return CommittedTransaction(identity, end, size, rows, self._mapper, self._tables)
