"""The relay's side of the lease (cdc/lease.py has the rules): check it before handing
anything to the producer, and stop fenced when it has run out.

The loop checks before every read, the hand-over before every database transaction it
gives the producer (and every 256 messages of a large one), a wait for Kafka's metadata
between its attempts. Once the lease has run out the relay hands nothing more over:
`fenced_stop` purges what the producer still queues and says why in one line, and no
further checkpoint is written. Without a lease (`[lease] enabled = false`) every check
passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdc.delivery.kafka_transaction import Fenced
from cdc.lease import LeaseClock, LeaseLost
from cdc.ports import Publisher

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


class LeaseGuard:
    def __init__(self, lease: LeaseClock | None, monotonic: Callable[[], float], publisher: Publisher):
        self.lease = lease
        self._monotonic = monotonic
        self._publisher = publisher

    def check(self) -> None:
        """Raise LeaseLost once the lease has run out (or was lost)."""
        if self.lease is not None:
            self.lease.check(self._monotonic())

    def held(self) -> bool:
        """A lease is held and was never lost: a clean stop may mark its last checkpoint
        released, so a successor need not wait for this relay's producer."""
        return self.lease is not None and self.lease.lost is None

    def fenced_stop(self, exc: LeaseLost, queued: int) -> None:
        """A fenced stop: purge what the producer holds and say why in one timed line,
        whichever of lease and broker came first. The exception's text is the CLI's one
        line, so a broker's fence is not repeated here."""
        self._publisher.purge()
        why = "the broker refused this instance's transactions" if isinstance(exc, Fenced) else exc
        log.error(
            "fenced: %s (%d message(s) not yet acknowledged were dropped; the successor re-reads them)", why, queued
        )
