"""What a message carries on the sinks beyond Kafka, by name. The relay's RabbitMQ Streams
and NATS JetStream sinks write these and the verifier's data source for each reads them
(`spark_jobs/log_record.py`), so both sides take the names from here. The mapping as a
whole (stream names, offsets, headers) is a table in docs/sinks.md.

A Kafka record has a key, headers, a value that may be null and a timestamp; an AMQP 1.0
message in a RabbitMQ stream has application properties, a body and `properties.creation-time`,
a NATS message has headers and a payload. Every Kafka header (the identity headers of
cdc/events/identity.py, the format's headers of cdc/events/formats.py) travels under its own name as an
application property (RabbitMQ) or a NATS header; what has no field of its own travels
under the names below.
"""

from __future__ import annotations

# The record key (the aggregate id): an application property / a NATS header. Absent: a null key.
H_KEY = "cdc.key"
# Present (value "true") on a message whose Kafka value would be null (a tombstone): an AMQP
# body and a NATS payload cannot tell an empty value from none.
H_NULL_VALUE = "cdc.value.null"
# NATS only: the record timestamp (milliseconds since the epoch, decimal text); NATS has no
# producer timestamp. RabbitMQ carries it in the AMQP properties' creation-time.
H_TIMESTAMP = "cdc.timestamp"
# Names a sink writes for the broker itself, not Kafka headers: the verifier leaves them out
# of its `headers` column (JetStream's `Nats-Msg-Id`, `Nats-Expected-Last-Sequence`, ...).
BROKER_HEADER_PREFIXES = ("Nats-",)

# RabbitMQ 3.10 has no super streams: a topic partitioned by key is several streams, the one
# of partition n named `<topic>-<n>`; an unpartitioned topic is one stream named as the topic.
PARTITION_SEPARATOR = "-"


def partition_stream(topic: str, partition: int) -> str:
    """The RabbitMQ stream that holds partition `partition` of a partitioned `topic`."""
    return f"{topic}{PARTITION_SEPARATOR}{partition}"


def message_properties(
    key: bytes | None, headers: list[tuple[str, bytes | None]] | None, value: bytes | None
) -> dict[str, str]:
    """What a Kafka record's key, headers and null value become on these brokers: one map of
    text (AMQP application properties, NATS headers). A repeated header keeps its last value
    and a null header is left out, as the verifier's reading of Kafka headers does
    (`cdc.events.identity.header_dict`); the key is `cdc.key`, a null value `cdc.value.null`."""
    out = {
        name: text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        for name, text in headers or ()
        if text is not None
    }
    if key is not None:
        out[H_KEY] = key.decode("utf-8", "replace")
    if value is None:
        out[H_NULL_VALUE] = "true"
    return out
