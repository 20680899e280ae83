"""Transactional delivery (`kafka.delivery = "transactional"`): the bookkeeping of the
Kafka transaction the relay has open, and the errors of that mode.

One Kafka transaction holds the messages of one or more *complete* database
transactions, their dead letters, and the checkpoint record naming the position after
them (docs/transactional-delivery.md). The transactional delivery mode
(cdc/delivery/transactional.py) opens one before the first message of a database
transaction when none is open, and commits it once a whole database transaction is
handed over and the open one is old enough (`transaction_max_s`) or large enough
(`transaction_max_messages`), and at stop. The errors live here, apart from the mode,
because the transactional producer (connectors/kafka/sink.py) raises them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc.delivery import ReadAgain
from cdc.lease import LeaseLost

# librdkafka's names for "a newer producer with this transactional.id exists".
FENCED_CODES = frozenset({"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"})
# Aborts in a row, without a commit between them, after which the relay stops (exit 1):
# a cause that does not go away (an authorization, a broker refusing a message) must not
# make the relay re-read the same range for ever.
MAX_ABORTS_IN_A_ROW = 5


def transactional_id(source_name: str) -> str:
    """The stable transactional.id of a source's relay: every instance of one source uses
    it, so the newest one's `init_transactions` fences the others."""
    return f"cdc-relay.{source_name}"


class Fenced(LeaseLost):
    """The broker refused this producer: a newer instance with the same transactional.id
    ran `init_transactions`. The relay stops at once and writes nothing more (exit 1)."""

    def __init__(self, txn_id: str):
        self.txn_id = txn_id
        super().__init__(f"fenced by a newer instance of {txn_id}; this instance stops")


class TransactionAborted(ReadAgain):
    """The open Kafka transaction could not be committed (a produce error, a timeout):
    the relay aborts it and re-reads from the last committed checkpoint."""


@dataclass
class TransactionState:
    """The open Kafka transaction (if any) and the figures of the ones before it."""

    max_s: float
    max_messages: int
    open: bool = False
    opened_at: float = 0.0
    messages: int = 0  # handed to the producer in the open transaction
    db_transactions: int = 0  # database transactions completed in the open transaction
    commits: int = 0
    aborts: int = 0
    aborts_in_a_row: int = 0
    committed_messages: int = 0
    batch_sizes: list[int] = field(default_factory=list)  # messages per commit (the last 1000)

    def opened(self, now: float) -> None:
        self.open, self.opened_at, self.messages, self.db_transactions = True, now, 0, 0

    def due(self, now: float) -> bool:
        """Commit now? Only asked between database transactions."""
        return self.open and (self.messages >= self.max_messages or now - self.opened_at >= self.max_s)

    def committed(self) -> None:
        self.commits += 1
        self.aborts_in_a_row = 0
        self.committed_messages += self.messages
        self.batch_sizes.append(self.messages)
        if len(self.batch_sizes) > 1000:
            del self.batch_sizes[:500]
        self.open = False

    def aborted(self) -> None:
        self.aborts += 1
        self.aborts_in_a_row += 1
        self.open = False

    def summary(self) -> dict[str, float]:
        sizes = sorted(self.batch_sizes)
        return {
            "commits": self.commits,
            "aborts": self.aborts,
            "messages": self.committed_messages,
            "mean_batch": (sum(sizes) / len(sizes)) if sizes else 0.0,
            "median_batch": sizes[len(sizes) // 2] if sizes else 0,
        }
