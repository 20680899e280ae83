"""What the streaming sources of the brokers beyond Kafka (`rabbitmq/stream.py`,
`nats/stream.py`) share: a PySpark `DataSourceStreamReader` over a broker's logs with the
Kafka streaming source's offsets, rows and markers (`spark_jobs/kafka/stream.py`), so
`cdc verify --follow` reads every sink alike.

Offsets are `{"<topic>": {"<partition>": next_offset}}` (a RabbitMQ stream offset, a
JetStream stream sequence), plain JSON Spark keeps in its checkpoint: a restarted query
reads again exactly the ranges of the batch it had not committed. Each micro-batch reads,
per partition, `[start, end)` with `end` the broker's next offset when Spark asked for the
latest offset, through the batch source's own planner and range reader (`plan()` and
`records(range)` of a `log_source.RangeReader` subclass), decoded by
`records.RecordColumns` into the Kafka source's columns, plus the marker columns: one
marker row per range read, whose `offset` is the first offset still held in that range
(`retained_from`; NULL when none). A first offset above `range_start` means the broker
removed messages (retention) before the verifier read them, as on Kafka.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from spark_jobs.arrow_transport import SCHEMA as TRANSPORT_SCHEMA
from spark_jobs.arrow_transport import pack, packing
from spark_jobs.common import DataSource, InputPartition, opt_int, settle_worker, stream_reader_stopped
from spark_jobs.log_record import LogRecord
from spark_jobs.records import DEFAULT_CHUNK, RecordColumns, chunks
from spark_jobs.stream_rows import STREAM_FIELDS, STREAM_SCHEMA, arrow_schema, arrow_with_markers, offsets_of

try:
    from pyspark.sql.datasource import DataSourceStreamReader
except Exception:  # pragma: no cover
    DataSourceStreamReader = object  # type: ignore[misc,assignment]  # a stand-in base when pyspark is not installed


def stream_ranges(start: Mapping[str, Any], end: Mapping[str, Any], streams: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every partition of `end` with its `[low, high)` and its broker stream
    (`streams["<topic>/<partition>"]`); empty ranges included: their markers tell the
    follow job the partition exists."""
    out = []
    for topic, parts in sorted(end.items()):
        for p, high in sorted(parts.items(), key=lambda kv: int(kv[0])):
            low = int((start or {}).get(topic, {}).get(p, 0))
            out.append({"topic": topic, "partition": int(p), "stream": streams.get(f"{topic}/{p}", topic),
                        "low": min(low, int(high)), "high": int(high)})  # fmt: skip
    return out


class LogStreamReader(DataSourceStreamReader):
    """A subclass plans (`plan()`, as the batch source's) and reads one range
    (`records(range)`); `retained_from(range)` is the first offset the broker still holds
    for the range (default: the first one read)."""

    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.streams: dict[str, str] = {}  # "<topic>/<partition>" -> broker stream, from the plans

    # -- what a broker's reader gives
    def plan(self) -> dict[str, Any]:
        raise NotImplementedError

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        raise NotImplementedError

    def retained_from(self, r: Mapping[str, Any], first_read: int | None) -> int | None:
        return first_read

    # -- the stream reader
    def _planned(self) -> dict[str, Any]:
        plan = self.plan()
        for p in plan["partitions"]:
            self.streams[f"{p['topic']}/{p['partition']}"] = p.get("stream") or p["topic"]
        return plan

    def initialOffset(self) -> dict:
        import json

        start = (self.options.get("start") or "latest").strip()
        if start.startswith("{"):  # explicit offsets (the follow job took them before the binlog head)
            return json.loads(start)
        return offsets_of(self._planned(), "high" if start == "latest" else "low")

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        latest = offsets_of(self._planned(), "high")
        for topic, parts in (start or {}).items():  # never go back (a stream briefly not found)
            for p, off in parts.items():
                latest.setdefault(topic, {})[p] = max(int(off), int(latest.get(topic, {}).get(p, off)))
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if any(f"{t}/{p}" not in self.streams for t, parts in end.items() for p in parts):
            self._planned()  # a restarted query: the streams of the checkpoint's offsets
        ranges = stream_ranges(start, end, self.streams)
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
        names = [n for n, _ in STREAM_FIELDS]
        rows: dict[str, list[Any]] = {n: [] for n in names}
        for r in part:
            first: int | None = None
            if r["high"] > r["low"]:
                for record in self.records(r):
                    if first is None:
                        first = record.offset()
                    cols.add(record)
                    if cols.n >= 8192:
                        yield arrow_with_markers(cols.take(), False)
            row: dict[str, Any] = {n: None for n in names}
            held = self.retained_from(r, first) if r["high"] > r["low"] else None
            row.update(topic=r["topic"], partition=r["partition"], offset=held, marker=True,
                       range_start=r["low"], range_end=r["high"])  # fmt: skip
            for n in names:
                rows[n].append(row[n])
        if cols.n:
            yield arrow_with_markers(cols.take(), False)
        if part:
            schema = arrow_schema()
            yield pa.RecordBatch.from_arrays(
                [pa.array(rows[n], type=schema.field(n).type) for n in names], schema=schema
            )

    def stop(self) -> None:
        stream_reader_stopped()

    def commit(self, end: dict) -> None:
        pass  # nothing is stored on the broker: the offsets live in Spark's checkpoint


class LogStreamDataSource(DataSource):
    """The Kafka streaming source's schema (packed when `transport` is `arrow`)."""

    def schema(self) -> str:
        return TRANSPORT_SCHEMA if packing(self.options) else STREAM_SCHEMA
