"""The generated row readers' fast column parsers (connectors/mysql/binlog_row_code.py,
`_column_code`) give what the decoder's general readers give, on bytes a server would not
write as well: DATETIME(6) read as one 64-bit word (against `read_datetime2_slow`, the
reference reading of MySQL's `TIME_to_longlong_datetime_packed` layout, sql-common/my_time.cc),
and UTF-8 text decoded with `bytes.decode()`."""

from __future__ import annotations

import datetime

import pytest

from connectors.mysql.binlog_column_types import T_DATETIME2, T_VARCHAR
from connectors.mysql.binlog_row_code import make_reader
from connectors.mysql.binlog_table_layout import Column, Table
from connectors.mysql.binlog_value_readers import read_datetime2_slow


def _table(*columns: Column) -> Table:
    tbl = Table("s", "t")
    tbl.columns = list(columns)
    tbl.ncols = len(columns)
    tbl.names = tuple(f"c{i}" for i in range(len(columns)))
    return tbl


def _datetime6(fsp: int = 6) -> Column:
    col = Column(T_DATETIME2)
    col.meta = {"fsp": fsp}
    return col


def _packed(year: int, month: int, day: int, hour: int, minute: int, second: int, fraction: int) -> bytes:
    """DATETIME2 with 3 fraction bytes: 1 sign bit, 17 bits year*13+month, 5 day, 5 hour,
    6 minute, 6 second, big-endian; the fraction a signed 24-bit big-endian number."""
    d = (1 << 39) | ((year * 13 + month) << 22) | (day << 17) | (hour << 12) | (minute << 6) | second
    return d.to_bytes(5, "big") + (fraction & 0xFFFFFF).to_bytes(3, "big")


@pytest.mark.parametrize(
    "value",
    [
        (2026, 11, 26, 18, 59, 1, 123456),
        (2026, 11, 26, 18, 59, 1, 0),
        (2026, 11, 26, 18, 59, 1, 999999),
        (1000, 1, 1, 0, 0, 0, 1),
        (9999, 12, 31, 23, 59, 59, 999999),
        (0, 0, 0, 0, 0, 0, 0),  # the zero date: None
        (2026, 2, 30, 0, 0, 0, 5),  # no such day: None
        (2026, 11, 26, 1, 2, 3, -1),  # a negative fraction: ignored
        (2026, 11, 26, 1, 2, 3, -0x800000),
    ],
)
def test_datetime6_as_the_reference_reads_it(value):
    raw = _packed(*value)
    read = make_reader(_table(_datetime6()), b"\x01")
    got, end = read(b"\x00" + raw, 0)  # the null bitmap, then the value
    assert end == 9
    assert got == {"c0": read_datetime2_slow(raw, 0, 6)}
    if value[0] == 2026 and value[2] == 26:
        assert got["c0"] == datetime.datetime(*value[:6], max(value[6], 0))


@pytest.mark.parametrize("fraction", [1_000_000, 0x7FFFFF])
def test_datetime6_fraction_out_of_range_is_refused(fraction):
    raw = _packed(2026, 11, 26, 1, 2, 3, fraction)
    read = make_reader(_table(_datetime6()), b"\x01")
    with pytest.raises(ValueError, match="microsecond"):
        read_datetime2_slow(raw, 0, 6)
    with pytest.raises(ValueError, match="microsecond"):
        read(b"\x00" + raw, 0)


def test_utf8_text_and_other_codecs():
    utf8, latin1, binary = Column(T_VARCHAR), Column(T_VARCHAR), Column(T_VARCHAR)
    for col in (utf8, latin1, binary):
        col.meta = {"max_length": 255}
    utf8.encoding, latin1.encoding, binary.encoding = "utf-8", "latin-1", None
    read = make_reader(_table(utf8, latin1, binary), b"\x07")
    text = "é€😀 x".encode()
    row = b"\x00" + bytes([len(text)]) + text + b"\x02\xe9\xe8" + b"\x03\x00\xff\x01"
    assert read(row, 0) == ({"c0": "é€😀 x", "c1": "éè", "c2": b"\x00\xff\x01"}, len(row))
    with pytest.raises(UnicodeDecodeError):  # strict, as .decode("utf-8") is
        read(b"\x00\x01\xff\x00\x00", 0)
