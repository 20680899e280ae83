"""Packed Arrow batches: how the follow job's stream sources hand their rows to the driver.

`cdc verify --follow` reconciles on the driver (`spark_jobs/follow_state.py`), so every row
its two stream sources read goes from the executors' Python workers to the driver's Python
and Spark does nothing with the columns in between. Sent as rows, each one is converted
Arrow -> Spark's internal row -> Arrow across ~64 columns (the union of both sides) and that
conversion cost more CPU in the JVM than reading the binlog and the topics did in Python.
With `option("transport", "arrow")` a source yields one row per Arrow record batch it read,
the batch serialised in Arrow's IPC stream format in a single binary column `arrow`; the
driver unpacks them (`unpack`). The rows, their order within a batch, and the sources'
offsets are exactly those of the row transport.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

TRANSPORT_OPTION = "transport"
COLUMN = "arrow"
SCHEMA = f"`{COLUMN}` binary"


def packing(options: Mapping[str, str]) -> bool:
    """Whether a stream source was asked for packed batches (`transport` = `arrow`);
    anything but `rows` (the default) and `arrow` is refused."""
    value = (options.get(TRANSPORT_OPTION) or "rows").strip().lower()
    if value not in ("rows", "arrow"):
        raise ValueError(f"option transport={value!r}: use 'rows' (default) or 'arrow'")
    return value == "arrow"


def pack(batches: Iterable[Any]) -> Iterator[Any]:
    """Each non-empty record batch as a one-row batch holding its IPC stream bytes."""
    import pyarrow as pa

    schema = pa.schema([(COLUMN, pa.binary())])
    for batch in batches:
        if batch.num_rows == 0:
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        yield pa.RecordBatch.from_arrays([pa.array([sink.getvalue().to_pybytes()], pa.binary())], schema=schema)


def unpack(blobs: Sequence[bytes]) -> Any:
    """The rows packed in `blobs` as one Arrow table (None when there are none)."""
    import pyarrow as pa

    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    if not tables:
        return None
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
