"""What a reconciliation calls each side, and the rules both implementations share: the
classes of events and records, the `ReconcileContext` of a run, why a delivery differs from
its event (`record_reasons`), and why an event without a delivery cannot be proven missing
(`event_unverifiable`, with `truncation_thresholds`). Pure Python: the Spark implementation
(`spark_jobs/reconcile.py`, whose docstring states the rules), the pure-python reference
(`spark_jobs/reconcile_reference.py`) and the following verifier (`spark_jobs/follow_state.py`)
use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc.events.formats import expected_timestamp_ms, payload_matches
from spark_jobs.common import murmur2_partition
from spark_jobs.mysql.binlog_rows import STATEMENT_FORMAT

EVENT_CLASSES = ("delivered", "missing", "duplicate", "reordered", "altered", "dead_lettered", "unverifiable")
RECORD_CLASSES = ("phantom", "unverifiable", "foreign", "unidentified")
PROBLEM_CLASSES = ("missing", "duplicate", "phantom", "reordered", "altered")
PROVEN_CLASSES = ("delivered", "reordered", "duplicate", "dead_lettered")
ALL_CLASSES = ("delivered", "missing", "duplicate", "phantom", "reordered", "altered", "dead_lettered", "unverifiable")
# unverifiable reasons that still make the run fail: the binlog holds a committed outbox
# write the verifier cannot check (a statement-logged insert: no row image)
BLOCKING_UNVERIFIABLE = (STATEMENT_FORMAT,)
XA_UNDECIDED = "xa_undecided"


@dataclass(frozen=True)
class ReconcileContext:
    source: str
    dlq_topic: str
    range_start: tuple[str, int, int]  # (file, file_seq, pos): first position verified
    range_end: tuple[str, int, int]  # (file, file_seq, pos): end of the verified range (exclusive)
    partitions: tuple[tuple[str, int, int, int], ...] = ()  # (topic, partition, low, high)
    partition_counts: Mapping[str, int] = field(default_factory=dict)
    unread_topics: tuple[str, ...] = ()  # expected topics that were not read
    partitioner: str = "murmur2"  # or "unknown"
    # the binlog rows hold XA prepare groups or outcomes (False: resolve_xa is skipped;
    # the verify job knows it from the read, other callers leave it True)
    has_xa: bool = True
    # some outbox table is written in a payload format (cdc/events/formats.py): its records' content
    # is checked by `payload_matches` (a Python function in Spark; False: never evaluated)
    payload_formats: bool = False
    # the exchange sink's audit stream (`partitions` holds it alone): every record read is of
    # it, whatever topic its routing key names, so its truncation covers every topic
    routed_stream: str = ""

    def truncated(self) -> list[tuple[str, int, int]]:
        return [(t, p, low) for t, p, low, _high in self.partitions if low > 0]


def record_reasons(rec: Mapping[str, Any], ev: Mapping[str, Any], dlq_topic: str) -> list[str]:
    """Why a delivery does not match its binlog event (empty when it does)."""
    reasons: list[str] = []
    is_dlq = rec["topic"] == dlq_topic
    if not is_dlq:
        if ev.get("expected_topic") is not None and rec["topic"] != ev["expected_topic"]:
            reasons.append("topic")
        if rec.get("key_text") != ev.get("aggregate_id"):
            reasons.append("key")
        fmt = rec.get("v_format")
        if fmt is not None and rec.get("value_error") is None:  # a payload format (cdc/events/formats.py)
            if rec.get("v_id") != ev.get("event_id"):
                reasons.append("id")
            if rec.get("v_type") != ev.get("event_type"):
                reasons.append("type")
            if not payload_matches(fmt, rec.get("v_payload"), ev.get("payload"), ev.get("payload_is_text")):
                reasons.append("payload")
            if rec.get("timestamp_ms") != expected_timestamp_ms(ev.get("timestamp_us"), ev.get("commit_ts_ms")):
                reasons.append("timestamp")
        elif rec.get("value_error") is None:
            if rec.get("v_id") != ev.get("event_id") or (
                rec.get("h_event_id") is not None and rec.get("h_event_id") != ev.get("event_id")
            ):
                reasons.append("id")
            if rec.get("v_aggregate_type") != ev.get("aggregate_type"):
                reasons.append("aggregate_type")
            if rec.get("v_aggregate_id") != ev.get("aggregate_id"):
                reasons.append("aggregate_id")
            if rec.get("v_type") != ev.get("event_type") or (
                rec.get("h_event_type") is not None and rec.get("h_event_type") != ev.get("event_type")
            ):
                reasons.append("type")
            if rec.get("v_payload") != ev.get("payload"):
                reasons.append("payload")
            if rec.get("v_timestamp_us") != ev.get("timestamp_us"):
                reasons.append("timestamp")
    if rec.get("h_commit_ts") is not None and rec.get("h_commit_ts") != ev.get("commit_ts_ms"):
        reasons.append("commit_ts")
    if rec.get("value_error") is not None:
        reasons.append("value")
    return reasons


def event_order(ev: Mapping[str, Any]) -> tuple[int, int, int]:
    return (ev["file_seq"], ev["tx_pos"], ev["row"])


def header_order(rec: Mapping[str, Any]) -> tuple[int, int, int] | None:
    if rec.get("h_file_seq") is None or rec.get("h_pos") is None or rec.get("h_row") is None:
        return None
    return (rec["h_file_seq"], rec["h_pos"], rec["h_row"])


def truncation_thresholds(
    records: Iterable[Mapping[str, Any]], ctx: ReconcileContext
) -> dict[tuple[str, int], tuple | None]:
    """For every partition whose low watermark is above 0: the binlog order of its first
    retained record of ours (None when it holds none). The audit stream (`routed_stream`):
    every record is one of its own, at its offset."""
    trunc: dict[tuple[str, int], tuple[Any, ...] | None] = {(t, p): None for t, p, _low in ctx.truncated()}
    best: dict[tuple[str, int], tuple[int, tuple]] = {}
    routed = (ctx.routed_stream, 0) if (ctx.routed_stream, 0) in trunc else None
    for rec in records:
        tp = routed or (rec["topic"], rec["partition"])
        if tp not in trunc:
            continue
        o = header_order(rec)
        if o is None or rec.get("source") != ctx.source:
            continue
        if tp not in best or rec["offset"] < best[tp][0]:
            best[tp] = (rec["offset"], o)
    for tp, (_off, o) in best.items():
        trunc[tp] = o
    return trunc


def event_unverifiable(
    ev: Mapping[str, Any], ctx: ReconcileContext, thresholds: Mapping[tuple[str, int], tuple | None]
) -> str | None:
    """Why an event without any delivery cannot be called missing (None: it is missing)."""
    loc = ctx.dlq_topic if ev.get("dlq_cause") else ev.get("expected_topic")
    if loc in ctx.unread_topics:
        return "topic_not_read"
    o = event_order(ev)
    count = ctx.partition_counts.get(loc or "")
    pred = murmur2_partition(ev.get("aggregate_id"), count) if (ctx.partitioner == "murmur2" and count) else None
    for (topic, part), thr in thresholds.items():
        if (topic in (ctx.dlq_topic, ctx.routed_stream) or (topic == loc and (pred is None or pred == part))) and (
            thr is None or o < thr
        ):
            return "partition_truncated"
    return None
