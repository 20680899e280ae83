"""The hand-over: a committed transaction's messages to the producer, in row order, and
each acknowledgement into the run's in-flight window (cdc/delivery/ledger.py).

    CommittedTransaction (from the feed)
      -> recovery says "already delivered"?  skip (counts as delivered)
      -> event: serializer.encode (unless the feed did), headers, topic checked
         (cdc/delivery/missing_topics.py) and named in the ledger before its first message
      -> publisher.publish(on_delivery)   (never fire and forget; the Kafka publisher's
         publish_reported: the client calls the hand-over's own report)
    on_delivery: acknowledged -> window; too large / topic gone -> redirected to the
      dead-letter topic (cdc/events/dead_letters.py); no offset -> looked for (cdc/delivery/unlocated.py);
      any other failure -> the ledger's failure, for the delivery mode to act on.

The delivery mode (cdc/delivery/) is told before a transaction's first message is handed
over (`handing_over`: a transactional mode opens a Kafka transaction) and when a topic
is named for the first time (`topic_named`). Messages are handed over in commit order
and row order (the idempotent producer keeps that order per partition); a large
transaction is handed over with acknowledgements served as it goes and at most
`max_in_flight` outstanding, so memory stays bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

from cdc import crashpoints
from cdc.assembly.feed import as_dead_letter, prepare
from cdc.assembly.transaction import CommittedTransaction
from cdc.delivery import DeliveryMode
from cdc.delivery.inflight import PendingTx
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.delivery.missing_topics import MissingTopics
from cdc.delivery.unlocated import Unlocated, UnlocatedConfirmation
from cdc.events.dead_letters import DeadLetterLog, dead_letter_headers, dead_letter_value
from cdc.events.formats import H_FORMAT
from cdc.events.identity import H_EVENT_ID, H_EVENT_TYPE, H_ROW, H_TABLE
from cdc.events.outbox import DeadLetter, OutboxEvent
from cdc.log_limit import LogLimiter
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery, Publisher, ReportingPublisher, Serializer, WireTransaction
from cdc.relay_settings import RelaySettings

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")

# The row header (cdc/events/identity.py: the row's index in its transaction, as text) of the
# first rows, made once: a look-up instead of str(), encode() and a tuple per event.
_ROW_HEADERS = tuple((H_ROW, str(row).encode()) for row in range(1024))
# Event types and tables whose headers are kept by their text; past this many, the cache
# starts over (a mapping that makes a new event type per row costs an encode, no memory).
_TEXT_HEADERS_KEPT = 4096


def _text_header(cache: dict[str, tuple[str, bytes]], name: str, text: str) -> tuple[str, bytes]:
    if len(cache) >= _TEXT_HEADERS_KEPT:
        cache.clear()
    header = cache[text] = (name, text.encode())
    return header


def _never(*_args: Any) -> None:
    raise AssertionError("a message of the tuple way without a reporting publisher")


class _WireReports:
    """The reports of one transaction's messages of the tuple way: librdkafka calls
    `partial(reported, wire, row)` with (error, message). The transaction's parts are this
    object's, so the partial holds two arguments, not four: CPython 3.11 calls a partial
    (partial_vectorcall) with its arguments and the caller's in an array on the C stack
    when they are at most five, and a bound method (method_vectorcall) with `self` added
    when they are at most four; beyond, each allocates one (PyMem_Malloc), twice a report
    with four. An acknowledgement at an offset is taken here; anything else is
    `Handover._wire_failed`."""

    __slots__ = ("_acknowledged_at", "_entry", "_failed", "_tx")

    def __init__(self, handover: Handover, entry: PendingTx, tx: WireTransaction):
        self._acknowledged_at, self._failed = handover._acknowledged_at, handover._wire_failed
        self._entry, self._tx = entry, tx

    def reported(self, wire: tuple, row: int, error: Any, message: Any) -> None:
        if error is None:
            offset = message.offset()  # None, never below 0 (confluent-kafka's Message_offset)
            if offset is not None:
                self._acknowledged_at(self._entry, wire[7], message.partition(), offset, len(wire[9]))
                return
        self._failed(self._entry, self._tx, wire, row, error, message)


class Handover:
    def __init__(
        self,
        settings: RelaySettings,
        publisher: Publisher,
        serializer: Serializer,
        ledger: Ledger,
        delivery: DeliveryMode,
        missing: MissingTopics,
        unlocated: UnlocatedConfirmation,
        dead_letter_log: LogLimiter,
        guard: LeaseGuard,
        metrics: RelayMetrics,
        clock: Callable[[], float],
    ):
        self._settings = settings
        self._publisher = publisher
        self._serializer = serializer
        self._ledger = ledger
        self._delivery = delivery
        self._missing = missing
        self._unlocated = unlocated
        self._dead_letter_log = DeadLetterLog(settings.dead_letter_topic, dead_letter_log)
        self._guard = guard
        self.metrics = metrics
        self._clock = clock
        # Never rebound, only changed: looked at before every message.
        self._named = ledger.partitions
        self._absent = missing.absent
        # Else Kafka's word is taken for an acknowledgement without an offset (cdc/delivery/unlocated.py).
        self._locate = delivery.readable_when_acknowledged
        # A publisher whose client calls each message's report itself (the Kafka publisher)
        # is given `_event_reported` as that report: one callable per message, no Delivery
        # on success. Looked up on the class: a wrapper that delegates by __getattr__ (a
        # test's, a bench's) keeps its own `publish`.
        self._reporting: ReportingPublisher | None = (
            cast(ReportingPublisher, publisher) if hasattr(type(publisher), "publish_reported") else None
        )
        self._reported = self._event_reported  # bound once, not per message
        # The tuple way's produce (used only with a reporting publisher), bound once.
        self._publish_reported: Callable[..., None] = getattr(self._reporting, "publish_reported", _never)
        # The event-type and table headers by their text: a few texts, on every event.
        self._type_headers: dict[str, tuple[str, bytes]] = {}
        self._table_headers: dict[str, tuple[str, bytes]] = {}

    def transaction(self, tx: CommittedTransaction) -> None:
        """Hand every message of `tx` over (or skip what recovery found delivered)."""
        ledger, metrics = self._ledger, self.metrics
        window = ledger.window
        metrics.transactions += 1
        metrics.last_commit_ts = tx.identity.commit_ts_ms / 1000.0
        xa = tx.xa
        entry = window.begin(tx.end, tx.identity.gtid, ledger.server_id, xa, self._clock())
        entry.commit_ts = metrics.last_commit_ts
        handed = False  # a message of it went to Kafka (recovery may skip them all)
        if xa is not None:
            entry.prepared_ts = tx.identity.commit_ts_ms // 1000
        if tx.size:
            guard = self._guard
            guard.check()
            self._delivery.handing_over(tx)
            ledger.tx_start = tx.identity.start
            recovery = ledger.recovery
            publisher, cap = self._publisher, self._settings.max_in_flight
            tx_headers = tx.identity.headers()
            # A transaction from the reader process gives its items as the pipe's tuples:
            # the common envelope event goes from its tuple to produce() (the tuple way below),
            # anything else becomes its object first (`wired.item`), as `items` would give it.
            wired = cast(WireTransaction, tx) if self._reporting is not None and hasattr(type(tx), "wire") else None
            named, absent = self._named, self._absent
            rows: Iterator[Any] = wired.wire() if wired is not None else tx.items()
            if wired is not None:
                produce, headers = self._publish_reported, self._headers
                report = _WireReports(self, entry, wired).reported
            crash = crashpoints.armed("after_produce")  # else its call is left out, once per event
            for index, got in enumerate(rows):
                if index & 255 == 255:
                    # A large transaction: serve acknowledgements as we go, and wait while
                    # too many are outstanding, so memory stays bounded (the rows
                    # themselves were spilled while the transaction was read).
                    publisher.poll(0)
                    while publisher.pending() > cap:
                        publisher.poll(0.05)
                    guard.check()
                if wired is not None:
                    # Tag 2: an envelope event, its value made (OutboxEvent.to_wire); on a
                    # topic already named and not missing, it needs no object.
                    if got[0] == 2 and recovery is None and got[7] in named and not (absent and got[7] in absent):
                        # `event` of the tuple (event_id, aggregate_id, event_type, topic,
                        # table, value at 1, 3, 4, 7, 8, 9): the same message, headers and
                        # report, without the OutboxEvent and its EventIdentity.
                        entry.remaining += 1  # InflightWindow.expect, inline
                        entry.events += 1
                        produce(
                            got[7],
                            got[3].encode(),
                            got[9],
                            headers(tx_headers, index, got[1], got[4], got[8]),
                            partial(report, got, index),
                            None,
                        )
                        handed = True
                        if crash:
                            crashpoints.hit("after_produce")
                        continue
                    got = wired.item(got, index)
                item: OutboxEvent | DeadLetter = got
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
                        ledger.recovery = recovery = None
                    continue
                if isinstance(item, OutboxEvent):
                    self.event(entry, item, tx_headers)
                else:
                    self.dead_letter(entry, item)
                handed = True
                if crash:
                    crashpoints.hit("after_produce")
            if xa is not None:
                crashpoints.hit("xa_outcome")
            tx.release()
        entry.sealed = True
        recovery = ledger.recovery
        if recovery is not None and recovery.adopt_until is not None and not tx.end < recovery.adopt_until:
            recovery.end_adoption()  # past what Debezium can have read before it stopped
            if recovery.pending == 0:
                ledger.recovery = None
        if tx.size and handed and not entry.remaining:  # acknowledged while it was being handed over
            self._acknowledged_whole(entry)

    def _acknowledged_whole(self, entry: PendingTx) -> None:
        """Every message of `entry` is acknowledged: its commit -> acknowledgement latency."""
        self.metrics.commit_to_ack.observe(max(0.0, self._clock() - entry.commit_ts))

    def _name(self, topic: str) -> None:
        if self._ledger.name_topic(topic):
            self._delivery.topic_named()

    def event(
        self, entry: PendingTx, event: OutboxEvent, tx_headers: list[tuple[str, bytes]], again: bool = False
    ) -> None:
        """Publish `event` (`again`: a second time, its expectation already counted)."""
        value = event.encoded
        extras = event.extras
        if value is None and (extras is None or not extras.null_value):
            prepared = prepare(event, self._serializer, self._settings.max_message_bytes)
            if isinstance(prepared, DeadLetter):
                self.dead_letter(entry, prepared)
                return
            value = cast(bytes, prepared.encoded)  # prepare() set it
        headers = self._headers(tx_headers, event.identity.row, event.event_id, event.event_type, event.table)
        timestamp_ms = None
        if extras is not None:  # a payload format (cdc/events/formats.py): its headers, the record timestamp
            headers.append((H_FORMAT, extras.format.encode()))
            headers += extras.headers
            timestamp_ms = extras.timestamp_ms
            if timestamp_ms is None:
                timestamp_ms = event.identity.tx.commit_ts_ms
        absent = self._absent
        if event.topic not in self._named or (absent and event.topic in absent):
            missing = self._missing.reason(event.topic)
            if missing is not None:
                self.dead_letter(entry, as_dead_letter(event, "topic_missing", missing), redirect=again)
                return
            self._name(event.topic)
        if not again:  # InflightWindow.expect, inline: once per event
            entry.remaining += 1
            entry.events += 1
        # A partial of a method, not a closure: a closure's cells would make every local of
        # this method a cell too, and this runs once per event (measured in-process, the
        # hand-over and its acknowledgements: 5.9 -> 3.6 us an event).
        size = len(value) if value is not None else 0
        reporting = self._reporting
        if reporting is not None:
            reporting.publish_reported(
                event.topic,
                event.aggregate_id.encode(),
                value,
                headers,
                partial(self._reported, entry, event, tx_headers, size),
                timestamp_ms,
            )
        else:
            on_delivery = partial(self._event_delivered, entry, event, tx_headers, size)
            self._publisher.publish(event.topic, event.aggregate_id.encode(), value, headers, on_delivery, timestamp_ms)

    def _headers(
        self, tx_headers: list[tuple[str, bytes]], row: int, event_id: str, event_type: str, table: str
    ) -> list[tuple[str, bytes | None]]:
        """An event's identity headers (cdc/events/identity.py): its transaction's, then its own."""
        return [
            *tx_headers,
            _ROW_HEADERS[row] if row < 1024 else (H_ROW, str(row).encode()),
            (H_EVENT_ID, event_id.encode()),
            self._type_headers.get(event_type) or _text_header(self._type_headers, H_EVENT_TYPE, event_type),
            self._table_headers.get(table) or _text_header(self._table_headers, H_TABLE, table),
        ]

    def _wire_failed(
        self, entry: PendingTx, tx: WireTransaction, wire: tuple, row: int, error: Any, message: Any
    ) -> None:
        """`_event_reported`'s other cases for a message of the tuple way (a failure, an
        acknowledgement without an offset): the event object is made from its tuple."""
        reporting = cast(ReportingPublisher, self._reporting)
        delivery = reporting.delivery(wire[7], error, message)
        self._event_delivered(entry, tx.item(wire, row), tx.identity.headers(), len(wire[9]), delivery)

    def _acknowledged_at(self, entry: PendingTx, topic: str, partition: int, offset: int, size: int) -> None:
        """InflightWindow.acknowledged, inline (once per event), and the metrics: an
        acknowledgement at an offset, of either way's message."""
        entry.remaining -= 1
        offsets, key = entry.offsets, (topic, partition)
        if offset > offsets.get(key, -1):
            offsets[key] = offset
        metrics = self.metrics
        metrics.events_published += 1
        metrics.bytes_published += size
        if not entry.remaining and entry.sealed:
            self._acknowledged_whole(entry)

    def _event_reported(
        self,
        entry: PendingTx,
        event: OutboxEvent,
        tx_headers: list[tuple[str, bytes]],
        size: int,
        error: Any,
        message: Any,
    ) -> None:
        """The client's own report of `event` (cdc.ports.ReportingPublisher). Acknowledged
        at a known offset, the common case, is `_event_delivered`'s first branch without a
        Delivery (and `InflightWindow.acknowledged` inline: this runs once per event);
        anything else goes there as the port's Delivery."""
        if error is None:
            offset = message.offset()  # None, never below 0 (confluent-kafka's Message_offset)
            if offset is not None:
                self._acknowledged_at(entry, event.topic, message.partition(), offset, size)
                return
        reporting = cast(ReportingPublisher, self._reporting)
        self._event_delivered(entry, event, tx_headers, size, reporting.delivery(event.topic, error, message))

    def _event_delivered(
        self, entry: PendingTx, event: OutboxEvent, tx_headers: list[tuple[str, bytes]], size: int, delivery: Delivery
    ) -> None:
        """Kafka's word on `event`, a message of `entry` of `size` bytes."""
        if delivery.failure is None:
            if delivery.offset < 0 and self._locate:
                self._ledger.unlocated.append(
                    Unlocated(entry, event, tx_headers, delivery.topic, delivery.partition, size)
                )
                return
            self._ledger.window.acknowledged(entry, delivery.topic, delivery.partition, delivery.offset)
            metrics = self.metrics
            metrics.events_published += 1
            metrics.bytes_published += size
            if not entry.remaining and entry.sealed:
                self._acknowledged_whole(entry)
        elif delivery.failure.too_large:
            # Still in flight: the dead-letter copy's acknowledgement completes it.
            self._ledger.redirects.append(
                (entry, as_dead_letter(event, "too_large", f"{delivery.failure.code}: {delivery.failure.message}"))
            )
        elif delivery.failure.unroutable:
            # A mandatory AMQP message that no queue took (basic.return before its ack):
            # no queue holds it, so its dead-letter copy stands in for it (docs/sinks.md)
            why = f"{delivery.failure.code}: {delivery.failure.message}"
            self._ledger.redirects.append((entry, as_dead_letter(event, "unroutable", why)))
        elif delivery.failure.topic_missing:
            why = self._missing.gone(event.topic, f"{delivery.failure.code}: {delivery.failure.message}")
            self._ledger.redirects.append((entry, as_dead_letter(event, "topic_missing", why)))
        else:
            self._ledger.delivery_failed(delivery)

    def dead_letter(self, entry: PendingTx, dead: DeadLetter, redirect: bool = False) -> None:
        """Send `dead` to the dead-letter topic. A `redirect` (a message Kafka refused as too
        large, re-sent here) keeps the expectation of the original message, and its offset
        is not recorded for the checkpoint: it was produced after messages of later
        transactions, so its offset says nothing about where they sit."""
        topic = self._settings.dead_letter_topic
        headers = dead_letter_headers(dead)
        if topic not in self._named and self._settings.topic_missing == "create":
            self._missing.reason(topic)  # created now; if refused, its warning is logged and Kafka has the last word
        self._name(topic)
        ledger, metrics = self._ledger, self.metrics
        window = ledger.window
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
                self._dead_letter_log.delivered(dead)
            else:
                ledger.delivery_failed(delivery)

        key = dead.key.encode() if dead.key is not None else None
        self._publisher.publish(topic, key, dead_letter_value(dead), headers, on_delivery)

    def settle(self) -> None:
        """On the loop's thread: send what Kafka refused to the dead-letter topic, and look
        for what it acknowledged without an offset."""
        ledger = self._ledger
        if ledger.redirects:
            redirects, ledger.redirects = ledger.redirects, []
            for entry, dead in redirects:
                self.dead_letter(entry, dead, redirect=True)
        if ledger.unlocated:
            todo, ledger.unlocated = ledger.unlocated, []
            self._unlocated.confirm(todo, ledger.window, self._located, self.event_again)

    def _located(self, entry: PendingTx, topic: str, partition: int, offset: int, size: int) -> None:
        self._ledger.window.acknowledged(entry, topic, partition, offset)
        metrics = self.metrics
        metrics.events_published += 1
        metrics.bytes_published += size
        if not entry.remaining and entry.sealed:
            self._acknowledged_whole(entry)

    def event_again(self, entry: PendingTx, event: OutboxEvent, tx_headers: list[tuple[str, bytes]]) -> None:
        self.event(entry, event, tx_headers, again=True)
