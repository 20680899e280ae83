"""Catch-up benchmark: the relay reads a binlog written before it started, end to end
(binlog -> Avro -> acknowledged by the broker), against the naive python-mysql-replication
parse rate of the same binlog measured in the same run.

    ./run.sh bench catchup [--events 200000] [--mixed] [--profile out.svg]   (with --format: the format's first run)
    ./run.sh bench catchup --compressed [--events 200000] [--pairs 2]
    ./run.sh bench catchup --delivery transactional [--events 100000]
    ./run.sh bench catchup --sink rabbitmq_stream|rabbitmq_exchange|nats_jetstream [--events 100000] [--rounds 3] [--profile out.svg]
        (the Kafka stand-in, then that sink's real server, alternating; --profile: the sink's first run)
        [--pin]: the servers (mariadbd, the stand-in, the sink's server) on CPU 1, the relay on CPU 0

`--compressed` starts mariadbd with --log-bin-compress=ON --log-bin-compress-min-len=10
and writes the same workload twice, into two databases: once with log_bin_compress
switched OFF (the baseline), once ON (every row event a Write_rows_compressed_v1); the
relay then catches up on each range in turn (`--pairs` times, alternating which goes
first), and the ratio compressed / uncompressed of each pair is printed.

With `--delivery transactional` both delivery modes run on the same broker (noida-db, a
Kafka with transactions; the stand-in has none) over the same binlog, the default
(idempotent) first: events/s of each, the transactional run's commits and messages per
commit, and each mode's start after a SIGKILL halfway (idempotent: the recovery scan of
the topics' tails; transactional: the committed checkpoint alone).

Prints events/s, CPU seconds and peak RSS (summed over the relay's processes: with
`source.reader = "process"` it has two; PSS too, which counts shared pages once), time to the first published event, and the
ratio to the naive parse rate (the figure that holds across machines).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workloads import bench_server, create_schema, write  # noqa: E402  # after the sys.path entry above


def naive_parse_rate(db, start_file: str, start_pos: int, database: str) -> tuple[float, int]:
    """python-mysql-replication with its defaults, reading every row event of the
    range and touching each row's values (what any consumer of the library does)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import WriteRowsEvent

    s = db.connection_settings()
    stream = BinLogStreamReader(
        connection_settings=s,
        server_id=777_001,
        blocking=False,
        resume_stream=True,
        log_file=start_file,
        log_pos=start_pos,
        only_events=[WriteRowsEvent, XidEvent],
    )
    rows = outbox = 0
    t0 = time.perf_counter()
    for ev in stream:
        if isinstance(ev, WriteRowsEvent):
            for row in ev.rows:
                rows += 1
                if ev.table == "outbox":
                    outbox += 1
                    row["values"]["payload"]
    stream.close()
    return outbox / (time.perf_counter() - t0), rows


def _format_settings(fmt: str) -> str:
    """The outbox table's output format as Debezium users would set it: the payload as the
    value, the event type in header eventType, the record timestamp from created_at."""
    if fmt == "envelope":
        return ""
    return f'format = "{fmt}"\nadditional_placement = "type:header:eventType"\ntimestamp_column = "created_at"'


def compare_formats(
    args: argparse.Namespace, db, kafka, database: str, start: str, end: tuple[str, int], tmp: str
) -> None:
    """--format NAME: the envelope and NAME over the same binlog, in alternating pairs (the
    first run of a pair tends to be the slower on a shared machine, so the order alternates)."""
    results: dict[str, list[float]] = {"envelope": [], args.format: []}
    for i in range(args.pairs):
        order = ("envelope", args.format) if i % 2 == 0 else (args.format, "envelope")
        for fmt in order:
            prefix = f"f{i}{fmt[:3]}"
            kafka.create_topic(f"{prefix}.order", 24)
            kafka.create_topic(f"{prefix}.dlq", 1)
            profile = args.profile if fmt == args.format and i == 0 else None  # the format's first run
            r = run_relay(db, kafka, database, start, end, Path(tmp) / prefix, profile, prefix=prefix, fmt=fmt)
            if r["events"] != args.events:
                raise SystemExit(
                    f"format {fmt}: the relay delivered {r['events']} events, the workload wrote {args.events}"
                )
            rate = args.events / r["elapsed"]
            steady = args.events / (r["elapsed"] - r["first_event"])
            results[fmt].append(rate)
            print(
                f"pair {i + 1}, {fmt}: {rate:,.0f} events/s end to end ({steady:,.0f}/s after the first event), "
                f"CPU {r['cpu']:.1f}s, peak RSS {r['peak_rss'] / 2**20:.0f} MiB"
            )
        a, b = results[args.format][-1], results["envelope"][-1]
        print(f"pair {i + 1}: {args.format} / envelope = {a / b:.3f}")
    mean = sum(results[args.format]) / sum(results["envelope"])
    print(f"{args.format} / envelope over {args.pairs} pair(s): {mean:.3f} (events/s, same binlog, same run)")


def relay_environment() -> dict[str, str]:
    """The relay child's environment, with the project's bytecode compiled first: an
    installed relay runs from `.pyc` files (pip compiles them), but an editable checkout run
    with PYTHONDONTWRITEBYTECODE set (as on the build machine) compiles every module from
    source at each start, about 0.4 s of the reader's start (measured in issue 28's work)
    that no user pays. Compiling is skipped for modules whose `.pyc` is current."""
    env = compiled_environment(ROOT)
    if not _builds_reported:
        _builds_reported.append(_builds(env))
        print(f"bench: {_builds_reported[0]}", flush=True)
    return env


_builds_reported: list[str] = []  # said once a run


def _builds(env: dict[str, str]) -> str:
    """Which builds the relay child loads, asked of its own interpreter and environment: the
    json format's proof walk (the compiled build that `./run.sh setup` makes, or the pure-Python
    module) and the sinks' encoders (connectors/sink_native.c's build, or the Python ways)."""
    probe = (
        "from cdc import json_kinds_native as j; from connectors import sink_native as s; "
        "print(f\"the relay's json walk: {j.WALK.__file__}; the sinks' encoders: \""
        "+ (s.compiled_module().__file__ if s.COMPILED else 'Python (no current C build)'))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
    return loaded.stdout.strip() or loaded.stderr.strip()[-200:]


def compiled_environment(root: Path) -> dict[str, str]:
    """Compile the relay's packages under `root` and return this process's environment
    without PYTHONDONTWRITEBYTECODE (`relay_environment`; `bench baseline` for an older tree)."""
    import compileall

    for package in ("cdc", "connectors", "cdc_cli", "avro"):
        if (root / package).is_dir():
            compileall.compile_dir(str(root / package), quiet=1)
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_relay(
    db,
    kafka,
    database: str,
    start: str,
    expected_end: tuple[str, int],
    workdir: Path,
    profile: str | None,
    delivery: str = "idempotent",
    prefix: str = "bench",
    kill_at: float | None = None,
    kafka_store: bool = False,
    fmt: str = "envelope",
    sink: Any = None,
    events: int | None = None,
) -> dict:
    """One relay over the range. `kill_at`: SIGKILL it once this share of the events is
    checkpointed, restart it and measure its start (to the "recovering from checkpoint" line)."""
    from cdc.position import BinlogPosition

    workdir.mkdir(parents=True, exist_ok=True)
    cp = workdir / "cp.json"
    cfg = workdir / "relay.toml"
    if delivery == "transactional" or kafka_store:
        from connectors.checkpoint_stores import KafkaCheckpointStore

        store = KafkaCheckpointStore(kafka.bootstrap_servers, f"{prefix}.cp", prefix)
        checkpoint = f'store = "kafka"\ntopic = "{prefix}.cp"'

        def progress() -> dict:
            loaded = store.load()
            if loaded is None:
                raise ValueError("no checkpoint yet")
            return loaded.to_dict()
    else:
        checkpoint = f'store = "file"\npath = "{cp}"'

        def progress() -> dict:
            return json.loads(cp.read_text())

    # The run ends at the first checkpoint past the workload's end, so the checkpoint's
    # interval (with the poll's 0.05 s) is the resolution of a run's time: 0.5 s, as until
    # 2026-11-29, left the ratio of two runs of 1.5-2.5 s to chance by up to a quarter. A file
    # checkpoint is written by the relay's writer thread; a Kafka one (transactional: it also
    # bounds a transaction) keeps 0.5 s.
    interval = 0.5 if delivery == "transactional" or kafka_store else 0.05

    cfg.write_text(f"""
[source]
name = "{prefix}"
host = "{db.host}"
port = {db.port}
user = "{db.user}"
password_env = "BENCH_MYSQL_PASSWORD"
replica_server_id = 777002
start = "{start}"
[[outbox.tables]]
schema = "{database}"
table = "outbox"
topic = "{prefix}.{{aggregate_type}}"
{_format_settings(fmt)}
[kafka]
bootstrap = "{kafka.bootstrap_servers}"
dead_letter_topic = "{prefix}.dlq"
delivery = "{delivery}"
{sink.toml if sink is not None else ""}
[schema_registry]
url = "mock://bench"
[checkpoint]
{checkpoint}
interval_s = {interval}
[lease]
enabled = false
[log]
level = "{"INFO" if kill_at else "WARNING"}"
""")
    env = {**relay_environment(), "BENCH_MYSQL_PASSWORD": db.password, **(sink.env if sink is not None else {})}
    cmd = [sys.executable, "-m", "cdc_cli.main", "run", "--config", str(cfg), "--skip-check"]
    if profile:
        fmt = "raw" if profile.endswith(".txt") else "flamegraph"
        cmd = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-o",
            profile,
            "-r",
            "200",
            "--format",
            fmt,
            "--subprocesses",
            "--",
        ] + cmd
    from confluent_kafka import TopicPartition

    end = BinlogPosition(*expected_end)
    if kill_at:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None:
            try:
                data = progress()
                if BinlogPosition(data["file"], data["pos"]) >= end:
                    raise SystemExit("the relay finished before the kill: use more events")
                if data.get("events_delivered", 0) >= kill_at * _EVENTS[0]:
                    break
            except (FileNotFoundError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        log_path = workdir / "restart.log"
        t0 = time.perf_counter()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        line = ""
        while proc.poll() is None and time.perf_counter() - t0 < 120:
            text = log_path.read_text(errors="replace")
            if "recovering from checkpoint" in text:
                line = next(ln for ln in text.splitlines() if "recovering from checkpoint" in ln)
                break
            time.sleep(0.005)
        started = time.perf_counter() - t0
        proc.kill()
        proc.wait()
        return {"restart": started, "line": line.split("cdc.relay: ", 1)[-1]}
    # The harness shares the machine with what it measures (2 cores here), so it asks little:
    # the topic's partition ends in ONE ListOffsets request a poll (until this session, 24
    # watermark requests every 5 ms until the first event), the relay's processes listed once
    # a second rather than every poll (each listing reads every process's /proc stat).
    partition_ends: Callable[[], int] | None = None
    if sink is not None:
        moved, done = sink.first_moved, sink.close
    else:
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        latest = {TopicPartition(f"{prefix}.order", p): OffsetSpec.latest() for p in range(24)}

        def partition_ends() -> int:
            return sum(f.result().offset for f in admin.list_offsets(latest, request_timeout=5).values())

        # Once before the relay starts: the client's first request waits for its connection
        # and metadata (up to 1 s, measured), which would otherwise delay the first event's time.
        partition_ends()

        def moved() -> bool:
            return partition_ends() > 0

        def done() -> None:
            pass

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = 0
    first_event = None
    # Time to the first acknowledged event: the first moment a partition's end moves (a sink
    # that cannot say so cheaply, RabbitMQ 3.10 without StreamStats, reports its rate only).
    slowest = 0.0  # the longest poll: the first event's time is known to within it
    while moved is not None and first_event is None and proc.poll() is None and time.perf_counter() - t0 < 30:
        asked = time.perf_counter()
        seen = moved()
        slowest = max(slowest, time.perf_counter() - asked)
        if seen:
            first_event = time.perf_counter() - t0
        else:
            time.sleep(0.005)
    if slowest > 0.05:
        print(f"bench: a poll for the first event took {slowest:.2f} s: this run's first event is known to within it")
    # Each process's CPU at the first event: what it spends after it is the steady window's
    # (which process bounds the rate: the relay's, or its reader child's).
    cpu_at_first = _cpu_by_role(ps)
    harness_at_first = time.process_time()
    done()
    # `events`: also the moment the last of them is in Kafka (the topic's partitions' ends add
    # up to it), one ListOffsets request a poll. The loop below ends at the first checkpoint
    # past the workload's end, which comes up to checkpoint.interval_s (`interval`) later.
    expected = events or 0
    in_kafka = partition_ends if expected and delivery == "idempotent" else None
    last_event = None
    peak_pss = 0
    cpu_by_pid: dict[int, float] = {}
    last_pss = 0.0
    procs: list[Any] = []
    listed = 0.0
    while True:
        try:
            if time.perf_counter() - listed > 1.0:
                procs = [p for p in [ps] + ps.children(recursive=True) if "python" in p.name()]
                listed = time.perf_counter()
            peak = max(peak, sum(p.memory_info().rss for p in procs))
            for p in procs:
                cpu_by_pid[p.pid] = sum(p.cpu_times()[:2])
            if time.perf_counter() - last_pss > 0.25:  # PSS: shared pages split between the processes
                peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in procs))
                last_pss = time.perf_counter()
        except psutil.Error:
            pass
        if in_kafka is not None and last_event is None and in_kafka() >= expected:
            last_event = time.perf_counter() - t0
        try:
            data = progress()
            pos = BinlogPosition(data["file"], data["pos"])
            if pos >= end:
                break
        except (FileNotFoundError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            raise SystemExit(f"relay exited early: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        time.sleep(0.05 if delivery == "idempotent" else 0.2)
    elapsed = time.perf_counter() - t0
    procs = [p for p in [ps] + ps.children(recursive=True) if "python" in p.name()]
    for p in procs:
        cpu_by_pid[p.pid] = sum(p.cpu_times()[:2])
    cpu = sum(cpu_by_pid.values())
    processes = len(cpu_by_pid)
    cpu_at_end = _cpu_by_role(ps)
    steady_cpu = {role: cpu_at_end[role] - cpu_at_first.get(role, 0.0) for role in cpu_at_end}
    steady_cpu["harness"] = time.process_time() - harness_at_first  # this process: it shares the machine
    if profile:
        procs[0].send_signal(15)  # the relay drains and exits; py-spy then writes its profile
    else:
        proc.terminate()
    proc.wait(120)
    commits = _commits(kafka.bootstrap_servers, f"{prefix}.cp") if delivery == "transactional" else 0
    return {
        "commits": commits,
        "elapsed": elapsed,
        "cpu": cpu,
        "peak_rss": peak,
        "peak_pss": peak_pss,
        "processes": processes,
        "first_event": first_event,
        "last_event": last_event,
        "events": data.get("events_delivered", 0),
        "steady_cpu": steady_cpu,
    }


def pin_servers(pids: list[int | None]) -> None:
    """--pin: every thread of each server (and of its children: beam.smp under its
    launcher) on CPU 1, this process on CPU 0, so the relays it starts and their reader
    children (which inherit the mask) have CPU 0 to themselves. On a 2-core machine this
    separates the relay's cost from the servers': a broker that costs more CPU an event than
    the Kafka stand-in then slows the relay only through its answers' latency."""
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("--pin needs 2 CPUs")
    for pid in pids:
        if pid is None:
            continue
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            for thread in proc.threads():
                try:
                    os.sched_setaffinity(thread.id, {1})
                except OSError:
                    pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, {0})
    print("bench: servers pinned to CPU 1, the relay to CPU 0")


def _cpu_by_role(relay: Any) -> dict[str, float]:
    """CPU seconds (user + system) so far of the relay's process ("relay") and of its
    Python children (the reader process, "reader"). Under --profile `relay` is py-spy's
    process: the relay is then its Python child (whose parent is not Python)."""
    out: dict[str, float] = {}
    try:
        for p in [relay] + relay.children(recursive=True):
            if "python" in p.name():
                role = "relay" if p.pid == relay.pid or "python" not in p.parent().name() else "reader"
                out[role] = out.get(role, 0.0) + sum(p.cpu_times()[:2])
    except psutil.Error:
        pass
    return out


def steady_cpu_line(r: dict, events: int) -> str:
    """Each process's CPU after the first event, per event (the steady window)."""
    parts = [f"{role} {cpu:.1f}s ({cpu / events * 1e6:.1f} us/event)" for role, cpu in sorted(r["steady_cpu"].items())]
    return "CPU after the first event by process: " + ", ".join(parts)


def compare_sink(
    args: argparse.Namespace, db, kafka, database: str, start: str, end: tuple[str, int], tmp: str
) -> None:
    """--sink NAME: the relay over the same binlog to the Kafka stand-in, then to NAME's
    real server (bench/sink_servers.py), events/s of each; `--rounds N` alternates the two N
    times (a relay, a checkpoint and topics of its own each time) and prints the medians.
    The broker's CPU (the stand-in's process, beam.smp, nats-server) is printed beside the
    relay's: on 2 cores it competes with the relay. `--profile` records the sink's first run."""
    from bench.sink_servers import sink_server

    rates: dict[str, list[float]] = {"kafka": [], args.sink: []}
    with sink_server(args.sink, "bench") as first_sink:
        if args.pin:
            pin_servers([db.pid, kafka.pid, first_sink.pid])
        for i in range(args.rounds):
            prefix = "bench" if i == 0 else f"r{i}"
            if i:
                kafka.create_topic(f"{prefix}.order", 24)
                kafka.create_topic(f"{prefix}.dlq", 1)
                print(f"round {i + 1}:")
            sink = first_sink if i == 0 or first_sink.with_prefix is None else first_sink.with_prefix(prefix)
            for name in ("kafka", args.sink):
                broker = psutil.Process(kafka.pid if name == "kafka" else sink.pid)
                broker_cpu = sum(broker.cpu_times()[:2])
                r = run_relay(
                    db, kafka, database, start, end, Path(tmp) / f"{name}-{prefix}",
                    args.profile if name != "kafka" and i == 0 else None, prefix=prefix,
                    sink=sink if name != "kafka" else None,
                )  # fmt: skip
                broker_cpu = sum(broker.cpu_times()[:2]) - broker_cpu
                if r["events"] != args.events:
                    raise SystemExit(
                        f"{name}: the relay delivered {r['events']} events, the workload wrote {args.events}"
                    )
                rates[name].append(args.events / r["elapsed"])
                steady = (
                    "not measured"
                    if r["first_event"] is None
                    else f"{args.events / (r['elapsed'] - r['first_event']):,.0f}/s"
                )
                print(
                    f"{name}: {rates[name][-1]:,.0f} events/s end to end ({steady} after the first event), "
                    f"CPU {r['cpu']:.1f}s ({r['cpu'] / args.events * 1e6:.1f} us/event; "
                    + ", ".join(f"{role} {cpu:.1f}s" for role, cpu in sorted(r["steady_cpu"].items()))
                    + f" after the first event), peak RSS {r['peak_rss'] / 2**20:.0f} MiB; "
                    f"broker CPU {broker_cpu:.1f}s ({broker_cpu / args.events * 1e6:.1f} us/event)"
                )
            print(f"{args.sink} / kafka: {rates[args.sink][-1] / rates['kafka'][-1]:.2f} (events/s, same binlog)")
    if args.rounds > 1:
        kafka_rate, sink_rate = statistics.median(rates["kafka"]), statistics.median(rates[args.sink])
        print(
            f"median of {args.rounds} rounds: kafka {kafka_rate:,.0f} events/s, {args.sink} {sink_rate:,.0f}: "
            f"{sink_rate / kafka_rate:.2f} (rounds: "
            + ", ".join(f"{s / k:.2f}" for k, s in zip(rates["kafka"], rates[args.sink], strict=True))
            + ")"
        )


def _status(db) -> tuple[str, int]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return str(file), int(pos)


def _range_bytes(db, start: tuple[str, int], end: tuple[str, int]) -> int:
    from cdc.position import BinlogPosition

    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
    total = 0
    for name, size in logs:
        lo = start[1] if name == start[0] else 4
        hi = end[1] if name == end[0] else size
        if BinlogPosition(start[0], 4) <= BinlogPosition(name, 4) <= BinlogPosition(end[0], 4):
            total += max(0, hi - lo)
    return total


def _row_event_kinds(db, start: tuple[str, int], count: int = 400) -> set[str]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SHOW BINLOG EVENTS IN %s FROM %s LIMIT {count}", start)
        return {str(r[2]) for r in cur.fetchall() if "rows" in str(r[2]).lower()}


def main_compressed(args: argparse.Namespace) -> None:
    """The same workload in an uncompressed and a compressed binlog range of one server."""
    from testbed.kafka_standin import KafkaStandin

    with (
        bench_server(compressed=True) as db,
        KafkaStandin.start(brokers=1) as kafka,
        tempfile.TemporaryDirectory() as tmp,
    ):
        ranges = {}
        for name, setting in (("uncompressed", "OFF"), ("compressed", "ON")):
            database = f"bench_{name}"
            create_schema(db, database, args.mixed)
            with db.connect() as conn, conn.cursor() as cur:
                cur.execute(f"SET GLOBAL log_bin_compress = {setting}")
                cur.execute("FLUSH BINARY LOGS")
            start = _status(db)
            t0 = time.perf_counter()
            write(db, database, args.events, mixed=args.mixed)
            end = _status(db)
            kinds = _row_event_kinds(db, start)
            print(
                f"{name}: {args.events} outbox events written in {time.perf_counter() - t0:.1f}s, "
                f"binlog {_range_bytes(db, start, end) / 2**20:.1f} MiB, row events {sorted(kinds)}"
            )
            ranges[name] = (database, start, end)
        if "Write_rows_compressed_v1" not in _row_event_kinds(db, ranges["compressed"][1]):
            raise SystemExit("the compressed range holds no Write_rows_compressed_v1 event")
        rates: dict[str, list[float]] = {"uncompressed": [], "compressed": []}
        cpus: dict[str, list[float]] = {"uncompressed": [], "compressed": []}
        for i in range(args.pairs):
            order = ("uncompressed", "compressed") if i % 2 == 0 else ("compressed", "uncompressed")
            pair = {}
            for name in order:
                database, start, end = ranges[name]
                prefix = f"b{i}{name[0]}"
                kafka.create_topic(f"{prefix}.order", 24)
                kafka.create_topic(f"{prefix}.dlq", 1)
                workdir = Path(tmp) / prefix
                workdir.mkdir()
                r = run_relay(db, kafka, database, f"{start[0]}:{start[1]}", end, workdir, None, prefix=prefix)
                if r["events"] != args.events:
                    raise SystemExit(
                        f"the relay delivered {r['events']} events of {name}, the workload wrote {args.events}"
                    )
                rate = args.events / r["elapsed"]
                steady = args.events / (r["elapsed"] - r["first_event"])
                pair[name] = rate
                rates[name].append(rate)
                cpus[name].append(r["cpu"])
                print(
                    f"pair {i + 1}, {name}: {rate:,.0f} events/s incl. start-up ({steady:,.0f}/s after the first "
                    f"event), CPU {r['cpu']:.1f}s ({r['cpu'] / r['elapsed']:.2f} cores), peak RSS "
                    f"{r['peak_rss'] / 2**20:.0f} MiB"
                )
            print(
                f"pair {i + 1} ({' then '.join(order)}): compressed / uncompressed = "
                f"{pair['compressed'] / pair['uncompressed']:.3f} (events/s); CPU seconds "
                f"{cpus['compressed'][-1] / cpus['uncompressed'][-1]:.3f}"
            )
        total_c, total_u = sum(rates["compressed"]), sum(rates["uncompressed"])
        # On a shared machine the rate moves with the neighbours; the CPU the relay spent on
        # the same events does not: it is the figure to compare when the cores are busy.
        print(
            f"over {args.pairs} pair(s): compressed / uncompressed = {total_c / total_u:.3f} (events/s), "
            f"CPU seconds {sum(cpus['compressed']) / sum(cpus['uncompressed']):.3f}"
        )


_EVENTS = [0]


def _commits(bootstrap: str, topic: str) -> int:
    """Kafka transactions the relay committed: each holds one checkpoint record."""
    from connectors.kafka.reader import KafkaTopicReader

    reader = KafkaTopicReader(bootstrap)
    try:
        low, high = reader.watermarks(topic, 0)
        return sum(1 for _ in reader.messages(topic, 0, low, high))
    finally:
        reader.close()


def compare_delivery(args, db, database: str, start: str, end: tuple[str, int], tmp: str) -> None:
    """Both delivery modes, the default first, on one noida-db broker over the same binlog,
    both with the default checkpoint store (a Kafka topic)."""
    from testbed.noida import NoidaKafka

    _EVENTS[0] = args.events
    with NoidaKafka.start() as broker:
        results = {}
        for delivery in ("idempotent", "transactional"):
            prefix = f"b{delivery[:3]}"
            for topic, n in ((f"{prefix}.order", 24), (f"{prefix}.dlq", 1), (f"{prefix}.cp", 1)):
                broker.create_topic(topic, n)
            r = run_relay(
                db, broker, database, start, end, Path(tmp) / prefix, None, delivery, prefix, kafka_store=True
            )
            if r["events"] != args.events:
                raise SystemExit(
                    f"{delivery}: the relay delivered {r['events']} events, the workload wrote {args.events}"
                )
            results[delivery] = rate = args.events / r["elapsed"]
            steady = args.events / (r["elapsed"] - r["first_event"])
            extra = (
                f", {r['commits']} Kafka transactions committed, {args.events / max(1, r['commits']):,.0f} "
                "messages per commit"
                if delivery == "transactional"
                else ""
            )
            print(
                f"{delivery} on noida-db: {rate:,.0f} events/s incl. start-up ({steady:,.0f}/s after the first "
                f"event, first after {r['first_event']:.2f}s), CPU {r['cpu']:.1f}s{extra}"
            )
        print(f"transactional / idempotent throughput: {results['transactional'] / results['idempotent']:.0%}")
        for delivery in ("idempotent", "transactional"):
            prefix = f"r{delivery[:3]}"
            for topic, n in ((f"{prefix}.order", 24), (f"{prefix}.dlq", 1), (f"{prefix}.cp", 1)):
                broker.create_topic(topic, n)
            r = run_relay(
                db,
                broker,
                database,
                start,
                end,
                Path(tmp) / prefix,
                None,
                delivery,
                prefix,
                kill_at=0.5,
                kafka_store=True,
            )
            print(
                f"{delivery}: start after a SIGKILL halfway, to the end of recovery: {r['restart']:.2f}s ({r['line']})"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--profile", default=None, help="write a py-spy flame graph of the relay here")
    ap.add_argument("--alter", action="store_true", help="ALTER TABLE the outbox halfway through the workload")
    ap.add_argument(
        "--compressed",
        action="store_true",
        help="log_bin_compress=ON: the same workload compressed and not, relay catch-up on each",
    )
    ap.add_argument("--pairs", type=int, default=2, help="with --compressed or --format: pairs of runs")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="the relay's catch-up this many times over the same binlog, and the medians (the host's speed "
        "varies between runs)",
    )
    ap.add_argument(
        "--format",
        choices=("string", "json", "bytes", "avro", "envelope"),
        default=None,
        help="an output format against the envelope, over the same binlog in alternating pairs (--pairs)",
    )
    ap.add_argument(
        "--sink",
        choices=("rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream"),
        default=None,
        help="the relay on that sink (a real server, testbed/) against the Kafka sink, same binlog, same run",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="with --sink: the servers on CPU 1, the relay on CPU 0 (the brokers' own CPU apart from the relay's)",
    )
    ap.add_argument(
        "--delivery",
        choices=("idempotent", "transactional"),
        default="idempotent",
        help="transactional: compare both delivery modes on noida-db (see the docstring)",
    )
    args = ap.parse_args()
    if args.compressed:
        main_compressed(args)
        return
    from testbed.kafka_standin import KafkaStandin

    database = "bench"
    with bench_server() as db, KafkaStandin.start(brokers=1) as kafka, tempfile.TemporaryDirectory() as tmp:
        kafka.create_topic("bench.order", 24)
        kafka.create_topic("bench.dlq", 1)
        create_schema(db, database, args.mixed)
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            start_file, start_pos = cur.fetchone()[:2]
        t0 = time.perf_counter()
        if args.alter:
            half = args.events // 2
            write(db, database, half, mixed=args.mixed)
            with db.connect(database) as conn, conn.cursor() as cur:
                cur.execute("ALTER TABLE outbox ADD COLUMN tenant VARCHAR(32) NOT NULL DEFAULT 't1' AFTER type")
            write(db, database, args.events - half, mixed=args.mixed, seed=2)
        else:
            write(db, database, args.events, mixed=args.mixed)
        gen = time.perf_counter() - t0
        with db.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            end = cur.fetchone()[:2]
        kind = "mixed (outbox = 1/11 of rows)" if args.mixed else "outbox-only"
        if args.alter:
            kind += ", ALTER TABLE ADD COLUMN halfway"
        print(f"workload: {args.events} outbox events, {kind}, 100 per transaction, generated in {gen:.1f}s")
        if args.format:
            compare_formats(args, db, kafka, database, f"{start_file}:{start_pos}", (end[0], int(end[1])), tmp)
            return
        if args.delivery == "transactional":
            compare_delivery(args, db, database, f"{start_file}:{start_pos}", (end[0], int(end[1])), tmp)
            return
        if args.sink:
            compare_sink(args, db, kafka, database, f"{start_file}:{start_pos}", (end[0], int(end[1])), tmp)
            return
        naive, rows = naive_parse_rate(db, start_file, start_pos, database)
        print(f"naive python-mysql-replication parse: {naive:,.0f} outbox events/s ({rows} rows read)")
        rates: list[float] = []
        steadies: list[float] = []
        arrivals: list[float] = []
        for i in range(args.rounds):
            # Each round a relay of its own (own checkpoint, own topics) over the same binlog.
            prefix = "bench" if i == 0 else f"r{i}"
            if i:
                kafka.create_topic(f"{prefix}.order", 24)
                kafka.create_topic(f"{prefix}.dlq", 1)
                print(f"round {i + 1}:")
            r = run_relay(
                db,
                kafka,
                database,
                f"{start_file}:{start_pos}",
                (end[0], int(end[1])),
                Path(tmp) / prefix,
                args.profile if i == 0 else None,
                prefix=prefix,
                events=args.events,
            )
            rate = args.events / r["elapsed"]
            if r["events"] != args.events:
                raise SystemExit(f"the relay delivered {r['events']} events, the workload wrote {args.events}")
            print(
                f"relay end to end: {rate:,.0f} events/s ({args.events} events in {r['elapsed']:.1f}s, "
                f"incl. start-up), CPU {r['cpu']:.1f}s ({r['cpu'] / r['elapsed']:.2f} cores), "
                f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB (PSS {r['peak_pss'] / 2**20:.0f} MiB) over "
                f"{r['processes']} process(es), first event after {r['first_event']:.2f}s"
            )
            steady = args.events / (r["elapsed"] - r["first_event"])
            print(f"relay after its first event: {steady:,.0f} events/s")
            in_kafka_rate = args.events / (r["last_event"] - r["first_event"])
            print(
                f"relay after its first event, to the last event in Kafka: {in_kafka_rate:,.0f} events/s (the line "
                "above ends at the first checkpoint past the workload's end, written every 0.5 s)"
            )
            print(steady_cpu_line(r, args.events))
            print(f"ratio relay / naive parse: {rate / naive:.2f}x (after the first event: {steady / naive:.2f}x)")
            rates.append(rate)
            steadies.append(steady)
            arrivals.append(in_kafka_rate)
        if args.rounds > 1:
            rate, steady = statistics.median(rates), statistics.median(steadies)
            print(
                f"median of {args.rounds} rounds: {rate:,.0f} events/s incl. start-up, {steady:,.0f} after the "
                f"first event (rounds: {', '.join(f'{s:,.0f}' for s in steadies)}); ratio to the naive parse "
                f"{rate / naive:.2f}x ({steady / naive:.2f}x); to the last event in Kafka "
                f"{statistics.median(arrivals):,.0f} (rounds: {', '.join(f'{s:,.0f}' for s in arrivals)})"
            )


if __name__ == "__main__":
    main()
