"""The relay's counters and gauges, as plain numbers the loop updates in place.

`connectors/http_endpoint.py` exposes them in Prometheus text format; tests and the demo
read them directly. Only the relay thread writes; readers see plain ints and floats.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc.events.outbox import DEAD_LETTER_CAUSES

# Commit -> acknowledgement, in seconds. The commit time is the binlog event's, which
# has whole seconds: a latency is up to 1 s longer than the true one, hence no finer buckets.
COMMIT_TO_ACK_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class Histogram:
    """Observations counted per bucket (Prometheus semantics: `le` upper bounds)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # one per bound, then one for +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations at or below it), +Inf last."""
        out, running = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class RelayMetrics:
    events_published: int = 0  # acknowledged by Kafka
    bytes_published: int = 0
    events_skipped_recovery: int = 0  # proven delivered before a restart, not re-sent
    republished_unlocated: int = 0  # acknowledged without an offset, not in its partition: published again
    # cause -> count; every cause there from the start (an alert on a rate needs the series)
    dead_lettered: Counter = field(default_factory=lambda: Counter({c: 0 for c in DEAD_LETTER_CAUSES}))
    delivery_errors: int = 0
    delivery_error_causes: Counter = field(default_factory=Counter)  # librdkafka error name -> count
    transactions: int = 0  # committed transactions read (with or without outbox rows)
    outbox_changes_ignored: int = 0  # UPDATE/DELETE on outbox tables
    rows_discarded: int = 0  # rolled back, or cut by a stream that ended mid-transaction
    reconnects: int = 0
    # per transaction with messages: its commit -> its last message acknowledged by Kafka
    commit_to_ack: Histogram = field(default_factory=lambda: Histogram(COMMIT_TO_ACK_BUCKETS_S))
    last_commit_ts: float = 0.0  # commit time of the newest transaction read
    caught_up: bool = False  # the last read returned nothing new
    read_file: str = ""
    read_pos: int = 0
    # since when the checkpoint has not covered everything read (0: it does): the oldest
    # transaction handed over after it; an idle, up-to-date relay's is 0
    checkpoint_behind_since: float = 0.0
    # the oldest message handed to Kafka and not acknowledged: a function the relay sets
    # (wall-clock time it was handed over, or None), read when the metrics are read
    unacknowledged_since: Callable[[], float | None] = lambda: None
    max_unacknowledged_age_s: float = 30.0  # older than this: /readyz says not ready, with the reason
    kafka_reachable: bool = True
    kafka_brokers_up: int | None = None  # None: not known yet
    kafka_unreachable_since: float = 0.0
    kafka_outages: int = 0
    kafka_waiting_since: float = 0.0  # the relay waits for a metadata answer it cannot go on without
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

    def checkpoint_age(self, now: float) -> float:
        """Seconds the checkpoint has lagged what was read (0 while it covers everything)."""
        return 0.0 if not self.checkpoint_behind_since else max(0.0, now - self.checkpoint_behind_since)

    def unacknowledged_age(self, now: float) -> float:
        since = self.unacknowledged_since()
        return 0.0 if since is None else max(0.0, now - since)

    def readiness(self, now: float) -> tuple[bool, list[str]]:
        """(ready, reasons when not): streaming (or a standby ready to take over), and no
        message waiting for Kafka longer than `max_unacknowledged_age_s`."""
        if not self.ready:
            return False, [f"not streaming ({self.role})"]
        if self.kafka_waiting_since and now - self.kafka_waiting_since > self.max_unacknowledged_age_s:
            return False, [
                f"waiting {now - self.kafka_waiting_since:.0f} s for Kafka to answer a metadata request "
                f"(bound relay.max_unacknowledged_age_s = {self.max_unacknowledged_age_s:g})"
            ]
        age = self.unacknowledged_age(now)
        if age > self.max_unacknowledged_age_s:
            why = "" if self.kafka_reachable else f"; Kafka unreachable for {now - self.kafka_unreachable_since:.0f} s"
            return False, [
                f"the oldest unacknowledged message was handed to Kafka {age:.0f} s ago (bound "
                f"relay.max_unacknowledged_age_s = {self.max_unacknowledged_age_s:g}){why}"
            ]
        return True, []

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())
