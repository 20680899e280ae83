"""Delivery modes: how the messages the relay hands over become *proven delivered*, what
its checkpoint means, how a restart finds what the previous run delivered, and how a
run ends. The relay loop (cdc/relay.py) sees only `DeliveryMode`.

    idempotent.py     `kafka.delivery = "idempotent"` (the default): an idempotent
                      producer; a message is delivered when Kafka acknowledges it; the
                      checkpoint follows the acknowledgements (written in the background
                      on a timer) and a restart scans the topics' tails after it.
    transactional.py  `kafka.delivery = "transactional"`: one Kafka transaction per batch
                      of whole database transactions, the checkpoint record inside it; a
                      committed checkpoint is exact (no scan on restart); an abort makes
                      the loop read again from the last committed checkpoint.
    kafka.py          the relay's default factory: one of the two above, by `kafka.delivery`
    mode_factory.py   what builds a run's mode (each sink's adapters bring one)
    ledger.py         one run's account, shared by the loop, the hand-over and the mode:
                      the in-flight window, the last checkpoint, the next one's record.

What a mode is told, and when (each call on the loop's thread):

    start()              before the checkpoint is read (fence older instances)
    recover(cp)          with the checkpoint to resume from, at start and after a rewind:
                         learn what was delivered after it (or know that nothing was)
    handing_over(tx)     before the first message of a committed transaction goes to the
                         publisher (the hand-over, cdc/delivery/handover.py, then publishes them)
    topic_named()        a topic is about to get its first message: make it known where a
                         restart will look
    commit_due(now)      between transactions: commit what is due, if the mode batches
    checkpoint(...)      on the loop's timer (and forced when it must be durable now):
                         record the delivered prefix
    failed()             a delivery failed (the ledger's failure): raise the mode's error
    rewind(why)          the loop caught ReadAgain: undo what is not delivered and return
                         the checkpoint to read again from
    drain(settle)        stop: wait for what is in flight, write the last checkpoint
    abandon(exc)         the lease is lost (or the broker fenced this instance): leave
                         without delivering anything more

A sink other than Kafka (a stream with its own de-duplication or transactions) is a
further module here with the same calls, over its own publisher port; the CLI hands the
relay its `DeliveryModeFactory` (mode_factory.py, cdc_cli/sinks.py), the relay loop does not branch on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, Protocol

from cdc.assembly.transaction import CommittedTransaction
from cdc.checkpoint import Checkpoint
from cdc.errors import Transient
from cdc.lease import LeaseLost


class ReadAgain(Transient):
    """What was handed over since the last checkpoint is not delivered and never will be
    (a Kafka transaction aborted): the loop asks the mode to `rewind` and reads the
    binlog again from the checkpoint it returns."""


class DeliveryMode(Protocol):
    readable_when_acknowledged: bool
    """Can an acknowledged message be read back in its topic before the mode commits?
    Then an acknowledgement without an offset is looked for (cdc/delivery/unlocated.py)."""

    def start(self) -> None: ...

    def recover(self, cp: Checkpoint) -> None: ...

    def handing_over(self, tx: CommittedTransaction) -> None: ...

    def topic_named(self) -> None: ...

    def commit_due(self, now: float) -> None: ...

    def checkpoint(self, force: bool = False, released: bool = False) -> None:
        """`force`: durable before this returns, even when nothing moved. `released`: the
        last one of a clean stop, everything settled (a successor need not wait)."""

    def failed(self) -> NoReturn: ...

    def rewind(self, why: str) -> Checkpoint | None: ...

    def drain(self, settle: Callable[[], None]) -> None:
        """`settle()`: send redirected dead letters, confirm unlocated acknowledgements."""

    def abandon(self, exc: LeaseLost) -> None: ...
