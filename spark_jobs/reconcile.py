"""Reconciliation: every committed outbox event of the binlog against every record of the
topics, joined on the identity key, and each side classified.

Inputs: the rows of `cdc_binlog` (one per committed outbox insert, plus XA prepare rows
and outcome markers) and the decoded records of `cdc_kafka` (`decode=true`), plus a
`ReconcileContext` (source name, the verified binlog range, the watermarks of every
partition read).

XA first (`resolve_xa`, Spark; `resolve_xa_rows`, the reference): the binlog is read in
byte ranges in parallel, so the rows of a prepare group and the XA COMMIT / XA ROLLBACK
that decides them are usually read by different tasks, maybe from different files. The
readers only tag (rows with their xid, one marker per outcome); the pairing is done here,
over the whole read, before anything is joined: per xid, in binlog order, a prepare's
outcome is the next row of that xid (an xid is busy from prepare to outcome). Committed:
each row becomes an event at the COMMIT's place, with the commit group's identity
(file/pos/GTID/commit time; `row` stays its index in the prepare group), exactly as the
relay's headers carry it - so binlog order, the key-order check and verified_through all
use the commit position. Rolled back: nothing. No outcome in the range: `xa_undecided`
(below). Joining in Spark rather than carrying prepared rows from task to task keeps the
partitions independent and is correct whatever the cut points.

The rules (the same in the Spark implementation `reconcile()` and in the pure-python
reference `reconcile_reference()`, which the unit tests hold against each other):

Records: a record "of ours" carries identity headers (`cdc.source`, `cdc.binlog.row` and
a GTID or file+pos) with our source name; every other record is `foreign` (another
source) or `unidentified` (no identity headers) and is only counted. A record of ours
whose identity key is an event of the binlog is a *delivery* of that event (records with
`cdc.repair` and dead-letter records included). A record of ours that matches no event is
    - `unverifiable` when its header position lies before the verified binlog range
      (reason `before_binlog_range`: the binlog there is purged or was not asked for) -
      also when it is an XA event (`cdc.xa.prepare`) whose prepare group does - or
      at/after its end (`after_verified_range`: committed after the snapshot);
    - `phantom` otherwise: the binlog does not hold it as a committed outbox insert.

Events: an XA transaction prepared in the range and undecided at its end is
`unverifiable` (`xa_undecided`): never missing (the relay never publishes it while
undecided), never matched (its key is one no record carries); its place is its prepare
group's, so verified_through stops before it. A statement-logged outbox insert
(`dlq_cause = statement_format`) is `unverifiable` (`statement_format`) with 0 or 1
deliveries - its dead letter is its delivery, not a phantom - and `duplicate` with more;
the report fails while one exists (report.py). Otherwise, with n deliveries,
    - n == 0: `missing`, unless it cannot be proven absent: its expected topic was not
      read (`topic_not_read`), or the partition it belongs to (murmur2 of the key when the
      partitioner is known, else any partition of the topic), or any partition of the
      dead-letter topic, has a low watermark above 0 and its first retained record comes
      after the event in binlog order (`partition_truncated`) - then `unverifiable`.
    - n >= 2: `duplicate` (all offsets listed).
    - n == 1 in the dead-letter topic: `dead_lettered` (with its cause).
    - n == 1 whose content differs from the binlog row: `altered` (reasons among topic,
      key, id, aggregate_type, aggregate_id, type, payload, timestamp, commit_ts, value).
    - n == 1 that comes, in its partition, after a record of the same key with a later
      binlog position: `reordered` (only the first copy of each event in a partition and
      no repair or dead-letter record take part in the order check).
    - else `delivered`.
Partition order: in each partition, the header positions (file, pos, row) of our
non-repair records never go backwards as offsets grow; every record that does is listed
in `order_violations` (a warning: a late duplicate or a reorder across keys).

`verified_through`: the end position of the last transaction such that it and every
event before it are proven delivered or dead-lettered (classes delivered, reordered,
duplicate, dead_lettered); when nothing is unproven, the end of the verified range.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.events.formats import expected_timestamp_ms, payload_matches
from spark_jobs.common import KEY_SEP, identity_key, murmur2_partition
from spark_jobs.mysql.binlog_rows import (
    KIND_EVENT,
    KIND_XA_COMMIT,
    KIND_XA_EVENT,
    KIND_XA_ROLLBACK,
    KIND_XA_ROW,
    KIND_XA_UNDECIDED,
    STATEMENT_FORMAT,
)

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

    def truncated(self) -> list[tuple[str, int, int]]:
        return [(t, p, low) for t, p, low, _high in self.partitions if low > 0]


# =============================================================================
# pure-python reference
# =============================================================================


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


def _ord_event(ev: Mapping[str, Any]) -> tuple[int, int, int]:
    return (ev["file_seq"], ev["tx_pos"], ev["row"])


def _ord_header(rec: Mapping[str, Any]) -> tuple[int, int, int] | None:
    if rec.get("h_file_seq") is None or rec.get("h_pos") is None or rec.get("h_row") is None:
        return None
    return (rec["h_file_seq"], rec["h_pos"], rec["h_row"])


@dataclass
class ReferenceResult:
    event_class: dict[str, str]  # ikey -> class
    event_reasons: dict[str, list[str]]
    event_unverifiable_reason: dict[str, str]
    deliveries: dict[str, list[tuple[str, int, int]]]  # ikey -> [(topic, partition, offset)]
    record_class: dict[tuple[str, int, int], tuple[str, str | None]]  # (t, p, o) -> (class, reason)
    order_violations: set[tuple[str, int, int]]
    verified_through: tuple[str, int] | None
    first_unproven: tuple[str, int, int] | None
    latencies: dict[str, int]

    def counts(self) -> dict[str, int]:
        out = {c: 0 for c in ALL_CLASSES}
        for c in self.event_class.values():
            out[c] += 1
        for c, _ in self.record_class.values():
            if c in ("phantom", "unverifiable"):
                out[c] += 1
        return out


def truncation_thresholds(
    records: Iterable[Mapping[str, Any]], ctx: ReconcileContext
) -> dict[tuple[str, int], tuple | None]:
    """For every partition whose low watermark is above 0: the binlog order of its first
    retained record of ours (None when it holds none)."""
    trunc: dict[tuple[str, int], tuple[Any, ...] | None] = {(t, p): None for t, p, _low in ctx.truncated()}
    best: dict[tuple[str, int], tuple[int, tuple]] = {}
    for rec in records:
        tp = (rec["topic"], rec["partition"])
        if tp not in trunc:
            continue
        o = _ord_header(rec)
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
    o = _ord_event(ev)
    count = ctx.partition_counts.get(loc or "")
    pred = murmur2_partition(ev.get("aggregate_id"), count) if (ctx.partitioner == "murmur2" and count) else None
    for (topic, part), thr in thresholds.items():
        if (topic == ctx.dlq_topic or (topic == loc and (pred is None or pred == part))) and (thr is None or o < thr):
            return "partition_truncated"
    return None


def _before(seq: Any, pos: Any, start: tuple[int, int]) -> bool:
    return seq is not None and pos is not None and (seq, pos) < start


def resolve_xa_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events of the binlog rows (the pure-python `resolve_xa`): ordinary events as
    they are; each row of an XA prepare group paired with the next outcome of its xid in
    binlog order (an xid is busy from its prepare to its outcome, so that outcome is
    its own): after an XA COMMIT it is an event at the commit's place with the commit
    group's identity (`xa_event`); after an XA ROLLBACK nothing; with no outcome in the
    range it is `xa_undecided` at the prepare's place, under a key no record carries.
    Outcome markers and anomaly rows are not events."""
    out: list[dict[str, Any]] = []
    timeline: dict[str, list[tuple[int, int, str, Mapping[str, Any] | None]]] = {}
    held: list[Mapping[str, Any]] = []
    seen: set[tuple[str, int, int]] = set()
    for r in rows:
        kind = r.get("kind") or KIND_EVENT
        if kind == KIND_EVENT:
            if r.get("ikey") is not None:
                out.append(dict(r))
        elif kind == KIND_XA_ROW:
            held.append(r)
            k = (r["xa_xid"], r["file_seq"], r["tx_pos"])
            if k not in seen:
                seen.add(k)
                timeline.setdefault(r["xa_xid"], []).append((r["file_seq"], r["tx_pos"], "p", None))
        elif kind in (KIND_XA_COMMIT, KIND_XA_ROLLBACK):
            timeline.setdefault(r["xa_xid"], []).append((r["file_seq"], r["tx_pos"], kind, r))
    outcome: dict[tuple[str, int, int], Mapping[str, Any] | None] = {}
    for xid, items in timeline.items():
        items.sort(key=lambda t: (t[0], t[1]))
        for i, (seq, pos, kind, _m) in enumerate(items):
            if kind == "p":
                nxt = items[i + 1] if i + 1 < len(items) else None
                outcome[(xid, seq, pos)] = nxt[3] if nxt is not None and nxt[2] != "p" else None
    for r in held:
        m = outcome.get((r["xa_xid"], r["file_seq"], r["tx_pos"]))
        e = dict(r)
        if m is None:
            e["kind"] = KIND_XA_UNDECIDED
            e["ikey"] = KEY_SEP.join(("x", str(r["source"]), str(r["file"]), str(r["tx_pos"]), str(r["row"])))
        elif m["kind"] == KIND_XA_COMMIT:
            for c in ("file", "file_seq", "tx_pos", "tx_end", "gtid", "commit_ts_ms", "commit_us", "server_id"):
                e[c] = m.get(c)
            e["kind"] = KIND_XA_EVENT
            e["ikey"] = identity_key(r["source"], m["gtid"], m["file"], m["tx_pos"], r["row"])
        else:
            continue  # rolled back
        out.append(e)
    return out


def reconcile_reference(
    events: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], ctx: ReconcileContext
) -> ReferenceResult:
    """`events`: the binlog rows (cdc_binlog), XA rows and markers included."""
    events = resolve_xa_rows(events)
    by_key = {e["ikey"]: e for e in events}
    ours = [r for r in records if r.get("ikey") is not None and r.get("source") == ctx.source]
    record_class: dict[tuple[str, int, int], tuple[str, str | None]] = {}
    for r in records:
        rid = (r["topic"], r["partition"], r["offset"])
        if r.get("ikey") is None:
            record_class[rid] = ("unidentified", None)
        elif r.get("source") != ctx.source:
            record_class[rid] = ("foreign", None)
    matches: dict[str, list[Mapping[str, Any]]] = {}
    s_seq, s_pos = ctx.range_start[1], ctx.range_start[2]
    e_seq, e_pos = ctx.range_end[1], ctx.range_end[2]
    for r in ours:
        rid = (r["topic"], r["partition"], r["offset"])
        if r["ikey"] in by_key:
            matches.setdefault(r["ikey"], []).append(r)
            continue
        if r.get("h_file_seq") is None or r.get("h_pos") is None:
            record_class[rid] = ("phantom", None)
        elif (r["h_file_seq"], r["h_pos"]) < (s_seq, s_pos) or _before(
            r.get("h_xa_file_seq"), r.get("h_xa_pos"), (s_seq, s_pos)
        ):
            # an XA commit in range whose prepare (its rows) lies before it: unverifiable too
            record_class[rid] = ("unverifiable", "before_binlog_range")
        elif (r["h_file_seq"], r["h_pos"]) >= (e_seq, e_pos):
            record_class[rid] = ("unverifiable", "after_verified_range")
        else:
            record_class[rid] = ("phantom", None)

    # key order: first copy of each event per partition, no repair / dead-letter records
    reordered: set[str] = set()
    by_partition_key: dict[tuple[str, int, str | None], list[Mapping[str, Any]]] = {}
    seen: set[tuple[str, str, int]] = set()
    for r in sorted(
        (r for rs in matches.values() for r in rs), key=lambda r: (r["topic"], r["partition"], r["offset"])
    ):
        if r.get("repair") or r["topic"] == ctx.dlq_topic:
            continue
        k = (r["ikey"], r["topic"], r["partition"])
        if k in seen:
            continue
        seen.add(k)
        by_partition_key.setdefault((r["topic"], r["partition"], r.get("key_text")), []).append(r)
    for rs in by_partition_key.values():
        running: tuple | None = None
        for r in rs:
            o = _ord_event(by_key[r["ikey"]])
            if running is not None and o < running:
                reordered.add(r["ikey"])
            running = o if running is None else max(running, o)

    # partition order of header positions
    violations: set[tuple[str, int, int]] = set()
    per_partition: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in ours:
        if not r.get("repair") and _ord_header(r) is not None:
            per_partition.setdefault((r["topic"], r["partition"]), []).append(r)
    for rs in per_partition.values():
        running = None
        for r in sorted(rs, key=lambda r: r["offset"]):
            at = _ord_header(r)
            if at is None:  # kept out of per_partition above
                continue
            if running is not None and at < running:
                violations.add((r["topic"], r["partition"], r["offset"]))
            running = at if running is None else max(running, at)

    thresholds = truncation_thresholds(records, ctx)
    event_class: dict[str, str] = {}
    event_reasons: dict[str, list[str]] = {}
    event_unv: dict[str, str] = {}
    deliveries: dict[str, list[tuple[str, int, int]]] = {}
    latencies: dict[str, int] = {}
    for e in events:
        k = e["ikey"]
        ms = sorted(matches.get(k, []), key=lambda r: (r["topic"], r["partition"], r["offset"]))
        deliveries[k] = [(r["topic"], r["partition"], r["offset"]) for r in ms]
        stamps = [r["timestamp_ms"] for r in ms if not r.get("repair") and r.get("timestamp_ms") is not None]
        if stamps:
            latencies[k] = min(stamps) - commit_ms_of(e)
        if e.get("kind") == KIND_XA_UNDECIDED:
            event_class[k] = "unverifiable"
            event_unv[k] = XA_UNDECIDED
            continue
        if e.get("dlq_cause") == STATEMENT_FORMAT and len(ms) < 2:
            if ms:
                event_reasons[k] = record_reasons(ms[0], e, ctx.dlq_topic)
            event_class[k] = "unverifiable"
            event_unv[k] = STATEMENT_FORMAT
            continue
        if not ms:
            why = event_unverifiable(e, ctx, thresholds)
            if why:
                event_class[k] = "unverifiable"
                event_unv[k] = why
            else:
                event_class[k] = "missing"
            continue
        if len(ms) >= 2:
            event_class[k] = "duplicate"
            continue
        r = ms[0]
        reasons = record_reasons(r, e, ctx.dlq_topic)
        event_reasons[k] = reasons
        if r["topic"] == ctx.dlq_topic:
            event_class[k] = "dead_lettered"
        elif reasons:
            event_class[k] = "altered"
        elif k in reordered:
            event_class[k] = "reordered"
        else:
            event_class[k] = "delivered"

    verified_through, first_unproven = _verified_through_ref(events, event_class, ctx)
    return ReferenceResult(
        event_class,
        event_reasons,
        event_unv,
        deliveries,
        record_class,
        violations,
        verified_through,
        first_unproven,
        latencies,
    )


def _verified_through_ref(
    events: Sequence[Mapping[str, Any]], event_class: Mapping[str, str], ctx: ReconcileContext
) -> tuple[tuple[str, int] | None, tuple[str, int, int] | None]:
    bad = [e for e in events if event_class[e["ikey"]] not in PROVEN_CLASSES]
    if not bad:
        return (ctx.range_end[0], ctx.range_end[2]), None
    first = min(bad, key=_ord_event)
    before = [e for e in events if (e["file_seq"], e["tx_pos"]) < (first["file_seq"], first["tx_pos"])]
    if not before:
        return (ctx.range_start[0], ctx.range_start[2]), (first["file"], first["tx_pos"], first["row"])
    last = max(before, key=_ord_event)
    return (last["file"], last["tx_end"]), (first["file"], first["tx_pos"], first["row"])


# =============================================================================
# Spark implementation
# =============================================================================

EVENT_COLUMNS = (
    "ikey", "source", "server_id", "file", "file_seq", "tx_pos", "tx_end", "row", "gtid", "commit_ts_ms", "table",
    "event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "payload_is_text", "timestamp_us",
    "expected_topic", "dlq_cause", "dlq_error", "kind", "xa_prepare", "commit_us",
)  # fmt: skip


def commit_ms_of(e: Mapping[str, Any]) -> int:
    """`commit_ms` of one event (the reference)."""
    if e.get("commit_us") is not None:
        return int(e["commit_us"]) // 1000
    if e.get("timestamp_us") is not None:
        return int(e["timestamp_us"]) // 1000
    return int(e["commit_ts_ms"])


def commit_ms(col: Any) -> Any:
    """The commit time a latency is measured from (ms): MySQL's immediate_commit_timestamp,
    else the outbox timestamp column, else the commit event header."""
    from pyspark.sql import functions as F

    return F.coalesce(F.floor(col("commit_us") / 1000), F.floor(col("timestamp_us") / 1000), col("commit_ts_ms"))


def resolve_xa(rows: Any) -> Any:
    """The events of the cdc_binlog rows (Spark; the rule of `resolve_xa_rows`).

    The binlog is read in byte ranges in parallel, so an XA transaction's prepare group
    (its rows) and its outcome group (XA COMMIT / XA ROLLBACK, maybe files later) are
    often read by different tasks. Each task therefore only tags: the rows of a prepare
    group come out as `xa_row` (xid, prepare position), each outcome as one marker row.
    Here, per xid, the prepares and outcomes are put in binlog order with one window
    (a small set: only XA groups), each prepare takes the row after it (`lead`): its
    outcome when that is a marker, else it is undecided in the range; the held rows are
    joined to that and become events at the commit's place (`xa_event`, the commit
    group's identity), disappear (rollback), or are `xa_undecided` (a key no record
    carries; their place is the prepare's, so verified_through stops before it)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col = F.col
    kind = F.coalesce(col("kind"), F.lit(KIND_EVENT))
    columns = rows.columns
    plain = rows.filter(kind == KIND_EVENT)
    held = rows.filter(kind == KIND_XA_ROW)
    outcome_cols = ("file", "file_seq", "tx_pos", "tx_end", "gtid", "commit_ts_ms", "commit_us", "server_id")
    prepares = held.select("xa_xid", "file_seq", "tx_pos").distinct().withColumn("_k", F.lit("p"))
    outcomes = rows.filter(kind.isin(KIND_XA_COMMIT, KIND_XA_ROLLBACK)).select(
        "xa_xid", "file_seq", "tx_pos", col("kind").alias("_k"), F.struct(*outcome_cols).alias("_o")
    )
    by_xid = Window.partitionBy("xa_xid").orderBy("file_seq", "tx_pos")
    paired = (
        prepares.unionByName(outcomes, allowMissingColumns=True)
        .withColumn("_n_k", F.lead("_k").over(by_xid))
        .withColumn("_n_o", F.lead("_o").over(by_xid))
        .filter(col("_k") == "p")
        .select(
            col("xa_xid").alias("_p_xid"),
            col("file_seq").alias("_p_seq"),
            col("tx_pos").alias("_p_pos"),
            "_n_k",
            "_n_o",
        )
    )
    j = held.join(
        paired,
        (col("xa_xid") == col("_p_xid")) & (col("file_seq") == col("_p_seq")) & (col("tx_pos") == col("_p_pos")),
        "left",
    )
    row_text = col("row").cast("string")
    committed = j.filter(col("_n_k") == KIND_XA_COMMIT)
    for c in outcome_cols:
        committed = committed.withColumn(c, col("_n_o")[c])
    committed = committed.withColumn("kind", F.lit(KIND_XA_EVENT)).withColumn(
        "ikey",
        F.when(
            col("gtid").isNotNull() & (col("gtid") != ""),
            F.concat_ws(KEY_SEP, F.lit("g"), col("source"), col("gtid"), row_text),
        ).otherwise(
            F.concat_ws(KEY_SEP, F.lit("p"), col("source"), col("file"), col("tx_pos").cast("string"), row_text)
        ),
    )
    undecided = (
        j.filter(col("_n_k").isNull() | (col("_n_k") == "p"))
        .withColumn("kind", F.lit(KIND_XA_UNDECIDED))
        .withColumn(
            "ikey", F.concat_ws(KEY_SEP, F.lit("x"), col("source"), col("file"), col("tx_pos").cast("string"), row_text)
        )
    )
    return plain.unionByName(committed.select(*columns)).unionByName(undecided.select(*columns))


@dataclass
class Reconciled:
    """The classified sides (computed from persisted intermediates): `events` (one row per binlog event: class,
    reasons, deliveries, latency_ms ...), `records` (records of ours that match no event,
    and foreign / unidentified records: class, reason), `violations` (partition order)."""

    events: Any
    records: Any
    violations: Any
    ctx: ReconcileContext
    joined: Any = None
    side: tuple = ()  # further persisted intermediates

    def unpersist(self) -> None:
        for df in (self.events, self.records, self.violations, self.joined, *self.side):
            if df is None:
                continue
            try:
                df.unpersist()
            except Exception:
                pass


def _spark_thresholds(records: Any, ctx: ReconcileContext) -> dict[tuple[str, int], tuple | None]:
    from pyspark.sql import functions as F

    trunc = ctx.truncated()
    if not trunc:
        return {}
    out: dict[tuple[str, int], tuple | None] = {(t, p): None for t, p, _ in trunc}
    cond: Any = None
    for t, p, _ in trunc:
        c = (F.col("topic") == t) & (F.col("partition") == p)
        cond = c if cond is None else (cond | c)
    rows = (
        records.filter(
            cond
            & (F.col("source") == ctx.source)
            & F.col("h_file_seq").isNotNull()
            & F.col("h_pos").isNotNull()
            & F.col("h_row").isNotNull()
        )
        .groupBy("topic", "partition")
        .agg(F.min_by(F.struct("h_file_seq", "h_pos", "h_row"), F.col("offset")).alias("first"))
        .collect()
    )
    for r in rows:
        out[(r["topic"], r["partition"])] = (r["first"]["h_file_seq"], r["first"]["h_pos"], r["first"]["h_row"])
    return out


def _lt(a_seq: Any, a_pos: Any, a_row: Any, b: tuple) -> Any:
    """Column expression: (a_seq, a_pos, a_row) < b (a python tuple)."""
    from pyspark.sql import functions as F

    b_seq, b_pos, b_row = (F.lit(x) for x in b)
    return (a_seq < b_seq) | ((a_seq == b_seq) & ((a_pos < b_pos) | ((a_pos == b_pos) & (a_row < b_row))))


def reconcile(events: Any, records: Any, ctx: ReconcileContext, storage: Any = None) -> Reconciled:
    """Classify with Spark DataFrames (joins, window functions). `events`: cdc_binlog rows;
    `records`: cdc_kafka rows with decode=true. The results are computed from persisted
    intermediates (`unpersist()` frees them).

    Plan (two big shuffles, no per-key list building in the common case):
      1. the records of ours are hash-partitioned by identity key and numbered within
         their key by (topic, partition, offset) with one window (count, rank, first
         broker time);
      2. the events are full-outer-joined to them on the key (a sort-merge join that
         reuses step 1's partitioning): one row per (event, record) pair, an event
         without records, or a record without an event. This is persisted;
      3. an event's row is its first record's row (rank 1): its class and its content
         check are row-local expressions; only events with two or more records get
         their delivery list from a (small) aggregation;
      4. one shuffle by (topic, partition), sorted by offset, serves both order checks:
         the partition order of header positions, and (after a sort by key) the key
         order of binlog positions; what they flag is small and joined back by broadcast.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    storage = storage or StorageLevel.MEMORY_AND_DISK
    dlq = ctx.dlq_topic
    col = F.col

    rec = records.withColumn("is_dlq", col("topic") == F.lit(dlq)).withColumn(
        "repair", F.coalesce(col("repair"), F.lit(False))
    )
    ours = rec.filter(col("ikey").isNotNull() & (col("source") == F.lit(ctx.source)))
    if ctx.has_xa:
        events = resolve_xa(events)
    else:
        events = events.filter(F.coalesce(col("kind"), F.lit(KIND_EVENT)) == KIND_EVENT)
    ev = (
        events.filter(col("ikey").isNotNull()).select(*EVENT_COLUMNS).withColumn("ord", F.struct("file_seq", "tx_pos", "row"))
        .withColumn("commit_clock_ms", commit_ms(col))
        .withColumn("commit_clock", F.when(col("commit_us").isNotNull(), F.lit("m"))
                    .when(col("timestamp_us").isNotNull(), F.lit("c")).otherwise(F.lit("h")))
    )  # fmt: skip

    # ---- 1. records of ours by identity key: how many, rank by (topic, partition, offset)
    by_ikey = Window.partitionBy("r_ikey").orderBy("r_topic", "r_partition", "r_offset")
    whole = by_ikey.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    r_cols = ("ikey",) + tuple(c for c in DELIVERY_FIELDS)
    ours_w = (
        ours.select(*[col(c).alias(f"r_{c}") for c in r_cols])
        .withColumn("n", F.count(F.lit(1)).over(whole))
        .withColumn("rn", F.row_number().over(by_ikey))
        .withColumn("first_ts", F.min(F.when(~col("r_repair"), col("r_timestamp_ms"))).over(whole))
    )

    # ---- 2. events joined to them; the content check is row-local, so it is done here and
    # only the narrow result is persisted (building Spark's cache costs by the byte, and
    # the payloads are most of the bytes)
    def r(name: str) -> Any:
        return col(f"r_{name}")

    formatted = r("v_format").isNotNull()  # a payload format: the value is the payload (cdc/events/formats.py)
    decoded = r("value_error").isNull()
    enveloped = decoded & ~formatted
    not_dlq = ~r("is_dlq")

    def ne(a: Any, b: str) -> Any:
        return ~a.eqNullSafe(col(b))

    if ctx.payload_formats:
        matches = F.udf(payload_matches, T.BooleanType())
        payload_differs = F.when(
            formatted, ~matches(r("v_format"), r("v_payload"), col("payload"), col("payload_is_text"))
        ).otherwise(ne(r("v_payload"), "payload"))
        expected_ms = F.when(col("timestamp_us").isNull(), col("commit_ts_ms")).otherwise(
            F.when(col("timestamp_us") >= 0, F.floor(col("timestamp_us") / 1000))
            .otherwise(-F.floor(-col("timestamp_us") / 1000))
            .cast("bigint")
        )
        stamp_differs = F.when(formatted, ~r("timestamp_ms").eqNullSafe(expected_ms)).otherwise(
            ne(r("v_timestamp_us"), "timestamp_us")
        )
    else:
        payload_differs, stamp_differs = ne(r("v_payload"), "payload"), ne(r("v_timestamp_us"), "timestamp_us")
    reason_list = F.array(
        F.when(not_dlq & col("expected_topic").isNotNull() & (r("topic") != col("expected_topic")), F.lit("topic")),
        F.when(not_dlq & ne(r("key_text"), "aggregate_id"), F.lit("key")),
        F.when(
            not_dlq
            & decoded
            & (ne(r("v_id"), "event_id") | (r("h_event_id").isNotNull() & (r("h_event_id") != col("event_id")))),
            F.lit("id"),
        ),
        F.when(not_dlq & enveloped & ne(r("v_aggregate_type"), "aggregate_type"), F.lit("aggregate_type")),
        F.when(not_dlq & enveloped & ne(r("v_aggregate_id"), "aggregate_id"), F.lit("aggregate_id")),
        F.when(
            not_dlq
            & decoded
            & (
                ne(r("v_type"), "event_type")
                | (r("h_event_type").isNotNull() & (r("h_event_type") != col("event_type")))
            ),
            F.lit("type"),
        ),
        F.when(not_dlq & decoded & payload_differs, F.lit("payload")),
        F.when(not_dlq & decoded & stamp_differs, F.lit("timestamp")),
        F.when(r("h_commit_ts").isNotNull() & (r("h_commit_ts") != col("commit_ts_ms")), F.lit("commit_ts")),
        F.when(r("value_error").isNotNull(), F.lit("value")),
    )
    joined = (
        ev.join(ours_w, ev["ikey"] == ours_w["r_ikey"], "full_outer")
        .withColumn(
            "match_reasons", F.when(col("file").isNotNull() & r("ikey").isNotNull(), F.array_compact(reason_list))
        )
        .select(
            *JOINED_EVENT_COLUMNS,
            "ord",
            "match_reasons",
            *[f"r_{c}" for c in JOINED_RECORD_FIELDS],
            "n",
            "rn",
            "first_ts",
        )
        .persist(storage)
    )

    # ---- 3. events: the row of the first record (or of none)
    empty_reasons = F.array().cast(T.ArrayType(T.StringType()))
    delivery = F.struct(*[r(c).alias(c) for c in LISTED_DELIVERY_FIELDS])
    multi = (
        joined.filter(col("file").isNotNull() & (col("n") >= 2))
        .groupBy("ikey")
        .agg(F.sort_array(F.collect_list(delivery)).alias("_deliveries"))
    )
    multi, n_multi = _small(multi, storage)
    evs = (
        joined.filter(col("file").isNotNull() & (col("rn").isNull() | (col("rn") == 1)))
        .withColumn("n", F.coalesce(col("n"), F.lit(0)))
        .withColumn("reasons", F.when(col("n") == 1, col("match_reasons")).otherwise(empty_reasons))
        .withColumn("latency_ms", col("first_ts") - col("commit_clock_ms"))
        .withColumn("_one", F.when(col("n") == 1, F.array(delivery)))
        .withColumn("_first_is_dlq", r("is_dlq"))
    )
    evs = _join_small(evs, multi, n_multi).withColumn("deliveries", F.coalesce(col("_deliveries"), col("_one")))

    # ---- 4. order checks, one shuffle: partition order (header positions, every record
    # of ours but repairs) and key order (binlog positions of the events delivered, no
    # dead-letter records). A later copy of an event can only flag that event itself,
    # which is a duplicate anyway.
    h_ord = F.when(
        r("h_file_seq").isNotNull() & r("h_pos").isNotNull() & r("h_row").isNotNull(),
        F.struct(r("h_file_seq").alias("h_file_seq"), r("h_pos").alias("h_pos"), r("h_row").alias("h_row")),
    )
    keyed = col("file").isNotNull() & ~r("is_dlq")
    by_part = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    by_key = (
        Window.partitionBy("topic", "partition", "key_text")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    flagged = (
        joined.filter(r("ikey").isNotNull() & ~r("repair"))
        .select(
            r("topic").alias("topic"),
            r("partition").alias("partition"),
            r("offset").alias("offset"),
            r("key_text").alias("key_text"),
            r("h_file").alias("h_file"),
            r("h_pos").alias("h_pos"),
            r("h_row").alias("h_row"),
            r("h_gtid").alias("h_gtid"),
            h_ord.alias("h_ord"),
            "ikey",
            F.when(keyed, col("ord")).alias("k_ord"),
        )
        .withColumn("h_prev_max", F.max("h_ord").over(by_part))
        .withColumn("k_prev_max", F.max("k_ord").over(by_key))
        .withColumn(
            "violation", col("h_ord").isNotNull() & col("h_prev_max").isNotNull() & (col("h_ord") < col("h_prev_max"))
        )
        .withColumn(
            "reorder", col("k_ord").isNotNull() & col("k_prev_max").isNotNull() & (col("k_ord") < col("k_prev_max"))
        )
        .filter(col("violation") | col("reorder"))
        .persist(storage)
    )
    violations = flagged.filter(col("violation")).select(
        "topic",
        "partition",
        "offset",
        "key_text",
        "h_file",
        "h_pos",
        "h_row",
        "h_gtid",
        "h_ord",
        col("h_prev_max").alias("prev_max"),
    )
    order = (
        flagged.filter(col("reorder"))
        .groupBy("ikey")
        .agg(
            F.lit(True).alias("reordered"),
            F.min_by(
                F.struct("topic", "partition", "offset", col("k_prev_max").alias("prev_max")), col("offset")
            ).alias("reorder_at"),
        )
    )
    order, n_order = _small(order, storage)
    classified = (
        _join_small(evs, order, n_order)
        .withColumn("reordered", F.coalesce(col("reordered"), F.lit(False)))
        .withColumn("_stmt", F.coalesce(col("dlq_cause") == F.lit(STATEMENT_FORMAT), F.lit(False)) & (col("n") < 2))
        .withColumn("_undecided", F.coalesce(col("kind") == F.lit(KIND_XA_UNDECIDED), F.lit(False)))
        .withColumn(
            "class",
            F.when(col("_undecided") | col("_stmt"), F.lit("unverifiable"))
            .when(col("n") == 0, F.lit("missing"))
            .when(col("n") >= 2, F.lit("duplicate"))
            .when(col("_first_is_dlq"), F.lit("dead_lettered"))
            .when(F.size(col("reasons")) > 0, F.lit("altered"))
            .when(col("reordered"), F.lit("reordered"))
            .otherwise(F.lit("delivered")),
        )
        .withColumn(
            "unverifiable_reason",
            F.when(col("_undecided"), F.lit(XA_UNDECIDED))
            .when(col("_stmt"), F.lit(STATEMENT_FORMAT))
            .otherwise(F.lit(None).cast("string")),
        )
        .select(
            *JOINED_EVENT_COLUMNS,
            "ord",
            "n",
            "deliveries",
            "first_ts",
            "reasons",
            "latency_ms",
            "reordered",
            "reorder_at",
            "class",
            "unverifiable_reason",
        )
    )

    # ---- events without a delivery that cannot be proven absent
    thresholds = _spark_thresholds(rec, ctx)
    if thresholds or ctx.unread_topics:
        counts = dict(ctx.partition_counts)
        partitioner = ctx.partitioner

        @F.udf("int")
        def predicted(loc, key):
            n = counts.get(loc or "")
            if partitioner != "murmur2" or not n:
                return None
            return murmur2_partition(key, n)

        loc = F.when(col("dlq_cause").isNotNull(), F.lit(dlq)).otherwise(col("expected_topic"))
        missing = classified.filter(col("class") == "missing").withColumn("_loc", loc)
        missing = missing.withColumn("_pred", predicted(col("_loc"), col("aggregate_id")))
        trunc_cond = F.lit(False)
        for (topic, part), thr in thresholds.items():
            applies = (
                F.lit(True)
                if topic == dlq
                else ((col("_loc") == F.lit(topic)) & (col("_pred").isNull() | (col("_pred") == F.lit(part))))
            )
            before = F.lit(True) if thr is None else _lt(col("file_seq"), col("tx_pos"), col("row"), thr)
            trunc_cond = trunc_cond | (applies & before)
        unread = col("_loc").isin(list(ctx.unread_topics)) if ctx.unread_topics else F.lit(False)
        why = F.when(unread, F.lit("topic_not_read")).when(trunc_cond, F.lit("partition_truncated"))
        missing = (
            missing.withColumn("unverifiable_reason", why)
            .withColumn(
                "class", F.when(col("unverifiable_reason").isNotNull(), F.lit("unverifiable")).otherwise(col("class"))
            )
            .drop("_loc", "_pred")
        )
        classified = classified.filter(col("class") != "missing").unionByName(missing)

    # ---- records of ours that match no event, and other people's records
    _s_file, s_seq, s_pos = ctx.range_start
    _e_file, e_seq, e_pos = ctx.range_end
    hs, hp = col("h_file_seq"), col("h_pos")
    xs, xp = col("h_xa_file_seq"), col("h_xa_pos")
    before = (
        (hs < s_seq)
        | ((hs == s_seq) & (hp < s_pos))
        | F.coalesce((xs < s_seq) | ((xs == s_seq) & (xp < s_pos)), F.lit(False))
    )
    after = (hs > e_seq) | ((hs == e_seq) & (hp >= e_pos))
    unmatched = (
        joined.filter(col("file").isNull())
        .select(*[r(c).alias(c) for c in RECORD_COLUMNS])
        .withColumn(
            "reason",
            F.when(hs.isNull() | hp.isNull(), F.lit(None))
            .when(before, F.lit("before_binlog_range"))
            .when(after, F.lit("after_verified_range")),
        )
        .withColumn("class", F.when(col("reason").isNull(), F.lit("phantom")).otherwise(F.lit("unverifiable")))
    )
    others = (
        rec.filter(col("ikey").isNull() | col("source").isNull() | (col("source") != F.lit(ctx.source)))
        .withColumn("class", F.when(col("ikey").isNull(), F.lit("unidentified")).otherwise(F.lit("foreign")))
        .withColumn("reason", F.lit(None).cast("string"))
        .select(*RECORD_COLUMNS, "reason", "class")
    )
    record_classes = unmatched.unionByName(others)

    # `joined` (and the small side tables) are persisted; the three results are cheap,
    # column-pruned projections of them, so they are not cached a second time.
    return Reconciled(classified, record_classes, violations, ctx, joined, (flagged, multi, order))


SMALL_ROWS = 200_000  # a side table up to this many rows is broadcast to the join


def _small(df: Any, storage: Any) -> tuple[Any, int]:
    """`df` persisted and its row count (one action): the side tables of reconcile
    (events delivered twice or more, events out of key order) are usually empty."""
    df = df.persist(storage)
    return df, df.count()


def _join_small(big: Any, small: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    if n == 0:  # nothing to join: the side's columns, all NULL
        return big.select(
            "*", *[F.lit(None).cast(f.dataType).alias(f.name) for f in small.schema.fields if f.name != "ikey"]
        )
    return big.join(F.broadcast(small) if n <= SMALL_ROWS else small, "ikey", "left")


# the record fields an event's row carries (prefixed r_); LISTED_DELIVERY_FIELDS go into
# its `deliveries` list (sorted by topic, partition, offset)
LISTED_DELIVERY_FIELDS = ("topic", "partition", "offset", "timestamp_ms", "repair", "is_dlq", "dlq_cause")
DELIVERY_FIELDS = (
    "topic", "partition", "offset", "timestamp_ms", "repair", "is_dlq", "dlq_cause", "key_text", "v_id",
    "v_aggregate_type", "v_aggregate_id", "v_type", "v_payload", "v_timestamp_us", "h_event_id", "h_event_type",
    "h_commit_ts", "value_error", "source", "h_file", "h_file_seq", "h_pos", "h_row", "h_gtid", "h_xa_prepare",
    "h_xa_file_seq", "h_xa_pos", "v_format",
)  # fmt: skip
# what the joined table keeps once the content has been compared: no payloads, no decoded values
EVENT_CONTENT_COLUMNS = ("payload", "payload_is_text", "timestamp_us")
JOINED_EVENT_COLUMNS = tuple(c for c in EVENT_COLUMNS if c not in EVENT_CONTENT_COLUMNS) + (
    "commit_clock_ms",
    "commit_clock",
)
JOINED_RECORD_FIELDS = ("ikey",) + tuple(c for c in DELIVERY_FIELDS if not c.startswith("v_"))
RECORD_COLUMNS = (
    "topic", "partition", "offset", "timestamp_ms", "key_text", "source", "h_file", "h_file_seq", "h_pos", "h_row",
    "h_gtid", "h_commit_ts", "h_event_id", "h_event_type", "repair", "is_dlq", "dlq_cause", "value_error",
    "h_xa_prepare", "h_xa_file_seq", "h_xa_pos",
)  # fmt: skip


# =============================================================================
# summaries (the report's numbers) from a Reconciled
# =============================================================================


def _event_example(r: Any) -> dict[str, Any]:
    d = r.asDict(recursive=True)
    out = {
        "class": d.get("class"),
        "binlog": {
            "file": d["file"], "pos": d["tx_pos"], "row": d["row"], "gtid": d["gtid"], "tx_end": d["tx_end"],
            "commit_ts_ms": d["commit_ts_ms"], "server_id": d["server_id"],
        },
        "table": d["table"],
        "event_id": d["event_id"],
        "aggregate_type": d["aggregate_type"],
        "aggregate_id": d["aggregate_id"],
        "event_type": d["event_type"],
        "expected_topic": d["expected_topic"],
        "expected_dlq_cause": d["dlq_cause"],
        "deliveries": [
            {k: v for k, v in x.items() if k in ("topic", "partition", "offset", "timestamp_ms", "repair", "dlq_cause", "reasons")}
            for x in (d.get("deliveries") or [])
        ],
    }  # fmt: skip
    if d.get("reasons"):
        out["reasons"] = d["reasons"]
    if d.get("unverifiable_reason"):
        out["unverifiable_reason"] = d["unverifiable_reason"]
    if d.get("xa_prepare"):
        out["binlog"]["xa_prepare"] = d["xa_prepare"]
    if d.get("reorder_at"):
        ra = d["reorder_at"]
        out["reordered_after"] = {
            "topic": ra["topic"], "partition": ra["partition"], "offset": ra["offset"],
            "later_position_seen": {"file_seq": ra["prev_max"]["file_seq"], "pos": ra["prev_max"]["tx_pos"], "row": ra["prev_max"]["row"]},
        }  # fmt: skip
    return out


def _record_example(r: Any) -> dict[str, Any]:
    d = r.asDict(recursive=True)
    return {
        "class": d["class"],
        "reason": d.get("reason"),
        "kafka": {"topic": d["topic"], "partition": d["partition"], "offset": d["offset"], "timestamp_ms": d["timestamp_ms"]},
        "key": d["key_text"],
        "headers": {
            "source": d["source"], "file": d["h_file"], "pos": d["h_pos"], "row": d["h_row"], "gtid": d["h_gtid"],
            "commit_ts": d["h_commit_ts"], "id": d["h_event_id"], "type": d["h_event_type"], "repair": d["repair"],
            "xa_prepare": d.get("h_xa_prepare"),
        },
    }  # fmt: skip


def missing_entry(r: Any) -> dict[str, Any]:
    """One missing event, machine-usable (for `cdc repair`)."""
    d = r.asDict(recursive=True) if hasattr(r, "asDict") else dict(r)
    return {
        "source": d["source"], "file": d["file"], "pos": d["tx_pos"], "row": d["row"], "gtid": d["gtid"],
        "tx_end": d["tx_end"], "server_id": d["server_id"], "commit_ts_ms": d["commit_ts_ms"], "table": d["table"],
        "event_id": d["event_id"], "aggregate_type": d["aggregate_type"], "aggregate_id": d["aggregate_id"],
        "event_type": d["event_type"], "expected_topic": d["expected_topic"], "dlq_cause": d["dlq_cause"],
    }  # fmt: skip


def summarize(rc: Reconciled, max_examples: int = 20, lag_buckets: int = 600, hist_bins: int = 40) -> dict[str, Any]:
    """Counts, examples, verified_through, latency and lag, from the persisted results.

    Few Spark actions: one for every count (events, records, order violations), one for
    the global figures (latency percentiles, first unproven event), one for the latency
    histogram and the lag series; the others only run when there is something to show."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    col = F.col
    ctx = rc.ctx
    ev = rc.events
    str_null = F.lit(None).cast("string")

    # ---- 1 action: every count
    facts = (
        ev.groupBy(
            F.lit("event").alias("side"),
            col("class"),
            col("unverifiable_reason").alias("reason"),
            F.when(col("class") == "dead_lettered", col("deliveries")[0]["dlq_cause"]).alias("cause"),
            F.when(col("class") == "altered", F.array_join(col("reasons"), ",")).alias("reasons"),
        )
        .count()
        .unionByName(
            rc.records.groupBy(
                F.lit("record").alias("side"),
                col("class"),
                col("reason"),
                str_null.alias("cause"),
                str_null.alias("reasons"),
            ).count()
        )
        .unionByName(
            rc.violations.groupBy(
                F.lit("violation").alias("side"),
                F.lit("order").alias("class"),
                str_null.alias("reason"),
                str_null.alias("cause"),
                str_null.alias("reasons"),
            ).count()
        )
        .collect()
    )
    counts = {c: 0 for c in ALL_CLASSES}
    rec_counts: dict[str, int] = {}
    rec_reasons: dict[str, int] = {}
    ev_unv: dict[str, int] = {}
    dlq_causes: dict[str, int] = {}
    altered_reasons: dict[str, int] = {}
    violations_count = 0
    for r in facts:
        n = r["count"]
        if r["side"] == "event":
            counts[r["class"]] += n
            if r["class"] == "unverifiable":
                ev_unv[r["reason"]] = ev_unv.get(r["reason"], 0) + n
            if r["class"] == "dead_lettered":
                dlq_causes[r["cause"]] = dlq_causes.get(r["cause"], 0) + n
            if r["class"] == "altered":
                for reason in (r["reasons"] or "").split(","):
                    if reason:
                        altered_reasons[reason] = altered_reasons.get(reason, 0) + n
        elif r["side"] == "record":
            rec_counts[r["class"]] = rec_counts.get(r["class"], 0) + n
            if r["class"] == "unverifiable":
                rec_reasons[r["reason"]] = rec_reasons.get(r["reason"], 0) + n
        else:
            violations_count += n
    events_total = sum(counts.values())
    counts["phantom"] += rec_counts.get("phantom", 0)
    counts["unverifiable"] += rec_counts.get("unverifiable", 0)

    # ---- 1 action: global figures (latency, first unproven event)
    lat_expr = col("latency_ms")
    g = ev.agg(
        F.count(lat_expr).alias("n"),
        F.min(lat_expr).alias("min"),
        F.max(lat_expr).alias("max"),
        F.avg(lat_expr).alias("mean"),
        F.percentile_approx(lat_expr, [0.5, 0.95, 0.99], 10000).alias("p"),
        F.count(F.when(lat_expr.isNotNull() & (col("commit_clock") == "m"), 1)).alias("n_mysql"),
        F.count(F.when(lat_expr.isNotNull() & (col("commit_clock") == "c"), 1)).alias("n_column"),
        F.min(F.when(lat_expr.isNotNull(), col("commit_ts_ms"))).alias("t0"),
        F.max(F.when(lat_expr.isNotNull(), col("commit_ts_ms"))).alias("t1"),
        F.min(F.when(~col("class").isin(*PROVEN_CLASSES), F.struct("file_seq", "tx_pos", "row", "file"))).alias(
            "first_bad"
        ),
    ).collect()[0]

    # ---- verified_through
    first_bad = g["first_bad"]
    if first_bad is None:
        verified = {"file": ctx.range_end[0], "pos": ctx.range_end[2], "complete": True}
        first_unproven = None
    else:
        prev = (
            ev.filter(
                (col("file_seq") < first_bad["file_seq"])
                | ((col("file_seq") == first_bad["file_seq"]) & (col("tx_pos") < first_bad["tx_pos"]))
            )
            .agg(F.max(F.struct("file_seq", "tx_pos", "row", "file", "tx_end")).alias("m"))
            .collect()[0]["m"]
        )
        if prev is None:
            verified = {"file": ctx.range_start[0], "pos": ctx.range_start[2], "complete": False}
        else:
            verified = {"file": prev["file"], "pos": prev["tx_end"], "complete": False}
        first_unproven = {"file": first_bad["file"], "pos": first_bad["tx_pos"], "row": first_bad["row"]}

    # ---- 1 action: latency histogram + lag over time
    clocks = {
        "mysql_immediate_commit_timestamp": g["n_mysql"],
        "outbox_timestamp_column": g["n_column"],
        "binlog_commit_header": g["n"] - g["n_mysql"] - g["n_column"],
    }
    latency: dict[str, Any] = {
        "count": g["n"],
        "clocks": {k: v for k, v in clocks.items() if v},
        "note": "latency = first broker timestamp - commit time; the commit time is MySQL's immediate_commit_timestamp "
        "(microseconds) where the server writes it, else the outbox timestamp column when configured (microseconds, "
        "set at the INSERT, read as UTC: includes the rest of the transaction), else the binlog commit event header "
        "(one-second resolution: a latency can be overstated by up to 1000 ms); `clocks` counts each",
    }
    if g["n"]:
        p = g["p"]
        latency.update(
            min_ms=g["min"], p50_ms=p[0], p95_ms=p[1], p99_ms=p[2], max_ms=g["max"], mean_ms=round(g["mean"], 1)
        )
        lo, hi = int(g["min"]), int(g["max"])
        width = max(1, -(-(hi - lo + 1) // hist_bins))
        t0 = int(g["t0"]) // 1000
        span_s = (int(g["t1"]) - int(g["t0"])) // 1000 + 1
        bucket_s = max(1, -(-span_s // lag_buckets))
        lat = ev.filter(lat_expr.isNotNull())
        rows = (
            lat.groupBy(F.lit("h").alias("kind"), F.floor((lat_expr - F.lit(lo)) / F.lit(width)).alias("b"))
            .agg(F.count(F.lit(1)).alias("n"), F.max(lat_expr).alias("mx"))
            .unionByName(
                lat.groupBy(
                    F.lit("l").alias("kind"),
                    F.floor((F.floor(col("commit_ts_ms") / 1000) - F.lit(t0)) / F.lit(bucket_s)).alias("b"),
                ).agg(F.count(F.lit(1)).alias("n"), F.max(lat_expr).alias("mx"))
            )
            .collect()
        )
        latency["histogram"] = {
            "bin_width_ms": width,
            "bins": sorted(
                ({"from_ms": lo + int(r["b"]) * width, "count": r["n"]} for r in rows if r["kind"] == "h"),
                key=lambda b: b["from_ms"],
            ),
        }
        latency["lag_over_time"] = {
            "bucket_seconds": bucket_s,
            "points": sorted(
                (
                    {"commit_second": t0 + int(r["b"]) * bucket_s, "max_latency_ms": r["mx"], "events": r["n"]}
                    for r in rows
                    if r["kind"] == "l"
                ),
                key=lambda x: x["commit_second"],
            ),
        }

    # ---- examples (only when there is something to show)
    examples: dict[str, list[dict[str, Any]]] = {c: [] for c in ALL_CLASSES}
    if events_total - counts["delivered"] > 0:
        w = Window.partitionBy("class").orderBy("file_seq", "tx_pos", "row")
        for r in (
            ev.filter(col("class") != "delivered")
            .withColumn("rn", F.row_number().over(w))
            .filter(col("rn") <= max_examples)
            .orderBy("class", "rn")
            .collect()
        ):
            examples[r["class"]].append(_event_example(r))
    if rec_counts.get("phantom", 0) + rec_counts.get("unverifiable", 0) > 0:
        wr = Window.partitionBy("class").orderBy("topic", "partition", "offset")
        for r in (
            rc.records.filter(col("class").isin("phantom", "unverifiable"))
            .withColumn("rn", F.row_number().over(wr))
            .filter(col("rn") <= max_examples)
            .orderBy("class", "rn")
            .collect()
        ):
            if len(examples[r["class"]]) < 2 * max_examples:
                examples[r["class"]].append(_record_example(r))
    violation_examples = []
    if violations_count:
        violation_examples = [
            {
                "topic": r["topic"],
                "partition": r["partition"],
                "offset": r["offset"],
                "key": r["key_text"],
                "position": {"file": r["h_file"], "pos": r["h_pos"], "row": r["h_row"], "gtid": r["h_gtid"]},
                "after_position": {
                    "file_seq": r["prev_max"]["h_file_seq"],
                    "pos": r["prev_max"]["h_pos"],
                    "row": r["prev_max"]["h_row"],
                },
            }
            for r in rc.violations.orderBy("topic", "partition", "offset").limit(max_examples).collect()
        ]
    unverifiable_ranges: list[dict[str, Any]] = []
    if rec_counts.get("unverifiable", 0):
        for r in rc.records.filter(col("class") == "unverifiable").groupBy("reason").agg(
            F.min(F.struct("h_file_seq", "h_pos", "h_file")).alias("lo"), F.max(F.struct("h_file_seq", "h_pos", "h_file")).alias("hi"),
            F.count(F.lit(1)).alias("n"),
        ).collect():  # fmt: skip
            unverifiable_ranges.append({"side": "kafka_records", "reason": r["reason"], "count": r["n"],
                                        "from": {"file": r["lo"]["h_file"], "pos": r["lo"]["h_pos"]},
                                        "to": {"file": r["hi"]["h_file"], "pos": r["hi"]["h_pos"]}})  # fmt: skip
    if ev_unv:
        for r in ev.filter(col("class") == "unverifiable").groupBy("unverifiable_reason").agg(
            F.min(F.struct("file_seq", "tx_pos", "file")).alias("lo"), F.max(F.struct("file_seq", "tx_pos", "file")).alias("hi"),
            F.count(F.lit(1)).alias("n"),
        ).collect():  # fmt: skip
            unverifiable_ranges.append({"side": "binlog_events", "reason": r["unverifiable_reason"], "count": r["n"],
                                        "from": {"file": r["lo"]["file"], "pos": r["lo"]["tx_pos"]},
                                        "to": {"file": r["hi"]["file"], "pos": r["hi"]["tx_pos"]}})  # fmt: skip
    del T
    return {
        "counts": counts,
        "events_total": events_total,
        "records": {
            "foreign": rec_counts.get("foreign", 0),
            "unidentified": rec_counts.get("unidentified", 0),
            "phantom": rec_counts.get("phantom", 0),
            "unverifiable": rec_counts.get("unverifiable", 0),
        },
        "unverifiable_reasons": {
            **{f"event:{k}": v for k, v in ev_unv.items()},
            **{f"record:{k}": v for k, v in rec_reasons.items()},
        },
        "dead_letter_causes": dlq_causes,
        "altered_reasons": altered_reasons,
        "examples": {k: v for k, v in examples.items() if v},
        "order_violations": {"count": violations_count, "examples": violation_examples},
        "verified_through": verified,
        "first_unproven": first_unproven,
        "latency": latency,
        "truncated_partitions": [{"topic": t, "partition": p, "low_watermark": low} for t, p, low in ctx.truncated()],
        "unverifiable_ranges": unverifiable_ranges,
    }
