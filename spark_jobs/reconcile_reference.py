"""The pure-python reference of the reconciliation (`reconcile_reference`, with the XA
pairing `resolve_xa_rows`): the rules of `spark_jobs/reconcile.py` written row by row, so that
the unit tests hold the Spark implementation against it (tests/unit/test_reconcile.py,
tests/integration/test_reconcile_spark.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs.common import KEY_SEP, identity_key
from spark_jobs.mysql.binlog_rows import (
    KIND_EVENT,
    KIND_XA_COMMIT,
    KIND_XA_EVENT,
    KIND_XA_ROLLBACK,
    KIND_XA_ROW,
    KIND_XA_UNDECIDED,
    STATEMENT_FORMAT,
)  # fmt: skip
from spark_jobs.reconcile_rules import (
    ALL_CLASSES,
    PROVEN_CLASSES,
    XA_UNDECIDED,
    ReconcileContext,
    event_order,
    event_unverifiable,
    header_order,
    record_reasons,
    truncation_thresholds,
)  # fmt: skip


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
            o = event_order(by_key[r["ikey"]])
            if running is not None and o < running:
                reordered.add(r["ikey"])
            running = o if running is None else max(running, o)

    # partition order of header positions
    violations: set[tuple[str, int, int]] = set()
    per_partition: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in ours:
        if not r.get("repair") and header_order(r) is not None:
            per_partition.setdefault((r["topic"], r["partition"]), []).append(r)
    for rs in per_partition.values():
        running = None
        for r in sorted(rs, key=lambda r: r["offset"]):
            at = header_order(r)
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
    first = min(bad, key=event_order)
    before = [e for e in events if (e["file_seq"], e["tx_pos"]) < (first["file_seq"], first["tx_pos"])]
    if not before:
        return (ctx.range_start[0], ctx.range_start[2]), (first["file"], first["tx_pos"], first["row"])
    last = max(before, key=event_order)
    return (last["file"], last["tx_end"]), (first["file"], first["tx_pos"], first["row"])


def commit_ms_of(e: Mapping[str, Any]) -> int:
    """`commit_ms` of one event (the reference)."""
    if e.get("commit_us") is not None:
        return int(e["commit_us"]) // 1000
    if e.get("timestamp_us") is not None:
        return int(e["timestamp_us"]) // 1000
    return int(e["commit_ts_ms"])
