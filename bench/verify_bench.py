"""Benchmark of the verifier: N outbox events into a MariaDB binlog and into Kafka
stand-in topics, then `run_verify` on local[2], with a plain python-mysql-replication read
of the same binlog as the same-run baseline.

    .venv/bin/python bench/verify_bench.py --events 1000000

Steps (only the last two are timed as results):
1. an embedded MariaDB (binlog files of --max-binlog-size, so several files exist for
   the per-file partitions; fsync off for fast loading) gets N outbox rows in
   transactions of --tx-rows rows (multi-row INSERTs; every row is one event);
2. baseline: one python-mysql-replication stream over all binlog files (GTID, rows,
   XID), which also yields the coordinates the bench needs to play the relay;
3. every event is produced to the stand-in (one topic per aggregate type, murmur2_random
   on the aggregate id, --partitions per topic so that each partition stays under the
   stand-in's ~5 MiB retention; lz4; linger for batching) with the header contract;
4. `run_verify` (local[2]) - must find every event delivered. `--runs` repeats step 4 on
   the same data with other binlog readers / masters, e.g.
   `--runs default@local[2],fast@local[2],default@local[1]` ("fast" = the relay's own
   decoder: faster, but not independent of the relay - see VerifyConfig.binlog_reader).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = "bench-db"
SCHEMA = "bench"


def load_binlog(db, events: int, tx_rows: int, keys: int) -> float:
    db.create_database(SCHEMA)
    conn = db.connect(SCHEMA, autocommit=True)
    cur = conn.cursor()
    cur.execute(
        "CREATE TABLE outbox(id BIGINT AUTO_INCREMENT PRIMARY KEY, aggregatetype VARCHAR(255), aggregateid VARCHAR(255), "
        "type VARCHAR(255), payload LONGTEXT, created_at DATETIME(6)) ENGINE=InnoDB"
    )
    t = time.monotonic()
    done = 0
    n_tx = 0
    while done < events:
        n = min(tx_rows, events - done)
        values = []
        args: list = []
        for i in range(n):
            k = (done + i) * 7919 % keys
            values.append("(%s,%s,%s,%s,NOW(6))")
            args += [
                "order" if k % 3 else "invoice",
                f"agg-{k}",
                "updated",
                '{"seq":%d,"note":"benchmark event"}' % (done + i),
            ]
        cur.execute("BEGIN")
        cur.execute(
            "INSERT INTO outbox(aggregatetype,aggregateid,type,payload,created_at) VALUES " + ",".join(values), args
        )
        cur.execute("COMMIT")
        done += n
        n_tx += 1
    conn.close()
    return time.monotonic() - t


def baseline_read(db) -> tuple[float, list]:
    """A plain python-mysql-replication read of the whole binlog: GTID, rows, XID."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import MariadbGtidEvent, RotateEvent, XidEvent
    from pymysqlreplication.row_event import WriteRowsEvent

    conn = db.connect()
    cur = conn.cursor()
    cur.execute("SHOW BINARY LOGS")
    first = cur.fetchall()[0][0]
    conn.close()
    t = time.monotonic()
    stream = BinLogStreamReader(
        connection_settings=db.connection_settings(), server_id=990001, blocking=False, resume_stream=True,
        log_file=first, log_pos=4, only_events=[MariadbGtidEvent, XidEvent, WriteRowsEvent, RotateEvent],
        only_tables=["outbox"], only_schemas=[SCHEMA],
    )  # fmt: skip
    out = []
    file = first
    gtid = start = None
    rows: list = []
    for ev in stream:
        if isinstance(ev, RotateEvent):
            file = ev.next_binlog
        elif isinstance(ev, MariadbGtidEvent):
            gtid, start, rows = ev.gtid, ev.packet.log_pos - ev.packet.event_size, []
        elif isinstance(ev, WriteRowsEvent):
            rows.extend(r["values"] for r in ev.rows)
        elif isinstance(ev, XidEvent):
            out.append((file, start, gtid, ev.timestamp, rows))
            rows = []
    stream.close()
    return time.monotonic() - t, out


def produce(kafka, txs: list, partitions: int) -> tuple[float, int]:
    import fastavro
    from confluent_kafka import Producer

    from connectors.schema_registry.avro_schemas import schema

    for topic in ("bench.order", "bench.invoice"):
        kafka.create_topic(topic, partitions)
    kafka.create_topic("bench.dlq", 1)
    parsed = fastavro.parse_schema(schema())
    producer = Producer({
        "bootstrap.servers": kafka.bootstrap_servers, "partitioner": "murmur2_random", "linger.ms": 50,
        "batch.size": 1_000_000, "compression.type": "lz4", "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 1_048_576, "enable.idempotence": True, "log_level": 3,
    })  # fmt: skip
    prefix = b"\x00" + struct.pack(">I", 1)
    t = time.monotonic()
    n = 0
    for file, start, gtid, ts, rows in txs:
        common = [("cdc.source", SOURCE.encode()), ("cdc.server.id", b"1"), ("cdc.binlog.file", file.encode()),
                  ("cdc.binlog.pos", str(start).encode()), ("cdc.gtid", gtid.encode()),
                  ("cdc.commit.ts", str(ts * 1000).encode()), ("cdc.table", f"{SCHEMA}.outbox".encode())]  # fmt: skip
        for i, v in enumerate(rows):
            buf = io.BytesIO()
            buf.write(prefix)
            eid = str(v["id"])
            fastavro.schemaless_writer(buf, parsed, {
                "id": eid, "aggregate_type": v["aggregatetype"], "aggregate_id": v["aggregateid"], "type": v["type"],
                "payload": v["payload"], "timestamp": None,
            })  # fmt: skip
            headers = [
                ("id", eid.encode()),
                ("cdc.event.type", v["type"].encode()),
                ("cdc.binlog.row", str(i).encode()),
                *common,
            ]
            while True:
                try:
                    producer.produce(
                        f"bench.{v['aggregatetype']}",
                        key=v["aggregateid"].encode(),
                        value=buf.getvalue(),
                        headers=headers,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
            if n % 20000 == 0:
                producer.poll(0)
    left = producer.flush(120)
    assert left == 0, f"{left} messages not delivered"
    return time.monotonic() - t, n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tx-rows", type=int, default=100)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument(
        "--partitions", type=int, default=0, help="per topic (default: sized for the stand-in's retention)"
    )
    parser.add_argument("--max-binlog-size", default="32M")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--reader", default="default", choices=("default", "fast"), help="the verifier's binlog reader")
    parser.add_argument(
        "--runs", default=None, help="comma-separated reader@master runs on the same data (overrides --reader/--master)"
    )
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)"
    )
    parser.add_argument(
        "--split-bytes", type=int, default=None, help="binlog piece size (default: auto; 0 = one task per file)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    from cdc.events.outbox import OutboxTable
    from spark_jobs.verify import VerifyConfig, run_verify
    from testbed.kafka_standin import KafkaStandin
    from testbed.mariadb import EmbeddedMariaDB

    # ~350 bytes a record before lz4; keep every partition well under ~5 MiB
    partitions = args.partitions or max(4, -(-args.events // 20_000))
    out_dir = args.output_dir or tempfile.mkdtemp(prefix="verify-bench-")
    result: dict = {
        "events": args.events,
        "tx_rows": args.tx_rows,
        "partitions_per_topic": partitions,
        "master": args.master,
    }
    db = EmbeddedMariaDB.start(extra_args=[f"--max-binlog-size={args.max_binlog_size}", "--sync-binlog=0",
                                           "--innodb-flush-log-at-trx-commit=0", "--innodb-buffer-pool-size=256M"])  # fmt: skip
    kafka = None
    try:
        kafka = KafkaStandin.start(brokers=1)
        result["load_binlog_s"] = round(load_binlog(db, args.events, args.tx_rows, args.keys), 2)
        conn = db.connect()
        cur = conn.cursor()
        cur.execute("SHOW BINARY LOGS")
        logs = cur.fetchall()
        conn.close()
        result["binlog_files"] = len(logs)
        result["binlog_bytes"] = sum(int(r[1]) for r in logs)
        print(f"loaded {args.events} events into {len(logs)} binlog file(s) in {result['load_binlog_s']} s", flush=True)
        base_s, txs = baseline_read(db)
        n_base = sum(len(t[4]) for t in txs)
        assert n_base == args.events, (n_base, args.events)
        result["baseline_pymysqlreplication_read_s"] = round(base_s, 2)
        result["baseline_events_per_s"] = round(n_base / base_s)
        print(f"baseline: plain python-mysql-replication read of {n_base} events: {base_s:.1f} s", flush=True)
        prod_s, n = produce(kafka, txs, partitions)
        result["produce_s"] = round(prod_s, 2)
        del txs
        print(f"produced {n} messages in {prod_s:.1f} s", flush=True)

        runs = [r.split("@", 1) for r in args.runs.split(",")] if args.runs else [(args.reader, args.master)]
        results = []
        ok_all = True
        for i, (reader, master) in enumerate(runs):
            config = VerifyConfig(
                mysql=db.connection_settings(),
                source=SOURCE,
                tables=(OutboxTable(SCHEMA, "outbox", topic="bench.{aggregate_type}"),),
                kafka_bootstrap=kafka.bootstrap_servers,
                dlq_topic="bench.dlq",
                spark_master=master,
                output_dir=os.path.join(out_dir, f"run{i}") if len(runs) > 1 else out_dir,
                spark_conf={"spark.driver.memory": "4g", **dict(kv.split("=", 1) for kv in args.spark_conf)},
                binlog_reader=reader,
                binlog_split_bytes=args.split_bytes,
            )
            print(f"run {i}: reader={reader} master={master}", flush=True)
            t = time.monotonic()
            report = run_verify(
                config,
                progress=lambda m, t=t: print(f"  [{time.monotonic() - t:6.1f}s] {m.splitlines()[0]}", flush=True),  # type: ignore[misc]  # mypy cannot type a lambda's default-bound argument
            )
            verify_s = time.monotonic() - t
            run = {"reader": reader, "master": master}
            run["verify_s"] = round(verify_s, 2)
            run["verify_events_per_s"] = round(args.events / verify_s)
            run["verify_phases_s"] = {k: round(v, 2) for k, v in report.timings.items()}
            run["counts"] = report.counts
            run["ok"] = report.ok
            run["report"] = report.json_path
            run["truncated_partitions"] = len([p for p in report.inputs["kafka"]["partitions"] if p["low"] > 0])
            results.append(run)
            ok_all = ok_all and report.ok and report.counts["delivered"] == args.events
            print(
                f"verify ({reader} reader, {master}): {args.events} events in {verify_s:.1f} s = {args.events / verify_s:,.0f} events/s "
                f"(baseline plain binlog read {base_s:.1f} s = {n_base / base_s:,.0f} events/s); ok={report.ok}",
                flush=True,
            )
        result.update(results[0])
        if len(results) > 1:
            result["runs"] = results
        print(json.dumps(result, indent=2))
        return 0 if ok_all else 1
    finally:
        if kafka is not None:
            kafka.stop()
        db.cleanup()


if __name__ == "__main__":
    sys.exit(main())
