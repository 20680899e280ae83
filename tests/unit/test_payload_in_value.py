"""The reader process leaves an envelope event's payload out of what it sends the relay
(connectors/mysql/reader_process.py, `OutboxEvent.to_wire(payload_in_value=True)`): its Avro value
holds the payload whole. What the relay rebuilds still gives a dead letter the payload as
the row held it (text, bytes or NULL), and the events of a payload format keep theirs."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.assembly.feed import as_dead_letter, prepare
from cdc.events.formats import MessageExtras
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import OutboxEvent, item_from_wire
from cdc.position import BinlogPosition
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, envelope_payload, registry_client

_IDENTITY = EventIdentity(TxIdentity("s", BinlogPosition("mysql-bin.000001", 4), None, 1, 0), 3)
_SERIALIZER = ConfluentAvroSerializer(registry_client("mock://test-payload-in-value"))
_TEXT = st.text(st.characters(codec="utf-8"), max_size=3000)


def _event(payload, timestamp_us=None, extras=None) -> OutboxEvent:
    return OutboxEvent("e1", "order", "order-1", "Created", payload, timestamp_us, "orders", "db.outbox", _IDENTITY,
                       extras=extras)  # fmt: skip


def _across_the_pipe(event: OutboxEvent) -> tuple[tuple, OutboxEvent]:
    wire = pickle.loads(pickle.dumps(event.to_wire(_SERIALIZER.payload_in_value)))
    back = item_from_wire(wire, _IDENTITY, envelope_payload)
    assert isinstance(back, OutboxEvent)
    return wire, back


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), _TEXT, st.binary(max_size=3000)), st.one_of(st.none(), st.integers(0, 1 << 60)))
def test_an_envelope_events_payload_stays_behind_and_its_dead_letter_keeps_it(payload, timestamp_us):
    event = prepare(_event(payload, timestamp_us), _SERIALIZER, 1 << 20)
    assert isinstance(event, OutboxEvent) and event.encoded is not None
    wire, back = _across_the_pipe(event)
    assert wire[0] == 2 and wire[5] is None  # the payload did not cross
    assert back.encoded == event.encoded and back.event_id == "e1" and back.identity == _IDENTITY
    for cause in ("topic_missing", "too_large"):  # the relay's own dead letters
        dead = as_dead_letter(back, cause, "why")
        assert dead.row == as_dead_letter(event, cause, "why").row
        assert dead.row["payload"] == payload and type(dead.row["payload"]) is type(payload)


def test_the_pipe_carries_the_payload_once():
    event = prepare(_event('{"pad":"' + "x" * 1000 + '"}'), _SERIALIZER, 1 << 20)
    assert isinstance(event, OutboxEvent)
    lean = len(pickle.dumps(event.to_wire(True)))
    assert lean < len(pickle.dumps(event.to_wire())) - 1000


def test_a_payload_formats_event_keeps_its_payload_on_the_wire():
    # the value of a payload format is not the envelope: the payload crosses as before
    extras = MessageExtras("json", [("a", b"1")], 5, (), False, False, True)
    event = _event('{"a": 1}', extras=extras)
    event.encoded = b'{"a":1}'
    wire, back = _across_the_pipe(event)
    assert wire[0] == 0 and back == event and as_dead_letter(back, "too_large", "x").row["payload"] == '{"a": 1}'


def test_an_event_not_yet_encoded_keeps_its_payload_on_the_wire():
    wire, back = _across_the_pipe(_event("{}"))
    assert wire[0] == 0 and back.payload == "{}" and back.payload_from_value is None


def test_an_event_without_its_payload_needs_a_way_to_read_it_back():
    event = prepare(_event("{}"), _SERIALIZER, 1 << 20)
    assert isinstance(event, OutboxEvent)
    with pytest.raises(ValueError, match="payload_from_value"):
        OutboxEvent.from_wire(event.to_wire(True), _IDENTITY)
