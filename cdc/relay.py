"""The relay loop: binlog events in, Kafka messages out, checkpoint behind them.

    feed (cdc.feed: source.read() -> TransactionAssembler -> at commit, OutboxEvent | DeadLetter;
          in this process, or in a reader process: connectors.reader_process)
        -> recovery says "already delivered"?  skip (counts as delivered)
        -> serializer.encode (unless the feed did) -> publisher.publish(on_delivery)   (never fire and forget)
    acknowledgements -> InflightWindow.advance -> CheckpointStore.save (at intervals)

Invariants kept here (docs/DESIGN.md): only committed transactions are published; messages
are handed to the producer in commit order and row order (the idempotent producer keeps
that order per partition); the checkpoint only passes fully acknowledged transactions;
a message Kafka refuses as too large goes to the dead-letter topic, any other delivery
failure stops progress and the relay exits after checkpointing the proven prefix.

With a lease (cdc/lease.py) the loop checks it before every transaction it hands to the
producer and between reads: once it has run out, the relay stops handing messages over,
purges what the producer still queues, and raises LeaseLost without a last checkpoint.
Every checkpoint carries the lease's epoch, one more than the epoch it started from.

Topics that do not exist (`settings.topic_missing`, `_missing_topic`): before the first
message to a topic the loop asks Kafka's metadata whether it exists. When it does not,
the event is dead-lettered with cause `topic_missing` and one log line names the topic
to create ("dead_letter"), or the topic is created through the `TopicAdmin` port first
("create"; a refused creation dead-letters as above); the topic is asked about again
after `topic_recheck_s`, and the other topics go on. A message Kafka refuses for a
missing topic anyway (deleted meanwhile; "auto" with brokers that do not create topics)
is dead-lettered the same way, as a message too large is. A topic is named in a
checkpoint before its first message, whichever way it came to exist.

With `delivery = "transactional"` (cdc/transactions.py) the loop keeps a Kafka transaction
open across whole database transactions and commits it, with the checkpoint record
inside, when it is old or large enough (`_txn_commit`); a failed commit or a delivery
failure aborts it and the loop re-reads from the last committed checkpoint (`_rewind`);
a fenced producer stops the relay at once (Fenced, a LeaseLost). Idempotent mode holds
`None` for that state and takes none of those paths.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from cdc import crashpoints
from cdc.adoption import AdoptedWindow
from cdc.checkpoint import Checkpoint
from cdc.checkpoint_writer import CheckpointWriter
from cdc.errors import ConfigError, DeliveryError
from cdc.feed import MORE, LocalFeed, as_dead_letter, assembler_for, prepare
from cdc.formats import H_FORMAT
from cdc.gtid import parse_gtid_set
from cdc.identity import (
    H_DLQ_CAUSE,
    H_DLQ_ERROR,
    H_DLQ_TOPIC,
    H_EVENT_ID,
    H_EVENT_TYPE,
    H_ROW,
    H_TABLE,
)
from cdc.inflight import InflightWindow, PendingTx
from cdc.lease import LeaseClock, LeaseLost
from cdc.log_limit import LogLimiter
from cdc.metrics import RelayMetrics
from cdc.outbox import DeadLetter, OutboxEvent
from cdc.ports import (
    BinlogSourceFactory,
    CheckpointStore,
    DeliveredLog,
    Delivery,
    Feed,
    FeedFactory,
    Publisher,
    Serializer,
    StartAt,
    TopicAdmin,
    TransactionalPublisher,
)
from cdc.position import BinlogPosition
from cdc.recovery import Recovery
from cdc.relay_settings import RelaySettings
from cdc.source_events import Heartbeat, ServerInfo
from cdc.transaction import CommittedTransaction
from cdc.transactions import (
    FENCED_CODES,
    MAX_ABORTS_IN_A_ROW,
    Fenced,
    TransactionAborted,
    TransactionState,
    transactional_id,
)
from cdc.xa_check_back import XaCheckBack

log = logging.getLogger(__name__)
_POSITION = re.compile(r"^[^\s:]+\.\d+:\d+$")  # <file>.<n>:<offset>; a GTID set never has this shape


@dataclass
class RunSummary:
    position: BinlogPosition | None
    events_published: int
    dead_lettered: int
    skipped_recovery: int
    stopped_by: str  # "request": a run that fails raises instead of returning
    error: str | None = None
    recovery: dict[str, Any] = field(default_factory=dict)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode()}
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, _dt.timedelta)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return repr(value)


def dead_letter_value(dead: DeadLetter) -> bytes:
    """The dead-lettered row, whole, as JSON (bytes as base64): nothing of it is lost."""
    return json.dumps({"table": dead.table, "row": dead.row}, default=_json_default, sort_keys=True).encode()


def start_point(cp: Checkpoint | None, server_id: int, settings: RelaySettings) -> StartAt | str:
    """Where a relay connected to server `server_id` starts: the checkpoint's position on
    the server that wrote it; its GTID set on another server of the topology (a failover:
    file/pos mean nothing there); without a checkpoint, the configured start (`latest`
    and `earliest` are returned as such, for the source to resolve)."""
    if cp is not None:
        if cp.source != settings.source_name:
            raise ConfigError(
                f"the checkpoint belongs to source {cp.source!r}, this relay is {settings.source_name!r}: "
                "point checkpoint.* at this source's own checkpoint"
            )
        if cp.gtids and cp.server_id and cp.server_id != server_id:
            log.info("server id changed %s -> %s: resuming by GTID set %s", cp.server_id, server_id, cp.gtids)
            return parse_gtid_set(cp.gtids)
        return cp.position
    start = settings.start.strip()
    if start in ("latest", "earliest"):
        return start
    if _POSITION.match(start):
        return BinlogPosition.parse(start)
    return parse_gtid_set(start)


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        sources: BinlogSourceFactory,
        publisher: Publisher,
        serializer: Serializer,
        store: CheckpointStore,
        delivered: DeliveredLog,
        metrics: RelayMetrics | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        feeds: FeedFactory | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        topics: TopicAdmin | None = None,
    ):
        """`feeds`: where committed transactions come from (default: a `LocalFeed` over
        `sources` in this process); `sources` also answers the start-up questions."""
        self.settings = settings
        self._sources = sources
        self._feeds = feeds
        self._publisher = publisher
        self._serializer = serializer
        self._store = store
        self._delivered = delivered
        self.metrics = metrics or RelayMetrics()
        self._clock = clock
        self._sleep = sleep
        self._failure: Delivery | None = None
        self._redirects: list[tuple[PendingTx, DeadLetter]] = []
        # acknowledged without an offset, to be found in their partition (_confirm_unlocated)
        self._unlocated: list[tuple[PendingTx, OutboxEvent, list[tuple[str, bytes]], str, int, int]] = []
        self._partitions: dict[str, int] = {}
        self._recovery: Recovery | None = None
        # Both replaced when run() starts: what a run reads and checkpoints.
        self._window = InflightWindow(None)
        self._server_id = 0
        self._last_checkpoint: Checkpoint | None = None
        self._recovery_stats: Recovery | None = None
        self._writer = CheckpointWriter(store, background=False)
        self._tx_start: BinlogPosition | None = None
        self._feed_seen: dict[str, int] = {}
        self._xa_check_back = XaCheckBack(settings, sources, self.metrics)
        self._monotonic = monotonic
        self._dead_letter_log = LogLimiter(10.0, monotonic)
        self._topics = topics  # creates a missing topic (settings.topic_missing = "create")
        self._missing: dict[str, tuple[float, str]] = {}  # topic -> (ask again after (monotonic), why)
        self._lease: LeaseClock | None = None
        self._epoch = 0
        self._holder = ""
        self._start: StartAt | None = None
        self._adopted: AdoptedWindow | None = None  # taken over from Debezium (cdc/adoption.py)
        # Transactional delivery: the open Kafka transaction (None: idempotent delivery).
        self._txn: TransactionState | None = None
        self.txn_id = transactional_id(settings.source_name)
        # Only used while `_txn` is set, that is with delivery = "transactional", whose publisher is one.
        self._txn_publisher = cast(TransactionalPublisher, publisher)
        if settings.delivery == "transactional":
            self._txn = TransactionState(settings.transaction_max_s, settings.transaction_max_messages)

    @property
    def epoch(self) -> int:
        """The lease epoch this relay publishes under (0: none claimed yet)."""
        return self._epoch

    # -- start --------------------------------------------------------------------------

    def _start_point(self, cp: Checkpoint | None) -> StartAt:
        point = start_point(cp, self._server_id, self.settings)
        if isinstance(point, str):  # "latest" or "earliest"
            return self._sources.resolve(point)
        return point

    # -- the loop -----------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], lease: LeaseClock | None = None, holder: str = "") -> RunSummary:
        """Run until `should_stop()` returns true; then drain, checkpoint and return.

        Raises DeliveryError (after checkpointing the proven prefix) when Kafka refuses a
        message for a reason other than its size, SourceError when the server stays
        unreachable past `reconnect_timeout_s`, NeedsOperator errors at start, and
        LeaseLost (after purging the producer, without a checkpoint) when `lease` runs
        out. `holder`: the lease session's tag, recorded in every checkpoint."""
        settings, metrics = self.settings, self.metrics
        self._server_id = self._sources.server_id()
        txn = self._txn
        if txn is not None:
            # Before the checkpoint is read: from here on no older instance of this source
            # can commit, and what it left open is aborted.
            self._txn_publisher.init_transactions(settings.drain_timeout_s)
            log.info("transactional delivery as %s: older instances are fenced", self.txn_id)
        cp = self._store.load()
        if lease is not None:
            self._lease, self._holder = lease, holder
            self._epoch = (cp.epoch if cp is not None else 0) + 1
            metrics.lease_epoch = self._epoch
        elif cp is not None:
            self._epoch, self._holder = cp.epoch, cp.holder
        start = self._start = self._start_point(cp)
        self._sources.check_available(start)
        self._window = window = InflightWindow(cp)
        metrics.unacknowledged_since = window.oldest_unacknowledged
        self._last_checkpoint = cp
        # Transactional: a checkpoint is produced inside the open Kafka transaction, on this thread.
        self._writer = CheckpointWriter(self._store, settings.checkpoint_in_background and txn is None)
        if cp is not None:
            self._partitions.update(cp.partitions)
            self._adopted = cp.adopted
            if txn is not None and cp.exact and cp.adopted is None:
                log.info(
                    "recovering from checkpoint %s: committed in the Kafka transaction of the messages before "
                    "it, nothing after it is visible: no scan of the topics needed",
                    cp.position,
                )
            else:
                self._scan(cp)
        elif isinstance(start, BinlogPosition):
            window.position, window.position_server_id = start, self._server_id
        if lease is not None:
            lease.check(self._monotonic())
            self._checkpoint(force=True)  # the new epoch is durable before anything is published
        feed = self._open_feed(start)
        metrics.ready = True
        last_checkpoint_at = self._clock()
        publisher, poll = self._publisher, self._publisher.poll
        monotonic = self._monotonic
        fenced = False
        try:
            while not should_stop():
                try:
                    if lease is not None:  # first: a relay woken after its lease ran out only stops
                        lease.check(monotonic())
                    if self._failure is not None:
                        self._fail()
                    # Acknowledgements are only served by poll(): while some are due, wait for
                    # the feed in short slices so they are not served late.
                    item = feed.read(0.002 if publisher.pending() else settings.read_timeout_s)
                    if item is None:
                        metrics.caught_up = True
                        poll(0)
                    elif item is MORE:
                        metrics.caught_up = False
                    else:
                        kind = type(item)
                        if kind is Heartbeat:
                            metrics.caught_up = True
                        elif kind is ServerInfo:
                            self._server_id = item.server_id
                        else:
                            metrics.caught_up = False
                            self._publish(item)
                            metrics.read_file, metrics.read_pos = item.end.file, item.end.pos
                            if item.size:
                                poll(0)
                                if txn is not None:
                                    txn.messages += item.size
                    if self._redirects:
                        self._redirect_dead_letters()
                    if self._unlocated:
                        self._confirm_unlocated()
                    now = self._clock()
                    if txn is not None and txn.due(now):
                        self._txn_commit()
                    if now - last_checkpoint_at >= settings.checkpoint_interval_s:
                        window = self._window
                        window.advance()
                        self._checkpoint()
                        metrics.checkpoint_behind_since = window.oldest_handed_at()
                        last_checkpoint_at = now
                        self._feed_counters(feed)
                        self._xa_check_back.run(window.held, now)
                except TransactionAborted as exc:
                    feed = self._rewind(feed, str(exc))
        except LeaseLost as exc:
            fenced = True
            queued = publisher.pending()
            try:
                if txn is not None and not isinstance(exc, Fenced):
                    self._end_as_zombie()  # raises Fenced when the broker already fenced this instance
            finally:
                self._drop_queued(exc, queued)
            raise
        finally:
            metrics.ready = False
            try:
                (feed.abandon if fenced else feed.close)()
            finally:
                self._feed_counters(feed)
                if not fenced:
                    self._drain()
        if self._failure is not None:
            self._fail()
        return RunSummary(
            self._window.resume().position,
            metrics.events_published,
            metrics.dead_lettered_total,
            metrics.events_skipped_recovery,
            "request",
            None,
            self._recovery_summary(),
        )

    def _failure_text(self) -> str:
        delivery = self._failure
        failure = delivery.failure if delivery else None
        if delivery is None or failure is None:
            return "Kafka refused a message"
        return (
            f"Kafka refused a message for {delivery.topic}: {failure.code}: {failure.message}; "
            "the checkpoint stops before it: fix the cause and restart the relay"
        )

    def _recovery_summary(self) -> dict[str, Any]:
        r = self._recovery_stats
        if r is None:
            return {}
        return {
            "records_read": r.records_read,
            "found": r.found,
            "skipped": r.skipped,
            "adopted_found": r.adopted_found,
            "adopted_skipped": r.adopted_skipped,
            "duplicates_in_topics": len(r.duplicates_in_topics),
        }

    def _drop_queued(self, exc: LeaseLost, queued: int) -> None:
        """A fenced stop: purge what the producer holds and say why in one timed line,
        whichever of lease and broker came first. The exception's text is the CLI's one
        line, so a broker's fence is not repeated here."""
        self._publisher.purge()
        why = "the broker refused this instance's transactions" if isinstance(exc, Fenced) else exc
        log.error(
            "fenced: %s (%d message(s) not yet acknowledged were dropped; the successor re-reads them)", why, queued
        )

    def _drain(self) -> None:
        """Stop: wait for what is in flight (dead-letter redirects included), then write
        the checkpoint of the proven prefix. Not when the lease has run out meanwhile (the
        loop ended on another error): then what is queued is dropped, never sent."""
        if self._lease is not None:
            try:
                self._lease.check(self._monotonic())
            except LeaseLost as exc:
                self._drop_queued(exc, self._publisher.pending())
                raise
        if self._txn is not None:
            self._txn_drain()
            return
        deadline = self._clock() + self.settings.drain_timeout_s
        while True:
            remaining = self._publisher.flush(max(0.0, min(1.0, deadline - self._clock())))
            if self._redirects or self._unlocated:
                self._redirect_dead_letters()
                self._confirm_unlocated()
                continue
            if remaining == 0 or self._clock() >= deadline:
                break
        self._window.advance()
        # Released: a successor need not wait for this relay's producer (cdc/lease.py).
        self._checkpoint(force=True, released=self._lease is not None and remaining == 0 and self._lease.lost is None)
        self._writer.close()

    def _open_feed(self, start: StartAt) -> Feed:
        settings = self.settings
        self._feed_seen = {}  # a new feed counts from 0
        if self._feeds is not None:
            return self._feeds.open(start, self._server_id)
        assembler = assembler_for(settings, self._server_id)
        return LocalFeed(
            self._sources,
            assembler,
            start,
            settings.reconnect_timeout_s,
            self._clock,
            self._sleep,
            self._publisher.poll,
        )

    def _feed_counters(self, feed: Feed) -> None:
        """The feed's own counters into the metrics (a reader process counts there)."""
        m, seen = self.metrics, self._feed_seen
        now = {
            "reconnects": feed.reconnects,
            "rows_discarded": feed.discarded_rows,
            "outbox_changes_ignored": feed.outbox_changes_ignored,
        }
        for name, value in now.items():
            setattr(m, name, getattr(m, name) + value - seen.get(name, 0))
        self._feed_seen = now

    # -- publishing ---------------------------------------------------------------------

    def _publish(self, tx: CommittedTransaction) -> None:
        metrics, window = self.metrics, self._window
        metrics.transactions += 1
        metrics.last_commit_ts = tx.identity.commit_ts_ms / 1000.0
        xa = tx.xa
        entry = window.begin(tx.end, tx.identity.gtid, self._server_id, xa, self._clock())
        entry.commit_ts = metrics.last_commit_ts
        handed = False  # a message of it went to Kafka (recovery may skip them all)
        if xa is not None:
            entry.prepared_ts = tx.identity.commit_ts_ms // 1000
        if tx.size:
            if self._lease is not None:
                self._lease.check(self._monotonic())
            if self._txn is not None and not self._txn.open:
                self._txn_begin()
            self._tx_start = tx.identity.start
            recovery = self._recovery
            publisher, cap = self._publisher, self.settings.max_in_flight
            tx_headers = tx.identity.headers()
            for index, item in enumerate(tx.items()):
                if index & 255 == 255:
                    # A large transaction: serve acknowledgements as we go, and wait while
                    # too many are outstanding, so memory stays bounded (the rows
                    # themselves were spilled while the transaction was read).
                    publisher.poll(0)
                    while publisher.pending() > cap:
                        publisher.poll(0.05)
                    if self._lease is not None:
                        self._lease.check(self._monotonic())
                if recovery is not None and (
                    recovery.already_delivered(item.identity.key())
                    or (
                        recovery.adopt_until is not None
                        and type(item) is OutboxEvent
                        and recovery.adopted_delivered(item.event_id)
                    )
                ):
                    window.skipped(entry)
                    metrics.events_skipped_recovery += 1
                    if recovery.pending == 0:
                        if recovery.adopt_until is not None:
                            recovery.end_adoption()  # every message Debezium published is matched
                        log.info(
                            "recovery complete: %d events were already delivered and not sent again", recovery.skipped
                        )
                        self._recovery = recovery = None
                    continue
                if isinstance(item, OutboxEvent):
                    self._publish_event(entry, item, tx_headers)
                else:
                    self._publish_dead_letter(entry, item)
                handed = True
                crashpoints.hit("after_produce")
            if xa is not None:
                crashpoints.hit("xa_outcome")
            tx.release()
        entry.sealed = True
        recovery = self._recovery
        if recovery is not None and recovery.adopt_until is not None and not tx.end < recovery.adopt_until:
            recovery.end_adoption()  # past what Debezium can have read before it stopped
            if recovery.pending == 0:
                self._recovery = None
        if tx.size and handed and not entry.remaining:  # acknowledged while it was being handed over
            self._acknowledged_whole(entry)

    def _acknowledged_whole(self, entry: PendingTx) -> None:
        """Every message of `entry` is acknowledged: its commit -> acknowledgement latency."""
        self.metrics.commit_to_ack.observe(max(0.0, self._clock() - entry.commit_ts))

    def _publish_event(
        self, entry: PendingTx, event: OutboxEvent, tx_headers: list[tuple[str, bytes]], again: bool = False
    ) -> None:
        """Publish `event` (`again`: a second time, its expectation already counted)."""
        value = event.encoded
        extras = event.extras
        if value is None and (extras is None or not extras.null_value):
            prepared = prepare(event, self._serializer, self.settings.max_message_bytes)
            if isinstance(prepared, DeadLetter):
                self._publish_dead_letter(entry, prepared)
                return
            value = cast(bytes, prepared.encoded)  # prepare() set it
        headers: list[tuple[str, bytes | None]] = [
            *tx_headers,
            (H_ROW, str(event.identity.row).encode()),
            (H_EVENT_ID, event.event_id.encode()),
            (H_EVENT_TYPE, event.event_type.encode()),
            (H_TABLE, event.table.encode()),
        ]
        timestamp_ms = None
        if extras is not None:  # a payload format (cdc/formats.py): its headers, the record timestamp
            headers.append((H_FORMAT, extras.format.encode()))
            headers += extras.headers
            timestamp_ms = extras.timestamp_ms
            if timestamp_ms is None:
                timestamp_ms = event.identity.tx.commit_ts_ms
        if event.topic not in self._partitions or (self._missing and event.topic in self._missing):
            missing = self._missing_topic(event.topic)
            if missing is not None:
                self._publish_dead_letter(entry, as_dead_letter(event, "topic_missing", missing), redirect=again)
                return
            self._note_topic(event.topic)
        window = self._window
        if not again:
            window.expect(entry)
        metrics = self.metrics
        size = len(value) if value is not None else 0
        confirm = self._txn is None  # a transaction's messages are not readable before its commit

        def on_delivery(delivery: Delivery) -> None:
            if delivery.failure is None:
                if delivery.offset < 0 and confirm:
                    self._unlocated.append((entry, event, tx_headers, delivery.topic, delivery.partition, size))
                    return
                window.acknowledged(entry, delivery.topic, delivery.partition, delivery.offset)
                metrics.events_published += 1
                metrics.bytes_published += size
                if not entry.remaining and entry.sealed:
                    self._acknowledged_whole(entry)
            elif delivery.failure.too_large:
                # Still in flight: the dead-letter copy's acknowledgement completes it.
                self._redirects.append(
                    (entry, as_dead_letter(event, "too_large", f"{delivery.failure.code}: {delivery.failure.message}"))
                )
            elif delivery.failure.topic_missing:
                why = self._topic_gone(event.topic, f"{delivery.failure.code}: {delivery.failure.message}")
                self._redirects.append((entry, as_dead_letter(event, "topic_missing", why)))
            else:
                self._delivery_failed(delivery)

        if timestamp_ms is None:
            self._publisher.publish(event.topic, event.aggregate_id.encode(), value, headers, on_delivery)
        else:
            self._publisher.publish(event.topic, event.aggregate_id.encode(), value, headers, on_delivery, timestamp_ms)

    def _delivery_failed(self, delivery: Delivery) -> None:
        metrics = self.metrics
        metrics.delivery_errors += 1
        metrics.delivery_error_causes[delivery.failure.code if delivery.failure else "unknown"] += 1
        if self._failure is None:
            self._failure = delivery

    def _redirect_dead_letters(self) -> None:
        redirects, self._redirects = self._redirects, []
        for entry, dead in redirects:
            self._publish_dead_letter(entry, dead, redirect=True)

    def _confirm_unlocated(self) -> None:
        """Kafka acknowledged these messages without an offset: librdkafka's account of a
        retried batch the broker answered as already written. The relay does not take a
        delivery it cannot locate on trust: it looks for each message in its partition
        after the last offset delivered there (by its identity headers). Found, it is
        delivered at that offset; not there, nothing of it is in the topic and it is
        published again (observed with the Kafka stand-in under broker faults)."""
        todo, self._unlocated = self._unlocated, []
        window, metrics = self._window, self.metrics
        for entry, event, tx_headers, topic, partition, size in todo:
            offset = self._locate(topic, partition, tx_headers, event)
            if offset is not None:
                window.acknowledged(entry, topic, partition, offset)
                metrics.events_published += 1
                metrics.bytes_published += size
                if not entry.remaining and entry.sealed:
                    self._acknowledged_whole(entry)
                continue
            metrics.republished_unlocated += 1
            log.warning(
                "Kafka acknowledged event %s (%s row %d) without an offset and %s[%d] does not hold it: "
                "publishing it again",
                event.event_id,
                event.identity.tx.start,
                event.identity.row,
                topic,
                partition,
            )
            self._publish_event(entry, event, tx_headers, again=True)

    def _locate(
        self, topic: str, partition: int, tx_headers: list[tuple[str, bytes]], event: OutboxEvent
    ) -> int | None:
        low, high = self._delivered.watermarks(topic, partition)
        start = max(low, self._window.offsets.get(topic, {}).get(partition, low))
        want = {k: v.decode() for k, v in tx_headers}
        want[H_ROW] = str(event.identity.row)
        want[H_EVENT_ID] = event.event_id
        for offset, headers in self._delivered.records(topic, partition, start, high):
            if all(headers.get(k) == v for k, v in want.items()):
                return offset
        return None

    def _publish_dead_letter(self, entry: PendingTx, dead: DeadLetter, redirect: bool = False) -> None:
        """Send `dead` to the dead-letter topic. A `redirect` (a message Kafka refused as too
        large, re-sent here) keeps the expectation of the original message, and its offset
        is not recorded for the checkpoint: it was produced after messages of later
        transactions, so its offset says nothing about where they sit."""
        topic = self.settings.dead_letter_topic
        headers: list[tuple[str, bytes | None]] = list(dead.identity.headers())
        event_id = dead.row.get("id")
        if event_id is not None:
            headers.append((H_EVENT_ID, str(event_id).encode()))
        headers += [
            (H_DLQ_CAUSE, dead.cause.encode()),
            (H_DLQ_ERROR, dead.error[:1000].encode()),
            (H_DLQ_TOPIC, (dead.intended_topic or "").encode()),
            (H_TABLE, dead.table.encode()),
        ]
        if topic not in self._partitions and self.settings.topic_missing == "create":
            self._missing_topic(topic)  # created now; if refused, its warning is logged and Kafka has the last word
        self._note_topic(topic)
        window, metrics = self._window, self.metrics
        if not redirect:
            window.expect(entry)

        def on_delivery(delivery: Delivery) -> None:
            if delivery.failure is None:
                if redirect:
                    entry.remaining -= 1
                else:
                    window.acknowledged(entry, delivery.topic, delivery.partition, delivery.offset)
                metrics.dead_lettered[dead.cause] += 1
                if not entry.remaining and entry.sealed:
                    self._acknowledged_whole(entry)
                self._log_dead_letter(dead, event_id)
            else:
                self._delivery_failed(delivery)

        key = dead.key.encode() if dead.key is not None else None
        self._publisher.publish(topic, key, dead_letter_value(dead), headers, on_delivery)

    def _ask_kafka(self, what: str, ask: Callable[[], Any]) -> Any:
        """A metadata question to Kafka that the loop cannot go on without: while Kafka
        does not answer, ask again (serving acknowledgements, keeping the lease checked)
        for up to `reconnect_timeout_s`, then give up (DeliveryError: exit 1)."""
        try:
            return ask()
        except DeliveryError as exc:
            first = exc
        metrics = self.metrics
        metrics.kafka_waiting_since = self._clock()
        log.warning(
            "cannot %s (%s); waiting for Kafka (up to %.0f s, relay.reconnect_timeout_s)",
            what,
            first,
            self.settings.reconnect_timeout_s,
        )
        deadline = self._clock() + self.settings.reconnect_timeout_s
        try:
            while True:
                self._publisher.poll(1.0)
                if self._lease is not None:
                    self._lease.check(self._monotonic())
                try:
                    answer = ask()
                except DeliveryError:
                    if self._clock() >= deadline:
                        raise
                    continue
                log.info("Kafka answered: %s done after %.1f s", what, self._clock() - metrics.kafka_waiting_since)
                return answer
        finally:
            metrics.kafka_waiting_since = 0.0

    def _log_dead_letter(self, dead: DeadLetter, event_id: Any) -> None:
        """One line per dead letter, at most one per cause every 10 s (with the count of
        those held back): the operator learns of them without reading the topic."""
        ok, held = self._dead_letter_log.allow(dead.cause)
        if ok:
            more = f" ({held} more dead letters of this cause since the last line)" if held else ""
            start = dead.identity.tx.start
            log.warning(
                "dead-lettered to %s: event %s of %s at %s row %s: %s: %s%s",
                self.settings.dead_letter_topic,
                event_id,
                dead.table,
                start,
                dead.identity.row,
                dead.cause,
                dead.error[:300],
                more,
            )

    def _missing_topic(self, topic: str) -> str | None:
        """None when `topic` exists (or may be created by the brokers: "auto"), else why
        not, for the dead letter. Asked of Kafka's metadata before the first message to
        a topic, and again `topic_recheck_s` after it was found missing."""
        settings = self.settings
        known = self._missing.get(topic)
        now = self._monotonic()
        if known is not None and now < known[0]:
            return known[1]  # found missing (or refused by Kafka) less than topic_recheck_s ago
        if settings.topic_missing == "auto" or (
            topic == settings.dead_letter_topic and settings.topic_missing != "create"
        ):
            self._missing.pop(topic, None)
            return None
        count = self._ask_kafka(f"read the partitions of {topic}", lambda: self._delivered.partition_count(topic))
        if count:
            if known is not None:
                log.info("topic %r exists now: its events are published again", topic)
                del self._missing[topic]
            return None
        if settings.topic_missing == "create" and self._topics is not None:
            refused = self._topics.create_topic(topic)
            if refused is None:
                log.info('created topic %r (topics.missing = "create")', topic)
                self._missing.pop(topic, None)
                return None
            why = f"topic {topic!r} does not exist and could not be created: {refused}"
        else:
            why = (
                f'topic {topic!r} does not exist (topics.missing = "dead_letter"): create it, e.g. '
                f'kafka-topics.sh --create --topic {topic}, or set topics.missing = "create"'
            )
        self._missing[topic] = (now + settings.topic_recheck_s, why)
        if known is None:
            log.warning(
                "%s; its events are dead-lettered to %s (cause topic_missing) until it exists, the other topics go on",
                why,
                settings.dead_letter_topic,
            )
        return why

    def _topic_gone(self, topic: str, error: str) -> str:
        """Kafka refused a message because `topic` does not exist: later events for it are
        dead-lettered at once until a metadata check finds it."""
        why = (
            f"topic {topic!r} does not exist ({error}): create it, e.g. kafka-topics.sh --create --topic {topic}, "
            'or set topics.missing = "create"'
        )
        if topic not in self._missing:
            log.warning(
                "%s; its events are dead-lettered to %s (cause topic_missing) until it exists",
                why,
                self.settings.dead_letter_topic,
            )
        self._missing[topic] = (self._monotonic() + self.settings.topic_recheck_s, why)
        return why

    def _note_topic(self, topic: str) -> None:
        """Before the first message to a topic, write a checkpoint that names it, with
        its current end offsets: after a crash, recovery then knows every topic this run
        may have written, and where in each to start looking."""
        if topic in self._partitions:
            return
        count = self._ask_kafka(f"read the partitions of {topic}", lambda: self._delivered.partition_count(topic))
        self._partitions[topic] = count or 0  # 0: not created yet; recovery reads it whole
        window = self._window
        if count:
            ends = self._ask_kafka(
                f"read the end offsets of {topic}",
                lambda: {p: self._delivered.watermarks(topic, p)[1] for p in range(count)},
            )
            window.note_topic(topic, ends)
        if self._tx_start is not None and (window.position is None or window.position_server_id != self._server_id):
            # Started from a GTID set (no checkpoint, or a failover): until a transaction
            # of this server completes, the first one's start is the resume point here.
            window.position, window.position_server_id = self._tx_start, self._server_id
        if self._txn is None:  # transactional: nothing is scanned, the next commit names it
            self._checkpoint(force=True)

    # -- checkpoint ---------------------------------------------------------------------

    def _checkpoint(self, force: bool = False, released: bool = False) -> None:
        if self._txn is not None:  # every checkpoint is part of a Kafka transaction
            self._txn_commit(force=force, released=released)
            return
        window = self._window
        if window is None:
            return
        resume = window.resume()
        if resume.position is None:
            return
        if not force and not self._moved(resume):
            return
        crashpoints.hit("after_ack_before_checkpoint")
        cp = self._new_checkpoint(resume, released)
        if force:
            self._writer.save(cp)  # must be durable before the relay goes on
        else:
            self._writer.submit(cp)
        self._last_checkpoint = cp

    def _moved(self, resume: Any) -> bool:
        """Does `resume` say something the last checkpoint does not?"""
        window, last = self._window, self._last_checkpoint
        xa_held = tuple((h.xid, str(h.prepared_at), h.prepared_ts) for h in window.held.values())
        return not (
            last is not None
            and last.position == resume.position
            and last.xa_held == xa_held
            and (not window.held or last.offsets == resume.offsets)
        )

    def _new_checkpoint(self, resume: Any, released: bool) -> Checkpoint:
        window = self._window
        xa_held = tuple((h.xid, str(h.prepared_at), h.prepared_ts) for h in window.held.values())
        for topic, count in list(self._partitions.items()):
            if not count:  # created by the first produce: learn its partition count now
                self._partitions[topic] = (
                    self._ask_kafka(f"read the partitions of {topic}", partial(self._delivered.partition_count, topic))
                    or 0
                )
        adopted = self._adopted
        if adopted is not None and not resume.position < adopted.until:
            adopted = self._adopted = None  # a restart from here re-reads nothing Debezium can have published
        cp = Checkpoint(
            source=self.settings.source_name,
            position=resume.position,
            gtids=str(resume.gtids) if resume.gtids else None,
            server_id=resume.server_id,
            offsets={t: dict(ps) for t, ps in resume.offsets.items()},
            partitions=dict(self._partitions),
            written_at_ms=int(self._clock() * 1000),
            events_delivered=resume.events_delivered,
            xa_held=xa_held,
            epoch=self._epoch,
            holder=self._holder,
            released=released,
            # Transactional: committed with every message before it. Not while an XA prepare
            # holds it back: messages after it were committed, a restart must scan for them.
            exact=self._txn is not None and not window.held and adopted is None,
            adopted=adopted,
        )
        return cp

    # -- transactional delivery -----------------------------------------------------------

    def _fenced(self, code: str | None) -> bool:
        return self._txn is not None and code in FENCED_CODES

    def _fail(self) -> None:
        """A delivery failed: idempotent delivery stops (DeliveryError); transactional
        delivery aborts and re-reads (TransactionAborted), or stops if fenced."""
        failure = self._failure.failure if self._failure is not None else None
        if self._txn is None:
            raise DeliveryError(self._failure_text())
        if failure is not None and failure.code in FENCED_CODES:
            raise Fenced(self.txn_id)
        raise TransactionAborted(self._failure_text())

    def _txn_begin(self) -> None:
        if self._txn is None:
            return
        self._txn_publisher.begin_transaction()
        self._txn.opened(self._clock())

    def _txn_commit(self, force: bool = False, released: bool = False) -> None:
        """Commit the open Kafka transaction with the checkpoint after its last database
        transaction inside (or, with none open, a transaction of the checkpoint alone when
        it moved or `force`). Raises TransactionAborted when it cannot."""
        txn, publisher, window = self._txn, self._txn_publisher, self._window
        if txn is None:
            return
        if txn.open:
            crashpoints.hit("txn_before_commit")
            remaining = publisher.flush(self.settings.drain_timeout_s)  # every acknowledgement served
            if self._failure is not None:
                self._fail()
            if self._redirects:
                raise TransactionAborted(
                    "Kafka refused a message as too large inside a transaction (set "
                    "relay.max_message_bytes to the topic's max.message.bytes)"
                )
            if remaining:
                raise TransactionAborted(f"{remaining} messages not acknowledged within relay.drain_timeout_s")
        window.advance()
        resume = window.resume()
        cp = None if resume.position is None else self._new_checkpoint(resume, released)
        if not txn.open:
            if cp is None or not (force or self._moved(resume)):
                return
            self._txn_begin()
        if cp is not None:
            self._writer.save(cp)  # produced inside the transaction (the transactional store)
        publisher.commit_transaction(self.settings.drain_timeout_s)
        crashpoints.hit("txn_after_commit")
        txn.committed()
        if cp is not None:
            self._last_checkpoint = cp
        self.metrics.checkpoint_behind_since = window.oldest_handed_at()

    def _txn_drain(self) -> None:
        """Stop: commit what is open with the last checkpoint (marked released when all
        went well); an abort here leaves the range to the next start."""
        released = self._lease is not None and self._lease.lost is None
        try:
            if self._redirects:
                self._redirect_dead_letters()
            self._txn_commit(force=True, released=released)
        except TransactionAborted as exc:
            log.warning(
                "the last Kafka transaction could not be committed (%s); it is aborted and the next start "
                "re-reads from the checkpoint %s",
                exc,
                self._last_checkpoint.position if self._last_checkpoint else self._start,
            )
            try:
                self._txn_publisher.abort_transaction(self.settings.drain_timeout_s)
            except TransactionAborted:
                pass
        finally:
            self._writer.close()
        if self._txn is not None:
            figures = self._txn.summary()
            log.info(
                "transactional delivery: %d Kafka transactions committed (%.0f messages each on average), %d aborted",
                figures["commits"],
                figures["mean_batch"],
                figures["aborts"],
            )

    def _rewind(self, feed: Feed, why: str) -> Feed:
        """Abort the open Kafka transaction (nothing of it becomes visible to
        read_committed readers) and re-read the binlog from the last committed checkpoint."""
        txn = self._txn
        if txn is None:
            raise DeliveryError(why)
        try:
            self._txn_publisher.abort_transaction(self.settings.drain_timeout_s)
        except TransactionAborted as exc:
            raise DeliveryError(f"a Kafka transaction could not be aborted ({exc}) after: {why}") from exc
        txn.aborted()
        self.metrics.delivery_error_causes["transaction_aborted"] += 1
        if txn.aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise DeliveryError(
                f"{txn.aborts_in_a_row} Kafka transactions aborted in a row, the last because: {why}; "
                "fix the cause and restart the relay"
            )
        cp = self._last_checkpoint
        log.warning(
            "Kafka transaction aborted (%s): nothing of it is visible to read_committed consumers; "
            "re-reading from the last committed checkpoint %s",
            why,
            cp.position if cp else self._start,
        )
        feed.close()
        self._failure, self._redirects, self._recovery = None, [], None
        self._unlocated = []
        self._window = window = InflightWindow(cp)
        self.metrics.unacknowledged_since = window.oldest_unacknowledged
        if cp is None:
            if self._start is None:  # run() sets it before anything is read
                raise DeliveryError(why)
            if isinstance(self._start, BinlogPosition):
                window.position, window.position_server_id = self._start, self._server_id
            start = self._start
        else:
            start = self._start_point(cp)
            if not cp.exact:
                self._scan(cp)
        return self._open_feed(start)

    def _end_as_zombie(self) -> None:
        """The lease ran out (transactional): ask the broker before leaving. What is open
        is aborted; then the last checkpoint is written once more in a transaction of its
        own, which is aborted too: if a successor already ran init_transactions, the broker
        refuses the write (Fenced: the one line); otherwise nothing of it is ever visible
        to read_committed readers."""
        publisher, timeout = self._txn_publisher, min(5.0, self.settings.drain_timeout_s)
        if self._txn is not None:
            self._txn.open = False
        try:
            publisher.abort_transaction(timeout)  # whatever is open, in whatever state
        except TransactionAborted:
            pass
        if self._last_checkpoint is None:
            return
        try:
            publisher.begin_transaction()
            self._store.save(self._last_checkpoint)
            publisher.flush(timeout)
            publisher.abort_transaction(timeout)
        except TransactionAborted:
            pass

    def _scan(self, cp: Checkpoint) -> None:
        """The recovery scan of the topics' tails after `cp` (docs/DESIGN.md, promise 4)."""
        recovery = Recovery(cp, self._delivered)
        recovery.scan_all(set(cp.partitions) | set(cp.offsets) | {self.settings.dead_letter_topic})
        log.info("recovering from checkpoint %s: %d events found delivered after it", cp.position, recovery.found)
        if cp.adopted is not None:
            log.info(
                "adopted from %s: %d Debezium messages in the window up to %s are recognised by their id",
                cp.adopted.origin or "Debezium",
                recovery.adopted_found,
                cp.adopted.until,
            )
        if recovery.pending:
            self._recovery = recovery
        self._recovery_stats = recovery
