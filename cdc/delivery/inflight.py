"""The window of transactions handed to Kafka and not yet fully acknowledged.

Like Maxwell's InflightMessageList, the delivered position only moves to the oldest
transaction that still has a message in flight: acknowledgements can arrive out of order
across partitions, but the checkpoint advances over a prefix of whole transactions.

Prepared XA transactions hold the checkpoint back. Their rows sit in the binlog at the
prepare, their events are published at the commit, maybe much later: a checkpoint past
the prepare would lose the rows on a restart. So when the delivered prefix passes a
prepare, the window keeps a copy of its state *before* it (position, GTID set, offsets)
and hands out the copy of the earliest undecided prepare as the checkpoint, until that
transaction's outcome is delivered. A restart then reads the binlog from before the
prepare; everything delivered since is recognised by the recovery scan of the topics
from the copy's offsets (cdc/recovery.py), so nothing is published twice. The cost of an
XA transaction left undecided is a longer re-read and scan at restart; the relay's
check-back reports it (cdc/delivery/xa_check_back.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cdc.checkpoint import Checkpoint
from cdc.gtid import GtidSet, empty_set_for, parse_gtid_set
from cdc.position import BinlogPosition


@dataclass(slots=True)
class PendingTx:
    end: BinlogPosition
    gtid: str | None
    server_id: int = 0  # the server whose binlog `end` is a position of
    remaining: int = 0
    sealed: bool = False  # every message of the transaction has been handed over
    events: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # max acked offset
    xa: Any = None  # the transaction's XaMark (cdc.assembly.transaction), for the XA groups
    prepared_ts: int = 0  # an XA prepare: its event's time (seconds since the epoch)
    handed_at: float = 0.0  # when its messages were handed to the producer (wall clock)
    commit_ts: float = 0.0  # its commit's time in the binlog (whole seconds)


@dataclass(slots=True)
class Resume:
    """What a checkpoint records: the first position not proven delivered, the GTIDs
    before it, and each partition's offset after the last message before it."""

    position: BinlogPosition | None
    server_id: int
    gtids: GtidSet | None
    offsets: dict[str, dict[int, int]]
    events_delivered: int


@dataclass(slots=True)
class HeldPrepare:
    """An XA transaction prepared and not yet decided, as the window saw it delivered."""

    xid: str
    prepared_at: BinlogPosition  # its prepare group's start
    prepared_ts: int  # the prepare event's time (seconds since the epoch)
    resume: Resume  # the checkpoint from before its prepare


class InflightWindow:
    def __init__(self, checkpoint: Checkpoint | None):
        self.position: BinlogPosition | None = checkpoint.position if checkpoint else None
        # The server `position` belongs to: after a failover the window keeps the old
        # server's position until a transaction of the new one completes.
        self.position_server_id: int = checkpoint.server_id if checkpoint else 0
        self.gtids: GtidSet | None = parse_gtid_set(checkpoint.gtids) if checkpoint and checkpoint.gtids else None
        self.offsets: dict[str, dict[int, int]] = (
            {t: dict(ps) for t, ps in checkpoint.offsets.items()} if checkpoint else {}
        )
        self.events_delivered = checkpoint.events_delivered if checkpoint else 0
        self._queue: deque[PendingTx] = deque()
        self.held: dict[str, HeldPrepare] = {}  # xid -> undecided XA prepare, in prepare order

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def messages_in_flight(self) -> int:
        return sum(p.remaining for p in self._queue)

    def begin(
        self, end: BinlogPosition, gtid: str | None, server_id: int = 0, xa: Any = None, handed_at: float = 0.0
    ) -> PendingTx:
        entry = PendingTx(end, gtid, server_id, xa=xa, handed_at=handed_at)
        self._queue.append(entry)
        return entry

    def oldest_handed_at(self) -> float:
        """When the oldest transaction not yet in the delivered prefix was handed over (0: none)."""
        queue = self._queue
        try:
            return queue[0].handed_at if queue else 0.0
        except IndexError:  # emptied meanwhile (read from another thread)
            return 0.0

    def oldest_unacknowledged(self, scan: int = 64) -> float | None:
        """When the oldest message still waiting for Kafka's acknowledgement was handed
        over (None: none waits). Safe to call from another thread (it looks, never
        changes); looks at the first `scan` transactions, where it is unless the relay
        has not advanced the window for a long while."""
        queue = self._queue
        try:
            for i in range(min(scan, len(queue))):
                entry = queue[i]
                if entry.remaining:
                    return entry.handed_at
        except IndexError:
            pass
        return None

    def resume(self) -> Resume:
        """The checkpoint to write now: the delivered prefix, or, while an XA transaction
        is prepared and undecided, the state from before the earliest such prepare."""
        for held in self.held.values():
            return held.resume
        return Resume(self.position, self.position_server_id, self.gtids, self.offsets, self.events_delivered)

    def note_topic(self, topic: str, end_offsets: dict[int, int]) -> None:
        """A topic named for the first time: nothing of this run is in it before
        `end_offsets`, in the delivered state and in every held copy alike."""
        for offsets in [self.offsets] + [h.resume.offsets for h in self.held.values()]:
            parts = offsets.setdefault(topic, {})
            for partition, offset in end_offsets.items():
                parts.setdefault(partition, offset)

    @staticmethod
    def expect(entry: PendingTx) -> None:
        entry.remaining += 1
        entry.events += 1

    @staticmethod
    def acknowledged(entry: PendingTx, topic: str, partition: int, offset: int) -> None:
        entry.remaining -= 1
        key = (topic, partition)
        if offset > entry.offsets.get(key, -1):
            entry.offsets[key] = offset

    @staticmethod
    def skipped(entry: PendingTx) -> None:
        """An event recovery proved delivered before the crash: it counts as delivered."""
        entry.events += 1

    def advance(self) -> bool:
        """Move the delivered position over every leading, fully acknowledged transaction."""
        moved = False
        queue = self._queue
        while queue and queue[0].sealed and queue[0].remaining == 0:
            entry = queue.popleft()
            xa = entry.xa
            if xa is not None:
                self._xa_delivered(entry, xa)
            self.position, self.position_server_id = entry.end, entry.server_id
            if entry.gtid:
                if self.gtids is None:
                    self.gtids = empty_set_for(entry.gtid)
                self.gtids = self.gtids.add(entry.gtid)
            for (topic, partition), offset in entry.offsets.items():
                parts = self.offsets.setdefault(topic, {})
                if offset + 1 > parts.get(partition, -1):
                    parts[partition] = offset + 1
            self.events_delivered += entry.events
            moved = True
        return moved

    def _xa_delivered(self, entry: PendingTx, xa: Any) -> None:
        """An XA group reaches the delivered prefix: a prepare starts holding the
        checkpoint (at the state before it), an outcome ends its prepare's hold."""
        if xa.kind == "prepare":
            if xa.xid not in self.held and xa.prepared_at is not None:
                state = Resume(
                    self.position,
                    self.position_server_id,
                    self.gtids,
                    {t: dict(ps) for t, ps in self.offsets.items()},
                    self.events_delivered,
                )
                self.held[xa.xid] = HeldPrepare(xa.xid, xa.prepared_at, entry.prepared_ts, state)
        else:
            self.held.pop(xa.xid, None)
