"""Unit tests of the verifier: the classification rules (the pure-python reference), the
verifier's own transaction assembly, the
outbox mapping, record decoding, murmur2 and the report.

No servers, no Spark: the Spark implementation is held against the reference in
tests/integration/test_reconcile_spark.py."""

from __future__ import annotations

import json
import struct
import uuid
from typing import Any

import fastavro
import pytest

from cdc.events import identity as hdr
from cdc.events.outbox import OutboxTable
from spark_jobs.common import identity_key, murmur2, murmur2_partition, redacted, scrub
from spark_jobs.mysql.binlog_assembly import TxAssembler, classify_query
from spark_jobs.mysql.binlog_rows import BINLOG_FIELDS, EventMapper, events_of_tx
from spark_jobs.reconcile_reference import reconcile_reference
from spark_jobs.reconcile_rules import ReconcileContext
from spark_jobs.records import avro_schema, decode_record, decode_value, fields_for

SOURCE = "shop-db"
DLQ = "outbox.dlq"
TOPIC = "outbox.event.order"


# ----------------------------------------------------------------------------- builders


def make_event(
    pos: int,
    row: int = 0,
    *,
    file_seq: int = 1,
    gtid: str | None = "auto",
    agg: str = "a1",
    eid: str | None = None,
    etype: str = "created",
    atype: str = "order",
    payload: bytes | None = b"{}",
    topic: str | None = TOPIC,
    commit_ms: int | None = None,
    dlq_cause: str | None = None,
) -> dict[str, Any]:
    file = f"mysql-bin.{file_seq:06d}"
    if gtid == "auto":
        gtid = f"0-1-{file_seq * 100000 + pos}"
    return {
        "ikey": identity_key(SOURCE, gtid, file, pos, row),
        "source": SOURCE,
        "server_id": 1,
        "file": file,
        "file_seq": file_seq,
        "tx_pos": pos,
        "tx_end": pos + 50,
        "row": row,
        "gtid": gtid,
        "commit_ts_ms": commit_ms if commit_ms is not None else 1_700_000_000_000 + pos * 1000,
        "table": "shop.outbox",
        "event_id": eid if eid is not None else f"e{file_seq}-{pos}-{row}",
        "aggregate_type": atype,
        "aggregate_id": agg,
        "event_type": etype,
        "payload": payload,
        "payload_is_text": None if payload is None else True,
        "timestamp_us": None,
        "expected_topic": topic,
        "dlq_cause": dlq_cause,
        "dlq_error": None if dlq_cause is None else "why",
        "kind": "event",
        "xa_xid": None,
        "xa_prepare": None,
    }


def make_record(
    ev: dict[str, Any] | None,
    *,
    topic: str | None = None,
    partition: int = 0,
    offset: int = 0,
    ts: int | None = None,
    **over: Any,
) -> dict[str, Any]:
    """A record exactly as the relay should write it for `ev` (then `over` applied)."""
    assert ev is not None
    topic = topic or (DLQ if ev["dlq_cause"] else ev["expected_topic"])
    is_dlq = topic == DLQ
    rec = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": ts if ts is not None else ev["commit_ts_ms"] + 250,
        "timestamp_type": 1,
        "key": ev["aggregate_id"].encode(),
        "key_text": ev["aggregate_id"],
        "ikey": ev["ikey"],
        "source": ev["source"],
        "h_file": ev["file"],
        "h_file_seq": ev["file_seq"],
        "h_pos": ev["tx_pos"],
        "h_row": ev["row"],
        "h_gtid": ev["gtid"],
        "h_commit_ts": ev["commit_ts_ms"],
        "h_event_id": ev["event_id"],
        "h_event_type": ev["event_type"],
        "h_table": ev["table"],
        "repair": False,
        "dlq_cause": ev["dlq_cause"] or ("too_large" if is_dlq else None),
        "dlq_error": None,
        "dlq_topic": ev["expected_topic"] if is_dlq else None,
        "schema_id": None if is_dlq else 1,
        "v_id": None if is_dlq else ev["event_id"],
        "v_aggregate_type": None if is_dlq else ev["aggregate_type"],
        "v_aggregate_id": None if is_dlq else ev["aggregate_id"],
        "v_type": None if is_dlq else ev["event_type"],
        "v_payload": None if is_dlq else ev["payload"],
        "v_payload_is_text": None if is_dlq else ev["payload_is_text"],
        "v_timestamp_us": None if is_dlq else ev["timestamp_us"],
        "value_error": None,
    }
    rec.update(over)
    if "h_file" in over or "h_pos" in over or "h_gtid" in over or "h_row" in over or "source" in over:
        rec["ikey"] = identity_key(rec["source"], rec["h_gtid"], rec["h_file"], rec["h_pos"], rec["h_row"])
        rec["h_file_seq"] = int(rec["h_file"].rsplit(".", 1)[1])
    return rec


def ctx(**over: Any) -> ReconcileContext:
    base = dict(
        source=SOURCE,
        dlq_topic=DLQ,
        range_start=("mysql-bin.000001", 1, 4),
        range_end=("mysql-bin.000002", 2, 100_000),
        partitions=((TOPIC, 0, 0, 100), (TOPIC, 1, 0, 100), (DLQ, 0, 0, 100)),
        partition_counts={TOPIC: 2, DLQ: 1},
        unread_topics=(),
        partitioner="unknown",
    )
    base.update(over)
    return ReconcileContext(**base)


def clean_scenario() -> tuple[list[dict], list[dict]]:
    """Six events over two keys and two transactions; every one delivered once, in order."""
    events = [
        make_event(100, 0, agg="a1"),
        make_event(100, 1, agg="a2"),
        make_event(300, 0, agg="a1"),
        make_event(300, 1, agg="a1"),
        make_event(500, 0, agg="a2"),
        make_event(700, 0, agg="bad key", topic="outbox.event.bad topic", dlq_cause="illegal_topic"),
    ]
    offsets = {"a1": 0, "a2": 0}
    parts = {"a1": 0, "a2": 1}
    records = []
    for e in events:
        if e["dlq_cause"]:
            records.append(make_record(e, offset=0))
            continue
        p = parts[e["aggregate_id"]]
        records.append(make_record(e, partition=p, offset=offsets[e["aggregate_id"]]))
        offsets[e["aggregate_id"]] += 1
    return events, records


# ----------------------------------------------------------------------------- reference rules


def test_clean_run_is_all_delivered_or_dead_lettered() -> None:
    events, records = clean_scenario()
    res = reconcile_reference(events, records, ctx())
    counts = res.counts()
    assert counts["delivered"] == 5
    assert counts["dead_lettered"] == 1
    assert all(counts[c] == 0 for c in ("missing", "duplicate", "phantom", "reordered", "altered", "unverifiable"))
    assert res.order_violations == set()
    assert res.verified_through == ("mysql-bin.000002", 100_000)
    assert res.first_unproven is None
    assert all(v == 250 for v in res.latencies.values())


def test_missing_event_detected_and_limits_verified_through() -> None:
    events, records = clean_scenario()
    dropped = events[2]
    records = [r for r in records if r["ikey"] != dropped["ikey"]]
    res = reconcile_reference(events, records, ctx())
    assert res.event_class[dropped["ikey"]] == "missing"
    assert res.counts()["missing"] == 1
    assert res.first_unproven == ("mysql-bin.000001", 300, 0)
    # the last fully proven transaction before it ends at 100 + 50
    assert res.verified_through == ("mysql-bin.000001", 150)


def test_duplicate_lists_all_offsets() -> None:
    events, records = clean_scenario()
    e = events[0]
    records.append(make_record(e, partition=0, offset=10))
    res = reconcile_reference(events, records, ctx())
    assert res.event_class[e["ikey"]] == "duplicate"
    assert res.deliveries[e["ikey"]] == [(TOPIC, 0, 0), (TOPIC, 0, 10)]
    # a late copy goes backwards in its partition: an order violation, not a reorder
    assert (TOPIC, 0, 10) in res.order_violations
    assert res.counts()["reordered"] == 0


def test_phantom_and_out_of_range_records() -> None:
    events, records = clean_scenario()
    ghost = make_event(900, 0, agg="a1")  # never committed: not in `events`
    before = make_event(2, 0, agg="a1")  # position 2 < range start 4
    after = make_event(5, 0, agg="a1", file_seq=3)  # beyond the range end
    records += [
        make_record(ghost, partition=0, offset=20),
        make_record(before, partition=0, offset=21),
        make_record(after, partition=0, offset=22),
    ]
    res = reconcile_reference(events, records, ctx())
    assert res.record_class[(TOPIC, 0, 20)] == ("phantom", None)
    assert res.record_class[(TOPIC, 0, 21)] == ("unverifiable", "before_binlog_range")
    assert res.record_class[(TOPIC, 0, 22)] == ("unverifiable", "after_verified_range")
    c = res.counts()
    assert c["phantom"] == 1 and c["unverifiable"] == 2


def test_swapped_events_of_one_key_are_reordered() -> None:
    events, records = clean_scenario()
    # a1's events at offsets 1 and 2 of partition 0 swap places
    r1 = next(r for r in records if r["ikey"] == events[2]["ikey"])
    r2 = next(r for r in records if r["ikey"] == events[3]["ikey"])
    r1["offset"], r2["offset"] = r2["offset"], r1["offset"]
    res = reconcile_reference(events, records, ctx())
    assert res.event_class[events[2]["ikey"]] == "reordered"  # now after a later event
    assert res.event_class[events[3]["ikey"]] == "delivered"
    assert res.counts()["reordered"] == 1
    assert (TOPIC, 0, 2) in res.order_violations


def test_order_across_keys_is_not_a_reorder_but_a_partition_violation() -> None:
    e1 = make_event(100, 0, agg="x")
    e2 = make_event(200, 0, agg="y")
    records = [make_record(e2, offset=0), make_record(e1, offset=1)]
    res = reconcile_reference([e1, e2], records, ctx())
    assert res.counts()["reordered"] == 0
    assert res.order_violations == {(TOPIC, 0, 1)}


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("v_payload", b"changed", "payload"),
        ("v_id", "other-id", "id"),
        ("h_event_id", "other-id", "id"),
        ("v_type", "deleted", "type"),
        ("h_event_type", "deleted", "type"),
        ("v_aggregate_type", "invoice", "aggregate_type"),
        ("v_aggregate_id", "zz", "aggregate_id"),
        ("key_text", "zz", "key"),
        ("topic", "outbox.event.other", "topic"),
        ("h_commit_ts", 5, "commit_ts"),
        ("v_timestamp_us", 77, "timestamp"),
        ("value_error", "Avro decoding failed", "value"),
    ],
)
def test_altered_field_detected(field: str, value: Any, reason: str) -> None:
    events, records = clean_scenario()
    target = events[4]
    rec = next(r for r in records if r["ikey"] == target["ikey"])
    rec[field] = value
    res = reconcile_reference(events, records, ctx())
    assert res.event_class[target["ikey"]] == "altered"
    assert reason in res.event_reasons[target["ikey"]]
    assert res.counts()["altered"] == 1


def test_null_payload_vs_empty_payload_is_altered() -> None:
    e = make_event(100, 0, payload=None)
    r = make_record(e, v_payload=b"")
    res = reconcile_reference([e], [r], ctx())
    assert res.event_class[e["ikey"]] == "altered"


def test_dead_lettered_with_cause_and_in_dlq_only() -> None:
    e = make_event(100, 0, agg="k", topic="outbox.event.bad topic", dlq_cause="illegal_topic")
    too_big = make_event(200, 0, agg="k")  # a legal topic, dead-lettered by the relay (too_large)
    records = [make_record(e, offset=0), make_record(too_big, topic=DLQ, offset=1, dlq_cause="too_large")]
    res = reconcile_reference([e, too_big], records, ctx())
    assert res.event_class[e["ikey"]] == "dead_lettered"
    assert res.event_class[too_big["ikey"]] == "dead_lettered"
    # published AND dead-lettered: delivered twice
    again = make_record(too_big, partition=0, offset=0)
    res = reconcile_reference([e, too_big], records + [again], ctx())
    assert res.event_class[too_big["ikey"]] == "duplicate"


def test_repair_record_counts_as_delivery_and_is_not_a_reorder() -> None:
    events, records = clean_scenario()
    lost = events[2]
    records = [r for r in records if r["ikey"] != lost["ikey"]]
    records.append(make_record(lost, partition=0, offset=50, repair=True))
    res = reconcile_reference(events, records, ctx())
    assert res.event_class[lost["ikey"]] == "delivered"
    assert res.order_violations == set()
    # the repaired copy's broker time does not count as latency
    assert lost["ikey"] not in res.latencies


def test_foreign_and_unidentified_records_are_not_phantoms() -> None:
    events, records = clean_scenario()
    e = make_event(900, 0)
    foreign = make_record(e, offset=30, source="other-db")
    unidentified = make_record(e, offset=31)
    unidentified["ikey"] = None
    unidentified["source"] = None
    res = reconcile_reference(events, records + [foreign, unidentified], ctx())
    assert res.record_class[(TOPIC, 0, 30)] == ("foreign", None)
    assert res.record_class[(TOPIC, 0, 31)] == ("unidentified", None)
    assert res.counts()["phantom"] == 0


def test_truncated_partition_makes_early_events_unverifiable_not_missing() -> None:
    e_old = make_event(100, 0, agg="a1")
    e_first_kept = make_event(300, 0, agg="a1")
    e_lost_late = make_event(500, 0, agg="a1")
    records = [make_record(e_first_kept, partition=0, offset=7)]
    c = ctx(partitions=((TOPIC, 0, 7, 8), (TOPIC, 1, 0, 0), (DLQ, 0, 0, 0)))
    res = reconcile_reference([e_old, e_first_kept, e_lost_late], records, c)
    assert res.event_class[e_old["ikey"]] == "unverifiable"
    assert res.event_unverifiable_reason[e_old["ikey"]] == "partition_truncated"
    assert res.event_class[e_lost_late["ikey"]] == "missing"  # after the first retained record
    assert res.counts()["missing"] == 1


def test_truncated_audit_stream_makes_early_events_of_every_topic_unverifiable() -> None:
    # The exchange sink's audit stream (`routed_stream`) holds every topic's records: its
    # retention removing its start leaves each topic's earliest events unread, so they are
    # unverifiable, never missing (a repair would deliver them a second time); an event
    # after its first retained record of ours is missing as usual.
    other = "outbox.event.invoice"
    e_old = make_event(100, 0, agg="a1")
    e_old_other = make_event(200, 0, agg="b1", topic=other)
    e_first_kept = make_event(300, 0, agg="a1")
    e_lost_late = make_event(500, 0, agg="b1", topic=other)
    records = [make_record(e_first_kept, partition=0, offset=7)]
    c = ctx(partitions=(("audit", 0, 7, 8),), partition_counts={TOPIC: 1, other: 1, DLQ: 1}, routed_stream="audit")
    res = reconcile_reference([e_old, e_old_other, e_first_kept, e_lost_late], records, c)
    assert res.event_class[e_old["ikey"]] == "unverifiable"
    assert res.event_unverifiable_reason[e_old_other["ikey"]] == "partition_truncated"
    assert res.event_class[e_first_kept["ikey"]] == "delivered"
    assert res.event_class[e_lost_late["ikey"]] == "missing"
    # an audit stream that holds nothing of ours any more: every event of the range is unverifiable
    res = reconcile_reference([e_old, e_lost_late], [], ctx(partitions=(("audit", 0, 9, 9),), routed_stream="audit"))
    assert set(res.event_class.values()) == {"unverifiable"}
    # the same stream not named as the audit stream: a topic of its own, which no event expects
    res = reconcile_reference([e_old], [], ctx(partitions=(("audit", 0, 9, 9),)))
    assert res.event_class[e_old["ikey"]] == "missing"


def test_truncation_uses_the_murmur2_partition_of_the_key() -> None:
    # find two keys on different partitions of a 2-partition topic
    keys = {}
    for i in range(100):
        k = f"k{i}"
        keys.setdefault(murmur2_partition(k, 2), k)
        if len(keys) == 2:
            break
    e0 = make_event(100, 0, agg=keys[0])
    e1 = make_event(200, 0, agg=keys[1])
    # partition 1 lost its beginning and is empty now; partition 0 is whole
    c = ctx(partitions=((TOPIC, 0, 0, 0), (TOPIC, 1, 5, 5), (DLQ, 0, 0, 0)), partitioner="murmur2")
    res = reconcile_reference([e0, e1], [], c)
    assert res.event_class[e0["ikey"]] == "missing"
    assert res.event_class[e1["ikey"]] == "unverifiable"
    # without a known partitioner any truncated partition of the topic may hold it
    res = reconcile_reference([e0, e1], [], ctx(partitions=c.partitions, partitioner="unknown"))
    assert res.event_class[e0["ikey"]] == "unverifiable"


def test_topic_not_read_is_unverifiable() -> None:
    e = make_event(100, 0, topic="outbox.event.invoice")
    res = reconcile_reference([e], [], ctx(unread_topics=("outbox.event.invoice",)))
    assert res.event_class[e["ikey"]] == "unverifiable"
    assert res.event_unverifiable_reason[e["ikey"]] == "topic_not_read"


def test_identity_without_gtid_uses_file_and_position() -> None:
    e = make_event(100, 0, gtid=None)
    r = make_record(e)
    assert r["ikey"] == e["ikey"] and "\x1fmysql-bin.000001\x1f100\x1f" in e["ikey"]
    res = reconcile_reference([e], [r], ctx())
    assert res.event_class[e["ikey"]] == "delivered"
    # same position, another row index: a different event
    other = make_record(e, h_row=1, offset=1)
    res = reconcile_reference([e], [r, other], ctx())
    assert res.record_class[(TOPIC, 0, 1)] == ("phantom", None)


def test_identity_key_agrees_with_the_header_contract() -> None:
    headers = {hdr.H_SOURCE: "s", hdr.H_FILE: "mysql-bin.000002", hdr.H_POS: "77", hdr.H_ROW: "3", hdr.H_GTID: "0-1-9"}
    key = hdr.identity_key_from_headers(headers)
    assert key == ("s", "0-1-9", 3)
    assert identity_key("s", "0-1-9", "mysql-bin.000002", 77, 3) == identity_key("s", "0-1-9", "mysql-bin.000009", 1, 3)
    no_gtid = {k: v for k, v in headers.items() if k != hdr.H_GTID}
    assert hdr.identity_key_from_headers(no_gtid) == ("s", "mysql-bin.000002", 77, 3)
    assert identity_key("s", None, "mysql-bin.000002", 77, 3) != identity_key("s", None, "mysql-bin.000002", 78, 3)


def test_tagged_gtids_identify_events_by_uuid_tag_and_number() -> None:
    """MySQL 8.4 tagged GTIDs: the event of `uuid:blue:7` is delivered by the record whose
    header names `uuid:blue:7`; a record naming the untagged `uuid:7` (another transaction)
    does not deliver it."""
    u = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    tagged, plain = make_event(100, 0, gtid=f"{u}:blue:7"), make_event(200, 0, gtid=f"{u}:7")
    assert tagged["ikey"] != plain["ikey"]
    res = reconcile_reference([tagged, plain], [make_record(tagged), make_record(plain, offset=1)], ctx())
    assert res.event_class[tagged["ikey"]] == "delivered" and res.event_class[plain["ikey"]] == "delivered"
    wrong = make_record(tagged, h_gtid=f"{u}:7", offset=2)
    res = reconcile_reference([tagged], [wrong], ctx())
    assert res.event_class[tagged["ikey"]] == "missing"
    assert res.record_class[(TOPIC, 0, 2)][0] == "phantom"
    headers = {
        hdr.H_SOURCE: "s",
        hdr.H_FILE: "binlog.000002",
        hdr.H_POS: "77",
        hdr.H_ROW: "0",
        hdr.H_GTID: f"{u}:blue:7",
    }
    assert hdr.identity_key_from_headers(headers) == ("s", f"{u}:blue:7", 0)


def test_verified_through_when_first_event_is_unproven() -> None:
    e = make_event(100, 0)
    res = reconcile_reference([e], [], ctx())
    assert res.verified_through == ("mysql-bin.000001", 4)
    assert res.first_unproven == ("mysql-bin.000001", 100, 0)


# ----------------------------------------------------------------------------- transaction assembly


def test_assembler_commit_rollback_and_savepoints() -> None:
    a = TxAssembler()
    a.gtid_event(100, "0-1-1", 1, implies_begin=True)
    a.add_rows("s", "outbox", [{"id": 1}, {"id": 2}], 150)
    tx = a.commit(300, 1_700_000_000)
    assert tx is not None and tx.start == 100 and tx.end == 300 and tx.gtid == "0-1-1"
    assert [v["id"] for _, _, v in tx.rows] == [1, 2]

    # rolled back: nothing
    a.gtid_event(300, "0-1-2", 1, implies_begin=True)
    a.add_rows("s", "outbox", [{"id": 3}], 350)
    a.rollback()
    assert a.commit(400, 1) is None and a.anomalies  # a commit without a transaction is an anomaly

    # savepoints: rows after the savepoint are cut back, later ones kept
    a = TxAssembler()
    a.gtid_event(500, "0-1-3", 1, implies_begin=True)
    a.add_rows("s", "outbox", [{"id": 4}], 510)
    a.savepoint("sp1")
    a.add_rows("s", "outbox", [{"id": 5}], 520)
    a.savepoint("sp2")
    a.add_rows("s", "outbox", [{"id": 6}], 530)
    a.rollback_to("SP1", 540)  # names are case-insensitive
    a.add_rows("s", "outbox", [{"id": 7}], 550)
    a.rollback_to("sp2", 555)  # sp2 was released by rolling back to sp1
    tx = a.commit(600, 2)
    assert tx is not None and [v["id"] for _, _, v in tx.rows] == [4, 7]
    assert any("unknown savepoint" in x for x in a.anomalies)


def test_assembler_mysql_gtid_begin_and_ddl() -> None:
    a = TxAssembler()
    a.gtid_event(100, "uuid:1", 1)  # MySQL GTID, then DDL: standalone
    a.other_statement(150)
    assert not a.open
    a.gtid_event(200, "uuid:2", 1)
    a.begin(250, 1)  # BEGIN after the GTID: the transaction starts at the GTID event
    a.add_rows("s", "outbox", [{"id": 1}], 300)
    a.other_statement(320)  # a statement inside the transaction does not end it
    tx = a.commit(400, 5)
    assert tx is not None and tx.start == 200 and len(tx.rows) == 1
    # without GTIDs the transaction starts at BEGIN
    a.begin(500, 1)
    a.add_rows("s", "outbox", [{"id": 2}], 550)
    tx = a.commit(600, 6)
    assert tx is not None and tx.start == 500 and tx.gtid is None
    # rows outside any transaction are never turned into events
    a.add_rows("s", "outbox", [{"id": 3}], 700)
    assert any("outside any transaction" in x for x in a.anomalies)
    # a new GTID while rows are buffered drops them (no commit seen)
    a.gtid_event(800, "uuid:3", 1, implies_begin=True)
    a.add_rows("s", "outbox", [{"id": 4}], 850)
    a.gtid_event(900, "uuid:4", 1, implies_begin=True)
    assert a.commit(950, 7).rows == []


@pytest.mark.parametrize(
    "query,expected",
    [
        ("BEGIN", ("begin", None)),
        ("COMMIT", ("commit", None)),
        ("COMMIT /* implicit */", ("commit", None)),
        ("ROLLBACK", ("rollback", None)),
        ("SAVEPOINT `sp1`", ("savepoint", "sp1")),
        ("SAVEPOINT sp_2", ("savepoint", "sp_2")),
        ("ROLLBACK TO `sp1`", ("rollback_to", "sp1")),
        ("ROLLBACK TO SAVEPOINT sp1", ("rollback_to", "sp1")),
        ("rollback work to savepoint `a b`", ("rollback_to", "a b")),
        ("use `shop`; CREATE TABLE t (id int)", ("other", None)),
    ],
)
def test_classify_query(query: str, expected: tuple) -> None:
    assert classify_query(query) == expected


# ----------------------------------------------------------------------------- mapping


def test_event_mapper_rules() -> None:
    table = OutboxTable("shop", "outbox", topic="outbox.event.{aggregate_type}")
    m = EventMapper([table])
    ok = m.map(
        "shop", "outbox", {"id": 7, "aggregatetype": "order", "aggregateid": "o1", "type": "created", "payload": "{}"}
    )
    assert ok["expected_topic"] == "outbox.event.order" and ok["dlq_cause"] is None
    assert ok["event_id"] == "7" and ok["payload"] == b"{}" and ok["payload_is_text"] is True
    bad = m.map(
        "shop", "outbox", {"id": 8, "aggregatetype": "bad type", "aggregateid": "o1", "type": "x", "payload": None}
    )
    assert bad["dlq_cause"] == "illegal_topic" and bad["expected_topic"] == "outbox.event.bad type"
    null = m.map("shop", "outbox", {"id": 9, "aggregatetype": None, "aggregateid": "o1", "type": "x", "payload": None})
    assert null["dlq_cause"] == "null_column"
    gone = m.map("shop", "outbox", {"id": 9, "aggregateid": "o1", "type": "x", "payload": None})
    assert gone["dlq_cause"] == "missing_column"
    uid = uuid.uuid4()
    binary = m.map(
        "shop",
        "outbox",
        {"id": uid.bytes, "aggregatetype": "order", "aggregateid": b"o2", "type": "x", "payload": b"\x00\x01"},
    )
    assert binary["event_id"] == str(uid) and binary["aggregate_id"] == "o2"
    assert binary["payload"] == b"\x00\x01" and binary["payload_is_text"] is False
    js = m.map(
        "shop", "outbox", {"id": 1, "aggregatetype": "order", "aggregateid": "o", "type": "x", "payload": {"a": [1, 2]}}
    )
    assert js["payload"] == b'{"a":[1,2]}'
    allow = EventMapper([table], allowlist=("outbox.event.inv*",))
    assert (
        allow.map("shop", "outbox", {"id": 1, "aggregatetype": "order", "aggregateid": "o", "type": "x"})["dlq_cause"]
        == "topic_not_allowed"
    )


def test_events_of_tx_coordinates() -> None:
    from spark_jobs.mysql.binlog_assembly import CommittedTx

    table = OutboxTable("shop", "outbox")
    tx = CommittedTx(
        start=1000, end=1500, gtid="0-1-42", server_id=1, commit_ts=1_700_000_123,
        rows=[("shop", "outbox", {"id": i, "aggregatetype": "order", "aggregateid": "a", "type": "t", "payload": "p"}) for i in range(3)],
    )  # fmt: skip
    out = list(events_of_tx("src", "mysql-bin.000042", tx, EventMapper([table])))
    assert [e["row"] for e in out] == [0, 1, 2]
    assert all(e["tx_pos"] == 1000 and e["tx_end"] == 1500 and e["file_seq"] == 42 for e in out)
    assert out[0]["commit_ts_ms"] == 1_700_000_123_000
    assert out[2]["ikey"] == identity_key("src", "0-1-42", "mysql-bin.000042", 1000, 2)
    assert set(out[0]) == {n for n, _ in BINLOG_FIELDS}


# ----------------------------------------------------------------------------- decoding


def encode_value(record: dict[str, Any], schema_id: int = 1) -> bytes:
    import io

    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(buf, avro_schema(), record)
    return buf.getvalue()


def test_decode_record_identity_and_avro() -> None:
    value = encode_value(
        {
            "id": "7",
            "aggregate_type": "order",
            "aggregate_id": "o1",
            "type": "created",
            "payload": "hé",
            "timestamp": 123,
        }
    )
    headers = {
        hdr.H_SOURCE: "s", hdr.H_FILE: "mysql-bin.000003", hdr.H_POS: "900", hdr.H_ROW: "1", hdr.H_GTID: "0-1-5",
        hdr.H_COMMIT_TS: "1700000000000", hdr.H_EVENT_ID: "7", hdr.H_EVENT_TYPE: "created", hdr.H_REPAIR: "1",
    }  # fmt: skip
    d = decode_record("outbox.event.order", headers, value, DLQ)
    assert d["ikey"] == identity_key("s", "0-1-5", "mysql-bin.000003", 900, 1)
    assert d["h_file_seq"] == 3 and d["h_pos"] == 900 and d["h_row"] == 1 and d["repair"] is True
    assert d["v_payload"] == "hé".encode() and d["v_payload_is_text"] is True and d["v_timestamp_us"] == 123
    assert d["schema_id"] == 1 and d["value_error"] is None
    assert set(d) == {n for n, _ in fields_for(False, True)} - {n for n, _ in fields_for(False, False)}
    raw = encode_value(
        {"id": "7", "aggregate_type": "o", "aggregate_id": "o1", "type": "c", "payload": b"\x01", "timestamp": None}
    )
    assert decode_record("t", headers, raw, DLQ)["v_payload_is_text"] is False


def test_decode_value_errors() -> None:
    assert decode_value(b"\x01\x00\x00\x00\x01abc")[2].startswith("not Confluent")
    good = encode_value(
        {"id": "7", "aggregate_type": "o", "aggregate_id": "a", "type": "t", "payload": None, "timestamp": None}
    )
    assert decode_value(good + b"xx")[2] == "2 trailing byte(s) after the Avro record"
    assert decode_value(good[:8])[2].startswith("Avro decoding failed")
    assert decode_record(DLQ, {}, b"not json", DLQ)["value_error"].startswith("dead-letter value is not JSON")
    no_identity = decode_record("t", {hdr.H_SOURCE: "s"}, good, DLQ)
    assert no_identity["ikey"] is None


def test_murmur2_matches_kafka() -> None:
    # Kafka's UtilsTest.testMurmur2 vectors
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}  # fmt: skip
    for data, expected in cases.items():
        assert murmur2(data) == expected
    assert murmur2_partition(None, 4) is None


def test_secrets_are_redacted() -> None:
    settings = {"host": "h", "port": 1, "user": "u", "password": "hunter2"}
    assert redacted(settings)["password"] == "***"
    assert "hunter2" not in scrub("Access denied, password hunter2 wrong", settings)


# ----------------------------------------------------------------------------- report


def test_report_exit_rule_and_outputs(tmp_path: Any) -> None:
    from spark_jobs.report import VerifyReport, render_html, summary_text

    def rep(**counts: int) -> VerifyReport:
        base = {
            c: 0
            for c in (
                "delivered",
                "missing",
                "duplicate",
                "phantom",
                "reordered",
                "altered",
                "dead_lettered",
                "unverifiable",
            )
        }
        base.update(counts)
        return VerifyReport(
            summary={"counts": base, "latency": {"count": 0, "note": "x"}, "examples": {}}, inputs={}, config={}
        )

    assert rep(delivered=5, dead_lettered=2, unverifiable=3).ok
    for bad in ("missing", "duplicate", "phantom", "reordered", "altered"):
        assert not rep(**{bad: 1}).ok
    r = rep(delivered=3, missing=1)
    r.summary["latency"] = {
        "count": 3, "p50_ms": 5, "p95_ms": 9, "p99_ms": 9, "max_ms": 9, "min_ms": 1, "mean_ms": 5.0, "note": "second resolution",
        "histogram": {"bin_width_ms": 2, "bins": [{"from_ms": 1, "count": 1}, {"from_ms": 5, "count": 2}]},
        "lag_over_time": {"bucket_seconds": 1, "points": [{"commit_second": 1, "max_latency_ms": 3, "events": 1}, {"commit_second": 2, "max_latency_ms": 9, "events": 2}]},
    }  # fmt: skip
    html = render_html(r)
    assert html.count("<svg") >= 3 and "missing" in html
    text = summary_text(r)
    assert "FAILED" in text and "missing=1" in text
    parsed = json.loads(r.to_json())
    assert parsed["ok"] is False and parsed["counts"]["missing"] == 1


# ============================================================================= Spark


# ----------------------------------------------------------------------------- columnar readers


class _Msg:
    """The confluent-kafka Message methods the reader calls."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list | None, ts: tuple[int, int] = (1, 1_700_000_000_123)):  # fmt: skip
        self._t, self._p, self._o, self._k, self._v, self._h, self._ts = (
            topic,
            partition,
            offset,
            key,
            value,
            headers,
            ts,
        )

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list | None:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        return self._ts


def _sample_messages() -> list[_Msg]:
    base = [(hdr.H_SOURCE, b"s"), (hdr.H_FILE, b"mysql-bin.000003"), (hdr.H_POS, b"900"), (hdr.H_ROW, b"1"),
            (hdr.H_GTID, b"0-1-5"), (hdr.H_COMMIT_TS, b"1700000000000"), (hdr.H_EVENT_ID, b"7"),
            (hdr.H_EVENT_TYPE, b"created"), (hdr.H_TABLE, b"shop.outbox")]  # fmt: skip
    rec = {
        "id": "7",
        "aggregate_type": "order",
        "aggregate_id": "o1",
        "type": "created",
        "payload": "hé",
        "timestamp": 123,
    }
    good = encode_value(rec)
    long_text = encode_value({**rec, "payload": "x" * 5000, "id": "é" * 300, "timestamp": -(1 << 60)})
    binary = encode_value({**rec, "payload": b"\x00\xff", "timestamp": None})
    null_payload = encode_value({**rec, "payload": None}, schema_id=77)
    msgs = [
        _Msg(TOPIC, 0, 0, b"o1", good, base),
        _Msg(TOPIC, 0, 1, b"o1", long_text, base + [(hdr.H_REPAIR, b"1")]),
        _Msg(TOPIC, 1, 2, None, binary, [(hdr.H_POS, b"x")] + base[:2] + [(hdr.H_ROW, None)], ts=(0, -1)),
        _Msg(TOPIC, 1, 3, b"\xff\xfe", null_payload, [(h, v) for h, v in base if h != hdr.H_GTID]),  # file/pos identity
        _Msg(TOPIC, 1, 4, b"k", good + b"xx", base),  # trailing bytes
        _Msg(TOPIC, 1, 5, b"k", good[:8], base),  # truncated
        _Msg(TOPIC, 1, 6, b"k", b"\x01\x00\x00\x00\x01abc", None),  # not wire format
        _Msg(TOPIC, 1, 7, b"k", None, []),  # null value
        _Msg(TOPIC, 1, 8, b"k", b"\x00\x00\x00\x00\x01" + good[5:-1] + b"\x06", base),  # bad union index
        _Msg(DLQ, 0, 9, b"k", b'{"a": 1}', base + [(hdr.H_DLQ_CAUSE, b"too_large"), (hdr.H_DLQ_TOPIC, b"t")]),
        _Msg(DLQ, 0, 10, b"k", b"not json", base),
        _Msg(TOPIC, 0, 11, b"k", good, base + [(hdr.H_SOURCE, b"other"), (hdr.H_SOURCE, None)]),  # last non-null wins
    ]
    return msgs


@pytest.mark.verifier_deps
@pytest.mark.parametrize("include_raw,decode", [(False, True), (True, True), (True, False), (False, False)])
def test_record_columns_equal_message_row(include_raw: bool, decode: bool) -> None:
    from spark_jobs.records import RecordColumns, message_row

    msgs = _sample_messages()
    cols = RecordColumns(include_raw, decode, DLQ)
    assert cols.fast_avro  # the schema file has the layout the fast decoder reads
    for m in msgs:
        cols.add(m)
    got = cols.take().to_pylist()
    want = [message_row(m, include_raw, decode, DLQ) for m in msgs]
    if include_raw:
        for w in want:
            w["headers"] = list(w["headers"].items())
    assert got == want
    assert cols.n == 0 and cols.take().num_rows == 0


@pytest.mark.verifier_deps
def test_record_columns_without_the_fast_avro_path_agree(monkeypatch: Any) -> None:
    import spark_jobs.kafka.source as ks

    msgs = _sample_messages()
    fast = ks.RecordColumns(False, True, DLQ)
    slow = ks.RecordColumns(False, True, DLQ)
    slow.fast_avro = False
    for m in msgs:
        fast.add(m)
        slow.add(m)
    assert fast.take().to_pylist() == slow.take().to_pylist()


@pytest.mark.verifier_deps
def test_event_columns_equal_events_of_tx() -> None:
    from spark_jobs.mysql.binlog_assembly import CommittedTx
    from spark_jobs.mysql.binlog_rows import EventColumns, anomaly_row

    table = OutboxTable("shop", "outbox", topic="outbox.event.{aggregate_type}", timestamp_column="created_at")
    mapper = EventMapper([table], allowlist=("outbox.event.o*",))
    rows = [
        {"id": 1, "aggregatetype": "order", "aggregateid": "a", "type": "t", "payload": "p", "created_at": None},
        {"id": uuid.uuid4().bytes, "aggregatetype": "invoice", "aggregateid": b"b", "type": "t", "payload": b"\x00"},
        {"id": 3, "aggregatetype": "bad type", "aggregateid": "c", "type": "t", "payload": {"x": 1}, "created_at": 17},
        {"id": 4, "aggregatetype": None, "aggregateid": "d", "type": "t", "payload": None},
        {"id": 5, "aggregateid": "e", "type": "t"},
    ]
    txs = [
        (
            "mysql-bin.000042",
            CommittedTx(1000, 1500, "0-1-42", 1, 1_700_000_123, [("shop", "outbox", r) for r in rows]),
        ),
        ("mysql-bin.000042", CommittedTx(2000, 2500, None, 2, 1_700_000_124, [("shop", "outbox", rows[0])])),
        ("mysql-bin.000043", CommittedTx(4, 50, "0-1-43", 1, 1_700_000_125, [])),
    ]
    cols = EventColumns("src", mapper)
    want = []
    for file, tx in txs:
        cols.add_tx(file, tx)
        want += list(events_of_tx("src", file, tx, mapper))
    cols.add_row(anomaly_row("src", "mysql-bin.000042", "something odd"))
    want.append(anomaly_row("src", "mysql-bin.000042", "something odd"))
    names = [n for n, _ in BINLOG_FIELDS]
    assert cols.take().to_pylist() == [{n: w[n] for n in names} for w in want]
