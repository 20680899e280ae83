"""The verifier's reading of DATE / DATETIME / TIMESTAMP / YEAR values, as MySQL stores them.

python-mysql-replication 1.0.17 reads a zero or partly-zero DATE / DATETIME (`0000-00-00`,
`2024-00-00`, allowed by sql_mode) and a day a month lacks (`2024-02-31`,
ALLOW_INVALID_DATES) as None, a TIMESTAMP of 0 seconds (MySQL's zero datetime) as
1970-01-01 00:00:00 and YEAR 0000 as 1900: a value where there was another, or NULL where
there was a value. So `binlog_table_map.TableMapRewriter` gives the library these columns
as BIT(8 * size) - same value layout, the bytes handed over as a string of bits - or, when
the size is that of an integer type, as that integer (cheaper to read), and the reader
turns them back here: a value the library reads right as the library reads it
(date, datetime, int), the others as the text MySQL prints (docs/mysql.md, "Zero-like
values"), as the relay's decoder publishes them. Written from MySQL's layouts, not from
the relay's code (the verifier is independent of it):

  DATE       3 bytes little-endian: day | month << 5 | year << 9
  DATETIME   8 bytes little-endian: YYYYMMDDhhmmss as a decimal number (before 5.6.4)
  DATETIME2  5 bytes big-endian: sign bit, 17 bits year*13+month, 5 day, 5 hour, 6 minute,
             6 second; then (fsp + 1) // 2 bytes of fraction, big-endian, signed
  TIMESTAMP  4 bytes little-endian seconds; TIMESTAMP2: 4 bytes big-endian and the fraction;
             0 seconds is `0000-00-00 00:00:00` (Field_timestampf::get_date_internal)
  YEAR       1 byte: 0 is 0000, 1..255 are 1901..2155

(mysys/my_time.cc my_datetime_packed_from_binary, sql/field.cc Field_year;
my_datetime_to_str prints fsp fraction digits.)
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

__all__ = ["INTEGER_TYPE_OF_SIZE", "RAW_TYPES", "raw_size", "reader"]

_TIMESTAMP, _DATE, _DATETIME, _YEAR, _TIMESTAMP2, _DATETIME2 = 7, 10, 12, 13, 17, 18
RAW_TYPES = frozenset({_TIMESTAMP, _DATE, _DATETIME, _YEAR, _TIMESTAMP2, _DATETIME2})


def raw_size(kind: int, fsp: int) -> int:
    """Bytes of one value of a column of this type (and fsp from its metadata)."""
    fraction = (fsp + 1) // 2
    return {_TIMESTAMP: 4, _DATE: 3, _DATETIME: 8, _YEAR: 1, _TIMESTAMP2: 4 + fraction, _DATETIME2: 5 + fraction}[kind]


def _text(y: int, mo: int, d: int, h: int | None = None, mi: int = 0, s: int = 0, us: int = 0, fsp: int = 0) -> str:
    out = f"{y:04d}-{mo:02d}-{d:02d}"
    if h is None:
        return out
    out += f" {h:02d}:{mi:02d}:{s:02d}"
    return out + ("." + f"{max(us, 0):06d}"[:fsp] if fsp else "")


def _fraction(data: bytes, fsp: int) -> int:
    """The fraction in microseconds, as the library computes it (signed; odd fsp / 10)."""
    if not fsp:
        return 0
    v = int.from_bytes(data, "big", signed=True)
    if fsp % 2:
        v = int(v / 10)
    return v * 10 ** (6 - fsp)


def _date(data: bytes) -> Any:
    t = int.from_bytes(data, "little")
    y, mo, d = (t >> 9) & 0x7FFF, (t >> 5) & 0xF, t & 0x1F
    try:
        return datetime.date(y, mo, d)
    except ValueError:
        return _text(y, mo, d)


def _datetime_old(data: bytes) -> Any:
    value = int.from_bytes(data, "little")
    date, time = divmod(value, 1000000)
    parts = (date // 10000, date // 100 % 100, date % 100, time // 10000, time // 100 % 100, time % 100)
    try:
        return datetime.datetime(*parts)
    except ValueError:
        return _text(*parts)


def _datetime2(fsp: int) -> Callable[[bytes], Any]:
    def read(data: bytes) -> Any:
        d = int.from_bytes(data[:5], "big")
        ym = (d >> 22) & 0x1FFFF
        parts = (ym // 13, ym % 13, (d >> 17) & 0x1F, (d >> 12) & 0x1F, (d >> 6) & 0x3F, d & 0x3F)
        us = _fraction(data[5:], fsp)
        try:
            value = datetime.datetime(*parts)
        except ValueError:
            return _text(*parts, us=us, fsp=fsp)
        return value.replace(microsecond=us) if us > 0 else value

    return read


def _timestamp(fsp: int, little: bool) -> Callable[[bytes], Any]:
    def read(data: bytes) -> Any:
        seconds = int.from_bytes(data[:4], "little") if little else int.from_bytes(data[:4], "big", signed=True)
        if not seconds:
            return _text(0, 0, 0, 0, fsp=fsp)
        value = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(tzinfo=None)
        us = _fraction(data[4:], fsp)
        return value.replace(microsecond=us) if us > 0 else value

    return read


def _year(data: bytes) -> int:
    return data[0] + 1900 if data[0] else 0


# The library's integer types by size in bytes (TINY, SHORT, INT24, LONG, LONGLONG): a
# column of one of these sizes reaches the library as that integer (little-endian, as the
# library reads it), which costs a few operations; BIT costs a loop over every bit.
INTEGER_TYPE_OF_SIZE = {1: 1, 2: 2, 3: 9, 4: 3, 8: 8}


def reader(kind: int, fsp: int, as_integer: bool = False) -> Callable[[Any], Any]:
    """f(the library's value for the column's bytes) -> the value: with `as_integer` the
    integer the library read them as (`INTEGER_TYPE_OF_SIZE`, signed or not), else its
    string of bits (BIT)."""
    size = raw_size(kind, fsp)
    read: Callable[[bytes], Any]
    if kind == _DATE:
        read = _date
    elif kind == _DATETIME:
        read = _datetime_old
    elif kind == _DATETIME2:
        read = _datetime2(fsp)
    elif kind == _YEAR:
        read = _year
    else:
        read = _timestamp(fsp if kind == _TIMESTAMP2 else 0, kind == _TIMESTAMP)

    def from_bits(bits: str) -> Any:
        return read(int(bits, 2).to_bytes(size, "big"))

    def from_integer(value: int) -> Any:
        # the bytes as stored: the library read them little-endian (signed when the
        # Table_map's SIGNEDNESS bit is 0; to_bytes gives the same bytes back either way)
        return read(value.to_bytes(size, "little", signed=value < 0))

    return from_integer if as_integer else from_bits
