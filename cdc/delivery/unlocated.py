"""Acknowledgements without an offset (docs/recovery.md, "An acknowledgement the relay
cannot locate").

librdkafka reports success with offset -1 when a retried batch is answered as already
written (the idempotent producer's duplicate sequence). The relay does not take a
delivery it cannot locate on trust: the hand-over queues it (`Unlocated`), and the loop
has it looked for here, in its partition after the last offset delivered there, by its
identity headers. Found, it is a delivery at that offset; not there, nothing of it is in
the topic and it is published again, its expectation in the window unchanged (observed
with the Kafka stand-in under broker faults). Only where an acknowledged message can be
read back: a Kafka transaction's messages cannot be before its commit, so transactional
delivery keeps librdkafka's word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cdc.delivery.inflight import InflightWindow, PendingTx
from cdc.events.identity import H_EVENT_ID, H_ROW
from cdc.events.outbox import OutboxEvent
from cdc.metrics import RelayMetrics
from cdc.ports import DeliveredLog

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


@dataclass(slots=True)
class Unlocated:
    """A message Kafka acknowledged without an offset."""

    entry: PendingTx
    event: OutboxEvent
    tx_headers: list[tuple[str, bytes]]
    topic: str
    partition: int
    size: int


class UnlocatedConfirmation:
    def __init__(self, delivered: DeliveredLog, metrics: RelayMetrics):
        self._delivered = delivered
        self._metrics = metrics

    def confirm(
        self,
        todo: list[Unlocated],
        window: InflightWindow,
        acknowledged: Callable[[PendingTx, str, int, int, int], None],
        publish_again: Callable[[PendingTx, OutboxEvent, list[tuple[str, bytes]]], None],
    ) -> None:
        """Look for each of `todo` in its partition: found, `acknowledged(entry, topic,
        partition, offset, size)`; not there, `publish_again(entry, event, tx_headers)`."""
        for u in todo:
            offset = self._locate(window, u)
            if offset is not None:
                acknowledged(u.entry, u.topic, u.partition, offset, u.size)
                continue
            self._metrics.republished_unlocated += 1
            event = u.event
            log.warning(
                "Kafka acknowledged event %s (%s row %d) without an offset and %s[%d] does not hold it: "
                "publishing it again",
                event.event_id,
                event.identity.tx.start,
                event.identity.row,
                u.topic,
                u.partition,
            )
            publish_again(u.entry, event, u.tx_headers)

    def _locate(self, window: InflightWindow, u: Unlocated) -> int | None:
        low, high = self._delivered.watermarks(u.topic, u.partition)
        start = max(low, window.offsets.get(u.topic, {}).get(u.partition, low))
        want = {k: v.decode() for k, v in u.tx_headers}
        want[H_ROW] = str(u.event.identity.row)
        want[H_EVENT_ID] = u.event.event_id
        for offset, headers in self._delivered.records(u.topic, u.partition, start, high):
            if all(headers.get(k) == v for k, v in want.items()):
                return offset
        return None
