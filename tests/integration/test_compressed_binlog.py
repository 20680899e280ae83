"""Issue 19, against a real mariadbd with `--log-bin-compress=ON --log-bin-compress-min-len=10`:
every statement and row image of 10 bytes or more is written as a Query_compressed /
Write/Update/Delete_rows_compressed_v1 event.

* the relay's decoder and the verifier's reader (python-mysql-replication behind
  spark_jobs/mysql/binlog_compressed.py) read the compressed binlog alike, for every column type;
* the relay (`cdc run` processes) publishes every committed outbox insert of a mixed
  workload once (NULL to 60 KB payloads, multi-byte text, rollbacks) across a SIGKILL and
  restart mid-stream, per the independent checker, and `cdc verify` reports 0 problems;
* a compressed event whose bytes were damaged (a byte flipped in a copy of the binlog)
  stops the relay with one line naming the event, its position and the fix, exit 2,
  the checkpoint before it.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent,
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.config import load_config
from cdc.position import BinlogPosition
from cdc.source_events import RowChange, RowInsert, Statement, TxCommit
from connectors.mysql.binlog_decoder import BinlogDecoder
from connectors.mysql.binlog_library import LibraryConverter
from connectors.mysql.binlog_protocol import BinlogConnection
from spark_jobs.mysql.binlog_compressed import ExpandingConnection
from testbed.mariadb import EmbeddedMariaDB
from tests.integration.harness import (
    OUTBOX_DDL,
    RelayProcess,
    env_for,
    master_position,
    read_topic,
    relay_raw_config,
    wait_until,
)
from tests.integration.test_binlog_decoder import MAX_ROW, MIN_ROW, TYPES_DDL

pytestmark = pytest.mark.integration

COMPRESS_ARGS = ("--log-bin-compress=ON", "--log-bin-compress-min-len=10")
_ids = iter(range(61_000, 10**9))


@pytest.fixture(scope="module")
def zdb():
    """A mariadbd of this module's own that compresses its binlog."""
    with EmbeddedMariaDB.start(server_id=19, extra_args=COMPRESS_ARGS) as db:
        yield db


@pytest.fixture
def zdatabase(zdb):
    name = f"z_{next(_ids)}"
    zdb.create_database(name)
    yield name
    with zdb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


def run_sql(db, database: str | None, statements: list[str]) -> None:
    with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def event_kinds(db, since: str) -> list[str]:
    pos = BinlogPosition.parse(since)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [r[0] for r in cur.fetchall() if BinlogPosition(r[0], 4) >= BinlogPosition(pos.file, 4)]
        kinds = []
        for name in files:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (name, pos.pos if name == pos.file else 4))
            kinds += [r[2] for r in cur.fetchall()]
    return kinds


def read_fast(db, watched, file: str, pos: int) -> list:
    s = db.connection_settings()
    dec = BinlogDecoder(watched, file)
    out: list = []
    with BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=next(_ids)) as conn:
        conn.dump_file(file, pos, blocking=False)
        for ev in conn.events():
            dec.decode(ev, out)
    return out


def read_verifier_way(db, watched, file: str, pos: int) -> list:
    """python-mysql-replication with the verifier's expanding connection (its own
    decompression), its events converted by the library path's converter."""
    reader = BinLogStreamReader(
        connection_settings=db.connection_settings(),
        server_id=next(_ids),
        blocking=False,
        pymysql_wrapper=ExpandingConnection,
        only_events=[
            FormatDescriptionEvent,
            RotateEvent,
            GtidEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            UpdateRowsEvent,
            DeleteRowsEvent,
            HeartbeatLogEvent,
            XAPrepareEvent,
            ExecuteLoadQueryEvent,
        ],
        only_schemas=sorted({s for s, _ in watched}),
        only_tables=sorted({t for _, t in watched}),
        enable_logging=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
    )
    conv = LibraryConverter(set(watched), file)
    out: list = []
    try:
        for ev in reader:
            conv.convert(ev, out)
    finally:
        reader.close()
    return out


def same_from_both_readers(db, watched, file: str, pos: int) -> list:
    fast = read_fast(db, watched, file, pos)
    lib = read_verifier_way(db, watched, file, pos)
    assert len(fast) == len(lib)
    for i, (a, b) in enumerate(zip(fast, lib, strict=True)):
        assert type(a) is type(b), (i, a, b)
        if isinstance(a, (RowInsert, RowChange)):
            for k, v in a.values.items():
                assert type(v) is type(b.values[k]), (i, k, v, b.values[k])
        assert a == b, (i, a, b)
    return fast


def test_both_readers_read_every_compressed_event_kind(zdb, zdatabase):
    """Query_compressed (DDL, a statement-logged insert), Write/Update/Delete_rows_compressed_v1
    of every column type: the relay's decoder and the verifier's reader agree on every
    event, value and position."""
    run_sql(zdb, zdatabase, [OUTBOX_DDL.format(name="outbox"), TYPES_DDL])
    start = master_position(zdb)
    file, pos = BinlogPosition.parse(start).file, BinlogPosition.parse(start).pos
    run_sql(
        zdb,
        zdatabase,
        [
            MAX_ROW,
            MIN_ROW,
            "INSERT INTO types (id) VALUES (3)",
            "UPDATE types SET vc = 'changed é', j = '{\"k\": [1]}' WHERE id = 1",
            "DELETE FROM types WHERE id = 2",
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
            "('a1', 'order', 'k', 'created', REPEAT('ü😀', 3000)), ('a2', 'order', 'k', 'created', NULL)",
            "SET SESSION binlog_format = 'STATEMENT'",
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('s1','order','k','created','x')",
            "SET SESSION binlog_format = 'ROW'",
            "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(20) NULL",
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, tenant) VALUES ('a3', 'order', 'k', 'c', 't')",
        ],
    )
    kinds = set(event_kinds(zdb, start))
    assert {
        "Query_compressed",
        "Write_rows_compressed_v1",
        "Update_rows_compressed_v1",
        "Delete_rows_compressed_v1",
    } <= kinds, kinds
    fast = same_from_both_readers(zdb, {(zdatabase, "outbox"), (zdatabase, "types")}, file, pos)
    ids = [e.values["id"] for e in fast if isinstance(e, RowInsert) and e.table == "outbox"]
    assert ids == ["a1", "a2", "a3"]
    assert (
        next(e for e in fast if isinstance(e, RowInsert) and e.values["id"] == "a1").values["payload"] == "ü😀" * 3000
    )
    assert any(isinstance(e, Statement) and "'s1'" in e.sql for e in fast)
    assert [e.kind for e in fast if isinstance(e, RowChange)] == ["update", "delete"]
    # positions are the binlog's own: every event ends where SHOW BINLOG EVENTS says one ends
    with zdb.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, pos))
        ends = {int(r[4]) for r in cur.fetchall()}
    assert all(e.end.pos in ends for e in fast if isinstance(e, (RowInsert, RowChange, TxCommit, Statement)))


def test_compressed_binlog_without_checksums():
    """binlog_checksum=NONE: no CRC after the compressed events either (both readers
    learn it from the Format_description event)."""
    with EmbeddedMariaDB.start(server_id=29, extra_args=COMPRESS_ARGS + ("--binlog-checksum=NONE",)) as db:
        db.create_database("nc")
        run_sql(db, "nc", [OUTBOX_DDL.format(name="outbox")])
        file, pos = BinlogPosition.parse(master_position(db)).file, BinlogPosition.parse(master_position(db)).pos
        run_sql(
            db,
            "nc",
            [
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                "('n1', 'order', 'k', 'T', REPEAT('é', 900)), ('n2', 'order', 'k', 'T', NULL)",
                "UPDATE outbox SET payload = 'changed payload' WHERE id = 'n2'",
                "DELETE FROM outbox WHERE id = 'n1'",
                "CREATE TABLE later (id INT PRIMARY KEY, note VARCHAR(64))",
            ],
        )
        assert {"Write_rows_compressed_v1", "Query_compressed"} <= set(event_kinds(db, f"{file}:{pos}"))
        events = same_from_both_readers(db, {("nc", "outbox")}, file, pos)
        assert [e.values["id"] for e in events if isinstance(e, RowInsert)] == ["n1", "n2"]
        assert [e.kind for e in events if isinstance(e, RowChange)] == ["update", "delete"]


# -- the relay end to end, with a SIGKILL, then cdc verify ----------------------------------

AGGREGATES = ("order", "payment")


def _payload(rng: random.Random, n: int) -> str | None:
    kind = rng.randrange(6)
    if kind == 0:
        return None
    if kind == 1:
        return ""
    if kind == 2:
        return f"é😀ü 日本語 {n}"
    if kind == 3:
        return json.dumps({"n": n, "text": "Grüße " * rng.randint(1, 200)}, ensure_ascii=False)
    if kind == 4:
        return "".join(rng.choice("abcdefghij😀é") for _ in range(rng.randint(1000, 4000)))
    return ('{"n": %d, "blob": "' % n) + "z" * (60 * 1024 - 40) + '"}'  # about 60 KB


class MixedWriter:
    """Outbox transactions of 1-4 rows with payloads from NULL to 60 KB and multi-byte text,
    10% rolled back, some XA; each committed row's id is the checker's to find."""

    def __init__(self, db, database: str, seed: int = 19):
        self.db, self.database, self.rng = db, database, random.Random(seed)
        self.n = 0

    def write(self, transactions: int) -> None:
        rng = self.rng
        with self.db.connect(self.database) as conn:
            for _ in range(transactions):
                rows = []
                for _ in range(rng.randint(1, 4)):
                    self.n += 1
                    rows.append(
                        (
                            f"ev-{self.n:06d}",
                            rng.choice(AGGREGATES),
                            f"k{rng.randrange(20)}",
                            "Happened",
                            _payload(rng, self.n),
                        )
                    )
                sql = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s,%s,%s,%s,%s)"
                if rng.random() < 0.05:
                    xid = f"zx{self.n}"
                    conn.autocommit(True)
                    with conn.cursor() as cur:
                        cur.execute(f"XA START '{xid}'")
                        cur.executemany(sql, rows)
                        cur.execute(f"XA END '{xid}'")
                        cur.execute(f"XA PREPARE '{xid}'")
                        cur.execute(f"XA {'COMMIT' if rng.random() < 0.7 else 'ROLLBACK'} '{xid}'")
                    conn.autocommit(False)
                    continue
                with conn.cursor() as cur:
                    cur.executemany(sql, rows)
                conn.rollback() if rng.random() < 0.1 else conn.commit()


def test_relay_publishes_a_compressed_binlog_once_across_a_sigkill_and_verify_agrees(
    zdb, kafka, zdatabase, topic_prefix, tmp_path, spark
):
    from cdc_cli.verify_commands import verify_config
    from spark_jobs.verify import run_verify
    from tests.integration.test_faults import _finish_and_check, _setup

    topics = _setup(zdb, kafka, zdatabase, topic_prefix)
    raw = relay_raw_config(zdb, kafka, zdatabase, topic_prefix, tmp_path / "cp.json")
    start = raw["source"]["start"]
    writer = MixedWriter(zdb, zdatabase)
    writer.write(80)
    relay = RelayProcess(raw, env_for(zdb), tmp_path / "run-1")
    try:
        cp = Path(raw["checkpoint"]["path"])
        wait_until(lambda: cp.exists() or not relay.alive(), 60, "the first checkpoint")
        writer.write(120)  # written while the relay reads
        relay.kill()  # SIGKILL mid-stream
        run_sql(zdb, zdatabase, ["CREATE TABLE side (id INT PRIMARY KEY, note VARCHAR(100))"])  # a Query_compressed
        writer.write(80)
        relay = RelayProcess(raw, env_for(zdb), tmp_path / "run-2")
        writer.write(40)
        relay.kill()
        writer.write(30)
    finally:
        if relay.alive():
            relay.kill()
    kinds = event_kinds(zdb, start)
    assert kinds.count("Write_rows_compressed_v1") > 200 and "Query_compressed" in kinds, set(kinds)
    result = _finish_and_check(zdb, kafka, zdatabase, raw, topics, tmp_path / "final", start)
    assert result.committed > 500, result.summary()
    assert result.clean, result.summary()

    cfg = load_config(raw, env_for(zdb))
    start_file = BinlogPosition.parse(start).file
    for reader in ("default", "fast"):
        vcfg = replace(
            verify_config(cfg, str(tmp_path / f"verify-{reader}"), start_file=start_file), binlog_reader=reader
        )
        rep = run_verify(vcfg, spark=spark)
        c = rep.counts
        assert rep.ok and not rep.problems and not rep.anomalies, (reader, rep.problems, rep.anomalies)
        assert c["delivered"] == result.committed, (reader, c)
        assert c["missing"] == c["duplicate"] == c["phantom"] == c["reordered"] == c["altered"] == 0, (reader, c)


# -- a damaged compressed event: one line, exit 2, the checkpoint before it ----------------


def test_a_flipped_byte_in_a_compressed_event_stops_the_relay_with_one_line(kafka, topic_prefix, tmp_path):
    """A copy of the binlog with one byte of a Write_rows_compressed_v1 event's zlib data
    flipped, put in place of the original while the server is stopped."""
    with EmbeddedMariaDB.start(server_id=23, extra_args=COMPRESS_ARGS) as db:
        db.create_database("zc")
        run_sql(db, "zc", [OUTBOX_DDL.format(name="outbox")])
        raw = relay_raw_config(db, kafka, "zc", topic_prefix, tmp_path / "cp.json")
        for topic in (f"{topic_prefix}.order", f"{topic_prefix}.dlq"):
            kafka.create_topic(topic, 1)
        text = "".join(random.Random(3).choice("abcdefghijklmnopqrstuvwxyz é😀") for _ in range(6000))
        ins = (
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('{}', 'order', 'k', 'T', '{}')"
        )
        run_sql(
            db,
            "zc",
            [
                ins.format("good-1", "small"),
                ins.format("damaged", text),
                ins.format("after", "x" * 50),
                "FLUSH BINARY LOGS",
            ],
        )
        file = BinlogPosition.parse(raw["source"]["start"]).file
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW BINLOG EVENTS IN %s", (file,))
            events = cur.fetchall()
        rows = [(int(r[1]), int(r[4])) for r in events if r[2] == "Write_rows_compressed_v1"]
        assert len(rows) == 3, [r[2] for r in events]
        (_first_start, first_end), (bad_start, bad_end) = rows[0], rows[1]
        good_commit_end = next(int(r[4]) for r in events if r[2] == "Xid" and int(r[1]) >= first_end)
        binlog = db.datadir / file
        db.stop()
        copy = tmp_path / f"{file}.copy"
        shutil.copy(binlog, copy)
        data = bytearray(copy.read_bytes())
        data[(bad_start + bad_end) // 2] ^= 0xFF  # inside the zlib stream of the 6000-char row
        copy.write_bytes(bytes(data))
        shutil.copy(copy, binlog)
        db.restart()

        relay = RelayProcess(raw, env_for(db), tmp_path / "run")
        try:
            code = relay.wait(60)
        finally:
            if relay.alive():
                relay.kill()
        out = relay.log_text()
        assert code == 2, out[-3000:]
        lines = [line for line in out.splitlines() if line.startswith("cdc: ")]
        assert len(lines) == 1, out[-3000:]
        line = lines[0]
        assert line.startswith(
            f"cdc: cannot decode the Write_rows_compressed_v1 event (type 166) at "
            f"{file}:{bad_start} (ending at {bad_end}): its zlib data"
        ), line
        assert "restore this binlog file from an intact copy" in line
        assert "Traceback" not in out and "reconnecting" not in out and db.password not in out
        cp = json.loads((tmp_path / "cp.json").read_text())
        assert (cp["file"], cp["pos"]) == (file, good_commit_end)
        published = [r.headers.get("id") for r in read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")]
        assert published == ["good-1"]


# -- preflight ------------------------------------------------------------------------------


def test_preflight_reports_the_compression_it_finds(zdb, mariadb, kafka, zdatabase, database, topic_prefix, tmp_path):
    from connectors.mysql.preflight import run_checks
    from tests.integration.harness import relay_config

    run_sql(zdb, zdatabase, [OUTBOX_DDL.format(name="outbox")])
    run_sql(mariadb, database, [OUTBOX_DDL.format(name="outbox")])

    def check(db, name: str, **over):
        cfg = relay_config(db, kafka, name, topic_prefix, tmp_path / "cp.json", **over)
        return {r.name: r for r in run_checks(cfg, replica_id=False)}

    on = check(zdb, zdatabase)
    assert all(r.ok for r in on.values()), [r.message for r in on.values() if not r.ok]
    r = on["binlog_compression"]
    assert not r.warn and r.message.startswith(
        "log_bin_compress is ON (MariaDB: zlib, every statement or row image of 10 bytes or more)"
    ), r.message
    library = check(zdb, zdatabase, source__decoder="library")["binlog_compression"]
    assert not library.ok and library.message.endswith('set source.decoder = "fast"'), library.message
    off = check(mariadb, database)["binlog_compression"]
    assert off.ok and not off.warn and off.message.startswith("binlog compression is off"), off.message
