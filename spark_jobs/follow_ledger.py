"""What the following verifier (`cdc verify --follow`) holds between micro-batches: the
fields of its state (pending events, waiting records, matched events, held XA groups, the
transactions that hold verified-through), its counts and examples, and the latency and lag
figures; with the bookkeeping every rule uses (counting, verified-through, remembering a
matched event). The rules that change it are `spark_jobs/follow_rules.py`; the micro-batch
and the state's files, `spark_jobs/follow_state.py` (`FollowState`).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.mysql.binlog_rows import STATEMENT_FORMAT
from spark_jobs.reconcile_rules import ALL_CLASSES

ALARM_LOG = logging.getLogger("cdc.verify.follow")
MAX_EXAMPLES = 20
LATENCY_SECONDS_KEPT = 3_600  # the latency-over-commit-time plot covers the last hour of commit time
STATE_VERSION = 2  # 2: matched events saved apart, batch by batch
# The follow job's classes: the batch verifier's and `repaired` (a missing event re-published
# by continuous compensation, `--repair`, and then delivered once: proven, not a problem)
FOLLOW_CLASSES = (*ALL_CLASSES, "repaired")


def ikey_hash(ikey: str) -> int:
    return int.from_bytes(hashlib.blake2b(ikey.encode(), digest_size=8).digest(), "little", signed=True)


def order_of(seq: Any, pos: Any, row: Any = 0) -> tuple[int, int, int]:
    return (int(seq), int(pos), int(row))


@dataclass
class FollowLedger:
    """The fields of `FollowState` and the bookkeeping its rules share."""

    source: str
    dlq_topic: str
    grace_s: float = 60.0
    dedupe_window_s: float = 300.0
    partitioner: str = "murmur2"
    unread_topics: tuple[str, ...] = ()
    # the exchange sink's audit stream: its markers name it, its records their own topics;
    # its truncation covers every topic (spark_jobs/reconcile_rules.py `routed_stream`)
    routed_stream: str = ""
    version: int = STATE_VERSION
    batch_id: int = -1
    batches: int = 0
    started_at: float = field(default_factory=time.time)
    start: tuple[str, int, int] | None = None  # (file, seq, pos) where following began
    read_through: tuple[str, int, int] | None = None  # (file, seq, pos) the binlog was read to
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in FOLLOW_CLASSES})
    records: dict[str, int] = field(
        default_factory=lambda: {"foreign": 0, "unidentified": 0, "phantom": 0, "unverifiable": 0}
    )
    unverifiable_reasons: dict[str, int] = field(default_factory=dict)
    # continuous compensation (`--repair`): ikey -> when a repair was asked; what came of them
    repair_asked: dict[str, float] = field(default_factory=dict)
    # repairs handed to the repair path and not yet answered: ikey -> its copy was read
    # meanwhile (`FollowRules._deliver`); in memory only, a restarted job asks again
    _repairing: dict[str, bool] = field(default_factory=dict, repr=False)
    repairs: dict[str, int] = field(
        default_factory=lambda: {"requested": 0, "published": 0, "repaired": 0, "repaired_out_of_order": 0, "failed": 0}
    )
    repair_failures: dict[str, int] = field(default_factory=dict)  # reason -> events
    dlq_causes: dict[str, int] = field(default_factory=dict)
    altered_reasons: dict[str, int] = field(default_factory=dict)
    order_violations: int = 0
    alarms: dict[str, int] = field(default_factory=lambda: {"missing": 0, "duplicate": 0, "phantom": 0})
    late_deliveries: int = 0
    # events read, no delivery yet: ikey -> event dict (+ "seen", "tx")
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    # events that got a verdict and may still get a delivery: ikey -> event (missing / unverifiable)
    open_verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # events matched: h64(ikey) -> (class, deliveries, tx, matched at, order); forgotten
    # after dedupe_window_s. Saved apart, batch by batch (see the module's docstring).
    # Tuples of plain values, so that the garbage collector stops tracking them: a million
    # entries as lists made each of its full collections walk them all.
    done: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    done_buckets: collections.deque = field(default_factory=collections.deque)  # (time, max order, [h64])
    # what this batch added to or changed in `done` (h64s), for its chunk
    _journal: set[int] = field(default_factory=set, repr=False)
    forgotten_through: tuple[int, int, int] | None = None
    # records of ours waiting for the binlog: ikey -> record (+ "seen"). Saved apart like
    # `done` (a job behind the broker holds hundreds of thousands): the ikeys this batch
    # added, changed or removed are `_waiting_changed`, for its chunk
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)
    _waiting_changed: set[str] = field(default_factory=set, repr=False)
    # XA: xid -> held rows of its prepare group; the prepare's transaction key
    xa_held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # transactions in binlog order that still hold unproven events: [seq, pos, file, end, n]
    txq: collections.deque = field(default_factory=collections.deque)
    txmap: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    verified_through: tuple[str, int, int] | None = None  # (file, seq, pos)
    # Kafka: (topic, partition) -> next offset read; partitions first seen above offset 0
    kafka_next: dict[tuple[str, int], int] = field(default_factory=dict)
    truncated: dict[tuple[str, int], Any] = field(default_factory=dict)  # -> order of first record of ours, or None
    partition_last: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    key_max: dict[tuple[str, int, str], tuple[tuple[int, int, int], float]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    latencies: collections.deque = field(default_factory=lambda: collections.deque(maxlen=100_000))
    latency_clocks: dict[str, int] = field(default_factory=dict)  # which clock each latency came from
    # commit second -> (max latency ms, deliveries), the newest LATENCY_SECONDS_KEPT seconds
    latency_by_second: dict[int, tuple[int, int]] = field(default_factory=dict)
    lag_history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4_000))
    heads: collections.deque = field(default_factory=collections.deque)  # ((seq, pos), first seen), ascending

    # -------------------------------------------------------------------- counting

    def _example(self, cls: str, ex: dict[str, Any]) -> None:
        lst = self.examples.setdefault(cls, [])
        if len(lst) < MAX_EXAMPLES:
            lst.append(ex)

    def _count(self, cls: str, delta: int = 1, reason: str | None = None) -> None:
        self.counts[cls] = self.counts.get(cls, 0) + delta
        if cls == "unverifiable" and reason:
            k = f"event:{reason}"
            self.unverifiable_reasons[k] = self.unverifiable_reasons.get(k, 0) + delta

    def _alarm(self, cls: str, text: str) -> None:
        self.alarms[cls] = self.alarms.get(cls, 0) + 1
        ALARM_LOG.warning("ALARM %s: %s", cls, text)

    # ---------------------------------------------------------------- transactions

    def _tx_add(self, ev: Mapping[str, Any]) -> tuple[int, int]:
        return self._tx_at(int(ev["file_seq"]), int(ev["tx_pos"]), ev["file"], ev["tx_end"], ev.get("commit_ts_ms"))

    def _tx_at(self, seq: int, pos: int, file: str, end: Any, commit_ts_ms: Any, n: int = 1) -> tuple[int, int]:
        """One more unproven event in the transaction at (seq, pos)."""
        key = (seq, pos)
        entry = self.txmap.get(key)
        if entry is None:
            entry = [seq, pos, file, int(end), 0, commit_ts_ms]
            self.txmap[key] = entry
            if self.txq and (self.txq[-1][0], self.txq[-1][1]) > key:  # rare: insert in order
                items = sorted([*self.txq, entry], key=lambda e: (e[0], e[1]))
                self.txq = collections.deque(items)
            else:
                self.txq.append(entry)
        entry[4] += n
        return key

    def _tx_proven(self, key: tuple[int, int] | None) -> None:
        if key is None:
            return
        entry = self.txmap.get((key[0], key[1]))
        if entry is not None:
            entry[4] -= 1

    def _advance(self) -> None:
        while self.txq and self.txq[0][4] <= 0:
            e = self.txq.popleft()
            self.txmap.pop((e[0], e[1]), None)
            self.verified_through = (e[2], e[0], e[3])
        if not self.txq and self.read_through is not None:
            self.verified_through = self.read_through

    def _latency(self, stamp: int, commit_us: Any, timestamp_us: Any, commit_ts_ms: Any) -> None:
        """One delivery's latency from the best commit clock the event has: MySQL's commit
        time (microseconds, in the GTID event); else the outbox timestamp column when the
        table has one (microseconds, written at the INSERT: it includes the rest of the
        transaction); else the binlog commit header (1 s)."""
        if commit_us is not None:
            clock, latency = "mysql_immediate_commit_timestamp", stamp - int(commit_us) // 1000
        elif timestamp_us is not None:
            clock, latency = "outbox_timestamp_column", stamp - int(timestamp_us) // 1000
        elif commit_ts_ms is not None:
            clock, latency = "binlog_commit_header", stamp - int(commit_ts_ms)
        else:
            return
        self.latencies.append(latency)
        self.latency_clocks[clock] = self.latency_clocks.get(clock, 0) + 1
        if commit_ts_ms is not None:
            second = int(commit_ts_ms) // 1000
            worst = self.latency_by_second.get(second)
            if worst is None:
                self.latency_by_second[second] = (latency, 1)
                if len(self.latency_by_second) > LATENCY_SECONDS_KEPT:
                    del self.latency_by_second[min(self.latency_by_second)]
            else:
                self.latency_by_second[second] = (max(worst[0], latency), worst[1] + 1)

    def _pending_event(self, ev: dict[str, Any], tx: tuple[int, int], now: float) -> dict[str, Any]:
        ev["seen"] = now
        ev["tx"] = tx
        ev["deliveries"] = []
        return ev

    def _remember(
        self, ikey: str, cls: str, ev: Mapping[str, Any], now: float, deliveries: list[str] | None = None
    ) -> None:
        h = ikey_hash(ikey)
        o = order_of(ev["file_seq"], ev["tx_pos"], ev["row"])
        self.done[h] = (cls, tuple(deliveries or ev.get("deliveries") or ()), ev.get("tx"), now, o)
        self._journal.add(h)
        self._bucket(h, now, o)

    def _bucket(self, h: int, now: float, o: tuple[int, int, int]) -> None:
        if self.done_buckets and now - self.done_buckets[-1][0] < 5.0:
            b = self.done_buckets[-1]
            b[2].append(h)
            if o > b[1]:
                b[1] = o
        else:
            self.done_buckets.append([now, o, [h]])

    # ------------------------------------------------------------------ figures

    def observe_head(self, head: tuple[str, int, int], now: float | None = None) -> float:
        """Record the server's binlog end; the verified-through lag in seconds: how long
        the head has been beyond verified-through (0 when verified-through is the head),
        at least the age of the oldest unproven event's commit."""
        now = time.time() if now is None else now
        hk = (int(head[1]), int(head[2]))
        if not self.heads or self.heads[-1][0] < hk:
            self.heads.append((hk, now))
        vt = (self.verified_through[1], self.verified_through[2]) if self.verified_through else None
        while self.heads and vt is not None and self.heads[0][0] <= vt:
            self.heads.popleft()
        lag = now - self.heads[0][1] if self.heads else 0.0
        if self.txq and self.txq[0][5]:
            lag = max(lag, now - self.txq[0][5] / 1000.0)
        lag = max(0.0, lag)
        self.lag_history.append((now, round(lag, 3)))
        return lag

    def problems(self) -> dict[str, int]:
        out = {
            c: self.counts.get(c, 0)
            for c in ("missing", "duplicate", "phantom", "reordered", "altered")
            if self.counts.get(c, 0)
        }
        if self.unverifiable_reasons.get(f"event:{STATEMENT_FORMAT}"):
            out[STATEMENT_FORMAT] = self.unverifiable_reasons[f"event:{STATEMENT_FORMAT}"]
        return out


def delivery_of(where: str) -> dict[str, Any]:
    """`topic[partition]@offset` as the report's delivery dict."""
    head, _, offset = where.rpartition("@")
    topic, _, part = head[:-1].rpartition("[")
    return {"topic": topic, "partition": int(part), "offset": int(offset)}


def position_text(point: tuple[str, int, int] | None) -> str:
    return f"{point[0]}:{point[2]}" if point is not None else "nothing yet"


def event_example(ev: Mapping[str, Any], cls: str, reason: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "class": cls,
        "binlog": {"file": ev.get("file"), "pos": ev.get("tx_pos"), "row": ev.get("row"), "gtid": ev.get("gtid"),
                   "tx_end": ev.get("tx_end"), "commit_ts_ms": ev.get("commit_ts_ms")},
        "event_id": ev.get("event_id"), "aggregate_type": ev.get("aggregate_type"), "aggregate_id": ev.get("aggregate_id"),
        "event_type": ev.get("event_type"), "expected_topic": ev.get("expected_topic"), "expected_dlq_cause": ev.get("dlq_cause"),
        "deliveries": [],
    }  # fmt: skip
    if reason:
        out["unverifiable_reason"] = reason
    return out
