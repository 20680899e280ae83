"""The transactional publisher (connectors/kafka/sink.py) against a broker with transactions
(noida-db): a fenced producer says so as Fenced, the one line of the relay, from whichever
call meets the fence first.

Found by the zombie test (test_transactional.py) run in a loop under load: the successor B
had been fenced and stopped with a traceback, `SystemError: <method 'code' of
'confluent_kafka.cimpl.KafkaError' objects> returned a result with an exception set`, raised
by `flush`. confluent-kafka serves the fatal error first (it sets a KafkaException) and then,
in the same call, the delivery reports of the purged messages: the report callback's first
call into the library fails with that SystemError, whose cause is the KafkaException."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from cdc.delivery.kafka_transaction import Fenced
from cdc.kafka_health import KafkaHealth
from cdc.metrics import RelayMetrics
from connectors.kafka.sink import TransactionalKafkaPublisher

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize("call", ["flush", "poll"])
def test_a_fenced_producer_with_reports_queued_raises_fenced_from_flush_and_poll(noida_kafka, topic_prefix, call):
    topic, txn_id = f"{topic_prefix}.order", f"cdc-test-{uuid.uuid4().hex[:8]}"
    noida_kafka.create_topic(topic, 3)
    publisher = TransactionalKafkaPublisher(
        noida_kafka.bootstrap, txn_id, KafkaHealth(RelayMetrics(), noida_kafka.bootstrap)
    )
    newer = Producer({"bootstrap.servers": noida_kafka.bootstrap, "transactional.id": txn_id})
    try:
        publisher.init_transactions(10)
        publisher.begin_transaction()
        reports: list = []
        publisher.publish(topic, b"k0", b"before", [], reports.append)
        assert publisher.flush(10) == 0 and reports[0].failure is None
        newer.init_transactions(10)  # the successor: the broker fences `publisher`
        for i in range(20):  # to partitions not yet in the transaction: the broker refuses to add them
            publisher.publish(topic, b"k%d" % i, b"after", [], reports.append)
        # One poll serves what is ready and returns: the broker's fence can come with the next
        # call (1 in 25 probes; flush waits for the queue, so it always meets it). The relay's
        # loop polls again, so the promise is Fenced from the first call that meets the fence.
        deadline = time.monotonic() + 10
        with pytest.raises(Fenced):
            while time.monotonic() < deadline:
                getattr(publisher, call)(1)
    finally:
        publisher.purge()
        newer.purge()
        del publisher, newer  # destroyed now, not when the broker is gone (librdkafka would retry it)
