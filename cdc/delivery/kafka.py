"""Kafka's delivery modes, chosen by `kafka.delivery`: the relay's default
`DeliveryModeFactory` (other sinks bring their own, cdc_cli/sinks.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from cdc.delivery import DeliveryMode
from cdc.delivery.idempotent import IdempotentDelivery
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.delivery.transactional import TransactionalDelivery
from cdc.metrics import RelayMetrics
from cdc.ports import CheckpointStore, Publisher, TransactionalPublisher
from cdc.relay_settings import RelaySettings


def kafka_delivery(
    settings: RelaySettings,
    publisher: Publisher,
    store: CheckpointStore,
    ledger: Ledger,
    guard: LeaseGuard,
    metrics: RelayMetrics,
    clock: Callable[[], float],
) -> DeliveryMode:
    """idempotent (the default) or transactional."""
    if settings.delivery == "transactional":
        txn_publisher = cast(TransactionalPublisher, publisher)  # the CLI builds one for this mode
        return TransactionalDelivery(settings, txn_publisher, store, ledger, guard, metrics, clock)
    return IdempotentDelivery(settings, publisher, store, ledger, guard, clock)
