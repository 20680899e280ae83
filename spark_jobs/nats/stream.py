"""PySpark Python streaming data source `cdc_nats_stream`: JetStream subjects as a stream
whose offsets are stream sequences `{"<subject>": {"0": next}}` (for `cdc verify --follow`
on `[sink] kind = "nats_jetstream"`).

    spark.readStream.format("cdc_nats_stream")
        .option("servers", "nats://127.0.0.1:4222").option("user", "...").option("password", "...")
        .option("topics", "outbox.event.order,outbox.dlq").option("topic_pattern", r"outbox\\.event\\..*")
        .option("dlq_topic", "outbox.dlq").option("start", "latest")   # or "earliest", or offsets as JSON
        .load()

The planner and the range reader are the batch source's (`spark_jobs/nats/source.py`:
`plan_nats_matching`, `read_range`; the mapping of a message to the Kafka columns is there),
the offsets, rows and markers those of `spark_jobs/log_stream.py`.

A subject's sequences have gaps (its stream's other subjects hold them), so the first
sequence read in a range says nothing about removed messages. A range's marker carries
instead the first sequence its stream still holds (`stream_info().state.first_seq`), or the
range's start when that is not above it: only retention (or a purge) that took messages
at or after the range's start marks the partition truncated; a single message deleted
from the middle is missing, as it should be. A stream that never lost a message starts at
sequence 1, which the offsets write as 0 (Kafka's first offset): following a subject from
its stream's beginning is then not taken for a truncated partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from spark_jobs.log_record import LogRecord
from spark_jobs.log_source import topics_option
from spark_jobs.log_stream import LogStreamDataSource, LogStreamReader
from spark_jobs.nats.source import first_sequence, plan_nats_matching, read_range, settings_from_options


class NatsStreamReader(LogStreamReader):
    def plan(self) -> dict[str, Any]:
        topics = topics_option(self.options, "cdc_nats_stream", "subjects")
        plan = plan_nats_matching(
            settings_from_options(self.options), topics, self.options.get("topic_pattern") or None
        )
        for p in plan["partitions"]:
            p["low"] = 0 if p["low"] <= 1 else p["low"]
            p["high"] = max(p["high"], p["low"])
        return plan

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        return read_range(settings_from_options(self.options), r["topic"], r["stream"], max(1, r["low"]), r["high"])

    def retained_from(self, r: Mapping[str, Any], first_read: int | None) -> int | None:
        first_seq = first_sequence(settings_from_options(self.options), r["stream"])
        return r["low"] if first_seq <= max(1, r["low"]) else first_seq


class NatsStreamDataSource(LogStreamDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_nats_stream"

    def streamReader(self, schema: Any) -> NatsStreamReader:
        return NatsStreamReader(self.options)
