"""The relay loop: committed transactions in, messages out, a checkpoint behind them.

    feed (cdc/assembly/feed.py: source.read() -> TransactionAssembler -> at commit, a
          CommittedTransaction of OutboxEvent | DeadLetter; in this process, or in a
          reader process: connectors/mysql/reader_process.py)
      -> hand-over (cdc/delivery/handover.py): each message to the publisher (never fire and
         forget), each acknowledgement into the run's in-flight window
         (cdc/delivery/ledger.py)
      -> delivery mode (cdc/delivery/): idempotent (checkpoint after acknowledgements,
         tail scan on restart) or transactional (Kafka transactions of whole database
         transactions with the checkpoint inside): when a checkpoint may be written,
         restart recovery, what a failure does, the stop
    on the checkpoint timer: the window advances over the acknowledged prefix, the mode
    checkpoints, the XA check-back asks about prepared transactions (cdc/delivery/xa_check_back.py)

Invariants kept (docs/DESIGN.md): only committed transactions are published; messages
are handed to the producer in commit order and row order; the checkpoint only passes
fully acknowledged transactions (in transactional mode: committed ones).

Around the loop, each in its own home: the lease (cdc/delivery/lease_guard.py: checked before
every read and every transaction handed over; once it has run out the relay purges what
the producer queues and raises LeaseLost, no last checkpoint), dead letters
(cdc/events/dead_letters.py), topics that do not exist (cdc/delivery/missing_topics.py), Kafka's
metadata asked with patience (cdc/delivery/topic_metadata.py), acknowledgements without an
offset (cdc/delivery/unlocated.py). Every checkpoint carries the lease's epoch, one more than the
epoch it started from.
"""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.assembly.feed import MORE, LocalFeed, assembler_for
from cdc.checkpoint import Checkpoint
from cdc.delivery import DeliveryMode, ReadAgain
from cdc.delivery.handover import Handover
from cdc.delivery.kafka import kafka_delivery
from cdc.delivery.kafka_transaction import TransactionState, transactional_id
from cdc.delivery.lease_guard import LeaseGuard
from cdc.delivery.ledger import Ledger
from cdc.delivery.missing_topics import MissingTopics
from cdc.delivery.mode_factory import DeliveryModeFactory
from cdc.delivery.topic_metadata import TopicMetadata
from cdc.delivery.unlocated import UnlocatedConfirmation
from cdc.delivery.xa_check_back import XaCheckBack
from cdc.errors import ConfigError, DeliveryError
from cdc.gtid import parse_gtid_set
from cdc.lease import LeaseClock, LeaseLost
from cdc.log_limit import LogLimiter
from cdc.metrics import RelayMetrics
from cdc.ports import (
    BinlogSourceFactory,
    CheckpointStore,
    DeliveredLog,
    Delivery,
    Feed,
    FeedFactory,
    Publisher,
    Serializer,
    StartAt,
    TopicAdmin,
)
from cdc.position import BinlogPosition
from cdc.recovery import Recovery
from cdc.relay_settings import RelaySettings
from cdc.source_events import Heartbeat, ServerInfo

log = logging.getLogger(__name__)
_POSITION = re.compile(r"^[^\s:]+\.\d+:\d+$")  # <file>.<n>:<offset>; a GTID set never has this shape
# The cyclic collector's young generation while the loop runs: a collection every 10,000
# allocations of container objects instead of CPython's 700. Each message in flight holds
# a few (its event, identity, headers, delivery callbacks) until Kafka acknowledges it, so
# at 700 they outlive the young generation and are walked again by the older ones: about
# 2 us an event of collector time (in-process, hand-over to acknowledgement against the
# Kafka stand-in: 2.07 -> 0.08 us an event; docs/hot-path.md, "The relay process's
# hand-over"). Nothing here relies on the collector: the relay's objects are freed by their
# reference counts, and cycles are still collected, only less often.
YOUNG_GENERATION = 10_000


@dataclass
class RunSummary:
    position: BinlogPosition | None
    events_published: int
    dead_lettered: int
    skipped_recovery: int
    stopped_by: str  # "request": a run that fails raises instead of returning
    error: str | None = None
    recovery: dict[str, Any] = field(default_factory=dict)


def start_point(cp: Checkpoint | None, server_id: int, settings: RelaySettings) -> StartAt | str:
    """Where a relay connected to server `server_id` starts: the checkpoint's position on
    the server that wrote it; its GTID set on another server of the topology (a failover:
    file/pos mean nothing there); without a checkpoint, the configured start (`latest`
    and `earliest` are returned as such, for the source to resolve)."""
    if cp is not None:
        if cp.source != settings.source_name:
            raise ConfigError(
                f"the checkpoint belongs to source {cp.source!r}, this relay is {settings.source_name!r}: "
                "point checkpoint.* at this source's own checkpoint"
            )
        if cp.gtids and cp.server_id and cp.server_id != server_id:
            log.info("server id changed %s -> %s: resuming by GTID set %s", cp.server_id, server_id, cp.gtids)
            return parse_gtid_set(cp.gtids)
        return cp.position
    start = settings.start.strip()
    if start in ("latest", "earliest"):
        return start
    if _POSITION.match(start):
        return BinlogPosition.parse(start)
    return parse_gtid_set(start)


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        sources: BinlogSourceFactory,
        publisher: Publisher,
        serializer: Serializer,
        store: CheckpointStore,
        delivered: DeliveredLog,
        metrics: RelayMetrics | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        feeds: FeedFactory | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        topics: TopicAdmin | None = None,
        delivery_mode: DeliveryModeFactory | None = None,
    ):
        """`feeds`: where committed transactions come from (default: a `LocalFeed` over
        `sources` in this process); `sources` also answers the start-up questions.
        `topics`: creates a missing topic (`topics.missing = "create"`). `delivery_mode`:
        builds the run's delivery mode (default: `kafka_delivery`). The parts of a
        run (ledger, delivery mode, hand-over) are built when `run` starts, from these."""
        self.settings = settings
        self._sources = sources
        self._feeds = feeds
        self._publisher = publisher
        self._serializer = serializer
        self._store = store
        self._delivered = delivered
        self.metrics = metrics or RelayMetrics()
        self._clock = clock
        self._sleep = sleep
        self._monotonic = monotonic
        self._topics = topics
        self._delivery_mode = delivery_mode or kafka_delivery
        self._xa_check_back = XaCheckBack(settings, sources, self.metrics)
        self._dead_letter_log = LogLimiter(10.0, monotonic)
        self._feed_seen: dict[str, int] = {}
        self.txn_id = transactional_id(settings.source_name)
        self._ledger: Ledger | None = None
        self._delivery: DeliveryMode | None = None

    # -- the loop -----------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], lease: LeaseClock | None = None, holder: str = "") -> RunSummary:
        """Run until `should_stop()` returns true; then drain, checkpoint and return.

        Raises DeliveryError (after checkpointing the proven prefix) when Kafka refuses a
        message for a reason other than its size, SourceError when the server stays
        unreachable past `reconnect_timeout_s`, NeedsOperator errors at start, and
        LeaseLost (after purging the producer, without a checkpoint) when `lease` runs
        out. `holder`: the lease session's tag, recorded in every checkpoint."""
        feed = self._start(lease, holder)
        threshold = gc.get_threshold()
        if threshold[0] < YOUNG_GENERATION:  # raised, never lowered (a process may have set its own)
            gc.set_threshold(YOUNG_GENERATION, *threshold[1:])
        settings, metrics, guard = self.settings, self.metrics, self._guard
        ledger, delivery, handover = self._run_ledger, self._run_delivery, self._handover
        publisher = self._publisher
        poll, pending, read_timeout = publisher.poll, publisher.pending, settings.read_timeout_s
        last_checkpoint_at = self._clock()
        fenced = False
        try:
            while not should_stop():
                try:
                    guard.check()  # first: a relay woken after its lease ran out only stops
                    if ledger.failure is not None:
                        delivery.failed()
                    # Acknowledgements are only served by poll(): while some are due, wait for
                    # the feed in short slices so they are not served late.
                    item = feed.read(0.002 if pending() else read_timeout)
                    if item is None:
                        metrics.caught_up = True
                        poll(0)
                    elif item is MORE:
                        metrics.caught_up = False
                    else:
                        kind = type(item)
                        if kind is Heartbeat:
                            metrics.caught_up = True
                        elif kind is ServerInfo:
                            ledger.server_id = item.server_id
                        else:
                            metrics.caught_up = False
                            handover.transaction(item)
                            metrics.read_file, metrics.read_pos = item.end.file, item.end.pos
                            if item.size:
                                poll(0)
                    if ledger.redirects or ledger.unlocated:
                        handover.settle()
                    now = self._clock()
                    delivery.commit_due(now)
                    if now - last_checkpoint_at >= settings.checkpoint_interval_s:
                        self._on_time(feed, now)
                        last_checkpoint_at = now
                except ReadAgain as exc:
                    feed = self._read_again(feed, delivery.rewind(str(exc)), str(exc))
        except LeaseLost as exc:
            fenced = True
            self._fenced_stop(exc)
            raise
        finally:
            metrics.ready = False
            self._stop(feed, fenced)
        if ledger.failure is not None:
            delivery.failed()
        return RunSummary(
            ledger.window.resume().position,
            metrics.events_published,
            metrics.dead_lettered_total,
            metrics.events_skipped_recovery,
            "request",
            None,
            ledger.recovery_summary(),
        )

    def _on_time(self, feed: Feed, now: float) -> None:
        """The checkpoint timer: over the acknowledged prefix, the mode checkpoints."""
        window = self._run_ledger.window
        window.advance()
        self._run_delivery.checkpoint()
        self.metrics.checkpoint_behind_since = window.oldest_handed_at()
        self._feed_counters(feed)
        self._xa_check_back.run(window.held, now)

    # -- start ----------------------------------------------------------------------------

    def _start(self, lease: LeaseClock | None, holder: str) -> Feed:
        """Build the run's parts, take over from the last checkpoint (the mode recovers
        what was delivered after it), make a new lease epoch durable, open the feed."""
        self._build(lease)
        ledger, delivery = self._run_ledger, self._run_delivery
        ledger.server_id = self._sources.server_id()
        delivery.start()  # before the checkpoint is read
        cp = self._store.load()
        ledger.claim(cp, lease is not None, holder)
        start = self._start_point(cp)
        self._sources.check_available(start)
        ledger.open(cp, start)
        if cp is not None:
            delivery.recover(cp)
        if lease is not None:
            self._guard.check()
            delivery.checkpoint(force=True)  # the new epoch is durable before anything is published
        feed = self._open_feed(start)
        self.metrics.ready = True
        return feed

    def _build(self, lease: LeaseClock | None) -> None:
        settings, metrics, publisher, clock = self.settings, self.metrics, self._publisher, self._clock
        guard = self._guard = LeaseGuard(lease, self._monotonic, publisher)
        metadata = TopicMetadata(self._delivered, publisher, guard, metrics, clock, settings.reconnect_timeout_s)
        ledger = Ledger(settings.source_name, settings.dead_letter_topic, metadata, self._delivered, metrics, clock)
        delivery = self._delivery_mode(settings, publisher, self._store, ledger, guard, metrics, clock)
        self._ledger, self._delivery = ledger, delivery
        self._handover = Handover(
            settings,
            publisher,
            self._serializer,
            ledger,
            delivery,
            MissingTopics(settings, metadata, self._topics, self._monotonic),
            UnlocatedConfirmation(self._delivered, metrics),
            self._dead_letter_log,
            guard,
            metrics,
            clock,
        )

    def _start_point(self, cp: Checkpoint | None) -> StartAt:
        point = start_point(cp, self._run_ledger.server_id, self.settings)
        if isinstance(point, str):  # "latest" or "earliest"
            return self._sources.resolve(point)
        return point

    def _read_again(self, feed: Feed, cp: Checkpoint | None, why: str) -> Feed:
        """After the mode's rewind: read the binlog again from `cp` (None: from where
        the run started), with a new window and a new feed."""
        ledger = self._run_ledger
        feed.close()
        ledger.reopen(cp)
        if cp is None:
            if ledger.start is None:  # _start sets it before anything is read
                raise DeliveryError(why)
            start = ledger.start
        else:
            start = self._start_point(cp)
            self._run_delivery.recover(cp)
        return self._open_feed(start)

    def _open_feed(self, start: StartAt) -> Feed:
        settings = self.settings
        self._feed_seen = {}  # a new feed counts from 0
        server_id = self._run_ledger.server_id
        if self._feeds is not None:
            return self._feeds.open(start, server_id)
        assembler = assembler_for(settings, server_id)
        return LocalFeed(
            self._sources,
            assembler,
            start,
            settings.reconnect_timeout_s,
            self._clock,
            self._sleep,
            self._publisher.poll,
        )

    def _feed_counters(self, feed: Feed) -> None:
        """The feed's own counters into the metrics (a reader process counts there)."""
        m, seen = self.metrics, self._feed_seen
        now = {
            "reconnects": feed.reconnects,
            "rows_discarded": feed.discarded_rows,
            "outbox_changes_ignored": feed.outbox_changes_ignored,
        }
        for name, value in now.items():
            setattr(m, name, getattr(m, name) + value - seen.get(name, 0))
        self._feed_seen = now

    # -- stop -----------------------------------------------------------------------------

    def _fenced_stop(self, exc: LeaseLost) -> None:
        queued = self._publisher.pending()
        try:
            self._run_delivery.abandon(exc)  # transactional: raises Fenced when the broker fenced this instance
        finally:
            self._guard.fenced_stop(exc, queued)

    def _stop(self, feed: Feed, fenced: bool) -> None:
        try:
            (feed.abandon if fenced else feed.close)()
        finally:
            self._feed_counters(feed)
            if not fenced:
                self._drain()

    def _drain(self) -> None:
        """Stop: the mode waits for what is in flight and writes its last checkpoint. Not
        when the lease has run out meanwhile (the loop ended on another error): then what
        is queued is dropped, never sent."""
        guard = self._guard
        try:
            guard.check()
        except LeaseLost as exc:
            guard.fenced_stop(exc, self._publisher.pending())
            raise
        self._run_delivery.drain(self._handover.settle)

    # -- the run's parts ----------------------------------------------------------------

    @property
    def _run_ledger(self) -> Ledger:
        assert self._ledger is not None, "run() builds it"
        return self._ledger

    @property
    def _run_delivery(self) -> DeliveryMode:
        assert self._delivery is not None, "run() builds it"
        return self._delivery

    @property
    def epoch(self) -> int:
        """The lease epoch this relay publishes under (0: none claimed yet)."""
        return self._ledger.epoch if self._ledger is not None else 0

    # What tests look at (tests/unit): the transactional figures, the recovery scan's
    # findings, and the delivery failure a test injects.

    @property
    def _txn(self) -> TransactionState | None:
        state = getattr(self._delivery, "state", None)  # the transactional mode's
        return state if isinstance(state, TransactionState) else None

    @property
    def _recovery_stats(self) -> Recovery | None:
        return self._ledger.recovery_stats if self._ledger is not None else None

    @property
    def _failure(self) -> Delivery | None:
        return self._ledger.failure if self._ledger is not None else None

    @_failure.setter
    def _failure(self, delivery: Delivery | None) -> None:
        self._run_ledger.failure = delivery
