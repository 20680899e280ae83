"""What builds a run's delivery mode: the relay calls it when a run starts (cdc/relay.py
`_build`); each sink's adapters bring one (cdc_cli/sinks.py), Kafka's is `kafka.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cdc.delivery import DeliveryMode
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.metrics import RelayMetrics
from cdc.ports import CheckpointStore, Publisher
from cdc.relay_settings import RelaySettings


class DeliveryModeFactory(Protocol):
    def __call__(
        self,
        settings: RelaySettings,
        publisher: Publisher,
        store: CheckpointStore,
        ledger: Ledger,
        guard: LeaseGuard,
        metrics: RelayMetrics,
        clock: Callable[[], float],
    ) -> DeliveryMode: ...
