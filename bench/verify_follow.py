"""The following verifier (`cdc verify --follow`) at a steady event rate with the relay
running, on local[2]: its verified-through lag (p50 / p99 / max, sampled every second
from its metrics endpoint) and the CPU it uses per verified event, then the batch
verifier over the same range in the same run, and its CPU per verified event.

    ./run.sh bench verify_follow [--rate 5000] [--seconds 120] [--partitions 64] [--broker noida|standin]
        [--sink kafka|rabbitmq_stream|rabbitmq_exchange|nats_jetstream] [--cluster 2]

A writer process commits transactions of 10 small outbox events (single-row INSERTs) at
--rate; the relay runs in this process (a thread); the following verifier is `cdc verify
--follow` in its own process (its Spark driver JVM and Python workers are its descendants:
their CPU is summed from /proc every second). The broker is noida-db by default: the
stand-in's cost per record read grows with each partition's length (`bench/readback.py`),
so it cannot serve minutes of thousands of events/s; with `--broker standin` keep runs
short (it also keeps only ~5 MiB per partition). `--sink` publishes to another sink's real
server instead (bench/sink_servers.py: a RabbitMQ 3.10 node's stream `vf.order`, the
exchange `vf.ex` whose audit stream `vf.audit` the job reads, a nats-server's stream
`vf_events`), and the follow job reads that sink. All of it - MariaDB, the writer, the
relay, the broker, the verifier - shares this machine's cores: the achieved rate is printed,
and the 1-minute load average at the start and the end.

`--cluster N` starts a Spark standalone cluster for the run (a master and N workers of one
core and 2 GiB each, from the PySpark installation's `spark-class`, as
tests/integration/test_spark_cluster.py does) and runs the follow job on it: the executors
are the workers' children, not the driver's, so their CPU (executor JVMs and their Python
workers) is sampled from the workers' process trees and printed beside the driver's, with
the executors' share of the job's CPU. With `--master spark://...` (a cluster started
elsewhere) only the driver's process tree is measured.

    python bench/verify_follow.py --no-follow --rate 10000 --seconds 60 [--sink ...]

runs the same writer, relay and broker with no verifier and prints the cores each process
uses while writing and the whole machine's: what is left on this machine for a verifier at
that rate, as CPU per event.

    python bench/verify_follow.py --decode-only 200000 [--against /path/to/other/checkout] [--rounds 3]

reads one binlog range of N outbox events (10 single-row INSERTs a transaction, as above)
with the verifier's binlog source alone (`iter_binlog_batches`: python-mysql-replication,
the verifier's assembly, the Arrow columns), in a child process per round, and prints its
CPU per event: the cost that bounds the follow job, without Spark, the relay or the broker
beside it; with --against, alternately with another checkout's code over the same binlog.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PER_TX = 10
INSERT = (
    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
    """VALUES ('e%010d', 'order', 'o%d', 'C', '{"n":%d}')"""
)


def _writer(settings: dict, database: str, rate: int, seconds: float, out: mp.Queue) -> None:
    """Transactions of PER_TX single-row INSERT statements (one Write_rows event each, as an
    application writing one event at a time makes) at `rate` events/s. Each transaction
    goes to the server as one multi-statement round trip (the INSERTs and the COMMIT): the
    binlog is the same as with a statement per round trip, and the writer, which shares
    the two cores with what it measures, costs less."""
    import pymysql
    from pymysql.constants import CLIENT

    conn = pymysql.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                           password=settings["password"], database=database, autocommit=False,
                           client_flag=CLIENT.MULTI_STATEMENTS)  # fmt: skip
    interval = PER_TX / rate
    start = time.perf_counter()
    n = 0
    with conn.cursor() as cur:
        while time.perf_counter() - start < seconds:
            due = start + (n // PER_TX) * interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            statements = [INSERT % (n + i, (n + i) % 1000, n + i) for i in range(PER_TX)]
            cur.execute(";".join([*statements, "COMMIT"]))
            while cur.nextset():  # every statement's result, the COMMIT's last
                pass
            n += PER_TX
    conn.close()
    out.put((n, n / (time.perf_counter() - start)))


class TreeCpu:
    """CPU seconds (user + system) of a process and all its descendants, sampled. Each
    process is put under a kind: the root's, else `jvm` for a java process, else `python`."""

    def __init__(self, pid: int, root: str = "driver", jvm: str = "jvm", python: str = "python workers"):
        import psutil

        self.root = psutil.Process(pid)
        self.names = {"root": root, "jvm": jvm, "python": python}
        self.seen: dict[int, float] = {}
        self.kind: dict[int, str] = {}

    def sample(self) -> float:
        import psutil

        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                if p.pid not in self.kind:
                    self.kind[p.pid] = self._kind(p)
                self.seen[p.pid] = max(
                    self.seen.get(p.pid, 0.0), t.user + t.system + t.children_user + t.children_system
                )
            except psutil.Error:
                pass
        return sum(self.seen.values())

    def _kind(self, p: Any) -> str:  # p: a psutil.Process
        if p.pid == self.root.pid:
            return self.names["root"]
        try:
            name = p.name()
        except Exception:
            return "other"
        return self.names["jvm"] if name == "java" else self.names["python"]

    def by_kind(self, since: dict[int, float]) -> dict[str, float]:
        """CPU seconds since `since` (an earlier copy of `seen`) by kind of process."""
        out: dict[str, float] = {}
        for pid, total in self.seen.items():
            k = self.kind.get(pid, "other")
            out[k] = out.get(k, 0.0) + total - since.get(pid, 0.0)
        return out


def _metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0] + ("{" + name.split(",", 1)[1] if "," in name else "")] = float(value)
    return out


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] if s else float("nan")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broker(kind: str):
    """A Kafka for the run: noida-db, or the stand-in with one broker."""
    if kind == "noida":
        from testbed.noida import NoidaKafka

        return NoidaKafka.start()
    from testbed.kafka_standin import KafkaStandin

    return KafkaStandin.start(brokers=1)


SINKS = ("kafka", "rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream")


@contextmanager
def _sink(args: argparse.Namespace) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """The sink of the run, its topics `vf.order` and `vf.dlq` made: the relay config's
    sections for it (`kafka`, and `sink` beyond Kafka) and the secrets they name by _env."""
    if args.sink == "kafka":
        from testbed.noida import CONSUMER_SETTINGS

        with _broker(args.broker) as kafka:
            kafka.create_topic("vf.order", args.partitions)
            kafka.create_topic("vf.dlq", 1)
            consumer = dict(CONSUMER_SETTINGS) if args.broker == "noida" else {}
            yield {"kafka": {"bootstrap": kafka.bootstrap_servers, "dead_letter_topic": "vf.dlq",
                             "consumer": consumer}}, {}  # fmt: skip
        return
    import tomllib

    from bench.sink_servers import sink_server

    with sink_server(args.sink, "vf") as sink:
        # [kafka] still names the dead-letter topic; nothing connects to its bootstrap
        sections = {"kafka": {"bootstrap": "127.0.0.1:9", "dead_letter_topic": "vf.dlq"}, **tomllib.loads(sink.toml)}
        yield sections, sink.env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument(
        "--trigger", type=float, default=2.0, help="the follow job's --trigger (seconds between micro-batches)"
    )
    ap.add_argument(
        "--broker",
        default="noida",
        choices=("noida", "standin"),
        help="noida: noida-db, a broker with an offset index (default); standin: librdkafka's mock cluster, whose "
        "fetch cost grows with each partition's history (it has no offset index and returns one batch per partition "
        "per fetch): it cannot serve a long run at thousands of events/s",
    )
    ap.add_argument(
        "--sink",
        default="kafka",
        choices=SINKS,
        help="the relay's sink, which the follow job reads (beyond Kafka: bench/sink_servers.py's real server)",
    )
    ap.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="WORKERS",
        help="run the follow job on a Spark standalone cluster of this many 1-core workers started for the run "
        "(instead of --master) and measure the executors' CPU",
    )
    ap.add_argument(
        "--catch-up-limit",
        type=float,
        default=300.0,
        help="seconds to wait after the writer for every event to be verified",
    )
    ap.add_argument(
        "--binlog-reader",
        default="default",
        choices=("default", "fast"),
        help="the follow job's binlog reader (fast: the relay's decoder, NOT independent)",
    )
    ap.add_argument(
        "--max-batch-bytes",
        type=int,
        default=None,
        help="the follow job's --max-batch-bytes (admission limit of binlog bytes per micro-batch; default: its own)",
    )
    ap.add_argument(
        "--no-batch", action="store_true", help="skip the batch verifier's run over the same range after following"
    )
    ap.add_argument(
        "--no-follow",
        action="store_true",
        help="no verifier: the writer, MariaDB, the relay and the broker alone at --rate, and the CPU each uses",
    )
    ap.add_argument("--decode-only", type=int, default=0, metavar="EVENTS", help="the binlog source alone (see above)")
    ap.add_argument("--against", default="", help="--decode-only: another checkout to compare with, alternately")
    ap.add_argument("--rounds", type=int, default=3, help="--decode-only: reads per tree")
    args = ap.parse_args()
    if args.decode_only:
        _decode_only(args.decode_only, args.against, args.rounds)
        return
    from bench.workloads import bench_server, create_schema
    from cdc.config import load_config
    from cdc.metrics import RelayMetrics
    from cdc_cli.app import build_relay
    from cdc_cli.logs import configure
    from tests.integration.harness import _to_toml

    configure("text", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="verify-follow-"))
    with ExitStack() as stack:
        db = stack.enter_context(bench_server())
        sections, sink_env = stack.enter_context(_sink(args))
        executors: list[TreeCpu] = []
        if args.cluster:
            from testbed.spark_cluster import standalone_cluster

            args.master, _ui, worker_pids = stack.enter_context(standalone_cluster(args.cluster, work))
            executors = [TreeCpu(pid, "cluster daemons", "executor JVMs", "executor Python workers")
                         for pid in worker_pids]  # fmt: skip
        create_schema(db, "vf", mixed=False)
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
        raw = {
            "source": {"name": "vf", "host": db.host, "port": db.port, "user": db.user, "password_env": "CDC_BENCH_PW",
                       "replica_server_id": 778101, "start": f"{file}:{pos}", "heartbeat_s": 0.5},
            "outbox": {"tables": [{"schema": "vf", "table": "outbox", "topic": "vf.{aggregate_type}"}]},
            **sections,
            "schema_registry": {"url": "mock://vf"},
            "checkpoint": {"store": "file", "path": str(work / "relay-cp.json"), "interval_s": 1.0},
        }  # fmt: skip
        secrets = {"CDC_BENCH_PW": db.password or "", **sink_env}
        cfg = load_config(raw, secrets)
        (work / "relay.toml").write_text(_to_toml(raw))
        env = {**os.environ, **secrets}
        handle = build_relay(cfg, RelayMetrics())
        stop = threading.Event()
        relay = threading.Thread(target=lambda: handle.relay.run(stop.is_set), daemon=True)
        relay.start()
        if args.no_follow:
            try:
                _without_follow(args, db, handle)
            finally:
                stop.set()
                relay.join(60)
                handle.close()
            return
        port = _free_port()
        flog = open(work / "follow.log", "wb")  # noqa: SIM115  # the child writes it until it is stopped
        follow = subprocess.Popen(
            [sys.executable, "-m", "cdc_cli.main", "verify", "--config", str(work / "relay.toml"), "--follow", "--master",
             args.master, "--output-dir", str(work / "follow-out"), "--metrics-port", str(port), "--trigger", f"{args.trigger:g}",
             "--report-every", "30", "--binlog-reader", args.binlog_reader,
             *(["--max-batch-bytes", str(args.max_batch_bytes)] if args.max_batch_bytes is not None else [])],
            cwd=ROOT, env=env, stdout=flog, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        cpu = TreeCpu(follow.pid)
        trees = [cpu, *executors]
        deadline = time.monotonic() + 180
        while not _metrics(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not _metrics(port):
            raise SystemExit(f"the follow job did not start: see {work / 'follow.log'}")
        print(
            f"follow job pid {follow.pid} up (work dir {work}); writing {args.rate}/s for {args.seconds:.0f} s ...",
            flush=True,
        )
        for tree in trees:
            tree.sample()
        seen0 = [dict(tree.seen) for tree in trees]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        writer = ctx.Process(target=_writer, args=(db.connection_settings(), "vf", args.rate, args.seconds, queue))
        load_start = os.getloadavg()
        t0 = time.monotonic()
        writer.start()
        lags: list[float] = []
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            m = _metrics(port)
            for tree in trees:
                tree.sample()
            if "cdc_verify_verified_through_lag_seconds" in m:
                lags.append(m["cdc_verify_verified_through_lag_seconds"])
        load_writing = os.getloadavg()
        relay_at_end = handle.metrics.events_published
        written, achieved = queue.get(timeout=120)
        writer.join(30)
        deadline = time.monotonic() + args.catch_up_limit
        relay_done: float | None = None  # the relay's last acknowledgement, seconds after the writer
        while time.monotonic() < deadline:
            m = _metrics(port)
            for tree in trees:
                tree.sample()
            if relay_done is None and handle.metrics.events_published >= written:
                relay_done = time.monotonic() - t0 - args.seconds
            if m.get('cdc_verify_events{class="delivered"}', 0) >= written:
                break
            time.sleep(1)
        # the verifier cannot verify what the relay has not published: its lag includes the relay's
        print(
            f"relay:   {relay_at_end} of {written} events published when the writer stopped; "
            + (
                f"all published {max(0.0, relay_done):.1f} s after it"
                if relay_done is not None
                else "not all published"
            ),
            flush=True,
        )
        caught_up = time.monotonic() - t0 - args.seconds
        m = _metrics(port)
        kinds: dict[str, float] = {}
        for tree, before in zip(trees, seen0, strict=True):
            tree.sample()
            for kind, seconds in tree.by_kind(before).items():
                kinds[kind] = kinds.get(kind, 0.0) + seconds
        # the workers' own daemons are the cluster's upkeep, not the job's
        follow_cpu = sum(v for k, v in kinds.items() if k != "cluster daemons")
        print("follow CPU by process: " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(kinds.items())), flush=True)
        follow.send_signal(signal.SIGTERM)
        follow.wait(120)
        flog.close()
        stop.set()
        relay.join(60)
        handle.close()
        delivered = m.get('cdc_verify_events{class="delivered"}', 0)
        problems = m.get("cdc_verify_problems", -1)
        loads = (load_start, load_writing, os.getloadavg())
        if args.no_batch:
            _summary(args, written, achieved, lags, delivered, problems, caught_up, follow_cpu, kinds, loads)
            return
        # the batch verifier over the same range, same machine, same run
        out = work / "batch-out"
        blog = open(work / "batch.log", "wb")  # noqa: SIM115  # the child writes it until it is stopped
        t1 = time.monotonic()
        batch = subprocess.Popen(
            [sys.executable, "-m", "cdc_cli.main", "verify", "--config", str(work / "relay.toml"), "--master", args.master,
             "--output-dir", str(out), "--start-file", file],
            cwd=ROOT, env=env, stdout=blog, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        bcpu = TreeCpu(batch.pid)
        while batch.poll() is None:
            bcpu.sample()
            time.sleep(0.5)
        batch_wall = time.monotonic() - t1
        blog.close()
        batch_cpu = sum(bcpu.seen.values())
        report = json.loads((out / "report.json").read_text())
        b_delivered = report["counts"]["delivered"]

    _summary(args, written, achieved, lags, delivered, problems, caught_up, follow_cpu, kinds, loads)
    print(
        f"batch:   delivered {b_delivered} (ok {report['ok']}) in {batch_wall:.1f} s wall; CPU {batch_cpu:.1f} s = "
        f"{1e6 * batch_cpu / max(1, b_delivered):.0f} us per verified event (JVM start-up included"
        + ("; the executors' CPU not counted)" if args.cluster else ")")
    )


_DECODE_CHILD = """
import json, sys, time
from spark_jobs.mysql.binlog_source import iter_binlog_batches
options, part = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t = time.process_time()
rows = sum(b.num_rows for b in iter_binlog_batches(options, part))
print(json.dumps({"cpu": time.process_time() - t, "rows": rows}))
"""


def _decode_only(events: int, against: str, rounds: int) -> None:
    """The verifier's binlog source alone over one range of `events` outbox events: CPU
    seconds per read (a child process each, this tree and `against` alternately)."""
    from bench.workloads import bench_server, create_schema
    from cdc.events.outbox import OutboxTable
    from spark_jobs.mysql.binlog_source import tables_to_json

    trees = [("this tree", str(ROOT))] + ([("against", str(Path(against).resolve()))] if against else [])
    with bench_server() as db:
        create_schema(db, "vf", mixed=False)
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, start = cur.fetchone()[:2]
        settings = db.connection_settings()
        import pymysql
        from pymysql.constants import CLIENT

        conn = pymysql.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                               password=settings["password"], database="vf", autocommit=False,
                               client_flag=CLIENT.MULTI_STATEMENTS)  # fmt: skip
        with conn.cursor() as cur:
            for n in range(0, events, PER_TX):
                cur.execute(";".join([*(INSERT % (n + i, (n + i) % 1000, n + i) for i in range(PER_TX)), "COMMIT"]))
                while cur.nextset():
                    pass
            cur.execute("SHOW MASTER STATUS")
            end_file, end = cur.fetchone()[:2]
        conn.close()
        assert end_file == file, "the workload crossed a binlog file: use fewer events"
        options = {"host": settings["host"], "port": str(settings["port"]), "user": settings["user"],
                   "password": settings["password"] or "", "source": "vf",
                   "tables": tables_to_json([OutboxTable("vf", "outbox", topic="vf.{aggregate_type}")])}  # fmt: skip
        part = {"file": file, "start": int(start), "end": int(end), "server_id": 990_001}
        cpu: dict[str, list[float]] = {name: [] for name, _ in trees}
        for r in range(rounds):
            for name, tree in trees:
                env = {**os.environ, "PYTHONPATH": tree}
                out = subprocess.run([sys.executable, "-c", _DECODE_CHILD, json.dumps(options), json.dumps(part)],
                                     cwd=tree, env=env, capture_output=True, text=True, check=True)  # fmt: skip
                got = json.loads(out.stdout.strip().splitlines()[-1])
                assert got["rows"] >= events, got
                cpu[name].append(got["cpu"])
                print(f"round {r + 1} {name}: {got['cpu']:.2f} s CPU, {1e6 * got['cpu'] / events:.1f} us an event "
                      f"(load {' '.join(f'{x:.2f}' for x in os.getloadavg())})", flush=True)  # fmt: skip
    for name, _ in trees:
        med = sorted(cpu[name])[len(cpu[name]) // 2]
        print(f"{name}: median {1e6 * med / events:.1f} us CPU an event over {rounds} read(s) of {events} events")


def _process_kind(p: Any, relay_pid: int, writer_pid: int) -> str | None:
    """What a process of the machine is in a `--no-follow` run (None: not one of them)."""
    pid = p.pid
    if pid == relay_pid:
        return "relay (this process: its main thread, the sink's loop)"
    if pid == writer_pid:
        return "writer"
    try:
        name, cmdline = p.name(), " ".join(p.cmdline())
        parent = p.ppid()
    except Exception:
        return None
    if parent == relay_pid and "python" in name:
        return "relay's binlog reader process"
    for needle, kind in (("mariadbd", "MariaDB"), ("noida", "noida-db"), ("beam.smp", "RabbitMQ node"),
                         ("nats-server", "nats-server"), ("epmd", "RabbitMQ node"), ("kafka_standin", "Kafka stand-in")):  # fmt: skip
        if needle in name or needle in cmdline:
            return kind
    return None


def _without_follow(args: argparse.Namespace, db: Any, handle: Any) -> None:
    """`--no-follow`: the writer at --rate for --seconds with the relay publishing and no
    verifier; the CPU of each process taking part and of the whole machine while writing
    (psutil; /proc/stat for the machine): what is left on this machine for a verifier."""
    import psutil

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    writer = ctx.Process(target=_writer, args=(db.connection_settings(), "vf", args.rate, args.seconds, queue))
    writer.start()
    assert writer.pid is not None
    relay_pid = os.getpid()

    def snapshot() -> dict[int, tuple[str, float]]:
        out = {}
        for p in psutil.process_iter():
            kind = _process_kind(p, relay_pid, writer.pid or -1)
            if kind is None:
                continue
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            out[p.pid] = (kind, t.user + t.system)
        return out

    cores = psutil.cpu_count() or 1
    machine0, before, t0 = psutil.cpu_times(), snapshot(), time.monotonic()
    published0 = handle.metrics.events_published
    last = before
    while writer.is_alive() and time.monotonic() - t0 < args.seconds - 1.0:
        time.sleep(1.0)
        last = {**last, **snapshot()}  # a process gone keeps its last figure
    after, machine1, elapsed = {**last, **snapshot()}, psutil.cpu_times(), time.monotonic() - t0
    published = handle.metrics.events_published - published0
    written, achieved = queue.get(timeout=120)
    writer.join(30)
    by_kind: dict[str, float] = {}
    for pid, (kind, total) in after.items():
        by_kind[kind] = by_kind.get(kind, 0.0) + total - before.get(pid, (kind, 0.0))[1]
    # busy: what ran here (user, nice, system, irq, softirq); steal (the hypervisor gave the
    # time to another guest) is said apart: neither this run nor a verifier could use it
    spent = {k: v - getattr(machine0, k) for k, v in machine1._asdict().items()}
    busy = sum(v for k, v in spent.items() if k not in ("idle", "iowait", "steal", "guest", "guest_nice"))
    steal = spent.get("steal", 0.0)
    print(
        f"written {written} events at {achieved:.0f}/s achieved (asked {args.rate}/s) for {args.seconds:.0f} s, "
        f"sink {args.sink}{f' ({args.partitions} partitions on {args.broker})' if args.sink == 'kafka' else ''}; "
        f"the relay published {published} in the writer's {elapsed:.0f} s; no verifier"
    )
    for kind, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind}: {seconds / elapsed:.2f} cores ({1e6 * seconds / max(1, written):.1f} us an event)")
    ours = sum(by_kind.values())
    print(
        f"these processes: {ours / elapsed:.2f} cores; the whole machine busy {busy / elapsed:.2f} of its {cores} cores "
        f"(and {steal / elapsed:.2f} stolen by the hypervisor); "
        f"left for a verifier: {cores - busy / elapsed:.2f} cores = "
        f"{1e6 * (cores - busy / elapsed) / max(1.0, achieved):.0f} us of CPU per event at {achieved:.0f}/s"
    )
    print(f"load average (1 min; the host is shared): {os.getloadavg()[0]:.2f}")


def _summary(
    args: argparse.Namespace,
    written: int,
    achieved: float,
    lags: list[float],
    delivered: float,
    problems: float,
    caught_up: float,
    follow_cpu: float,
    kinds: dict[str, float],
    loads: tuple[tuple[float, float, float], ...],
) -> None:
    """The follow job's figures, printed."""
    where = f"{args.partitions} partitions on {args.broker}" if args.sink == "kafka" else f"sink {args.sink}"
    print(
        f"written {written} events at {achieved:.0f}/s achieved (asked {args.rate}/s) for {args.seconds:.0f} s, "
        f"{where}, master {args.master}"
        f"{f' ({args.cluster} workers of 1 core)' if args.cluster else ''}, follow binlog reader {args.binlog_reader}, "
        f"trigger {args.trigger:g} s"
    )
    print(
        f"follow:  delivered {delivered:.0f}, problems {problems:.0f}; verified-through lag p50 {_pct(lags, 50):.1f} s, "
        f"p99 {_pct(lags, 99):.1f} s, max {max(lags) if lags else float('nan'):.1f} s ({len(lags)} samples, 1/s); "
        + (f"all verified {caught_up:.1f} s after the writer stopped" if delivered >= written
           else f"NOT all verified {caught_up:.1f} s after the writer stopped")
    )  # fmt: skip
    per_event = ", ".join(f"{k} {1e6 * v / max(1, delivered):.1f}" for k, v in sorted(kinds.items()))
    print(
        f"follow:  CPU {follow_cpu:.1f} s = {1e6 * follow_cpu / max(1, delivered):.0f} us per verified event "
        f"({follow_cpu / (args.seconds + caught_up):.2f} cores while following); us per verified event: {per_event}"
    )
    if args.cluster:
        executors = kinds.get("executor JVMs", 0.0) + kinds.get("executor Python workers", 0.0)
        print(
            f"cluster: executors (JVMs + Python workers) {executors:.1f} s = {100 * executors / max(1e-9, follow_cpu):.0f}% "
            f"of the job's CPU; driver (Python, JVM, local Python workers) {follow_cpu - executors:.1f} s = "
            f"{1e6 * (follow_cpu - executors) / max(1, delivered):.1f} us per verified event"
        )
    start, writing, end = loads
    print(
        f"load average (1 min; the host is shared): at the writer's start {start[0]:.2f}, at its end {writing[0]:.2f}, "
        f"after catching up {end[0]:.2f}"
    )


if __name__ == "__main__":
    main()
