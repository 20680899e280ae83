"""The follow job's packed transport (spark_jobs/arrow_transport.py): rows, order and types
survive packing and unpacking exactly; an unknown transport option is refused."""

import pytest

from spark_jobs.arrow_transport import pack, packing, unpack


def _row(i):
    return {"ikey": f"k{i}", "row": i, "payload": b"\x00\xff" * i, "marker": i % 2 == 0}


@pytest.mark.verifier_deps  # PyArrow
def test_rows_order_and_types_survive():
    import pyarrow as pa

    schema = pa.schema([("ikey", pa.string()), ("row", pa.int32()), ("payload", pa.binary()), ("marker", pa.bool_())])
    batches = [
        pa.RecordBatch.from_pylist([_row(i) for i in range(start, start + n)], schema=schema)
        for start, n in ((0, 3), (3, 0), (3, 5000))
    ]
    packed = list(pack(batches))
    assert len(packed) == 2  # the empty batch is not sent
    assert all(p.num_rows == 1 and p.schema.names == ["arrow"] for p in packed)
    table = unpack([p.column(0)[0].as_py() for p in packed])
    assert table.schema == schema
    assert table.to_pylist() == [r for b in batches for r in b.to_pylist()]
    assert unpack([]) is None


def test_the_option():
    assert packing({"transport": "arrow"}) and packing({"transport": " Arrow "})
    assert not packing({}) and not packing({"transport": "rows"})
    with pytest.raises(ValueError, match="transport='parquet'"):
        packing({"transport": "parquet"})
