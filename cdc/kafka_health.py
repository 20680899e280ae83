"""Is Kafka reachable? The relay's own account of it: one line when every broker became
unreachable (with what is waiting), one when Kafka answers again (with how long it was
gone), and the state in the metrics (`cdc_kafka_reachable`, `cdc_kafka_brokers_up`).

The producer adapter reports what librdkafka tells it: "all brokers down" (its error
callback), a delivery acknowledged or brokers seen up (its statistics)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc.metrics import RelayMetrics

log = logging.getLogger(__name__)


class KafkaHealth:
    def __init__(self, metrics: RelayMetrics, bootstrap: str, clock: Callable[[], float] = time.time):
        self._m = metrics
        self._bootstrap = bootstrap
        self._clock = clock
        self.down = False  # a plain attribute: the producer's acknowledgement path reads it

    def unreachable(self, reason: str, waiting: int) -> None:
        m = self._m
        if not m.kafka_reachable:
            return
        m.kafka_reachable, self.down = False, True
        m.kafka_unreachable_since = self._clock()
        m.kafka_outages += 1
        log.error(
            "Kafka unreachable: no broker of %s (kafka.bootstrap) answers (%s); %d message(s) wait for an "
            "acknowledgement, nothing is lost: the relay retries and publishes them when Kafka is back",
            self._bootstrap,
            reason,
            waiting,
        )

    def reachable(self) -> None:
        m = self._m
        if m.kafka_reachable:
            return
        m.kafka_reachable, self.down = True, False
        gone = self._clock() - m.kafka_unreachable_since
        m.kafka_unreachable_since = 0.0
        log.warning("Kafka reachable again after %.1f s (%s)", gone, self._bootstrap)

    def brokers_up(self, count: int) -> None:
        self._m.kafka_brokers_up = count
        if count > 0:
            self.reachable()
