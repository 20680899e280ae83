"""Recovery on start: what did the previous run deliver after its last checkpoint?

The topics are the record. The relay writes a checkpoint naming a topic before it sends
the first message to it, so the last checkpoint lists every topic the previous run could
have written. Each partition of each is read from the checkpoint's offset to its end,
and the identity of each message that belongs to a transaction at or after the
checkpoint is remembered. While the binlog is re-read
from the checkpoint, an event whose identity is remembered is skipped instead of being
published again: no broker transaction is needed, and a transaction delivered to some
partitions and not others is completed exactly.

A checkpoint written by `cdc adopt` (cdc/adoption.py) carries a window in which Debezium's
messages may sit: those lack the relay's identity headers, so their `id` header (the
outbox event id) is remembered instead, from the window's offsets on, and an event of the
binlog with that id is not published again until the relay has passed the window.

Refused, with a message, because guessing would lose or repeat events:
* a topic whose partition count differs from the checkpoint's (keys moved partitions);
* a checkpoint offset past a partition's end (the topic was truncated or recreated).
"""

from __future__ import annotations

import logging

from cdc import crashpoints
from cdc.checkpoint import Checkpoint
from cdc.errors import PositionError, RecoveryError
from cdc.events.identity import H_EVENT_ID, H_FILE, H_GTID, H_POS, H_SOURCE, identity_key_from_headers
from cdc.gtid import parse_gtid_set
from cdc.ports import DeliveredLog
from cdc.position import BinlogPosition

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, checkpoint: Checkpoint, delivered: DeliveredLog):
        self._cp = checkpoint
        self._log = delivered
        self._gtids = parse_gtid_set(checkpoint.gtids) if checkpoint.gtids else None
        self._keys: set[tuple] = set()
        self._scanned: set[str] = set()
        self.records_read = 0
        self.found = 0  # identities of events delivered after the checkpoint
        self.duplicates_in_topics: list[tuple[str, int, int]] = []  # (topic, partition, offset)
        self.skipped = 0
        self._adopted = checkpoint.adopted
        # Debezium's messages in the adopted window: their event ids (cdc/adoption.py).
        self._adopted_ids: set[str] = set()
        self.adopted_found = 0
        self.adopted_skipped = 0

    @property
    def pending(self) -> int:
        return len(self._keys) + len(self._adopted_ids)

    @property
    def adopt_until(self) -> BinlogPosition | None:
        """While not None, events are also matched by id (`adopted_delivered`) up to here."""
        return self._adopted.until if self._adopted is not None else None

    def scan_all(self, topics: set[str]) -> None:
        for topic in sorted(topics):
            self.scan(topic)

    def scan(self, topic: str) -> None:
        if topic in self._scanned:
            return
        self._scanned.add(topic)
        count = self._log.partition_count(topic)
        if count is None:
            return
        expected = self._cp.partitions.get(topic)
        if expected and count != expected:
            raise RecoveryError(
                f"topic {topic!r} has {count} partitions but had {expected} at the checkpoint: "
                "keys now map to other partitions and per-key order cannot be kept; restore the "
                "partition count or start the relay with a fresh checkpoint on a new topic"
            )
        recorded = self._cp.offsets.get(topic, {})
        adopted = self._adopted.offsets.get(topic) if self._adopted is not None else None
        for partition in range(count):
            low, high = self._log.watermarks(topic, partition)
            start = recorded.get(partition, low)
            adopted_from = None
            if adopted is not None:
                adopted_from = adopted.get(partition, low)  # a partition added since: all of it
                start = min(start, adopted_from)
            if start > high:
                raise RecoveryError(
                    f"the checkpoint says {topic}[{partition}] held messages up to offset {start - 1}, "
                    f"but the partition ends at offset {high}: the topic was truncated or recreated. "
                    "Events may be lost; restore the topic or reset the checkpoint knowingly"
                )
            if start < low:
                log.warning(
                    "%s[%d]: offsets %d..%d after the checkpoint were removed by retention; "
                    "events there cannot be checked for re-delivery",
                    topic,
                    partition,
                    start,
                    low - 1,
                )
                start = low
            for offset, headers in self._log.records(topic, partition, start, high):
                self.records_read += 1
                source = headers.get(H_SOURCE)
                if source is None and adopted_from is not None and offset >= adopted_from:
                    event_id = headers.get(H_EVENT_ID)
                    if event_id is not None and event_id not in self._adopted_ids:  # a Debezium message
                        self._adopted_ids.add(event_id)
                        self.adopted_found += 1
                    continue
                if source != self._cp.source or not self._after_checkpoint(headers):
                    continue
                key = identity_key_from_headers(headers)
                if key is None:
                    continue
                if key in self._keys:
                    self.duplicates_in_topics.append((topic, partition, offset))
                    continue
                self._keys.add(key)
                self.found += 1
                crashpoints.hit("recovery")

    def _after_checkpoint(self, headers: dict[str, str]) -> bool:
        gtid = headers.get(H_GTID)
        if gtid and self._gtids is not None:
            try:
                return not self._gtids.contains(gtid)
            except PositionError:  # a GTID of the other flavour: compare positions instead
                pass
        try:
            return BinlogPosition(headers[H_FILE], int(headers[H_POS])) >= self._cp.position
        except (KeyError, ValueError, PositionError):
            return False

    def adopted_delivered(self, event_id: str) -> bool:
        """Did Debezium publish the event with this id (in the adopted window)?"""
        if event_id in self._adopted_ids:
            self._adopted_ids.discard(event_id)
            self.adopted_skipped += 1
            self.skipped += 1
            return True
        return False

    def end_adoption(self) -> None:
        """The relay has read past the adopted window: no later event can be Debezium's.
        The ids still remembered are of events before Debezium's offset (published by it
        long ago, never re-read here)."""
        if self._adopted is not None:
            log.info(
                "adoption from %s complete: %d events Debezium had published after its offset were not sent again",
                self._adopted.origin or "Debezium",
                self.adopted_skipped,
            )
        self._adopted = None
        self._adopted_ids.clear()

    def already_delivered(self, key: tuple) -> bool:
        if key in self._keys:
            self._keys.discard(key)
            self.skipped += 1
            return True
        return False
