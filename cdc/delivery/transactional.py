"""Transactional delivery (`kafka.delivery = "transactional"`; docs/transactional-delivery.md):
promise 4 kept by Kafka transactions, with atomic visibility
and a broker-side fence on top.

One Kafka transaction holds the messages of one or more *whole* database transactions,
their dead letters, and, produced last, the checkpoint record naming the position after
them (through the same producer: the transactional checkpoint store). It is opened
before the first message of a database transaction when none is open
(`handing_over`), and committed only between database transactions: when it is
`transaction_max_s` old or holds `transaction_max_messages` (`commit_due`), on the
loop's checkpoint timer, and at stop. The commit: flush (every acknowledgement served,
so the window's delivered prefix covers everything produced), the checkpoint record,
`commit_transaction`; only then is the checkpoint booked as the last one.

Restart: `init_transactions` runs before the checkpoint is read (`start`: from then on
no older instance can commit, and what one left open is aborted). A checkpoint marked
`exact` was committed with every message before it and nothing later is visible, so
there is no recovery scan; any other (written in idempotent mode, or while an XA prepare
held the checkpoint back) is scanned for as in idempotent mode.

Aborts: a delivery failure, a failed commit, a dead letter redirect inside the
transaction or messages not acknowledged within `relay.drain_timeout_s` raise
TransactionAborted (a ReadAgain): the loop calls `rewind`, which aborts (nothing of it
is visible to read_committed readers) and returns the last committed checkpoint to read
again from. `MAX_ABORTS_IN_A_ROW` without a commit stop the relay. A fenced producer
(a newer instance ran `init_transactions`) stops it at once (Fenced, a LeaseLost); when
the lease clock notices first, `abandon` still asks the broker before leaving.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

from cdc import crashpoints
from cdc.assembly.transaction import CommittedTransaction
from cdc.checkpoint import Checkpoint
from cdc.checkpoint_writer import CheckpointWriter
from cdc.delivery.kafka_transaction import (
    FENCED_CODES,
    MAX_ABORTS_IN_A_ROW,
    Fenced,
    TransactionAborted,
    TransactionState,
    transactional_id,
)
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.errors import DeliveryError
from cdc.lease import LeaseLost
from cdc.metrics import RelayMetrics
from cdc.ports import CheckpointStore, TransactionalPublisher
from cdc.relay_settings import RelaySettings

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


class TransactionalDelivery:
    readable_when_acknowledged = False  # a transaction's messages are not readable before its commit

    def __init__(
        self,
        settings: RelaySettings,
        publisher: TransactionalPublisher,
        store: CheckpointStore,
        ledger: Ledger,
        guard: LeaseGuard,
        metrics: RelayMetrics,
        clock: Callable[[], float],
    ):
        self._publisher = publisher
        self._store = store
        self._ledger = ledger
        self._guard = guard
        self._metrics = metrics
        self._clock = clock
        self._timeout = settings.drain_timeout_s
        self.txn_id = transactional_id(settings.source_name)
        self.state = TransactionState(settings.transaction_max_s, settings.transaction_max_messages)
        # A checkpoint is produced inside the open Kafka transaction, on the loop's thread.
        self._writer = CheckpointWriter(store, background=False)

    def start(self) -> None:
        # Before the checkpoint is read: from here on no older instance of this source
        # can commit, and what it left open is aborted.
        self._publisher.init_transactions(self._timeout)
        log.info("transactional delivery as %s: older instances are fenced", self.txn_id)

    def recover(self, cp: Checkpoint) -> None:
        if not cp.exact or cp.adopted is not None:
            self._ledger.scan(cp)
        elif not self.state.aborts:  # at start (a re-read after an abort says why in its own line)
            log.info(
                "recovering from checkpoint %s: committed in the Kafka transaction of the messages before "
                "it, nothing after it is visible: no scan of the topics needed",
                cp.position,
            )

    def handing_over(self, tx: CommittedTransaction) -> None:
        state = self.state
        if not state.open:
            self._begin()
        state.messages += tx.size

    def topic_named(self) -> None:
        pass  # nothing is scanned: the next commit's checkpoint names it

    def commit_due(self, now: float) -> None:
        if self.state.due(now):
            self._commit()

    def checkpoint(self, force: bool = False, released: bool = False) -> None:
        self._commit(force=force, released=released)  # every checkpoint is part of a Kafka transaction

    def failed(self) -> NoReturn:
        """A delivery failed: abort and read again (TransactionAborted), or stop if fenced."""
        ledger = self._ledger
        failure = ledger.failure.failure if ledger.failure is not None else None
        if failure is not None and failure.code in FENCED_CODES:
            raise Fenced(self.txn_id)
        raise TransactionAborted(ledger.failure_text())

    def _begin(self) -> None:
        self._publisher.begin_transaction()
        self.state.opened(self._clock())

    def _commit(self, force: bool = False, released: bool = False) -> None:
        """Commit the open Kafka transaction with the checkpoint after its last database
        transaction inside (or, with none open, a transaction of the checkpoint alone when
        it moved or `force`). Raises TransactionAborted when it cannot."""
        state, publisher, ledger = self.state, self._publisher, self._ledger
        window = ledger.window
        if state.open:
            crashpoints.hit("txn_before_commit")
            remaining = publisher.flush(self._timeout)  # every acknowledgement served
            if ledger.failure is not None:
                self.failed()
            if ledger.redirects:
                raise TransactionAborted(
                    "Kafka refused a message as too large inside a transaction (set "
                    "relay.max_message_bytes to the topic's max.message.bytes)"
                )
            if remaining:
                raise TransactionAborted(f"{remaining} messages not acknowledged within relay.drain_timeout_s")
        window.advance()
        resume = window.resume()
        cp = None if resume.position is None else ledger.record(resume, released, committed_with_messages=True)
        if not state.open:
            if cp is None or not (force or ledger.moved(resume)):
                return
            self._begin()
        if cp is not None:
            self._writer.save(cp)  # produced inside the transaction (the transactional store)
        publisher.commit_transaction(self._timeout)
        crashpoints.hit("txn_after_commit")
        state.committed()
        if cp is not None:
            ledger.last = cp
        self._metrics.checkpoint_behind_since = window.oldest_handed_at()

    def rewind(self, why: str) -> Checkpoint | None:
        """Abort the open Kafka transaction (nothing of it becomes visible to
        read_committed readers); the loop reads again from the last committed checkpoint."""
        state = self.state
        try:
            self._publisher.abort_transaction(self._timeout)
        except TransactionAborted as exc:
            raise DeliveryError(f"a Kafka transaction could not be aborted ({exc}) after: {why}") from exc
        state.aborted()
        self._metrics.delivery_error_causes["transaction_aborted"] += 1
        if state.aborts_in_a_row >= MAX_ABORTS_IN_A_ROW:
            raise DeliveryError(
                f"{state.aborts_in_a_row} Kafka transactions aborted in a row, the last because: {why}; "
                "fix the cause and restart the relay"
            )
        cp = self._ledger.last
        log.warning(
            "Kafka transaction aborted (%s): nothing of it is visible to read_committed consumers; "
            "re-reading from the last committed checkpoint %s",
            why,
            cp.position if cp else self._ledger.start,
        )
        return cp

    def drain(self, settle: Callable[[], None]) -> None:
        """Commit what is open with the last checkpoint (marked released when all went
        well); an abort here leaves the range to the next start."""
        released = self._guard.held()
        try:
            settle()  # dead letters for what Kafka refused go into the open transaction
            self._commit(force=True, released=released)
        except TransactionAborted as exc:
            last = self._ledger.last
            log.warning(
                "the last Kafka transaction could not be committed (%s); it is aborted and the next start "
                "re-reads from the checkpoint %s",
                exc,
                last.position if last else self._ledger.start,
            )
            self._abort_quietly(self._timeout)
        finally:
            self._writer.close()
        figures = self.state.summary()
        log.info(
            "transactional delivery: %d Kafka transactions committed (%.0f messages each on average), %d aborted",
            figures["commits"],
            figures["mean_batch"],
            figures["aborts"],
        )

    def abandon(self, exc: LeaseLost) -> None:
        """The lease ran out: ask the broker before leaving. What is open is aborted; then
        the last checkpoint is written once more in a transaction of its own, which is
        aborted too: if a successor already ran init_transactions, the broker refuses the
        write (Fenced: the one line); otherwise nothing of it is ever visible to
        read_committed readers. Fenced already, or a message of the open transaction
        failed (below): nothing more is written."""
        if isinstance(exc, Fenced):
            return
        publisher, timeout = self._publisher, min(5.0, self._timeout)
        self.state.open = False
        try:
            publisher.poll(0)  # the reports of what failed while the relay was frozen
        except TransactionAborted:
            return
        failure = self._ledger.failure
        if failure is not None:
            if failure.failure is not None and failure.failure.code in FENCED_CODES:
                raise Fenced(self.txn_id)
            # A message of the open transaction failed: a frozen relay's timed out (its
            # successor waits the delivery timeout out before taking over). librdkafka aborts
            # such a transaction by asking the coordinator to bump this producer id's epoch
            # (InitProducerId with the id and epoch, KIP-360): a take-over request, which a
            # relay without its lease does not make. Kafka refuses it from an older epoch;
            # noida-db granted it and fenced the successor. What is open is aborted by the
            # successor's init_transactions.
            return
        self._abort_quietly(timeout)  # whatever is open, in whatever state
        last = self._ledger.last
        if last is None:
            return
        try:
            publisher.begin_transaction()
            self._store.save(last)
            publisher.flush(timeout)
            publisher.abort_transaction(timeout)
        except TransactionAborted:
            pass

    def _abort_quietly(self, timeout: float) -> None:
        """Abort what is open; a refusal changes nothing (the next start's
        init_transactions aborts it). Fenced is not swallowed: it is the one line."""
        try:
            self._publisher.abort_transaction(timeout)
        except TransactionAborted:
            pass
