"""The envelope's hand-written Avro body (connectors/schema_registry/avro_serializer.py, `_envelope_body`)
is byte for byte what fastavro writes for the same event, and leaves every event outside
the shapes it knows to fastavro, which then behaves as it always did."""

from __future__ import annotations

import io
import subprocess
import sys

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import OutboxEvent
from cdc.position import BinlogPosition
from connectors.schema_registry.avro_schemas import OUTBOX_EVENT, schema
from connectors.schema_registry.avro_serializer import (
    ConfluentAvroSerializer,
    _envelope_body,
    _varint,
    _zigzag,
    decode,
    registry_client,
)

_PARSED = fastavro.parse_schema(schema(OUTBOX_EVENT))
_IDENTITY = EventIdentity(TxIdentity("s", BinlogPosition("mysql-bin.000001", 4), None, 1, 0), 0)
_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)  # no lone surrogates: they are not UTF-8
_LONG = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def _event(event_id, aggregate_type, aggregate_id, event_type, payload, timestamp_us) -> OutboxEvent:
    return OutboxEvent(
        event_id, aggregate_type, aggregate_id, event_type, payload, timestamp_us, "t", "db.outbox", _IDENTITY
    )


def _fastavro(event: OutboxEvent) -> bytes:
    out = io.BytesIO()
    record = {
        "id": event.event_id,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "type": event.event_type,
        "payload": event.payload,
        "timestamp": event.timestamp_us,
    }
    fastavro.schemaless_writer(out, _PARSED, record)
    return out.getvalue()


@settings(max_examples=400, deadline=None)
@given(
    _TEXT,
    _TEXT,
    _TEXT,
    _TEXT,
    st.one_of(st.none(), _TEXT, st.text(max_size=5000), st.binary(max_size=5000)),
    st.one_of(st.none(), _LONG, st.sampled_from([0, -1, 63, 64, -64, -65, (1 << 63) - 1, -(1 << 63)])),
)
def test_the_body_is_what_fastavro_writes(event_id, aggregate_type, aggregate_id, event_type, payload, timestamp):
    event = _event(event_id, aggregate_type, aggregate_id, event_type, payload, timestamp)
    assert _envelope_body(event) == _fastavro(event)


@pytest.mark.parametrize("length", [0, 1, 63, 64, 127, 128, 2047, 2048, 2049, 16383, 16384, 70000])
def test_every_length_prefix_is_what_fastavro_writes(length):
    for payload in ("a" * length, b"\x00" * length):
        event = _event("id", "order", "order-1", "Created", payload, None)
        assert _envelope_body(event) == _fastavro(event)


@pytest.mark.parametrize("length", [0, 63, 64, 2047, 2048, 70000])
def test_the_kept_aggregate_and_event_types_are_what_fastavro_writes(length, monkeypatch: pytest.MonkeyPatch):
    """The aggregate type's and event type's encoded strings are kept per text
    (`_TEXT_FIELDS`): the first event and the next, and past the limit of kept texts."""
    from connectors.schema_registry import avro_serializer

    event = _event("id", "t" * length, "order-1", "é" * length, "{}", None)
    assert _envelope_body(event) == _envelope_body(event) == _fastavro(event)
    monkeypatch.setattr(avro_serializer, "_TEXT_FIELDS", {})
    monkeypatch.setattr(avro_serializer, "_TEXT_FIELDS_LIMIT", 1)
    other = _event("id", "order", "order-1", "x" * length, "{}", 5)
    assert _envelope_body(other) == _envelope_body(other) == _fastavro(other)
    assert list(avro_serializer._TEXT_FIELDS) == ["order"]


class _Text(str):
    pass


@pytest.mark.parametrize(
    "fields",
    [
        ("id", "order", _Text("order-1"), "Created", "{}", None),  # a str subclass
        ("id", "order", "order-1", "Created", bytearray(b"{}"), None),  # not str / bytes
        ("id", "order", "order-1", "Created", "{}", True),  # a bool is not a timestamp here
        ("id", "order", "order-1", "Created", "{}", 1 << 63),  # past Avro's long
    ],
)
def test_other_shapes_are_left_to_fastavro(fields):
    assert _envelope_body(_event(*fields)) is None


def test_the_serializer_writes_the_wire_format_either_way():
    serializer = ConfluentAvroSerializer(registry_client("mock://test-avro-envelope"))
    fast = _event("e1", "order", "order-1", "Created", '{"a":1}', 1_700_000_000_000_000)
    slow = _event("e1", "order", _Text("order-1"), "Created", '{"a":1}', 1_700_000_000_000_000)
    assert serializer.encode(fast, "orders") == serializer.encode(slow, "orders")
    schema_id, record = decode(serializer.encode(fast, "orders"))
    assert schema_id == serializer.schema_id("orders")
    assert {k: v for k, v in record.items() if k != "timestamp"} == {
        "id": "e1",
        "aggregate_type": "order",
        "aggregate_id": "order-1",
        "type": "Created",
        "payload": '{"a":1}',
    }
    assert record["timestamp"] is not None
    with pytest.raises((ValueError, TypeError, OverflowError)):  # fastavro's refusal, as before
        serializer.encode(_event("e1", "order", "order-1", "Created", "{}", 1 << 64), "orders")


@pytest.mark.parametrize("bits", range(0, 65))
def test_the_timestamps_varint_is_the_loops_at_every_group_boundary(bits):
    # _varint spreads the groups without a loop below 2**56 and hands larger values to
    # _zigzag's loop: both sides of each 7-bit group boundary, and of 2**56
    for n in {(1 << bits) - 1, 1 << bits, (1 << bits) + 1}:
        if n < 1 << 64:
            assert _varint(n) == _zigzag(n, zigzagged=True)


def test_the_envelope_is_encoded_without_importing_fastavro():
    # the reader process imports the serializer on its way to its first event; fastavro is
    # imported for the events the hand-written body leaves to it (the test above), not before
    code = (
        "import sys\n"
        "from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client\n"
        "from cdc.events.outbox import OutboxEvent\n"
        "s = ConfluentAvroSerializer(registry_client('mock://test-avro-lazy'))\n"
        "e = OutboxEvent('e1', 'order', 'order-1', 'Created', '{}', 1, 't', 'db.outbox', None)\n"
        "assert s.encode(e, 'orders')\n"
        "print('fastavro' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
