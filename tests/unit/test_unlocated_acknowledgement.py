"""An acknowledgement without an offset is not taken on trust (cdc/delivery/unlocated.py,
called from the hand-over): librdkafka reports a retried batch the broker answered as already
written as a success with no offset; the Kafka stand-in was seen to give that answer for a
message it never stored (tests/integration/test_faults.py::test_broker_faults under load lost
one event in two runs of four before this). The relay looks for each such message in its
partition: there, it is delivered at the offset found; not there, it is published again."""

import pytest

from cdc.ports import Delivery
from fakes import (
    Binlog,
    FakePublisher,
    RelayHarness,
    ReportsLikeKafka,
    delivered_events,
    expected_events,
    message_id,
    outbox_row,
)


class _Unlocating(FakePublisher):
    """Acknowledges the first copy of the chosen messages without an offset; `store` says
    whether the broker really wrote it."""

    def __init__(self, kafka, chosen: set[str], store: bool):
        super().__init__(kafka)
        self.chosen, self.store, self.answered = set(chosen), store, []

    def _transmit(self, limit):
        count = len(self.queue) if limit is None else min(limit, len(self.queue))
        for _ in range(count):
            msg = self.queue.pop(0)
            event = message_id(msg)
            if event in self.chosen:
                self.chosen.discard(event)
                if self.store:
                    self.kafka.append(msg.topic, msg.partition, msg.key, msg.value, msg.headers)
                self.answered.append(event)
                msg.on_delivery(Delivery(msg.topic, msg.partition, -1))
                continue
            msg.record = self.kafka.append(msg.topic, msg.partition, msg.key, msg.value, msg.headers)
            self.unacked.append(msg)


class _KafkaShapedUnlocating(ReportsLikeKafka, _Unlocating):
    """The same, with the hand-over's report called as librdkafka calls it (offset None)."""


# Both ways an acknowledgement reaches the hand-over: the port's Delivery (the other
# sinks) and the Kafka publisher's own report (cdc.ports.ReportingPublisher).
both_shapes = pytest.mark.parametrize("shape", [_Unlocating, _KafkaShapedUnlocating], ids=["port", "kafka_report"])


def _run(store: bool, shape: type[_Unlocating]):
    b = Binlog()
    for n in range(6):
        b.transaction([outbox_row(f"e{n}a", "order", f"k{n % 2}"), outbox_row(f"e{n}b", "order", f"k{n % 2}")])
    h = RelayHarness(b)
    h.publisher = shape(h.kafka, {"e1a", "e4b"}, store)
    h.relay._publisher = h.publisher
    h.run()
    return b, h


@both_shapes
def test_a_message_acknowledged_without_an_offset_and_not_written_is_published_again(shape):
    b, h = _run(store=False, shape=shape)
    assert sorted(h.publisher.answered) == ["e1a", "e4b"]
    assert sorted(delivered_events(h.kafka)) == sorted(expected_events(b))  # every event once
    assert h.relay.metrics.republished_unlocated == 2
    assert h.store.current.position == b.end


@both_shapes
def test_a_message_acknowledged_without_an_offset_and_written_is_found_and_not_sent_again(shape):
    b, h = _run(store=True, shape=shape)
    assert sorted(h.publisher.answered) == ["e1a", "e4b"]
    assert sorted(delivered_events(h.kafka)) == sorted(expected_events(b))
    assert h.relay.metrics.republished_unlocated == 0
    assert h.store.current.position == b.end
