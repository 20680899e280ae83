"""`cdc verify --follow`: the verifier as a Spark Structured Streaming job that runs all the
time and says how far the binlog is proven delivered exactly once.

Two streaming sources, both the verifier's own independent readers:
`cdc_binlog_stream` (offsets: binlog positions; `spark_jobs/mysql/binlog_stream.py`) and
the sink's: `cdc_kafka_stream` (offsets: per-partition offsets; `spark_jobs/kafka/stream.py`),
or for the other sinks `cdc_rabbitmq_stream` / `cdc_nats_stream` (`spark_jobs/log_stream.py`:
the same offsets, rows and markers, read by the batch sources' own readers). Their
rows are put side by side (one union, one query, one Spark checkpoint) and handed to
`foreachBatch`, which reconciles each micro-batch - only what is new - against the state
left by the earlier ones (`spark_jobs/follow_state.py`: unmatched events and records,
matched identities for duplicate detection, verified-through).

Why foreachBatch with a small state of our own, not Spark's stateful operators: the
rules need more than a join with a watermark (a late second delivery of a matched event is
a duplicate; verified-through is an ordered scan over transactions; an unmatched record is
a phantom only once the binlog has been read past it), and a micro-batch holds only what
is new - a few thousand rows - so the state fits one process and each batch is one
collect. Exactness across a kill: Spark's checkpoint (`<checkpoint>/spark`) holds the
offsets of every batch; the state after batch N is written to `<checkpoint>/state/N.state`
(atomic rename) before Spark commits N. A restarted job gets batch N again with the same
offsets when N was not committed, and it starts from the state of N-1: nothing is counted
twice, nothing is lost. (Alarm lines of a batch re-run after a kill can be logged again.)

Outputs, refreshed continuously: the Prometheus endpoint (`--metrics-port`), one alarm
line per missing / duplicate / phantom event (logger `cdc.verify.follow`), and
report.json + report.html (+ missing.jsonl) in the output directory every
`report_every_s` and at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from cdc.position import file_sequence
from connectors.http_endpoint import OperatorHTTPServer
from connectors.mysql.client import binlog_end
from spark_jobs.arrow_transport import unpack
from spark_jobs.common import redacted
from spark_jobs.follow_ledger import FOLLOW_CLASSES
from spark_jobs.follow_repair import Compensation, Compensator
from spark_jobs.follow_state import FollowState
from spark_jobs.kafka.source import plan_kafka
from spark_jobs.kafka.stream import KafkaStreamDataSource, offsets_of
from spark_jobs.log_stream import LogStreamReader
from spark_jobs.mysql.binlog_plan import connect_mysql
from spark_jobs.mysql.binlog_source import tables_to_json
from spark_jobs.mysql.binlog_stream import BinlogStreamDataSource, server_logs
from spark_jobs.reconcile_summary import missing_entry
from spark_jobs.report import VerifyReport, write_outputs
from spark_jobs.verify import VerifyConfig, source_error

LOG = logging.getLogger("cdc.verify.follow")
# The streaming engine's own cost per micro-batch, measured beside a trickle of writes (one
# micro-batch every 2 s, bench/verify_follow.py): Hadoop's FileContext renames of the
# checkpoint's offset and commit files asked `readlink` in a child process (about 20
# processes per micro-batch), and the JIT's optimising compiler took more than half of the
# JVM's CPU for code that only carries the sources' Arrow batches. With these two the JVM
# used 8.6 s instead of 20.8 s in 90 s (trigger 2 s).
FOLLOW_SPARK_CONF = {
    # plain FileSystem renames: atomic on a local disk, where the follow job keeps its checkpoint
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}
FOLLOW_JVM_FLAGS = "-XX:TieredStopAtLevel=1"  # the quick compiler only
Progress = Callable[[str], None]


@dataclass(frozen=True)
class FollowConfig:
    verify: VerifyConfig
    checkpoint_dir: str = ""  # default: <output_dir>/checkpoint
    grace_s: float = 60.0
    trigger_s: float = 2.0
    start: str = "head"  # "head" (now), "oldest", a binlog file name, or file:pos
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no endpoint; 0: any free port
    report_every_s: float = 10.0
    dedupe_window_s: float = 300.0
    max_batch_bytes: int = 64 << 20  # admission limit: binlog bytes one micro-batch reads (0: no limit)
    # A micro-batch's binlog range is read by one task unless larger than this: splitting
    # costs a scan of the range (SHOW BINLOG EVENTS, for transaction starts) on the server
    # and in the planner, and the topics' tasks already run beside the binlog's. With the
    # default admission limit a micro-batch is never split.
    binlog_split_bytes: int = 64 << 20
    # Continuous compensation (`--repair`; spark_jobs/follow_repair.py): None, off
    compensation: Compensation | None = None

    @property
    def checkpoint(self) -> Path:
        return Path(self.checkpoint_dir or os.path.join(self.verify.output_dir, "checkpoint"))


# The streaming source of each sink beside Kafka: the batch source's format -> its stream's
STREAM_FORMATS = {"cdc_rabbitmq": "cdc_rabbitmq_stream", "cdc_nats": "cdc_nats_stream"}


def sink_stream_reader(fmt: str, options: dict[str, str]) -> LogStreamReader:
    """The streaming reader of a sink beside Kafka (`fmt`: its batch source's format)."""
    if fmt == "cdc_rabbitmq":
        from spark_jobs.rabbitmq.stream import RabbitMQStreamReader

        return RabbitMQStreamReader(options)
    from spark_jobs.nats.stream import NatsStreamReader

    return NatsStreamReader(options)


def register_stream_sources(spark: Any) -> None:
    from spark_jobs.nats.stream import NatsStreamDataSource
    from spark_jobs.rabbitmq.stream import RabbitMQStreamDataSource

    for source in (BinlogStreamDataSource, KafkaStreamDataSource, RabbitMQStreamDataSource, NatsStreamDataSource):
        try:
            spark.dataSource.register(source)
        except Exception as exc:  # only "already registered" is fine
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise


class FollowJob:
    """The streaming query, the state it keeps, a clock thread (grace expiry, binlog head,
    metrics, report) and the metrics endpoint."""

    def __init__(self, config: FollowConfig, spark: Any = None, progress: Progress | None = None):
        if config.grace_s <= 0 or config.trigger_s <= 0:
            raise ValueError("cdc verify --follow: --grace and --trigger must be positive numbers of seconds")
        self.config = config
        self.say = progress or (lambda _m: None)
        self._own_spark = spark is None
        self.spark = spark
        self.lock = threading.RLock()
        self.state: FollowState | None = None
        self.query: Any = None
        self.head: tuple[str, int, int] | None = None
        self.lag_s: float = 0.0
        self.last_batch_at: float | None = None
        self.batch_seconds: list[float] = []
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None
        self._http: OperatorHTTPServer | None = None
        self.metrics_port: int | None = None
        self._last_report = 0.0
        self.report: VerifyReport | None = None
        self.error: str | None = None
        self._known_topics: set[str] = set()
        self.compensator: Compensator | None = None

    # ------------------------------------------------------------------ set-up

    def _state_dir(self) -> Path:
        return self.config.checkpoint / "state"

    def state_dir(self) -> Path:
        return self._state_dir()

    def _fresh(self) -> bool:
        offsets = self.config.checkpoint / "spark" / "offsets"
        return not offsets.is_dir() or not any(offsets.iterdir())

    def _new_state(self) -> FollowState:
        v = self.config.verify
        return FollowState(source=v.source, dlq_topic=v.dlq_topic, grace_s=self.config.grace_s,
                           dedupe_window_s=self.config.dedupe_window_s, partitioner=v.partitioner,
                           routed_stream=v.sink.get("audit_stream") or "")  # fmt: skip

    def _resolve_start(self) -> tuple[str, str]:
        """(binlog start file:pos, kafka start) for a new query. From the head: the
        topics' high watermarks are taken first, the binlog head second, so every event
        after that head is published after those offsets."""
        settings: dict[str, Any] = {**self.config.verify.mysql_options()}
        settings["port"] = int(settings["port"])
        start = (self.config.start or "head").strip()
        if start == "head":
            v = self.config.verify
            if v.sink:  # the sink's own stream reader plans it, as it will on every trigger
                kplan = sink_stream_reader(v.sink["format"], self._sink_options())._planned()
            else:
                kplan = plan_kafka(
                    v.kafka_bootstrap, list(v.topics) + [v.dlq_topic], v.effective_pattern(), v.consumer_conf
                )
            (file, pos), _logs = server_logs(settings)
            return f"{file}:{pos}", json.dumps(offsets_of(kplan, "high"))
        (file, pos), logs = server_logs(settings)
        if start == "oldest":
            return f"{logs[0][0] if logs else file}:4", "earliest"
        if ":" in start:
            return start, "earliest"
        if start not in [n for n, _ in logs]:
            raise ValueError(
                f"cdc verify --follow: start file {start} is not on the server (SHOW BINARY LOGS): name one that is"
            )
        return f"{start}:4", "earliest"

    def _topics_file(self) -> Path:
        return self.config.checkpoint / "topics.json"

    def _sink_options(self) -> dict[str, str]:
        """The streaming options of a sink beside Kafka: the batch source's, with the topics
        (a RabbitMQ 3.10 node cannot list its streams: the configured and fixed topics, and
        those the binlog names, written to `topics.json` as they appear)."""
        v = self.config.verify
        fixed = [t.topic for t in v.tables if "{" not in t.topic]
        topics = ",".join(sorted(set(v.topics) | set(fixed) | {v.dlq_topic}))
        return {**{k: val for k, val in v.sink.items() if k != "format"}, "topics": topics,
                "topic_pattern": v.effective_pattern() or "", "dlq_topic": v.dlq_topic,
                "topics_file": str(self._topics_file())}  # fmt: skip

    def _note_topics(self, b_table: Any) -> None:
        """The topics this micro-batch's events name, added to `topics.json` (atomic rename)
        for the RabbitMQ stream reader's next plan."""
        if b_table is None or "expected_topic" not in b_table.column_names:
            return
        new = {t for t in b_table.column("expected_topic").to_pylist() if t} - self._known_topics
        if not new:
            return
        self._known_topics |= new
        tmp = self._topics_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._known_topics)))
        os.replace(tmp, self._topics_file())

    def start(self) -> FollowJob:
        from pyspark.sql import functions as F

        cfg, v = self.config, self.config.verify
        cp = cfg.checkpoint
        cp.mkdir(parents=True, exist_ok=True)
        fresh = self._fresh()
        if fresh and self._state_dir().exists():
            shutil.rmtree(self._state_dir())  # state of a query whose Spark checkpoint is gone
        # Where the query starts, kept beside Spark's checkpoint: Spark's offset log holds each
        # batch's end, not batch 0's start, and asks the sources' initialOffset again when
        # batch 0 is run again after a kill; "head" then would be a later head, and batch 0's
        # events would never be read. The same start, from this file, reads them again.
        start_file = cp / "start.json"
        if fresh or not start_file.is_file():
            binlog_start, kafka_start = self._resolve_start() if fresh else ("head", "latest")
            tmp = start_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"binlog": binlog_start, "sink": kafka_start}))
            os.replace(tmp, start_file)
        else:
            kept = json.loads(start_file.read_text())
            binlog_start, kafka_start = kept["binlog"], kept["sink"]
        if fresh:
            f, _, p = binlog_start.rpartition(":")
            st = self._new_state()
            st.start = (f, file_sequence(f)[1], int(p))
            st.read_through = st.start
            st.verified_through = st.start
            if kafka_start.startswith("{"):  # partitions known at the start are not truncated
                for topic, parts in json.loads(kafka_start).items():
                    for p_, off in parts.items():
                        st.kafka_next[(topic, int(p_))] = int(off)
            st.save(self._state_dir())  # batch -1: where following began
            self.state = st
            self.say(
                f"follow: new checkpoint {cp}, binlog from {binlog_start}, topics from the "
                f"{'latest' if kafka_start.startswith('{') else kafka_start} offsets"
            )
        else:
            self.say(f"follow: resuming from checkpoint {cp}")
        if self.spark is None:
            from spark_jobs.session import build_spark

            self.say(f"spark: starting ({v.spark_master})")
            on_main = threading.current_thread() is threading.main_thread()
            sigint = signal.getsignal(signal.SIGINT) if on_main else None
            self.spark = build_spark(
                v.spark_master, "cdc-verify-follow", {**FOLLOW_SPARK_CONF, **v.spark_conf}, jvm_flags=FOLLOW_JVM_FLAGS
            )
            if sigint is not None:
                # PySpark installs its own Ctrl-C handler (cancel the jobs, raise KeyboardInterrupt);
                # for a job that runs until stopped, Ctrl-C is the caller's stop, as SIGTERM is
                signal.signal(signal.SIGINT, sigint)
        register_stream_sources(self.spark)
        # Both sides travel packed (spark_jobs/arrow_transport.py): the reconciliation is
        # here on the driver, Spark only carries the executors' Arrow batches to it.
        binlog = (
            self.spark.readStream.format("cdc_binlog_stream").options(**v.mysql_options())
            .option("source", v.source).option("tables", tables_to_json(v.tables))
            .option("binlog_reader", v.binlog_reader).option("start", binlog_start)
            .option("split_bytes", str(cfg.binlog_split_bytes)).option("max_batch_bytes", str(cfg.max_batch_bytes))
            .option("transport", "arrow").load()
        )  # fmt: skip
        topics = ",".join(list(v.topics) + [v.dlq_topic])
        if v.sink:
            if self._topics_file().is_file():
                self._known_topics = set(json.loads(self._topics_file().read_text()))
            kafka = (
                self.spark.readStream.format(STREAM_FORMATS[v.sink["format"]]).options(**self._sink_options())
                .option("start", kafka_start).option("chunk", str(v.kafka_chunk)).option("transport", "arrow").load()
            )  # fmt: skip
        else:
            kafka = (
                self.spark.readStream.format("cdc_kafka_stream").option("bootstrap", v.kafka_bootstrap)
                .option("topics", topics).option("topic_pattern", v.effective_pattern() or "")
                .option("dlq_topic", v.dlq_topic).option("start", kafka_start).option("isolation", v.isolation)
                .option("chunk", str(v.kafka_chunk)).option("consumer_conf", json.dumps(dict(v.consumer_conf)))
                .option("transport", "arrow").load()
            )  # fmt: skip
        both = binlog.select(F.lit("b").alias("side"), "arrow").unionByName(
            kafka.select(F.lit("k").alias("side"), "arrow")
        )
        self.query = (
            both.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", str(cp / "spark"))
            .trigger(processingTime=f"{cfg.trigger_s:g} seconds")
            .queryName("cdc_verify_follow")
            .start()
        )
        if cfg.metrics_port is not None:
            self._start_http()
        self._clock = threading.Thread(target=self._clock_loop, name="follow-clock", daemon=True)
        self._clock.start()
        if cfg.compensation is not None:
            self.compensator = Compensator(self, cfg.compensation).start()
            self.say(
                f"follow: repairing missing events behind the relay's checkpoint every {cfg.compensation.every_s:g} s"
            )
        return self

    # ----------------------------------------------------------------- batches

    def _state_for(self, batch_id: int) -> FollowState:
        st = self.state
        if st is not None and st.batch_id == batch_id - 1:
            return st
        loaded = FollowState.load(self._state_dir(), before=batch_id)
        if loaded is None:
            raise RuntimeError(f"cdc verify --follow: no state before batch {batch_id} in {self._state_dir()}: "
                               f"start with a new checkpoint dir")  # fmt: skip
        loaded.grace_s, loaded.dedupe_window_s = self.config.grace_s, self.config.dedupe_window_s
        loaded.routed_stream = self.config.verify.sink.get("audit_stream") or ""  # a state saved before it was kept
        return loaded

    def _on_batch(self, df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        table = df.toArrow()  # the Spark job: both sources' new ranges read by the executors
        t_read = time.monotonic() - t0
        packed: dict[str, list[bytes]] = {"b": [], "k": []}
        for side, blob in zip(table.column("side").to_pylist(), table.column("arrow").to_pylist(), strict=True):
            packed[side].append(blob)
        b_table, k_table = unpack(packed["b"]), unpack(packed["k"])
        n_b = b_table.num_rows if b_table is not None else 0
        n_k = k_table.num_rows if k_table is not None else 0
        if self.config.verify.sink:
            self._note_topics(b_table)
        with self.lock:
            st = self._state_for(batch_id)
            self.state = None  # a failure half-way leaves no half-applied state in memory
            st.apply_tables(batch_id, b_table, k_table)
            st.expire()
            st.save(self._state_dir())
            self.state = st
            self.last_batch_at = time.time()
            self.batch_seconds.append(time.monotonic() - t0)
            del self.batch_seconds[:-1000]
            vt = st.verified_through
        LOG.info("batch %d: %d binlog row(s), %d record row(s); read %.2f s, reconcile %.2f s; verified through %s:%s",
                 batch_id, n_b, n_k, t_read, time.monotonic() - t0 - t_read, vt[0] if vt else None,
                 vt[2] if vt else None)  # fmt: skip

    # ------------------------------------------------------------------- clock

    def _clock_loop(self) -> None:
        settings: dict[str, Any] = {**self.config.verify.mysql_options()}
        settings["port"] = int(settings["port"])
        conn = None  # one session, kept: a connection per second cost more CPU than the query
        while not self._stop.wait(1.0):
            try:
                if conn is None:
                    conn = connect_mysql(settings)
                with conn.cursor() as cur:
                    end = binlog_end(cur)
                if not end:
                    raise RuntimeError("binary logging is off on the server")
                head: tuple[str, int, int] | None = (end[0], file_sequence(end[0])[1], int(end[1]))
            except Exception as exc:
                LOG.warning("follow: cannot read the binlog head: %s", str(exc).splitlines()[0][:300])
                head = self.head
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # already broken: nothing to end
                        pass
                    conn = None
            with self.lock:
                st = self.state
                if st is None:
                    continue
                before = (dict(st.counts), dict(st.records))
                st.expire()
                if head is not None:
                    self.head = head
                    self.lag_s = st.observe_head(head)
                if (dict(st.counts), dict(st.records)) != before:
                    st.save(self._state_dir())
                due = time.monotonic() - self._last_report >= self.config.report_every_s
            if due:
                try:
                    self.write_report()
                except Exception as exc:
                    LOG.warning("follow: writing the report failed: %s", exc)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to end
                pass

    # ----------------------------------------------------------------- figures

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            st = self.state
            if st is None:
                return {}
            vt = st.verified_through
            return {
                "batches": st.batches,
                "batch_id": st.batch_id,
                "counts": dict(st.counts),
                "records": dict(st.records),
                "alarms": dict(st.alarms),
                "problems": st.problems(),
                "pending_events": len(st.pending),
                "waiting_records": len(st.waiting),
                "xa_undecided": len(st.xa_held),
                "late_deliveries": st.late_deliveries,
                "order_violations": st.order_violations,
                "repairs": dict(st.repairs),
                "repair_failures": dict(st.repair_failures),
                "repair_held": self.compensator.held if self.compensator is not None else 0,
                "verified_through": {"file": vt[0], "pos": vt[2]} if vt else None,
                "read_through": {"file": st.read_through[0], "pos": st.read_through[2]} if st.read_through else None,
                "start": {"file": st.start[0], "pos": st.start[2]} if st.start else None,
                "binlog_head": {"file": self.head[0], "pos": self.head[2]} if self.head else None,
                "verified_through_lag_s": round(self.lag_s, 3),
                "last_batch_at": self.last_batch_at,
            }

    def metrics_text(self) -> str:
        s = self.snapshot()
        src = self.config.verify.source.replace("\\", "\\\\").replace('"', '\\"')
        lab = f'source="{src}"'
        lines = []

        def m(name: str, help_: str, kind: str, values: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for extra, value in values:
                lines.append(f"{name}{{{lab}{extra}}} {value}")

        if not s:
            m("cdc_verify_up", "1 once the following verifier has its state", "gauge", [("", 0)])
            return "\n".join(lines) + "\n"
        m("cdc_verify_up", "1 once the following verifier has its state", "gauge", [("", 1)])
        counts = s["counts"]
        m("cdc_verify_events", "events (and phantom / unverifiable records) by class so far", "gauge",
          [(f',class="{c}"', counts.get(c, 0)) for c in FOLLOW_CLASSES])  # fmt: skip
        m("cdc_verify_problems", "missing + duplicate + phantom + reordered + altered (+ statement_format)", "gauge",
          [("", sum(s["problems"].values()))])  # fmt: skip
        m(
            "cdc_verify_alarms_total",
            "alarm lines logged",
            "counter",
            [(f',class="{c}"', n) for c, n in sorted(s["alarms"].items())],
        )
        m("cdc_verify_records", "records that are not of this source", "gauge",
          [(',class="foreign"', s["records"]["foreign"]), (',class="unidentified"', s["records"]["unidentified"])])  # fmt: skip
        m("cdc_verify_verified_through_lag_seconds", "how long the binlog head has been ahead of verified-through", "gauge",
          [("", s["verified_through_lag_s"])])  # fmt: skip
        vt, head = s["verified_through"], s["binlog_head"]
        if vt:
            m(
                "cdc_verify_verified_through_file_seq",
                "binlog file number of verified-through",
                "gauge",
                [("", file_sequence(vt["file"])[1])],
            )
            m("cdc_verify_verified_through_pos", "binlog position of verified-through", "gauge", [("", vt["pos"])])
        if head:
            m(
                "cdc_verify_binlog_head_file_seq",
                "binlog file number of the server's end",
                "gauge",
                [("", file_sequence(head["file"])[1])],
            )
            m("cdc_verify_binlog_head_pos", "binlog position of the server's end", "gauge", [("", head["pos"])])
            if vt and vt["file"] == head["file"]:
                m("cdc_verify_binlog_unverified_bytes", "bytes between verified-through and the head (same file)", "gauge",
                  [("", max(0, head["pos"] - vt["pos"]))])  # fmt: skip
        m(
            "cdc_verify_pending_events",
            "events read, no delivery yet, within grace",
            "gauge",
            [("", s["pending_events"])],
        )
        m(
            "cdc_verify_waiting_records",
            "records read whose binlog position is not read yet",
            "gauge",
            [("", s["waiting_records"])],
        )
        m("cdc_verify_xa_undecided", "XA prepare groups read without their outcome", "gauge", [("", s["xa_undecided"])])
        m(
            "cdc_verify_late_deliveries_total",
            "deliveries of events already called missing",
            "counter",
            [("", s["late_deliveries"])],
        )
        m("cdc_verify_order_violations_total", "records whose header position goes back in their partition", "counter",
          [("", s["order_violations"])])  # fmt: skip
        m("cdc_verify_batches_total", "micro-batches reconciled", "counter", [("", s["batches"])])
        if self.compensator is not None:  # continuous compensation (--repair)
            rp = s["repairs"]
            m("cdc_verify_repaired_total", "missing events re-published and then seen delivered", "counter",
              [("", rp["repaired"])])  # fmt: skip
            m("cdc_verify_repaired_out_of_order_total", "repaired events delivered after a later event of their key",
              "counter", [("", rp["repaired_out_of_order"])])  # fmt: skip
            m("cdc_verify_repair_published_total", "repairs handed to the sink", "counter", [("", rp["published"])])
            m("cdc_verify_repair_failed_total", "missing events that could not be repaired, by reason", "counter",
              [(f',reason="{r}"', n) for r, n in sorted(s["repair_failures"].items())] or [("", 0)])  # fmt: skip
            m("cdc_verify_repair_held", "missing events the relay has not checkpointed past (not repaired)", "gauge",
              [("", s["repair_held"])])  # fmt: skip
        if s["last_batch_at"]:  # absent until this process's first micro-batch
            age = time.time() - s["last_batch_at"]
            m("cdc_verify_last_batch_age_seconds", "since the last micro-batch", "gauge", [("", round(age, 3))])
        return "\n".join(lines) + "\n"

    def _start_http(self) -> None:
        job = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body, ctype, code = job.metrics_text().encode(), "text/plain; version=0.0.4", 200
                elif self.path.split("?")[0] in ("/healthz", "/"):
                    ok = job.error is None
                    body, ctype, code = (
                        (b"ok\n" if ok else f"failed: {job.error}\n".encode()),
                        "text/plain",
                        200 if ok else 503,
                    )
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: Any) -> None:
                pass

        try:
            self._http = OperatorHTTPServer((self.config.metrics_host, int(self.config.metrics_port or 0)), Handler)
        except OSError as exc:
            raise ValueError(f"cdc verify --follow: cannot serve metrics on {self.config.metrics_host}:{self.config.metrics_port}: "
                             f"{exc.strerror} (choose another --metrics-port)") from None  # fmt: skip
        self.metrics_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, name="follow-metrics", daemon=True).start()
        self.say(f"follow: metrics on http://{self.config.metrics_host}:{self.metrics_port}/metrics")

    # ------------------------------------------------------------------ report

    def write_report(self) -> VerifyReport | None:
        with self.lock:
            st = self.state
            if st is None:
                return None
            summary = follow_summary(st, self.lag_s, self.head)
            missing = [missing_entry(ev) for ev in st.open_verdicts.values() if ev.get("class") == "missing"]
            anomalies = list(st.anomalies)
        v = self.config.verify
        config = {**v.public(), "follow": {"grace_s": self.config.grace_s, "trigger_s": self.config.trigger_s,
                                           "checkpoint_dir": str(self.config.checkpoint), "start": self.config.start,
                                           "dedupe_window_s": self.config.dedupe_window_s}}  # fmt: skip
        inputs = {"mysql": redacted(v.mysql_options()), "mode": "follow",
                  "binlog": {"start": summary["follow"]["start"], "read_through": summary["follow"]["read_through"],
                             "head": summary["follow"]["binlog_head"]},
                  "kafka": {"bootstrap": v.kafka_bootstrap, "isolation": v.isolation,
                            "partitions": [{"topic": t, "partition": p, "next_offset": o} for (t, p), o in sorted(st.kafka_next.items())]}}  # fmt: skip
        rep = VerifyReport(summary=summary, inputs=inputs, config=config, anomalies=anomalies)
        write_outputs(rep, v.output_dir, iter(missing))
        self._last_report = time.monotonic()
        self.report = rep
        return rep

    # -------------------------------------------------------------------- run

    def failure(self) -> str | None:
        """The query's failure as one line (a source's own line when it is one)."""
        exc = self.query.exception() if self.query is not None else None
        if exc is None:
            return None
        text = str(exc)
        return source_error(exc) or next(
            (ln.strip() for ln in text.splitlines() if "cdc verify" in ln), text.splitlines()[0][:400]
        )

    def run_until(self, stop: Callable[[], bool], duration_s: float | None = None) -> None:
        t_end = time.monotonic() + duration_s if duration_s else None
        checked = 0.0
        while not stop() and (t_end is None or time.monotonic() < t_end):
            if time.monotonic() - checked >= 1.0:  # a call into the JVM: once a second is enough
                checked = time.monotonic()
                if not self.query.isActive:
                    self.error = self.failure() or "the streaming query stopped"
                    return
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self.compensator is not None:
            self.compensator.stop()
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:
                pass
        if self._clock is not None:
            self._clock.join(10)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        try:
            self.write_report()
        finally:
            if self._own_spark and self.spark is not None:
                try:
                    self.spark.stop()
                except Exception as exc:  # py4j's errors vary: the JVM is gone either way
                    # Ctrl-C in a terminal signals the whole process group: the JVM may be gone already
                    LOG.info("spark had already stopped (%s)", type(exc).__name__)


def latency_over_commit_time(by_second: dict[int, tuple[int, int]], buckets: int = 600) -> dict[str, Any]:
    """The batch report's `lag_over_time` (max latency per bucket of commit seconds, at
    most `buckets` points) from the follow state's per-second maxima."""
    t0 = min(by_second)
    bucket_s = max(1, -(-(max(by_second) - t0 + 1) // buckets))
    points: dict[int, list[int]] = {}
    for second, (worst, n) in by_second.items():
        p = points.setdefault(t0 + (second - t0) // bucket_s * bucket_s, [worst, 0])
        p[0] = max(p[0], worst)
        p[1] += n
    return {
        "bucket_seconds": bucket_s,
        "points": [{"commit_second": t, "max_latency_ms": w, "events": n} for t, (w, n) in sorted(points.items())],
    }


def follow_summary(st: FollowState, lag_s: float, head: tuple[str, int, int] | None) -> dict[str, Any]:
    """The report's summary (the batch verifier's keys) from the follow state."""
    lat = sorted(st.latencies)
    clocks = dict(st.latency_clocks)
    latency: dict[str, Any] = {
        "count": len(lat), "clocks": clocks,
        "clock": ("MySQL immediate_commit_timestamp (microseconds) -> broker timestamp"
                  if clocks.get("mysql_immediate_commit_timestamp") else
                  "outbox timestamp column (microseconds, set at the INSERT, read as UTC) -> broker timestamp"
                  if clocks.get("outbox_timestamp_column") else
                  "binlog commit event header (1 s resolution on MariaDB) -> broker timestamp"),
        "note": "of the last 100000 deliveries; from the binlog commit header a latency can be overstated by up to 1000 ms; "
                "from the outbox timestamp column it includes the rest of the writing transaction",
    }  # fmt: skip
    if lat:

        def q(p: float) -> int:
            return lat[min(len(lat) - 1, int(p * len(lat)))]

        latency.update(min_ms=lat[0], p50_ms=q(0.5), p95_ms=q(0.95), p99_ms=q(0.99), max_ms=lat[-1],
                       mean_ms=round(sum(lat) / len(lat), 1))  # fmt: skip
        lo, hi = lat[0], lat[-1]
        width = max(1, -(-(hi - lo + 1) // 40))
        bins: dict[int, int] = {}
        for x in lat:
            b = (x - lo) // width
            bins[b] = bins.get(b, 0) + 1
        latency["histogram"] = {
            "bin_width_ms": width,
            "bins": [{"from_ms": lo + b * width, "count": n} for b, n in sorted(bins.items())],
        }
    if st.latency_by_second:
        latency["lag_over_time"] = latency_over_commit_time(st.latency_by_second)
    vt = st.verified_through
    fu = None
    if st.txq:
        e = st.txq[0]
        fu = {"file": e[2], "pos": e[1], "row": 0}
    events_total = sum(st.counts.get(c, 0) for c in FOLLOW_CLASSES) - st.records["phantom"]
    return {
        "counts": dict(st.counts),
        "events_total": events_total,
        "records": dict(st.records),
        "unverifiable_reasons": dict(st.unverifiable_reasons),
        "dead_letter_causes": dict(st.dlq_causes),
        "altered_reasons": dict(st.altered_reasons),
        "examples": {k: list(v) for k, v in st.examples.items() if v},
        "order_violations": {"count": st.order_violations, "examples": []},
        "verified_through": {"file": vt[0], "pos": vt[2], "complete": not st.txq} if vt else None,
        "first_unproven": fu,
        "latency": latency,
        "truncated_partitions": [{"topic": t, "partition": p} for (t, p) in sorted(st.truncated)],
        "unverifiable_ranges": [],
        "follow": {
            "batches": st.batches,
            "start": {"file": st.start[0], "pos": st.start[2]} if st.start else None,
            "read_through": {"file": st.read_through[0], "pos": st.read_through[2]} if st.read_through else None,
            "binlog_head": {"file": head[0], "pos": head[2]} if head else None,
            "verified_through_lag_s": round(lag_s, 3),
            "grace_s": st.grace_s,
            "pending_events": len(st.pending),
            "waiting_records": len(st.waiting),
            "xa_undecided": len(st.xa_held),
            "late_deliveries": st.late_deliveries,
            "alarms": dict(st.alarms),
            "repairs": {**st.repairs, "failures": dict(st.repair_failures)},
            "lag_history": [{"t": round(t, 1), "lag_s": lag} for t, lag in list(st.lag_history)[-600:]],
        },
    }


def run_follow(config: FollowConfig, progress: Progress | None = None, stop: Callable[[], bool] | None = None,
               duration_s: float | None = None, spark: Any = None) -> tuple[int, FollowJob]:  # fmt: skip
    """Follow until `stop()` (or `duration_s`); (exit code, job): 0 no problem, 3 problems,
    2 the query failed (a person must fix something: the one line is in job.error)."""
    job = FollowJob(config, spark=spark, progress=progress)
    try:
        job.start()
        job.run_until(stop or (lambda: False), duration_s)
    finally:
        job.stop()
    if job.error:
        return 2, job
    return (3 if job.snapshot().get("problems") else 0), job
