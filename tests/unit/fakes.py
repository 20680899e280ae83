"""In-memory implementations of the ports in `cdc/ports.py`, for the unit tests.

Contract: unit tests start no process, no server, no network; each runs in
milliseconds. Everything here is plain Python over lists and dicts:

* `Binlog`            builds a scripted binlog (cdc.source_events objects with
                      consistent start/end positions) and remembers what it holds.
* `FakeSourceFactory` / `FakeSource`   a BinlogSourceFactory over a `Binlog`; it records
                      every position it was opened at, and raises SourceError at chosen
                      binlog indexes (once each) or on chosen `open` calls.
* `FakeKafka`         topics as lists of partitions of records; a key goes to partition
                      `crc32(key) % partitions` (murmur2 is not needed here).
* `FakePublisher`     a Publisher on a FakeKafka: offsets assigned on write, delivery
                      callbacks only from `poll`/`flush`, optional failure injection
                      (too large, fatal), throttled/held/out-of-order acknowledgements,
                      and `crash()` that models kill -9 (an arbitrary per-partition
                      prefix of what was in flight lands, nothing is acknowledged).
* `FakeTxnPublisher`  a transactional publisher on a FakeKafka (transactional delivery):
                      records carry their Kafka transaction; commit, abort, fencing by a
                      newer instance of the same transactional.id, injected commit failures;
                      `FakeTxnCheckpointStore` stages its record in the open transaction.
* `FakeDeliveredLog`  a DeliveredLog reading the FakeKafka (read_committed: records of
                      aborted or open Kafka transactions are not seen).
* `FakeCheckpointStore`  keeps every saved checkpoint (through to_dict/from_dict) and
                      can be frozen (a dead process saves nothing).
* `JsonSerializer`    a trivial Serializer.
* `TickingClock`      a clock that advances a little on every read (and on sleep).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cdc.checkpoint import Checkpoint
from cdc.errors import PositionPurgedError, SourceError
from cdc.events.identity import header_dict
from cdc.gtid import MariadbGtidPosition, MysqlGtidSet
from cdc.ports import Delivery, DeliveryCallback, DeliveryFailure, Report
from cdc.position import BinlogPosition
from cdc.source_events import (
    Heartbeat,
    RollbackToSavepoint,
    RowChange,
    RowInsert,
    Savepoint,
    ServerInfo,
    ServerStarted,
    Statement,
    TxBegin,
    TxCommit,
    TxRollback,
    XaCommit,
    XaEnd,
    XaPrepare,
    XaRollback,
)

EVENT_SIZE = 100
SCHEMA = "shop"
OUTBOX = "outbox"


# -- the binlog ---------------------------------------------------------------------------


def outbox_row(
    event_id: Any,
    aggregate_type: str = "order",
    aggregate_id: Any = "k1",
    type: str = "created",
    payload: Any = "{}",
    **extra: Any,
) -> dict[str, Any]:
    row = {
        "id": event_id,
        "aggregatetype": aggregate_type,
        "aggregateid": aggregate_id,
        "type": type,
        "payload": payload,
    }
    row.update(extra)
    return row


@dataclass
class TxInfo:
    """What the builder wrote for one transaction."""

    start: BinlogPosition
    end: BinlogPosition | None = None
    gtid: str | None = None
    outcome: str = "open"  # commit | rollback | open (cut)
    outbox_rows: list[dict[str, Any]] = field(default_factory=list)  # released rows, in order
    commit_ts: int = 0
    prepared_at: BinlogPosition | None = None  # an XA outcome: where its prepare group starts

    @property
    def committed(self) -> bool:
        return self.outcome == "commit"


class Binlog:
    """Builds a binlog: events with consistent, strictly increasing positions."""

    def __init__(self, file: str = "mysql-bin.000001", first_pos: int = 4):
        self.file = file
        self.pos = first_pos
        self.events: list[Any] = []
        self.starts: list[BinlogPosition] = []
        self.txs: list[TxInfo] = []
        self._open: TxInfo | None = None
        self._savepoints: dict[str, int] = {}
        self._pending: list[dict[str, Any]] = []
        self._standalone = False
        self._explicit = True
        self._ts = 1_700_000_000
        self._xa_prepared: dict[str, tuple[BinlogPosition, list[dict[str, Any]]]] = {}

    # positions
    def _span(self) -> tuple[BinlogPosition, BinlogPosition]:
        start = BinlogPosition(self.file, self.pos)
        self.pos += EVENT_SIZE
        return start, BinlogPosition(self.file, self.pos)

    def _add(self, make: Callable[[BinlogPosition, BinlogPosition], Any]) -> Any:
        start, end = self._span()
        event = make(start, end)
        self.events.append(event)
        self.starts.append(start)
        return event

    @property
    def end(self) -> BinlogPosition:
        return BinlogPosition(self.file, self.pos)

    def rotate(self) -> None:
        base, _, seq = self.file.rpartition(".")
        self.file = f"{base}.{int(seq) + 1:06d}"
        self.pos = 4

    def server_start(self) -> None:
        """The server (re)started: it opened a new binlog, whose Format_description says so."""
        self.rotate()
        self.events.append(ServerStarted(self.end))
        self.starts.append(self.end)

    # transactions
    def begin(self, gtid: str | None = None, begin_query: bool = True, standalone: bool = False) -> TxInfo:
        first = self._add(lambda s, e: TxBegin(s, e, gtid, standalone))
        if gtid is not None and begin_query:
            self._add(lambda s, e: TxBegin(s, e, None))
        tx = TxInfo(first.start, gtid=gtid)
        self._open = tx
        self._standalone = standalone
        self._explicit = gtid is None or begin_query
        self._pending = []
        self._savepoints = {}
        return tx

    def insert(
        self, values: dict[str, Any], schema: str = SCHEMA, table: str = OUTBOX, outbox: bool | None = None
    ) -> None:
        self._add(lambda s, e: RowInsert(schema, table, dict(values), e))
        if outbox if outbox is not None else (schema, table) == (SCHEMA, OUTBOX):
            self._pending.append(dict(values))

    def change(self, kind: str, values: dict[str, Any], schema: str = SCHEMA, table: str = OUTBOX) -> None:
        self._add(lambda s, e: RowChange(kind, schema, table, dict(values), e))

    def savepoint(self, name: str) -> None:
        self._add(lambda s, e: Savepoint(name, e))
        self._savepoints[name] = len(self._pending)

    def rollback_to(self, name: str) -> None:
        self._add(lambda s, e: RollbackToSavepoint(name, e))
        del self._pending[self._savepoints[name] :]

    def commit(self) -> TxInfo:
        self._ts += 1
        ts = self._ts
        ev = self._add(lambda s, e: TxCommit(e, ts))
        return self._close("commit", ev.end, ts)

    def rollback(self) -> TxInfo:
        ev = self._add(lambda s, e: TxRollback(e))
        return self._close("rollback", ev.end, 0)

    def statement(self, sql: str = "CREATE TABLE t (a INT)") -> Any:
        """A query event. Inside a standalone transaction, or one opened by a GTID event
        without a BEGIN, it completes it (DDL); outside a transaction it stands alone."""
        self._ts += 1
        ts = self._ts
        ev = self._add(lambda s, e: Statement(sql, e, ts))
        if self._open is not None and (self._standalone or not self._explicit):
            self._close("commit", ev.end, ts)
        return ev

    def xa_prepare(self, xid: str, rows: list[dict[str, Any]], gtid: str | None = None) -> BinlogPosition:
        """An XA transaction's first group, as MariaDB writes it (a GTID event that opens
        it, its rows, XA END, the XA_prepare event) or, without a GTID, MySQL's `XA
        START` query. Its outcome comes later: `xa_outcome`."""
        first = self._add(lambda s, e: TxBegin(s, e, gtid, False, gtid is not None))
        for row in rows:
            self._add(lambda s, e, row=row: RowInsert(SCHEMA, OUTBOX, dict(row), e))
        self._add(lambda s, e: XaEnd(xid, e))
        self._ts += 1
        ts = self._ts
        self._add(lambda s, e: XaPrepare(xid, e, ts))
        self._xa_prepared[xid] = (first.start, [dict(r) for r in rows])
        return first.start

    def xa_outcome(self, xid: str, commit: bool = True, gtid: str | None = None) -> TxInfo:
        """The outcome group of a prepared XA transaction: XA COMMIT or XA ROLLBACK."""
        prepared_at, rows = self._xa_prepared.pop(xid)
        self._ts += 1
        ts = self._ts
        first = self._add(lambda s, e: TxBegin(s, e, gtid, True)) if gtid is not None else None
        if commit:
            ev = self._add(lambda s, e: XaCommit(xid, s, e, ts))
        else:
            ev = self._add(lambda s, e: XaRollback(xid, e))
        start = first.start if first is not None else self.starts[-1]
        tx = TxInfo(start, ev.end, gtid, "commit" if commit else "rollback", rows if commit else [], ts, prepared_at)
        self.txs.append(tx)
        return tx

    @property
    def xa_undecided(self) -> dict[str, BinlogPosition]:
        return {xid: start for xid, (start, _rows) in self._xa_prepared.items()}

    def heartbeat(self) -> None:
        self.events.append(Heartbeat(self.end))
        self.starts.append(self.end)

    def _close(self, outcome: str, end: BinlogPosition, ts: int) -> TxInfo:
        tx = self._open
        assert tx is not None
        tx.end, tx.outcome, tx.commit_ts = end, outcome, ts
        tx.outbox_rows = list(self._pending) if outcome == "commit" else []
        self.txs.append(tx)
        self._open = None
        self._pending = []
        return tx

    def transaction(
        self, rows: list[dict[str, Any]], gtid: str | None = None, outcome: str = "commit", other_rows: int = 0
    ) -> TxInfo:
        self.begin(gtid)
        for i in range(other_rows):
            self.insert({"id": i, "name": "x"}, table="orders")
        for row in rows:
            self.insert(row)
        return self.commit() if outcome == "commit" else self.rollback()

    # what a relay must publish
    def committed(self) -> list[TxInfo]:
        return [t for t in self.txs if t.committed]

    def index_at(self, position: BinlogPosition) -> int:
        """Index of the first event at or after `position`, which must be an event
        boundary (the start or the end of an event): a relay that resumes anywhere else
        would read garbage from a real server."""
        boundaries = set(self.starts) | {e.end for e in self.events} | {self.end}
        if position not in boundaries:
            raise AssertionError(f"the relay opened the binlog at {position}, which is not an event boundary")
        for i, start in enumerate(self.starts):
            if start >= position:
                return i
        return len(self.events)


# -- the source ---------------------------------------------------------------------------


class FakeSource:
    def __init__(self, factory: FakeSourceFactory, index: int):
        self._f = factory
        self.index = index
        self.closed = False
        self._info_sent = not factory.send_server_info

    def read(self, timeout: float) -> Any:
        f = self._f
        assert not self.closed, "read from a closed source"
        if not self._info_sent:
            self._info_sent = True
            return ServerInfo(f.server_id_value, f.flavor)
        if self.index in f.fail_at:
            f.fail_at.discard(self.index)
            f.failures_raised += 1
            raise SourceError(f"connection lost before event {self.index}")
        if self.index >= len(f.binlog.events):
            f.exhausted = True
            return None
        event = f.binlog.events[self.index]
        self.index += 1
        f.reads += 1
        return event

    def close(self) -> None:
        self.closed = True


class FakeSourceFactory:
    def __init__(
        self,
        binlog: Binlog,
        server_id: int = 1,
        flavor: str = "mysql",
        fail_at: set[int] | None = None,
        open_failures: int = 0,
        purged_before: BinlogPosition | None = None,
        send_server_info: bool = True,
        reopen_failures: int = 0,
    ):
        self.binlog = binlog
        self.reopen_failures = reopen_failures  # open() failures after the first open
        self.server_id_value = server_id
        self.flavor = flavor
        self.fail_at = set(fail_at or ())  # binlog indexes before which read() raises once
        self.open_failures = open_failures
        self.purged_before = purged_before
        self.send_server_info = send_server_info
        self.opened_at: list[Any] = []
        self.sources: list[FakeSource] = []
        self.reads = 0
        self.failures_raised = 0
        self.exhausted = False
        self.prepared: set[str] | None = set()  # what XA RECOVER lists; None: not permitted
        self.started_at: float | None = None  # the server's start (seconds); None: unknown

    def open(self, start: Any) -> FakeSource:
        if self.open_failures > 0:
            self.open_failures -= 1
            raise SourceError("server unreachable")
        if self.opened_at and self.reopen_failures > 0:
            self.reopen_failures -= 1
            raise SourceError("server unreachable")
        self.opened_at.append(start)
        if isinstance(start, BinlogPosition):
            index = self.binlog.index_at(start)
        elif isinstance(start, (MysqlGtidSet, MariadbGtidPosition)):
            index = len(self.binlog.events)
            for i, ev in enumerate(self.binlog.events):
                if isinstance(ev, TxBegin) and ev.gtid and not start.contains(ev.gtid):
                    index = i
                    break
        else:
            raise AssertionError(f"open() with {start!r}")
        source = FakeSource(self, index)
        self.sources.append(source)
        return source

    def resolve(self, mode: str) -> BinlogPosition:
        if mode == "earliest":
            return self.binlog.starts[0] if self.binlog.starts else self.binlog.end
        return self.binlog.end

    def check_available(self, start: Any) -> None:
        if self.purged_before is not None and isinstance(start, BinlogPosition) and start < self.purged_before:
            raise PositionPurgedError(f"{start} was purged")

    def server_id(self) -> int:
        return self.server_id_value

    def prepared_xids(self) -> set[str] | None:
        return set(self.prepared) if self.prepared is not None else None

    def server_started_at(self) -> float | None:
        return self.started_at


# -- Kafka --------------------------------------------------------------------------------


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    txn: int | None = None  # the Kafka transaction it was written in (None: not transactional)

    @property
    def header_text(self) -> dict[str, str]:
        return header_dict(self.headers)


class FakeKafka:
    def __init__(self, topics: dict[str, int] | None = None, auto_create_partitions: int | None = 3):
        self.logs: dict[str, list[list[Record]]] = {}
        self.lows: dict[tuple[str, int], int] = {}
        self.auto_create_partitions = auto_create_partitions
        self.txn_state: dict[int, str] = {}  # Kafka transaction -> open | committed | aborted
        self.txn_epochs: dict[str, int] = {}  # transactional.id -> newest producer epoch
        self.txn_of: dict[int, str] = {}  # Kafka transaction -> transactional.id
        for name, n in (topics or {}).items():
            self.create_topic(name, n)

    def create_topic(self, name: str, partitions: int) -> None:
        self.logs[name] = [[] for _ in range(partitions)]

    def add_partitions(self, name: str, total: int) -> None:
        while len(self.logs[name]) < total:
            self.logs[name].append([])

    def recreate(self, name: str) -> None:
        self.create_topic(name, len(self.logs[name]))
        for key in [k for k in self.lows if k[0] == name]:
            del self.lows[key]

    def partition_for(self, topic: str, key: bytes | None) -> int:
        if topic not in self.logs:
            if self.auto_create_partitions is None:
                raise KeyError(topic)
            self.create_topic(topic, self.auto_create_partitions)
        n = len(self.logs[topic])
        return 0 if key is None else zlib.crc32(key) % n

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        txn: int | None = None,
    ) -> Record:
        log = self.logs[topic][partition]
        record = Record(topic, partition, len(log), key, value, list(headers), txn)
        log.append(record)
        return record

    def visible(self, record: Record) -> bool:
        """What a read_committed consumer sees."""
        return record.txn is None or self.txn_state.get(record.txn) == "committed"

    def records(self, topic: str | None = None, committed: bool = False) -> list[Record]:
        """Every record (read_uncommitted), or with `committed` only what read_committed sees."""
        out = []
        for name, parts in sorted(self.logs.items()):
            if topic is None or name == topic:
                for part in parts:
                    out.extend(r for r in part if not committed or self.visible(r))
        return out


def message_id(msg: _Message) -> str:
    return header_dict(msg.headers).get("id", "")


@dataclass
class _Message:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    on_delivery: DeliveryCallback
    record: Record | None = None
    txn: int | None = None  # a transactional publisher's open Kafka transaction


TOO_LARGE = DeliveryFailure("MSG_SIZE_TOO_LARGE", "Broker: Message size too large", too_large=True)
FATAL = DeliveryFailure("TOPIC_AUTHORIZATION_FAILED", "Broker: Topic authorization failed", fatal=True)


class FakePublisher:
    """Messages go queue -> (written to the partition) -> acknowledged (callback).

    `per_poll`: at most this many messages are written and acknowledged per poll()
    (None: all). `hold_acks`: written messages wait for `release()` (flush too).
    `ack_order`: "fifo" or "reverse" (acknowledgements arrive out of order).
    `fail(message) -> DeliveryFailure | None` decides a message's fate when written."""

    def __init__(
        self,
        kafka: FakeKafka,
        fail: Callable[[_Message], DeliveryFailure | None] | None = None,
        per_poll: int | None = None,
        hold_acks: bool = False,
        ack_order: str = "fifo",
        flush_delivers: bool = True,
    ):
        self.kafka = kafka
        self.fail = fail
        self.per_poll = per_poll
        self.hold_acks = hold_acks
        self.ack_order = ack_order
        self.flush_delivers = flush_delivers
        self.queue: list[_Message] = []
        self.unacked: list[_Message] = []
        self.published: list[_Message] = []
        self.acked: list[Record] = []
        self.dead = False
        self.closed = False
        self.purged = 0

    # Publisher port
    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        assert isinstance(value, bytes), "the relay must hand bytes to the producer"
        if self.dead:
            return
        msg = _Message(topic, self.kafka.partition_for(topic, key), key, value, list(headers), on_delivery)
        self.queue.append(msg)
        self.published.append(msg)

    def poll(self, timeout: float) -> None:
        if self.dead:
            return
        self._transmit(self.per_poll)
        if not self.hold_acks:
            self._ack(self.per_poll)

    def pending(self) -> int:
        return len(self.queue) + len(self.unacked)

    def flush(self, timeout: float) -> int:
        if self.dead:
            return 0
        if self.flush_delivers:
            self._transmit(None)
            if not self.hold_acks:
                self._ack(None)
        return len(self.queue) + len(self.unacked)

    def purge(self) -> None:
        """Messages not yet written are dropped; written ones stay written, unacknowledged."""
        self.purged += len(self.queue)
        self.queue.clear()
        self.unacked.clear()

    def close(self) -> None:
        self.closed = True

    # test controls
    def _transmit(self, limit: int | None) -> None:
        count = len(self.queue) if limit is None else min(limit, len(self.queue))
        for _ in range(count):
            msg = self.queue.pop(0)
            failure = self.fail(msg) if self.fail else None
            if failure is not None:
                msg.on_delivery(Delivery(msg.topic, msg.partition, -1, failure))
                continue
            msg.record = self.kafka.append(msg.topic, msg.partition, msg.key, msg.value, msg.headers)
            self.unacked.append(msg)

    def _ack(self, limit: int | None) -> None:
        count = len(self.unacked) if limit is None else min(limit, len(self.unacked))
        if self.ack_order == "reverse":
            batch, self.unacked = self.unacked[:count], self.unacked[count:]
            batch.reverse()
        else:
            batch, self.unacked = self.unacked[:count], self.unacked[count:]
        for msg in batch:
            self.acked.append(msg.record)
            msg.on_delivery(Delivery(msg.topic, msg.partition, msg.record.offset))

    def transmit(self, limit: int | None = None) -> None:
        self._transmit(limit)

    def release(self, limit: int | None = None, where: Callable[[_Message], bool] | None = None) -> int:
        """Deliver held acknowledgements (those matching `where`), returns how many."""
        chosen = [m for m in self.unacked if where is None or where(m)]
        if limit is not None:
            chosen = chosen[:limit]
        if self.ack_order == "reverse":
            chosen.reverse()
        for msg in chosen:
            self.unacked.remove(msg)
            self.acked.append(msg.record)
            msg.on_delivery(Delivery(msg.topic, msg.partition, msg.record.offset))
        return len(chosen)

    def crash(self, rng: random.Random | None = None, keep: Callable[[_Message], bool] | None = None) -> None:
        """kill -9: of the messages not yet written, each partition gets a prefix (the
        idempotent producer keeps order per partition) -- chosen by `keep` (a message
        lands while `keep` holds for it and for every earlier one of its partition), or
        at random; nothing more is acknowledged, and the publisher is dead."""
        rng = rng or random.Random(0)
        decide = keep or (lambda _msg: rng.random() < 0.5)
        cut: set[tuple[str, int]] = set()
        for msg in self.queue:
            tp = (msg.topic, msg.partition)
            if self.fail is not None and self.fail(msg) is not None:
                continue  # the broker refuses it whenever it arrives
            if tp not in cut and decide(msg):
                self.kafka.append(msg.topic, msg.partition, msg.key, msg.value, msg.headers, msg.txn)
            else:
                cut.add(tp)
        self.queue = []
        self.unacked = []
        self.dead = True


class FakeTxnPublisher(FakePublisher):
    """Transactional: every message is written in the open Kafka transaction; readers
    see it only once that commits. `init_transactions` gives this instance the newest
    epoch of its transactional.id and aborts what an older instance left open; an older
    instance is then fenced (Fenced from begin/commit/abort, `_FENCED` in delivery
    reports). `fail_commits`: how many commits fail (abortable) before they work;
    `after_commit()`: called right after a commit took effect (a test kills there)."""

    def __init__(self, kafka: FakeKafka, txn_id: str = "cdc-relay.shop-db", **kwargs: Any):
        super().__init__(kafka, **kwargs)
        self.txn_id = txn_id
        self.epoch = -1
        self.current: int | None = None
        self.store: FakeTxnCheckpointStore | None = None
        self.fail_commits = 0
        self.after_commit: Callable[[], None] | None = None
        self.commits = 0
        self.aborts = 0
        self._failed = False

    @property
    def fenced(self) -> bool:
        return self.kafka.txn_epochs.get(self.txn_id, -1) > self.epoch

    def _check(self) -> None:
        from cdc.delivery.kafka_transaction import Fenced

        if self.fenced:
            raise Fenced(self.txn_id)

    def init_transactions(self, timeout: float) -> None:
        k = self.kafka
        self.epoch = k.txn_epochs[self.txn_id] = k.txn_epochs.get(self.txn_id, -1) + 1
        for n, state in k.txn_state.items():
            if state == "open" and k.txn_of.get(n) == self.txn_id:
                k.txn_state[n] = "aborted"

    def begin_transaction(self) -> None:
        if self.dead:  # a killed process does nothing more
            return
        self._check()
        if self.current is not None:
            raise AssertionError("begin_transaction with a transaction open")
        self.current = n = len(self.kafka.txn_state) + 1
        self.kafka.txn_state[n], self.kafka.txn_of[n] = "open", self.txn_id
        self._failed = False

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        if self.current is None and not self.dead:
            raise AssertionError("a transactional producer produced outside a transaction")
        super().publish(topic, key, value, headers, on_delivery, timestamp_ms)
        if self.queue:
            self.queue[-1].txn = self.current

    def _transmit(self, limit: int | None) -> None:
        count = len(self.queue) if limit is None else min(limit, len(self.queue))
        for _ in range(count):
            msg = self.queue.pop(0)
            failure = FENCED if self.fenced else (self.fail(msg) if self.fail else None)
            if failure is not None:
                self._failed = True
                msg.on_delivery(Delivery(msg.topic, msg.partition, -1, failure))
                continue
            msg.record = self.kafka.append(msg.topic, msg.partition, msg.key, msg.value, msg.headers, msg.txn)
            self.unacked.append(msg)

    def commit_transaction(self, timeout: float) -> None:
        from cdc.delivery.kafka_transaction import TransactionAborted

        if self.dead:
            return
        self._check()
        if self.current is None:
            raise AssertionError("commit_transaction without a transaction")
        self.flush(timeout)
        if self._failed or self.fail_commits > 0:
            self.fail_commits = max(0, self.fail_commits - 1)
            raise TransactionAborted("Broker: commit failed (injected)")
        self.kafka.txn_state[self.current] = "committed"
        if self.store is not None:
            self.store.committed(self.current)
        self.current = None
        self.commits += 1
        if self.after_commit is not None:
            self.after_commit()

    def abort_transaction(self, timeout: float) -> None:
        if self.dead:
            return
        self._check()
        if self.current is not None:
            self.kafka.txn_state[self.current] = "aborted"
            if self.store is not None:
                self.store.aborted(self.current)
        self.queue.clear()
        self.unacked.clear()
        self.current = None
        self.aborts += 1


FENCED = DeliveryFailure("_FENCED", "Local: This instance has been fenced by a newer instance", fatal=True)


@dataclass(frozen=True)
class _Written:
    """What librdkafka's report carries of a message (confluent-kafka's Message)."""

    where: int
    at: int | None  # None: acknowledged without an offset

    def partition(self) -> int:
        return self.where

    def offset(self) -> int | None:
        return self.at


def _as_report(report: Report, delivery: Delivery) -> None:
    """A fake's Delivery as librdkafka's report: (None, message) or (error, message); the
    error here is the DeliveryFailure itself."""
    if delivery.failure is None:
        report(None, _Written(delivery.partition, None if delivery.offset < 0 else delivery.offset))
    else:
        report(delivery.failure, _Written(delivery.partition, None))


class ReportsLikeKafka:
    """cdc.ports.ReportingPublisher over a fake's `publish`: the hand-over's report is
    called as librdkafka calls it, as with connectors/kafka/sink.py (what RelayHarness
    uses unless `reporting=False`, the port of the other sinks)."""

    publish: Callable[..., None]

    def publish_reported(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        report: Report,
        timestamp_ms: int | None = None,
    ) -> None:
        self.publish(topic, key, value, headers, partial(_as_report, report), timestamp_ms)

    def delivery(self, topic: str, error: DeliveryFailure | None, message: _Written | None) -> Delivery:
        if error is None:
            assert message is not None
            offset = message.offset()
            return Delivery(topic, message.partition(), -1 if offset is None else offset)
        return Delivery(topic, message.partition() if message is not None else -1, -1, error)


class KafkaShapedPublisher(ReportsLikeKafka, FakePublisher):
    pass


class KafkaShapedTxnPublisher(ReportsLikeKafka, FakeTxnPublisher):
    pass


class FakeTxnCheckpointStore:
    """The Kafka checkpoint store in transactional mode: a save is staged in the
    publisher's open transaction and becomes what `load` returns when it commits."""

    def __init__(self, publisher: FakeTxnPublisher):
        self._publisher = publisher
        publisher.store = self
        self._data: dict[str, Any] | None = None
        self._staged: dict[int, dict[str, Any]] = {}
        self.history: list[Checkpoint] = []
        self.frozen = False

    def attach(self, publisher: FakeTxnPublisher) -> None:
        """A restarted relay's publisher writes this store."""
        self._publisher = publisher
        publisher.store = self

    def load(self) -> Checkpoint | None:
        return None if self._data is None else Checkpoint.from_dict(json.loads(json.dumps(self._data)))

    def save(self, checkpoint: Checkpoint) -> None:
        current = self._publisher.current
        if self._publisher.dead:
            return
        if current is None:
            raise AssertionError("a transactional checkpoint saved outside a Kafka transaction")
        self._staged[current] = json.loads(json.dumps(checkpoint.to_dict()))

    def committed(self, txn: int) -> None:
        data = self._staged.pop(txn, None)
        if data is not None:
            self._data = data
            self.history.append(Checkpoint.from_dict(data))

    def aborted(self, txn: int) -> None:
        self._staged.pop(txn, None)

    @property
    def current(self) -> Checkpoint | None:
        return self.load()


class FakeDeliveredLog:
    def __init__(self, kafka: FakeKafka):
        self.kafka = kafka
        self.reads: list[tuple[str, int, int, int]] = []

    def partition_count(self, topic: str) -> int | None:
        parts = self.kafka.logs.get(topic)
        return None if parts is None else len(parts)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        log = self.kafka.logs[topic][partition]
        return self.kafka.lows.get((topic, partition), 0), len(log)

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        self.reads.append((topic, partition, start, end))
        low = self.kafka.lows.get((topic, partition), 0)
        for record in self.kafka.logs[topic][partition][max(start, low) : end]:
            if self.kafka.visible(record):
                yield record.offset, record.header_text


# -- checkpoint store, serializer, clock -------------------------------------------------------


class FakeCheckpointStore:
    def __init__(self, initial: Checkpoint | None = None, on_save: Callable[[Checkpoint], None] | None = None):
        self._data: dict[str, Any] | None = initial.to_dict() if initial else None
        self.history: list[Checkpoint] = []
        self.frozen = False
        self.on_save = on_save

    def load(self) -> Checkpoint | None:
        return None if self._data is None else Checkpoint.from_dict(json.loads(json.dumps(self._data)))

    def save(self, checkpoint: Checkpoint) -> None:
        if self.frozen:
            return
        self._data = json.loads(json.dumps(checkpoint.to_dict()))
        self.history.append(checkpoint)
        if self.on_save is not None:
            self.on_save(checkpoint)

    @property
    def current(self) -> Checkpoint | None:
        return self.load()


class JsonSerializer:
    """An OutboxEvent as JSON bytes; `fail_if(event)` makes it raise ValueError;
    `pad_if(event)` returns how many bytes to add (to make a message too large)."""

    def __init__(self, fail_if: Callable[[Any], bool] | None = None, pad_if: Callable[[Any], int] | None = None):
        self.fail_if = fail_if
        self.pad_if = pad_if

    def encode(self, event: Any, topic: str) -> bytes:
        if self.fail_if is not None and self.fail_if(event):
            raise ValueError("the schema cannot hold this event")
        payload = event.payload
        if isinstance(payload, bytes):
            payload = payload.hex()
        body = {"id": event.event_id, "type": event.event_type, "aggregate": event.aggregate_id, "payload": payload}
        pad = self.pad_if(event) if self.pad_if is not None else 0
        if pad:
            body["pad"] = "x" * pad
        return json.dumps(body, sort_keys=True).encode()


class TickingClock:
    def __init__(self, start: float = 1_000.0, step: float = 0.001):
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# -- a relay on the fakes -------------------------------------------------------------------


class Killed(BaseException):
    """Raised out of the relay loop to model kill -9 (BaseException: no product code may
    catch it). The publisher and the store are 'dead' before it is raised, so whatever
    the loop's cleanup does is lost, as it would be."""


DEFAULT_TOPICS = {"outbox.event.order": 3, "outbox.event.user": 3, "outbox.dlq": 2}
SOURCE_NAME = "shop-db"


class RelayHarness:
    """One relay process over the fakes. Several harnesses can share a FakeKafka and a
    FakeCheckpointStore (restarts)."""

    def __init__(
        self,
        binlog: Binlog,
        kafka: FakeKafka | None = None,
        store: FakeCheckpointStore | None = None,
        publisher: dict[str, Any] | None = None,
        factory: dict[str, Any] | None = None,
        serializer: Any = None,
        transactional: bool = False,
        topics: Any = None,
        reporting: bool = True,
        **settings: Any,
    ):
        """`reporting`: the publisher takes the hand-over's own report, as the Kafka
        publisher does (cdc.ports.ReportingPublisher); False: the port's `publish` alone."""
        from cdc.events.outbox import OutboxTable
        from cdc.relay import Relay
        from cdc.relay_settings import RelaySettings

        self.binlog = binlog
        self.kafka = kafka if kafka is not None else FakeKafka(DEFAULT_TOPICS)
        self.factory = FakeSourceFactory(binlog, **(factory or {}))
        if transactional:
            settings.setdefault("delivery", "transactional")
            txn_class = KafkaShapedTxnPublisher if reporting else FakeTxnPublisher
            self.publisher = txn_class(self.kafka, **(publisher or {}))
            if store is None:
                store = FakeTxnCheckpointStore(self.publisher)
            else:
                store.attach(self.publisher)
        else:
            self.publisher = (KafkaShapedPublisher if reporting else FakePublisher)(self.kafka, **(publisher or {}))
        self.store = store if store is not None else FakeCheckpointStore()
        self.delivered = FakeDeliveredLog(self.kafka)
        self.serializer = serializer or JsonSerializer()
        self.clock = TickingClock()
        options = dict(
            source_name=SOURCE_NAME,
            tables=(OutboxTable(SCHEMA, OUTBOX),),
            start="mysql-bin.000001:4",
            checkpoint_interval_s=0.0,
            read_timeout_s=0.0,
            drain_timeout_s=5.0,
            checkpoint_in_background=False,
            reconnect_timeout_s=5.0,
        )
        # A FakeKafka that creates topics on first use is a broker with auto.create.topics.enable
        options["topic_missing"] = "auto" if self.kafka.auto_create_partitions else "dead_letter"
        options.update(settings)
        self.settings = RelaySettings(**options)
        self.relay = Relay(
            self.settings,
            self.factory,
            self.publisher,
            self.serializer,
            self.store,
            self.delivered,
            clock=self.clock,
            sleep=self.clock.sleep,
            topics=topics,
        )
        self.iterations = 0

    def run(self, stop: Callable[[RelayHarness], bool] | None = None, max_iterations: int = 200_000):
        """Run until `stop(self)` (default: the source has nothing more to give)."""
        stop = stop or (lambda h: h.factory.exhausted)

        def should_stop() -> bool:
            self.iterations += 1
            if self.iterations > max_iterations:
                raise AssertionError("the relay loop did not stop")
            return stop(self)

        return self.relay.run(should_stop)

    def kill(self, rng: random.Random | None = None, keep: Callable[[_Message], bool] | None = None) -> None:
        """kill -9 now: in-flight messages land as a per-partition prefix."""
        self.publisher.crash(rng, keep)
        self.store.frozen = True
        raise Killed()

    def run_until_killed(
        self,
        when: Callable[[RelayHarness], bool],
        rng: random.Random | None = None,
        keep: Callable[[_Message], bool] | None = None,
    ) -> bool:
        """Run until `when(self)`, then kill -9; returns False when the source ran out
        first (the relay then stopped normally)."""

        def stop(h: RelayHarness) -> bool:
            if when(h):
                h.kill(rng, keep)
            return h.factory.exhausted

        try:
            self.run(stop)
            return False
        except Killed:
            return True
        finally:
            self.store.frozen = False


def identity_of(record: Record) -> tuple:
    h = record.header_text
    return (h["cdc.binlog.file"], int(h["cdc.binlog.pos"]), int(h["cdc.binlog.row"]))


def expected_events(binlog: Binlog) -> list[tuple]:
    """(file, pos, row, event id) of every committed outbox row, in commit and row order."""
    out = []
    for tx in binlog.committed():
        for row, values in enumerate(tx.outbox_rows):
            out.append((tx.start.file, tx.start.pos, row, str(values["id"])))
    return out


def delivered_events(kafka: FakeKafka) -> list[tuple]:
    """(file, pos, row, event id) of every record in every topic."""
    return [(*identity_of(r), r.header_text["id"]) for r in kafka.records()]
