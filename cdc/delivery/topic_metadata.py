"""What the relay asks Kafka about its topics (partition counts, end offsets), asked again
while Kafka does not answer.

The loop cannot go on without these answers (a topic is named in a checkpoint with its
end offsets before its first message, cdc/delivery/ledger.py; a missing topic is
dead-lettered, cdc/delivery/missing_topics.py), but Kafka being away for a while is no reason to
die: the question is asked again, serving acknowledgements and keeping the lease
checked, for up to `relay.reconnect_timeout_s`, then the relay gives up (DeliveryError:
exit 1). `kafka_waiting_since` tells the health endpoint while it waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdc.delivery.lease_guard import LeaseGuard
from cdc.errors import DeliveryError
from cdc.metrics import RelayMetrics
from cdc.ports import DeliveredLog, Publisher

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


class TopicMetadata:
    def __init__(
        self,
        delivered: DeliveredLog,
        publisher: Publisher,
        guard: LeaseGuard,
        metrics: RelayMetrics,
        clock: Callable[[], float],
        reconnect_timeout_s: float,
    ):
        self._delivered = delivered
        self._publisher = publisher
        self._guard = guard
        self._metrics = metrics
        self._clock = clock
        self._timeout = reconnect_timeout_s

    def partition_count(self, topic: str) -> int | None:
        """None when the topic does not exist."""
        return self.ask(f"read the partitions of {topic}", lambda: self._delivered.partition_count(topic))

    def end_offsets(self, topic: str, count: int) -> dict[int, int]:
        return self.ask(
            f"read the end offsets of {topic}",
            lambda: {p: self._delivered.watermarks(topic, p)[1] for p in range(count)},
        )

    def ask(self, what: str, ask: Callable[[], Any]) -> Any:
        """A metadata question to Kafka that the loop cannot go on without: while Kafka
        does not answer, ask again (serving acknowledgements, keeping the lease checked)
        for up to `reconnect_timeout_s`, then give up (DeliveryError: exit 1)."""
        try:
            return ask()
        except DeliveryError as exc:
            first = exc
        metrics = self._metrics
        metrics.kafka_waiting_since = self._clock()
        log.warning(
            "cannot %s (%s); waiting for Kafka (up to %.0f s, relay.reconnect_timeout_s)",
            what,
            first,
            self._timeout,
        )
        deadline = self._clock() + self._timeout
        try:
            while True:
                self._publisher.poll(1.0)
                self._guard.check()
                try:
                    answer = ask()
                except DeliveryError:
                    if self._clock() >= deadline:
                        raise
                    continue
                log.info("Kafka answered: %s done after %.1f s", what, self._clock() - metrics.kafka_waiting_since)
                return answer
        finally:
            metrics.kafka_waiting_since = 0.0
