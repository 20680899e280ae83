"""`cdc.source_events.RowInsert` is written out (slots set by plain stores, its end kept as
file and offset) where the other source events are frozen dataclasses: it must behave as
the frozen dataclass it was, for the assembler, the tests that build rows by hand and the
decoder's generated inserters alike."""

from __future__ import annotations

import dataclasses

import pytest

from cdc.position import BinlogPosition
from cdc.source_events import RowInsert


@dataclasses.dataclass(frozen=True, slots=True)
class _AsBefore:  # RowInsert as it was (ac9d755): the behaviour to keep
    schema: str
    table: str
    values: dict
    end: BinlogPosition


END = BinlogPosition("binlog.000002", 120)


def _both(schema="shop", table="outbox", values=None, end=END):
    values = {"id": "e-1", "n": 1} if values is None else values
    return RowInsert(schema, table, values, end), _AsBefore(schema, table, values, end)


def test_fields_equality_and_repr_are_the_dataclass_ones():
    row, before = _both()
    assert (row.schema, row.table, row.values, row.end) == (before.schema, before.table, before.values, before.end)
    assert type(row.end) is BinlogPosition and row.end == BinlogPosition("binlog.000002", 120)
    assert repr(row) == repr(before).replace("_AsBefore", "RowInsert")
    assert row == RowInsert("shop", "outbox", {"id": "e-1", "n": 1}, BinlogPosition("binlog.000002", 120))
    for other in (
        _both(schema="billing")[0],
        _both(table="events")[0],
        _both(values={"id": "e-2"})[0],
        _both(end=BinlogPosition("binlog.000002", 121))[0],
        _both(end=BinlogPosition("binlog.000003", 120))[0],
    ):
        assert row != other
    assert row != before  # another class, as a dataclass compares


def test_unhashable_and_matched_by_class_and_fields_as_before():
    row, before = _both()
    for obj in (row, before):
        with pytest.raises(TypeError):
            hash(obj)  # the values dict
    match row:
        case RowInsert(schema, table, values, end):
            assert (schema, table, values, end) == (before.schema, before.table, before.values, before.end)
        case _:
            pytest.fail("RowInsert(...) did not match")


def test_a_decoder_made_row_equals_one_built_by_its_constructor():
    """The generated inserter stores the slots itself (connectors/mysql/binlog_row_code.py)."""
    row = object.__new__(RowInsert)
    row.schema, row.table, row.values = "shop", "outbox", {"id": "e-1", "n": 1}
    row._end_file, row._end_pos = "binlog.000002", 120
    assert row == _both()[0] and repr(row) == repr(_both()[0])
