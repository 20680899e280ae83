"""The rows every streaming source of `cdc verify --follow` hands out, whatever the sink
(`kafka/stream.py`, `log_stream.py`): the Kafka source's decoded columns
(`records.fields_for`) plus a range marker per range read (`marker`, `range_start`,
`range_end`; a marker row's `offset` is the first offset still held in that range), and
offsets `{"<topic>": {"<partition>": next_offset}}` from a plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_jobs.records import fields_for

MARKER_FIELDS: tuple[tuple[str, str], ...] = (("marker", "boolean"), ("range_start", "bigint"), ("range_end", "bigint"))
STREAM_FIELDS = fields_for(False, True) + MARKER_FIELDS
STREAM_SCHEMA = ", ".join(f"`{n}` {k}" for n, k in STREAM_FIELDS)


def offsets_of(plan: Mapping[str, Any], which: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for p in plan["partitions"]:
        out.setdefault(p["topic"], {})[str(p["partition"])] = int(p[which])
    return out


def arrow_with_markers(batch: Any, marker: bool) -> Any:
    import pyarrow as pa

    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        list(batch.columns) + [pa.array([marker] * n, pa.bool_()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64())],
        schema=arrow_schema(),
    )


def arrow_schema() -> Any:
    import pyarrow as pa

    kinds = {
        "string": pa.string(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "binary": pa.binary(),
        "boolean": pa.bool_(),
    }
    return pa.schema([(n, kinds[k]) for n, k in STREAM_FIELDS])
