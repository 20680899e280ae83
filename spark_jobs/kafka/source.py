"""PySpark Python data source `cdc_kafka`: the records of Kafka topics, read with a plain
confluent-kafka Consumer (assign + seek, no consumer group offsets are committed).

    spark.read.format("cdc_kafka")
        .option("bootstrap", "host:9092,...")
        .option("topics", "outbox.event.order,outbox.dlq")    # and/or
        .option("topic_pattern", r"outbox\\.event\\..*")      # a Python regex (fullmatch)
        .option("dlq_topic", "outbox.dlq")                    # decode its values as JSON
        .option("chunk", "100000")                            # offsets per Spark partition
        .option("plan", json.dumps(plan_kafka(...)))          # optional: a fixed snapshot
        .option("include_raw", "true")                        # headers map + value bytes
        .option("decode", "true")                             # identity + Avro columns
        .option("isolation", "read_committed")
        .option("consumer_conf", json.dumps({...}))           # [kafka.client] + [kafka.consumer]
        .load()

`consumer_conf` carries the relay's shared Kafka client settings (security, SASL, TLS;
`KafkaClientConfig.settings("consumer")`) to the executors, where every consumer is
built with `cdc.kafka_client.client_conf`. Spark redacts an option whose value names a
password or secret in its plans and UI (`spark.redaction.regex`).

Partitions: lists of `(topic, partition, [low, high))` offset ranges between the low and
high watermark of the plan, at most `chunk` offsets per Spark partition (a big Kafka
partition is split into ranges; small ones share one task and one consumer). A reader
stops at `high` or at the end of the partition. Offsets that hold no record (transaction markers, compacted records) are
simply absent; they are never losses.

Schema: `topic, partition, offset, timestamp_ms, timestamp_type, key` (binary),
`key_text`, then with include_raw `headers` (map<string,string>, UTF-8 text; the last
value wins for a repeated name) and `value` (binary), then with decode the identity
columns from the headers (`ikey`, `source`, `h_file`, `h_file_seq`, `h_pos`, `h_row`,
`h_gtid`, `h_commit_ts`, `h_event_id`, `h_event_type`, `h_table`, `repair`,
`dlq_cause`, `dlq_error`, `dlq_topic`; at the end `h_xa_prepare` with its `h_xa_file_seq`,
`h_xa_pos`: an XA transaction's prepare group) and the value decoded from the Confluent wire format
+ Avro `outbox_event.avsc` (`schema_id`, `v_id`, `v_aggregate_type`, `v_aggregate_id`,
`v_type`, `v_payload` binary + `v_payload_is_text`, `v_timestamp_us`, `value_error`), then
`v_format`: a payload format's name (header `cdc.format`, cdc/events/formats.py; null: the envelope).
A record of a payload format carries the payload as its value: `v_payload` is the value (for
`avro`, the payload decoded from its string/bytes schema or their union with null), `v_id` and
`v_type` come from the headers `id` and `cdc.event.type`, `v_aggregate_id` is the key,
`v_aggregate_type` and `v_timestamp_us` are null (the topic and the record timestamp hold them).
Dead-letter values (JSON) are not decoded into `v_*`; `value_error` says when they are
not JSON.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.kafka_client import client_conf
from spark_jobs.common import (
    DataSource,
    DataSourceReader,
    InputPartition,
    opt_bool,
    opt_int,
    opt_json,
    settle_worker,
)
from spark_jobs.records import BATCH_ROWS, DEFAULT_CHUNK, RecordColumns, chunks, schema_for


def consumer_config(
    bootstrap: str, extra: Mapping[str, Any] | None = None, isolation: str = "read_committed"
) -> dict[str, Any]:
    """The verifier's consumer: its defaults < `extra` (the relay's [kafka.client] and
    [kafka.consumer], from the `consumer_conf` option) < what reading needs."""
    defaults: dict[str, Any] = {
        "group.id": f"cdc-verify-{uuid.uuid4().hex[:12]}",
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 8_388_608,
        "queued.min.messages": 200_000,
        "socket.timeout.ms": 20_000,
        # librdkafka logs every failed connection attempt (errors at level 3, many a
        # second); every failure that matters reaches us as an error and is raised as one line
        "log_level": 2,
    }
    enforced = {
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
    }
    return client_conf(bootstrap, extra, defaults, enforced)


def kafka_consumer(bootstrap: str, extra: Mapping[str, Any] | None = None, isolation: str = "read_committed") -> Any:
    from confluent_kafka import Consumer

    return Consumer(consumer_config(bootstrap, extra, isolation))


def select_topics(
    available: Sequence[str], topics: Sequence[str] | None, pattern: str | None
) -> tuple[list[str], list[str]]:
    """(topics to read, requested topics that do not exist)."""
    wanted: list[str] = []
    missing: list[str] = []
    avail = set(available)
    for t in topics or ():
        if t in avail:
            wanted.append(t)
        else:
            missing.append(t)
    if pattern:
        rx = re.compile(pattern)
        wanted += [t for t in sorted(avail) if not t.startswith("__") and rx.fullmatch(t) and t not in wanted]
    return sorted(set(wanted)), sorted(set(missing))


def plan_kafka(
    bootstrap: str,
    topics: Sequence[str] | None = None,
    pattern: str | None = None,
    extra: Mapping[str, Any] | None = None,
    timeout: float = 15.0,
) -> dict[str, Any]:
    """A snapshot of what to read: every partition of the selected topics with its low and
    high watermark now."""
    from confluent_kafka import KafkaException, TopicPartition

    consumer = kafka_consumer(bootstrap, extra)
    try:
        try:
            md = consumer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise RuntimeError(
                f"cdc_kafka: cannot list the topics of {bootstrap} within {timeout:.0f}s: {exc.args[0].str()} (check the bootstrap servers)"
            ) from None
        names, missing = select_topics(list(md.topics), topics, pattern)
        parts = []
        counts = {}
        for name in names:
            tmd = md.topics[name]
            if tmd.error is not None:
                raise RuntimeError(f"cdc_kafka: topic {name!r}: {tmd.error}")
            counts[name] = len(tmd.partitions)
            for p in sorted(tmd.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=timeout, cached=False)
                parts.append({"topic": name, "partition": p, "low": int(low), "high": int(high)})
    finally:
        consumer.close()
    return {
        "bootstrap": bootstrap,
        "partitions": parts,
        "partition_counts": counts,
        "missing_topics": missing,
        "at_ms": int(time.time() * 1000),
    }


def consume_range(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    extra: Mapping[str, Any] | None = None,
    isolation: str = "read_committed",
    stall_timeout: float = 60.0,
) -> Iterator[Any]:
    """The messages of `topic[partition]` at offsets `[start, end)`, in offset order."""
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    consumer = kafka_consumer(bootstrap, extra, isolation)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        last_progress = time.monotonic()
        while True:
            msgs = consumer.consume(num_messages=5_000, timeout=0.2)
            if not msgs:
                if time.monotonic() - last_progress > stall_timeout:
                    raise RuntimeError(
                        f"cdc_kafka: no progress reading {topic}[{partition}] offsets [{start}, {end}) "
                        f"for {stall_timeout:.0f}s from {bootstrap}"
                    )
                continue
            last_progress = time.monotonic()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    if err.retriable() or not err.fatal():
                        continue
                    raise RuntimeError(f"cdc_kafka: reading {topic}[{partition}]: {err}")
                off = msg.offset()
                if off >= end:
                    return
                if off < start:
                    continue
                yield msg
                if off >= end - 1:
                    return
    finally:
        consumer.close()


def scan_partitions(
    bootstrap: str,
    parts: Sequence[Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
    isolation: str = "read_committed",
    stall_timeout: float = 60.0,
) -> Iterator[Any]:
    """The messages of many `{topic, partition, low, high}` ranges through ONE consumer
    (order is per partition only) - for header scans such as `cdc locate`."""
    from confluent_kafka import KafkaError, TopicPartition

    todo = {(p["topic"], p["partition"]): (int(p["low"]), int(p["high"])) for p in parts if p["high"] > p["low"]}
    if not todo:
        return
    consumer = kafka_consumer(bootstrap, extra, isolation)
    try:
        consumer.assign(
            [
                TopicPartition(p["topic"], p["partition"], p["low"])
                for p in parts
                if (p["topic"], p["partition"]) in todo
            ]
        )
        last_progress = time.monotonic()
        while todo:
            msgs = consumer.consume(num_messages=5_000, timeout=0.2)
            if not msgs:
                if time.monotonic() - last_progress > stall_timeout:
                    raise RuntimeError(
                        f"cdc_kafka: no progress scanning {sorted(todo)[:5]} for {stall_timeout:.0f}s from {bootstrap}"
                    )
                continue
            last_progress = time.monotonic()
            for msg in msgs:
                tp = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.pop(tp, None)
                        continue
                    if err.retriable() or not err.fatal():
                        continue
                    raise RuntimeError(f"cdc_kafka: scanning {tp}: {err}")
                bounds = todo.get(tp)
                if bounds is None or not bounds[0] <= msg.offset() < bounds[1]:
                    continue
                high = bounds[1]
                yield msg
                if msg.offset() >= high - 1:
                    todo.pop(tp, None)
                    # no more fetches for it: records past `high` (a busy topic has them) would
                    # be fetched and thrown away while the other partitions finish
                    consumer.pause([TopicPartition(tp[0], tp[1])])
    finally:
        consumer.close()


def aborted_records(
    bootstrap: str,
    parts: Sequence[Mapping[str, Any]],
    committed: Mapping[tuple[str, int], int],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Records that sat in aborted transactions (transactional delivery aborted them;
    read_committed readers never see them): per partition, what a read_uncommitted
    consumer reads of [low, high) minus `committed`, what read_committed read. An
    operator sees that aborts happened and were harmless. Only partitions whose offset
    range is larger than what was read are scanned (transaction markers, aborted records,
    compaction): a topic written without transactions costs nothing here."""
    gaps = [p for p in parts if int(p["high"]) - int(p["low"]) > committed.get((p["topic"], p["partition"]), 0)]
    uncommitted: dict[tuple[str, int], int] = {}
    for msg in scan_partitions(bootstrap, gaps, extra, isolation="read_uncommitted"):
        tp = (msg.topic(), msg.partition())
        uncommitted[tp] = uncommitted.get(tp, 0) + 1
    per = {
        f"{t}[{p}]": n - committed.get((t, p), 0)
        for (t, p), n in sorted(uncommitted.items())
        if n > committed.get((t, p), 0)
    }
    return {"count": sum(per.values()), "partitions": per}


# ----------------------------------------------------------------------- data source


class KafkaReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.include_raw = opt_bool(self.options, "include_raw", True)
        self.decode = opt_bool(self.options, "decode", True)

    def _bootstrap(self) -> str:
        bootstrap = self.options.get("bootstrap") or self.options.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ValueError("cdc_kafka: option 'bootstrap' (bootstrap servers) is required")
        return bootstrap

    def partitions(self) -> Sequence[InputPartition]:
        plan = opt_json(self.options, "plan")
        if plan is None:
            topics = [t.strip() for t in (self.options.get("topics") or "").split(",") if t.strip()]
            plan = plan_kafka(
                self._bootstrap(),
                topics,
                self.options.get("topic_pattern") or None,
                opt_json(self.options, "consumer_conf", {}),
            )
        parts = chunks(plan, opt_int(self.options, "chunk", DEFAULT_CHUNK) or DEFAULT_CHUNK)
        return [InputPartition(p) for p in parts] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        part = partition.value
        if part is None:
            return
        cols = RecordColumns(self.include_raw, self.decode, self.options.get("dlq_topic") or None)
        add = cols.add
        for msg in scan_partitions(
            self._bootstrap(),
            part,
            opt_json(self.options, "consumer_conf", {}),
            self.options.get("isolation") or "read_committed",
        ):
            add(msg)
            if cols.n >= BATCH_ROWS:
                yield cols.take()
        if cols.n:
            yield cols.take()


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_kafka"

    def schema(self) -> str:
        return schema_for(opt_bool(self.options, "include_raw", True), opt_bool(self.options, "decode", True))

    def reader(self, schema: Any) -> KafkaReader:
        return KafkaReader(self.options)
