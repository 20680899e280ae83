"""MySQL binary JSON written by hand for the tests, from MySQL's format description
(`sql-common/json_binary.h`, the comment at its top; `json_binary.cc` serialize_json_value),
independent of connectors/mysql/json_binary.py, which reads it:

- type byte: 0x00/0x01 small/large object, 0x02/0x03 small/large array, 0x04 literal
  (0 null, 1 true, 2 false), 0x05/0x06 int16/uint16, 0x07/0x08 int32/uint32, 0x09/0x0a
  int64/uint64, 0x0b double, 0x0c string, 0x0f opaque (MySQL column type, size, bytes);
- a container: element count, total size (2 bytes small, 4 large), an object's key
  entries (offset, 2-byte length) in key order (shorter keys first, then byte order), value
  entries (type + the value inlined for literals and 16-bit integers, in a large container
  32-bit integers too; otherwise its offset), keys, values; offsets count from the byte
  after the container's type byte;
- sizes of strings and opaque values: 7 bits a byte, low bits first, high bit = more;
- an integer is stored in the smallest of int16 / int32 / int64 that holds it (uint64
  above the int64 range), as MySQL's Json_int / Json_uint are.
"""

from __future__ import annotations

import struct
from typing import Any

LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING, OPAQUE = (
    0x04,
    0x05,
    0x06,
    0x07,
    0x08,
    0x09,
    0x0A,
    0x0B,
    0x0C,
    0x0F,
)


class Raw:
    """A scalar stored with a chosen type (e.g. a uint16), or an opaque value."""

    def __init__(self, kind: int, body: bytes):
        self.kind, self.body = kind, body


def varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def opaque(field_type: int, data: bytes) -> Raw:
    return Raw(OPAQUE, bytes([field_type]) + varlen(len(data)) + data)


def encode(value: Any, large: bool = False) -> bytes:
    """A whole JSON column value: type byte + value."""
    kind, body = _value(value, large)
    return bytes([kind]) + body


def _value(v: Any, large: bool) -> tuple[int, bytes]:
    if isinstance(v, Raw):
        return v.kind, v.body
    if v is None:
        return LITERAL, b"\x00"
    if v is True:
        return LITERAL, b"\x01"
    if v is False:
        return LITERAL, b"\x02"
    if isinstance(v, int):
        if -(1 << 15) <= v < 1 << 15:
            return INT16, struct.pack("<h", v)
        if -(1 << 31) <= v < 1 << 31:
            return INT32, struct.pack("<i", v)
        if -(1 << 63) <= v < 1 << 63:
            return INT64, struct.pack("<q", v)
        return UINT64, struct.pack("<Q", v)
    if isinstance(v, float):
        return DOUBLE, struct.pack("<d", v)
    if isinstance(v, str):
        raw = v.encode()
        return STRING, varlen(len(raw)) + raw
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        return (0x01 if large else 0x00), _container([k for k, _ in items], [x for _, x in items], large)
    if isinstance(v, list):
        return (0x03 if large else 0x02), _container(None, v, large)
    raise TypeError(v)


def _container(keys: list[str] | None, values: list[Any], large: bool) -> bytes:
    osz = 4 if large else 2
    fmt = "<I" if large else "<H"
    count = len(values)
    pos = 2 * osz + (count * (osz + 2) if keys is not None else 0) + count * (1 + osz)
    key_entries = b""
    key_bytes = b""
    for k in keys or ():
        raw = k.encode()
        key_entries += struct.pack(fmt, pos) + struct.pack("<H", len(raw))
        key_bytes += raw
        pos += len(raw)
    value_entries = b""
    value_bytes = b""
    for v in values:
        kind, body = _value(v, large)
        if kind in (LITERAL, INT16, UINT16) or (large and kind in (INT32, UINT32)):
            value_entries += bytes([kind]) + body.ljust(osz, b"\x00")
        else:
            value_entries += bytes([kind]) + struct.pack(fmt, pos)
            value_bytes += body
            pos += len(body)
    return struct.pack(fmt, count) + struct.pack(fmt, pos) + key_entries + value_entries + key_bytes + value_bytes


def decimal_bytes(digits: str, precision: int, scale: int) -> bytes:
    """MySQL's binary DECIMAL (`strings/decimal.cc` decimal2bin): integer and fraction
    digits in groups of 9 (4 bytes each, big-endian), the leftover leading integer digits
    and trailing fraction digits in 1-4 bytes; a negative number has every byte inverted;
    then the top bit of the first byte is flipped."""
    negative = digits.startswith("-")
    whole, _, frac = digits.lstrip("-").partition(".")
    intg = precision - scale
    whole = whole.rjust(intg, "0")
    frac = frac.ljust(scale, "0")
    size_of = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    out = b""
    lead = intg % 9
    if lead:
        out += int(whole[:lead]).to_bytes(size_of[lead], "big")
    for i in range(lead, intg, 9):
        out += int(whole[i : i + 9]).to_bytes(4, "big")
    full = scale - scale % 9
    for i in range(0, full, 9):
        out += int(frac[i : i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(frac[full:]).to_bytes(size_of[scale % 9], "big")
    raw = bytearray(b ^ 0xFF for b in out) if negative else bytearray(out)
    raw[0] ^= 0x80
    return bytes(raw)


def packed_time(hours: int, minutes: int, seconds: int, micros: int = 0, negative: bool = False) -> bytes:
    """TIME_to_longlong_time_packed (mysys/my_time.cc), stored with int8store."""
    v = (((hours << 12) | (minutes << 6) | seconds) << 24) | micros
    return struct.pack("<q", -v if negative else v)


def packed_datetime(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> bytes:
    """TIME_to_longlong_datetime_packed (a DATE is packed the same with a zero time)."""
    ymd = ((y * 13 + mo) << 5) | d
    hms = (h << 12) | (mi << 6) | s
    return struct.pack("<q", (((ymd << 17) | hms) << 24) | us)
