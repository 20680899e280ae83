"""The mapping of a Kafka record onto the properties of a RabbitMQ / NATS message
(`cdc.events.sink_fields.message_properties`) and back (`spark_jobs.log_record.from_properties`):
the verifier's rows of a broker message equal the Kafka source's rows of the record the
relay would have written to Kafka. Starts nothing (the brokers' own round trip is in
tests/integration/test_sink_sources.py)."""

from __future__ import annotations

import pytest

from cdc.events.sink_fields import H_KEY, H_NULL_VALUE, H_TIMESTAMP, message_properties, partition_stream
from spark_jobs.log_record import TIMESTAMP_CREATE_TIME, from_properties
from spark_jobs.records import message_row
from tests.sink_samples import sample_records

TOPIC, DLQ = "outbox.event.order", "outbox.dlq"


def _as_broker(props: dict[str, str], as_bytes: bool) -> dict:
    """Properties as a client hands them back: rstream's AMQP decoder gives bytes names and values."""
    return {k.encode(): v.encode() for k, v in props.items()} if as_bytes else dict(props)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_broker_message_reads_back_into_the_kafka_row(as_bytes: bool) -> None:
    for offset, sample in enumerate(sample_records(TOPIC, DLQ)):
        props = message_properties(sample.key, sample.headers, sample.value)
        assert all(isinstance(v, str) for v in props.values())
        record = from_properties(
            sample.topic,
            0,
            offset,
            (TIMESTAMP_CREATE_TIME, sample.timestamp_ms),
            _as_broker(props, as_bytes),
            sample.value,
        )
        want = message_row(sample.as_kafka(0, offset), True, True, DLQ)
        assert message_row(record, True, True, DLQ) == want
        assert want["ikey"] is not None  # every sample carries the relay's identity


def test_key_null_value_and_broker_headers_are_not_headers() -> None:
    props = message_properties(b"agg-1", [("id", b"1"), ("id", b"2"), ("gone", None)], None)
    assert props == {"id": "2", H_KEY: "agg-1", H_NULL_VALUE: "true"}
    assert H_KEY not in message_properties(None, [], b"")
    record = from_properties(
        "t", 3, 9, (1, 5), {**props, "Nats-Msg-Id": "x", "Nats-Expected-Last-Sequence": "4", H_TIMESTAMP: "5"}, b""
    )
    assert (record.key(), record.value(), record.headers()) == (b"agg-1", None, [("id", b"2")])
    assert (record.topic(), record.partition(), record.offset(), record.timestamp()) == ("t", 3, 9, (1, 5))
    # an empty value is not a null one
    assert from_properties("t", 0, 0, (1, 5), message_properties(b"k", [], b""), None).value() == b""
    # AMQP booleans and numbers as header text
    assert from_properties("t", 0, 0, (1, 5), {"b": True, "n": 7}, b"").headers() == [("b", b"true"), ("n", b"7")]


def test_partition_streams_are_named_after_the_topic() -> None:
    assert [partition_stream("outbox.event.order", n) for n in (0, 11)] == [
        "outbox.event.order-0",
        "outbox.event.order-11",
    ]


@pytest.mark.verifier_deps
def test_record_columns_of_broker_records_equal_message_rows() -> None:
    from spark_jobs.records import RecordColumns

    cols = RecordColumns(True, True, DLQ)
    records = [
        from_properties(s.topic, 0, i, (1, s.timestamp_ms), message_properties(s.key, s.headers, s.value), s.value)
        for i, s in enumerate(sample_records(TOPIC, DLQ))
    ]
    for record in records:
        cols.add(record)
    got = cols.take().to_pylist()
    want = [message_row(r, True, True, DLQ) for r in records]
    for w in want:
        w["headers"] = list(w["headers"].items())
    assert got == want
