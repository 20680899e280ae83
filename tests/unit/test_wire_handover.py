"""The hand-over's two ways for a transaction from the reader process (cdc/delivery/handover.py): the
common envelope event goes from its pipe tuple to produce() (`Handover.transaction`'s tuple way, no
OutboxEvent or EventIdentity), anything else through its object (`ShippedTransaction.item`).
Whatever the items, the messages produced, their reports' effects (acknowledgements, a
too-large refusal's dead letter, an acknowledgement without an offset) are the ones the
object path gives for the same items."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.assembly.feed import prepare
from cdc.delivery.handover import Handover
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.delivery.missing_topics import MissingTopics
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import DeadLetter, OutboxEvent, OutboxTable
from cdc.log_limit import LogLimiter
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc.position import BinlogPosition
from cdc.relay_settings import RelaySettings
from connectors.mysql.reader_process import ShippedTransaction
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client
from fakes import TOO_LARGE, _Written

_SERIALIZER = ConfluentAvroSerializer(registry_client("mock://test-wire-handover"))
_TX = TxIdentity("s", BinlogPosition("mysql-bin.000001", 4), "0-1-7", 1, 1_764_000_000_000)
_END = BinlogPosition("mysql-bin.000001", 99)
_TOPICS = ("outbox.event.order", "outbox.event.invoice")
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


class _Recording:
    """A ReportingPublisher that keeps what it was given; the test plays Kafka's reports."""

    def __init__(self) -> None:
        self.produced: list[tuple[Any, ...]] = []
        self.reports: list[Any] = []

    def publish(
        self, topic: str, key: bytes, value: bytes, headers: list, on_delivery: Any, timestamp_ms: int | None = None
    ) -> None:
        self.produced.append((topic, key, value, list(headers), timestamp_ms))
        self.reports.append(lambda error, message: on_delivery(self.delivery(topic, error, message)))

    def publish_reported(
        self, topic: str, key: bytes, value: bytes, headers: list, report: Any, timestamp_ms: int | None = None
    ) -> None:
        self.produced.append((topic, key, value, list(headers), timestamp_ms))
        self.reports.append(report)

    def delivery(self, topic: str, error: Any, message: Any) -> Delivery:
        if error is None:
            offset = message.offset()
            return Delivery(topic, message.partition(), -1 if offset is None else offset)
        return Delivery(topic, -1, -1, error)

    def poll(self, _timeout: float) -> int:
        return 0

    def pending(self) -> int:
        return 0


class _ObjectsOnly:
    """The same transaction without `wire`: the hand-over takes the object path."""

    def __init__(self, shipped: ShippedTransaction):
        self.identity, self.end, self.size, self.xa = shipped.identity, shipped.end, shipped.size, shipped.xa
        self._shipped = shipped

    def items(self) -> Any:
        return self._shipped.items()

    def release(self) -> None:
        self._shipped.release()


def _handover() -> tuple[Handover, _Recording, Ledger]:
    settings = RelaySettings(source_name="s", tables=(OutboxTable("db", "outbox"),), dead_letter_topic="dlq")
    metrics, publisher = RelayMetrics(), _Recording()
    ledger = Ledger("s", "dlq", None, None, metrics, time.time)
    for topic in (*_TOPICS, "dlq"):
        ledger.partitions[topic] = 3
    handover = Handover(
        settings,
        publisher,
        _SERIALIZER,
        ledger,
        # The delivery mode's three hooks only; every topic named, so no metadata is asked.
        SimpleNamespace(readable_when_acknowledged=True, handing_over=lambda tx: None, topic_named=lambda: None),  # type: ignore[arg-type]
        MissingTopics(settings, None, None, time.monotonic),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # no unlocated acknowledgement is confirmed here
        LogLimiter(10.0, time.monotonic),
        LeaseGuard(None, time.monotonic, publisher),
        metrics,
        lambda: 1_000.0,
    )
    return handover, publisher, ledger


@st.composite
def _wires(draw: Any) -> tuple[Any, ...]:
    """A pipe tuple as the reader sends it: mostly tag 2, some tag 0 (the payload beside
    the value), some dead letters (tag 1)."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return DeadLetter("missing_column", "no id", None, None, {"a": 1}, "db.outbox", EventIdentity(_TX, 0)).to_wire()
    event = OutboxEvent(
        draw(_TEXT),
        draw(st.sampled_from(["order", "invoice"])),
        draw(_TEXT),
        draw(st.sampled_from(["Created", draw(_TEXT)])),
        draw(st.one_of(st.none(), _TEXT)),
        draw(st.one_of(st.none(), st.integers(0, 1 << 50))),
        draw(st.sampled_from(_TOPICS)),
        "db.outbox",
        EventIdentity(_TX, 0),
    )
    prepared = prepare(event, _SERIALIZER, 1 << 20)
    assert isinstance(prepared, OutboxEvent)
    return prepared.to_wire(payload_in_value=kind != 1)


def _hand_over(wires: list[tuple[Any, ...]], objects: bool, reports: list[Any]) -> tuple[Any, ...]:
    """Hand `wires` over one way; Kafka answers each message with the matching report."""
    handover, publisher, ledger = _handover()
    # No feed (the whole transaction is its first chunk); the transactions are duck-typed.
    shipped = ShippedTransaction(None, _TX, _END, len(wires), list(wires), False)  # type: ignore[arg-type]
    handover.transaction(_ObjectsOnly(shipped) if objects else shipped)  # type: ignore[arg-type]
    for n, report in enumerate(publisher.reports):
        error, offset = reports[n % len(reports)]
        report(error, _Written(n % 3, offset))
    entry = ledger.window._queue[0] if len(ledger.window) else None
    metrics = handover.metrics
    return (
        publisher.produced,
        ledger.redirects,
        [(u.event, u.tx_headers, u.topic, u.partition, u.size) for u in ledger.unlocated],
        None if entry is None else (entry.remaining, entry.events, dict(entry.offsets)),
        (metrics.events_published, metrics.bytes_published),
    )


_REPORTS = st.lists(st.sampled_from([(None, 5), (None, 9), (None, None), (TOO_LARGE, None)]), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(st.lists(_wires(), min_size=1, max_size=8), _REPORTS)
def test_the_tuple_way_produces_and_settles_what_the_object_way_does(wires, reports):
    assert _hand_over(wires, objects=False, reports=reports) == _hand_over(wires, objects=True, reports=reports)


def test_the_common_envelope_event_builds_no_object_on_its_way_to_kafka(monkeypatch):
    event = OutboxEvent("e-1", "order", "o-1", "Created", "{}", None, _TOPICS[0], "db.outbox", EventIdentity(_TX, 0))
    prepared = prepare(event, _SERIALIZER, 1 << 20)
    assert isinstance(prepared, OutboxEvent)
    wires = [prepared.to_wire(payload_in_value=True)] * 3
    made: list[Any] = []
    item = ShippedTransaction.item
    monkeypatch.setattr(ShippedTransaction, "item", lambda self, w, row: made.append(row) or item(self, w, row))
    produced, _redirects, _unlocated, entry, published = _hand_over(wires, objects=False, reports=[(None, 4)])
    assert made == [] and len(produced) == 3 and entry is not None and entry[0] == 0 and published[0] == 3
    # a refusal makes the object, for its dead letter
    produced, redirects, _unlocated, _entry, _published = _hand_over(wires, objects=False, reports=[(TOO_LARGE, None)])
    assert made == [0, 1, 2] and [dead.cause for _entry, dead in redirects] == ["too_large"] * 3
    assert redirects[0][1].row["payload"] == "{}"  # read back from the value
