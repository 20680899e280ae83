"""The producer adapter's account of an acknowledgement: librdkafka may acknowledge a
message without saying where it was written (a retried batch the broker had already
appended: its answer carries no offset, and confluent-kafka's `Message.offset()` is None
then). The adapter reports it as a delivery at offset -1; the relay then looks for the
message in its partition before it counts it delivered (test_unlocated_acknowledgement.py)."""

from typing import Any

from cdc.inflight import InflightWindow
from cdc.position import BinlogPosition
from connectors.kafka_sink import KafkaPublisher


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
