"""The Kafka reader rides out a moment in which librdkafka cannot answer for a partition: right
after a broker comes back its metadata may not know the partition's leader yet, and
`get_watermark_offsets` answers at once with "Local: Unknown partition" instead of waiting.
The relay asks the watermarks when Kafka acknowledged a message without an offset
(cdc/delivery/unlocated.py), which happens after broker faults: a reader that gave up at
once stopped a running relay there (a fresh-clone run of
tests/integration/test_faults.py::test_broker_faults). A transient answer is asked again
until the reader's own timeout; anything else still fails at once, in one line."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import connectors.kafka.reader as reader_module
from cdc.errors import DeliveryError
from connectors.kafka.reader import KafkaTopicReader


class _Consumer:
    """confluent-kafka's Consumer as `watermarks` uses it: each call answers the next of
    `watermarks` (the last one again and again)."""

    watermarks: list[Any] = []
    calls = 0

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        type(self).calls += 1
        answer = self.watermarks.pop(0) if len(self.watermarks) > 1 else self.watermarks[0]
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return answer


@pytest.fixture
def consumer(monkeypatch):
    monkeypatch.setattr(reader_module, "Consumer", _Consumer)
    _Consumer.watermarks, _Consumer.calls = [], 0
    return _Consumer


def test_an_unknown_partition_for_a_moment_is_asked_again(consumer):
    consumer.watermarks = [KafkaError(KafkaError._UNKNOWN_PARTITION), KafkaError(KafkaError._TRANSPORT), (3, 9)]
    reader = KafkaTopicReader("127.0.0.1:9", timeout_s=5.0)
    assert reader.watermarks("t", 2) == (3, 9)
    assert consumer.calls == 3


def test_a_partition_unknown_past_the_readers_timeout_fails_in_one_line(consumer):
    consumer.watermarks = [KafkaError(KafkaError._UNKNOWN_PARTITION)]
    reader = KafkaTopicReader("127.0.0.1:9", timeout_s=0.6)
    t0 = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        reader.watermarks("t", 2)
    assert 0.6 <= time.monotonic() - t0 < 3.0 and consumer.calls >= 2
    assert str(info.value) == "cannot read offsets of t[2]: Local: Unknown partition"


def test_an_error_that_is_not_transient_fails_at_once(consumer):
    consumer.watermarks = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    reader = KafkaTopicReader("127.0.0.1:9", timeout_s=5.0)
    with pytest.raises(DeliveryError, match=r"^cannot read offsets of t\[0\]: "):
        reader.watermarks("t", 0)
    assert consumer.calls == 1
