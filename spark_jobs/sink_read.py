"""`cdc verify` on a sink other than Kafka (docs/sinks.md): the plan and the read of its
Spark data source, into the same columns as the Kafka topics' (`records.fields_for`),
so reconcile reads every sink alike.

Unlike Kafka's, these brokers' topics are planned after the binlog is read: RabbitMQ 3.10's
stream protocol cannot list streams, so the topics to read are those the binlog's events
name, the configured ones and the dead-letter topic (JetStream adds the subjects its streams
hold that match the tables' topic templates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def sink_plan(fmt: str, options: Mapping[str, str], topics: list[str], pattern: str | None = None) -> dict[str, Any]:
    """The snapshot of what `fmt`'s source reads: partitions with [low, high) ranges,
    partition counts, missing topics (as `kafka_source.plan_kafka`). `pattern`: also the
    subjects matching it (JetStream can list its streams' subjects; RabbitMQ 3.10 cannot)."""
    if fmt == "cdc_nats":
        from spark_jobs.nats.source import plan_nats_matching
        from spark_jobs.nats.source import settings_from_options as nats_settings

        return plan_nats_matching(nats_settings(options), topics, pattern)
    if fmt == "cdc_rabbitmq":
        from spark_jobs.rabbitmq.source import DEFAULT_EMPTY_WAIT, plan_rabbitmq, settings_from_options

        return plan_rabbitmq(
            settings_from_options(options), topics, float(options.get("empty_wait") or DEFAULT_EMPTY_WAIT)
        )
    raise ValueError(f"cdc verify: no sink data source {fmt!r}")


def sink_read(
    spark: Any, config: Any, expected_topics: Iterable[str], say: Callable[[str], None], timings: dict[str, float]
) -> tuple[dict[str, Any], Any, dict[tuple[str, int], tuple[int, int, int]]]:
    """(plan, the records cached, per partition (records, first offset, last offset))."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    t = time.monotonic()
    fmt = config.sink["format"]
    options = {k: v for k, v in config.sink.items() if k != "format"}
    topics = sorted(set(config.topics) | set(expected_topics) | {config.dlq_topic})
    say(f"{fmt}: planning {len(topics)} topic(s)")
    plan = sink_plan(fmt, options, topics, config.effective_pattern())
    records = (
        spark.read.format(fmt)
        .options(**options)
        .option("plan", json.dumps(plan))
        .option("dlq_topic", config.dlq_topic)
        .option("include_raw", "false")
        .option("decode", "true")
        .load()
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    say(f"{fmt}: reading {len(plan['partitions'])} partition(s) of {len(plan['partition_counts'])} topic(s)")
    stats = records.groupBy("topic", "partition").agg(
        F.count(F.lit(1)).alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi")
    )
    per_partition = {(r["topic"], r["partition"]): (r["n"], r["lo"], r["hi"]) for r in stats.collect()}
    timings["read_sink"] = time.monotonic() - t
    return plan, records, per_partition
