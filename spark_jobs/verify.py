"""`cdc verify`: prove, position by position, that every committed outbox event of the
binlog was delivered to Kafka exactly once and in order per key - or list what was not.

API for the CLI::

    from spark_jobs.verify import VerifyConfig, run_verify
    report = run_verify(VerifyConfig(mysql={...}, source="shop-db", tables=(OutboxTable(...),),
                                     kafka_bootstrap="host:9092"), progress=print)
    report.ok, report.counts, report.to_json(), report.json_path, report.html_path
    report.missing_events()   # for `cdc repair`: full binlog coordinates of each missing event

As a Spark application (the same code; the master given to spark-submit wins)::

    spark-submit --master spark://host:7077 spark_jobs/verify.py --config verify.toml

Order of the snapshot: the binlog end position is taken first, the Kafka high
watermarks second, so every event in the verified range had its chance to be delivered
before the topics are read. Events committed within the last moments before the
snapshot may still be in flight in a running relay: verify through an `end_position`
the relay has passed (or re-run) before calling them missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import string
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc.errors import NeedsOperator
from cdc.events.outbox import OutboxTable
from cdc.position import file_sequence
from cdc.tls import TLS_KEYS
from spark_jobs.common import redacted
from spark_jobs.kafka.source import aborted_records, plan_kafka
from spark_jobs.mysql.binlog_plan import plan_binlog, split_ranges
from spark_jobs.mysql.binlog_rows import KIND_ANOMALY, KIND_EVENT, KIND_XA_COMMIT, KIND_XA_ROLLBACK, KIND_XA_ROW
from spark_jobs.mysql.binlog_source import BINLOG_READERS, tables_to_json
from spark_jobs.reconcile import reconcile
from spark_jobs.reconcile_rules import ReconcileContext
from spark_jobs.reconcile_summary import missing_entry, summarize
from spark_jobs.report import VerifyReport, write_outputs
from spark_jobs.session import build_spark, register_sources
from spark_jobs.sink_read import sink_read

Progress = Callable[[str], None]
MIN_SPLIT_BYTES = 4 << 20  # smaller binlog pieces cost more in task and connection set-up than they save
BINLOG_JOB_GROUP = "cdc-verify-binlog"
KAFKA_JOB_GROUP = "cdc-verify-kafka"


@dataclass(frozen=True)
class VerifyConfig:
    mysql: Mapping[str, Any]  # host, port, user, password (never printed)
    source: str
    tables: tuple[OutboxTable, ...]
    kafka_bootstrap: str
    topics: tuple[str, ...] = ()  # topics to read; with no topics and no pattern: derived from the templates
    topic_pattern: str | None = None  # a Python regex (fullmatch) of topics to read
    dlq_topic: str = "outbox.dlq"
    spark_master: str = "local[*]"
    output_dir: str = "verify-report"
    start_file: str | None = None  # verify from this binlog file (default: the oldest on the server)
    end_position: str | None = None  # verify up to `file:pos` (default: the server's position now)
    topic_allowlist: tuple[str, ...] = ()  # the relay's allowlist (topic_not_allowed goes to the DLQ)
    partitioner: str = "murmur2"  # how the relay partitions by key; "unknown" when not murmur2
    max_examples: int = 20
    kafka_chunk: int = 100_000  # offsets per Spark partition
    isolation: str = "read_committed"
    consumer_conf: Mapping[str, Any] = field(default_factory=dict)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    server_id_base: int | None = None  # replication server ids used: base .. base + files - 1
    check_table: bool = False  # also read the outbox table (rows kept) and count rows not in the binlog
    # How the binlog is decoded. "default": python-mysql-replication - a decoder of its
    # own, independent of the relay's (a decoder bug cannot hide itself). "fast": the
    # relay's own reader (connectors.mysql.binlog_protocol + connectors.mysql.binlog_decoder), several
    # times faster but NOT independent of the relay's reading path; the verifier's own
    # transaction assembly is used either way. Opt in only when speed matters more.
    binlog_reader: str = "default"
    # Binlog files are cut at transaction starts into pieces of about this many bytes,
    # one Spark task each (more tasks than files: more cores finish sooner). None: about
    # three pieces per core; 0: one task per file.
    binlog_split_bytes: int | None = None
    # A sink other than Kafka (docs/sinks.md): its Spark data source's format and options
    # (`cdc_rabbitmq`: host, port, vhost, user, password, tls; `cdc_nats`: servers, user,
    # password or token; both: ca_file, cert_file, key_file; never printed); empty: the Kafka topics.
    sink: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"VerifyConfig(mysql={redacted(self.mysql)!r}, source={self.source!r}, "
            f"tables={[t.qualified_name for t in self.tables]!r}, kafka_bootstrap={self.kafka_bootstrap!r}, "
            f"topics={self.topics!r}, topic_pattern={self.topic_pattern!r}, dlq_topic={self.dlq_topic!r}, "
            f"spark_master={self.spark_master!r}, output_dir={self.output_dir!r})"
        )

    __str__ = __repr__

    def mysql_options(self) -> dict[str, str]:
        m = self.mysql
        return {
            "host": str(m.get("host", "127.0.0.1")),
            "port": str(m.get("port", 3306)),
            "user": str(m.get("user", "root")),
            "password": str(m.get("password", m.get("passwd", "")) or ""),
            **{key: str(m[key]) for key in TLS_KEYS if m.get(key)},  # TLS to MySQL (cdc/tls.py)
        }

    def public(self) -> dict[str, Any]:
        """The configuration as shown in the report (no password)."""
        return {
            "mysql": redacted(self.mysql),
            "source": self.source,
            "tables": [{"schema": t.schema, "table": t.table, "topic": t.topic} for t in self.tables],
            # the Kafka address only when Kafka was read: another sink is named by `sink_read`
            **({"sink_read": sink_description(self.sink)} if self.sink else {"kafka_bootstrap": self.kafka_bootstrap}),
            "topics": list(self.topics),
            "topic_pattern": self.effective_pattern(),
            "dlq_topic": self.dlq_topic,
            "spark_master": self.spark_master,
            "start_file": self.start_file,
            "end_position": self.end_position,
            "topic_allowlist": list(self.topic_allowlist),
            "partitioner": self.partitioner,
            "binlog_reader": self.binlog_reader,
            "sink": self.sink.get("format", "cdc_kafka"),
        }

    @property
    def payload_formats(self) -> bool:
        """Some table is written in a payload format (cdc/events/formats.py)."""
        return any(t.format != "envelope" for t in self.tables)

    def effective_pattern(self) -> str | None:
        if self.topic_pattern or self.topics:
            return self.topic_pattern
        return template_pattern([t.topic for t in self.tables])


def sink_description(sink: Mapping[str, str]) -> dict[str, Any]:
    """A sink other than Kafka as the report names it: its kind, addresses and user, never
    a password or token (a NATS URL's user:password part is left out too)."""
    fmt = sink.get("format", "")
    if fmt == "cdc_rabbitmq":
        return {"kind": "rabbitmq_stream", "address": f"{sink.get('host')}:{sink.get('port')}",
                "vhost": sink.get("vhost", "/"), "user": sink.get("user", "")}  # fmt: skip
    if fmt == "cdc_nats":
        servers = [re.sub(r"//[^/@]*@", "//", s) for s in str(sink.get("servers", "")).split(",") if s]
        return {"kind": "nats_jetstream", "servers": servers, "user": sink.get("user", "")}
    return {"kind": fmt}


def read_inputs(
    config: VerifyConfig,
    kplan: Mapping[str, Any],
    per_partition: Mapping[tuple[str, int], tuple[int, Any, Any]],
    read_topics: set[str],
    unread: Sequence[str],
) -> dict[str, Any]:
    """The report's inputs for what was read besides the binlog: `kafka` (bootstrap,
    isolation) for Kafka, `sink` (kind, addresses, streams) for another sink."""
    read = {
        "snapshot_at_ms": kplan["at_ms"],
        "requested_topics_absent": [t for t in kplan["missing_topics"] if t != config.dlq_topic or t in config.topics],
        "dlq_topic_present": config.dlq_topic in read_topics,
        "expected_topics_not_read": list(unread),
        "partitions": [
            {
                **p,
                "records_read": per_partition.get((p["topic"], p["partition"]), (0, None, None))[0],
                "first_offset_read": per_partition.get((p["topic"], p["partition"]), (0, None, None))[1],
                "last_offset_read": per_partition.get((p["topic"], p["partition"]), (0, None, None))[2],
            }
            for p in kplan["partitions"]
        ],
    }
    if config.sink:
        streams = sorted({str(p.get("stream") or p["topic"]) for p in kplan["partitions"]})
        return {"sink": {**sink_description(config.sink), "streams": streams, **read}}
    return {"kafka": {"bootstrap": config.kafka_bootstrap, "isolation": config.isolation, **read}}


def template_pattern(templates: Sequence[str]) -> str:
    """A regex of every legal topic a topic template can render to."""
    alts = []
    for template in templates:
        parts = []
        for literal, fieldname, _spec, _conv in string.Formatter().parse(template):
            parts.append(re.escape(literal))
            if fieldname is not None:
                parts.append(r"[A-Za-z0-9._-]+")
        alts.append("".join(parts))
    return "|".join(f"(?:{a})" for a in sorted(set(alts)))


def _topic_selected(topic: str, config: VerifyConfig) -> bool:
    if topic in config.topics or topic == config.dlq_topic:
        return True
    pattern = config.effective_pattern()
    return bool(pattern and re.fullmatch(pattern, topic))


def local_cores(master: str) -> int | None:
    """The cores of a `local[N]` / `local[*]` / `local` master (None for a cluster, or
    under spark-submit, where the command line's master wins)."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", (master or "").strip())
    if not m:
        return None
    if m.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))


class ReadFailed(NeedsOperator):
    """Planning or reading a source failed (the server is unreachable, a grant is missing
    ...); the message is the source's own one line (no password), not Spark's stack traces."""


def source_error(exc: BaseException) -> str | None:
    """The one-line error a cdc_* data source raised inside a Spark task, if it did."""
    m = re.search(r"\b(cdc_(?:binlog|kafka|outbox_table|nats|rabbitmq): [^\n]*)", str(exc))
    return m.group(1).strip() if m else None


@contextmanager
def _one_line_source_errors() -> Iterator[None]:
    """Planning or reading: a source's own one-line error becomes ReadFailed (no Spark
    stack traces); anything else passes unchanged."""
    try:
        yield
    except Exception as exc:
        reason = source_error(exc)
        if reason:
            raise ReadFailed(reason) from None
        raise


def _read_binlog(
    spark: Any, config: VerifyConfig, bplan: Mapping[str, Any], range_plan: Callable[[], dict[str, Any]],
    say: Progress, timings: dict[str, float],
) -> tuple[Any, dict[str, tuple[int, int]], list[str], set[str], bool]:  # fmt: skip
    """The binlog's rows, read into Spark's cache by one job, and per file: (events,
    anomalies), the anomaly texts, the topics the events expect, and whether any XA
    prepare or outcome was read."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t = time.monotonic()
    rplan = range_plan()
    events_all = (
        spark.read.format("cdc_binlog")
        .options(**config.mysql_options())
        .option("source", config.source)
        .option("tables", tables_to_json(config.tables))
        .option("topic_allowlist", json.dumps(list(config.topic_allowlist)))
        .option("binlog_reader", config.binlog_reader)
        .option("plan", json.dumps(rplan))
        .load()
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    n_ranges = len(rplan.get("ranges") or bplan["files"])
    say(
        f"binlog: reading {len(bplan['files'])} file(s) in {n_ranges} range(s) through "
        f"{bplan['range_end']['file']}:{bplan['range_end']['pos']} ({config.binlog_reader} reader)"
    )
    per_file: dict[str, tuple[int, int]] = {}
    anomalies: list[str] = []
    expected_topics: set[str] = set()
    xa_rows = 0
    spark.sparkContext.setJobGroup(BINLOG_JOB_GROUP, "cdc verify: read the binlog", interruptOnCancel=True)
    kind = F.col("kind")
    row_like = kind.isin(KIND_EVENT, KIND_XA_ROW)  # events, and XA rows that may become events
    for r in events_all.groupBy("file").agg(
        F.count(F.when(row_like, 1)).alias("n"),
        F.slice(F.collect_list(F.when(kind == KIND_ANOMALY, F.col("dlq_error"))), 1, 200).alias("anomalies"),
        F.count(F.when(kind == KIND_ANOMALY, 1)).alias("n_anomalies"),
        F.count(F.when(kind.isin(KIND_XA_ROW, KIND_XA_COMMIT, KIND_XA_ROLLBACK), 1)).alias("n_xa"),
        F.collect_set(F.when(row_like & F.col("dlq_cause").isNull(), F.col("expected_topic"))).alias("topics"),
    ).collect():  # fmt: skip
        per_file[r["file"]] = (r["n"], r["n_anomalies"])
        anomalies += [f"{r['file']}: {a}" for a in r["anomalies"]]
        expected_topics.update(r["topics"])
        xa_rows += r["n_xa"]
    timings["read_binlog"] = time.monotonic() - t
    return events_all, per_file, anomalies, expected_topics, xa_rows > 0


def _read_kafka(
    spark: Any,
    config: VerifyConfig,
    kplan: Mapping[str, Any],
    binlog_read: Future,
    say: Progress,
    timings: dict[str, float],
) -> tuple[Any, dict[tuple[str, int], tuple[int, int, int]]]:
    """The topics' records, read into Spark's cache by one job submitted after the binlog's
    (see run_verify), and per partition: (records, first offset, last offset)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t = time.monotonic()
    records = (
        spark.read.format("cdc_kafka")
        .option("bootstrap", config.kafka_bootstrap)
        .option("isolation", config.isolation)
        .option("consumer_conf", json.dumps(dict(config.consumer_conf)))
        .option("plan", json.dumps(kplan))
        .option("dlq_topic", config.dlq_topic)
        .option("chunk", str(config.kafka_chunk))
        .option("include_raw", "false")
        .option("decode", "true")
        .load()
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    stats = records.groupBy("topic", "partition").agg(
        F.count(F.lit(1)).alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi")
    )
    # queue behind the binlog's job: wait until it is submitted (or its thread is done)
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while not binlog_read.done() and not tracker.getJobIdsForGroup(BINLOG_JOB_GROUP) and time.monotonic() < deadline:
        time.sleep(0.05)
    say(f"kafka: reading {len(kplan['partitions'])} partition(s) of {len(kplan['partition_counts'])} topic(s)")
    spark.sparkContext.setJobGroup(KAFKA_JOB_GROUP, "cdc verify: read the topics", interruptOnCancel=True)
    per_partition = {(r["topic"], r["partition"]): (r["n"], r["lo"], r["hi"]) for r in stats.collect()}
    timings["read_kafka"] = time.monotonic() - t
    return records, per_partition


def run_verify(config: VerifyConfig, progress: Progress | None = None, spark: Any = None) -> VerifyReport:
    """Plan, read, reconcile and report. Writes report.json, report.html and
    missing.jsonl into `config.output_dir`. A Spark session is created (and stopped at
    the end) unless one is passed in."""
    say = progress or (lambda _msg: None)
    if config.binlog_reader not in BINLOG_READERS:
        raise ValueError(f"binlog_reader must be one of {BINLOG_READERS}, got {config.binlog_reader!r}")
    timings: dict[str, float] = {}
    t_all = time.monotonic()

    t = time.monotonic()
    say("binlog: planning (SHOW BINARY LOGS)")
    settings = config.mysql_options()
    settings_typed = {**settings, "port": int(settings["port"])}
    with _one_line_source_errors():
        bplan = plan_binlog(settings_typed, config.start_file, config.end_position, config.server_id_base)
        if config.sink:
            kplan = {}  # planned once the binlog names the topics (sink_read)
        else:
            say(f"kafka: planning (watermarks of {config.topics or config.effective_pattern()} + {config.dlq_topic})")
            kplan = plan_kafka(
                config.kafka_bootstrap,
                list(config.topics) + [config.dlq_topic],
                config.effective_pattern(),
                config.consumer_conf,
            )
    timings["plan"] = time.monotonic() - t

    def ranges(cores: int) -> dict[str, Any]:
        split = config.binlog_split_bytes
        if split is None:
            total = sum(f["end"] - f["start"] for f in bplan["files"])
            split = max(MIN_SPLIT_BYTES, total // max(1, 3 * cores))
        return split_ranges(settings_typed, bplan, split) if split else bplan

    own_spark = spark is None
    early = None
    if own_spark:
        cores = local_cores(config.spark_master)
        if cores:  # cut the binlog into ranges (SHOW BINLOG EVENTS) while the JVM starts
            early = ThreadPoolExecutor(1, thread_name_prefix="binlog-ranges").submit(ranges, cores)
        say(f"spark: starting ({config.spark_master})")
        spark = build_spark(config.spark_master, "cdc-verify", config.spark_conf)
    else:
        register_sources(spark)  # a session made elsewhere may not know cdc_binlog / cdc_kafka
    try:
        from pyspark.sql import functions as F

        # The two reads run as concurrent Spark jobs: the topics' tasks fill the cores the
        # binlog's last tasks leave idle, and each side's planning overlaps the other's
        # reading. The binlog job is submitted first: its tasks are the longer ones, and
        # FIFO scheduling runs a job's tasks before those of a job submitted after it.
        def range_plan() -> dict[str, Any]:
            if early is not None and spark.sparkContext.defaultParallelism == local_cores(config.spark_master):
                return early.result()
            return ranges(spark.sparkContext.defaultParallelism)

        t = time.monotonic()
        if config.sink:
            with _one_line_source_errors():
                events_all, per_file, anomalies, expected_topics, has_xa = _read_binlog(
                    spark, config, bplan, range_plan, say, timings
                )
                kplan, records, per_partition = sink_read(spark, config, expected_topics, say, timings)
        else:
            with _one_line_source_errors(), ThreadPoolExecutor(2, thread_name_prefix="cdc-read") as pool:
                binlog_read = pool.submit(_read_binlog, spark, config, bplan, range_plan, say, timings)
                kafka_read = pool.submit(_read_kafka, spark, config, kplan, binlog_read, say, timings)
                try:
                    events_all, per_file, anomalies, expected_topics, has_xa = binlog_read.result()
                    records, per_partition = kafka_read.result()
                except BaseException:
                    spark.sparkContext.cancelJobGroup(BINLOG_JOB_GROUP)
                    spark.sparkContext.cancelJobGroup(KAFKA_JOB_GROUP)
                    raise
        timings["read"] = time.monotonic() - t

        read_topics = set(kplan["partition_counts"])
        unread = tuple(sorted(t for t in expected_topics if t not in read_topics and not _topic_selected(t, config)))

        rs, re_ = bplan["range_start"], bplan["range_end"]
        ctx = ReconcileContext(
            source=config.source,
            dlq_topic=config.dlq_topic,
            range_start=(rs["file"], file_sequence(rs["file"])[1], rs["pos"]),
            range_end=(re_["file"], file_sequence(re_["file"])[1], re_["pos"]),
            partitions=tuple((p["topic"], p["partition"], p["low"], p["high"]) for p in kplan["partitions"]),
            partition_counts=dict(kplan["partition_counts"]),
            unread_topics=unread,
            partitioner=config.partitioner,
            has_xa=has_xa,
            payload_formats=config.payload_formats,
            routed_stream=next((p["topic"] for p in kplan["partitions"] if p.get("routed")), ""),
        )
        t = time.monotonic()
        say("reconcile: joining and classifying")
        rc = reconcile(events_all, records, ctx)
        summary = summarize(rc, max_examples=config.max_examples)
        timings["reconcile"] = time.monotonic() - t

        if config.check_table:
            summary["outbox_table"] = _check_table(spark, settings, config, events_all)
        if config.isolation == "read_committed" and not config.sink:  # Kafka transactions: what aborts left behind
            summary["aborted_records"] = aborted_records(
                config.kafka_bootstrap,
                kplan["partitions"],
                {tp: n for tp, (n, _first, _last) in per_partition.items()},
                config.consumer_conf,
            )

        inputs = {
            "mysql": redacted(settings_typed),
            "binlog": {
                "server_id": bplan["server_id"],
                "oldest_file_on_server": bplan["oldest_file"],
                "gtid_binlog_pos": bplan["gtid_binlog_pos"],
                "range_start": rs,
                "range_end": re_,
                "files": [
                    {**f, "events": per_file.get(f["file"], (0, 0))[0], "anomalies": per_file.get(f["file"], (0, 0))[1]}
                    for f in bplan["files"]
                ],
            },
            **read_inputs(config, kplan, per_partition, read_topics, unread),
        }
        report = VerifyReport(
            summary=summary, inputs=inputs, config=config.public(), timings=timings, anomalies=anomalies
        )
        say("report: writing")
        missing_rows = (
            (
                missing_entry(r)
                for r in rc.events.filter(F.col("class") == "missing")
                .orderBy("file_seq", "tx_pos", "row")
                .toLocalIterator()
            )
            if summary["counts"]["missing"]
            else iter(())
        )
        timings["total"] = time.monotonic() - t_all
        write_outputs(report, config.output_dir, missing_rows)
        rc.unpersist()
        events_all.unpersist()
        records.unpersist()
        say("report: written")  # its paths are in the summary's last line
        return report
    finally:
        if own_spark:
            spark.stop()


def _check_table(spark: Any, settings: Mapping[str, str], config: VerifyConfig, events: Any) -> dict[str, Any]:
    """Rows still in the outbox table(s) vs. events of the binlog (informational: rows
    written before the oldest binlog are expected to be absent from it)."""
    from pyspark.sql import functions as F

    out = {}
    ev = events.filter(F.col("kind").isin(KIND_EVENT, KIND_XA_ROW)).select("table", "event_id").distinct()
    for table in config.tables:
        rows = spark.read.format("cdc_outbox_table").options(**settings).option("table", tables_to_json([table])).load()
        total = rows.count()
        absent = rows.join(ev, ["table", "event_id"], "left_anti")
        out[table.qualified_name] = {
            "rows": total,
            "rows_not_in_binlog": absent.count(),
            "examples": [r["event_id"] for r in absent.limit(config.max_examples).collect()],
        }
    return out


# ----------------------------------------------------------------------------- CLI


def _consumer_conf(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`[kafka.consumer_conf]` of a verify.toml: librdkafka settings; a secret comes from
    `"<key>_env"` (an environment variable's name), never from the file."""
    from cdc.kafka_client import is_secret_key

    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key.endswith("_env") and is_secret_key(key[:-4]):
            if value not in os.environ:
                raise ValueError(f"kafka.consumer_conf.{key} names the environment variable {value}, which is not set")
            out[key[:-4]] = os.environ[value]
        elif is_secret_key(key):
            raise ValueError(f'kafka.consumer_conf.{key} must not be written in the file; use "{key}_env"')
        else:
            out[key] = value
    return out


def load_config(path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None) -> VerifyConfig:
    """A VerifyConfig from a JSON or TOML file::

    source = "shop-db"
    dlq_topic = "outbox.dlq"
    output_dir = "verify-report"
    [mysql]
    host = "127.0.0.1"
    port = 3306
    user = "cdc"
    password_env = "CDC_MYSQL_PASSWORD"   # or password = "..."
    [kafka]
    bootstrap = "127.0.0.1:9092"
    topics = ["outbox.event.order"]        # or topic_pattern = "outbox\\\\.event\\\\..*"
    [[outbox.tables]]
    schema = "shop"
    table = "outbox"
    topic = "outbox.event.{aggregate_type}"
    """
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".toml"):
        import tomllib

        data = tomllib.loads(text)
    else:
        data = json.loads(text)
    data.update(overrides or {})
    mysql = dict(data.get("mysql", {}))
    env = mysql.pop("password_env", None)
    if env:
        mysql["password"] = os.environ.get(env, "")
    kafka = data.get("kafka", {})
    tables_raw = data.get("tables") or (data.get("outbox") or {}).get("tables") or []
    bootstrap = kafka.get("bootstrap") or data.get("kafka_bootstrap")
    if not bootstrap:
        raise NeedsOperator(f"{path}: kafka.bootstrap is missing: name the Kafka brokers to read the topics from")
    return VerifyConfig(
        mysql=mysql,
        source=data["source"],
        tables=tuple(OutboxTable(**t) for t in tables_raw),
        kafka_bootstrap=bootstrap,
        topics=tuple(kafka.get("topics") or data.get("topics") or ()),
        topic_pattern=kafka.get("topic_pattern") or data.get("topic_pattern"),
        dlq_topic=data.get("dlq_topic") or kafka.get("dlq_topic") or "outbox.dlq",
        spark_master=data.get("spark_master", "local[*]"),
        output_dir=data.get("output_dir", "verify-report"),
        start_file=data.get("start_file"),
        end_position=data.get("end_position"),
        topic_allowlist=tuple(data.get("topic_allowlist") or ()),
        partitioner=data.get("partitioner", "murmur2"),
        max_examples=int(data.get("max_examples", 20)),
        kafka_chunk=int(data.get("kafka_chunk", 100_000)),
        isolation=data.get("isolation", "read_committed"),
        consumer_conf=_consumer_conf(kafka.get("consumer_conf") or {}),
        spark_conf=dict(data.get("spark_conf") or {}),
        server_id_base=data.get("server_id_base"),
        check_table=bool(data.get("check_table", False)),
        binlog_reader=str(data.get("binlog_reader", "default")),
        binlog_split_bytes=None if data.get("binlog_split_bytes") is None else int(data["binlog_split_bytes"]),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cdc-verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="JSON or TOML verify configuration")
    parser.add_argument("--output-dir", help="where report.json / report.html / missing.jsonl go")
    parser.add_argument("--master", help="Spark master (ignored under spark-submit, whose --master wins)")
    parser.add_argument("--end-position", help="verify up to file:pos")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    if args.master:
        overrides["spark_master"] = args.master
    if args.end_position:
        overrides["end_position"] = args.end_position
    try:
        config = load_config(args.config, overrides)
        report = run_verify(config, progress=None if args.quiet else (lambda m: print(m, file=sys.stderr)))
    except Exception as exc:
        print(f"cdc verify: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary_text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
