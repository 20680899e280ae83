"""What the data sources of the brokers beyond Kafka (`rabbitmq_source.py`, `nats_source.py`)
share: a reader over planned `{topic, partition, low, high, ...}` ranges (a fixed plan from
the `plan` option, else the source's own snapshot), at most `chunk` offsets per Spark
partition (`records.chunks`), each range's records decoded into the Kafka source's
columns by `records.RecordColumns` and handed out as Arrow batches."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_jobs.common import DataSource, DataSourceReader, InputPartition, opt_bool, opt_int, opt_json, settle_worker
from spark_jobs.log_record import LogRecord
from spark_jobs.records import BATCH_ROWS, DEFAULT_CHUNK, RecordColumns, chunks, schema_for


def topics_option(options: Mapping[str, str], source: str, what: str) -> list[str]:
    topics = [t.strip() for t in (options.get("topics") or "").split(",") if t.strip()]
    if not topics:
        raise ValueError(f"{source}: option 'topics' (comma-separated {what}) is required")
    return topics


class RangeReader(DataSourceReader):
    """A subclass plans (`plan()`: `{"partitions": [...], ...}` as `kafka_source.plan_kafka`
    returns) and reads one range (`records(range)`)."""

    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.include_raw = opt_bool(self.options, "include_raw", True)
        self.decode = opt_bool(self.options, "decode", True)

    def plan(self) -> dict[str, Any]:
        raise NotImplementedError

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        raise NotImplementedError

    def partitions(self) -> Sequence[InputPartition]:
        plan = opt_json(self.options, "plan")
        if plan is None:
            plan = self.plan()
        parts = chunks(plan, opt_int(self.options, "chunk", DEFAULT_CHUNK) or DEFAULT_CHUNK)
        return [InputPartition(p) for p in parts] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        part = partition.value
        if part is None:
            return
        cols = RecordColumns(self.include_raw, self.decode, self.options.get("dlq_topic") or None)
        for r in part:
            for record in self.records(r):
                cols.add(record)
                if cols.n >= BATCH_ROWS:
                    yield cols.take()
        if cols.n:
            yield cols.take()


class RangeDataSource(DataSource):
    """The Kafka source's schema (`include_raw`, `decode` options)."""

    def schema(self) -> str:
        return schema_for(opt_bool(self.options, "include_raw", True), opt_bool(self.options, "decode", True))
