"""One delivery mode over the fakes, with the parts of a run it works with (what
`Relay._build` wires): the ledger, the lease guard, and the hand-over that feeds it
committed transactions, so a mode's unit tests drive it call by call."""

from __future__ import annotations

from typing import Any

from cdc.assembly.feed import LocalFeed, assembler_for
from cdc.assembly.transaction import CommittedTransaction
from cdc.delivery.handover import Handover
from cdc.delivery.idempotent import IdempotentDelivery
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.delivery.missing_topics import MissingTopics
from cdc.delivery.topic_metadata import TopicMetadata
from cdc.delivery.transactional import TransactionalDelivery
from cdc.delivery.unlocated import UnlocatedConfirmation
from cdc.events.outbox import OutboxTable
from cdc.log_limit import LogLimiter
from cdc.metrics import RelayMetrics
from cdc.position import BinlogPosition
from cdc.relay_settings import RelaySettings
from fakes import (
    OUTBOX,
    SCHEMA,
    SOURCE_NAME,
    Binlog,
    FakeKafka,
    FakeSourceFactory,
    JsonSerializer,
    RelayHarness,
    TickingClock,
)

START = BinlogPosition("mysql-bin.000001", 4)


class ModeParts:
    def __init__(
        self,
        transactional: bool = False,
        kafka: FakeKafka | None = None,
        store: Any = None,
        lease: Any = None,
        publisher: dict[str, Any] | None = None,
        **settings: Any,
    ):
        # The harness's fakes and settings; its relay is not used.
        h = RelayHarness(
            Binlog(), kafka=kafka, store=store, publisher=publisher, transactional=transactional, **settings
        )
        self.kafka, self.publisher, self.store, self.settings = h.kafka, h.publisher, h.store, h.settings
        self.delivered, self.clock = h.delivered, h.clock
        self.metrics = RelayMetrics()
        self.guard = LeaseGuard(lease, lambda: 0.0, self.publisher)
        metadata = TopicMetadata(self.delivered, self.publisher, self.guard, self.metrics, self.clock, 5.0)
        self.ledger = Ledger(
            SOURCE_NAME, self.settings.dead_letter_topic, metadata, self.delivered, self.metrics, self.clock
        )
        self.mode: Any
        if transactional:
            self.mode = TransactionalDelivery(
                self.settings, self.publisher, self.store, self.ledger, self.guard, self.metrics, self.clock
            )
        else:
            self.mode = IdempotentDelivery(
                self.settings, self.publisher, self.store, self.ledger, self.guard, self.clock
            )
        self.handover = Handover(
            self.settings,
            self.publisher,
            JsonSerializer(),
            self.ledger,
            self.mode,
            MissingTopics(self.settings, metadata, None, lambda: 0.0),
            UnlocatedConfirmation(self.delivered, self.metrics),
            LogLimiter(10.0, lambda: 0.0),
            self.guard,
            self.metrics,
            self.clock,
        )

    def open(self, cp: Any = None, start: BinlogPosition = START) -> None:
        """As the relay starts: the checkpoint read (after the mode's `start`), the
        account opened from it, recovery from it."""
        self.ledger.server_id = 1
        self.ledger.open(cp, start)
        if cp is not None:
            self.mode.recover(cp)

    def hand_over(self, tx: CommittedTransaction) -> None:
        """What the loop does with a committed transaction."""
        self.handover.transaction(tx)
        if tx.size:
            self.publisher.poll(0)


def committed(
    binlog: Binlog, start: BinlogPosition = START, factory: FakeSourceFactory | None = None
) -> list[CommittedTransaction]:
    """The committed transactions of `binlog` from `start`, as the feed gives them
    (`factory`: another source of the same binlog)."""
    settings = RelaySettings(source_name=SOURCE_NAME, tables=(OutboxTable(SCHEMA, OUTBOX),), start=str(start))
    factory = factory or FakeSourceFactory(binlog)
    clock = TickingClock()
    feed = LocalFeed(factory, assembler_for(settings, 1), start, 5.0, clock, clock.sleep, lambda _t: None)
    out = []
    while not factory.exhausted:
        item = feed.read(0.0)
        if isinstance(item, CommittedTransaction):
            out.append(item)
    return out
