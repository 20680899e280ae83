"""Kafka records as the relay writes them (identity headers of cdc/events/identity.py, the event's
headers, a payload format's headers, the envelope's Confluent-wire Avro value), for the
tests of the sinks beyond Kafka: the same records written to RabbitMQ and JetStream must
read back into the Kafka source's rows."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cdc.events import identity as hdr
from cdc.events.formats import H_FORMAT
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import OutboxEvent
from cdc.position import BinlogPosition

TS = 1_700_000_000_000


@dataclass
class SampleRecord:
    topic: str
    key: bytes | None
    headers: list[tuple[str, bytes | None]]
    value: bytes | None
    timestamp_ms: int

    def as_kafka(self, partition: int, offset: int) -> KafkaMsg:
        return KafkaMsg(self.topic, partition, offset, self.key, self.value, self.headers, (1, self.timestamp_ms))


class KafkaMsg:
    """The confluent-kafka Message methods the Kafka source's decoding calls."""

    def __init__(self, topic, partition, offset, key, value, headers, ts):  # type: ignore[no-untyped-def]
        self._t, self._p, self._o, self._k, self._v, self._h, self._ts = (
            topic, partition, offset, key, value, headers, ts,
        )  # fmt: skip

    def topic(self):  # type: ignore[no-untyped-def]
        return self._t

    def partition(self):  # type: ignore[no-untyped-def]
        return self._p

    def offset(self):  # type: ignore[no-untyped-def]
        return self._o

    def key(self):  # type: ignore[no-untyped-def]
        return self._k

    def value(self):  # type: ignore[no-untyped-def]
        return self._v

    def headers(self):  # type: ignore[no-untyped-def]
        return self._h

    def timestamp(self):  # type: ignore[no-untyped-def]
        return self._ts


def _event_headers(identity: EventIdentity, event_id: str, event_type: str) -> list[tuple[str, bytes | None]]:
    # the order the relay writes them (cdc/relay.py `_publish_event`)
    return [
        *identity.tx.headers(),
        (hdr.H_ROW, str(identity.row).encode()),
        (hdr.H_EVENT_ID, event_id.encode()),
        (hdr.H_EVENT_TYPE, event_type.encode()),
        (hdr.H_TABLE, b"shop.outbox"),
    ]


def sample_records(topic: str, dlq_topic: str) -> list[SampleRecord]:
    """Envelope (Avro, text and binary payloads, NULL payload), a payload format with its
    extra headers, a tombstone, a null key, an XA transaction's event, a repair and a dead
    letter; GTID and file/pos identities."""
    from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client

    serializer = ConfluentAvroSerializer(registry_client("mock://sink-samples"))
    gtid_tx = TxIdentity("src", BinlogPosition("mysql-bin.000003", 900), "0-1-17", 1, TS)
    pos_tx = TxIdentity("src", BinlogPosition("mysql-bin.000004", 4), None, 1, TS + 5)
    xa_tx = TxIdentity(
        "src", BinlogPosition("mysql-bin.000004", 777), None, 1, TS + 9, BinlogPosition("mysql-bin.000004", 500)
    )

    def envelope(row: int, tx: TxIdentity, payload: str | bytes | None, aggregate_id: str = "o1") -> SampleRecord:
        identity = EventIdentity(tx, row)
        event = OutboxEvent(f"e{row}-{tx.start.pos}", "order", aggregate_id, "created", payload, 123_456,
                            topic, "shop.outbox", identity)  # fmt: skip
        value = serializer.encode(event, topic)
        return SampleRecord(
            topic, aggregate_id.encode(), _event_headers(identity, event.event_id, "created"), value, TS + row
        )

    out = [
        envelope(0, gtid_tx, '{"total": 12.5, "name": "h\u00e9"}'),
        envelope(1, gtid_tx, b"\x00\xff binary"),
        envelope(2, gtid_tx, None, aggregate_id="o2"),
        envelope(0, pos_tx, "file/pos identity"),
        envelope(0, xa_tx, "xa event"),
    ]
    # a payload format (`format = "json"`): the value is the payload, the format's headers
    # (additional placement, trace context; a NULL column is a null header) follow
    formatted = _event_headers(EventIdentity(pos_tx, 1), "e-json", "shipped") + [
        (H_FORMAT, b"json"), ("eventType", b"shipped"), ("traceparent", b"00-abc-def-01"), ("empty", None),
    ]  # fmt: skip
    out.append(SampleRecord(topic, b"o3", formatted, b'{"n":0}', TS + 42))
    tombstone = _event_headers(EventIdentity(pos_tx, 2), "e-tomb", "deleted") + [(H_FORMAT, b"string")]
    out.append(SampleRecord(topic, b"o3", tombstone, None, TS + 43))
    no_key = _event_headers(EventIdentity(pos_tx, 3), "e-nokey", "created") + [
        (H_FORMAT, b"string"),
        (hdr.H_REPAIR, b"1"),
    ]
    out.append(SampleRecord(topic, None, no_key, b"", TS + 44))
    dead = _event_headers(EventIdentity(pos_tx, 4), "e-dlq", "created") + [
        (hdr.H_DLQ_CAUSE, b"too_large"), (hdr.H_DLQ_ERROR, b"message of 2000000 bytes"), (hdr.H_DLQ_TOPIC, topic.encode()),
    ]  # fmt: skip
    out.append(
        SampleRecord(dlq_topic, b"o4", dead, json.dumps({"id": "e-dlq", "cause": "too_large"}).encode(), TS + 45)
    )
    return out
