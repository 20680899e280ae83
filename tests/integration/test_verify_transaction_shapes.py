"""The verifier on the transaction shapes of issue 11, against the real mariadbd, the
Kafka stand-in and the real relay (RelayThread): XA transactions and statement-logged
outbox writes.

One relay run writes three phases into one database; `cdc verify` (run_verify, on the
session's Spark) then checks ranges of it:
  1. XA COMMIT after XA PREPARE with other transactions and a FLUSH BINARY LOGS between
     them, XA ROLLBACK after prepare, XA COMMIT ONE PHASE, REPLACE of an existing id and
     an explicit DELETE + INSERT of one id in one transaction: clean, nothing unproven;
  2. an XA transaction prepared and undecided at the end of the range: its event is
     unverifiable (`xa_undecided`), verified_through stops before its prepare group;
  3. a statement-logged INSERT into the outbox (with `on_statement = "dead_letter"`)
     followed by a row-logged insert in the same transaction: the statement is
     unverifiable (`statement_format`), its dead letter no phantom, the row after it
     matches at the next row index, and the run fails (`cdc verify` exit 3) - read by
     both binlog readers, the fast one over ranges cut small;
  4. verified from the file after the rotation: the committed XA's records, whose
     prepare lies before the range, are unverifiable (`before_binlog_range`), not phantom.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cdc.config import load_config
from cdc.events.identity import H_DLQ_CAUSE, H_ROW
from cdc.position import BinlogPosition
from cdc_cli.verify_commands import verify_config
from spark_jobs.verify import run_verify
from tests.integration.harness import (
    RelayThread,
    env_for,
    insert_events,
    master_position,
    read_topic,
    relay_raw_config,
)  # fmt: skip
from tests.integration.test_relay_e2e import commit_events, create_outbox, ev, execute
from tests.integration.test_transaction_shapes import (
    binlog_events,
    xa_decide,
    xa_prepare,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]


COLS = "(id, aggregatetype, aggregateid, type, payload)"


def _pos(vt: dict[str, Any]) -> BinlogPosition:
    return BinlogPosition(vt["file"], int(vt["pos"]))


def _prepare_start(events: list[tuple], xid: str) -> BinlogPosition:
    """Where the prepare group of `xid` starts: its GTID event (SHOW BINLOG EVENTS shows
    it as `XA START X'<hex>',...`)."""
    hexed = xid.encode().hex()
    for file, pos, kind, _sid, _end, info in events:
        if kind == "Gtid" and info.startswith(f"XA START X'{hexed}'"):
            return BinlogPosition(file, int(pos))
    raise AssertionError(f"no XA prepare group of {xid} in the binlog")


def _group_start_of(events: list[tuple], marker: str) -> BinlogPosition:
    """The start (GTID event) of the transaction holding the Query whose text holds `marker`."""
    gtid_at = None
    for file, pos, kind, _sid, _end, info in events:
        if kind == "Gtid":
            gtid_at = BinlogPosition(file, int(pos))
        if kind == "Query" and marker in info:
            if gtid_at is None:
                break
            return gtid_at
    raise AssertionError(f"no transaction with a statement {marker!r} in the binlog")


def test_verify_xa_statement_and_replace_shapes(mariadb, kafka, database, topic_prefix, tmp_path, spark):
    create_outbox(mariadb, database)
    topic, dlq = f"{topic_prefix}.order", f"{topic_prefix}.dlq"
    kafka.create_topic(topic, 3)
    kafka.create_topic(dlq, 1)
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json",
                           outbox={"tables": [{"schema": database, "table": "outbox",
                                               "topic": topic_prefix + ".{aggregate_type}"}],
                                   "on_statement": "dead_letter"})  # fmt: skip
    cfg = load_config(raw, env_for(mariadb))
    start = raw["source"]["start"]
    start_file = BinlogPosition.parse(start).file
    undecided = True
    relay = RelayThread(cfg)
    try:
        # -- phase 1: XA commit across a rotation, XA rollback, ONE PHASE, REPLACE
        commit_events(mariadb, database, [ev("plain-1", aggregate_id="k")])
        xa_prepare(mariadb, database, "x1", [ev("x1-a", aggregate_id="k"), ev("x1-b", aggregate_id="k")])
        commit_events(mariadb, database, [ev("plain-2", aggregate_id="k")])
        execute(mariadb, database, "FLUSH BINARY LOGS")
        after_rotation = BinlogPosition.parse(master_position(mariadb)).file
        commit_events(mariadb, database, [ev("plain-3", aggregate_id="k")])
        xa_prepare(mariadb, database, "x2", [ev("x2-rolled-back")])
        xa_decide(mariadb, "x2", commit=False)
        xa_decide(mariadb, "x1", commit=True)
        with mariadb.connect(database, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.execute("XA START 'x3'")
            insert_events(conn, "outbox", [ev("x3-one-phase")])
            with conn.cursor() as cur:
                cur.execute("XA END 'x3'")
                cur.execute("XA COMMIT 'x3' ONE PHASE")
        execute(mariadb, database,
                f"INSERT INTO outbox {COLS} VALUES ('replaced','order','k','t','p')",
                f"REPLACE INTO outbox {COLS} VALUES ('replaced','order','k','t','again')",
                f"INSERT INTO outbox {COLS} VALUES ('re-inserted','order','k','t','p')",
                "BEGIN",
                "DELETE FROM outbox WHERE id = 're-inserted'",
                f"INSERT INTO outbox {COLS} VALUES ('re-inserted','order','k','t','changed')",
                f"INSERT INTO outbox {COLS} VALUES ('new-beside','order','k','t','p')",
                "COMMIT")  # fmt: skip
        phase1 = [
            "plain-1",
            "x1-a",
            "x1-b",
            "plain-2",
            "plain-3",
            "x3-one-phase",
            "replaced",
            "re-inserted",
            "new-beside",
        ]
        relay.wait_delivered(len(phase1))
        end1 = master_position(mariadb)

        # -- phase 2: an XA prepared and undecided at the end of the range
        xa_prepare(mariadb, database, "u1", [ev("u1-a", aggregate_id="u")])
        commit_events(mariadb, database, [ev("after-u1", aggregate_id="k")])
        relay.wait_delivered(len(phase1) + 1)
        end2 = master_position(mariadb)
        u1_prepare = _prepare_start(binlog_events(mariadb, end1), "u1")
        xa_decide(mariadb, "u1", commit=False)
        undecided = False

        # -- phase 3: a statement-logged outbox insert, then a row-logged one, in one transaction
        stmt_sql = f"INSERT INTO outbox {COLS} VALUES ('stmt','order','k','t','p')"
        execute(mariadb, database, "SET SESSION binlog_format = 'MIXED'", "BEGIN", stmt_sql,
                f"INSERT INTO outbox {COLS} VALUES (UUID(),'order','k','t','unsafe: row-logged')", "COMMIT")  # fmt: skip
        commit_events(mariadb, database, [ev("last", aggregate_id="k")])
        relay.wait_delivered(len(phase1) + 1 + 3)
    finally:
        try:
            if undecided:
                xa_decide(mariadb, "u1", commit=False)  # a prepared XA would block the database's removal
        finally:
            relay.stop()
    stmt_tx = _group_start_of(binlog_events(mariadb, end2), "INSERT INTO outbox")
    records = read_topic(kafka.bootstrap_servers, topic)
    dead = read_topic(kafka.bootstrap_servers, dlq)
    assert [d.headers[H_DLQ_CAUSE] for d in dead] == ["statement_format"]
    unsafe = [r for r in records if r.value["payload"] == "unsafe: row-logged"]
    assert [r.headers[H_ROW] for r in unsafe] == ["1"], "the relay gives the statement row 0, the row after it 1"

    def verify(name: str, **over: Any) -> Any:
        vcfg = replace(verify_config(cfg, str(tmp_path / name), start_file=start_file), **over)
        return run_verify(vcfg, spark=spark)

    # 1. clean: every shape delivered once, nothing unproven
    rep = verify("v1", end_position=end1)
    c = rep.counts
    assert rep.ok, (rep.problems, rep.summary.get("examples"))
    assert c["delivered"] == len(phase1), c
    assert c["missing"] == c["duplicate"] == c["phantom"] == c["reordered"] == c["altered"] == 0, c
    # the records of phases 2 and 3 (after-u1, the dead letter, the row after it, last) lie beyond the range
    assert rep.summary["unverifiable_reasons"] == {"record:after_verified_range": 4}
    assert rep.verified_through["complete"] and _pos(rep.verified_through) == BinlogPosition.parse(end1)
    assert not rep.anomalies

    # 2. an undecided XA: unverifiable, verified through before its prepare group
    rep = verify("v2", end_position=end2)
    c = rep.counts
    assert rep.ok, rep.problems
    assert (c["delivered"], c["missing"], c["phantom"], c["duplicate"], c["altered"]) == (
        len(phase1) + 1,
        0,
        0,
        0,
        0,
    ), c
    assert rep.summary["unverifiable_reasons"] == {"event:xa_undecided": 1, "record:after_verified_range": 3}
    assert (
        rep.summary["first_unproven"]["file"] == u1_prepare.file
        and rep.summary["first_unproven"]["pos"] == u1_prepare.pos
    )
    assert not rep.verified_through["complete"] and _pos(rep.verified_through) <= u1_prepare
    assert _pos(rep.verified_through) >= BinlogPosition.parse(end1)

    # 3. the statement-logged insert: unverifiable statement_format, the run fails; both readers
    total = sum(size for name, size in _logs(mariadb) if BinlogPosition(name, 4) >= BinlogPosition(start_file, 4))
    for reader, split in (("default", None), ("fast", max(2048, total // 8))):
        rep = verify(f"v3-{reader}", binlog_reader=reader, binlog_split_bytes=split)
        c = rep.counts
        assert not rep.ok and rep.problems == {"statement_format": 1}, (reader, rep.problems)
        assert (c["delivered"], c["unverifiable"], c["missing"], c["duplicate"], c["phantom"], c["altered"]) == (
            len(phase1) + 1 + 2, 1, 0, 0, 0, 0), (reader, c)  # fmt: skip
        assert rep.summary["unverifiable_reasons"] == {"event:statement_format": 1}, reader
        [ex] = rep.summary["examples"]["unverifiable"]
        assert ex["binlog"]["row"] == 0 and [d["dlq_cause"] for d in ex["deliveries"]] == ["statement_format"]
        assert _pos(rep.verified_through) <= stmt_tx, reader
        assert "statement_format" in rep.summary_text()

    # 4. from the file after the rotation: x1 committed in range, prepared before it
    rep = verify("v4", start_file=after_rotation, end_position=end1)
    c = rep.counts
    assert rep.ok, rep.problems
    assert c["phantom"] == 0 and c["missing"] == 0 and c["delivered"] == len(phase1) - 4, c
    # plain-1, plain-2 and x1's two records (their header position is the commit's, in range)
    assert rep.summary["unverifiable_reasons"] == {"record:before_binlog_range": 4, "record:after_verified_range": 4}
    xa_examples = [e for e in rep.summary["examples"]["unverifiable"] if e.get("headers", {}).get("xa_prepare")]
    assert len(xa_examples) == 2 and all(e["reason"] == "before_binlog_range" for e in xa_examples)


def _logs(db) -> list[tuple[str, int]]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(r[0], int(r[1])) for r in cur.fetchall()]
