"""The relay's counters and gauges, as plain numbers the loop updates in place.

`connectors/http_endpoint.py` exposes them in Prometheus text format; tests and the demo
read them directly. Only the relay thread writes; readers see plain ints and floats.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RelayMetrics:
    events_published: int = 0  # acknowledged by Kafka
    bytes_published: int = 0
    events_skipped_recovery: int = 0  # proven delivered before a restart, not re-sent
    dead_lettered: Counter = field(default_factory=Counter)  # cause -> count
    delivery_errors: int = 0
    transactions: int = 0  # committed transactions read (with or without outbox rows)
    outbox_changes_ignored: int = 0  # UPDATE/DELETE on outbox tables
    rows_discarded: int = 0  # rolled back, or cut by a stream that ended mid-transaction
    reconnects: int = 0
    last_commit_ts: float = 0.0  # commit time of the newest transaction read
    caught_up: bool = False  # the last read returned nothing new
    read_file: str = ""
    read_pos: int = 0
    checkpoint_written_at: float = 0.0
    checkpoint_file: str = ""
    checkpoint_pos: int = 0
    server_end_bytes_behind: int | None = None  # set by the connector that asks the server
    ready: bool = False  # streaming, or (a standby) ready to take over
    role: str = "active"  # active | standby (waiting for the lease) | taking over (waiting before publishing)
    lease_held: bool = False
    lease_epoch: int = 0
    lease_confirmed_at: float = 0.0  # wall-clock time of the last lease confirmation
    xa_undecided: int = 0  # XA transactions prepared, outcome not read (held, never published)
    xa_oldest_undecided_age_s: float = 0.0  # since the oldest one's prepare
    xa_problems: list = field(default_factory=list)  # one line each past xa.max_checks: an operator problem

    def lag_seconds(self, now: float) -> float:
        if self.caught_up or not self.last_commit_ts:
            return 0.0
        return max(0.0, now - self.last_commit_ts)

    def lease_confirmed_age(self, now: float) -> float | None:
        return None if not self.lease_confirmed_at else max(0.0, now - self.lease_confirmed_at)

    def checkpoint_age(self, now: float) -> float | None:
        return None if not self.checkpoint_written_at else max(0.0, now - self.checkpoint_written_at)

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())
