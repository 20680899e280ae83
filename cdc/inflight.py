"""The window of transactions handed to Kafka and not yet fully acknowledged.

Like Maxwell's InflightMessageList, the delivered position only moves to the oldest
transaction that still has a message in flight: acknowledgements can arrive out of order
across partitions, but the checkpoint advances over a prefix of whole transactions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def messages_in_flight(self) -> int:
        return sum(p.remaining for p in self._queue)

    def begin(self, end: BinlogPosition, gtid: str | None, server_id: int = 0) -> PendingTx:
        entry = PendingTx(end, gtid, server_id)
        self._queue.append(entry)
        return entry

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
