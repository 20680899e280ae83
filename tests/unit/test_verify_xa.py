"""Unit tests of the verifier's side of issue 11 (no servers): its own assembly of XA
prepare and outcome groups, statement-logged outbox inserts and REPLACE written as
delete + insert; the pairing of prepares with outcomes across partitions
(`resolve_xa_rows`); the reconcile rules for them; the report's exit rule."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.events.outbox import OutboxTable
from spark_jobs.common import identity_key
from spark_jobs.mysql.binlog_assembly import (
    XA_COMMITTED,
    XA_PREPARED,
    XA_ROLLED_BACK,
    CommittedTx,
    TxAssembler,
    canonical_xid,
    classify_query,
    statement_insert_target,
)
from spark_jobs.mysql.binlog_assembly import assemble_query as _query
from spark_jobs.mysql.binlog_rows import BINLOG_FIELDS, EventColumns, EventMapper, events_of_tx
from spark_jobs.reconcile_reference import reconcile_reference, resolve_xa_rows
from tests.unit.test_reconcile import DLQ, SOURCE, ctx, make_event, make_record

TABLE = OutboxTable("shop", "outbox")
WANTED = {("shop", "outbox")}
XID = "X'7831',X'',1"


def row(i: Any) -> dict[str, Any]:
    return {"id": i, "aggregatetype": "order", "aggregateid": "k", "type": "t", "payload": "p"}


def asm() -> TxAssembler:
    return TxAssembler(id_columns={("shop", "outbox"): "id"})


# ----------------------------------------------------------------------------- assembly


def test_xa_prepare_group_hands_its_rows_over_tagged_and_the_outcome_as_a_marker() -> None:
    a = asm()
    a.gtid_event(100, "0-1-5", 1, implies_begin=True)  # MariaDB: the GTID event opens the prepare group
    a.add_rows("shop", "outbox", [row(1), row(2)], 150)
    assert _query(a, "XA END X'7831',X'',1", "shop", 200, 250, 7, 1, WANTED) is None
    tx = a.xa_prepare(XID, 300, 1_700_000_000)
    assert tx is not None and tx.xa == (XA_PREPARED, XID) and (tx.start, tx.end, tx.gtid) == (100, 300, "0-1-5")
    assert [v["id"] for _, _, v in tx.rows] == [1, 2] and not a.open
    # later, another transaction, then the outcome group: standalone GTID + XA COMMIT
    a.gtid_event(400, "0-1-6", 1, implies_begin=True)
    a.add_rows("shop", "outbox", [row(3)], 450)
    plain = a.commit(500, 1_700_000_001)
    assert plain is not None and plain.xa is None
    a.gtid_event(500, "0-1-7", 2, standalone=True, implies_begin=True)
    out = _query(a, "XA COMMIT X'7831',X'',1", "", 540, 600, 1_700_000_009, 2, WANTED)
    assert out is not None and out.xa == (XA_COMMITTED, XID) and out.rows == []
    assert (out.start, out.end, out.gtid, out.server_id, out.commit_ts) == (500, 600, "0-1-7", 2, 1_700_000_009)
    a.gtid_event(600, "0-1-8", 2, standalone=True, implies_begin=True)
    rb = _query(a, "XA ROLLBACK 'x2'", "", 640, 700, 3, 2, WANTED)
    assert rb is not None and rb.xa == (XA_ROLLED_BACK, "X'7832',X'',1")
    assert not a.anomalies


def test_xa_one_phase_and_outcome_without_gtids() -> None:
    a = asm()
    a.begin(100, 1)  # MySQL without GTIDs: XA START is a BEGIN
    a.add_rows("shop", "outbox", [row(1)], 150)
    tx = _query(a, "XA COMMIT 'x3' ONE PHASE", "", 200, 250, 9, 1, WANTED)
    assert tx is not None and tx.xa is None and len(tx.rows) == 1  # an ordinary transaction
    a.begin(300, 1)
    a.add_rows("shop", "outbox", [row(2)], 350)
    one = a.xa_prepare(XID, 400, 10, one_phase=True)  # MySQL's one-phase XA_prepare event
    assert one is not None and one.xa is None and len(one.rows) == 1
    out = _query(a, "XA COMMIT X'7831',X'',1", "", 500, 560, 11, 1, WANTED)  # no GTID event: starts at the query
    assert out is not None and (out.start, out.gtid, out.xa) == (500, None, (XA_COMMITTED, XID))


def test_statement_logged_insert_takes_one_row_index_and_a_rollback_drops_it() -> None:
    a = asm()
    a.gtid_event(100, "0-1-1", 1, implies_begin=True)
    a.add_rows("shop", "outbox", [row(1)], 110)
    sql = "INSERT INTO outbox (id) VALUES ('s')"
    assert _query(a, sql, "shop", 120, 160, 1, 1, WANTED) is None
    _query(a, "INSERT INTO other.outbox VALUES (1)", "shop", 160, 170, 1, 1, WANTED)  # another schema's table
    _query(a, "INSERT INTO audit SELECT * FROM outbox", "shop", 170, 180, 1, 1, WANTED)  # writes audit, not the outbox
    a.add_rows("shop", "outbox", [row(2)], 180)
    tx = a.commit(200, 1)
    assert tx is not None and [r[2] if isinstance(r[2], str) else r[2]["id"] for r in tx.rows] == [1, sql, 2]
    events = list(events_of_tx(SOURCE, "mysql-bin.000001", tx, EventMapper([TABLE])))
    assert [(e["row"], e["dlq_cause"]) for e in events] == [(0, None), (1, "statement_format"), (2, None)]
    assert events[1]["ikey"] == identity_key(SOURCE, "0-1-1", "mysql-bin.000001", 100, 1)
    assert events[1]["table"] == "shop.outbox" and events[1]["event_id"] is None and events[1]["expected_topic"] is None
    # in a transaction that ends in ROLLBACK it is nothing
    a.begin(300, 1)
    _query(a, sql, "shop", 310, 350, 1, 1, WANTED)
    _query(a, "ROLLBACK", "shop", 350, 380, 1, 1, WANTED)
    assert not a.open and not a.anomalies


@pytest.mark.parametrize(
    "sql,schema,expected",
    [
        ("INSERT INTO outbox (id) VALUES (1)", "shop", ("shop", "outbox")),
        ("insert ignore into `shop`.`outbox` values (1)", "x", ("shop", "outbox")),
        ("/* c */ REPLACE LOW_PRIORITY outbox VALUES (1)", "shop", ("shop", "outbox")),
        ("LOAD DATA INFILE '/tmp/a.csv' INTO TABLE `outbox` (id)", "shop", ("shop", "outbox")),
        ("LOAD DATA LOCAL INFILE 'f' REPLACE INTO TABLE s2.outbox", "shop", ("s2", "outbox")),
        ("INSERT INTO audit SELECT * FROM outbox", "shop", ("shop", "audit")),
        ("UPDATE outbox SET payload = 'x'", "shop", None),
        ("DELETE FROM outbox", "shop", None),
        ("CREATE TABLE outbox2 LIKE outbox", "shop", None),
    ],
)
def test_statement_insert_target(sql: str, schema: str, expected: tuple | None) -> None:
    assert statement_insert_target(sql, schema) == expected


def test_replace_as_delete_then_insert_of_one_id_is_no_event() -> None:
    a = asm()
    a.gtid_event(100, "0-1-1", 1, implies_begin=True)
    a.delete_rows("shop", "outbox", [row("r1")])
    a.add_rows("shop", "outbox", [row("r1"), row("new")], 150)  # r1 again: a change; "new": an event
    a.add_rows_of([("shop", "outbox", row("r1"))], 160)  # the fast reader's path: the same rule
    tx = a.commit(200, 1)
    assert tx is not None and [v["id"] for _, _, v in tx.rows] == ["new"]
    # the rule holds within one transaction only
    a.gtid_event(200, "0-1-2", 1, implies_begin=True)
    a.add_rows("shop", "outbox", [row("r1")], 250)
    tx = a.commit(300, 1)
    assert tx is not None and [v["id"] for _, _, v in tx.rows] == ["r1"]


@pytest.mark.parametrize(
    "query,expected",
    [
        ("XA START 'x1'", ("begin", None)),
        ("XA END X'7831',X'',1", ("xa_end", XID)),
        ("XA COMMIT X'7831',X'',1", ("xa_commit", XID)),
        ("XA ROLLBACK X'7831',X'',1", ("xa_rollback", XID)),
        ("xa commit 'x1'", ("xa_commit", XID)),
        ("XA COMMIT 'x1','b',7 ONE PHASE", ("xa_commit_one_phase", "X'7831',X'62',7")),
        ("XA COMMIT X'00ff',X'',0", ("xa_commit", "X'00ff',X'',0")),
    ],
)
def test_classify_xa_queries(query: str, expected: tuple) -> None:
    assert classify_query(query) == expected


def test_canonical_xid_leaves_what_is_no_xid_alone() -> None:
    assert canonical_xid("X'7831',X'',1") == XID
    assert canonical_xid("'x1'") == XID
    assert canonical_xid("not an xid") == "not an xid"


@pytest.mark.verifier_deps
def test_event_columns_equal_events_of_tx_for_xa_and_statement_rows() -> None:
    mapper = EventMapper([TABLE])
    txs = [
        ("mysql-bin.000003", CommittedTx(100, 300, "0-1-5", 1, 10, [("shop", "outbox", row(1)), ("shop", "outbox", "INSERT ...")], (XA_PREPARED, XID))),
        ("mysql-bin.000003", CommittedTx(300, 400, "0-1-6", 1, 11, [("shop", "outbox", "INSERT INTO outbox ..."), ("shop", "outbox", row(2))])),
        ("mysql-bin.000004", CommittedTx(4, 90, "0-1-7", 2, 12, [], (XA_COMMITTED, XID))),
        ("mysql-bin.000004", CommittedTx(90, 150, "0-1-8", 2, 13, [], (XA_ROLLED_BACK, "X'7832',X'',1"))),
        ("mysql-bin.000004", CommittedTx(150, 200, "0-1-9", 2, 13, [], (XA_PREPARED, XID))),  # a prepare without outbox rows
    ]  # fmt: skip
    cols = EventColumns(SOURCE, mapper)
    want: list[dict] = []
    for file, tx in txs:
        cols.add_tx(file, tx)
        want += list(events_of_tx(SOURCE, file, tx, mapper))
    names = [n for n, _ in BINLOG_FIELDS]
    got = cols.take().to_pylist()
    assert got == [{n: w[n] for n in names} for w in want]
    assert [(g["kind"], g["ikey"] is None, g["xa_xid"], g["xa_prepare"]) for g in got] == [
        ("xa_row", True, XID, "mysql-bin.000003:100"), ("xa_row", True, XID, "mysql-bin.000003:100"),
        ("event", False, None, None), ("event", False, None, None),
        ("xa_commit", True, XID, None), ("xa_rollback", True, "X'7832',X'',1", None),
    ]  # fmt: skip


# ----------------------------------------------------------------------------- pairing


def xa_row(pos: int, row_: int, xid: str = XID, file_seq: int = 1, **over: Any) -> dict[str, Any]:
    e = make_event(pos, row_, file_seq=file_seq, **over)
    e.update(kind="xa_row", ikey=None, xa_xid=xid, xa_prepare=f"{e['file']}:{pos}")
    return e


def marker(pos: int, kind: str, xid: str = XID, file_seq: int = 1, gtid: str | None = "auto") -> dict[str, Any]:
    e = make_event(pos, 0, file_seq=file_seq, gtid=gtid)
    for c in (
        "table",
        "event_id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "payload_is_text",
        "expected_topic",
    ):
        e[c] = None
    e.update(kind=kind, ikey=None, row=-1, xa_xid=xid)
    return e


def test_resolve_pairs_each_prepare_with_the_next_outcome_of_its_xid() -> None:
    """Rows and markers come from different partitions in any order; an xid may be used
    again after its outcome."""
    rows = [
        marker(900, "xa_commit", file_seq=2),  # commit of the first x1, in the next file
        xa_row(100, 0),
        xa_row(100, 1),  # x1 prepared at file 1:100
        make_event(200, 0),  # a plain transaction between
        xa_row(1000, 0, file_seq=2),  # x1 again, prepared after the commit ...
        marker(1100, "xa_rollback", file_seq=2),  # ... and rolled back
        xa_row(1200, 0, file_seq=2),  # x1 a third time: undecided at the end of the range
        marker(50, "xa_commit", xid="X'7a',X'',1"),  # an outcome whose prepare is before the range
        {**make_event(0, -1), "ikey": None, "kind": "anomaly"},
    ]
    out = {(e["kind"], e["row"], e["file_seq"], e["tx_pos"]): e for e in resolve_xa_rows(rows)}
    assert set(out) == {
        ("event", 0, 1, 200),
        ("xa_event", 0, 2, 900),
        ("xa_event", 1, 2, 900),
        ("xa_undecided", 0, 2, 1200),
    }
    committed = out[("xa_event", 1, 2, 900)]
    m = rows[0]
    assert committed["ikey"] == identity_key(SOURCE, m["gtid"], m["file"], 900, 1)
    assert (committed["gtid"], committed["tx_end"], committed["commit_ts_ms"]) == (
        m["gtid"],
        m["tx_end"],
        m["commit_ts_ms"],
    )
    assert committed["xa_prepare"] == "mysql-bin.000001:100" and committed["event_id"] == "e1-100-1"
    assert out[("xa_undecided", 0, 2, 1200)]["ikey"].startswith("x\x1f")


def test_reconcile_xa_events_match_commit_identity_and_undecided_stops_verified_through() -> None:
    plain = make_event(200, 0)
    rows = [xa_row(100, 0), xa_row(100, 1), plain, marker(300, "xa_commit"), xa_row(400, 0, xid="X'75',X'',1"),
            make_event(500, 0)]  # fmt: skip
    events = resolve_xa_rows(rows)
    by_kind = {(e["kind"], e["row"]): e for e in events}
    records = [
        make_record(e, offset=i)
        for i, e in enumerate([plain, by_kind[("xa_event", 0)], by_kind[("xa_event", 1)], rows[-1]])
    ]
    res = reconcile_reference(rows, records, ctx())
    assert res.counts() == {**{c: 0 for c in res.counts()}, "delivered": 4, "unverifiable": 1}
    undecided = by_kind[("xa_undecided", 0)]["ikey"]
    assert res.event_unverifiable_reason == {undecided: "xa_undecided"}
    assert res.verified_through == (
        "mysql-bin.000001",
        350,
    )  # the end of the XA commit group, before the prepare at 400
    assert res.first_unproven == ("mysql-bin.000001", 400, 0)
    # the same records against the rows read as if the commit were never seen: the XA
    # events are then undecided, and their records (committed in range) phantoms
    res = reconcile_reference([r for r in rows if r.get("kind") != "xa_commit"], records, ctx())
    assert res.counts()["phantom"] == 2 and res.counts()["unverifiable"] == 3


def test_xa_record_whose_prepare_lies_before_the_range_is_unverifiable_not_phantom() -> None:
    commit = make_event(300, 0, file_seq=2)
    rec = make_record(commit, h_xa_prepare="mysql-bin.000001:100", h_xa_file_seq=1, h_xa_pos=100)
    c = ctx(range_start=("mysql-bin.000002", 2, 4), range_end=("mysql-bin.000003", 3, 100))
    assert reconcile_reference([], [rec], c).record_class[(rec["topic"], 0, 0)] == (
        "unverifiable",
        "before_binlog_range",
    )
    rec2 = make_record(commit, h_xa_prepare="mysql-bin.000002:100", h_xa_file_seq=2, h_xa_pos=100)
    assert reconcile_reference([], [rec2], c).record_class[(rec2["topic"], 0, 0)] == ("phantom", None)


def test_statement_format_event_is_unverifiable_its_dead_letter_no_phantom_and_later_rows_match() -> None:
    stmt = make_event(100, 0, dlq_cause="statement_format", topic=None)
    after = make_event(100, 1)
    records = [make_record(stmt, topic=DLQ, offset=0, dlq_cause="statement_format"), make_record(after, offset=0)]
    res = reconcile_reference([stmt, after], records, ctx())
    assert res.event_class == {stmt["ikey"]: "unverifiable", after["ikey"]: "delivered"}
    assert res.event_unverifiable_reason == {stmt["ikey"]: "statement_format"}
    assert not res.record_class and res.verified_through == ("mysql-bin.000001", 4)
    # without any record it is unverifiable too (the relay stopped at it), never missing
    res = reconcile_reference([stmt], [], ctx())
    assert res.event_class == {stmt["ikey"]: "unverifiable"}
    # delivered twice it is a duplicate
    res = reconcile_reference([stmt], [records[0], {**records[0], "offset": 1}], ctx())
    assert res.event_class == {stmt["ikey"]: "duplicate"}


def test_report_fails_while_a_statement_format_position_exists() -> None:
    from spark_jobs.report import VerifyReport, summary_text

    counts = {"delivered": 3, "missing": 0, "duplicate": 0, "phantom": 0, "reordered": 0, "altered": 0, "dead_lettered": 0,
              "unverifiable": 2}  # fmt: skip
    ok = VerifyReport(
        summary={"counts": counts, "unverifiable_reasons": {"event:xa_undecided": 2}}, inputs={}, config={}
    )
    assert ok.ok and ok.problems == {}
    bad = VerifyReport(summary={"counts": counts, "unverifiable_reasons": {"event:statement_format": 1, "event:xa_undecided": 1}},
                       inputs={}, config={})  # fmt: skip
    assert not bad.ok and bad.problems == {"statement_format": 1}
    assert "FAILED" in summary_text(bad) and "statement_format" in summary_text(bad)
