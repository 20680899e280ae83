"""Transaction assembly: rows are held until their transaction's commit event.

The binlog only holds committed transactions, with two exceptions that matter here:

* A transaction that also wrote a non-transactional (MyISAM) table and then rolled back
  is written with a `ROLLBACK` query at its end, and `ROLLBACK TO SAVEPOINT` may appear
  inside one. Rows are released only on the commit event (XID, or a `COMMIT` query),
  discarded on `ROLLBACK`, and cut back on `ROLLBACK TO SAVEPOINT`.
* An XA (two-phase) transaction is written at `XA PREPARE`, as an event group of its own
  ending in an XA_prepare event, and its outcome comes later in a separate group (`XA
  COMMIT <xid>` or `XA ROLLBACK <xid>`), often from another connection, after other
  transactions, binlog rotations or a server restart. Its rows are held by xid and
  released at the commit: they are published *at the commit's place* in commit order,
  with the commit group's identity (position, GTID), or discarded at the rollback.
  `XA COMMIT ... ONE PHASE` is an ordinary transaction. A prepared transaction's
  group, and its outcome's, are also returned (size 0, `xa` set) so that the
  checkpoint can hold at the earliest undecided prepare (cdc/delivery/inflight.py): a restart
  then reads the prepared rows again.

A stream that ends, or reconnects, mid-transaction releases nothing of it: the resume
point is always the end of the last complete group (go-mysql: "we can't save the
position until meeting XIDEvent which tells the whole transaction is over").

DML on an outbox table logged as a *statement* (no row image) cannot become an event:
the relay stops at the commit of its transaction (one that rolls back never becomes
anything) with one line naming the fix, or, with `on_statement =
"dead_letter"`, dead-letters it (cause `statement_format`, the SQL in the dead letter)
as one item of its transaction, at its place among the transaction's rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cdc.assembly.spill import SpillBuffer
from cdc.assembly.statements import statement_target
from cdc.errors import ConfigError, NeedsOperator
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import DeadLetter, EnvelopeEncoder, OutboxEvent, OutboxMapper, OutboxTable
from cdc.position import BinlogPosition
from cdc.source_events import (
    RollbackToSavepoint,
    RowChange,
    RowInsert,
    Savepoint,
    SourceEvent,
    Statement,
    TxBegin,
    TxCommit,
    TxRollback,
    XaCommit,
    XaPrepare,
    XaRollback,
)

log = logging.getLogger(__name__)

ON_CHANGE_POLICIES = ("ignore", "warn", "stop")
ON_STATEMENT_POLICIES = ("stop", "dead_letter")
STATEMENT_FORMAT = "statement_format"  # the dead-letter cause of a statement-logged outbox write

# What an XA group did, in CommittedTransaction.xa.
XA_PREPARE, XA_COMMIT, XA_ROLLBACK = "prepare", "commit", "rollback"


# A frozen slotted dataclass's __init__ sets each field through object.__setattr__; its slot
# descriptors set them for a third of that (1.62 -> 0.56 us, timeit): once per transaction
# here, and once per transaction the relay unpickles from the reader process
# (connectors/mysql/reader_process.py, `MessagePickler`). Read from the class's namespace (as the
# decoder does for RowInsert): attribute access on the class means the field to mypy.
_new = object.__new__
_id_source = vars(TxIdentity)["source"].__set__
_id_start = vars(TxIdentity)["start"].__set__
_id_gtid = vars(TxIdentity)["gtid"].__set__
_id_server_id = vars(TxIdentity)["server_id"].__set__
_id_commit_ts_ms = vars(TxIdentity)["commit_ts_ms"].__set__
_id_xa_prepared_at = vars(TxIdentity)["xa_prepared_at"].__set__


def tx_identity(
    source: str,
    start: BinlogPosition,
    gtid: str | None,
    server_id: int,
    commit_ts_ms: int,
    xa_prepared_at: BinlogPosition | None = None,
) -> TxIdentity:
    """`TxIdentity(...)`, equal to it, built without its __init__ (see above)."""
    identity = _new(TxIdentity)
    _id_source(identity, source)
    _id_start(identity, start)
    _id_gtid(identity, gtid)
    _id_server_id(identity, server_id)
    _id_commit_ts_ms(identity, commit_ts_ms)
    _id_xa_prepared_at(identity, xa_prepared_at)
    return identity


class OutboxChangeRefused(ConfigError):
    """An UPDATE or DELETE on an outbox table, with `on_change = "stop"` configured."""


class StatementFormatRefused(NeedsOperator):
    """DML on an outbox table logged as a statement, with `on_statement = "stop"`."""


@dataclass(frozen=True, slots=True)
class XaMark:
    """What an XA event group did: `kind` prepare / commit / rollback of `xid`, whose
    prepare group starts at `prepared_at` (None when the relay never read it)."""

    kind: str
    xid: str
    prepared_at: BinlogPosition | None


@dataclass(slots=True)
class CommittedTransaction:
    identity: TxIdentity
    end: BinlogPosition  # resume here to read the next transaction
    size: int  # outbox rows it holds
    _rows: SpillBuffer | None
    _mapper: OutboxMapper | None
    _tables: dict[tuple[str, str], OutboxTable] | None
    xa: XaMark | None = None  # set on the groups of an XA transaction

    def items(self) -> Iterator[OutboxEvent | DeadLetter]:
        """The transaction's events in row order, mapped with the commit's identity.

        A row held as text is a statement-logged write (`on_statement = "dead_letter"`)."""
        if not self.size or self._rows is None or self._mapper is None or self._tables is None:
            return
        item, tables = self._item, self._tables
        for row_index, (table_key, values) in enumerate(self._rows):
            yield item(row_index, tables[table_key], values)

    def wire_items(
        self,
        envelope: EnvelopeEncoder | None,
        max_message_bytes: int,
        slow: Callable[[OutboxEvent | DeadLetter], tuple[Any, ...]],
    ) -> Iterator[tuple[Any, ...]]:
        """The items as the reader process's pipe carries them (`OutboxEvent.to_wire`), in
        row order: a common envelope row straight to its tuple (`OutboxMapper.envelope_wire`
        with `envelope`, the serializer; None: never), every other row as the item
        `items` gives, made a tuple by `slow` (encoded or dead-lettered, then `to_wire`)."""
        if not self.size or self._rows is None or self._mapper is None or self._tables is None:
            return
        item, tables = self._item, self._tables
        writer = self._mapper.envelope_writer
        # A run of rows of one table shares its key object (`TransactionAssembler.feed_inserts`):
        # the table and its writer are looked up when the key changes, not per row.
        last_key: Any = None
        table: Any = None
        write: Any = None
        for row_index, (table_key, values) in enumerate(self._rows):
            if table_key is not last_key:
                last_key, table = table_key, tables[table_key]
                write = None if envelope is None else writer(table, envelope, max_message_bytes)
            if write is not None and type(values) is dict:
                fast = write(values)
                if fast is not None:
                    yield fast
                    continue
            yield slow(item(row_index, table, values))

    def _item(self, row_index: int, table: OutboxTable, values: dict[str, Any] | str) -> OutboxEvent | DeadLetter:
        identity = EventIdentity(self.identity, row_index)
        if type(values) is str:
            return DeadLetter(
                STATEMENT_FORMAT,
                "DML logged as a statement: the binlog holds no row image to publish",
                None,
                None,
                {"sql": values},
                table.qualified_name,
                identity,
            )
        assert self._mapper is not None  # items / wire_items checked it
        return self._mapper.map(table, values, identity)  # type: ignore[arg-type]  # a dict, by the check above

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
        on_statement: str = "stop",
    ):
        if on_change not in ON_CHANGE_POLICIES:
            raise ConfigError(f"outbox.on_change must be one of {ON_CHANGE_POLICIES}, got {on_change!r}")
        if on_statement not in ON_STATEMENT_POLICIES:
            raise ConfigError(f"outbox.on_statement must be one of {ON_STATEMENT_POLICIES}, got {on_statement!r}")
        self._on_statement = on_statement
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
        # Prepared XA transactions whose outcome has not been read: xid -> (start of the
        # prepare group, its rows). They survive reset(): a reconnect resumes after them.
        self._prepared: dict[str, tuple[BinlogPosition, SpillBuffer, tuple[int, str] | None, int]] = {}
        self._deleted: set[tuple[tuple[str, str], Any]] = set()  # outbox ids deleted in this transaction
        # With on_statement = "stop": the refusal of the first statement-logged outbox INSERT
        # of the open transaction (its row index, the message). Raised only if the transaction
        # commits: a statement of a transaction that rolls back never becomes anything.
        self._refusal: tuple[int, str] | None = None
        self.resume_point: BinlogPosition | None = None
        self.discarded_rows = 0  # rows dropped by ROLLBACK / ROLLBACK TO SAVEPOINT / a cut stream
        self.xa_outcomes_unmatched = 0  # XA COMMIT/ROLLBACK of a prepare read before the start
        self.xa_lost = 0  # prepares the server lost in a crash (see drop_lost)
        self.changes_ignored = 0  # UPDATE/DELETE on an outbox table let through (on_change ignore / warn)

    @property
    def in_transaction(self) -> bool:
        return self._start is not None

    def watches(self, schema: str, table: str) -> bool:
        return (schema, table) in self._tables

    @property
    def holds_prepared(self) -> bool:
        return bool(self._prepared)

    @property
    def prepared_xids(self) -> list[str]:
        """XA transactions prepared and not yet decided, in prepare order."""
        return list(self._prepared)

    def prepared(self) -> list[tuple[str, BinlogPosition, int]]:
        """(xid, prepare group's start, prepare time) of each undecided XA transaction."""
        return [(xid, at, ts) for xid, (at, _rows, _refusal, ts) in self._prepared.items()]

    def drop_lost(self, xid: str) -> CommittedTransaction | None:
        """The server lost this prepare: a crash came between the prepare group's binlog
        write and the engine's prepare, so recovery did not restore it, `XA RECOVER` does not
        list it, and no outcome for it is in the binlog up to where the relay has read (the
        caller's proof, cdc/assembly/feed.py). Nothing of it can ever commit: its rows go, and a
        rollback mark ends its hold on the checkpoint. Only between transactions."""
        if self._start is not None or xid not in self._prepared or self.resume_point is None:
            return None
        prepared_at, rows, _refusal, _ts = self._prepared.pop(xid)
        self.discarded_rows += len(rows)
        rows.clear()
        self.xa_lost += 1
        self._start, self._gtid = self.resume_point, None
        return self._complete(self.resume_point, 0, XaMark(XA_ROLLBACK, xid, prepared_at))

    def reset(self) -> None:
        """Forget a partial transaction (the stream was cut or is being reopened)."""
        self.discarded_rows += len(self._rows)
        self._rows.clear()
        self._savepoints.clear()
        self._deleted.clear()
        self._refusal = None
        self._start = None
        self._gtid = None
        self._explicit = False
        self._standalone = False

    def feed(self, event: SourceEvent) -> CommittedTransaction | None:
        # `match` on the class (row inserts first: they are most of a binlog) lets mypy narrow
        # `event` in each branch; the source events are final slotted dataclasses.
        match event:
            case RowInsert():
                self.feed_inserts((event,))
                return None
            case TxBegin():
                if self._start is not None and event.gtid is None and not self._explicit and not len(self._rows):
                    self._explicit = True  # the BEGIN query that follows a GTID event
                    return None
                if self._start is not None:
                    self.reset()  # a transaction never closed: the stream was cut
                self._start = event.start
                self._gtid = event.gtid
                self._standalone = event.standalone
                self._explicit = event.gtid is None or event.opens
                return None
            case TxCommit():
                if self._start is None:  # a commit without its start: the stream began mid-group
                    self.resume_point = event.end
                    return None
                return self._complete(event.end, event.timestamp)
            case TxRollback():
                self.reset()
                self.resume_point = event.end
                return None
            case Savepoint():
                self._savepoints[event.name] = len(self._rows)
                return None
            case RollbackToSavepoint():
                keep = self._savepoints.get(event.name)
                if keep is not None:
                    self.discarded_rows += len(self._rows) - keep
                    self._rows.truncate(keep)
                    if self._refusal is not None and self._refusal[0] >= keep:
                        self._refusal = None
                return None
            case Statement():
                if self._start is None:
                    self.resume_point = event.end
                    return None
                if self._standalone or not self._explicit:
                    return self._complete(event.end, event.timestamp)
                self._statement(event)
                return None
            case RowChange():
                key = (event.schema, event.table)
                if self._start is not None and key in self._tables:
                    if event.kind == "delete":
                        self._deleted.add((key, event.values.get(self._tables[key].id_column)))
                    self._outbox_change(event)
                return None
            case XaPrepare():
                return self._xa_prepare(event)
            case XaCommit():
                return self._xa_commit(event)
            case XaRollback():
                return self._xa_rollback(event)
        return None  # XaEnd, heartbeats, server info: nothing to assemble

    def feed_inserts(self, rows: Iterable[RowInsert]) -> None:
        """`feed` of each of `rows` (none completes a transaction) in one call: a run of row
        inserts the source has read already (cdc/assembly/feed.py, `LocalFeed.read`), without a call,
        the `match` and the caller's checks per row."""
        if self._start is None:
            return
        tables, deleted, append = self._tables, self._deleted, self._rows.append
        schema: Any = None
        table: Any = None
        key: Any = None
        watched = False
        for event in rows:
            # the decoder gives a rows event's rows the same schema and table objects: one
            # key object for the run (and `wire_items` looks the table up once for it)
            if event.schema is not schema or event.table is not table:
                schema, table, key = event.schema, event.table, (event.schema, event.table)
                watched = key in tables
            if watched:
                if deleted and (key, event.values.get(tables[key].id_column)) in deleted:
                    # the second half of a REPLACE written as delete + insert: the event id
                    # exists already, this is a change of it, never a second event
                    self._outbox_change(RowChange("update", event.schema, event.table, event.values, event.end))
                    continue
                append((key, event.values))

    # -- XA -------------------------------------------------------------------------

    def _xa_prepare(self, event: XaPrepare) -> CommittedTransaction | None:
        if self._start is None:  # the stream began inside the prepare group
            self.resume_point = event.end
            return None
        if event.one_phase:
            return self._complete(event.end, event.timestamp)
        start = self._start
        if event.xid in self._prepared:  # the same xid prepared twice without an outcome: cannot happen
            self.discarded_rows += len(self._prepared.pop(event.xid)[1])
        self._prepared[event.xid] = (start, self._rows, self._refusal, event.timestamp)
        self._rows = SpillBuffer(self._memory_limit, self._spill_dir)
        self._refusal = None
        marker = self._complete(event.end, event.timestamp, XaMark(XA_PREPARE, event.xid, start))
        return marker

    def _xa_commit(self, event: XaCommit) -> CommittedTransaction:
        if event.one_phase and self._start is not None:
            return self._complete(event.end, event.timestamp)
        if self._start is None:  # no GTID event before it (a server without GTIDs)
            self._start, self._gtid = event.start, None
        held = self._prepared.pop(event.xid, None)
        if held is None:
            self.xa_outcomes_unmatched += 1
            log.warning(
                "XA COMMIT %s at %s: its prepare lies before where this relay started reading; "
                "its rows were not read and are not published",
                event.xid,
                event.end,
            )
            return self._complete(event.end, event.timestamp, XaMark(XA_COMMIT, event.xid, None))
        prepared_at, rows, refusal, _ts = held
        self.discarded_rows += len(self._rows)  # an outcome group holds no rows of its own
        self._rows.clear()
        self._rows = rows
        self._refusal = refusal
        return self._complete(event.end, event.timestamp, XaMark(XA_COMMIT, event.xid, prepared_at))

    def _xa_rollback(self, event: XaRollback) -> CommittedTransaction | None:
        held = self._prepared.pop(event.xid, None)
        prepared_at = None
        if held is not None:
            prepared_at, rows, _, _ts = held
            self.discarded_rows += len(rows)
            rows.clear()
        elif self._start is None:
            self.resume_point = event.end
            return None
        if self._start is None:
            self._start, self._gtid = event.end, None
        self.discarded_rows += len(self._rows)
        self._rows.clear()
        return self._complete(event.end, 0, XaMark(XA_ROLLBACK, event.xid, prepared_at))

    # -- statements -----------------------------------------------------------------

    def _statement(self, event: Statement) -> None:
        """A statement inside a transaction: DML logged as text. Only a write to an
        outbox table matters here."""
        target = statement_target(event.sql, event.schema)
        if target is None or (target.schema, target.table) not in self._tables:
            return
        key = (target.schema, target.table)
        if target.kind != "insert":
            self._outbox_change(RowChange(target.kind, target.schema, target.table, {}, event.end))
            return
        if self._on_statement == "stop" and self._refusal is None:
            self._refusal = (
                len(self._rows),
                f"an INSERT into outbox table {target.schema}.{target.table} was logged as a statement at "
                f"{event.end} (transaction at {self._start}); the relay needs its row image: set "
                "binlog_format=ROW for the server and the writing sessions, then restart the relay; or set "
                'outbox.on_statement = "dead_letter" to dead-letter it and go on',
            )
        self._rows.append((key, event.sql))

    def _outbox_change(self, event: RowChange) -> None:
        if self._on_change == "stop":
            raise OutboxChangeRefused(
                f"{event.kind.upper()} on outbox table {event.schema}.{event.table} at {event.end}: "
                'outbox rows are only inserted (set outbox.on_change = "ignore" or "warn" to allow '
                "the insert-then-delete pattern)"
            )
        if self._on_change == "warn":
            log.warning(
                "ignoring %s on outbox table %s.%s at %s", event.kind.upper(), event.schema, event.table, event.end
            )
        self.changes_ignored += 1
        if self._on_ignored_change is not None:
            self._on_ignored_change(event)

    def _complete(self, end: BinlogPosition, timestamp: int, xa: XaMark | None = None) -> CommittedTransaction:
        if self._refusal is not None and (xa is None or xa.kind == XA_COMMIT):
            raise StatementFormatRefused(self._refusal[1])
        start = self._start if self._start is not None else end
        identity = tx_identity(
            self._source,
            start,
            self._gtid,
            self.server_id,
            timestamp * 1000,
            xa.prepared_at if xa is not None and xa.kind == XA_COMMIT else None,
        )
        size = len(self._rows)
        rows = self._rows if size else None
        if size:
            self._rows = SpillBuffer(self._memory_limit, self._spill_dir)
        self._savepoints.clear()
        self._deleted.clear()
        self._refusal = None
        self._start = None
        self._gtid = None
        self._explicit = False
        self._standalone = False
        self.resume_point = end
        return CommittedTransaction(identity, end, size, rows, self._mapper, self._tables, xa)
