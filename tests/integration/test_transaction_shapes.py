"""Every transaction shape a user can write with SQL, against the real mariadbd: what the
relay publishes for it (docs/transaction-shapes.md has the table).

XA (two-phase) transactions are held from XA PREPARE to their outcome and published at
XA COMMIT with the commit group's identity; statement-logged writes to an outbox table
stop the relay with one line (or are dead-lettered with `on_statement = "dead_letter"`).
What each test asserts is read back from the topics and the binlog itself.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import urllib.request
from collections import defaultdict

import pytest

from cdc.events.identity import H_DLQ_CAUSE, H_FILE, H_GTID, H_POS, H_XA_PREPARE
from cdc.position import BinlogPosition
from connectors.http_endpoint import HttpEndpoint
from tests.integration.harness import (
    RelayProcess,
    RelayThread,
    env_for,
    insert_events,
    master_position,
    read_topic,
    relay_config,
    relay_raw_config,
    wait_until,
)
from tests.integration.test_relay_e2e import (
    assert_exactly_once,
    commit_events,
    create_outbox,
    ev,
    execute,
    ids_of,
    topic_count,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def outbox(mariadb, database):
    create_outbox(mariadb, database)
    return "outbox"


def xa_prepare(db, database: str, xid: str, events: list[tuple], table: str = "outbox") -> None:
    """XA START .. XA PREPARE on its own connection, which then disconnects: the prepared
    transaction stays, and any other connection may decide it (MariaDB 10.5+)."""
    with db.connect(database, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute(f"XA START '{xid}'")
        insert_events(conn, table, events)
        with conn.cursor() as cur:
            cur.execute(f"XA END '{xid}'")
            cur.execute(f"XA PREPARE '{xid}'")


def xa_decide(db, xid: str, commit: bool) -> None:
    with db.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"XA {'COMMIT' if commit else 'ROLLBACK'} '{xid}'")


def binlog_events(db, since: str) -> list[tuple]:
    """SHOW BINLOG EVENTS rows (file, pos, type, server id, end, info) from `since` on."""
    start = BinlogPosition.parse(since)
    out = []
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        for name, *_rest in cur.fetchall():
            if BinlogPosition(name, 4) < BinlogPosition(start.file, 4):
                continue
            cur.execute(f"SHOW BINLOG EVENTS IN '{name}'" + (f" FROM {start.pos}" if name == start.file else ""))
            out += [(name, *row[1:]) for row in cur.fetchall()]
    return out


def checkpoint_position(path) -> BinlogPosition:
    cp = json.loads(path.read_text())
    return BinlogPosition(cp["file"], cp["pos"])


def outcome_group_start(events: list[tuple], xid: str) -> tuple[str, int]:
    """Where the event group of `XA COMMIT '<xid>'` starts: its GTID event."""
    hexed = xid.encode().hex()
    for i, (_file, _pos, kind, _sid, _end, info) in enumerate(events):
        if kind == "Query" and info.startswith(f"XA COMMIT X'{hexed}'"):
            gtid_file, gtid_pos, gtid_kind = events[i - 1][:3]
            assert gtid_kind == "Gtid"
            return gtid_file, gtid_pos
    raise AssertionError(f"no XA COMMIT of {xid} in the binlog")


# -- XA -----------------------------------------------------------------------------------


def test_xa_shapes_publish_only_what_committed_once_at_the_commit(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    """Commit after prepare from another connection with other transactions and a binlog
    rotation in between, rollback after prepare, ONE PHASE, a savepoint inside XA."""
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    start = master_position(mariadb)
    relay = RelayThread(relay_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json"))
    try:
        xa_prepare(mariadb, database, "x1", [ev("x1-a", aggregate_id="k"), ev("x1-b", aggregate_id="k")])
        commit_events(mariadb, database, [ev("plain-1", aggregate_id="k")])
        execute(mariadb, database, "FLUSH BINARY LOGS")
        commit_events(mariadb, database, [ev("plain-2", aggregate_id="k")])
        xa_prepare(mariadb, database, "x2", [ev("x2-rolled-back")])
        xa_decide(mariadb, "x2", commit=False)
        xa_decide(mariadb, "x1", commit=True)
        with mariadb.connect(database, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.execute("XA START 'x3'")
            insert_events(conn, outbox, [ev("x3-one-phase")])
            with conn.cursor() as cur:
                cur.execute("XA END 'x3'")
                cur.execute("XA COMMIT 'x3' ONE PHASE")
                cur.execute("XA START 'x4'")
                cur.execute("SAVEPOINT s1")
            insert_events(conn, outbox, [ev("x4-cut")])
            with conn.cursor() as cur:
                cur.execute("ROLLBACK TO SAVEPOINT s1")
            insert_events(conn, outbox, [ev("x4-kept")])
            with conn.cursor() as cur:
                cur.execute("XA END 'x4'")
                cur.execute("XA PREPARE 'x4'")
                cur.execute("XA COMMIT 'x4'")
        commit_events(mariadb, database, [ev("plain-3", aggregate_id="k")])
        relay.wait_delivered(7)
        # the gauge follows the check-back, which runs on the checkpoint timer
        wait_until(lambda: relay.metrics.xa_undecided == 0, 30, "no XA transaction held")
    finally:
        relay.stop()
    records = read_topic(kafka.bootstrap_servers, topic)
    assert_exactly_once(records, {"x1-a", "x1-b", "plain-1", "plain-2", "x3-one-phase", "x4-kept", "plain-3"})
    # Per key in commit order: x1 committed after plain-1 and plain-2, before plain-3.
    same_key = [r.value["id"] for r in records if r.key == "k"]
    assert same_key == ["plain-1", "plain-2", "x1-a", "x1-b", "plain-3"]
    # The identity is the commit group's, as the server lists it; the prepare's place is named too.
    events = binlog_events(mariadb, start)
    file, pos = outcome_group_start(events, "x1")
    x1 = [r for r in records if r.value["id"].startswith("x1-")]
    assert {(r.headers[H_FILE], int(r.headers[H_POS])) for r in x1} == {(file, pos)}
    assert all(r.headers[H_GTID] and H_XA_PREPARE in r.headers for r in x1)
    prepared_at = BinlogPosition.parse(x1[0].headers[H_XA_PREPARE])
    assert BinlogPosition.parse(start) <= prepared_at < BinlogPosition(file, pos)
    assert relay.metrics.xa_undecided == 0


def test_an_undecided_xa_holds_the_checkpoint_is_checked_back_and_reported_then_published(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path, caplog
):
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    cp_path = tmp_path / "cp.json"
    cfg = relay_config(
        mariadb,
        kafka,
        database,
        topic_prefix,
        cp_path,
        xa={"check_after_s": 0, "check_interval_s": 0.3, "max_checks": 2},
    )
    caplog.set_level(logging.INFO, logger="cdc.delivery.xa_check_back")
    relay = RelayThread(cfg)
    decided = False
    try:
        commit_events(mariadb, database, [ev("before")])
        relay.wait_delivered(1)
        start = master_position(mariadb)
        xa_prepare(mariadb, database, "slow", [ev("slow-1")])
        prepare = next(
            BinlogPosition(f, p)
            for f, p, kind, _s, _e, info in binlog_events(mariadb, start)
            if kind == "Gtid" and info.startswith("XA START X'736c6f77'")
        )
        commit_events(mariadb, database, [ev("after")])
        relay.wait_delivered(2)
        m = relay.metrics
        wait_until(lambda: m.xa_problems, 30, "the undecided XA transaction reported as a problem")
        assert m.xa_undecided == 1 and "XA COMMIT or XA ROLLBACK" in m.xa_problems[0]
        endpoint = HttpEndpoint(m, "src")
        try:
            ready = urllib.request.urlopen(endpoint.url + "/readyz", timeout=10).read().decode()
            metrics_text = urllib.request.urlopen(endpoint.url + "/metrics", timeout=10).read().decode()
        finally:
            endpoint.close()
        assert "problem: XA transaction X'736c6f77',X'',1 prepared at" in ready
        assert 'cdc_xa_undecided_problems{source="src"} 1.0' in metrics_text
        assert 'cdc_xa_undecided{source="src"} 1.0' in metrics_text
        assert checkpoint_position(cp_path) <= prepare, "the checkpoint passed the prepare"
        text = caplog.text
        assert "XA RECOVER lists it as prepared (check 1 of 2)" in text
        assert "decide it on the server: XA COMMIT X'736c6f77',X'',1" in text
        assert "slow-1" not in ids_of(read_topic(kafka.bootstrap_servers, topic))
        xa_decide(mariadb, "slow", commit=True)
        decided = True
        relay.wait_delivered(3)
        wait_until(lambda: not m.xa_problems and m.xa_undecided == 0, 30, "the problem cleared")
        wait_until(lambda: checkpoint_position(cp_path) > prepare, 30, "the checkpoint moved past the prepare")
    finally:
        if not decided:
            xa_decide(mariadb, "slow", commit=False)  # a prepared XA would block the database's removal
        relay.stop()
    assert_exactly_once(read_topic(kafka.bootstrap_servers, topic), {"before", "after", "slow-1"})


@pytest.mark.fault
def test_relay_killed_between_prepare_and_outcome_20_times_publishes_each_committed_xa_once(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    """SIGKILLs at the two XA crash points (prepare read, outcome not yet; outcome produced,
    not yet acknowledged) and at random moments, while a writer interleaves XA and plain
    transactions: every committed event once, nothing of a rolled-back XA."""
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    rng = random.Random(11)
    expected: set[str] = set()
    rolled_back: set[str] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        i = 0
        try:
            while not stop.is_set() and i < 400:
                xid = f"w{i}"
                rows = [ev(f"{xid}-{j}", aggregate_id=f"k{i % 5}") for j in range(rng.randint(1, 3))]
                xa_prepare(mariadb, database, xid, rows)
                commit_events(mariadb, database, [ev(f"p{i}", aggregate_id=f"k{i % 5}")])
                expected.add(f"p{i}")
                commit = rng.random() < 0.7
                xa_decide(mariadb, xid, commit)
                (expected if commit else rolled_back).update(r[0] for r in rows)
                i += 1
                stop.wait(0.01)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    kills = 0
    try:
        for round_ in range(20):
            point = ("xa_prepared", "xa_outcome", None)[round_ % 3]
            relay = RelayProcess(
                raw,
                env_for(mariadb),
                tmp_path / f"run{round_}",
                crash_at=f"{point}@{rng.randint(1, 4)}" if point else None,
            )
            try:
                if point:
                    code = relay.wait(60)
                    assert code == -9, f"round {round_}: exit {code}: {relay.log_text()[-1500:]}"
                else:
                    stop.wait(rng.uniform(0.8, 2.5))  # start-up takes about 0.7 s: kill it while it publishes
                    relay.kill()
            finally:
                if relay.alive():
                    relay.kill()
            kills += 1
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert kills >= 20
    assert len(rolled_back) >= 10 and len(expected) >= 100, (len(expected), len(rolled_back))  # a real mix
    final = RelayProcess(raw, env_for(mariadb), tmp_path / "final")
    try:
        wait_until(
            lambda: not final.alive() or topic_count(kafka.bootstrap_servers, topic) >= len(expected),
            120,
            f"{len(expected)} events after the last restart",
        )
        assert final.alive(), final.log_text()[-2000:]
    finally:
        code = final.terminate()
    assert code == 0, final.log_text()[-2000:]
    records = read_topic(kafka.bootstrap_servers, topic)
    assert_exactly_once(records, expected)
    assert not rolled_back & set(ids_of(records))
    by_key = defaultdict(list)
    for r in records:
        by_key[(r.partition, r.key)].append(BinlogPosition(r.headers[H_FILE], int(r.headers[H_POS])))
    for key, positions in by_key.items():
        assert positions == sorted(positions), f"{key}: out of commit order"


def test_mariadbd_restarted_between_prepare_and_outcome(kafka, topic_prefix, tmp_path):
    """A prepared XA transaction survives a crash of mariadbd (XA RECOVER lists it); its
    commit after the restart is published once, at the commit."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=7) as db:
        db.create_database("shapes")
        create_outbox(db, "shapes")
        topic = f"{topic_prefix}.order"
        kafka.create_topic(topic, 3)
        raw = relay_raw_config(db, kafka, "shapes", topic_prefix, tmp_path / "cp.json")
        relay = RelayProcess(raw, env_for(db), tmp_path / "run1")
        try:
            xa_prepare(db, "shapes", "survivor", [ev("survivor-1")])
            commit_events(db, "shapes", [ev("before-crash")])
            wait_until(lambda: topic_count(kafka.bootstrap_servers, topic) >= 1, 30, "the first event")
            db.kill()
            db.restart()
            with db.connect(autocommit=True) as conn, conn.cursor() as cur:
                cur.execute("XA RECOVER")
                assert [bytes(r[3]) for r in cur.fetchall()] == [b"survivor"]
            commit_events(db, "shapes", [ev("after-restart")])
            xa_decide(db, "survivor", commit=True)
            wait_until(
                lambda: not relay.alive() or topic_count(kafka.bootstrap_servers, topic) >= 3,
                90,
                "every event after the server's restart",
            )
            assert relay.alive(), relay.log_text()[-2000:]
        finally:
            if relay.alive():
                relay.terminate()
        assert_exactly_once(read_topic(kafka.bootstrap_servers, topic), {"before-crash", "after-restart", "survivor-1"})


# -- statement-logged writes --------------------------------------------------------------


def test_a_statement_logged_outbox_insert_stops_the_relay_with_one_line_and_the_checkpoint_before_it(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    cp_path = tmp_path / "cp.json"
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, cp_path)
    commit_events(mariadb, database, [ev("row-logged")])
    before = master_position(mariadb)
    execute(
        mariadb,
        database,
        "SET SESSION binlog_format = 'STATEMENT'",
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('stmt', 'order', 'a', 't', 'p')",
    )
    commit_events(mariadb, database, [ev("after-it")])
    relay = RelayProcess(raw, env_for(mariadb), tmp_path / "run")
    code = relay.wait(60)
    log = relay.log_text()
    assert code == 2, log[-2000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("cdc: ") and f"outbox table {database}.outbox" in last and "binlog_format=ROW" in last, log
    assert "Traceback" not in log and "AssertionError" not in log
    assert checkpoint_position(cp_path) <= BinlogPosition.parse(before), "the checkpoint passed its transaction"
    assert ids_of(read_topic(kafka.bootstrap_servers, topic)) == ["row-logged"]


def test_a_statement_logged_outbox_insert_is_dead_lettered_when_configured_and_the_relay_goes_on(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    topic, dlq = f"{topic_prefix}.order", f"{topic_prefix}.dlq"
    kafka.create_topic(topic, 3)
    kafka.create_topic(dlq, 1)
    sql = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('stmt', 'order', 'a', 't', 'p')"
    relay = RelayThread(
        relay_config(
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path / "cp.json",
            outbox={
                "tables": [{"schema": database, "table": "outbox", "topic": topic_prefix + ".{aggregate_type}"}],
                "on_statement": "dead_letter",
            },
        )
    )
    csv = tmp_path / "load.csv"
    csv.write_text("loaded\torder\tk\tt\tp\n")
    csv.chmod(0o644)
    tmp_path.chmod(0o755)
    load = f"LOAD DATA INFILE '{csv}' INTO TABLE outbox (id, aggregatetype, aggregateid, type, payload)"
    try:
        execute(mariadb, database, "SET SESSION binlog_format = 'STATEMENT'", sql, load)
        commit_events(mariadb, database, [ev("next")])
        relay.wait_delivered(3)
    finally:
        relay.stop()
    assert ids_of(read_topic(kafka.bootstrap_servers, topic)) == ["next"]
    dead = read_topic(kafka.bootstrap_servers, dlq)
    assert [d.headers[H_DLQ_CAUSE] for d in dead] == ["statement_format"] * 2
    bodies = [json.loads(d.raw_value) for d in dead]
    assert bodies[0]["row"]["sql"] == sql and bodies[0]["table"] == f"{database}.outbox"
    assert bodies[1]["row"]["sql"].startswith("LOAD DATA") and "INTO TABLE `outbox`" in bodies[1]["row"]["sql"]


# -- the other shapes ---------------------------------------------------------------------

COLS = "(id, aggregatetype, aggregateid, type, payload)"


def test_row_logged_shapes_publish_exactly_the_new_outbox_rows(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    """Multi-row INSERT, INSERT ... SELECT, ON DUPLICATE KEY UPDATE and REPLACE of an
    existing id (never a second event under that id), rows a trigger or a stored procedure
    writes, DDL inside a transaction (its implicit commit), CREATE TABLE ... SELECT,
    TRUNCATE of the outbox, LOAD DATA, and a temporary table as the source of an INSERT."""
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    csv = tmp_path / "load.csv"
    csv.write_text("load-1\torder\tk\tt\tp\nload-2\torder\tk\tt\tp\n")
    csv.chmod(0o644)
    tmp_path.chmod(0o755)
    setup = [
        "CREATE TABLE staging LIKE outbox",
        "CREATE TABLE orders (id INT PRIMARY KEY)",
        f"CREATE TRIGGER order_event AFTER INSERT ON orders FOR EACH ROW INSERT INTO outbox {COLS} "
        "VALUES (CONCAT('trigger-', NEW.id), 'order', 'k', 't', 'p')",
        f"CREATE PROCEDURE two_events() BEGIN INSERT INTO outbox {COLS} VALUES ('proc-1','order','k','t','p'); "
        f"INSERT INTO outbox {COLS} VALUES ('proc-2','order','k','t','p'); END",
    ]
    execute(mariadb, database, *setup)
    relay = RelayThread(relay_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json"))
    expected = [
        "multi-1",
        "multi-2",
        "multi-3",
        "select-1",
        "select-2",
        "dup",
        "dup-new",
        "replaced",
        "trigger-1",
        "proc-1",
        "proc-2",
        "ddl-1",
        "ddl-2",
        "load-1",
        "load-2",
        "temp-1",
        "last",
    ]
    try:
        execute(
            mariadb,
            database,
            f"INSERT INTO outbox {COLS} VALUES ('multi-1','order','k','t','p'),('multi-2','order','k','t','p'),"
            "('multi-3','order','k','t','p')",
            f"INSERT INTO staging {COLS} VALUES ('select-1','order','k','t','p'),('select-2','order','k','t','p')",
            f"INSERT INTO outbox {COLS} SELECT {COLS[1:-1]} FROM staging",
            f"INSERT INTO outbox {COLS} VALUES ('dup','order','k','t','p')",
            f"INSERT INTO outbox {COLS} VALUES ('dup','order','k','t','again') ON DUPLICATE KEY UPDATE payload='x'",
            f"INSERT INTO outbox {COLS} VALUES ('dup-new','order','k','t','p') ON DUPLICATE KEY UPDATE payload='x'",
            f"INSERT INTO outbox {COLS} VALUES ('replaced','order','k','t','p')",
            f"REPLACE INTO outbox {COLS} VALUES ('replaced','order','k','t','again')",
            "INSERT INTO orders VALUES (1)",
            "CALL two_events()",
            "BEGIN",
            f"INSERT INTO outbox {COLS} VALUES ('ddl-1','order','k','t','p')",
            "CREATE TABLE made_mid_transaction (a INT)",  # commits ddl-1 implicitly
            f"INSERT INTO outbox {COLS} VALUES ('ddl-2','order','k','t','p')",
            "COMMIT",
            "CREATE TABLE copied SELECT * FROM outbox",
            "TRUNCATE staging",
            f"LOAD DATA INFILE '{csv}' INTO TABLE outbox {COLS}",
            "CREATE TEMPORARY TABLE tmp_events AS SELECT * FROM staging",
            f"INSERT INTO tmp_events {COLS} VALUES ('temp-1','order','k','t','p')",
            f"INSERT INTO outbox {COLS} SELECT {COLS[1:-1]} FROM tmp_events",
            "TRUNCATE outbox",
            f"INSERT INTO outbox {COLS} VALUES ('last','order','k','t','p')",
        )
        relay.wait_delivered(len(expected))
    finally:
        summary = relay.stop()
    records = read_topic(kafka.bootstrap_servers, topic)
    assert_exactly_once(records, expected)
    assert ids_of(records) == expected  # one key, so one partition: commit order, row order
    assert summary.dead_lettered == 0


def test_a_transaction_larger_than_max_binlog_cache_size_is_refused_by_the_server_and_publishes_nothing(
    mariadb, kafka, database, topic_prefix, outbox, tmp_path
):
    import pymysql

    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 3)
    relay = RelayThread(relay_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json"))
    try:
        with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.max_binlog_cache_size")
            (old,) = cur.fetchone()
            cur.execute("SET GLOBAL max_binlog_cache_size = 65536")
        try:
            with mariadb.connect(database) as conn:  # a new session picks up the global limit
                with pytest.raises(pymysql.err.OperationalError) as refused:
                    insert_events(conn, outbox, [ev(f"big-{i}", payload="x" * 2000) for i in range(100)])
                    conn.commit()
                conn.rollback()
        finally:
            with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(f"SET GLOBAL max_binlog_cache_size = {int(old)}")
        assert refused.value.args[0] == 1197  # ER_TRANS_CACHE_FULL
        commit_events(mariadb, database, [ev("after")])
        relay.wait_delivered(1)
    finally:
        relay.stop()
    assert ids_of(read_topic(kafka.bootstrap_servers, topic)) == ["after"]
