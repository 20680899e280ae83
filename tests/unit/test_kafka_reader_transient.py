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
    `watermarks` (the last one again and again); `stale`: the first client made answers
    "Unknown partition" to every call, as a client whose metadata stays stale."""

    watermarks: list[Any] = []
    calls = 0
    made = 0
    closed = 0
    stale = False

    def __init__(self, conf: dict[str, Any]) -> None:
        type(self).made += 1
        self.number = self.made

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        type(self).calls += 1
        if self.stale and self.number == 1:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        answer = self.watermarks.pop(0) if len(self.watermarks) > 1 else self.watermarks[0]
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return answer

    def close(self) -> None:
        type(self).closed += 1


@pytest.fixture
def consumer(monkeypatch):
    monkeypatch.setattr(reader_module, "Consumer", _Consumer)
    _Consumer.watermarks, _Consumer.calls, _Consumer.made, _Consumer.closed, _Consumer.stale = [], 0, 0, 0, False
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


def test_a_client_whose_metadata_stays_stale_gives_way_to_a_new_one(consumer):
    """A fresh-clone run: the relay's reader answered "Unknown partition" for its whole 10 s
    after a broker fault, asked again on the same client. The tries after the first are made
    on a new client (closed after), the reader's own one kept."""
    consumer.stale, consumer.watermarks = True, [(3, 9)]
    reader = KafkaTopicReader("127.0.0.1:9", timeout_s=5.0)
    assert reader.watermarks("t", 2) == (3, 9)
    assert (consumer.made, consumer.closed) == (2, 1)
    assert reader.watermarks("t", 2) == (3, 9) and consumer.made == 3  # the stale one is still the reader's
