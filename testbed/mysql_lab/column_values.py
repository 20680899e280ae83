"""Columns as MySQL writes them into row events: the Table_map type and metadata of a
column type, and the bytes of a Python value in a row image.

References: `sql/field.cc` (each Field's `pack()` and `do_save_field_metadata()`),
`libs/mysql/binlog/event/rows_event.h` (Table_map_event: column types, metadata),
`mysys/my_time.cc` (my_datetime_packed_to_binary, my_time_packed_to_binary,
my_timestamp_to_binary), `strings/decimal.cc` (decimal2bin). Integers are little-endian
unless said.

  type (Table_map code)        metadata                       value
  TINYINT..BIGINT (1,2,9,3,8)  -                              1/2/3/4/8 bytes
  FLOAT (4) / DOUBLE (5)       pack length (1 byte)           IEEE 754, 4/8 bytes
  DECIMAL (246)                precision, scale               decimal2bin (big-endian groups)
  DATE (10)                    -                              3 bytes: day | month << 5 | year << 9
  DATETIME(n) (18)             fsp                            5 bytes big-endian + (n+1)/2 bytes
  TIMESTAMP(n) (17)            fsp                            4 bytes big-endian seconds + fraction
  TIME(n) (19)                 fsp                            3 bytes big-endian + fraction
  YEAR (13)                    -                              1 byte: year - 1900 (0 for 0000)
  CHAR/BINARY(n) (254)         real type ^ (len & 0x300) >> 4, len & 0xff
                                                              1-2 byte length + bytes
  VARCHAR/VARBINARY(n) (15)    max bytes (2 bytes)            1 byte length if max < 256 else 2
  *TEXT/*BLOB (252)            length size 1-4                length (that size) + bytes
  JSON (245)                   length size (4)                4-byte length + binary JSON
  ENUM (254)                   247, pack length 1/2           the value's index (1-based; 0 = '')
  SET (254)                    248, pack length 1,2,3,4,8     bit mask of the members
  BIT(n) (16)                  n % 8, n // 8                  (n+7)/8 bytes big-endian
  VECTOR(n) (242, MySQL 9)     length size (4)                4-byte length + n float32s
"""

from __future__ import annotations

import datetime
import decimal
import re
import struct
from dataclasses import dataclass

from testbed.mysql_lab.json_binary import decimal_binary, encode_json

__all__ = ["COLLATIONS", "Column", "ColumnType", "parse_column_type"]

T_DECIMAL_NEW, T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG = 246, 1, 2, 9, 3, 8
T_FLOAT, T_DOUBLE, T_DATE, T_YEAR, T_VARCHAR, T_BIT = 4, 5, 10, 13, 15, 16
T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 17, 18, 19
T_VECTOR, T_JSON, T_ENUM, T_SET, T_BLOB, T_STRING = 242, 245, 247, 248, 252, 254

# collation ids (information_schema.COLLATIONS; the MySQL 8 defaults of each character set)
COLLATIONS = {"utf8mb4": 255, "utf8mb3": 33, "utf8": 33, "latin1": 8, "ascii": 11, "binary": 63}
_MAXLEN = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "latin1": 1, "ascii": 1, "binary": 1}
_CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252", "ascii": "ascii"}

_INTS = {"tinyint": (T_TINY, 1), "smallint": (T_SHORT, 2), "mediumint": (T_INT24, 3), "int": (T_LONG, 4)}
_INTS |= {"integer": (T_LONG, 4), "bigint": (T_LONGLONG, 8)}
_BLOBS = {"tinyblob": 1, "blob": 2, "mediumblob": 3, "longblob": 4, "tinytext": 1, "text": 2}
_BLOBS |= {"mediumtext": 3, "longtext": 4}
_TYPE = re.compile(r"^\s*([a-z]+)\s*(?:\((.*)\))?\s*(.*)$", re.S)


@dataclass(frozen=True)
class ColumnType:
    """A column type as the binlog sees it. `data_type` is information_schema's DATA_TYPE."""

    data_type: str
    code: int
    metadata: bytes
    unsigned: bool = False
    charset: str | None = None  # character columns only ("binary" for BLOB/VARBINARY/BINARY)
    length: int = 0  # CHAR/VARCHAR/BINARY: characters; BIT: bits; VECTOR: dimensions
    precision: int = 0
    scale: int = 0  # DECIMAL scale, temporal fsp
    pack_length: int = 0  # integers, ENUM/SET, BLOB length size
    members: tuple[str, ...] = ()  # ENUM / SET values

    @property
    def numeric(self) -> bool:
        """log_event.cc is_numeric_type: the columns SIGNEDNESS has a bit for."""
        return self.code in (T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_DECIMAL_NEW, T_FLOAT, T_DOUBLE)

    @property
    def character(self) -> bool:
        """log_event.cc is_character_type on the binlog type (STRING, VARCHAR, BLOB and, on
        MySQL 9, VECTOR), ENUM and SET excluded: they have their own charset field."""
        return self.code in (T_STRING, T_VARCHAR, T_BLOB, T_VECTOR) and self.data_type not in ("enum", "set")

    @property
    def enum_or_set(self) -> bool:
        return self.data_type in ("enum", "set")


@dataclass(frozen=True)
class Column:
    """A table column: `Column("id", "varchar(64)", nullable=False, key="PRI")`.
    `charset` overrides a character column's character set (default utf8mb4);
    `visible=False` is an INVISIBLE column (MySQL 8.0.23+)."""

    name: str
    column_type: str
    nullable: bool = True
    key: str = ""  # "PRI" for a primary key column
    charset: str | None = None
    visible: bool = True

    def binlog_type(self) -> ColumnType:
        return parse_column_type(self.column_type, self.charset)


def _members(text: str) -> tuple[str, ...]:
    """enum('a','b''c') -> ('a', "b'c")."""
    out: list[str] = []
    for m in re.finditer(r"'((?:[^']|'')*)'", text):
        out.append(m.group(1).replace("''", "'"))
    if not out:
        raise ValueError(f"no members in ({text})")
    return tuple(out)


def _charset_of(rest: str, default: str | None) -> str:
    m = re.search(r"(?:character\s+set|charset)\s+(\w+)", rest)
    name = (m.group(1) if m else default) or "utf8mb4"
    if name not in COLLATIONS:
        raise ValueError(f"character set {name!r} is not one the lab writes ({', '.join(sorted(COLLATIONS))})")
    return name


def parse_column_type(text: str, charset: str | None = None) -> ColumnType:
    """information_schema.COLUMNS.COLUMN_TYPE text -> ColumnType."""
    m = _TYPE.match(text.lower())
    if m is None:
        raise ValueError(f"cannot read column type {text!r}")
    name, args, rest = m.group(1), m.group(2), m.group(3)
    unsigned = "unsigned" in rest
    if name in _INTS:
        code, size = _INTS[name]
        return ColumnType(name if name != "integer" else "int", code, b"", unsigned, pack_length=size)
    if name in ("float", "double", "real"):
        size = 4 if name == "float" else 8
        return ColumnType(
            "float" if size == 4 else "double", T_FLOAT if size == 4 else T_DOUBLE, bytes([size]), unsigned
        )
    if name in ("decimal", "numeric", "dec"):
        parts = [int(x) for x in (args or "10,0").split(",")]
        precision, scale = parts[0], (parts[1] if len(parts) > 1 else 0)
        return ColumnType(
            "decimal", T_DECIMAL_NEW, bytes([precision, scale]), unsigned, precision=precision, scale=scale
        )
    if name == "date":
        return ColumnType("date", T_DATE, b"")
    if name == "year":
        return ColumnType("year", T_YEAR, b"")
    if name in ("datetime", "timestamp", "time"):
        fsp = int(args or 0)
        code = {"datetime": T_DATETIME2, "timestamp": T_TIMESTAMP2, "time": T_TIME2}[name]
        return ColumnType(name, code, bytes([fsp]), scale=fsp)
    if name in ("char", "binary"):
        cs = "binary" if name == "binary" else _charset_of(rest, charset)
        n = int(args or 1)
        field_length = n * _MAXLEN[cs]
        meta = bytes([T_STRING ^ ((field_length & 0x300) >> 4), field_length & 0xFF])
        return ColumnType(name, T_STRING, meta, charset=cs, length=n)
    if name in ("varchar", "varbinary"):
        cs = "binary" if name == "varbinary" else _charset_of(rest, charset)
        n = int(args or 0)
        return ColumnType(name, T_VARCHAR, struct.pack("<H", n * _MAXLEN[cs]), charset=cs, length=n)
    if name in _BLOBS:
        cs = "binary" if name.endswith("blob") else _charset_of(rest, charset)
        size = _BLOBS[name]
        return ColumnType(name, T_BLOB, bytes([size]), charset=cs, pack_length=size)
    if name == "json":
        return ColumnType("json", T_JSON, bytes([4]), pack_length=4)
    if name == "enum":
        members = _members(args or "")
        size = 1 if len(members) < 256 else 2
        return ColumnType(
            "enum",
            T_STRING,
            bytes([T_ENUM, size]),
            charset=_charset_of(rest, charset),
            pack_length=size,
            members=members,
        )
    if name == "set":
        members = _members(args or "")
        size = (len(members) + 7) // 8
        size = 8 if size > 4 else size
        return ColumnType(
            "set", T_STRING, bytes([T_SET, size]), charset=_charset_of(rest, charset), pack_length=size, members=members
        )
    if name == "bit":
        n = int(args or 1)
        return ColumnType("bit", T_BIT, bytes([n % 8, n // 8]), length=n)
    if name == "vector":
        n = int(args or 2048)
        return ColumnType("vector", T_VECTOR, bytes([4]), charset="binary", length=n, pack_length=4)
    raise ValueError(f"column type {text!r} is not one the lab writes")


# -- values ------------------------------------------------------------------------------


def _fraction(micros: int, fsp: int) -> bytes:
    """The fractional part of DATETIME2/TIMESTAMP2 (my_datetime_packed_to_binary): fsp 1-2
    one byte of hundredths, 3-4 two bytes of 1/10000 s, 5-6 three bytes of microseconds."""
    if fsp <= 0:
        return b""
    if fsp <= 2:
        return bytes([micros // 10000])
    if fsp <= 4:
        return (micros // 100).to_bytes(2, "big")
    return micros.to_bytes(3, "big")


def _truncate_micros(micros: int, fsp: int) -> int:
    step = 10 ** (6 - fsp)
    return micros // step * step


def time2(value: datetime.timedelta, fsp: int) -> bytes:
    """my_time_packed_to_binary of TIME_to_longlong_time_packed (see json_binary.time_packed):
    fsp 0: 3 bytes of int part + 0x800000; fsp 1-2 / 3-4: that and the fraction in 1 / 2
    bytes (C's truncating division, so a negative fraction is stored as its complement);
    fsp 5-6: 6 bytes of the packed value + 0x800000000000."""
    micros = value // datetime.timedelta(microseconds=1)
    sign = -1 if micros < 0 else 1
    micros = sign * _truncate_micros(abs(micros), fsp)
    seconds, frac = divmod(abs(micros), 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours > 838:
        raise ValueError(f"TIME {value} is outside -838:59:59..838:59:59")
    packed = sign * ((((hours << 12) | (minutes << 6) | secs) << 24) + frac)
    int_part = packed >> 24  # arithmetic shift, as in C
    frac_part = abs(packed) % (1 << 24) * (1 if packed >= 0 else -1)  # C's % keeps the sign
    if fsp <= 0:
        return (int_part + 0x800000).to_bytes(3, "big")
    if fsp <= 2:
        return (int_part + 0x800000).to_bytes(3, "big") + struct.pack("b", int(frac_part / 10000))
    if fsp <= 4:
        return (int_part + 0x800000).to_bytes(3, "big") + struct.pack(">h", int(frac_part / 100))
    return (packed + 0x800000000000).to_bytes(6, "big")


def datetime2(value: datetime.datetime, fsp: int) -> bytes:
    """my_datetime_packed_to_binary: 5 bytes big-endian of (ymd << 17 | hms) + 0x8000000000,
    ymd = (year * 13 + month) << 5 | day, hms = hour << 12 | minute << 6 | second; then the
    fraction."""
    ymd = ((value.year * 13 + value.month) << 5) | value.day
    hms = (value.hour << 12) | (value.minute << 6) | value.second
    return (((ymd << 17) | hms) + 0x8000000000).to_bytes(5, "big") + _fraction(
        _truncate_micros(value.microsecond, fsp), fsp
    )


def timestamp2(value: datetime.datetime, fsp: int) -> bytes:
    """my_timestamp_to_binary: seconds since the epoch (UTC), 4 bytes big-endian, then the
    fraction. A naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    seconds = int(value.timestamp())
    return seconds.to_bytes(4, "big") + _fraction(_truncate_micros(value.microsecond, fsp), fsp)


def _length_prefixed(raw: bytes, size: int) -> bytes:
    if len(raw) >= 1 << (8 * size):
        raise ValueError(f"a value of {len(raw)} bytes does not fit a {size}-byte length")
    return len(raw).to_bytes(size, "little") + raw


def _text(value: object, ct: ColumnType) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if not isinstance(value, str):
        raise TypeError(f"a {ct.data_type} column takes str or bytes, not {type(value).__name__}")
    if ct.charset == "binary":
        return value.encode("utf-8")
    return value.encode(_CODECS[ct.charset or "utf8mb4"])


def encode_value(value: object, ct: ColumnType) -> bytes:
    """The bytes of a non-NULL value of column type `ct` in a row image."""
    code = ct.code
    if code in (T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG):
        assert isinstance(value, int), f"an integer column takes int, not {type(value).__name__}"
        bits = 8 * ct.pack_length
        lo, hi = (0, (1 << bits) - 1) if ct.unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is outside {ct.data_type}{' unsigned' if ct.unsigned else ''}")
        return (value & ((1 << bits) - 1)).to_bytes(ct.pack_length, "little")
    if code == T_FLOAT:
        return struct.pack("<f", float(value))  # type: ignore[arg-type]
    if code == T_DOUBLE:
        return struct.pack("<d", float(value))  # type: ignore[arg-type]
    if code == T_DECIMAL_NEW:
        return decimal_binary(decimal.Decimal(value), ct.precision, ct.scale)  # type: ignore[arg-type]
    if code == T_DATE:
        assert isinstance(value, datetime.date)
        return (value.day | (value.month << 5) | (value.year << 9)).to_bytes(3, "little")
    if code == T_YEAR:
        assert isinstance(value, int)
        return bytes([value - 1900 if value else 0])
    if code == T_DATETIME2:
        assert isinstance(value, datetime.datetime)
        return datetime2(value, ct.scale)
    if code == T_TIMESTAMP2:
        assert isinstance(value, datetime.datetime)
        return timestamp2(value, ct.scale)
    if code == T_TIME2:
        assert isinstance(value, datetime.timedelta)
        return time2(value, ct.scale)
    if code == T_JSON:
        return _length_prefixed(encode_json(value), 4)
    if code == T_BIT:
        nbytes = (ct.length + 7) // 8
        if isinstance(value, bytes):
            value = int.from_bytes(value, "big")
        assert isinstance(value, int)
        if value >> ct.length:
            raise ValueError(f"{value} does not fit BIT({ct.length})")
        return value.to_bytes(nbytes, "big")
    if code == T_VECTOR:
        floats = list(value)  # type: ignore[call-overload]
        if len(floats) > ct.length:
            raise ValueError(f"{len(floats)} dimensions do not fit VECTOR({ct.length})")
        return _length_prefixed(struct.pack(f"<{len(floats)}f", *floats), 4)
    if ct.data_type == "enum":
        index = value if isinstance(value, int) else ct.members.index(str(value)) + 1
        return index.to_bytes(ct.pack_length, "little")
    if ct.data_type == "set":
        if isinstance(value, int):
            mask = value
        else:
            names = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
            mask = 0
            for member in names:
                if member:
                    mask |= 1 << ct.members.index(member)
        return mask.to_bytes(ct.pack_length, "little")
    if code == T_BLOB:
        return _length_prefixed(_text(value, ct), ct.pack_length)
    if code == T_VARCHAR:
        max_bytes = struct.unpack("<H", ct.metadata)[0]
        raw = _text(value, ct)
        if len(raw) > max_bytes:
            raise ValueError(f"{len(raw)} bytes do not fit {ct.data_type}({ct.length})")
        return _length_prefixed(raw, 1 if max_bytes < 256 else 2)
    if code == T_STRING:
        field_length = ct.length * _MAXLEN[ct.charset or "utf8mb4"]
        raw = _text(value, ct)
        # Field_string::pack strips the padding: spaces of CHAR, zero bytes of BINARY
        raw = raw.rstrip(b"\x00") if ct.charset == "binary" else raw.rstrip(b" ")
        if len(raw) > field_length:
            raise ValueError(f"{len(raw)} bytes do not fit {ct.data_type}({ct.length})")
        return _length_prefixed(raw, 1 if field_length < 256 else 2)
    raise ValueError(f"no encoder for {ct.data_type}")
