"""Idempotent delivery (`kafka.delivery = "idempotent"`, the default; docs/DESIGN.md,
promises 3 and 4).

The producer is idempotent (acks=all), so retries never reorder or repeat a message
within a partition. A message is delivered when Kafka acknowledges it; the checkpoint
names the first position not proven delivered and only moves past transactions whose
every message was acknowledged (the in-flight window's delivered prefix). It is written
on the loop's timer, off the loop's thread (cdc/checkpoint_writer.py), and on the
loop's thread when it must be durable before the relay goes on: before a topic's first
message (so a restart knows to look in it) and at stop.

After a crash the topics are the record: on start the tails of every topic the
checkpoint names are scanned from its offsets (cdc/recovery.py), and what is found there
is skipped while the binlog is read again from the checkpoint. A message Kafka refuses
for a reason other than its size or a missing topic stops the relay (DeliveryError)
after checkpointing the proven prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from cdc import crashpoints
from cdc.assembly.transaction import CommittedTransaction
from cdc.checkpoint import Checkpoint
from cdc.checkpoint_writer import CheckpointWriter
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.errors import DeliveryError
from cdc.lease import LeaseLost
from cdc.metrics import RelayMetrics
from cdc.ports import CheckpointStore, Publisher
from cdc.relay_settings import RelaySettings


class IdempotentDelivery:
    readable_when_acknowledged = True

    def __init__(
        self,
        settings: RelaySettings,
        publisher: Publisher,
        store: CheckpointStore,
        ledger: Ledger,
        guard: LeaseGuard,
        clock: Callable[[], float],
    ):
        self._publisher = publisher
        self._ledger = ledger
        self._guard = guard
        self._clock = clock
        self._drain_timeout_s = settings.drain_timeout_s
        self._writer = CheckpointWriter(store, settings.checkpoint_in_background)

    def start(self) -> None:
        pass

    def recover(self, cp: Checkpoint) -> None:
        self._ledger.scan(cp)

    def handing_over(self, tx: CommittedTransaction) -> None:
        pass

    def topic_named(self) -> None:
        self.checkpoint(force=True)  # a recovery scan must know the topic before it can hold a message

    def commit_due(self, now: float) -> None:
        pass

    def checkpoint(self, force: bool = False, released: bool = False) -> None:
        ledger = self._ledger
        resume = ledger.window.resume()
        if resume.position is None:
            return
        if not force and not ledger.moved(resume):
            return
        crashpoints.hit("after_ack_before_checkpoint")
        cp = ledger.record(resume, released, committed_with_messages=False)
        if force:
            self._writer.save(cp)  # must be durable before the relay goes on
        else:
            self._writer.submit(cp)
        ledger.last = cp

    def failed(self) -> NoReturn:
        raise DeliveryError(self._ledger.failure_text())

    def rewind(self, why: str) -> Checkpoint | None:
        raise DeliveryError(why)  # nothing here raises ReadAgain

    def drain(self, settle: Callable[[], None]) -> None:
        """Wait for what is in flight (dead-letter redirects included), then write the
        checkpoint of the proven prefix."""
        ledger, clock = self._ledger, self._clock
        deadline = clock() + self._drain_timeout_s
        while True:
            remaining = self._publisher.flush(max(0.0, min(1.0, deadline - clock())))
            if ledger.redirects or ledger.unlocated:
                settle()
                continue
            if remaining == 0 or clock() >= deadline:
                break
        ledger.window.advance()
        # Released: a successor need not wait for this relay's producer (cdc/lease.py).
        self.checkpoint(force=True, released=self._guard.held() and remaining == 0)
        self._writer.close()

    def abandon(self, exc: LeaseLost) -> None:
        pass  # what the producer queues is purged; no checkpoint after the lease ran out


def idempotent_delivery(
    settings: RelaySettings,
    publisher: Publisher,
    store: CheckpointStore,
    ledger: Ledger,
    guard: LeaseGuard,
    metrics: RelayMetrics,
    clock: Callable[[], float],
) -> IdempotentDelivery:
    """The DeliveryModeFactory of a sink whose exactly-once is the checkpoint and the
    recovery scan alone (the RabbitMQ Streams sink, cdc_cli/sinks.py)."""
    return IdempotentDelivery(settings, publisher, store, ledger, guard, clock)
