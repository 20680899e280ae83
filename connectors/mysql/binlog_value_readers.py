"""What the generated row readers (connectors/mysql/binlog_row_code.py) call for a value
that is not a plain integer or string: DECIMAL, the temporal types, JSON and partial JSON
diffs. The arithmetic mirrors python-mysql-replication 1.0.17's, so a value decodes to
what the library gives (see connectors/mysql/binlog_decoder.py)."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from connectors.mysql import temporal_text as _temporal
from connectors.mysql.binlog_decode_errors import BinlogDecodeError
from connectors.mysql.binlog_event_types import U32, U64

_COMPRESSED_BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
_Decimal = decimal.Decimal
_datetime = datetime.datetime
_date = datetime.date
_timedelta = datetime.timedelta
_utcfromtimestamp = datetime.datetime.utcfromtimestamp


def decimal_reader(precision: int, decimals: int):
    """(size, f(bytes) -> Decimal) for DECIMAL(precision, decimals); same string as the library builds."""
    integral = precision - decimals
    uncomp_integral, comp_integral = divmod(integral, 9)
    uncomp_fractional, comp_fractional = divmod(decimals, 9)
    isize = _COMPRESSED_BYTES[comp_integral]
    fsize = _COMPRESSED_BYTES[comp_fractional]
    size = isize + uncomp_integral * 4 + uncomp_fractional * 4 + fsize
    ffmt = f"0{comp_fractional}d"

    def read(data: bytes) -> decimal.Decimal:
        negative = not (data[0] & 0x80)
        b = bytearray(data)
        b[0] ^= 0x80
        if negative:
            b = bytearray(x ^ 0xFF for x in b)
            res = "-"
        else:
            res = ""
        p = 0
        if isize:
            res += str(int.from_bytes(b[:isize], "big"))
            p = isize
        for _ in range(uncomp_integral):
            res += f"{int.from_bytes(b[p : p + 4], 'big'):09d}"
            p += 4
        res += "."
        for _ in range(uncomp_fractional):
            res += f"{int.from_bytes(b[p : p + 4], 'big'):09d}"
            p += 4
        if fsize:
            res += format(int.from_bytes(b[p : p + fsize], "big"), ffmt)
        return _Decimal(res)

    return size, read


def fsp_size(fsp: int) -> int:
    return (fsp + 1) // 2


def _fsp_value(b: bytes, p: int, fsp: int) -> int:
    """The library's __read_fsp: signed big-endian read, /10 for odd fsp, scaled to µs."""
    size = (fsp + 1) // 2
    if not size:
        return 0
    v = int.from_bytes(b[p : p + size], "big", signed=True)
    if fsp % 2:
        v = int(v / 10)
    return v * (10 ** (6 - fsp))


def read_time2(b: bytes, p: int, fsp: int) -> datetime.timedelta:
    data = int.from_bytes(b[p : p + 3], "big", signed=True)
    sign = 1 if (data >> 23) & 1 else -1
    if sign == -1:
        data = ~data + 1
    return (
        _timedelta(
            hours=(data >> 12) & 0x3FF,
            minutes=(data >> 6) & 0x3F,
            seconds=data & 0x3F,
            microseconds=_fsp_value(b, p + 3, fsp),
        )
        * sign
    )


def read_date(b: bytes, p: int):
    t = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)
    try:  # a zero date or zero part: MySQL's text, not the library's None (temporal_text.py)
        return _date(year=(t >> 9) & 0x7FFF, month=(t >> 5) & 0xF, day=t & 0x1F)
    except ValueError:
        return _temporal.old_date_text(t)


def read_time_old(b: bytes, p: int) -> datetime.timedelta:
    t = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)
    return _timedelta(hours=int(t / 10000), minutes=int((t % 10000) / 100), seconds=int(t % 100))


def read_datetime_old(b: bytes, p: int):
    value = U64(b, p)[0]
    date = value / 1000000
    time = int(value % 1000000)
    year, month, day = int(date / 10000), int((date % 10000) / 100), int(date % 100)
    try:  # a zero date or zero part: MySQL's text, not the library's None (temporal_text.py)
        return _datetime(
            year=year,
            month=month,
            day=day,
            hour=int(time / 10000),
            minute=int((time % 10000) / 100),
            second=int(time % 100),
        )
    except ValueError:
        return _temporal.old_datetime_text(value)


def read_datetime2_slow(b: bytes, p: int, fsp: int):
    d = int.from_bytes(b[p : p + 5], "big")
    ym = (d >> 22) & 0x1FFFF
    try:
        t = _datetime(
            year=int(ym / 13),
            month=ym % 13,
            day=(d >> 17) & 0x1F,
            hour=(d >> 12) & 0x1F,
            minute=(d >> 6) & 0x3F,
            second=d & 0x3F,
        )
    except ValueError:  # a zero date or zero part: MySQL's text, not the library's None
        return datetime2_text(b, p, fsp)
    us = _fsp_value(b, p + 5, fsp)
    if us > 0:
        t = t.replace(microsecond=us)
    return t


def datetime2_text(b: bytes, p: int, fsp: int) -> str:
    return _temporal.datetime2_text(int.from_bytes(b[p : p + 5], "big"), _fsp_value(b, p + 5, fsp), fsp)


def read_timestamp(b: bytes, p: int):
    seconds = U32(b, p)[0]
    return _utcfromtimestamp(seconds) if seconds else _temporal.zero_timestamp()


def read_timestamp2(b: bytes, p: int, fsp: int):
    seconds = int.from_bytes(b[p : p + 4], "big", signed=True)
    if not seconds:  # 0 is MySQL's zero datetime, not 1970-01-01 (temporal_text.py)
        return _temporal.zero_timestamp(fsp)
    t = _utcfromtimestamp(seconds)
    us = _fsp_value(b, p + 4, fsp)
    if us > 0:
        t = t.replace(microsecond=us)
    return t


def json_reader(schema: str, table: str, column: str | None, document: bool = False):
    """f(value bytes) -> MySQL's JSON text of a JSON column (MySQL only: MariaDB's JSON is
    LONGTEXT), as connectors/mysql/json_binary.py prints it (`document=True`: the document, as
    mysql_json.parse returns it, for a partial update); malformed bytes raise
    BinlogDecodeError naming the column."""
    from connectors.mysql import json_binary as _mysql_json

    convert = _mysql_json.parse if document else _mysql_json.document_text

    def read(data: bytes) -> Any:
        try:
            return convert(data)
        except _mysql_json.JsonDecodeError as exc:
            raise BinlogDecodeError(
                f"column {column!r} of {schema}.{table} holds a JSON value MySQL's binary JSON format cannot hold: "
                f"{exc}"
            ) from None

    return read


class Diffs:
    """A partial JSON column of a Partial_update_rows after image: its diffs."""

    __slots__ = ("diffs",)

    def __init__(self, diffs: list):
        self.diffs = diffs


def diffs_reader(schema: str, table: str, column: str | None):
    """f(b, p) -> (Diffs, new p): a partial JSON column's diffs (connectors/mysql/json_diff.py)."""

    from connectors.mysql import json_diff as _json_diff

    def read(b: bytes, p: int) -> tuple[Diffs, int]:
        try:
            diffs, p = _json_diff.read_diffs(b, p, len(b))
        except _json_diff.JsonDiffError as exc:
            raise BinlogDecodeError(
                f"column {column!r} of {schema}.{table}: malformed partial JSON update: {exc}"
            ) from None
        return Diffs(diffs), p

    return read
