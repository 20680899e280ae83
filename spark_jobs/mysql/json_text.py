"""The verifier's own reading of MySQL's binary JSON (a JSON column's bytes in a rows
event) and its rendering as the JSON text MySQL itself prints (`SELECT json_col`).

The project's rule for a JSON column (relay and verifier alike): exactly MySQL's text,
`{"a": 1, "b": [1, 2]}` - ", " and ": " separators, object keys in stored order (MySQL
stores them sorted by length, then bytewise), doubles as MySQL prints them, an opaque
DECIMAL as a number with its scale's digits (`123.450`), opaque DATE / TIME / DATETIME /
TIMESTAMP quoted as MySQL prints them (TIME hours may pass 24 and carry a sign; 6
fraction digits but DATE), an opaque VAR_STRING as a string, any other opaque value as
`"base64:type<N>:<base64>"`. This module shares no code with the relay's decoder nor
with python-mysql-replication's JSON parser (which turns decimals into strings and
fails on a TIME over 24 hours).

Layout (MySQL `sql-common/json_binary.h`, header comment; little-endian):

    doc     ::= type value
    type    ::= 0x00 small object | 0x01 large object | 0x02 small array | 0x03 large array
              | 0x04 literal | 0x05 int16 | 0x06 uint16 | 0x07 int32 | 0x08 uint32
              | 0x09 int64 | 0x0a uint64 | 0x0b double | 0x0c utf8mb4 string | 0x0f opaque
    object  ::= count size key-entry* value-entry* key* value*   (count, size, offsets:
                uint16 small / uint32 large; offsets from the start of `count`)
    array   ::= count size value-entry* value*
    key-entry   ::= key-offset key-length(uint16)
    value-entry ::= type offset-or-inlined-value   (inlined: literal, int16, uint16; and in
                    the large format int32, uint32)
    literal ::= 0x00 null | 0x01 true | 0x02 false
    string  ::= data-length (7 bits a byte, low first, high bit = more) utf8mb4-data
    opaque  ::= field-type(1) data-length data
Opaque data: NEWDECIMAL (246) = precision(1) scale(1) MySQL's binary decimal
(`strings/decimal.cc` decimal2bin); DATE (10) / TIME (11) / DATETIME (12) / TIMESTAMP (7)
= 8 bytes, MySQL's packed time (`mysys/my_time.cc` TIME_to_longlong_*_packed).
Rendering: `sql/json_dom.cc` wrapper_to_string / double_quote, `strings/dtoa.cc` my_gcvt,
`mysys/base64.cc` (a newline every 76 characters).

`to_binary` writes a parsed value back (large format), for the partial-update path
(`spark_jobs/mysql/binlog_partial_json.py`) that applies MySQL's JSON diffs to a document.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["Double", "JsonBinaryError", "Opaque", "parse", "render", "to_binary", "to_text"]

_SMALL_OBJ, _LARGE_OBJ, _SMALL_ARR, _LARGE_ARR, _LITERAL = 0x00, 0x01, 0x02, 0x03, 0x04
_INT16, _UINT16, _INT32, _UINT32, _INT64, _UINT64, _DOUBLE, _STRING, _OPAQUE = (
    0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0F,
)  # fmt: skip
_INTS = {_INT16: "<h", _UINT16: "<H", _INT32: "<i", _UINT32: "<I", _INT64: "<q", _UINT64: "<Q"}
_NEWDECIMAL, _DATE, _TIME, _DATETIME, _TIMESTAMP, _VAR_STRING = 246, 10, 11, 12, 7, 253
_MAX_DEPTH = 150  # MySQL refuses documents deeper than 100


class JsonBinaryError(ValueError):
    """Bytes that are not MySQL binary JSON."""


@dataclass(frozen=True)
class Opaque:
    """A value of a MySQL type stored inside JSON (`field_type` is MySQL's column type)."""

    field_type: int
    data: bytes


class Double(float):
    """A JSON double (an integral double stays a double: MySQL prints `1.0`)."""


# ------------------------------------------------------------------------------ parse


def parse(data: bytes) -> Any:
    """A binary JSON document as Python values: dict (stored key order), list, None,
    bool, int, Double, str, Opaque."""
    if not data:
        return None  # an empty JSON value (a column added NOT NULL without a default) reads as null
    try:
        return _value(data[0], memoryview(data), 1, 0)
    except (IndexError, struct.error) as exc:
        raise JsonBinaryError(f"binary JSON cut short ({exc})") from None


def _value(kind: int, buf: memoryview, at: int, depth: int) -> Any:
    if kind in (_SMALL_OBJ, _LARGE_OBJ, _SMALL_ARR, _LARGE_ARR):
        if depth > _MAX_DEPTH:
            raise JsonBinaryError("binary JSON nested too deep")
        return _container(kind, buf, at, depth + 1)
    if kind == _LITERAL:
        return _literal(buf[at])
    if kind in _INTS:
        return struct.unpack_from(_INTS[kind], buf, at)[0]
    if kind == _DOUBLE:
        return Double(struct.unpack_from("<d", buf, at)[0])
    if kind == _STRING:
        size, at = _var_length(buf, at)
        return _utf8(buf, at, size)
    if kind == _OPAQUE:
        field_type = buf[at]
        size, at = _var_length(buf, at + 1)
        if at + size > len(buf):
            raise JsonBinaryError("opaque value runs past the document")
        return Opaque(field_type, bytes(buf[at : at + size]))
    raise JsonBinaryError(f"unknown binary JSON type 0x{kind:02x}")


def _literal(code: int) -> Any:
    if code == 0:
        return None
    if code == 1:
        return True
    if code == 2:
        return False
    raise JsonBinaryError(f"unknown JSON literal 0x{code:02x}")


def _utf8(buf: memoryview, at: int, size: int) -> str:
    if at + size > len(buf):
        raise JsonBinaryError("string runs past the document")
    return bytes(buf[at : at + size]).decode("utf-8", "surrogateescape")


def _var_length(buf: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(5):  # a uint32 at most
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise JsonBinaryError("a data length longer than 5 bytes")


def _container(kind: int, buf: memoryview, base: int, depth: int) -> Any:
    large = kind in (_LARGE_OBJ, _LARGE_ARR)
    word, fmt = (4, "<I") if large else (2, "<H")
    count = struct.unpack_from(fmt, buf, base)[0]
    size = struct.unpack_from(fmt, buf, base + word)[0]
    if base + size > len(buf):
        raise JsonBinaryError(f"container of {size} bytes runs past the document")
    at = base + 2 * word
    keys: list[str] = []
    if kind in (_SMALL_OBJ, _LARGE_OBJ):
        for _ in range(count):
            offset = struct.unpack_from(fmt, buf, at)[0]
            length = struct.unpack_from("<H", buf, at + word)[0]
            keys.append(_utf8(buf, base + offset, length))
            at += word + 2
    values = []
    for _ in range(count):
        vkind = buf[at]
        inlined = vkind in (_LITERAL, _INT16, _UINT16) or (large and vkind in (_INT32, _UINT32))
        if inlined:
            values.append(_value(vkind, buf, at + 1, depth))
        else:
            offset = struct.unpack_from(fmt, buf, at + 1)[0]
            if offset >= size:
                raise JsonBinaryError(f"value offset {offset} outside its container of {size} bytes")
            values.append(_value(vkind, buf, base + offset, depth))
        at += 1 + word
    if kind in (_SMALL_ARR, _LARGE_ARR):
        return values
    return dict(zip(keys, values, strict=True))


# ----------------------------------------------------------------------------- render


def to_text(data: bytes) -> str:
    """A JSON column's bytes as MySQL's JSON text."""
    return render(parse(data))


def render(value: Any) -> str:
    out: list[str] = []
    _render(value, out)
    return "".join(out)


def _render(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(", ")
            out.append(_quote(key))
            out.append(": ")
            _render(item, out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(", ")
            _render(item, out)
        out.append("]")
    elif isinstance(value, float):
        text = gcvt(value)
        out.append(text if "." in text or "e" in text else text + ".0")  # json_dom.cc: a double stays one
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, Opaque):
        out.append(_opaque(value))
    else:
        raise TypeError(f"not a parsed JSON value: {type(value).__name__}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quote(text: str) -> str:
    """json_dom.cc double_quote: `"` `\\` and the C0 controls escaped, nothing else."""
    if not any(c in _ESCAPES or c < " " for c in text):
        return f'"{text}"'
    parts = [_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " else c) for c in text]
    return '"' + "".join(parts) + '"'


def _opaque(value: Opaque) -> str:
    t, data = value.field_type, value.data
    if t == _NEWDECIMAL:
        return decimal_text(data)
    if t in (_DATE, _TIME, _DATETIME, _TIMESTAMP) and len(data) == 8:
        return '"' + packed_time_text(t, struct.unpack("<q", data)[0]) + '"'
    if t == _VAR_STRING:
        return _quote(data.decode("utf-8", "surrogateescape"))
    encoded = base64.b64encode(data).decode("ascii")
    lines = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))  # mysys/base64.cc
    return _quote(f"base64:type{t}:{lines}")


_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def decimal_text(data: bytes) -> str:
    """An opaque DECIMAL (precision, scale, decimal2bin bytes) as MySQL's decimal2string
    prints it: the scale's digits after the point."""
    if len(data) < 2:
        raise JsonBinaryError("an opaque DECIMAL without precision and scale")
    precision, scale = data[0], data[1]
    if scale > precision or precision > 65:
        raise JsonBinaryError(f"an opaque DECIMAL({precision},{scale})")
    intg = precision - scale
    sizes = (
        [_DIG2BYTES[intg % 9]] * bool(intg % 9) + [4] * (intg // 9),
        [4] * (scale // 9) + [_DIG2BYTES[scale % 9]] * bool(scale % 9),
    )
    widths = ([intg % 9] * bool(intg % 9) + [9] * (intg // 9), [9] * (scale // 9) + [scale % 9] * bool(scale % 9))
    raw = bytearray(data[2:])
    if len(raw) != sum(sizes[0]) + sum(sizes[1]):
        raise JsonBinaryError(f"an opaque DECIMAL({precision},{scale}) of {len(raw)} bytes")
    if not raw:
        return "0"
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    at = 0
    parts: list[str] = []
    for size_list, width_list in zip(sizes, widths, strict=True):
        digits = ""
        for size, width in zip(size_list, width_list, strict=True):
            group = int.from_bytes(raw[at : at + size], "big")
            at += size
            digits += str(group).rjust(width, "0")[-width:] if width else ""
        parts.append(digits)
    whole = parts[0].lstrip("0") or "0"
    text = whole + ("." + parts[1] if scale else "")
    if negative and any(c not in "0." for c in text):
        text = "-" + text
    return text


def packed_time_text(field_type: int, packed: int) -> str:
    """MySQL's packed DATE / TIME / DATETIME / TIMESTAMP (my_time.cc) as my_TIME_to_str
    prints it with 6 decimals (DATE without a time)."""
    negative = packed < 0
    packed = -packed if negative else packed
    frac = packed % (1 << 24)
    whole = packed >> 24
    sign = "-" if negative else ""
    if field_type == _TIME:
        hour = (whole >> 12) % (1 << 10)
        minute = (whole >> 6) % (1 << 6)
        second = whole % (1 << 6)
        return f"{sign}{hour:02d}:{minute:02d}:{second:02d}.{frac:06d}"
    ymd, hms = whole >> 17, whole % (1 << 17)
    day, ym = ymd % (1 << 5), ymd >> 5
    year, month = ym // 13, ym % 13
    date = f"{sign}{year:04d}-{month:02d}-{day:02d}"
    if field_type == _DATE:
        return date
    hour, minute, second = hms >> 12, (hms >> 6) % (1 << 6), hms % (1 << 6)
    return f"{date} {hour:02d}:{minute:02d}:{second:02d}.{frac:06d}"


_GCVT_WIDTH = 15 + 4 + 15  # MY_GCVT_MAX_FIELD_WIDTH: DBL_DIG + 4 + max(5, MAX_DECPT_FOR_F_FORMAT)
_MAX_DECPT_FOR_F = 15  # DBL_DIG


def gcvt(x: float) -> str:
    """strings/dtoa.cc my_gcvt(x, MY_GCVT_ARG_DOUBLE, MY_GCVT_MAX_FIELD_WIDTH): the shortest
    digits that read back as x (dtoa mode 4 with more digits than a double holds), in the
    'f' or the 'e' format as my_gcvt chooses. The widths never force rounding here."""
    width = _GCVT_WIDTH - (1 if x < 0 else 0)
    sign = "-" if str(x).startswith("-") else ""
    if x == 0:
        return sign + "0"
    _, digit_tuple, exponent = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    n = len(digits)
    decpt = n + int(exponent)
    exp_len = 1 + (decpt >= 101 or decpt <= -99) + (decpt >= 11 or decpt <= -9)
    f_len = n - decpt + 2 if decpt <= 0 else (n + 1 if decpt < n else decpt)
    have_space = f_len <= width
    force_e = decpt <= 0 and width <= 2 - decpt and width >= 3 + exp_len
    use_f = (
        have_space or (decpt <= width and (decpt >= -1 or (decpt == -2 and (n > 1 or not force_e))) and not force_e)
    ) and (not have_space or (decpt >= -_MAX_DECPT_FOR_F + 1 and (decpt <= _MAX_DECPT_FOR_F or n > decpt)))
    if use_f:
        if decpt <= 0:
            return f"{sign}0.{'0' * -decpt}{digits}"
        if decpt < n:
            return f"{sign}{digits[:decpt]}.{digits[decpt:]}"
        return f"{sign}{digits}{'0' * (decpt - n)}"
    mantissa = digits[0] + ("." + digits[1:] if n > 1 else "")
    return f"{sign}{mantissa}e{decpt - 1}"


# ---------------------------------------------------------------------------- to_binary


def to_binary(value: Any) -> bytes:
    """A parsed value as a binary JSON document (large containers), readable by `parse`
    and by MySQL."""
    kind, body = _encode(value)
    return bytes([kind]) + body


def _encode(value: Any) -> tuple[int, bytes]:
    if value is None or isinstance(value, bool):
        return _LITERAL, bytes([0 if value is None else (1 if value else 2)])
    if isinstance(value, float):
        return _DOUBLE, struct.pack("<d", value)
    if isinstance(value, int):
        for kind in (_INT16, _INT32, _INT64, _UINT64):
            try:
                return kind, struct.pack(_INTS[kind], value)
            except struct.error:
                continue
        raise JsonBinaryError(f"integer {value} does not fit in JSON")
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
        return _STRING, _var_bytes(len(data)) + data
    if isinstance(value, Opaque):
        return _OPAQUE, bytes([value.field_type]) + _var_bytes(len(value.data)) + value.data
    if isinstance(value, dict):
        return _LARGE_OBJ, _encode_container(list(value.keys()), list(value.values()))
    if isinstance(value, list):
        return _LARGE_ARR, _encode_container(None, value)
    raise TypeError(f"not a parsed JSON value: {type(value).__name__}")


def _var_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _encode_container(keys: list[str] | None, values: list[Any]) -> bytes:
    count = len(values)
    key_bytes = [k.encode("utf-8", "surrogateescape") for k in keys] if keys is not None else []
    at = 8 + 6 * len(key_bytes) + 5 * count  # count, size, key entries, value entries
    key_entries = bytearray()
    for k in key_bytes:
        key_entries += struct.pack("<IH", at, len(k))
        at += len(k)
    value_entries = bytearray()
    bodies = bytearray()
    for item in values:
        kind, body = _encode(item)
        if kind == _LITERAL:  # inlined (so are int16 / int32 in the large format)
            value_entries += bytes([kind]) + body + b"\x00\x00\x00"
        elif kind in (_INT16, _INT32):
            value_entries += bytes([kind]) + struct.pack("<i", struct.unpack(_INTS[kind], body)[0])
        else:
            value_entries += bytes([kind]) + struct.pack("<I", at)
            bodies += body
            at += len(body)
    return struct.pack("<II", count, at) + bytes(key_entries) + bytes(value_entries) + b"".join(key_bytes) + bodies
