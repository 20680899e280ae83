"""MySQL's binary JSON (the value of a JSON column in a row event) -> MySQL's JSON text.

The text is what `SELECT json_col` prints on a MySQL server: `{"a": 1, "b": [1, 2]}`, with
", " and ": " between items, an object's keys in the order MySQL stores them (by length,
then byte by byte), strings escaped as MySQL escapes them, doubles in MySQL's shortest
form, a DECIMAL inside a document as a number, temporal values as quoted text with six
fraction digits and other opaque values as `"base64:type<N>:<base64>"`.

Binary format (MySQL `sql-common/json_binary.h`, the comment at its top, and
`json_binary.cc`): a type byte, then the value.

    0x00 / 0x01  object, small (2-byte offsets and sizes) / large (4-byte)
    0x02 / 0x03  array, small / large
    0x04 literal (1 byte: 0 null, 1 true, 2 false)
    0x05 / 0x06 int16 / uint16, 0x07 / 0x08 int32 / uint32, 0x09 / 0x0a int64 / uint64,
    0x0b double (8 bytes), all little-endian
    0x0c string: its length as a variable-length integer (7 bits a byte, low bits first,
         high bit set on all but the last byte), then utf8mb4 bytes
    0x0f opaque: a MySQL column type (1 byte), a variable-length length, the bytes

An object or array: element count, total size (both 2 or 4 bytes), an object's key
entries (key offset 2/4 bytes, key length 2 bytes), the value entries (type 1 byte, then
the value inlined when it is a literal or a 16-bit integer, and in a large container
also a 32-bit integer; otherwise the offset of the value), then keys and values. Offsets
count from the first byte after the container's type byte.

Text (MySQL `sql-common/json_dom.cc`, `wrapper_to_string`, `double_quote`,
`escape_character`): `"`, `\\`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t` escaped with a backslash,
other characters up to 0x1f as `\\u00xx`, everything else as is. A double is printed by
`my_gcvt(d, MY_GCVT_ARG_DOUBLE, MY_GCVT_MAX_FIELD_WIDTH)` (`strings/dtoa.cc`) with ".0"
appended when that text has neither "." nor "e". An opaque DECIMAL (precision 1 byte,
scale 1 byte, MySQL's binary decimal) is printed by `decimal2string`; DATE, TIME,
DATETIME and TIMESTAMP (a packed 8-byte integer, `TIME_to_longlong_*_packed` in
`mysys/my_time.cc`) by `my_TIME_to_str(t, 6)`; an opaque VAR_STRING as a string; any
other opaque value as `"base64:type<N>:"` and MySQL's base64 (`mysys/base64.cc`: a newline
after every 76 characters, which the string escaping turns into `\\n`).

The parsed document (`parse`) is plain Python values (dict, list, str, int, float, None,
bool) and `Decimal` / `Temporal` / `Opaque` for the opaque values, so that a partial
update (connectors/mysql/json_diff.py) can be applied to it before it is printed (`text`).
"""

from __future__ import annotations

import base64
import struct
from decimal import Decimal as _PyDecimal
from typing import Any

__all__ = ["JsonDecimal", "JsonDecodeError", "Opaque", "Temporal", "document_text", "parse", "parse_value", "text"]


class JsonDecodeError(ValueError):
    """Bytes that are not a value MySQL's binary JSON format can hold."""


# MySQL never stores a document deeper than JSON_DOCUMENT_MAX_DEPTH (100); deeper bytes are corrupt
MAX_DEPTH = 100

_I16 = struct.Struct("<h").unpack_from
_U16 = struct.Struct("<H").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct("<d").unpack_from

# MySQL column types an opaque value may carry that MySQL prints other than as base64
T_TIMESTAMP, T_DATE, T_TIME, T_DATETIME, T_NEWDECIMAL, T_VAR_STRING = 7, 10, 11, 12, 246, 253


class JsonDecimal:
    """A DECIMAL inside a document, kept as MySQL's text of it (printed as a number)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JsonDecimal) and other.text == self.text

    def __repr__(self) -> str:
        return f"JsonDecimal({self.text!r})"


class Temporal:
    """A DATE / TIME / DATETIME / TIMESTAMP inside a document, as MySQL prints it (quoted)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Temporal) and other.text == self.text

    def __repr__(self) -> str:
        return f"Temporal({self.text!r})"


class Opaque:
    """Any other opaque value: its MySQL column type and bytes."""

    __slots__ = ("data", "type")

    def __init__(self, type_: int, data: bytes):
        self.type, self.data = type_, data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and (other.type, other.data) == (self.type, self.data)

    def __repr__(self) -> str:
        return f"Opaque({self.type}, {self.data!r})"


# -- binary -> document ----------------------------------------------------------------------


def parse(data: bytes) -> Any:
    """A whole JSON column value (type byte + value) -> the document. An empty value is
    the JSON null literal, as MySQL reads it (`json_binary::parse_binary`: an empty value
    comes from an INSERT IGNORE of NULL into a NOT NULL column)."""
    if not data:
        return None
    return parse_value(data[0], memoryview(data)[1:], 0)


def parse_value(kind: int, data: memoryview | bytes, depth: int) -> Any:
    """The value of type `kind` whose bytes start at data[0] (`json_binary.cc` parse_value)."""
    if kind <= 0x03:
        if depth >= MAX_DEPTH:
            raise JsonDecodeError(f"nested deeper than MySQL's limit of {MAX_DEPTH}")
        return _container(kind, data, depth + 1)
    return _scalar(kind, data, 0, len(data))


def _need(end: int, limit: int) -> None:
    if end > limit:
        raise JsonDecodeError(f"a value runs past the end of its data ({end} > {limit} bytes)")


def _variable_length(data, p: int, end: int) -> tuple[int, int]:
    """MySQL's read_variable_length: at most 5 bytes of 7 bits, low bits first."""
    length = 0
    for i in range(5):
        if p + i >= end:
            break
        b = data[p + i]
        length |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if length > 0xFFFFFFFF:
                break
            return length, p + i + 1
    raise JsonDecodeError("malformed variable-length size")


def _scalar(kind: int, data, p: int, end: int) -> Any:
    if kind == 0x04:
        _need(p + 1, end)
        lit = data[p]
        if lit == 0:
            return None
        if lit == 1:
            return True
        if lit == 2:
            return False
        raise JsonDecodeError(f"unknown literal {lit}")
    if kind == 0x05:
        _need(p + 2, end)
        return _I16(data, p)[0]
    if kind == 0x06:
        _need(p + 2, end)
        return _U16(data, p)[0]
    if kind == 0x07:
        _need(p + 4, end)
        return _I32(data, p)[0]
    if kind == 0x08:
        _need(p + 4, end)
        return _U32(data, p)[0]
    if kind == 0x09:
        _need(p + 8, end)
        return _I64(data, p)[0]
    if kind == 0x0A:
        _need(p + 8, end)
        return _U64(data, p)[0]
    if kind == 0x0B:
        _need(p + 8, end)
        return _F64(data, p)[0]
    if kind == 0x0C:
        n, q = _variable_length(data, p, end)
        if q + n > end:
            raise JsonDecodeError(f"a string of {n} bytes runs past the end of its data")
        return _utf8(data[q : q + n])
    if kind == 0x0F:
        _need(p + 1, end)
        field_type = data[p]
        n, q = _variable_length(data, p + 1, end)
        if q + n > end:
            raise JsonDecodeError(f"an opaque value of {n} bytes runs past the end of its data")
        return _opaque(field_type, bytes(data[q : q + n]))
    raise JsonDecodeError(f"unknown value type 0x{kind:02x}")


def _utf8(raw) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise JsonDecodeError(f"a string is not utf8mb4 ({exc.reason} at byte {exc.start})") from None


def _container(kind: int, data, depth: int) -> Any:
    """`json_binary.cc` parse_array_or_object and Value::element / key."""
    large = kind & 1
    osz = 4 if large else 2
    read = _U32 if large else _U16
    length = len(data)
    if length < 2 * osz:
        raise JsonDecodeError("a container shorter than its header")
    count = read(data, 0)[0]
    size = read(data, osz)[0]
    if size > length:
        raise JsonDecodeError(f"a container of {size} bytes in {length}")
    is_object = kind <= 0x01
    key_entry = osz + 2
    value_entry = 1 + osz
    values_at = 2 * osz + (count * key_entry if is_object else 0)
    if values_at + count * value_entry > size:
        raise JsonDecodeError(f"a container header of {count} entries larger than its {size} bytes")
    values = []
    for i in range(count):
        e = values_at + i * value_entry
        t = data[e]
        if t == 0x04 or t == 0x05 or t == 0x06 or (large and (t == 0x07 or t == 0x08)):
            values.append(_scalar(t, data, e + 1, e + value_entry))
            continue
        offset = read(data, e + 1)[0]
        if offset >= size:
            raise JsonDecodeError(f"a value offset {offset} past its container's {size} bytes")
        if t <= 0x03:
            if depth >= MAX_DEPTH:
                raise JsonDecodeError(f"nested deeper than MySQL's limit of {MAX_DEPTH}")
            values.append(_container(t, data[offset:size], depth + 1))
        else:
            values.append(_scalar(t, data, offset, size))
    if not is_object:
        return values
    out = {}
    for i in range(count):
        e = 2 * osz + i * key_entry
        key_at = read(data, e)[0]
        key_len = _U16(data, e + osz)[0]
        if key_at + key_len > size:
            raise JsonDecodeError("a key past the end of its object")
        out[_utf8(data[key_at : key_at + key_len])] = values[i]
    return out


def _opaque(field_type: int, data: bytes) -> Any:
    if field_type == T_NEWDECIMAL:
        return JsonDecimal(_decimal_text(data))
    if field_type in (T_DATE, T_TIME, T_DATETIME, T_TIMESTAMP):
        return Temporal(_temporal_text(field_type, data))
    if field_type == T_VAR_STRING:  # json_dom.cc: "Treat strings saved in opaque as plain json strings"
        return _utf8(data)
    return Opaque(field_type, data)


_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def _decimal_text(data: bytes) -> str:
    """Precision, scale, MySQL's binary decimal (`strings/decimal.cc` bin2decimal) ->
    `decimal2string`'s text: no leading zeros, exactly `scale` fraction digits."""
    if len(data) < 2:
        raise JsonDecodeError("an opaque DECIMAL without its precision and scale")
    precision, scale = data[0], data[1]
    if not 1 <= precision <= 65 or scale > 30 or scale > precision:
        raise JsonDecodeError(f"an opaque DECIMAL({precision},{scale})")
    return decimal_digits(precision, scale, data, 2)[0]


def decimal_digits(precision: int, scale: int, b: bytes, p: int) -> tuple[str, int]:
    """MySQL's binary DECIMAL(precision, scale) at b[p:] -> (its text as `decimal2string`
    writes it, the position after it)."""
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    size = _DIG2BYTES[intg0x] + 4 * (intg0 + frac0) + _DIG2BYTES[frac0x]
    if p + size > len(b) or size == 0:
        raise JsonDecodeError(f"a DECIMAL({precision},{scale}) shorter than its {size} bytes")
    raw = bytearray(b[p : p + size])
    negative = not raw[0] & 0x80
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(x ^ 0xFF for x in raw)
    q = 0
    parts = []

    def group(nbytes: int, digits: int) -> None:
        nonlocal q
        v = int.from_bytes(raw[q : q + nbytes], "big")
        if v >= 10**digits:
            raise JsonDecodeError(f"a DECIMAL({precision},{scale}) with a group of more than {digits} digits")
        parts.append(f"{v:0{digits}d}")
        q += nbytes

    if intg0x:
        group(_DIG2BYTES[intg0x], intg0x)
    for _ in range(intg0):
        group(4, 9)
    integer = "".join(parts).lstrip("0") or "0"
    parts = []
    for _ in range(frac0):
        group(4, 9)
    if frac0x:
        group(_DIG2BYTES[frac0x], frac0x)
    text = integer + ("." + "".join(parts) if scale else "")
    return ("-" + text if negative else text), p + size


def _temporal_text(field_type: int, data: bytes) -> str:
    """A packed temporal value (`TIME_from_longlong_*_packed`, mysys/my_time.cc) as
    `my_TIME_to_str(t, 6)` prints it."""
    if len(data) != 8:
        raise JsonDecodeError(f"an opaque temporal value of {len(data)} bytes (MySQL writes 8)")
    packed = _I64(data, 0)[0]
    negative = packed < 0
    if negative:
        packed = -packed
    frac = packed % (1 << 24)
    whole = packed >> 24
    if field_type == T_TIME:
        hms = whole
        hour = (hms >> 12) % (1 << 10)
        text = f"{hour:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}.{frac:06d}"
        return "-" + text if negative else text
    ymd, hms = whole >> 17, whole % (1 << 17)
    ym = ymd >> 5
    date = f"{ym // 13:04d}-{ym % 13:02d}-{ymd % 32:02d}"
    if field_type == T_DATE:
        return date
    return f"{date} {hms >> 12:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}.{frac:06d}"


# -- document -> text ---------------------------------------------------------------------------

_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"})


def quote(s: str) -> str:
    """`double_quote` of json_dom.cc."""
    return '"' + s.translate(_ESCAPES) + '"'


def double_text(d: float) -> str:
    """`my_gcvt(d, MY_GCVT_ARG_DOUBLE, MY_GCVT_MAX_FIELD_WIDTH)` (strings/dtoa.cc) and the
    ".0" json_dom.cc appends. dtoa mode 4 with that width yields the shortest digits that
    read back as `d` (Python's repr finds the same digits, with the same algorithm)."""
    if d != d or d in (float("inf"), float("-inf")):
        return "0.0"  # dtoa's overflow: my_gcvt writes "0" (MySQL never stores these)
    sign = "-" if str(d)[0] == "-" else ""  # dtoa sets the sign of -0.0 too
    width = 34 - (1 if d < 0 else 0)  # MY_GCVT_MAX_FIELD_WIDTH = DBL_DIG + 4 + max(5, DBL_DIG)
    if d == 0:
        digits, decpt = "0", 1
    else:
        _, ds, exp = _PyDecimal(repr(abs(d))).as_tuple()
        digits = "".join(map(str, ds)).rstrip("0")
        decpt = len(ds) + int(exp)
    n = len(digits)
    exp_len = 1 + (decpt >= 101 or decpt <= -99) + (decpt >= 11 or decpt <= -9)
    have_space = (n - decpt + 2 if decpt <= 0 else n + 1 if decpt < n else decpt) <= width
    force_e = decpt <= 0 and width <= 2 - decpt and width >= 3 + exp_len
    max_decpt = 15  # MAX_DECPT_FOR_F_FORMAT = DBL_DIG
    f_format = (
        have_space or (decpt <= width and (decpt >= -1 or (decpt == -2 and (n > 1 or not force_e))) and not force_e)
    ) and (not have_space or (decpt >= -max_decpt + 1 and (decpt <= max_decpt or n > decpt)))
    if f_format:
        if decpt <= 0:
            out = "0." + "0" * -decpt + digits
        elif decpt < n:
            out = digits[:decpt] + "." + digits[decpt:]
        else:
            out = digits + "0" * (decpt - n)
        out = sign + out
        return out if "." in out else out + ".0"
    e = decpt - 1
    mantissa = digits[0] + ("." + digits[1:] if n > 1 else "")
    return f"{sign}{mantissa}e{'-' if e < 0 else ''}{abs(e)}"


def _base64(data: bytes) -> str:
    """MySQL's base64_encode: standard alphabet, padding, a newline after every 76 characters."""
    flat = base64.b64encode(data).decode("ascii")
    return "\n".join(flat[i : i + 76] for i in range(0, len(flat), 76))


def text(value: Any) -> str:
    """A document as MySQL prints it (`Json_wrapper::to_string`)."""
    t = type(value)
    if t is str:
        return quote(value)
    if t is dict:
        return "{" + ", ".join(quote(k) + ": " + text(v) for k, v in value.items()) + "}"
    if t is list:
        return "[" + ", ".join(text(v) for v in value) + "]"
    if t is int:
        return str(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if t is float:
        return double_text(value)
    if t is JsonDecimal:
        return value.text
    if t is Temporal:
        return '"' + value.text + '"'
    if t is Opaque:
        return quote(f"base64:type{value.type}:{_base64(value.data)}")
    raise TypeError(f"not a JSON document value: {value!r}")


def document_text(data: bytes) -> str:
    """A whole JSON column value (type byte + value) -> MySQL's text of it."""
    return text(parse(data))
