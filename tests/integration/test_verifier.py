"""The verifier end to end: a real embedded MariaDB (ROW binlog) and the Kafka stand-in.

The test plays the relay itself. It writes outbox transactions (committed ones, a rolled
back one, one with a rolled-back savepoint whose rows DO appear in the binlog, a DDL, a
MyISAM-only transaction, a rotation to a second binlog file) and derives the expected
messages WITHOUT the verifier's binlog reader: transaction starts come from SHOW MASTER
STATUS around each commit (nothing else writes), GTIDs from @@last_gtid, commit times
from the XID events' headers. It publishes them per the header contract (Avro value in
Confluent wire format, murmur2_random partitioner, one Kafka transaction per binlog
transaction so the commit markers leave offset gaps) and dead-letters the row whose
topic is illegal. Then: a clean run reports no problem; a run over topics seeded with
faults (a dropped message, a duplicate, two events of one key swapped, an altered
payload, a message for a transaction that never committed) classifies each exactly.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fastavro
import pytest

from cdc.events import identity as hdr
from cdc.events.outbox import OutboxTable
from connectors.mysql.client import binlog_end
from tests.integration.harness import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SOURCE = "shop-db"
SCHEMA = "shop"
PASSWORD_MARK = "cdc-test"  # the embedded server's password: must never show up in outputs


@dataclass(frozen=True)
class Expected:
    """One committed outbox event, as the test knows it."""

    event_id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str | None
    file: str
    pos: int
    row: int
    gtid: str
    end: int
    commit_ts_ms: int = 0

    @property
    def key(self) -> tuple:
        return (self.gtid, self.row)


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def servers():
    from testbed.kafka_standin import KafkaStandin
    from testbed.mariadb import EmbeddedMariaDB

    db = EmbeddedMariaDB.start()
    try:
        kafka = KafkaStandin.start(brokers=1)
    except BaseException:
        db.cleanup()
        raise
    try:
        yield db, kafka
    finally:
        kafka.stop()
        db.cleanup()


def _master(cur: Any) -> tuple[str, int]:
    return binlog_end(cur)


class Writer:
    """Runs transactions and records what each committed one is in the binlog."""

    def __init__(self, db: Any):
        self.conn = db.connect(SCHEMA, autocommit=True)
        self.cur = self.conn.cursor()
        self.expected: list[Expected] = []

    def insert(self, atype: str, agg: str, etype: str, payload: str | None) -> dict[str, Any]:
        eid = str(uuid.uuid4())
        self.cur.execute(
            "INSERT INTO outbox(id, aggregatetype, aggregateid, type, payload, created_at) VALUES (%s,%s,%s,%s,%s,NOW(6))",
            (eid, atype, agg, etype, payload),
        )
        return {"event_id": eid, "aggregate_type": atype, "aggregate_id": agg, "event_type": etype, "payload": payload}

    def tx(self, rows: list[tuple[str, str, str, str | None]], savepoint_cut: list[tuple[str, str, str, str | None]] | None = None,
           after_cut: list[tuple[str, str, str, str | None]] | None = None) -> list[Expected]:  # fmt: skip
        self.cur.execute("BEGIN")
        kept = [self.insert(*r) for r in rows]
        if savepoint_cut is not None:
            self.cur.execute("SAVEPOINT sp1")
            self.cur.execute("INSERT INTO side(v) VALUES ('forces the savepoint into the binlog')")
            for r in savepoint_cut:
                self.insert(*r)
            self.cur.execute("ROLLBACK TO SAVEPOINT sp1")
            kept += [self.insert(*r) for r in after_cut or []]
        # InnoDB changes reach the binlog at COMMIT, as one group starting here (a MyISAM
        # statement inside the transaction was logged at once, as its own transaction)
        file, start = _master(self.cur)
        self.cur.execute("COMMIT")
        self.cur.execute("SELECT @@last_gtid")
        gtid = self.cur.fetchone()[0]
        file2, end = _master(self.cur)
        assert file2 == file
        out = [Expected(**k, file=file, pos=start, row=i, gtid=gtid, end=end) for i, k in enumerate(kept)]
        self.expected += out
        return out


@pytest.fixture(scope="module")
def world(servers):
    db, _kafka = servers
    db.create_database(SCHEMA)
    w = Writer(db)
    c = w.cur
    c.execute(
        "CREATE TABLE outbox(id VARCHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255), aggregateid VARCHAR(255), "
        "type VARCHAR(255), payload LONGTEXT, created_at DATETIME(6)) ENGINE=InnoDB"
    )
    c.execute("CREATE TABLE side(id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64)) ENGINE=MyISAM")
    c.execute("CREATE TABLE other(id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64)) ENGINE=InnoDB")

    w.tx(
        [
            ("order", "o1", "created", '{"n":1}'),
            ("order", "o2", "created", '{"n":2}'),
            ("invoice", "i1", "issued", None),
        ]
    )
    for n in range(6):
        w.tx(
            [
                ("order", f"o{n % 3 + 1}", "updated", json.dumps({"step": n})),
                ("invoice", f"i{n % 2 + 1}", "paid", "é ü"),
            ]
        )
    # rolled back: InnoDB-only, so the server logs nothing of it
    before = _master(c)
    c.execute("BEGIN")
    ghost = w.insert("order", "o1", "never", "rolled back")
    c.execute("ROLLBACK")
    assert _master(c) == before
    # savepoint: the MyISAM write makes the server log SAVEPOINT .. ROLLBACK TO with the
    # rolled-back outbox row inside the transaction; the verifier must cut it back
    w.tx(
        [("order", "o2", "sp-kept-1", "a")],
        savepoint_cut=[("order", "o2", "SPRB", "cut")],
        after_cut=[("order", "o3", "sp-kept-2", "b")],
    )
    c.execute("SHOW BINLOG EVENTS IN %s", (before[0],))
    assert any("SPRB" in str(r[5]) for r in c.fetchall()), "the rolled-back savepoint row must be in the binlog"
    c.execute("ALTER TABLE other ADD COLUMN w INT")  # DDL
    c.execute("INSERT INTO other(v) VALUES ('not an outbox row')")
    c.execute("INSERT INTO side(v) VALUES ('myisam only')")
    c.execute("FLUSH BINARY LOGS")  # a second binlog file
    # MariaDB writes a Binlog_checkpoint event into the new file once the old one is
    # durable, asynchronously: wait for it so that it cannot land inside a transaction's
    # SHOW MASTER STATUS bracket below.
    new_file = _master(c)[0]

    def checkpointed() -> bool:
        c.execute("SHOW BINLOG EVENTS IN %s", (new_file,))
        return any(r[2] == "Binlog_checkpoint" and r[5] == new_file for r in c.fetchall())

    wait_until(checkpointed, 20, "a Binlog_checkpoint in the new binlog file")
    w.tx([("bad topic", "b1", "created", "illegal")])  # dead-lettered: illegal topic
    for n in range(5):
        w.tx(
            [("order", "o1", "shipped", f"p{n}"), ("order", "o4", "shipped", None), ("invoice", "i3", "sent", "x" * 50)]
        )
    w.tx([("order", f"bulk{n % 7}", "bulk", f"b{n}") for n in range(40)])
    w.tx([("order", "o5", "swap-a", "1")])
    w.tx([("order", "o5", "swap-b", "2")])

    # commit times from the XID events (header timestamp, seconds)
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent

    stream = BinLogStreamReader(connection_settings=db.connection_settings(), server_id=77001, blocking=False,
                                resume_stream=True, log_file="mysql-bin.000001", log_pos=4, only_events=[XidEvent])  # fmt: skip
    commit_at: dict[tuple[str, int], int] = {}
    for ev in stream:
        commit_at[(stream.log_file, ev.packet.log_pos)] = ev.timestamp
    stream.close()
    w.expected = [replace(e, commit_ts_ms=commit_at[(e.file, e.end)] * 1000) for e in w.expected]
    w.ghost = ghost  # type: ignore[attr-defined]  # extra fields for the seeded-fault tests
    w.ghost_position = before  # type: ignore[attr-defined]  # as above
    yield w
    w.conn.close()


# ------------------------------------------------------------------------ the test relay


def avro_value(e: Expected) -> bytes:
    from connectors.schema_registry.avro_schemas import schema

    parsed = fastavro.parse_schema(schema())
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", 1))
    fastavro.schemaless_writer(buf, parsed, {
        "id": e.event_id, "aggregate_type": e.aggregate_type, "aggregate_id": e.aggregate_id, "type": e.event_type,
        "payload": e.payload, "timestamp": None,
    })  # fmt: skip
    return buf.getvalue()


def headers_of(e: Expected) -> list[tuple[str, bytes]]:
    return [
        (hdr.H_EVENT_ID, e.event_id.encode()),
        (hdr.H_EVENT_TYPE, e.event_type.encode()),
        (hdr.H_SOURCE, SOURCE.encode()),
        (hdr.H_SERVER_ID, b"1"),
        (hdr.H_FILE, e.file.encode()),
        (hdr.H_POS, str(e.pos).encode()),
        (hdr.H_ROW, str(e.row).encode()),
        (hdr.H_GTID, e.gtid.encode()),
        (hdr.H_COMMIT_TS, str(e.commit_ts_ms).encode()),
        (hdr.H_TABLE, f"{SCHEMA}.outbox".encode()),
    ]


def topic_of(prefix: str, e: Expected) -> str | None:
    from cdc.events.topics import topic_problem

    t = f"{prefix}.{e.aggregate_type}"
    return None if topic_problem(t) else t


class Published:
    def __init__(self) -> None:
        self.where: dict[tuple, list[tuple[str, int, int]]] = {}

    def add(self, key: tuple, t: str, p: int, o: int) -> None:
        self.where.setdefault(key, []).append((t, p, o))


def publish(kafka: Any, prefix: str, expected: list[Expected], *, drop: set = frozenset(), dup: set = frozenset(),
            swap: tuple | None = None, alter: dict | None = None, phantoms: list[Expected] = ()) -> Published:  # type: ignore[assignment]  # fmt: skip
    from confluent_kafka import Producer

    for name, n in ((f"{prefix}.order", 3), (f"{prefix}.invoice", 2), (f"{prefix}.dlq", 1)):
        kafka.create_topic(name, n)
    out = Published()
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "partitioner": "murmur2_random",
                         "transactional.id": f"test-relay-{prefix}", "linger.ms": 5, "log_level": 3})  # fmt: skip
    producer.init_transactions(20)

    def report(key: tuple) -> Any:
        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            out.add(key, msg.topic(), msg.partition(), msg.offset())

        return cb

    order = [e for e in expected if e.key not in drop]
    if swap:
        a = next(i for i, e in enumerate(order) if e.key == swap[0])
        b = next(i for i, e in enumerate(order) if e.key == swap[1])
        order[a], order[b] = order[b], order[a]
    # one Kafka transaction per binlog transaction (as the relay would): markers leave gaps
    groups: list[list[Expected]] = []
    for e in list(order) + list(phantoms):
        if groups and groups[-1][0].gtid == e.gtid:
            groups[-1].append(e)
        else:
            groups.append([e])
    for group in groups:
        producer.begin_transaction()
        for e in group:
            for _copy in range(2 if e.key in dup else 1):
                topic = topic_of(prefix, e)
                if topic is None:
                    h = headers_of(e) + [
                        (hdr.H_DLQ_CAUSE, b"illegal_topic"),
                        (hdr.H_DLQ_ERROR, b"topic name has characters Kafka does not allow"),
                        (hdr.H_DLQ_TOPIC, f"{prefix}.{e.aggregate_type}".encode()),
                    ]
                    value = json.dumps(
                        {"table": f"{SCHEMA}.outbox", "row": {"id": e.event_id, "aggregateid": e.aggregate_id}}
                    ).encode()
                    producer.produce(
                        f"{prefix}.dlq", key=e.aggregate_id.encode(), value=value, headers=h, on_delivery=report(e.key)
                    )
                    continue
                value = avro_value(replace(e, **(alter or {}).get(e.key, {})))
                producer.produce(
                    topic, key=e.aggregate_id.encode(), value=value, headers=headers_of(e), on_delivery=report(e.key)
                )
        producer.commit_transaction(20)
    assert producer.flush(20) == 0
    return out


def verify_config(servers: Any, prefix: str, tmp: Path, **over: Any) -> Any:
    from spark_jobs.verify import VerifyConfig

    db, kafka = servers
    base = dict(
        mysql=db.connection_settings(),
        source=SOURCE,
        tables=(OutboxTable(SCHEMA, "outbox", topic=prefix + ".{aggregate_type}"),),
        kafka_bootstrap=kafka.bootstrap_servers,
        dlq_topic=f"{prefix}.dlq",
        spark_master="local[2]",
        output_dir=str(tmp / prefix),
        max_examples=50,
    )
    base.update(over)
    return VerifyConfig(**base)


def coords(ex: dict[str, Any]) -> tuple:
    return (ex["binlog"]["gtid"], ex["binlog"]["row"])


# ---------------------------------------------------------------------------------- tests


def test_binlog_source_reads_exactly_the_committed_outbox_inserts(servers, world, spark) -> None:
    db, _ = servers
    s = db.connection_settings()
    from spark_jobs.mysql.binlog_source import tables_to_json

    df = (
        spark.read.format("cdc_binlog")
        .options(host=s["host"], port=str(s["port"]), user=s["user"], password=s["password"])
        .option("source", SOURCE)
        .option("tables", tables_to_json([OutboxTable(SCHEMA, "outbox")]))
        .load()
    )
    assert df.rdd.getNumPartitions() == 2  # one per binlog file
    rows = df.filter("ikey is not null").collect()
    got = {(r["gtid"], r["row"]): r for r in rows}
    assert len(got) == len(rows) == len(world.expected)
    for e in world.expected:
        r = got[e.key]
        assert (r["file"], r["tx_pos"], r["tx_end"], r["commit_ts_ms"]) == (e.file, e.pos, e.end, e.commit_ts_ms)
        assert (r["event_id"], r["aggregate_id"], r["event_type"]) == (e.event_id, e.aggregate_id, e.event_type)
        assert r["payload"] == (None if e.payload is None else e.payload.encode())
    assert not any(r["event_type"] in ("SPRB", "never") for r in rows)
    bad = [r for r in rows if r["aggregate_type"] == "bad topic"]
    assert len(bad) == 1 and bad[0]["dlq_cause"] == "illegal_topic"
    assert df.filter("ikey is null").count() == 0  # no assembly anomalies


def test_split_ranges_and_fast_reader_read_the_same_events(servers, world, spark) -> None:
    """Binlog files cut into ranges at transaction starts (more tasks than files), and the
    opt-in fast reader (the relay's decoder feeding the verifier's own assembly), yield
    exactly the rows of the default one-task-per-file python-mysql-replication read."""
    db, _ = servers
    s = db.connection_settings()
    from spark_jobs.mysql.binlog_plan import plan_binlog, split_ranges
    from spark_jobs.mysql.binlog_rows import BINLOG_FIELDS
    from spark_jobs.mysql.binlog_source import tables_to_json

    plan = plan_binlog(s, server_id_base=880000)

    def read(**opts: str) -> tuple[int, list]:
        df = (
            spark.read.format("cdc_binlog")
            .options(host=s["host"], port=str(s["port"]), user=s["user"], password=s["password"])
            .option("source", SOURCE)
            .option("tables", tables_to_json([OutboxTable(SCHEMA, "outbox")]))
            .option("plan", json.dumps(plan))
            .options(**opts)
            .load()
        )
        rows = sorted((tuple(r[n] for n, _ in BINLOG_FIELDS) for r in df.collect()), key=repr)
        return df.rdd.getNumPartitions(), rows

    n_default, default = read()
    assert n_default == 2 and len(default) == len(world.expected)
    ranges = split_ranges(s, plan, 400)["ranges"]
    assert len(ranges) > 4 and all(r["start"] < r["end"] for r in ranges)
    n_split, split = read(split_bytes="400")
    assert n_split == len(ranges) and split == default
    _, fast = read(binlog_reader="fast", split_bytes="400")
    assert fast == default


def test_clean_run_reports_no_problem(servers, world, spark, tmp_path_factory) -> None:
    from spark_jobs.verify import run_verify

    _db, kafka = servers
    tmp = tmp_path_factory.mktemp("verify")
    pub = publish(kafka, "clean", world.expected)
    messages = []
    rep = run_verify(verify_config(servers, "clean", tmp), progress=messages.append, spark=spark)
    n = len(world.expected)
    assert rep.ok, rep.summary_text()
    assert rep.counts == {"delivered": n - 1, "dead_lettered": 1, "missing": 0, "duplicate": 0, "phantom": 0,
                          "reordered": 0, "altered": 0, "unverifiable": 0}  # fmt: skip
    assert rep.summary["dead_letter_causes"] == {"illegal_topic": 1}
    assert rep.summary["order_violations"]["count"] == 0
    vt = rep.verified_through
    assert vt["complete"] and (vt["file"], vt["pos"]) == (world.expected[-1].file, world.expected[-1].end)
    assert rep.summary["latency"]["count"] == n and rep.summary["latency"]["p50_ms"] >= 0
    assert rep.missing_events() == []
    # the transactional test relay left commit markers: offsets without records
    parts = rep.inputs["kafka"]["partitions"]
    assert sum(p["records_read"] for p in parts) == n
    assert any(p["high"] - p["low"] > p["records_read"] > 0 for p in parts)
    assert {f["file"] for f in rep.inputs["binlog"]["files"]} == {"mysql-bin.000001", "mysql-bin.000002"}
    # outputs exist, hold no password
    for path in (rep.json_path, rep.html_path):
        text = Path(path).read_text()
        assert PASSWORD_MARK not in text
    assert json.loads(Path(rep.json_path).read_text())["ok"] is True
    assert "<svg" in Path(rep.html_path).read_text()
    assert PASSWORD_MARK not in repr(verify_config(servers, "clean", tmp))
    assert messages and all(PASSWORD_MARK not in m for m in messages)
    world.clean_published = pub  # for the locate tests


def test_run_verify_registers_the_sources_on_a_passed_session(servers, world, tmp_path) -> None:
    """A session built elsewhere (a plain SparkSession, not build_spark) knows no
    cdc_binlog / cdc_kafka: run_verify registers them itself, and registering again is
    harmless. Its own process: this module's session already has the sources."""
    if getattr(world, "clean_published", None) is None:
        pytest.skip("needs test_clean_run_reports_no_problem")
    db, kafka = servers
    s = db.connection_settings()
    config = {
        "source": SOURCE, "dlq_topic": "clean.dlq", "output_dir": str(tmp_path / "out"),
        "mysql": {"host": s["host"], "port": s["port"], "user": s["user"], "password_env": "VERIFY_TEST_PW"},
        "kafka": {"bootstrap": kafka.bootstrap_servers},
        "outbox": {"tables": [{"schema": SCHEMA, "table": "outbox", "topic": "clean.{aggregate_type}"}]},
    }  # fmt: skip
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[2]
    script = f"""
import json, sys
sys.path.insert(0, {str(root)!r})
from pyspark.sql import SparkSession
from spark_jobs.session import register_sources
from spark_jobs.verify import load_config, run_verify
plain = (SparkSession.builder.master("local[1]").appName("plain").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
try:
    plain.read.format("cdc_binlog").load()
    before = "found"
except Exception as exc:
    before = "DATA_SOURCE_NOT_FOUND" if "DATA_SOURCE_NOT_FOUND" in str(exc) else repr(exc)[:300]
rep = run_verify(load_config({str(path)!r}), spark=plain)
register_sources(plain)  # again: harmless
schema = [f.name for f in plain.read.format("cdc_kafka").option("include_raw", "false").option("decode", "false").load().schema]
print(json.dumps({{"before": before, "ok": rep.ok, "counts": rep.counts, "schema": schema[:3]}}))
plain.stop()
"""
    env = {
        **os.environ,
        "VERIFY_TEST_PW": s["password"],
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(tmp_path),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    n = len(world.expected)
    assert out["before"] == "DATA_SOURCE_NOT_FOUND"  # the bug's precondition: a session without the sources
    assert out["ok"] is True and out["counts"]["delivered"] == n - 1 and out["counts"]["dead_lettered"] == 1
    assert out["schema"] == ["topic", "partition", "offset"]


def test_a_failed_read_stops_the_other_and_says_why(servers, world, spark, tmp_path) -> None:
    """The binlog and the topics are read by two concurrent Spark jobs. A user who may
    list the binlog (planning works) but not stream it (no REPLICATION SLAVE) makes the
    binlog job fail: run_verify raises one error that names the read and never the
    password, and the topics' job is not left running on the session."""
    from spark_jobs.verify import ReadFailed, run_verify

    db, _kafka = servers
    password = "no-dump-pw-7f3a"
    admin = db.connect(autocommit=True)
    cur = admin.cursor()
    cur.execute("CREATE USER IF NOT EXISTS 'nodump'@'%%' IDENTIFIED BY %s", (password,))
    cur.execute("GRANT BINLOG MONITOR, SELECT ON *.* TO 'nodump'@'%'")
    admin.close()
    mysql = {**db.connection_settings(), "user": "nodump", "password": password}
    started = time.monotonic()
    with pytest.raises(ReadFailed) as failure:
        run_verify(verify_config(servers, "clean", tmp_path, mysql=mysql), spark=spark)
    message = str(failure.value)
    assert message.startswith("cdc_binlog: reading") and "REPLICATION SLAVE" in message, message
    assert "\n" not in message and password not in message
    wait_until(
        lambda: not spark.sparkContext.statusTracker().getActiveJobsIds(),
        30,
        "the other read's job to end",
        interval=0.2,
    )
    assert time.monotonic() - started < 120


def test_seeded_faults_are_each_classified(servers, world, spark, tmp_path_factory) -> None:
    from spark_jobs.verify import run_verify

    _db, kafka = servers
    tmp = tmp_path_factory.mktemp("verify")
    ex = world.expected
    dropped = next(e for e in ex if e.aggregate_id == "o4")
    duplicated = next(e for e in ex if e.event_type == "paid")
    swap_a = next(e for e in ex if e.event_type == "swap-a")
    swap_b = next(e for e in ex if e.event_type == "swap-b")
    altered = next(e for e in ex if e.event_type == "bulk")
    ghost = Expected(
        event_id=world.ghost["event_id"], aggregate_type="order", aggregate_id="o1", event_type="never",
        payload="rolled back", file=world.ghost_position[0], pos=world.ghost_position[1], row=0, gtid="0-1-900000",
        end=world.ghost_position[1] + 100, commit_ts_ms=ex[0].commit_ts_ms,
    )  # fmt: skip
    pub = publish(
        kafka, "faulty", ex,
        drop={dropped.key}, dup={duplicated.key}, swap=(swap_a.key, swap_b.key),
        alter={altered.key: {"payload": "tampered"}}, phantoms=[ghost],
    )  # fmt: skip
    rep = run_verify(verify_config(servers, "faulty", tmp), spark=spark)
    n = len(ex)
    assert not rep.ok
    assert rep.counts == {"delivered": n - 5, "dead_lettered": 1, "missing": 1, "duplicate": 1, "phantom": 1,
                          "reordered": 1, "altered": 1, "unverifiable": 0}, rep.summary_text()  # fmt: skip
    examples = rep.summary["examples"]
    # missing: the dropped one, with its full coordinates, also in the repair list
    (m,) = examples["missing"]
    assert coords(m) == dropped.key and m["binlog"]["file"] == dropped.file and m["binlog"]["pos"] == dropped.pos
    assert m["event_id"] == dropped.event_id and m["deliveries"] == []
    (entry,) = rep.missing_events()
    assert (entry["file"], entry["pos"], entry["row"], entry["gtid"], entry["event_id"]) == (
        dropped.file, dropped.pos, dropped.row, dropped.gtid, dropped.event_id)  # fmt: skip
    assert entry["expected_topic"] == "faulty.order" and entry["aggregate_id"] == "o4"
    # duplicate: both offsets
    (d,) = examples["duplicate"]
    assert coords(d) == duplicated.key
    assert sorted((x["topic"], x["partition"], x["offset"]) for x in d["deliveries"]) == sorted(
        pub.where[duplicated.key]
    )
    assert len(d["deliveries"]) == 2
    # reordered: swap-a came after swap-b of the same key
    (r,) = examples["reordered"]
    assert coords(r) == swap_a.key
    assert [(x["topic"], x["partition"], x["offset"]) for x in r["deliveries"]] == pub.where[swap_a.key]
    # altered: payload, nothing else
    (a,) = examples["altered"]
    assert coords(a) == altered.key and a["reasons"] == ["payload"]
    # phantom: the never-committed transaction's message, with its Kafka coordinates
    (p,) = examples["phantom"]
    assert (p["kafka"]["topic"], p["kafka"]["partition"], p["kafka"]["offset"]) == pub.where[ghost.key][0]
    assert p["headers"]["gtid"] == "0-1-900000"
    # verified_through stops before the first unproven event (the dropped one comes first)
    first_bad = min((dropped, altered), key=lambda e: (e.file, e.pos, e.row))
    fu = rep.summary["first_unproven"]
    assert (fu["file"], fu["pos"], fu["row"]) == (first_bad.file, first_bad.pos, first_bad.row)
    prior = max((e for e in ex if (e.file, e.pos) < (first_bad.file, first_bad.pos)), key=lambda e: (e.file, e.pos))
    assert (rep.verified_through["file"], rep.verified_through["pos"]) == (prior.file, prior.end)
    # the duplicate's second copy and the swap go backwards in their partitions
    assert rep.summary["order_violations"]["count"] >= 2
    text = rep.summary_text()
    assert "FAILED" in text and "missing=1" in text


def test_kafka_source_raw_mode_and_offset_gaps(servers, world, spark) -> None:
    _db, kafka = servers
    pub = getattr(world, "clean_published", None)
    if pub is None:
        pytest.skip("needs test_clean_run_reports_no_problem")
    df = (
        spark.read.format("cdc_kafka")
        .option("bootstrap", kafka.bootstrap_servers)
        .option("topic_pattern", r"clean\..*")
        .option("chunk", "7")  # several ranges per partition
        .option("decode", "false")
        .load()
    )
    assert df.rdd.getNumPartitions() > 5
    rows = df.collect()
    by_offset = {(r["topic"], r["partition"], r["offset"]): r for r in rows}
    assert len(by_offset) == len(rows) == len(world.expected)
    for e in world.expected:
        (where,) = pub.where[e.key]
        r = by_offset[where]
        assert r["headers"][hdr.H_GTID] == e.gtid and r["headers"][hdr.H_ROW] == str(e.row)
        assert r["key"] == e.aggregate_id.encode()
    offsets = sorted(o for (t, p, o) in by_offset if (t, p) == ("clean.order", 0))
    assert offsets != list(range(len(offsets)))  # gaps left by transaction markers


def test_locate_both_ways(servers, world) -> None:
    from spark_jobs.locate import locate_offset, locate_position

    _db, kafka = servers
    pub = getattr(world, "clean_published", None)
    if pub is None:
        pytest.skip("needs test_clean_run_reports_no_problem")
    e = next(x for x in world.expected if x.aggregate_id == "bulk3")
    (where,) = pub.where[e.key]
    found = locate_offset(kafka.bootstrap_servers, *where)
    assert found is not None
    assert found["identity_key"] == (SOURCE, e.gtid, e.row)
    assert (found["file"], found["pos"], found["row"], found["gtid"]) == (e.file, e.pos, e.row, e.gtid)
    # the offset after the last record of a partition is a commit marker (or beyond): no record
    t, p, _o = where
    last = max(o for locs in pub.where.values() for (tt, pp, o) in locs if (tt, pp) == (t, p))
    assert locate_offset(kafka.bootstrap_servers, t, p, last + 1) is None
    topics = ["clean.order", "clean.invoice", "clean.dlq"]
    same_tx = sorted(w for x in world.expected if x.gtid == e.gtid for w in pub.where[x.key])
    assert locate_position(kafka.bootstrap_servers, topics, SOURCE, e.gtid) == same_tx
    assert locate_position(kafka.bootstrap_servers, topics, SOURCE, f"{e.file}:{e.pos}") == same_tx
    assert locate_position(kafka.bootstrap_servers, topics, SOURCE, f"{e.file}:{e.pos}", row=e.row) == [where]
    assert locate_position(kafka.bootstrap_servers, topics, "another-source", e.gtid) == []


def test_outbox_table_source(servers, world, spark) -> None:
    from spark_jobs.mysql.binlog_source import tables_to_json

    db, _ = servers
    s = db.connection_settings()
    df = (
        spark.read.format("cdc_outbox_table")
        .options(host=s["host"], port=str(s["port"]), user=s["user"], password=s["password"])
        .option("table", tables_to_json([OutboxTable(SCHEMA, "outbox")]))
        .option("chunk", "10")
        .load()
    )
    assert df.rdd.getNumPartitions() >= 6
    rows = df.collect()
    assert sorted(r["event_id"] for r in rows) == sorted(e.event_id for e in world.expected)


@pytest.mark.skipif(
    not shutil.which("spark-submit", path=os.path.dirname(sys.executable)), reason="no spark-submit in the venv"
)
def test_spark_submit_entry_point(servers, world, tmp_path) -> None:
    """`spark-submit spark_jobs/verify.py --config ...` runs the same job (exit 0 = OK)."""
    if getattr(world, "clean_published", None) is None:
        pytest.skip("needs test_clean_run_reports_no_problem")
    db, kafka = servers
    s = db.connection_settings()
    config = {
        "source": SOURCE,
        "dlq_topic": "clean.dlq",
        "output_dir": str(tmp_path / "out"),
        "mysql": {"host": s["host"], "port": s["port"], "user": s["user"], "password_env": "VERIFY_TEST_PW"},
        "kafka": {"bootstrap": kafka.bootstrap_servers},
        "outbox": {"tables": [{"schema": SCHEMA, "table": "outbox", "topic": "clean.{aggregate_type}"}]},
        "spark_conf": {"spark.sql.shuffle.partitions": "2"},
    }
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "VERIFY_TEST_PW": s["password"],
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
         str(root / "spark_jobs" / "verify.py"), "--config", str(path), "--quiet"],
        capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "cdc verify: OK" in proc.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["ok"] is True and report["counts"]["delivered"] == len(world.expected) - 1
    assert report["config"]["spark_master"] == "local[*]"  # config default; spark-submit's --master won
    assert PASSWORD_MARK not in proc.stdout + proc.stderr + (tmp_path / "out" / "report.json").read_text()
