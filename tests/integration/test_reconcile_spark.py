"""The verifier's Spark reconciliation held against the pure-python reference
(`spark_jobs.reconcile_reference.reconcile_reference`, unit-tested in tests/unit/test_reconcile.py):
every fault class, truncation and unread topics, random histories, XA and statement-logged
inserts. Starts a local Spark session (the `spark` fixture)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from spark_jobs.common import murmur2_partition
from spark_jobs.mysql.binlog_rows import BINLOG_FIELDS
from spark_jobs.reconcile_reference import reconcile_reference, resolve_xa_rows
from spark_jobs.reconcile_rules import ReconcileContext
from spark_jobs.records import fields_for
from tests.unit.test_reconcile import DLQ, TOPIC, clean_scenario, ctx, make_event, make_record

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _frames(spark: Any, events: list[dict], records: list[dict]) -> tuple[Any, Any]:
    from spark_jobs.mysql.binlog_rows import BINLOG_SCHEMA
    from spark_jobs.records import schema_for

    cols_e = [n for n, _ in BINLOG_FIELDS]
    cols_r = [n for n, _ in fields_for(False, True)]
    ev = spark.createDataFrame([tuple(e.get(c) for c in cols_e) for e in events], BINLOG_SCHEMA)
    rec = spark.createDataFrame([tuple(r.get(c) for c in cols_r) for r in records], schema_for(False, True))
    return ev, rec


def _spark_result(spark: Any, events: list[dict], records: list[dict], c: ReconcileContext) -> dict[str, Any]:
    from spark_jobs.reconcile import reconcile
    from spark_jobs.reconcile_summary import summarize

    ev, rec = _frames(spark, events, records)
    rc = reconcile(ev, rec, c)
    try:
        out = {
            "event_class": {r["ikey"]: r["class"] for r in rc.events.select("ikey", "class").collect()},
            "event_reasons": {
                r["ikey"]: list(r["reasons"]) for r in rc.events.filter("n = 1").select("ikey", "reasons").collect()
            },
            "unv": {r["ikey"]: r["unverifiable_reason"] for r in rc.events.filter("class = 'unverifiable'").collect()},
            "deliveries": {
                r["ikey"]: [(d["topic"], d["partition"], d["offset"]) for d in (r["deliveries"] or [])]
                for r in rc.events.select("ikey", "deliveries").collect()
            },
            "record_class": {
                (r["topic"], r["partition"], r["offset"]): (r["class"], r["reason"]) for r in rc.records.collect()
            },
            "violations": {(r["topic"], r["partition"], r["offset"]) for r in rc.violations.collect()},
            "latencies": {r["ikey"]: r["latency_ms"] for r in rc.events.filter("latency_ms is not null").collect()},
            "summary": summarize(rc, max_examples=5),
        }
    finally:
        rc.unpersist()
    return out


def _assert_same(spark_out: dict[str, Any], ref: Any) -> None:
    assert spark_out["event_class"] == ref.event_class
    assert {k: v for k, v in spark_out["event_reasons"].items()} == ref.event_reasons
    assert spark_out["unv"] == ref.event_unverifiable_reason
    assert spark_out["deliveries"] == ref.deliveries
    assert spark_out["record_class"] == ref.record_class
    assert spark_out["violations"] == ref.order_violations
    assert spark_out["latencies"] == ref.latencies
    s = spark_out["summary"]
    assert s["counts"] == ref.counts()
    vt = s["verified_through"]
    assert (vt["file"], vt["pos"]) == ref.verified_through
    fu = s["first_unproven"]
    assert (None if fu is None else (fu["file"], fu["pos"], fu["row"])) == ref.first_unproven


@pytest.mark.spark
def test_spark_every_fault_class_matches_reference(spark: Any) -> None:
    events, records = clean_scenario()
    # missing: drop events[2]; duplicate: events[0] twice; altered: events[4] payload;
    # reordered: a1's events at pos 300 row 1 before an earlier one; phantom; out of range
    records = [r for r in records if r["ikey"] != events[2]["ikey"]]
    records.append(make_record(events[0], partition=0, offset=10))
    next(r for r in records if r["ikey"] == events[4]["ikey"])["v_payload"] = b"tampered"
    late = make_event(600, 0, agg="a1")
    early = make_event(550, 0, agg="a1")
    events += [early, late]
    records += [make_record(late, partition=0, offset=11), make_record(early, partition=0, offset=12)]
    records.append(make_record(make_event(650, 0, agg="a9"), partition=1, offset=20))  # phantom
    records.append(make_record(make_event(2, 0, agg="a9"), partition=1, offset=21))  # before range
    foreign = make_record(make_event(660, 0), partition=1, offset=22, source="elsewhere")
    records.append(foreign)
    c = ctx()
    ref = reconcile_reference(events, records, c)
    counts = ref.counts()
    assert counts == {
        "delivered": 3, "missing": 1, "duplicate": 1, "phantom": 1, "reordered": 1, "altered": 1,
        "dead_lettered": 1, "unverifiable": 1,
    }  # fmt: skip
    out = _spark_result(spark, events, records, c)
    _assert_same(out, ref)
    s = out["summary"]
    assert s["examples"]["missing"][0]["binlog"] == {
        "file": "mysql-bin.000001", "pos": 300, "row": 0, "gtid": events[2]["gtid"], "tx_end": 350,
        "commit_ts_ms": events[2]["commit_ts_ms"], "server_id": 1,
    }  # fmt: skip
    dup = s["examples"]["duplicate"][0]
    assert [(d["topic"], d["partition"], d["offset"]) for d in dup["deliveries"]] == [(TOPIC, 0, 0), (TOPIC, 0, 10)]
    assert s["examples"]["phantom"][0]["kafka"] == {
        "topic": TOPIC,
        "partition": 1,
        "offset": 20,
        "timestamp_ms": records[-3]["timestamp_ms"],
    }
    assert s["records"]["foreign"] == 1
    assert s["altered_reasons"] == {"payload": 1}
    assert s["dead_letter_causes"] == {"illegal_topic": 1}
    assert s["latency"]["count"] == 7 and s["latency"]["p50_ms"] == 250


@pytest.mark.spark
def test_spark_truncation_and_unread_topics_match_reference(spark: Any) -> None:
    keys = {}
    for i in range(200):
        keys.setdefault(murmur2_partition(f"k{i}", 2), f"k{i}")
    evs = [make_event(100 * (i + 1), 0, agg=keys[i % 2]) for i in range(6)]
    evs.append(make_event(900, 0, agg="z", topic="outbox.event.unread"))
    recs = [make_record(evs[4], partition=1, offset=3)]
    c = ctx(
        partitions=((TOPIC, 0, 0, 0), (TOPIC, 1, 3, 4), (DLQ, 0, 0, 0)),
        partitioner="murmur2",
        unread_topics=("outbox.event.unread",),
    )
    ref = reconcile_reference(evs, recs, c)
    assert ref.event_unverifiable_reason  # the scenario exercises the rule
    assert set(ref.event_class.values()) >= {"missing", "unverifiable", "delivered"}
    _assert_same(_spark_result(spark, evs, recs, c), ref)


@pytest.mark.spark
def test_spark_truncated_audit_stream_matches_reference(spark: Any) -> None:
    other = "outbox.event.invoice"
    evs = [make_event(100 * (i + 1), 0, agg=f"a{i % 3}", topic=other if i % 2 else TOPIC) for i in range(6)]
    recs = [make_record(evs[3], partition=0, offset=7), make_record(evs[5], partition=0, offset=8)]
    c = ctx(partitions=(("audit", 0, 7, 9),), partition_counts={TOPIC: 1, other: 1, DLQ: 1}, routed_stream="audit")
    ref = reconcile_reference(evs, recs, c)
    assert set(ref.event_unverifiable_reason.values()) == {"partition_truncated"}
    assert set(ref.event_class.values()) == {"missing", "unverifiable", "delivered"}
    _assert_same(_spark_result(spark, evs, recs, c), ref)


@pytest.mark.spark
@pytest.mark.parametrize("rounds", [1, pytest.param(3, marks=pytest.mark.extended)])
def test_spark_random_histories_match_reference(spark: Any, rounds: int) -> None:
    """Random relay histories with random faults: Spark and the reference agree. One
    history in the README's test command, three with `./run.sh test -m extended` (the
    first is the same history: one seed)."""
    rng = random.Random(20240601)
    for _round in range(rounds):
        events: list[dict] = []
        pos = 100
        for _tx in range(40):
            for row in range(rng.randint(1, 3)):
                agg = f"k{rng.randint(0, 5)}"
                dlq = rng.random() < 0.05
                events.append(
                    make_event(pos, row, agg=agg, gtid=None if rng.random() < 0.2 else "auto",
                               topic="outbox.event.x y" if dlq else TOPIC, dlq_cause="illegal_topic" if dlq else None)
                )  # fmt: skip
            pos += 200
        records: list[dict] = []
        offsets = {0: 0, 1: 0, "dlq": 0}
        for e in events:
            fault = rng.random()
            if fault < 0.05:
                continue  # lost
            p = murmur2_partition(e["aggregate_id"], 2)
            copies = 2 if fault > 0.95 else 1
            for _ in range(copies):
                if e["dlq_cause"]:
                    records.append(make_record(e, offset=offsets["dlq"]))
                    offsets["dlq"] += 1
                else:
                    over = {"v_payload": b"x"} if 0.05 <= fault < 0.08 else {}
                    records.append(make_record(e, partition=p, offset=offsets[p], **over))
                    offsets[p] += 3  # gaps, as transaction markers leave
        # swap a few neighbours in each partition
        for p in (0, 1):
            mine = [r for r in records if r["topic"] == TOPIC and r["partition"] == p]
            for _ in range(2):
                i = rng.randrange(len(mine) - 1)
                mine[i]["offset"], mine[i + 1]["offset"] = mine[i + 1]["offset"], mine[i]["offset"]
        records.append(make_record(make_event(pos + 10, 0, agg="k1"), partition=0, offset=9999))  # phantom
        c = ctx(partitioner="murmur2", partitions=((TOPIC, 0, 0, 9999), (TOPIC, 1, 0, 9999), (DLQ, 0, 0, 999)))
        ref = reconcile_reference(events, records, c)
        _assert_same(_spark_result(spark, events, records, c), ref)


@pytest.mark.spark
def test_spark_xa_statement_and_prepare_before_range_match_reference(spark: Any) -> None:
    """resolve_xa (Spark) against resolve_xa_rows: a commit read after other transactions
    and in another file than its prepare, a rollback, an xid used again and left
    undecided, an outcome of a prepare before the range; a statement-logged insert with
    its dead letter; records of each, one XA record lost."""
    from tests.unit.test_verify_xa import marker, xa_row

    xid2 = "X'7832',X'',1"
    stmt = make_event(700, 0, file_seq=2, dlq_cause="statement_format", topic=None)
    after_stmt = make_event(700, 1, file_seq=2)
    rows = [
        xa_row(100, 0), xa_row(100, 1), make_event(200, 0), marker(50, "xa_commit", file_seq=2),
        xa_row(300, 0, xid=xid2), marker(400, "xa_rollback", xid=xid2), xa_row(500, 0, xid=xid2, file_seq=2),
        marker(600, "xa_commit", xid="X'7a',X'',1"), stmt, after_stmt,
        marker(60, "xa_commit", xid="X'7831',X'',1", file_seq=2, gtid=None),  # pairs with nothing: after the commit at 2:50
    ]  # fmt: skip
    resolved = {(e["kind"], e["tx_pos"], e["row"]): e for e in resolve_xa_rows(rows)}
    records = [make_record(resolved[("xa_event", 50, 0)], offset=0), make_record(resolved[("event", 200, 0)], offset=1),
               make_record(stmt, topic=DLQ, offset=0, dlq_cause="statement_format"), make_record(after_stmt, offset=2),
               make_record(make_event(600, 0, file_seq=2), offset=3, h_xa_prepare="mysql-bin.000000:9", h_xa_file_seq=0,
                           h_xa_pos=9)]  # fmt: skip
    c = ctx(range_end=("mysql-bin.000003", 3, 100))
    ref = reconcile_reference(rows, records, c)
    assert ref.counts()["missing"] == 1 and ref.counts()["unverifiable"] == 3  # x1 row 1; undecided, statement, record
    assert set(ref.event_unverifiable_reason.values()) == {"xa_undecided", "statement_format"}
    _assert_same(_spark_result(spark, rows, records, c), ref)


def test_spark_latency_is_measured_from_the_best_commit_clock_and_names_it(spark: Any) -> None:
    """MySQL's immediate_commit_timestamp, else the outbox timestamp column, else the
    commit event header: the same in the reference and in Spark, counted per clock."""
    mysql, column, header = make_event(100, 0), make_event(200, 0), make_event(300, 0)
    mysql["commit_us"] = mysql["commit_ts_ms"] * 1000 - 400_000  # the header rounds the second up
    column["timestamp_us"] = column["commit_ts_ms"] * 1000 - 900_000
    events = [mysql, column, header]
    records = [make_record(e, offset=i) for i, e in enumerate(events)]
    c = ctx()
    ref = reconcile_reference(events, records, c)
    assert ref.latencies == {mysql["ikey"]: 650, column["ikey"]: 1150, header["ikey"]: 250}
    out = _spark_result(spark, events, records, c)
    _assert_same(out, ref)
    assert out["summary"]["latency"]["clocks"] == {
        "mysql_immediate_commit_timestamp": 1,
        "outbox_timestamp_column": 1,
        "binlog_commit_header": 1,
    }
