"""The MySQL lab server's GTID sets (testbed/mysql_lab/gtid_sets.py): MySQL's text, tagged
too, and the COM_BINLOG_DUMP_GTID encoding in both formats (sql/rpl_gtid_set.cc)."""

from __future__ import annotations

import struct
import uuid

import pytest

from testbed.mysql_lab.gtid_sets import GtidSet, GtidSetError

A = "3e11fa47-71ca-11e1-a4f1-000c29a2f5b1"
B = "11111111-2222-3333-4444-555555555555"


def test_text_with_tags_parses_and_prints_canonically():
    s = GtidSet.parse(f"{B}:3-4:1-2, {A}:1-5:Blue:1-3:7,{A}:6")
    assert str(s) == f"{B}:1-4,\n{A}:1-6:blue:1-3:7"
    assert s.contains(f"{A}:blue:7") and not s.contains(f"{A}:blue:4") and s.contains(f"{A}:6")
    assert not s.contains(f"{A}:red:1")


def test_subset_and_difference():
    small = GtidSet.parse(f"{A}:1-3:tag:1")
    big = GtidSet.parse(f"{A}:1-5:tag:1-2")
    assert small.issubset(big) and not big.issubset(small)
    assert str(big.minus(small)) == f"{A}:4-5:tag:2"


def test_untagged_encoding():
    data = struct.pack("<Q", 1) + uuid.UUID(A).bytes + struct.pack("<QQQQQ", 2, 1, 4, 7, 8)
    assert str(GtidSet.decode(data)) == f"{A}:1-3:7"


def test_tagged_encoding_format_byte_in_top_and_low_byte():
    entries = uuid.UUID(A).bytes + b"\x00" + struct.pack("<QQQ", 1, 1, 3)
    entries += uuid.UUID(A).bytes + bytes([3 << 1]) + b"red" + struct.pack("<QQQ", 1, 5, 6)
    data = struct.pack("<Q", (1 << 56) | (2 << 8) | 1) + entries
    assert str(GtidSet.decode(data)) == f"{A}:1-2:red:5"


@pytest.mark.parametrize(
    "data",
    [b"\x01", struct.pack("<Q", 2 << 56), struct.pack("<Q", 1) + b"\x00" * 10],
)
def test_bad_encodings_are_refused(data):
    with pytest.raises(GtidSetError):
        GtidSet.decode(data)


def test_bad_text_is_refused():
    with pytest.raises(GtidSetError):
        GtidSet.parse("not-a-uuid:1")
    with pytest.raises(GtidSetError):
        GtidSet.parse(f"{A}:x-y-")
