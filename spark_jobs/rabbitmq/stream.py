"""PySpark Python streaming data source `cdc_rabbitmq_stream`: RabbitMQ streams as a stream
whose offsets are stream offsets per topic partition `{"<topic>": {"<partition>": next}}`
(for `cdc verify --follow` on `[sink] kind = "rabbitmq_stream"`).

    spark.readStream.format("cdc_rabbitmq_stream")
        .option("host", "127.0.0.1").option("port", "5552").option("vhost", "/")
        .option("hosts", "rabbit2:5552,rabbit3:5552")   # a cluster's other nodes
        .option("user", "...").option("password", "...")
        .option("topics", "outbox.event.order,outbox.dlq").option("dlq_topic", "outbox.dlq")
        .option("start", "latest")   # or "earliest", or offsets as JSON
        .load()

The planner and the range reader are the batch source's (`spark_jobs/rabbitmq/source.py`:
`plan_rabbitmq`, `read_range`; the mapping of a message to the Kafka columns is there, and
each stream is planned and read on its leader there), the
offsets, rows and markers those of `spark_jobs/log_stream.py`. A topic's streams are found
by name on every plan. 3.10 cannot list streams, so the topics are the `topics` option (the
configured ones, the tables' fixed topics, the dead-letter topic) and those listed in the
file of the `topics_file` option: the follow job writes there every topic the binlog's events
name (a table's topic template), and the next plan reads them from their first offset. A stream's offsets are contiguous (the
sinks publish one message per entry, without sub-entry batching), so the first offset read
in a range is the first one the broker still holds, as on Kafka.

The exchange sink (`[sink] kind = "rabbitmq_exchange"`, option `audit_stream`): the plan is
the batch source's, one range of the audit stream, so the offsets are
`{"<audit stream>": {"0": next}}` and each range marker names the audit stream; each
message read is a record of the topic its routing key names, partition 0, at its
audit-stream offset (as `cdc verify` reads it). Messages the audit stream's retention
removed before they were read mark the audit stream truncated, which the follow job's
rules apply to every topic (`routed_stream`, spark_jobs/follow_rules.py): their events are
unverifiable, not missing (docs/verifier.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from spark_jobs.log_record import LogRecord
from spark_jobs.log_source import topics_option
from spark_jobs.log_stream import LogStreamDataSource, LogStreamReader
from spark_jobs.rabbitmq.source import DEFAULT_EMPTY_WAIT, plan_rabbitmq, read_range, settings_from_options


class RabbitMQStreamReader(LogStreamReader):
    def plan(self) -> dict[str, Any]:
        topics = topics_option(self.options, "cdc_rabbitmq_stream", "topic names")
        listed = self.options.get("topics_file")
        if listed and os.path.isfile(listed):
            with open(listed, encoding="utf-8") as f:
                topics = sorted(set(topics) | set(json.load(f)))
        wait = float(self.options.get("empty_wait") or DEFAULT_EMPTY_WAIT)
        return plan_rabbitmq(settings_from_options(self.options), topics, wait)

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        settings = settings_from_options(self.options)
        # the exchange sink's audit stream: its offsets are the one partition `<audit stream>/0`,
        # each message a record of the topic its routing key names (the batch plan's `routed`)
        routed = bool(settings["audit_stream"]) and r["stream"] == settings["audit_stream"]
        return read_range(settings, r["topic"], r["partition"], r["stream"], r["low"], r["high"], routed=routed)


class RabbitMQStreamDataSource(LogStreamDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_rabbitmq_stream"

    def streamReader(self, schema: Any) -> RabbitMQStreamReader:
        return RabbitMQStreamReader(self.options)
