"""Issue 26: the relay, `cdc check` and `cdc verify` end to end on MySQL bytes, as MySQL 5.7,
8.0, 8.4 and 9.x, on the MySQL lab (`testbed/mysql_lab/`: binlog files written byte for byte
as those servers write them, served over MySQL's client and replication protocol; no MySQL
server can be installed here, tests/README.md says what the lab reproduces).

The workload carries every shape issue 26 names: JSON payloads with DECIMALs, a TIME over
24 hours, DATETIMEs and text outside the BMP; ENUM / SET / DECIMAL / DATETIME(6) columns;
tagged GTIDs (`SET gtid_next = 'AUTOMATIC:<tag>'`, type 42) mixed with plain ones;
Transaction_payload (zstd) transactions; XA prepared then committed or rolled back later,
other transactions between; partial JSON updates of outbox rows (an UPDATE: `on_change`,
nothing published); rolled-back transactions (nothing in the binlog); rotations. What was
committed is known from the writer itself, so the check needs no decoder at all: every
committed outbox insert exactly once, in commit order per key, nothing else. As 5.7 and 8.0
the shapes those versions lack (tagged GTIDs, and on 5.7 Transaction_payload and partial
JSON) are plain transactions instead; 5.7's Table_maps carry no column names at all.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cdc.config import load_config
from testbed.mysql_lab.binlog_writer import Column, JsonDiff, Xid
from testbed.mysql_lab.json_binary import INSERT
from tests.integration.harness import RelayProcess, _to_toml, env_for, relay_raw_config, wait_until
from tests.integration.independent_checker import Committed, check, topic_records
from tests.integration.test_faults import _checkpoint_reached, _server_end

pytestmark = [pytest.mark.integration]

DB = "shop"
AGGREGATES = ("order", "customer")
TAG = "batch"

OUTBOX = [
    Column("id", "varchar(36)", nullable=False, key="PRI"),
    Column("aggregatetype", "varchar(255)", nullable=False),
    Column("aggregateid", "varchar(255)", nullable=False),
    Column("type", "varchar(255)", nullable=False),
    Column("payload", "json"),
    Column("created_at", "datetime(6)", nullable=False),
    Column("status", "enum('new','sent','failed')"),
]
ORDERS = [
    Column("id", "bigint", nullable=False, key="PRI"),
    Column("total", "decimal(12,2)", nullable=False),
    Column("state", "enum('open','paid','shipped')"),
    Column("flags", "set('gift','express','fragile')"),
    Column("note", "varchar(255)"),
    Column("placed_at", "datetime(6)"),
]


class LabWorkload:
    """Transactions of every shape, written through the lab's binlog writer; `committed` is
    what a relay must publish, in commit order (an XA transaction at its XA COMMIT)."""

    def __init__(self, writer, seed: int = 26):
        self.w = writer
        # what the writer's version has: tagged GTIDs (8.3), Transaction_payload (8.0.20),
        # partial JSON (8.0.3): an older one writes plain transactions in their place
        version = writer.version_tuple
        self.tags_ok, self.compression_ok, self.partial_ok = version >= (8, 3), version >= (8, 0, 20), version >= (8,)
        self.rng = random.Random(seed)
        self.committed: list[Committed] = []
        self.prepared: list[tuple[Xid, list[tuple[str, str]]]] = []
        self.rows: dict[str, dict] = {}  # outbox rows by id, for partial JSON updates
        self.n = 0
        self.shapes: dict[str, int] = {}
        writer.create_table(DB, "outbox", OUTBOX)
        writer.create_table(DB, "orders", ORDERS)

    def _event(self) -> dict:
        self.n += 1
        rng, n = self.rng, self.n
        total = decimal.Decimal(rng.randrange(1, 10**7)) / 100
        payload = {
            "order": n,
            "total": total,
            "taken": datetime.timedelta(hours=rng.randrange(0, 200), microseconds=rng.randrange(10**6)),
            "at": datetime.datetime(2026, 11, 26, rng.randrange(24), rng.randrange(60), 1, rng.randrange(10**6)),
            "note": rng.choice(["żółw 🐢", "plain", 'quote " and \\', ""]),
            "lines": [{"sku": f"s{k}", "qty": k, "price": 1.5 * k} for k in range(rng.randrange(4))],
        }
        return {
            "id": f"ev-{n:06d}",
            "aggregatetype": rng.choice(AGGREGATES),
            "aggregateid": f"k{rng.randrange(40)}",
            "type": "Created",
            "payload": payload if rng.random() > 0.05 else None,
            "created_at": datetime.datetime(2026, 11, 26, 12, 0, 0, n % 10**6),
            "status": rng.choice(["new", "sent", None]),
        }

    def _business_rows(self, tx) -> None:
        self.n += 1
        tx.insert(
            DB,
            "orders",
            [
                {
                    "id": self.n,
                    "total": decimal.Decimal("12.34"),
                    "state": self.rng.choice(["open", "paid", "shipped"]),
                    "flags": {"gift", "fragile"} if self.n % 2 else set(),
                    "note": "x" * self.rng.randrange(50),
                    "placed_at": datetime.datetime(2026, 1, 1, 0, 0, 0, 123456),
                }
            ],
        )

    def _count(self, shape: str) -> None:
        self.shapes[shape] = self.shapes.get(shape, 0) + 1

    def write(self, transactions: int) -> None:
        w, rng = self.w, self.rng
        for _ in range(transactions):
            r = rng.random()
            events = [self._event() for _ in range(rng.randrange(1, 6))]
            if r < 0.08 and self.prepared:
                xid, rows = self.prepared.pop(0)
                if rng.random() < 0.75:
                    w.xa_commit(xid)
                    self._commit(rows)
                    self._count("xa_commit")
                else:
                    w.xa_rollback(xid)
                    self._count("xa_rollback")
                continue
            if r < 0.16:
                xid = Xid(f"xa-{self.n}".encode(), b"b", 7)
                with w.xa_prepare(xid) as tx:
                    tx.insert(DB, "outbox", events)
                self.prepared.append((xid, [(e["id"], e["aggregateid"]) for e in events]))
                self._count("xa_prepare")
                continue
            if r < 0.21:
                try:
                    with w.transaction() as tx:
                        tx.insert(DB, "outbox", events)
                        raise _Rollback
                except _Rollback:
                    self._count("rollback")
                continue
            if r < 0.27 and self.rows and self.partial_ok:
                old = self.rows[rng.choice(sorted(self.rows))]
                if isinstance(old["payload"], dict):
                    new = {**old, "payload": {**old["payload"], "status": "sent"}}
                    w.partial_json = True
                    with w.transaction() as tx:
                        tx.update_json_partial(
                            DB, "outbox", [(old, new, {"payload": [JsonDiff(INSERT, "$.status", "sent")]})]
                        )
                    w.partial_json = False
                    self.rows[old["id"]] = new
                    self._count("partial_json_update")
                    continue
            tag = TAG if r < 0.45 and self.tags_ok else None
            compressed = 0.45 <= r < 0.6 and self.compression_ok
            w.compression = compressed
            with w.transaction(tag=tag) as tx:
                self._business_rows(tx)
                tx.insert(DB, "outbox", events)
            w.compression = False
            self._commit([(e["id"], e["aggregateid"]) for e in events])
            for e in events:
                self.rows[e["id"]] = e
            self._count("tagged" if tag else "compressed" if compressed else "plain")
            if rng.random() < 0.02:
                w.rotate()
                self._count("rotate")

    def _commit(self, rows: list[tuple[str, str]]) -> None:
        for event_id, key in rows:
            self.committed.append(Committed(event_id, key, len(self.committed)))

    def finish(self) -> None:
        """Decide every XA transaction still prepared (committed: published at the end)."""
        while self.prepared:
            xid, rows = self.prepared.pop(0)
            self.w.xa_commit(xid)
            self._commit(rows)


class _Rollback(Exception):
    pass


@pytest.fixture(
    params=[
        ("8.4.3", "FULL"),
        ("9.1.0", "MINIMAL"),
        # 9.x's layouts with FULL metadata: the two above between them, once more
        # (`./run.sh test -m extended`; 9.x with FULL also runs in the GTID test below)
        pytest.param(("9.1.0", "FULL"), marks=pytest.mark.extended),
    ],
    ids=lambda p: "-".join(p),
)
def lab(request):
    """The lab as MySQL 8.4 and 9.x; 9.x with MySQL's default binlog_row_metadata =
    MINIMAL (no column or ENUM/SET value names in the Table_maps: relay and verifier each
    read them from information_schema)."""
    from testbed.mysql_lab.lab import MysqlLab

    version, metadata = request.param
    with MysqlLab.start(version=version) as lab:
        lab.row_metadata = metadata
        yield lab


def _topics(kafka, prefix: str, partitions: int = 6) -> list[str]:
    topics = [f"{prefix}.{a}" for a in AGGREGATES]
    for t in topics:
        kafka.create_topic(t, partitions)
    kafka.create_topic(f"{prefix}.dlq", 1)
    return topics + [f"{prefix}.dlq"]


def _run_to_end(lab, raw: dict, workdir: Path) -> RelayProcess:
    end = _server_end(lab)
    relay = RelayProcess(raw, env_for(lab), workdir)
    try:
        wait_until(
            lambda: _checkpoint_reached(Path(raw["checkpoint"]["path"]), end) or not relay.alive(),
            240,
            f"the relay to reach {end}",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; relay log:\n{relay.log_text()[-3000:]}") from None
    assert relay.alive(), relay.log_text()[-3000:]
    return relay


def test_the_relay_publishes_a_mysql_binlog_once_across_a_sigkill_and_verify_agrees(
    lab, kafka, topic_prefix, tmp_path, spark
):
    from cdc_cli.verify_commands import verify_config
    from spark_jobs.verify import run_verify

    work = LabWorkload(lab.writer(row_metadata=lab.row_metadata))
    topics = _topics(kafka, topic_prefix)
    raw = relay_raw_config(lab, kafka, DB, topic_prefix, tmp_path / "cp.json")
    start = raw["source"]["start"]
    work.write(60)
    relay = RelayProcess(raw, env_for(lab), tmp_path / "run-1")
    try:
        wait_until(lambda: Path(raw["checkpoint"]["path"]).exists() or not relay.alive(), 60, "a first checkpoint")
        assert relay.alive(), relay.log_text()[-3000:]
        work.write(120)  # written while the relay reads
        relay.kill()  # SIGKILL mid-stream
        work.write(60)
        work.finish()
        relay = _run_to_end(lab, raw, tmp_path / "run-2")
        assert relay.terminate() == 0
        log = relay.log_text()
        assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
    finally:
        if relay.alive():
            relay.kill()
    assert lab.unknown_statements() == [] and lab.lab_errors() == []
    for shape in ("plain", "tagged", "compressed", "xa_commit", "xa_rollback", "rollback", "partial_json_update"):
        assert work.shapes.get(shape, 0) > 0, (shape, work.shapes)
    records = topic_records(kafka.bootstrap_servers, topics)
    result = check(work.committed, records)
    print(f"\nMySQL {lab.version} lab, row metadata {lab.row_metadata}, {work.shapes}: {result.summary()}")
    assert result.committed > 300 and result.clean, result.summary()

    cfg = load_config(raw, env_for(lab))
    rep = run_verify(replace(verify_config(cfg, str(tmp_path / "verify"), start_file=start.split(":")[0])), spark=spark)
    c = rep.counts
    assert rep.ok and not rep.problems and not rep.anomalies, (rep.problems, rep.anomalies)
    assert c["delivered"] == result.committed, c


def test_the_relay_starts_at_a_gtid_set_and_restarts_from_a_tagged_gtid_checkpoint(kafka, topic_prefix, tmp_path):
    """`source.start` a MySQL GTID set with tags: what it holds is skipped; a checkpoint
    taken after tagged transactions restarts the relay exactly after them."""
    from testbed.mysql_lab.lab import MysqlLab

    with MysqlLab.start(version="9.1.0") as lab:
        work = LabWorkload(lab.writer(), seed=7)
        topics = _topics(kafka, topic_prefix)
        for _ in range(3):
            with work.w.transaction(tag=TAG) as tx:
                tx.insert(DB, "outbox", [work._event()])  # before the start: never published
        skipped = str(work.w.gtid_executed)
        assert f":{TAG}:" in skipped
        work.write(80)
        work.finish()
        raw = relay_raw_config(lab, kafka, DB, topic_prefix, tmp_path / "cp.json", source__start=skipped)
        relay = _run_to_end(lab, raw, tmp_path / "run-1")
        assert relay.terminate() == 0
        cp = json.loads(Path(raw["checkpoint"]["path"]).read_text())
        assert f":{TAG}:" in json.dumps(cp), cp  # the checkpoint names tagged GTIDs
        with work.w.transaction(tag=TAG) as tx:
            first = work._event()
            tx.insert(DB, "outbox", [first])
        work._commit([(first["id"], first["aggregateid"])])
        work.write(20)
        work.finish()
        relay = _run_to_end(lab, raw, tmp_path / "run-2")
        assert relay.terminate() == 0
        records = topic_records(kafka.bootstrap_servers, topics)
        result = check(work.committed, records)
        assert result.clean and result.committed == len(work.committed), result.summary()
        tagged = [r for r in records if r.event_id == first["id"]]
        assert len(tagged) == 1


@pytest.mark.fault
@pytest.mark.parametrize("version", ["8.4.3", "8.0.40", "5.7.44-log"])
def test_transactional_delivery_from_a_mysql_binlog_once_across_a_sigkill(version, noida_kafka, topic_prefix, tmp_path):
    """`kafka.delivery = "transactional"` on noida-db (a broker with transactions) over the
    lab as MySQL 8.4, 8.0 and 5.7: a SIGKILL mid-stream, a restart from the committed
    checkpoint alone."""
    from cdc.position import BinlogPosition
    from connectors.checkpoint_stores import KafkaCheckpointStore
    from testbed.mysql_lab.lab import MysqlLab

    with MysqlLab.start(version=version) as lab:
        work = LabWorkload(lab.writer(), seed=11)
        topics = _topics(noida_kafka, topic_prefix, partitions=3)
        noida_kafka.create_topic(f"{topic_prefix}.checkpoints", 1)
        raw = relay_raw_config(
            lab,
            noida_kafka,
            DB,
            topic_prefix,
            tmp_path / "unused.json",
            kafka__delivery="transactional",
            kafka__transaction_max_ms=100,
            kafka__producer={"message.timeout.ms": 3000},
            lease__enabled=False,
        )
        raw["checkpoint"] = {"store": "kafka", "topic": f"{topic_prefix}.checkpoints", "interval_s": 0.2}
        store = KafkaCheckpointStore(
            noida_kafka.bootstrap_servers, f"{topic_prefix}.checkpoints", raw["source"]["name"]
        )

        def reached(end: tuple[str, int]) -> bool:
            cp = store.load()
            return cp is not None and cp.position >= BinlogPosition(*end)

        work.write(60)
        relay = RelayProcess(raw, env_for(lab), tmp_path / "run-1")
        try:
            wait_until(lambda: store.load() is not None or not relay.alive(), 60, "a first committed checkpoint")
            assert relay.alive(), relay.log_text()[-3000:]
            work.write(100)
            relay.kill()
            work.write(40)
            work.finish()
            end = _server_end(lab)
            relay = RelayProcess(raw, env_for(lab), tmp_path / "run-2")
            try:
                wait_until(lambda: reached(end) or not relay.alive(), 240, f"the relay to commit through {end}")
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; checkpoint {store.load()}; relay log:\n{relay.log_text()[-3000:]}"
                ) from None
            assert relay.alive(), relay.log_text()[-3000:]
            assert relay.terminate() == 0
        finally:
            if relay.alive():
                relay.kill()
        records = topic_records(noida_kafka.bootstrap_servers, topics)
        result = check(work.committed, records)
        print(f"\nMySQL {version} lab, transactional: {work.shapes}: {result.summary()}")
        assert result.committed > 200 and result.clean, result.summary()


def _cdc_check(raw: dict, lab, workdir: Path) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "relay.toml"
    config.write_text(_to_toml(raw))
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", "check", "--config", str(config)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **env_for(lab)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("version", ["5.7.44-log", "8.0.40"])
def test_mysql_5_7_and_8_0_from_a_gtid_set_once_across_a_sigkill_and_verify_agrees(
    version, kafka, topic_prefix, tmp_path, spark
):
    """The lab as MySQL 5.7 (42-byte GTID events, Table_maps without any names: the relay
    and the verifier read them from information_schema) and as 8.0: `cdc check` passes, the
    relay starts at a GTID set (what it holds, in the first file, is never published),
    is SIGKILLed mid-stream and restarted from its checkpoint, every committed event is
    published once, and `cdc verify` from the second file agrees."""
    from cdc_cli.verify_commands import verify_config
    from spark_jobs.verify import run_verify
    from testbed.mysql_lab.lab import MysqlLab

    with MysqlLab.start(version=version) as lab:
        work = LabWorkload(lab.writer(), seed=57)
        topics = _topics(kafka, topic_prefix)
        for _ in range(3):
            with work.w.transaction() as tx:
                tx.insert(DB, "outbox", [work._event()])  # before the start: never published
        skipped = str(work.w.gtid_executed)
        work.w.rotate()
        raw = relay_raw_config(lab, kafka, DB, topic_prefix, tmp_path / "cp.json", source__start=skipped)
        check_run = _cdc_check(raw, lab, tmp_path / "check")
        assert check_run.returncode == 0 and "Traceback" not in check_run.stderr, check_run.stdout + check_run.stderr
        [metadata_line] = [line for line in check_run.stdout.splitlines() if "binlog_row_metadata:" in line]
        if version.startswith("5.7"):
            assert "information_schema" in metadata_line, metadata_line
        work.write(40)
        relay = RelayProcess(raw, env_for(lab), tmp_path / "run-1")
        try:
            wait_until(lambda: Path(raw["checkpoint"]["path"]).exists() or not relay.alive(), 60, "a first checkpoint")
            assert relay.alive(), relay.log_text()[-3000:]
            work.write(80)  # written while the relay reads
            relay.kill()  # SIGKILL mid-stream
            work.write(40)
            work.finish()
            relay = _run_to_end(lab, raw, tmp_path / "run-2")
            assert relay.terminate() == 0
            log = relay.log_text()
            assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
        finally:
            if relay.alive():
                relay.kill()
        assert lab.unknown_statements() == [] and lab.lab_errors() == []
        for shape in ("plain", "xa_commit", "rollback"):
            assert work.shapes.get(shape, 0) > 0, (shape, work.shapes)
        records = topic_records(kafka.bootstrap_servers, topics)
        result = check(work.committed, records)
        print(f"\nMySQL {version} lab from {skipped}, {work.shapes}: {result.summary()}")
        assert result.committed > 150 and result.clean, result.summary()

        cfg = load_config(raw, env_for(lab))
        rep = run_verify(replace(verify_config(cfg, str(tmp_path / "verify"), start_file="binlog.000002")), spark=spark)
        c = rep.counts
        assert rep.ok and not rep.problems and not rep.anomalies, (rep.problems, rep.anomalies)
        assert c["delivered"] == result.committed, c
