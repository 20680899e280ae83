"""PySpark Python streaming data source `cdc_kafka_stream`: the topics as a stream whose
offsets are per-partition offsets `{"<topic>": {"<partition>": next_offset}}` (for
`cdc verify --follow`).

    spark.readStream.format("cdc_kafka_stream")
        .option("bootstrap", "host:9092").option("topics", "a,b").option("topic_pattern", r"...")
        .option("dlq_topic", "outbox.dlq").option("start", "latest")   # or "earliest", or offsets as JSON
        .load()

Each micro-batch reads, per partition, `[start, end)` with `end` the high watermark when
Spark asked for the latest offset (a topic or partition that appears later starts at 0, its
first retained offset). Records are read and decoded by the batch source's own functions
(`spark_jobs/kafka/source.py`: `plan_kafka`, `chunks`, `scan_partitions`,
`RecordColumns`), with the decoded schema, plus three columns: `marker` (true on one row
per range read), `range_start`, `range_end`; a marker row's `offset` is the first offset
actually read in that range (NULL when none): a first offset above `range_start` means
records were removed (retention) before the verifier read them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_jobs.arrow_transport import SCHEMA as TRANSPORT_SCHEMA
from spark_jobs.arrow_transport import pack, packing
from spark_jobs.common import DataSource, InputPartition, opt_int, opt_json, settle_worker, stream_reader_stopped
from spark_jobs.kafka.source import plan_kafka, scan_partitions
from spark_jobs.records import DEFAULT_CHUNK, RecordColumns, chunks
from spark_jobs.stream_rows import STREAM_FIELDS, STREAM_SCHEMA, arrow_schema, arrow_with_markers, offsets_of

try:
    from pyspark.sql.datasource import DataSourceStreamReader
except Exception:  # pragma: no cover
    DataSourceStreamReader = object  # type: ignore[misc,assignment]  # a stand-in base when pyspark is not installed


def ranges_between(start: Mapping[str, Any], end: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every partition of `end` with its `[low, high)` (empty ranges included: their
    markers tell the follow job the partition exists)."""
    out = []
    for topic, parts in sorted(end.items()):
        for p, high in sorted(parts.items(), key=lambda kv: int(kv[0])):
            low = int((start or {}).get(topic, {}).get(p, 0))
            out.append({"topic": topic, "partition": int(p), "low": min(low, int(high)), "high": int(high)})
    return out


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)

    def _plan(self) -> dict[str, Any]:
        topics = [t.strip() for t in (self.options.get("topics") or "").split(",") if t.strip()]
        return plan_kafka(self.options["bootstrap"], topics, self.options.get("topic_pattern") or None,
                          opt_json(self.options, "consumer_conf", {}))  # fmt: skip

    def initialOffset(self) -> dict:
        start = (self.options.get("start") or "latest").strip()
        if start.startswith("{"):  # explicit offsets (the follow job took them before the binlog head)
            return json.loads(start)
        return offsets_of(self._plan(), "high" if start == "latest" else "low")

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        latest = offsets_of(self._plan(), "high")
        for topic, parts in (start or {}).items():  # never go back (a partition briefly unlisted)
            for p, off in parts.items():
                latest.setdefault(topic, {})[p] = max(int(off), int(latest.get(topic, {}).get(p, off)))
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = ranges_between(start, end)
        chunk = opt_int(self.options, "chunk", DEFAULT_CHUNK) or DEFAULT_CHUNK
        tasks = chunks({"partitions": [r for r in ranges if r["high"] > r["low"]]}, chunk)
        empty = [r for r in ranges if r["high"] <= r["low"]]
        parts = [InputPartition(t) for t in tasks]
        if empty or not parts:
            parts.append(InputPartition(empty))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        batches = self._batches(partition.value or [])
        return pack(batches) if packing(self.options) else batches

    def _batches(self, part: list[dict[str, Any]]) -> Iterator[Any]:
        import pyarrow as pa

        cols = RecordColumns(False, True, self.options.get("dlq_topic") or None)
        first: dict[tuple[str, int], int] = {}
        todo = [r for r in part if r["high"] > r["low"]]
        if todo:
            for msg in scan_partitions(self.options["bootstrap"], todo, opt_json(self.options, "consumer_conf", {}),
                                       self.options.get("isolation") or "read_committed"):  # fmt: skip
                first.setdefault((msg.topic(), msg.partition()), msg.offset())
                cols.add(msg)
                if cols.n >= 8192:
                    yield arrow_with_markers(cols.take(), False)
            if cols.n:
                yield arrow_with_markers(cols.take(), False)
        names = [n for n, _ in STREAM_FIELDS]
        rows: dict[str, list[Any]] = {n: [] for n in names}
        for r in part:
            row: dict[str, Any] = {n: None for n in names}
            row.update(topic=r["topic"], partition=r["partition"], offset=first.get((r["topic"], r["partition"])),
                       marker=True, range_start=r["low"], range_end=r["high"])  # fmt: skip
            for n in names:
                rows[n].append(row[n])
        if part:
            schema = arrow_schema()
            yield pa.RecordBatch.from_arrays(
                [pa.array(rows[n], type=schema.field(n).type) for n in names], schema=schema
            )

    def stop(self) -> None:
        stream_reader_stopped()

    def commit(self, end: dict) -> None:
        pass


class KafkaStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_kafka_stream"

    def schema(self) -> str:
        return TRANSPORT_SCHEMA if packing(self.options) else STREAM_SCHEMA

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(self.options)


__all__ = ["STREAM_FIELDS", "KafkaStreamDataSource", "json", "offsets_of"]
