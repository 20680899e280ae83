"""One run's account of delivery, shared by the loop (cdc/relay.py), the hand-over
(cdc/delivery/handover.py) and the delivery mode (cdc/delivery/):

* the in-flight window (cdc/delivery/inflight.py): what was handed over, what Kafka acknowledged,
  the delivered prefix;
* where the run started, the epoch and holder it publishes under (cdc/lease.py), the
  window taken over from Debezium (cdc/adoption.py);
* the topics it has named in a checkpoint, with their partition counts: a topic is named
  (its end offsets noted in the window) before its first message, so a recovery scan
  knows every topic the run may have written and where in each to start looking;
* the last checkpoint written, and the record of the next one (`record`);
* what the previous run delivered after its checkpoint (`scan`, cdc/recovery.py);
* what acknowledgements left for the loop's thread: the first delivery failure, dead
  letters to redirect, acknowledgements to locate (cdc/delivery/unlocated.py).

A re-read from a checkpoint (transactional delivery after an abort) starts a new window
and forgets what the acknowledgements left (`reopen`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdc.adoption import AdoptedWindow
from cdc.checkpoint import Checkpoint
from cdc.delivery.inflight import InflightWindow, PendingTx, Resume
from cdc.delivery.topic_metadata import TopicMetadata
from cdc.delivery.unlocated import Unlocated
from cdc.events.outbox import DeadLetter
from cdc.metrics import RelayMetrics
from cdc.ports import DeliveredLog, Delivery, StartAt
from cdc.position import BinlogPosition
from cdc.recovery import Recovery

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


class Ledger:
    def __init__(
        self,
        source_name: str,
        dead_letter_topic: str,
        metadata: TopicMetadata,
        delivered: DeliveredLog,
        metrics: RelayMetrics,
        clock: Callable[[], float],
    ):
        self._source_name = source_name
        self._dead_letter_topic = dead_letter_topic
        self._metadata = metadata
        self._delivered = delivered
        self._metrics = metrics
        self._clock = clock
        self.window = InflightWindow(None)
        self.server_id = 0  # the server being read (ServerInfo: a failover changes it)
        self.start: StartAt | None = None  # where the run started reading
        self.tx_start: BinlogPosition | None = None  # the start of the last transaction handed over
        self.epoch = 0
        self.holder = ""
        self.adopted: AdoptedWindow | None = None  # taken over from Debezium (cdc/adoption.py)
        self.partitions: dict[str, int] = {}  # topics named in a checkpoint -> partition count (0: not known yet)
        self.last: Checkpoint | None = None  # the last checkpoint written (committed, in transactional mode)
        self.recovery: Recovery | None = None  # while events found delivered after the checkpoint are to come
        self.recovery_stats: Recovery | None = None
        self.failure: Delivery | None = None  # the first delivery Kafka refused
        self.redirects: list[tuple[PendingTx, DeadLetter]] = []  # refused messages, to the dead-letter topic
        self.unlocated: list[Unlocated] = []  # acknowledged without an offset, to be found in their partition

    # -- start ----------------------------------------------------------------------------

    def claim(self, cp: Checkpoint | None, leased: bool, holder: str) -> None:
        """The epoch this run publishes under: with a lease, one more than the last
        checkpoint's; without, the last checkpoint's own."""
        if leased:
            self.epoch, self.holder = (cp.epoch if cp is not None else 0) + 1, holder
            self._metrics.lease_epoch = self.epoch
        elif cp is not None:
            self.epoch, self.holder = cp.epoch, cp.holder

    def open(self, cp: Checkpoint | None, start: StartAt) -> None:
        """Account from `cp` (None: a first start at `start`)."""
        self.start = start
        window = self._new_window(cp)
        self.last = cp
        if cp is not None:
            self.partitions.update(cp.partitions)
            self.adopted = cp.adopted
        elif isinstance(start, BinlogPosition):
            window.position, window.position_server_id = start, self.server_id

    def reopen(self, cp: Checkpoint | None) -> None:
        """Account again from `cp`, the last checkpoint (None: from where the run
        started): what was handed over since is read again."""
        self.failure, self.redirects, self.recovery = None, [], None
        self.unlocated = []
        window = self._new_window(cp)
        if cp is None and isinstance(self.start, BinlogPosition):
            window.position, window.position_server_id = self.start, self.server_id

    def _new_window(self, cp: Checkpoint | None) -> InflightWindow:
        self.window = window = InflightWindow(cp)
        self._metrics.unacknowledged_since = window.oldest_unacknowledged
        return window

    def scan(self, cp: Checkpoint) -> None:
        """The recovery scan of the topics' tails after `cp` (docs/DESIGN.md, promise 4)."""
        recovery = Recovery(cp, self._delivered)
        recovery.scan_all(set(cp.partitions) | set(cp.offsets) | {self._dead_letter_topic})
        log.info("recovering from checkpoint %s: %d events found delivered after it", cp.position, recovery.found)
        if cp.adopted is not None:
            log.info(
                "adopted from %s: %d Debezium messages in the window up to %s are recognised by their id",
                cp.adopted.origin or "Debezium",
                recovery.adopted_found,
                cp.adopted.until,
            )
        if recovery.pending:
            self.recovery = recovery
        self.recovery_stats = recovery

    # -- topics ---------------------------------------------------------------------------

    def name_topic(self, topic: str) -> bool:
        """Before the first message to `topic`: note it with its current end offsets
        (nothing of this run is in it before them). True when it was not named before:
        the delivery mode then makes that durable before the message is handed over."""
        if topic in self.partitions:
            return False
        count = self._metadata.partition_count(topic)
        self.partitions[topic] = count or 0  # 0: not created yet; recovery reads it whole
        window = self.window
        if count:
            window.note_topic(topic, self._metadata.end_offsets(topic, count))
        if self.tx_start is not None and (window.position is None or window.position_server_id != self.server_id):
            # Started from a GTID set (no checkpoint, or a failover): until a transaction
            # of this server completes, the first one's start is the resume point here.
            window.position, window.position_server_id = self.tx_start, self.server_id
        return True

    # -- checkpoints ----------------------------------------------------------------------

    def moved(self, resume: Resume) -> bool:
        """Does `resume` say something the last checkpoint does not?"""
        window, last = self.window, self.last
        xa_held = tuple((h.xid, str(h.prepared_at), h.prepared_ts) for h in window.held.values())
        return not (
            last is not None
            and last.position == resume.position
            and last.xa_held == xa_held
            and (not window.held or last.offsets == resume.offsets)
        )

    def record(self, resume: Resume, released: bool, committed_with_messages: bool) -> Checkpoint:
        """The checkpoint of `resume`. `released`: a clean stop with everything settled.
        `committed_with_messages`: written in one broker transaction with every message
        before it (transactional delivery), so it is `exact` unless an XA prepare holds
        it back (messages after it were committed: a restart must scan for them)."""
        position = resume.position
        assert position is not None, "the modes record only a resume point that has a position"
        window = self.window
        xa_held = tuple((h.xid, str(h.prepared_at), h.prepared_ts) for h in window.held.values())
        for topic, count in list(self.partitions.items()):
            if not count:  # created by the first produce: learn its partition count now
                self.partitions[topic] = self._metadata.partition_count(topic) or 0
        adopted = self.adopted
        if adopted is not None and not position < adopted.until:
            adopted = self.adopted = None  # a restart from here re-reads nothing Debezium can have published
        return Checkpoint(
            source=self._source_name,
            position=position,
            gtids=str(resume.gtids) if resume.gtids else None,
            server_id=resume.server_id,
            offsets={t: dict(ps) for t, ps in resume.offsets.items()},
            partitions=dict(self.partitions),
            written_at_ms=int(self._clock() * 1000),
            events_delivered=resume.events_delivered,
            xa_held=xa_held,
            epoch=self.epoch,
            holder=self.holder,
            released=released,
            exact=committed_with_messages and not window.held and adopted is None,
            adopted=adopted,
        )

    # -- what the acknowledgements left -------------------------------------------------

    def delivery_failed(self, delivery: Delivery) -> None:
        metrics = self._metrics
        metrics.delivery_errors += 1
        metrics.delivery_error_causes[delivery.failure.code if delivery.failure else "unknown"] += 1
        if self.failure is None:
            self.failure = delivery

    def failure_text(self) -> str:
        delivery = self.failure
        failure = delivery.failure if delivery else None
        if delivery is None or failure is None:
            return "the sink refused a message"
        return (
            f"the sink refused a message for {delivery.topic}: {failure.code}: {failure.message}; "
            "the checkpoint stops before it: fix the cause and restart the relay"
        )

    def recovery_summary(self) -> dict[str, Any]:
        r = self.recovery_stats
        if r is None:
            return {}
        return {
            "records_read": r.records_read,
            "found": r.found,
            "skipped": r.skipped,
            "adopted_found": r.adopted_found,
            "adopted_skipped": r.adopted_skipped,
            "duplicates_in_topics": len(r.duplicates_in_topics),
        }
