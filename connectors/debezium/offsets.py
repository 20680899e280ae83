"""Reads a Debezium connector's stored offset: from Kafka Connect's offsets topic, or from
a FileOffsetBackingStore file (Debezium Server, the embedded engine, a standalone worker).

The offsets topic is compacted, keyed by the connector's partition
(`["<name>",{"server":"<topic.prefix>"}]`, JSON), the value the offset JSON (null: deleted);
a key always lands in one partition, so the last record of a key there is its offset.
"""

from __future__ import annotations

import os

from cdc.adoption import DebeziumOffset, offset_key_matches, pick_offset
from cdc.errors import ConfigError
from cdc.kafka_client import KafkaClientConfig
from connectors.debezium.java_offset_file import read_offset_file
from connectors.kafka.reader import KafkaTopicReader


def offset_from_file(path: str | os.PathLike[str], connector: str, server: str | None) -> DebeziumOffset:
    entries = read_offset_file(path)
    return pick_offset(entries, connector, server, f"the offset file {os.fspath(path)}")


def offset_from_topic(
    clients: KafkaClientConfig | str, topic: str, connector: str, server: str | None
) -> DebeziumOffset:
    """The connector's newest offset in the Connect worker's offsets topic, read with the
    relay's Kafka client settings (`[kafka.client]`: the topic is on the same cluster)."""
    clients = KafkaClientConfig.of(clients)
    bootstrap = clients.bootstrap
    reader = KafkaTopicReader(clients)
    try:
        count = reader.partition_count(topic)
        if count is None:
            raise ConfigError(
                f"the Kafka Connect offsets topic {topic!r} does not exist on {bootstrap}: give the "
                "worker's offset.storage.topic (e.g. connect-offsets)"
            )
        entries: dict[bytes | None, bytes | None] = {}
        for partition in range(count):
            low, high = reader.watermarks(topic, partition)
            for msg in reader.messages(topic, partition, low, high):
                key = msg.key()
                if offset_key_matches(key, connector, server):
                    entries.pop(key, None)  # the newest record of a key last (pick_offset takes the last)
                    entries[key] = msg.value()
        return pick_offset(entries, connector, server, f"the offsets topic {topic!r}")
    finally:
        reader.close()
