"""Reads back what Kafka topics hold (implements cdc.ports.DeliveredLog).

Recovery, the checkpoint store and `cdc locate` read partitions through this: a plain
consumer with manual assignment, no group offsets committed, `read_committed` so a
transactional producer's aborted records (if any writer uses them) are never taken as
delivered. Offsets with no record (transaction markers, compaction) are simply skipped.
Its consumer and its metadata client carry `[kafka.client]` (and the consumer
`[kafka.consumer]`), like every Kafka client of the project (cdc/kafka_client.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc.errors import DeliveryError
from cdc.events.identity import header_dict
from cdc.kafka_client import KafkaClientConfig, redact
from connectors.kafka.client_log import client_logging

# What reading back needs, whatever [kafka.consumer] says: no group offsets, no topic
# created by reading, and never a record of an aborted transaction taken as delivered.
READER_ENFORCED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "allow.auto.create.topics": False,
}

# What librdkafka answers while a broker is down or its leadership moves: asked again (every
# `_AGAIN_S`) until the reader's timeout, not taken for an answer about the partition.
_TRANSIENT = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,  # its metadata does not know the partition's leader yet
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
    }
)
_AGAIN_S = 0.2


def reader_settings(clients: KafkaClientConfig | str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reader's consumer configuration: its defaults < [kafka.client] < [kafka.consumer]
    < READER_ENFORCED and `options` (what this use of the reader needs)."""
    defaults = {"group.id": f"cdc-reader-{uuid.uuid4().hex[:12]}", "auto.offset.reset": "earliest"}
    return KafkaClientConfig.of(clients).conf("consumer", defaults, {**READER_ENFORCED, **(options or {})})


class KafkaTopicReader:
    def __init__(
        self, clients: KafkaClientConfig | str, options: dict[str, Any] | None = None, timeout_s: float = 10.0
    ):
        clients = KafkaClientConfig.of(clients)
        self._timeout = timeout_s
        self._conf = {**reader_settings(clients, options), **client_logging()}
        self._bootstrap = clients.bootstrap
        self._secrets = clients
        self._admin = AdminClient({**clients.conf("admin"), **client_logging()})
        self._consumer: Consumer | None = None

    def _consumer_(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._conf)
        return self._consumer

    def partition_count(self, topic: str) -> int | None:
        try:
            meta = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise DeliveryError(
                f"cannot read Kafka metadata from {self._bootstrap} (kafka.bootstrap) within "
                f"{self._timeout:g} s: {redact(exc.args[0].str(), self._secrets)}: check the address, "
                "that the brokers run and the security settings ([kafka.client])"
            ) from exc
        info = meta.topics.get(topic)
        if info is None or (info.error is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        return len(info.partitions)

    def topics(self) -> list[str]:
        return sorted(self._admin.list_topics(timeout=self._timeout).topics)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's low and high watermarks. A transient answer (`_TRANSIENT`: right after
        a broker comes back, librdkafka may not know the partition's leader yet and answers at
        once) is asked again, on a new client, until the reader's timeout; then, or at any other
        error, a DeliveryError in one line."""
        consumer, tp = self._consumer_(), TopicPartition(topic, partition)
        deadline = time.monotonic() + self._timeout
        fresh: Consumer | None = None
        try:
            while True:
                try:
                    low, high = consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()))
                except KafkaException as exc:
                    error = exc.args[0]
                    left = deadline - time.monotonic()
                    if error.code() in _TRANSIENT and left > 0:
                        time.sleep(min(_AGAIN_S, left))
                        if fresh is None:
                            # the long-lived client's metadata can stay stale past a broker's
                            # return ("Unknown partition" for the whole timeout, a fresh-clone
                            # run of the fault suite): the next tries on a new client, which
                            # reads the metadata afresh
                            fresh = consumer = Consumer(self._conf)
                        continue
                    raise DeliveryError(f"cannot read offsets of {topic}[{partition}]: {error.str()}") from exc
                return int(low), int(high)
        finally:
            if fresh is not None:
                fresh.close()

    def messages(self, topic: str, partition: int, start: int, end: int) -> Iterator[Any]:
        """The records held in [start, end) of one partition, in offset order."""
        if end <= start:
            return
        consumer = self._consumer_()
        consumer.assign([TopicPartition(topic, partition, start if start >= 0 else OFFSET_BEGINNING)])
        next_offset = max(start, 0)
        waited = 0.0
        try:
            while next_offset < end:
                # Ask for no more than the range has left: consume() otherwise waits out
                # its whole timeout for messages that will never come (recovery reads
                # every partition at start; a second per partition adds up).
                batch = consumer.consume(num_messages=max(1, min(5000, end - next_offset)), timeout=0.5)
                if not batch:
                    # The rest of the range may hold offsets with no record (transaction
                    # markers, compaction): done when the consumer stands at the end.
                    _low, high = self.watermarks(topic, partition)
                    position = consumer.position([TopicPartition(topic, partition)])[0].offset
                    waited += 0.5
                    if position >= min(end, high) or waited >= self._timeout:
                        return
                    continue
                waited = 0.0
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            return
                        raise DeliveryError(f"reading {topic}[{partition}] failed: {err.str()}")
                    offset = msg.offset()
                    if offset is None or offset >= end:  # a consumed message always has one
                        return
                    next_offset = offset + 1
                    yield msg
        finally:
            consumer.unassign()

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        for msg in self.messages(topic, partition, start, end):
            yield msg.offset(), header_dict(msg.headers())

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
