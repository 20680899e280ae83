"""Steady-state latency: a writer commits outbox events at a fixed rate; the relay runs
live; for every event, commit (the writer's COMMIT returned) -> broker acknowledgement
(the relay's delivery report) is measured.

    ./run.sh bench latency [--rates 1000,5000,10000] [--seconds 10]

The writer runs in its own process (it must not share the relay's interpreter lock),
commits transactions of 10 events, and records when each COMMIT returned. The relay runs
in this process behind a thin wrapper that records when each acknowledgement arrived.
Prints p50/p99/max per rate and the relay's CPU use; the writer's own achieved rate is
printed too (the machine has 2 cores shared by the database, the writer and the relay).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PER_TX = 10


def _writer(settings: dict, database: str, rate: int, seconds: float, seed: int, out: mp.Queue) -> None:
    import pymysql

    conn = pymysql.connect(
        host=settings["host"],
        port=settings["port"],
        user=settings["user"],
        password=settings["password"],
        database=database,
        autocommit=False,
    )
    commits: dict[str, float] = {}
    interval = PER_TX / rate
    start = time.perf_counter()
    n = 0
    with conn.cursor() as cur:
        while time.perf_counter() - start < seconds:
            due = start + (n // PER_TX) * interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            ids = [f"{seed:04d}-{n + i:09d}" for i in range(PER_TX)]
            cur.executemany(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES (%s,'order',%s,'OrderCreated',%s)",
                [(i, f"order-{hash(i) % 1000}", '{"pad":"' + "x" * 280 + '"}') for i in ids],
            )
            conn.commit()
            now = time.time()
            for i in ids:
                commits[i] = now
            n += PER_TX
    conn.close()
    out.put((commits, n / (time.perf_counter() - start)))


class _AckClock:
    """Wraps the publisher: records when each event's acknowledgement arrived."""

    def __init__(self, inner):
        self._inner = inner
        self.acks: dict[str, float] = {}

    def publish(self, topic, key, value, headers, on_delivery, timestamp_ms=None):
        event_id = dict(headers)["id"].decode()
        acks = self.acks

        def timed(delivery):
            if delivery.failure is None:
                acks[event_id] = time.time()
            on_delivery(delivery)

        self._inner.publish(topic, key, value, headers, timed, timestamp_ms)

    def publish_reported(self, topic, key, value, headers, report, timestamp_ms=None):
        """The Kafka publisher's own report path (cdc.ports.ReportingPublisher), the one the
        relay takes for every event: without it the hand-over would use `publish` here."""
        event_id = dict(headers)["id"].decode()
        acks = self.acks

        def timed(err, msg):
            if err is None:
                acks[event_id] = time.time()
            report(err, msg)

        self._inner.publish_reported(topic, key, value, headers, timed, timestamp_ms)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def _relay_cpu() -> float:
    """CPU seconds of this process (the relay runs in a thread here; the bench's own
    waiting costs little) and of the relay's reader process, if any."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children():
        try:
            if "connectors.mysql.reader_process" in " ".join(child.cmdline()):
                total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1000,5000,10000")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--reader", default="process", choices=("process", "thread"), help="source.reader")
    args = ap.parse_args()
    from bench.workloads import bench_server, create_schema
    from cdc.config import load_config
    from cdc.metrics import RelayMetrics
    from cdc_cli.app import build_relay
    from cdc_cli.logs import configure
    from testbed.kafka_standin import KafkaStandin

    configure("text", "WARNING")
    with bench_server() as db, KafkaStandin.start(brokers=1) as kafka:
        kafka.create_topic("lat.order", 12)
        kafka.create_topic("lat.dlq", 1)
        create_schema(db, "lat", mixed=False)
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
        raw = {
            "source": {
                "name": "lat",
                "host": db.host,
                "port": db.port,
                "user": db.user,
                "password_env": "P",
                "replica_server_id": 778001,
                "start": f"{file}:{pos}",
                "heartbeat_s": 0.5,
                "reader": args.reader,
            },
            "outbox": {"tables": [{"schema": "lat", "table": "outbox", "topic": "lat.{aggregate_type}"}]},
            "kafka": {"bootstrap": kafka.bootstrap_servers, "dead_letter_topic": "lat.dlq"},
            "schema_registry": {"url": "mock://lat"},
            "checkpoint": {"store": "file", "path": f"/tmp/lat-{os.getpid()}.json", "interval_s": 1.0},
        }
        cfg = load_config(raw, {"P": db.password})
        handle = build_relay(cfg, RelayMetrics())
        clock = _AckClock(handle.relay._publisher)
        handle.relay._publisher = clock
        stop = threading.Event()
        thread = threading.Thread(target=lambda: handle.relay.run(stop.is_set), daemon=True)
        thread.start()
        # steady state: the rates start once the relay reads (its reader process started)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not handle.relay.metrics.caught_up:
            time.sleep(0.01)
        settings = db.connection_settings()
        # Warm-up, not measured: the first event to a topic makes the relay write a
        # checkpoint naming the topic with its partitions' end offsets (crash safety,
        # cdc/delivery/ledger.py name_topic), a few hundred ms once per topic and run.
        with db.connect("lat") as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES ('warm-up','order','order-0','OrderCreated','{}')"
            )
            conn.commit()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "warm-up" not in clock.acks:
            time.sleep(0.01)
        print(
            f"{'rate/s':>8} {'achieved':>9} {'events':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'relay CPU':>10}"
        )
        for seed, rate in enumerate(int(r) for r in args.rates.split(",")):
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            cpu0 = _relay_cpu()
            t0 = time.perf_counter()
            proc = ctx.Process(target=_writer, args=(settings, "lat", rate, args.seconds, seed, queue))
            proc.start()
            commits, achieved = queue.get(timeout=args.seconds + 120)
            proc.join(30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(i in clock.acks for i in commits):
                time.sleep(0.05)
            wall = time.perf_counter() - t0
            cpu = _relay_cpu() - cpu0
            lat = [(clock.acks[i] - t) * 1000 for i, t in commits.items() if i in clock.acks]
            lost = len(commits) - len(lat)
            print(
                f"{rate:>8} {achieved:>9.0f} {len(commits):>7} {_pct(lat, 50):>7.1f} {_pct(lat, 99):>7.1f} "
                f"{max(lat):>7.1f} {cpu / wall:>9.2f}c" + (f"  ({lost} not acknowledged)" if lost else "")
            )
        stop.set()
        thread.join(60)
        handle.close()


if __name__ == "__main__":
    main()
