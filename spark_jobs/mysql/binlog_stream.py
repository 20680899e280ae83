"""PySpark Python streaming data source `cdc_binlog_stream`: the binlog as a stream whose
offsets are binlog positions `{"file": ..., "pos": ...}` (for `cdc verify --follow`).

    spark.readStream.format("cdc_binlog_stream")
        .option("host", ...).option("port", ...).option("user", ...).option("password", ...)
        .option("source", "shop-db").option("tables", tables_to_json([...]))
        .option("start", "head")            # "head" (the server's position now), "oldest", or a file name
        .option("split_bytes", str(8 << 20)) # optional: cut a micro-batch's range into pieces
        .option("max_batch_bytes", str(64 << 20))  # optional: admission limit per micro-batch
        .load()

Each micro-batch reads `[start, end)` where `end` is the server's position
(`SHOW MASTER STATUS`) when Spark asked for the latest offset: always the end of a
transaction, so every transaction is read whole, by one task. The rows are those of the
batch source `cdc_binlog` (`spark_jobs/mysql/binlog_source.py` `iter_binlog_batches`: the
verifier's own reader, python-mysql-replication by default, and its own transaction
assembly), plus one `kind = progress` row per range read (`file`, `tx_pos` = the range's
start, `tx_end` = its end): the follow job learns from them how far the binlog was read.

Admission limit: with `max_batch_bytes`, a micro-batch reads at most about that many
bytes of binlog (cut at the first transaction start past it; a larger transaction is read
whole), so that catching up after a pause or from `oldest` proceeds in bounded steps
instead of one batch that holds everything in the driver. Only the binlog side is
limited: a Kafka record read before its event waits for it and is never judged early,
whereas an event read before its record would start its grace period too soon.

Each range is read over its own replication connection with its own server id
(`server_id_base + index`, the base drawn at random per reader; micro-batches run one after
the other, so ids are reused only by connections that have ended).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.position import file_sequence
from connectors.mysql.client import binlog_end
from spark_jobs.arrow_transport import SCHEMA as TRANSPORT_SCHEMA
from spark_jobs.arrow_transport import pack, packing
from spark_jobs.common import (
    DataSource,
    InputPartition,
    mysql_settings_from_options,
    opt_int,
    opt_json,
    settle_worker,
    stream_reader_stopped,
    where,
)
from spark_jobs.mysql.binlog_plan import connect_mysql, split_ranges, transaction_starts
from spark_jobs.mysql.binlog_rows import BINLOG_FIELDS, BINLOG_SCHEMA, EventColumns, EventMapper, anomaly_row
from spark_jobs.mysql.binlog_source import iter_binlog_batches, tables_from_json

try:
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes
except Exception:  # pragma: no cover
    DataSourceStreamReader = object  # type: ignore[misc,assignment]  # a stand-in base when pyspark is not installed

KIND_PROGRESS = "progress"


def server_logs(settings: Mapping[str, Any]) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    """((file, pos) of the server's end now, [(file, size)] of SHOW BINARY LOGS in order)."""
    conn = connect_mysql(settings)
    try:
        with conn.cursor() as cur:
            status = binlog_end(cur)  # SHOW BINARY LOG STATUS on MySQL 8.2+
            if not status:
                raise RuntimeError(f"cdc_binlog: binary logging is off on {where(settings)}: start it with --log-bin")
            cur.execute("SHOW BINARY LOGS")
            logs = [(r[0], int(r[1])) for r in cur.fetchall()]
    finally:
        conn.close()
    logs.sort(key=lambda item: file_sequence(item[0])[1])
    return (status[0], int(status[1])), logs


def ranges_between(
    start: Mapping[str, Any], end: Mapping[str, Any], logs: Sequence[tuple[str, int]]
) -> list[dict[str, Any]]:
    """The byte ranges `[start, end)` of each file from position `start` to `end`."""
    s_seq, e_seq = file_sequence(start["file"])[1], file_sequence(end["file"])[1]
    if (s_seq, int(start["pos"])) >= (e_seq, int(end["pos"])):
        return []
    out = []
    for name, size in logs:
        seq = file_sequence(name)[1]
        if seq < s_seq or seq > e_seq:
            continue
        lo = int(start["pos"]) if seq == s_seq else 4
        hi = int(end["pos"]) if seq == e_seq else size
        if hi > lo:
            out.append({"file": name, "start": lo, "end": hi})
    if not out or out[0]["file"] != start["file"]:
        known = [n for n, _ in logs]
        if start["file"] not in known:
            raise RuntimeError(
                f"cdc_binlog: binlog file {start['file']} is no longer on the server (purged; oldest is "
                f"{known[0] if known else '?'}): start the follow job afresh (new checkpoint dir) or keep binlogs longer"
            )
    return out


def admitted_end(
    settings: Mapping[str, Any],
    start: Mapping[str, Any],
    head: dict[str, Any],
    logs: Sequence[tuple[str, int]],
    cap: int,
) -> dict[str, Any]:
    """The end of a micro-batch that reads about `cap` bytes from `start`: the first
    transaction start at or past `cap` bytes, or the head when it is nearer."""
    budget = cap
    for r in ranges_between(start, head, logs):
        size = r["end"] - r["start"]
        if size <= budget:
            budget -= size
            continue
        target = r["start"] + max(budget, 1)
        for p in transaction_starts(settings, r["file"], r["start"], r["end"], until=target):
            if p >= target:
                return {"file": r["file"], "pos": p}
        return {"file": r["file"], "pos": r["end"]}  # no transaction starts later in this piece
    return head


def progress_row(source: str, file: str, start: int, end: int) -> dict[str, Any]:
    row = anomaly_row(source, file, "")
    row.update(dlq_error=None, kind=KIND_PROGRESS, tx_pos=start, tx_end=end)
    return row


class BinlogStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.settings = mysql_settings_from_options(self.options)
        base = opt_int(self.options, "server_id_base")
        self.server_id_base = base if base is not None else random.randint(1 << 30, (1 << 31) - 100_000)

    def initialOffset(self) -> dict:
        start = (self.options.get("start") or "head").strip()
        (file, pos), logs = server_logs(self.settings)
        if start == "head":
            return {"file": file, "pos": pos}
        if ":" in start:
            f, _, p = start.rpartition(":")
            return {"file": f, "pos": int(p)}
        if start == "oldest":
            return {"file": logs[0][0] if logs else file, "pos": 4}
        if start not in [n for n, _ in logs]:
            raise RuntimeError(
                f"cdc_binlog: start file {start} is not on the server (SHOW BINARY LOGS): name one that is"
            )
        return {"file": start, "pos": 4}

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = opt_int(self.options, "max_batch_bytes")
        return ReadMaxBytes(cap) if cap else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        (file, pos), logs = server_logs(self.settings)
        head = {"file": file, "pos": pos}
        cap = getattr(limit, "max_bytes", None) if start is not None else None
        return admitted_end(self.settings, start, head, logs, cap) if cap and start is not None else head

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        _head, logs = server_logs(self.settings)
        ranges = ranges_between(start, end, logs)
        split = opt_int(self.options, "split_bytes")
        if split and any(r["end"] - r["start"] > split for r in ranges):
            ranges = split_ranges(self.settings, {"files": ranges}, split)["ranges"]
        return [InputPartition({**r, "server_id": self.server_id_base + i}) for i, r in enumerate(ranges)] or [
            InputPartition(None)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        batches = self._batches(partition.value)
        return pack(batches) if packing(self.options) else batches

    def _batches(self, part: dict[str, Any] | None) -> Iterator[Any]:
        if part is None:
            return
        yield from iter_binlog_batches(self.options, part)
        cols = EventColumns(self.options.get("source") or "", EventMapper(tables_from_json(self.options.get("tables"))))
        cols.add_row(progress_row(self.options.get("source") or "", part["file"], part["start"], part["end"]))
        yield cols.take()

    def stop(self) -> None:
        stream_reader_stopped()

    def commit(self, end: dict) -> None:
        pass


class BinlogStreamDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_binlog_stream"

    def schema(self) -> str:
        return TRANSPORT_SCHEMA if packing(self.options) else BINLOG_SCHEMA

    def streamReader(self, schema: Any) -> BinlogStreamReader:
        return BinlogStreamReader(self.options)


__all__ = ["BINLOG_FIELDS", "KIND_PROGRESS", "BinlogStreamDataSource", "opt_json"]
