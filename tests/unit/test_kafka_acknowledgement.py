"""The producer adapter's account of an acknowledgement: librdkafka may acknowledge a
message without saying where it was written (a retried batch the broker had already
appended: its answer carries no offset, and confluent-kafka's `Message.offset()` is None
then). The adapter reports it as a delivery at offset -1; the relay then looks for the
message in its partition before it counts it delivered (test_unlocated_acknowledgement.py)."""

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from cdc.delivery.inflight import InflightWindow
from cdc.kafka_health import KafkaHealth
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc.position import BinlogPosition
from connectors.kafka.sink import KafkaPublisher
from fakes import TOO_LARGE, Binlog, RelayHarness, message_id, outbox_row

DLQ = "outbox.dlq"


class _Msg:
    def __init__(self, partition: int, offset: int | None):
        self._p, self._o = partition, offset

    def partition(self) -> int:
        return self._p

    def offset(self) -> int | None:
        return self._o


class _AcknowledgingProducer:
    """Acknowledges each message at once, at the offsets given (None: not said)."""

    def __init__(self, offsets: list[int | None]):
        self._offsets = offsets

    def produce(  # confluent-kafka's parameters, in its order
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        (callback or on_delivery)(None, _Msg(0, self._offsets.pop(0)))

    def poll(self, _timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        return 0


def test_an_acknowledgement_without_an_offset_is_a_delivery_at_an_unknown_offset():
    publisher = KafkaPublisher("127.0.0.1:9")
    publisher._producer = _AcknowledgingProducer([7, None])  # type: ignore[assignment]  # a fake of the client library
    deliveries = []
    publisher.publish("t", b"k", b"v", [], deliveries.append)
    publisher.publish("t", b"k", b"v", [], deliveries.append)
    assert [(d.partition, d.offset, d.failure) for d in deliveries] == [(0, 7, None), (0, -1, None)]

    window = InflightWindow(None)
    entry = window.begin(BinlogPosition("mysql-bin.000001", 100), None)
    for d in deliveries:
        InflightWindow.expect(entry)
        InflightWindow.acknowledged(entry, d.topic, d.partition, d.offset)
    entry.sealed = True
    assert window.advance()
    assert window.offsets == {"t": {0: 8}}  # the recovery scan starts after the last offset known


# The hand-over's own report (cdc.ports.ReportingPublisher): librdkafka calls it itself.


class _KeepingProducer(_AcknowledgingProducer):
    """Keeps each message's delivery callback instead of calling it."""

    def __init__(self) -> None:
        super().__init__([])
        self.callbacks: list[Any] = []

    def produce(self, topic: str, *args: Any) -> None:  # confluent-kafka's parameters, by position
        self.callbacks.append(args[3])  # callback (value, key, partition, callback, ...)


class _RefusingProducer(_AcknowledgingProducer):
    """librdkafka refuses to queue the message (too large for message.max.bytes)."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))


def test_the_report_handed_over_is_librdkafkas_delivery_callback_itself():
    publisher = KafkaPublisher("127.0.0.1:9")
    publisher._producer = producer = _KeepingProducer()  # type: ignore[assignment]  # a fake of the client library

    def report(err: Any, msg: Any) -> None:
        pass

    publisher.publish_reported("t", b"k", b"v", [], report)
    assert producer.callbacks == [report]  # no adapter between librdkafka and the hand-over


def test_while_kafka_is_unreachable_an_acknowledgement_says_it_is_back():
    metrics = RelayMetrics()
    health = KafkaHealth(metrics, "127.0.0.1:9")
    publisher = KafkaPublisher("127.0.0.1:9", health)
    publisher._producer = _AcknowledgingProducer([5])  # type: ignore[assignment]  # a fake of the client library
    health.unreachable("1/1 brokers are down", 1)
    got = []
    publisher.publish_reported("t", b"k", b"v", [], lambda err, msg: got.append((err, msg.offset())))
    assert got == [(None, 5)]
    assert metrics.kafka_reachable and not health.down


def test_a_message_librdkafka_refuses_to_queue_is_reported_at_once_and_read_as_a_failed_delivery():
    publisher = KafkaPublisher("127.0.0.1:9")
    publisher._producer = _RefusingProducer([])  # type: ignore[assignment]  # a fake of the client library
    got = []
    publisher.publish_reported("t", b"k", b"v", [], lambda err, msg: got.append(publisher.delivery("t", err, msg)))
    [d] = got
    assert (d.topic, d.partition, d.offset) == ("t", -1, -1)
    assert d.failure is not None and d.failure.too_large and d.failure.code == "MSG_SIZE_TOO_LARGE"


def test_the_hand_over_reads_a_report_as_a_delivery_only_when_it_is_not_an_acknowledgement_at_an_offset():
    b = Binlog()
    b.transaction([outbox_row("e1", "order", "k1"), outbox_row("big", "order", "k2")])
    b.transaction([outbox_row("e2", "order", "k1")])
    h = RelayHarness(b, publisher=dict(fail=lambda m: TOO_LARGE if message_id(m) == "big" and m.topic != DLQ else None))
    publisher = h.publisher
    read: list[Any] = []
    delivery = publisher.delivery

    def reading(topic: str, error: Any, message: Any) -> Delivery:
        read.append(error)
        return delivery(topic, error, message)

    publisher.delivery = reading  # type: ignore[method-assign]
    h.run()
    assert read == [TOO_LARGE]  # the two acknowledged events took no Delivery, the refused one did
    assert h.relay.metrics.events_published == 2 and h.relay.metrics.dead_lettered["too_large"] == 1
    assert h.store.current.position == b.end
