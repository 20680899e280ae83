"""One record of a broker's log (a RabbitMQ stream, a JetStream stream) in the shape the Kafka
source's decoding reads: the methods of a confluent-kafka `Message` (`topic()`,
`partition()`, `offset()`, `timestamp()`, `key()`, `headers()`, `value()`). The sources of
the other brokers build these and hand them to `records.RecordColumns`, so every sink
is decoded by the same code into the same columns, and the reconciliation reads them all
alike.

The names a sink writes for what a Kafka record has and a broker message has not (the
key, a null value, NATS's timestamp) are `cdc.events.sink_fields`; `from_properties` takes them
out of the properties/headers into the record's own fields, as a Kafka record holds them.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdc.events.sink_fields import BROKER_HEADER_PREFIXES, H_KEY, H_NULL_VALUE, H_TIMESTAMP

# confluent-kafka's timestamp types (librdkafka's rd_kafka_timestamp_type_t)
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2


class LogRecord:
    """A broker's message as a confluent-kafka `Message` shows a Kafka record."""

    __slots__ = ("_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: tuple[int, int],
        key: bytes | None,
        headers: list[tuple[str, bytes]],
        value: bytes | None,
    ) -> None:
        self._topic, self._partition, self._offset, self._timestamp = topic, partition, offset, timestamp
        self._key, self._headers, self._value = key, headers, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch), as confluent-kafka's."""
        return self._timestamp

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes | None:
        return self._value

    def __repr__(self) -> str:
        return f"LogRecord({self._topic!r}[{self._partition}]@{self._offset})"


def _text(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):  # an AMQP boolean property: Kafka header text is true/false
        return b"true" if value else b"false"
    return str(value).encode("utf-8")


def from_properties(
    topic: str,
    partition: int,
    offset: int,
    timestamp: tuple[int, int],
    properties: Mapping[str | bytes, object] | None,
    body: bytes | None,
) -> LogRecord:
    """A record from a broker message's properties (AMQP application properties, NATS
    headers) and body: `cdc.key` is the key, `cdc.value.null` makes the value null, the
    broker's own headers (`Nats-*`) and `cdc.timestamp` (the caller's timestamp) are left out, every other property is a header (UTF-8
    text) under its own name; a null property is no header (as a null Kafka header is not in
    the Kafka source's `headers` map)."""
    key: bytes | None = None
    null_value = False
    headers: list[tuple[str, bytes]] = []
    for raw_name, raw_value in (properties or {}).items():
        name = raw_name.decode("utf-8", "replace") if isinstance(raw_name, bytes) else str(raw_name)
        value = _text(raw_value)
        if name == H_KEY:
            key = value
        elif name == H_NULL_VALUE:
            null_value = True
        elif name == H_TIMESTAMP:
            continue  # the record's timestamp: the source has read it
        elif value is not None and not name.startswith(BROKER_HEADER_PREFIXES):
            headers.append((name, value))
    return LogRecord(topic, partition, offset, timestamp, key, headers, None if null_value else (body or b""))
