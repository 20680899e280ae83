"""Recovery on start: what did the previous run deliver after its last checkpoint?

The topics are the record. The relay writes a checkpoint naming a topic before it sends
the first message to it, so the last checkpoint lists every topic the previous run could
have written. Each partition of each is read from the checkpoint's offset to its end,
and the identity of each message that belongs to a transaction at or after the
checkpoint is remembered. While the binlog is re-read
from the checkpoint, an event whose identity is remembered is skipped instead of being
published again: no broker transaction is needed, and a transaction delivered to some
partitions and not others is completed exactly.

Refused, with a message, because guessing would lose or repeat events:
* a topic whose partition count differs from the checkpoint's (keys moved partitions);
* a checkpoint offset past a partition's end (the topic was truncated or recreated).
"""

from __future__ import annotations

import logging

from cdc import crashpoints
from cdc.checkpoint import Checkpoint
from cdc.errors import PositionError, RecoveryError
from cdc.gtid import parse_gtid_set
from cdc.identity import H_FILE, H_GTID, H_POS, H_SOURCE, identity_key_from_headers
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

    @property
    def pending(self) -> int:
        return len(self._keys)

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
        for partition in range(count):
            low, high = self._log.watermarks(topic, partition)
            start = recorded.get(partition, low)
            if start > high:
                raise RecoveryError(
                    f"the checkpoint says {topic}[{partition}] held messages up to offset {start - 1}, "
                    f"but the partition ends at offset {high}: the topic was truncated or recreated. "
                    "Events may be lost; restore the topic or reset the checkpoint knowingly"
                )
            if start < low:
                log.warning(
                    "%s[%d]: offsets %d..%d after the checkpoint were removed by retention; "
                    "events there cannot be checked for re-delivery", topic, partition, start, low - 1,
                )
                start = low
            for offset, headers in self._log.records(topic, partition, start, high):
                self.records_read += 1
                if headers.get(H_SOURCE) != self._cp.source or not self._after_checkpoint(headers):
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

    def already_delivered(self, key: tuple) -> bool:
        if key in self._keys:
            self._keys.discard(key)
            self.skipped += 1
            return True
        return False
