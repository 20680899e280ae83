"""MySQL's binary JSON, the encoder: Python values -> the bytes a JSON column holds.

Layout (MySQL `sql-common/json_binary.cc`, documented in the header of
`sql-common/json_binary.h`; all integers little-endian):

    doc       ::= type value
    type      ::= 0x00 small object | 0x01 large object | 0x02 small array | 0x03 large array
                | 0x04 literal | 0x05 int16 | 0x06 uint16 | 0x07 int32 | 0x08 uint32
                | 0x09 int64 | 0x0a uint64 | 0x0b double | 0x0c utf8mb4 string | 0x0f opaque
    object    ::= element-count size key-entry* value-entry* key* value*
    array     ::= element-count size value-entry* value*
                  (count, size and offsets are 2 bytes in a small container, 4 in a large one;
                  offsets count from the first byte of the container, after its type byte)
    key-entry ::= key-offset key-length(2 bytes, both sizes)
    value-entry ::= type offset-or-inlined-value
                  (literals and int16/uint16 are inlined in both sizes; int32/uint32 only in
                  a large container)
    literal   ::= 0x00 null | 0x01 true | 0x02 false
    string    ::= data-length utf8mb4-data        (data-length: 7 bits a byte, low first,
                                                   high bit set while more bytes follow)
    opaque    ::= field-type data-length data     (field-type: MySQL's enum_field_types)

Keys are stored sorted by length, then byte by byte (`json_binary.cc` serialize_json_object
writes them in the order of `Json_object`'s key comparator, "shorter keys first"). A
container is written small unless an offset or its size does not fit 16 bits
(`serialize_json_value` retries large on `VALUE_TOO_BIG`).

Opaque values (`sql/json_dom.cc` Json_decimal::get_binary, Json_datetime::to_packed):
DECIMAL is precision (1 byte), scale (1 byte), then MySQL's binary decimal; DATE / TIME /
DATETIME / TIMESTAMP are the 8-byte packed integer of `mysys/my_time.cc`
(TIME_to_longlong_*_packed); BLOB / BIT / others are their raw bytes.

Python values map as MySQL's JSON functions build them: None/True/False literals, int
(int16/int32/int64 by size; above INT64_MAX uint64), `JsonUInt` (an unsigned column's
value: uint16/uint32/uint64), float (double), str, dict (object), list/tuple (array),
`decimal.Decimal` (opaque DECIMAL), `datetime.date` / `datetime.datetime` (opaque DATE /
DATETIME), `datetime.timedelta` (opaque TIME, negative or over 24 hours allowed),
`JsonTimestamp` (opaque TIMESTAMP), `JsonOpaque` (any other field type: BLOB, BIT, ...).

Partial updates (`sql/json_diff.cc` Json_diff_vector::write_binary, Json_diff::write_binary):
the column holds a 4-byte length, then per diff: operation (1 byte: 0 REPLACE, 1 INSERT,
2 REMOVE), the path's text (length as a net_field_length integer, then the text), and,
unless REMOVE, the value's binary JSON (its length as a net_field_length, then type + value).
"""

from __future__ import annotations

import datetime
import decimal
import struct
from dataclasses import dataclass

from testbed.mysql_lab.packed_int import net_field_length

__all__ = [
    "JsonDecimal",
    "JsonDiff",
    "JsonOpaque",
    "JsonTimestamp",
    "JsonUInt",
    "decimal_binary",
    "encode_diffs",
    "encode_json",
]

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0x00, 0x01, 0x02, 0x03
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
LITERAL_NULL, LITERAL_TRUE, LITERAL_FALSE = 0x00, 0x01, 0x02

# enum_field_types (include/field_types.h) of the opaque values MySQL stores
FIELD_TIMESTAMP, FIELD_DATE, FIELD_TIME, FIELD_DATETIME, FIELD_BIT = 7, 10, 11, 12, 16
FIELD_NEWDECIMAL, FIELD_BLOB, FIELD_VAR_STRING = 246, 252, 253

REPLACE, INSERT, REMOVE = 0, 1, 2  # enum_json_diff_operation (sql/json_diff.h)

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


@dataclass(frozen=True)
class JsonUInt:
    """An unsigned integer (what JSON_OBJECT makes of an UNSIGNED column): uint16/32/64."""

    value: int


@dataclass(frozen=True)
class JsonDecimal:
    """A DECIMAL with the precision and scale MySQL keeps (a DECIMAL(10,2) column's value
    keeps 10 and 2); a bare `decimal.Decimal` takes the digits it has."""

    value: decimal.Decimal
    precision: int
    scale: int


@dataclass(frozen=True)
class JsonTimestamp:
    """A TIMESTAMP value (opaque type 7); a plain datetime is a DATETIME (type 12)."""

    value: datetime.datetime


@dataclass(frozen=True)
class JsonOpaque:
    """Raw bytes of another MySQL type (BLOB 252, BIT 16, VAR_STRING 253, ...)."""

    field_type: int
    data: bytes


@dataclass(frozen=True)
class JsonDiff:
    """One entry of a partial update: JSON_SET/JSON_REPLACE -> REPLACE or INSERT,
    JSON_REMOVE -> REMOVE. `path` is MySQL's path text, e.g. `$.a` or `$.b[1]`."""

    operation: int
    path: str
    value: object = None


def _data_length(n: int) -> bytes:
    """json_binary.cc append_variable_length: 7 bits per byte, low bits first."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- MySQL's binary DECIMAL (strings/decimal.cc decimal2bin) ---------------------------------

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_binary(value: decimal.Decimal, precision: int, scale: int) -> bytes:
    """decimal2bin: the integral and fractional digits in groups of 9 (4 bytes each,
    big-endian) with the leftover digits in the fewest bytes; the sign bit of the first
    byte flipped; negative numbers stored with every byte inverted."""
    if not value.is_finite():
        raise ValueError(f"DECIMAL cannot hold {value}")
    negative = value.is_signed() and value != 0
    with decimal.localcontext() as ctx:
        ctx.prec = 200  # DECIMAL holds up to 65 digits; the default context keeps 28
        quantized = abs(value).quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
    digits = format(quantized, "f")
    int_part, _, frac_part = digits.partition(".")
    frac_part = frac_part.ljust(scale, "0")[:scale]
    intg = precision - scale
    if len(int_part.lstrip("0")) > intg:
        raise ValueError(f"{value} does not fit DECIMAL({precision},{scale})")
    int_part = int_part.rjust(intg, "0")[-intg:] if intg else ""
    out = bytearray()
    lead = intg % 9
    if lead:
        out += int(int_part[:lead] or "0").to_bytes(_DIG2BYTES[lead], "big")
    for i in range(lead, intg, 9):
        out += int(int_part[i : i + 9]).to_bytes(4, "big")
    full = scale // 9
    for i in range(full):
        out += int(frac_part[i * 9 : i * 9 + 9]).to_bytes(4, "big")
    trail = scale % 9
    if trail:
        out += int(frac_part[full * 9 :]).to_bytes(_DIG2BYTES[trail], "big")
    if not out:
        out = bytearray(b"\x00")
    if negative:
        out = bytearray(b ^ 0xFF for b in out)
    out[0] ^= 0x80
    return bytes(out)


def _decimal_shape(value: decimal.Decimal) -> tuple[int, int]:
    """(precision, scale) of a Decimal as MySQL parses its text: digits before the point
    (at least 1) plus the digits after it."""
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    intg = max(1, len(digits) + exponent) if digits else 1
    return intg + scale, scale


# -- packed temporal values (mysys/my_time.cc) ---------------------------------------------


def datetime_packed(value: datetime.datetime) -> int:
    """TIME_to_longlong_datetime_packed: ((ymd << 17 | hms) << 24) + microseconds, with
    ymd = (year * 13 + month) << 5 | day and hms = hour << 12 | minute << 6 | second."""
    ymd = ((value.year * 13 + value.month) << 5) | value.day
    hms = (value.hour << 12) | (value.minute << 6) | value.second
    return (((ymd << 17) | hms) << 24) + value.microsecond


def date_packed(value: datetime.date) -> int:
    """TIME_to_longlong_date_packed: the DATETIME packing with a zero time."""
    ymd = ((value.year * 13 + value.month) << 5) | value.day
    return (ymd << 17) << 24


def time_packed(value: datetime.timedelta) -> int:
    """TIME_to_longlong_time_packed: (hours << 12 | minutes << 6 | seconds) << 24 plus
    microseconds, of the absolute value, negated for a negative TIME (hours go past 24)."""
    micros = abs(value) // datetime.timedelta(microseconds=1)
    seconds, frac = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    packed = (((hours << 12) | (minutes << 6) | secs) << 24) + frac
    return -packed if value < datetime.timedelta(0) else packed


# -- the encoder -------------------------------------------------------------------------


def encode_json(value: object) -> bytes:
    """The bytes of a JSON column holding `value`: type byte, then the value."""
    kind, data = _value(value)
    return bytes([kind]) + data


def _int_kind(n: int) -> tuple[int, bytes]:
    if -(1 << 15) <= n < 1 << 15:
        return INT16, struct.pack("<h", n)
    if -(1 << 31) <= n < 1 << 31:
        return INT32, struct.pack("<i", n)
    if _INT64_MIN <= n <= _INT64_MAX:
        return INT64, struct.pack("<q", n)
    if n <= _UINT64_MAX:
        return UINT64, struct.pack("<Q", n)
    raise ValueError(f"JSON integer {n} is outside MySQL's 64-bit range")


def _uint_kind(n: int) -> tuple[int, bytes]:
    if n < 0:
        raise ValueError(f"JsonUInt({n}) is negative")
    if n < 1 << 16:
        return UINT16, struct.pack("<H", n)
    if n < 1 << 32:
        return UINT32, struct.pack("<I", n)
    if n <= _UINT64_MAX:
        return UINT64, struct.pack("<Q", n)
    raise ValueError(f"JSON integer {n} is outside MySQL's 64-bit range")


def _opaque(field_type: int, data: bytes) -> tuple[int, bytes]:
    return OPAQUE, bytes([field_type]) + _data_length(len(data)) + data


def _value(value: object) -> tuple[int, bytes]:
    """(type, value bytes) of one JSON value."""
    if value is None:
        return LITERAL, bytes([LITERAL_NULL])
    if value is True:
        return LITERAL, bytes([LITERAL_TRUE])
    if value is False:
        return LITERAL, bytes([LITERAL_FALSE])
    if isinstance(value, int):
        return _int_kind(value)
    if isinstance(value, JsonUInt):
        return _uint_kind(value.value)
    if isinstance(value, float):
        return DOUBLE, struct.pack("<d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return STRING, _data_length(len(raw)) + raw
    if isinstance(value, dict):
        return _container(value, True)
    if isinstance(value, list | tuple):
        return _container(list(value), False)
    if isinstance(value, JsonDecimal):
        body = bytes([value.precision, value.scale]) + decimal_binary(value.value, value.precision, value.scale)
        return _opaque(FIELD_NEWDECIMAL, body)
    if isinstance(value, decimal.Decimal):
        precision, scale = _decimal_shape(value)
        return _value(JsonDecimal(value, precision, scale))
    if isinstance(value, JsonTimestamp):
        return _opaque(FIELD_TIMESTAMP, struct.pack("<q", datetime_packed(value.value)))
    if isinstance(value, datetime.datetime):
        return _opaque(FIELD_DATETIME, struct.pack("<q", datetime_packed(value)))
    if isinstance(value, datetime.date):
        return _opaque(FIELD_DATE, struct.pack("<q", date_packed(value)))
    if isinstance(value, datetime.timedelta):
        return _opaque(FIELD_TIME, struct.pack("<q", time_packed(value)))
    if isinstance(value, JsonOpaque):
        return _opaque(value.field_type, value.data)
    raise TypeError(f"no MySQL JSON encoding for {type(value).__name__}")


def _inlined(kind: int, large: bool) -> bool:
    return kind in (LITERAL, INT16, UINT16) or (large and kind in (INT32, UINT32))


def _container(value: dict | list, is_object: bool) -> tuple[int, bytes]:
    small = _container_bytes(value, is_object, large=False)
    if small is not None:
        return (SMALL_OBJECT if is_object else SMALL_ARRAY), small
    large = _container_bytes(value, is_object, large=True)
    assert large is not None
    return (LARGE_OBJECT if is_object else LARGE_ARRAY), large


def _container_bytes(value: dict | list, is_object: bool, large: bool) -> bytes | None:
    """The container after its type byte, or None when a small one cannot hold it."""
    width = 4 if large else 2
    limit = 1 << (32 if large else 16)
    pack = struct.Struct("<I" if large else "<H").pack
    if is_object:
        assert isinstance(value, dict)
        keys = sorted((k.encode("utf-8") for k in value), key=lambda k: (len(k), k))
        values = [value[k.decode("utf-8")] for k in keys]
    else:
        keys = []
        values = list(value)
    count = len(values)
    if count >= limit:
        return None
    # header (count, size), key entries (offset, 2-byte length), value entries (type, offset/value)
    offset = 2 * width + count * ((width + 2) if is_object else 0) + count * (1 + width)
    key_entries = bytearray()
    for k in keys:
        if len(k) > 0xFFFF:
            raise ValueError("a JSON object key longer than 65535 bytes")
        if offset >= limit:
            return None
        key_entries += pack(offset) + struct.pack("<H", len(k))
        offset += len(k)
    value_entries = bytearray()
    data = bytearray()
    for v in values:
        kind, raw = _value(v)
        if _inlined(kind, large):
            value_entries += bytes([kind]) + raw.ljust(width, b"\x00")
            continue
        if offset >= limit:
            return None
        value_entries += bytes([kind]) + pack(offset)
        data += raw
        offset += len(raw)
    if offset >= limit:
        return None
    return pack(count) + pack(offset) + bytes(key_entries) + bytes(value_entries) + b"".join(keys) + bytes(data)


def encode_diffs(diffs: list[JsonDiff]) -> bytes:
    """A partial JSON column value: 4-byte length, then each diff (see the module docstring)."""
    body = bytearray()
    for diff in diffs:
        if diff.operation not in (REPLACE, INSERT, REMOVE):
            raise ValueError(f"unknown JSON diff operation {diff.operation}")
        path = diff.path.encode("utf-8")
        body += bytes([diff.operation]) + net_field_length(len(path)) + path
        if diff.operation != REMOVE:
            doc = encode_json(diff.value)
            body += net_field_length(len(doc)) + doc
    return struct.pack("<I", len(body)) + bytes(body)
