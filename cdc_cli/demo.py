"""`cdc demo`: the whole product on embedded defaults, in one command.

A throwaway MariaDB and a Kafka stand-in start; a shop workload writes orders, their
line items and their outbox rows in single transactions (with rollbacks, a savepoint
rollback, a MyISAM rollback, an insert-then-delete outbox row and one event that must be
dead-lettered); the relay streams them to Kafka while a progress line runs; the summary
compares what the application committed with what Kafka acknowledged; the Spark
verifier then proves it event by event. Everything started is stopped at the end.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cdc.config import load_config
from cdc.errors import CdcError
from cdc.metrics import RelayMetrics
from cdc.relay import RunSummary
from cdc_cli.workload import ShopWorkload, WorkloadResult
from connectors.mysql.client import binlog_end

TOPICS = {"outbox.event.order": 6, "outbox.event.payment": 6, "outbox.dlq": 1}
DATABASE = "shop"
SOURCE = "shop-db"


def demo_config(db, bootstrap: str, workdir: Path, start: str) -> tuple[dict, dict]:
    raw = {
        "source": {
            "name": SOURCE,
            "host": db.host,
            "port": db.port,
            "user": db.user,
            "password_env": "CDC_DEMO_MYSQL_PASSWORD",
            "replica_server_id": 4242,
            "start": start,
            "heartbeat_s": 0.5,
        },
        "outbox": {"tables": [{"schema": DATABASE, "table": "outbox", "timestamp_column": "created_at"}]},
        "kafka": {"bootstrap": bootstrap, "dead_letter_topic": "outbox.dlq"},
        "schema_registry": {"url": "mock://cdc-demo"},
        "checkpoint": {"store": "file", "path": str(workdir / "checkpoint.json"), "interval_s": 0.5},
    }
    return raw, {"CDC_DEMO_MYSQL_PASSWORD": db.password or ""}


class _Progress:
    def __init__(self, metrics: RelayMetrics):
        self._m = metrics
        self._tty = sys.stdout.isatty()
        self._last = 0.0

    def show(self, workload: WorkloadResult | None, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.25 if self._tty else 2.0):
            return
        self._last = now
        m = self._m
        committed = workload.committed_count if workload else 0
        line = (
            f"committed {committed:>6}  published {m.events_published:>6}  "
            f"dead-lettered {m.dead_lettered_total:>3}  lag {m.lag_seconds(time.time()):4.1f}s"
        )
        if self._tty:
            print("\r" + line, end="", flush=True)
        else:
            print(line, flush=True)

    def done(self) -> None:
        if self._tty:
            print()


def run_demo(orders: int = 2000, workdir: str | None = None, verify: bool = True, brokers: int = 3) -> int:
    from cdc_cli.app import run_relay
    from cdc_cli.logs import configure
    from testbed.kafka_standin import KafkaStandin
    from testbed.mariadb import EmbeddedMariaDB

    configure("text", os.environ.get("CDC_LOG_LEVEL", "WARNING"))
    work = Path(workdir or "var/demo").resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "checkpoint.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    print("starting embedded MariaDB and the Kafka stand-in ...", flush=True)
    with (
        EmbeddedMariaDB.start() as db,
        KafkaStandin.start(brokers=brokers, group_initial_rebalance_delay_ms=0) as kafka,
    ):
        print(
            f"  MariaDB {db.host}:{db.port}  Kafka stand-in {kafka.bootstrap_servers}  ({time.monotonic() - t0:.1f}s)",
            flush=True,
        )
        for topic, partitions in TOPICS.items():
            kafka.create_topic(topic, partitions)
        db.create_database(DATABASE)
        workload = ShopWorkload(lambda: db.connect(DATABASE))
        workload.create_schema()
        with db.connect() as conn, conn.cursor() as cur:
            end = binlog_end(cur)
        if end is None:
            raise CdcError("the demo's MariaDB has binary logging off")
        file, pos = end
        raw, env = demo_config(db, kafka.bootstrap_servers, work, f"{file}:{pos}")
        cfg = load_config(raw, env)
        metrics = RelayMetrics()
        stop = threading.Event()
        outcome: dict[str, Any] = {}

        def relay_thread() -> None:
            try:
                outcome["summary"] = run_relay(cfg, stop.is_set, metrics)
            except BaseException as exc:  # reported by the main thread
                outcome["error"] = exc

        thread = threading.Thread(target=relay_thread, name="relay", daemon=True)
        thread.start()
        progress = _Progress(metrics)
        print(f"writing {orders} order transactions; the relay streams them:", flush=True)
        result = workload.run(orders, on_progress=progress.show)
        expected = result.committed_count
        deadline = time.monotonic() + 60
        while (
            metrics.events_published + metrics.dead_lettered_total < expected
            and time.monotonic() < deadline
            and thread.is_alive()
        ):
            progress.show(result)
            time.sleep(0.1)
        progress.show(result, force=True)
        progress.done()
        stop.set()
        thread.join(60)
        if "error" in outcome:
            raise outcome["error"]  # a CdcError reaches main() and prints one line
        summary: RunSummary = outcome["summary"]
        published, dead = metrics.events_published, metrics.dead_lettered_total
        ok = published + dead == expected and dead == result.expected_dead_letters
        print()
        print("summary")
        print(f"  transactions written     {result.transactions}  ({result.rollbacks} rolled back)")
        print(f"  events committed         {expected}  (by the application's own ledger)")
        print(f"  events never committed   {len(result.rolled_back)}  (rolled back: must not appear)")
        print(f"  published to Kafka       {published}")
        print(f"  dead-lettered            {dead}  { ({c: n for c, n in metrics.dead_lettered.items() if n}) }")
        print(f"  outbox deletes ignored   {metrics.outbox_changes_ignored}  (insert-then-delete)")
        print(f"  checkpoint               {summary.position}")
        print(f"  relay verdict            {'OK: counts match' if ok else 'MISMATCH'}")
        status = 0 if ok else 3
        if verify:
            status = max(status, _verify(db, kafka, cfg, work))
        print(f"demo finished in {time.monotonic() - t0:.1f}s")
        return status


def _verify(db, kafka, cfg, work: Path) -> int:
    from cdc_cli.verify_commands import verify_config
    from spark_jobs.verify import run_verify

    print()
    print("verifying with Spark (binlog vs topics, event by event) ...", flush=True)
    vcfg = verify_config(cfg, str(work / "report"), master="local[2]")
    report = run_verify(vcfg, progress=lambda msg: print(f"  {msg}", flush=True))
    print("\n".join("  " + line for line in report.summary_text().splitlines()))  # names the HTML report
    return 0 if report.ok else 3
