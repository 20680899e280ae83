"""Raw binlog events (from `connectors.mysql.binlog_protocol`) -> `cdc.source_events`.

A lean replacement for python-mysql-replication + `binlog_library.LibraryConverter` that yields
the same source events with the same positions and the same Python values, at a fraction
of the cost:

* A Table_map event is decoded once per distinct body (the bytes after the table id):
  repeated identical Table_maps — one before every row event — cost one dict lookup, and
  an ALTER TABLE, which changes the bytes, is decoded afresh. Column names, signedness,
  charsets and ENUM/SET values come from the optional metadata
  (binlog_row_metadata=FULL); for a watched table whose Table_map lacks names or ENUM/SET
  values (MINIMAL), from the optional `table_columns` port (connectors/mysql/table_columns.py).
* Tables that are not watched keep only (schema, table); their row events are skipped
  after one dict lookup, their rows are never decoded.
* For a watched table, one Python function per (table layout, columns-present bitmap) is
  generated (once) that decodes a whole row image with inlined per-column code and
  builds the values dict with a dict display.

Values follow python-mysql-replication 1.0.17 (the library's own conversions are reused
for charsets, and its arithmetic is mirrored for DECIMAL, temporal types and BIT), so a
row decodes to an equal dict, with these exceptions, where the library loses or mangles a
value: a MySQL JSON column is MySQL's own text of the document (connectors/mysql/json_binary.py);
Partial_update_rows (partial JSON updates, connectors/mysql/json_diff.py) is decoded; an ENUM or
SET without value names is its index / bitmask, not None; a SET is MySQL's text of it (`a,c`, the
empty set ''), not a Python set; a VECTOR is its bytes; no stored value becomes None
(docs/mysql.md, "Zero-like values"): YEAR 0 is 0 (not 1900), a
DATE / DATETIME Python cannot hold (`0000-00-00`, `2024-00-00`, `2024-02-31`) and a TIMESTAMP of 0
seconds (not 1970-01-01) are MySQL's text of them (connectors/mysql/temporal_text.py). Types the
library cannot decode raise `UnsupportedColumnType` (at the Table_map of a watched table).
The Format_description's post-header lengths say which events exist and how their
post-headers are laid out (MySQL 9 has no v1 rows events).

Compressed events (`connectors/mysql/binlog_compression.py`): a MariaDB *_COMPRESSED_* event is
decompressed into the plain event it stands for (same header, so the same position) and
decoded as that one. The events inside a MySQL Transaction_payload are decoded in order
as if each sat where the payload sits: each starts at the payload's start and ends at its
end (a payload holds one transaction, so a transaction begun inside it starts at the
payload and its commit ends with it; see docs/binlog-decoding.md, "Compressed binlogs"). A compressed event that cannot
be decompressed exactly, or a payload with a second transaction after a commit, raises
`UndecodableEvent` naming the event, its position and what to do (the library would
drop such events silently).

Positions: an event ends at its header `log_pos`; it starts at `log_pos - event_size`
with `event_size` the header's total event size (as `LibraryConverter` computes it from
`ev.packet.event_size`). `legacy_begin_start=True` reproduces the earlier `LibraryConverter`,
which subtracted the library's `ev.event_size` — the body size without the 19-byte header
and the 4-byte checksum — and so named a TxBegin.start 23 bytes past the real start.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from pymysqlreplication.row_event import RowsEvent, find_charset

from cdc.position import file_sequence, unchecked_position
from cdc.server_version import writes_checksum_algorithm
from cdc.source_events import (
    Heartbeat,
    RowChange,
    RowInsert,
    ServerStarted,
    TxBegin,
    TxCommit,
    TxRollback,
    XaCommit,
    XaPrepare,
    XaRollback,
    query_event,
    xid_text,
)
from connectors.mysql import table_columns as _table_columns
from connectors.mysql import temporal_text as _temporal

# Imported where first needed, not here: what only MySQL JSON columns, partial JSON updates,
# tagged GTIDs and compressed events use (connectors/mysql/json_binary.py, json_diff.py,
# mysql_gtid_tagged.py, binlog_compression.py). The reader process imports this module on
# the way to its first event, and those four were a third of its import time (14 of 41 ms
# CPU, python -X importtime, on a loaded machine).

__all__ = ["BinlogDecodeError", "BinlogDecoder", "ServerSettingRequired", "UndecodableEvent", "UnsupportedColumnType"]


class BinlogDecodeError(Exception):
    """A binlog event could not be decoded."""


class UnsupportedColumnType(BinlogDecodeError):
    """A watched table has a column whose type this decoder does not decode."""

    def __init__(self, schema: str, table: str, column: str, type_code: int, detail: str = ""):
        self.schema, self.table, self.column, self.type_code = schema, table, column, type_code
        name = _TYPE_NAMES.get(type_code, "unknown")
        super().__init__(
            f"column {column!r} of {schema}.{table} has type {type_code} ({name}) which the fast binlog decoder "
            f"does not decode{': ' + detail if detail else ''}; use python-mysql-replication for this table"
        )


class ServerSettingRequired(BinlogDecodeError):
    """The binlog lacks what decoding a watched table needs (a before image without the
    column a partial JSON update changes, ENUM/SET metadata that no longer matches the
    table): a server setting must change; the message names it."""


class UndecodableEvent(BinlogDecodeError):
    """An event that cannot be decoded exactly (a corrupt compressed event, an unknown
    compression algorithm): reading on would lose its rows. A person must act."""


# -- constants -------------------------------------------------------------------------

QUERY_EVENT = 2
ROTATE_EVENT = 4
FORMAT_DESCRIPTION_EVENT = 15
XID_EVENT = 16
EXECUTE_LOAD_QUERY_EVENT = 18  # LOAD DATA logged as a statement: a Query event with 13 more post-header bytes
TABLE_MAP_EVENT = 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
HEARTBEAT_LOG_EVENT = 27
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32
GTID_LOG_EVENT = 33
XA_PREPARE_LOG_EVENT = 38
PARTIAL_UPDATE_ROWS_EVENT = 39
TRANSACTION_PAYLOAD_EVENT = 40
GTID_TAGGED_LOG_EVENT = 42  # MySQL 8.3+: connectors/mysql/gtid_tagged.py
MARIADB_GTID_EVENT = 162
_MARIADB_TYPES = 160  # MariaDB's own event types start here (Annotate_rows)
MARIADB_QUERY_COMPRESSED = 165
MARIADB_ROWS_COMPRESSED = range(166, 172)
_EVENT_NAMES = {
    TRANSACTION_PAYLOAD_EVENT: "Transaction_payload",
    MARIADB_QUERY_COMPRESSED: "Query_compressed",
    166: "Write_rows_compressed_v1",
    167: "Update_rows_compressed_v1",
    168: "Delete_rows_compressed_v1",
    169: "Write_rows_compressed",
    170: "Update_rows_compressed",
    171: "Delete_rows_compressed",
}
# source events that end a transaction: inside a Transaction_payload only the last may be one
_TX_ENDS = (TxCommit, TxRollback, XaPrepare, XaCommit, XaRollback)

T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR, T_NEWDATE, T_VARCHAR = 8, 9, 10, 11, 12, 13, 14, 15
T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 16, 17, 18, 19
T_VECTOR, T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 242, 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB, T_VAR_STRING, T_STRING, T_GEOMETRY = 249, 250, 251, 252, 253, 254, 255

_TYPE_NAMES = {
    0: "DECIMAL",
    1: "TINY",
    2: "SHORT",
    3: "LONG",
    4: "FLOAT",
    5: "DOUBLE",
    6: "NULL",
    7: "TIMESTAMP",
    8: "LONGLONG",
    9: "INT24",
    10: "DATE",
    11: "TIME",
    12: "DATETIME",
    13: "YEAR",
    14: "NEWDATE",
    15: "VARCHAR",
    16: "BIT",
    17: "TIMESTAMP2",
    18: "DATETIME2",
    19: "TIME2",
    20: "TYPED_ARRAY",
    242: "VECTOR",
    243: "BOOL",
    244: "INVALID",
    245: "JSON",
    246: "NEWDECIMAL",
    247: "ENUM",
    248: "SET",
    249: "TINY_BLOB",
    250: "MEDIUM_BLOB",
    251: "LONG_BLOB",
    252: "BLOB",
    253: "VAR_STRING",
    254: "STRING",
    255: "GEOMETRY",
}
# post-header lengths this decoder reads: event type -> (name, length when the
# Format_description's table is shorter, lengths read; 0 = the server has no such event)
_ROWS_POST_HEADERS = {
    TABLE_MAP_EVENT: ("Table_map", 8, (8,)),
    WRITE_ROWS_V1: ("Write_rows_v1", 8, (0, 8)),
    UPDATE_ROWS_V1: ("Update_rows_v1", 8, (0, 8)),
    DELETE_ROWS_V1: ("Delete_rows_v1", 8, (0, 8)),
    WRITE_ROWS_V2: ("Write_rows", 10, (0, 10)),
    UPDATE_ROWS_V2: ("Update_rows", 10, (0, 10)),
    DELETE_ROWS_V2: ("Delete_rows", 10, (0, 10)),
    PARTIAL_UPDATE_ROWS_EVENT: ("Partial_update_rows", 10, (0, 10)),
}
_NUMERIC = {T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_NEWDECIMAL, T_FLOAT, T_DOUBLE, T_YEAR}
FL_STANDALONE = 0x01

_HDR = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
_U16 = struct.Struct("<H").unpack_from
# `decode_reads` frames the binlog stream's event packets itself (MySQL Client/Server
# Protocol, "MySQL Packets": 3-byte payload length, 1-byte sequence id; COM_BINLOG_DUMP's
# reply packets: the OK byte 0x00, then the event). One unpack reads all a dropped event
# needs: the length and sequence id, the OK byte, the event type (header offset 4) and the
# 6 bytes at event offset 19, a rows event's or Table_map's table id (post-header, MySQL
# libbinlogevents rows_event.h / Table_map_event).
_RUN_HEAD = struct.Struct("<IB4xB14x6s").unpack_from
_RUN_HEAD_SIZE = 30
_RUN_MIN = 1 + 25  # an OK byte and an event long enough to hold a table id
_MAX_PACKET = 0xFFFFFF  # a payload this long continues in the next physical packet
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from

_new = object.__new__

_pos = unchecked_position  # the file name is validated once per Rotate


def _lenenc(buf: bytes, p: int) -> tuple[int, int]:
    c = buf[p]
    if c < 251:
        return c, p + 1
    if c == 252:
        return buf[p + 1] | (buf[p + 2] << 8), p + 3
    if c == 253:
        return buf[p + 1] | (buf[p + 2] << 8) | (buf[p + 3] << 16), p + 4
    if c == 254:
        return _U64(buf, p + 1)[0], p + 9
    raise BinlogDecodeError(f"bad length-encoded integer (first byte {c})")


# -- helpers called by generated code (mirror python-mysql-replication's arithmetic) -------

_COMPRESSED_BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
_Decimal = decimal.Decimal
_datetime = datetime.datetime
_date = datetime.date
_timedelta = datetime.timedelta
_utcfromtimestamp = datetime.datetime.utcfromtimestamp


def _decimal_reader(precision: int, decimals: int):
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


def _fsp_size(fsp: int) -> int:
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


def _read_time2(b: bytes, p: int, fsp: int) -> datetime.timedelta:
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


def _read_date(b: bytes, p: int):
    t = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)
    try:  # a zero date or zero part: MySQL's text, not the library's None (temporal_text.py)
        return _date(year=(t >> 9) & 0x7FFF, month=(t >> 5) & 0xF, day=t & 0x1F)
    except ValueError:
        return _temporal.old_date_text(t)


def _read_time_old(b: bytes, p: int) -> datetime.timedelta:
    t = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)
    return _timedelta(hours=int(t / 10000), minutes=int((t % 10000) / 100), seconds=int(t % 100))


def _read_datetime_old(b: bytes, p: int):
    value = _U64(b, p)[0]
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


def _read_datetime2_slow(b: bytes, p: int, fsp: int):
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
        return _datetime2_text(b, p, fsp)
    us = _fsp_value(b, p + 5, fsp)
    if us > 0:
        t = t.replace(microsecond=us)
    return t


def _datetime2_text(b: bytes, p: int, fsp: int) -> str:
    return _temporal.datetime2_text(int.from_bytes(b[p : p + 5], "big"), _fsp_value(b, p + 5, fsp), fsp)


def _read_timestamp(b: bytes, p: int):
    seconds = _U32(b, p)[0]
    return _utcfromtimestamp(seconds) if seconds else _temporal.zero_timestamp()


def _read_timestamp2(b: bytes, p: int, fsp: int):
    seconds = int.from_bytes(b[p : p + 4], "big", signed=True)
    if not seconds:  # 0 is MySQL's zero datetime, not 1970-01-01 (temporal_text.py)
        return _temporal.zero_timestamp(fsp)
    t = _utcfromtimestamp(seconds)
    us = _fsp_value(b, p + 4, fsp)
    if us > 0:
        t = t.replace(microsecond=us)
    return t


# -- table layouts ---------------------------------------------------------------------


class _Column:
    __slots__ = ("encoding", "enum_values", "meta", "name", "nullable", "set_values", "type", "unsigned")

    def __init__(self, type_: int):
        self.type = type_
        self.meta: dict[str, int] = {}
        self.name: str | None = None
        self.unsigned = False
        self.nullable = True
        self.encoding: str | None = None  # python codec; None = bytes
        self.enum_values: list[str] | None = None
        self.set_values: list[str] | None = None


class _Table:
    """One Table_map layout. `columns is None` for tables that are not watched."""

    __slots__ = (
        "columns",
        "head",
        "inserters",
        "json_columns",
        "looked_up",
        "names",
        "ncols",
        "readers",
        "schema",
        "table",
        "table_id",
    )

    def __init__(self, schema: str, table: str):
        self.schema, self.table = schema, table
        # names / ENUM-SET values came from the table_columns port: valid for this table id
        # only (an ALTER that keeps the Table_map's bytes, such as renamed ENUM values,
        # gives the table a new id)
        self.looked_up = False
        self.table_id = b""
        self.columns: list[_Column] | None = None
        self.ncols = 0
        self.names: tuple[str | None, ...] = ()  # None: the server sent no name (no row metadata)
        self.json_columns: tuple[int, ...] = ()  # indexes of the JSON columns (partial JSON updates)
        # columns-present bitmap -> generated row reader; (bitmap, partial JSON columns) ->
        # the reader of a Partial_update_rows image, whose JSON values are documents
        self.readers: dict[Any, Any] = {}
        # a Write_rows event's column count and columns-present bitmap -> its generated
        # inserter (`_make_inserter`): as their bytes when the count is the Table_map's
        # (`head`: their length then), else as (count, bitmap)
        self.inserters: dict[Any, Any] = {}
        self.head = 0


def _parse_column_meta(col: _Column, buf: bytes, p: int) -> int:
    """Per-type metadata of the Table_map, as python-mysql-replication's Column reads it."""
    t = col.type
    m = col.meta
    if t == T_VARCHAR:
        m["max_length"] = _U16(buf, p)[0]
        return p + 2
    if t in (T_DOUBLE, T_FLOAT):
        m["size"] = buf[p]
        return p + 1
    if t in (T_TIMESTAMP2, T_DATETIME2, T_TIME2):
        m["fsp"] = buf[p]
        return p + 1
    if t in (T_VAR_STRING, T_STRING):
        metadata = (buf[p] << 8) + buf[p + 1]
        real_type = metadata >> 8
        if real_type in (T_SET, T_ENUM):
            col.type = real_type
            m["size"] = metadata & 0xFF
        else:
            m["max_length"] = (((metadata >> 4) & 0x300) ^ 0x300) + (metadata & 0xFF)
        return p + 2
    if t in (T_BLOB, T_GEOMETRY, T_JSON, T_VECTOR):
        # VECTOR (MySQL 9) is stored as a BLOB is: one metadata byte, the size of the
        # value's length (libs/mysql/binlog/event/binary_log_funcs.cpp, calc_field_size)
        m["length_size"] = buf[p]
        return p + 1
    if t == T_NEWDECIMAL:
        m["precision"], m["decimals"] = buf[p], buf[p + 1]
        return p + 2
    if t == T_BIT:
        bits, nbytes = buf[p], buf[p + 1]
        m["bits"] = nbytes * 8 + bits
        m["bytes"] = (m["bits"] + 7) // 8
        return p + 2
    return p


def _is_character(t: int, dbms: str) -> bool:
    return t in (T_STRING, T_VAR_STRING, T_VARCHAR, T_BLOB) or (t == T_GEOMETRY and dbms == "mariadb")


def _python_encoding(charset_id: int | None, dbms: str) -> str | None:
    """The codec the library ends up using for a character column; None = it keeps bytes
    (Python has no such codec, e.g. 'binary')."""
    if charset_id is None:
        return "utf-8"
    encode_name = find_charset(str(charset_id), dbms=dbms)[0]
    name = RowsEvent.charset_to_encoding(encode_name)
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    return "utf-8" if info.name == "utf-8" else name


def _read_strings(buf: bytes, p: int, end: int) -> tuple[list[list[str]], int]:
    result = []
    while p < end:
        count, p = _lenenc(buf, p)
        values = []
        for _ in range(count):
            n, p = _lenenc(buf, p)
            raw = buf[p : p + n]
            p += n
            try:
                values.append(raw.decode())
            except UnicodeDecodeError:
                values.append("")
        result.append(values)
    return result, p


class _RowMetadata:
    """The optional metadata of a Table_map (binlog_row_metadata); None = not in the event."""

    __slots__ = ("charsets", "encodings", "enum_values", "names", "set_values", "unsigned")

    def __init__(self) -> None:
        self.unsigned: list[bool] | None = None
        self.charsets: list[int] | None = None  # collation ids of the character columns
        self.encodings: list[str | None] | None = None  # python codecs of the character columns (from a lookup)
        self.names: list[str] | None = None
        self.enum_values: list[list[str]] | None = None
        self.set_values: list[list[str]] | None = None


def _read_optional_metadata(cols: list[_Column], buf: bytes, p: int, end: int) -> _RowMetadata:
    """binlog_row_metadata TLV fields (MySQL libs/mysql/binlog/event/rows_event.h,
    Table_map_event::Optional_metadata_field_type): type 1 byte, length (lenenc), value."""
    meta = _RowMetadata()
    n = len(cols)
    while p < end:
        kind = buf[p]
        length, p = _lenenc(buf, p + 1)
        stop = p + length
        if kind == 1:  # SIGNEDNESS: one bit per numeric column, most significant first
            numeric = [i for i, c in enumerate(cols) if c.type in _NUMERIC]
            meta.unsigned = unsigned = [False] * n
            for k, i in enumerate(numeric):
                unsigned[i] = bool(buf[p + k // 8] & (0x80 >> (k % 8)))
        elif kind == 2:  # DEFAULT_CHARSET: default, then (char column index, collation) pairs
            default, q = _lenenc(buf, p)
            overrides = {}
            while q < stop:
                idx, q = _lenenc(buf, q)
                coll, q = _lenenc(buf, q)
                overrides[idx] = coll
            meta.charsets = [overrides.get(k, default) for k in range(n)]
        elif kind == 3:  # COLUMN_CHARSET
            q, meta.charsets = p, []
            while q < stop:
                coll, q = _lenenc(buf, q)
                meta.charsets.append(coll)
        elif kind == 4:  # COLUMN_NAME
            q, meta.names = p, []
            while q < stop:
                ln, q = _lenenc(buf, q)
                meta.names.append(buf[q : q + ln].decode())
                q += ln
        elif kind == 5:  # SET_STR_VALUE
            meta.set_values, _ = _read_strings(buf, p, stop)
        elif kind == 6:  # ENUM_STR_VALUE
            meta.enum_values, _ = _read_strings(buf, p, stop)
        # 7 geometry type, 8/9 primary key, 10/11 enum+set charsets, 12 visibility: unused
        p = stop
    return meta


def _assign_metadata(cols: list[_Column], meta: _RowMetadata, dbms: str) -> None:
    """Names, signedness, encodings and ENUM/SET values onto the columns."""
    if not meta.names:
        # The library without column names: UNKNOWN_COLn keys, nothing unsigned, utf-8.
        for i, c in enumerate(cols):
            c.name = f"UNKNOWN_COL{i}"
            c.encoding = "utf-8"
        return
    names, charsets, encodings = meta.names, meta.charsets, meta.encodings
    enum_values, set_values = meta.enum_values or [], meta.set_values or []
    enum_pos = set_pos = 0
    char_pos = 0
    for i, c in enumerate(cols):
        c.name = names[i] if i < len(names) else f"UNKNOWN_COL{i}"
        if _is_character(c.type, dbms):
            if encodings is not None and char_pos < len(encodings):
                c.encoding = encodings[char_pos]
            else:
                cs = charsets[char_pos] if charsets is not None and char_pos < len(charsets) else None
                c.encoding = _python_encoding(cs, dbms)
            char_pos += 1
        if c.type == T_ENUM:
            c.enum_values = [""] + enum_values[enum_pos] if enum_pos < len(enum_values) else None
            enum_pos += 1
        elif c.type == T_SET:
            c.set_values = set_values[set_pos] if set_pos < len(set_values) else None
            set_pos += 1
        if meta.unsigned is not None and meta.unsigned[i]:
            c.unsigned = True


def _lacks_metadata(cols: list[_Column], meta: _RowMetadata) -> bool:
    """Column names, or the value names of an ENUM / SET column, are not in the Table_map."""
    if not meta.names:
        return True
    if meta.enum_values is None and any(c.type == T_ENUM for c in cols):
        return True
    return meta.set_values is None and any(c.type == T_SET for c in cols)


# information_schema.COLUMNS.DATA_TYPE of each binlog column type (a DATA_TYPE not listed
# here, such as MariaDB's inet6 or uuid, is not checked)
_DATA_TYPES = {
    T_TINY: {"tinyint"},
    T_SHORT: {"smallint"},
    T_INT24: {"mediumint"},
    T_LONG: {"int"},
    T_LONGLONG: {"bigint"},
    T_FLOAT: {"float"},
    T_DOUBLE: {"double"},
    T_NEWDECIMAL: {"decimal"},
    T_YEAR: {"year"},
    T_DATE: {"date"},
    T_NEWDATE: {"date"},
    T_TIME: {"time"},
    T_TIME2: {"time"},
    T_DATETIME: {"datetime"},
    T_DATETIME2: {"datetime"},
    T_TIMESTAMP: {"timestamp"},
    T_TIMESTAMP2: {"timestamp"},
    T_VARCHAR: {"varchar", "varbinary"},
    T_STRING: {"char", "binary"},
    T_ENUM: {"enum"},
    T_SET: {"set"},
    T_BIT: {"bit"},
    T_JSON: {"json"},
    T_VECTOR: {"vector"},
    T_BLOB: {"tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob", "json"},
    T_GEOMETRY: {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    },
}
_KNOWN_DATA_TYPES = set().union(*_DATA_TYPES.values())


def _charset_encoding(charset: str | None) -> str | None:
    """A CHARACTER_SET_NAME -> the python codec the library would use; None = bytes."""
    if charset is None:
        return "utf-8"
    name = RowsEvent.charset_to_encoding(charset)
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    return "utf-8" if info.name == "utf-8" else name


# -- code generation for row images ----------------------------------------------------


def _json_reader(schema: str, table: str, column: str | None, document: bool = False):
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


_GLOBALS_BASE = {
    "_u16": struct.Struct("<H").unpack_from,
    "_i16": struct.Struct("<h").unpack_from,
    "_u32": struct.Struct("<I").unpack_from,
    "_i32": struct.Struct("<i").unpack_from,
    "_u64": struct.Struct("<Q").unpack_from,
    "_i64": struct.Struct("<q").unpack_from,
    "_f32": struct.Struct("<f").unpack_from,
    "_f64": struct.Struct("<d").unpack_from,
    "_be40": struct.Struct(">IB").unpack_from,
    "_be64": struct.Struct(">Q").unpack_from,
    "_from_bytes": int.from_bytes,
    "_datetime": _datetime,
    "_read_time2": _read_time2,
    "_read_date": _read_date,
    "_read_time_old": _read_time_old,
    "_read_datetime_old": _read_datetime_old,
    "_read_timestamp2": _read_timestamp2,
    "_read_datetime2_slow": _read_datetime2_slow,
    "_datetime2_text": _datetime2_text,
    "_read_timestamp": _read_timestamp,
    "_utcfromtimestamp": _utcfromtimestamp,
}


def _uint_expr(size: int) -> str:
    """Little-endian unsigned int of `size` bytes at b[p]."""
    if size == 1:
        return "b[p]"
    if size == 2:
        return "(b[p] | (b[p + 1] << 8))"
    if size == 3:
        return "(b[p] | (b[p + 1] << 8) | (b[p + 2] << 16))"
    if size == 4:
        return "_u32(b, p)[0]"
    if size == 8:
        return "_u64(b, p)[0]"
    return f"_from_bytes(b[p:p + {size}], 'little')"


def _column_code(i: int, c: _Column, schema: str, table: str, g: dict[str, Any]) -> list[str]:
    """Lines that set v{i} from b[p:] and advance p (4-space indented, no null check)."""
    t, m, v = c.type, c.meta, f"v{i}"
    u = c.unsigned
    if t == T_TINY:
        return [f"{v} = b[p]", "p += 1"] if u else [f"{v} = b[p]", f"if {v} > 127: {v} -= 256", "p += 1"]
    if t == T_SHORT:
        return [f"{v} = {'_u16' if u else '_i16'}(b, p)[0]", "p += 2"]
    if t == T_INT24:
        lines = [f"{v} = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)"]
        if not u:
            lines.append(f"if {v} >= 0x800000: {v} -= 0x1000000")
        return lines + ["p += 3"]
    if t == T_LONG:
        return [f"{v} = {'_u32' if u else '_i32'}(b, p)[0]", "p += 4"]
    if t == T_LONGLONG:
        return [f"{v} = {'_u64' if u else '_i64'}(b, p)[0]", "p += 8"]
    if t == T_FLOAT:
        return [f"{v} = _f32(b, p)[0]", "p += 4"]
    if t == T_DOUBLE:
        return [f"{v} = _f64(b, p)[0]", "p += 8"]
    if t == T_YEAR:
        # byte 0 is YEAR 0000 (MySQL's zero year), not 1900 as the library reads it
        return [f"{v} = b[p] + 1900 if b[p] else 0", "p += 1"]
    if t in (T_VARCHAR, T_STRING, T_BLOB):
        size = m["length_size"] if t == T_BLOB else (2 if m["max_length"] > 255 else 1)
        if size not in (1, 2, 3, 4):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"length size {size}")
        lines = [f"n = {_uint_expr(size)}", f"p += {size}"]
        if c.encoding is None:
            # The library "decodes" with a codec Python lacks ('binary') and keeps the
            # bytes on LookupError, but bytes.decode() of b"" never looks the codec up:
            # an empty binary value comes out as "" (mirrored).
            lines.append(f"{v} = b[p:p + n] if n else ''")
        elif c.encoding == "utf-8":
            # bytes.decode() with no argument is UTF-8 (strict) as well, and skips parsing
            # the codec argument: 195 -> 113 ns a value (36 bytes, timeit on this machine),
            # about 0.4 us on an outbox row of five text columns.
            lines.append(f"{v} = b[p:p + n].decode()")
        else:
            lines.append(f"{v} = b[p:p + n].decode({c.encoding!r})")
        return lines + ["p += n"]
    if t in (T_GEOMETRY, T_VECTOR):
        # a VECTOR's value is MySQL's own bytes: float32s, little-endian (published as bytes)
        size = m["length_size"]
        return [f"n = {_uint_expr(size)}", f"p += {size}", f"{v} = b[p:p + n]", "p += n"]
    if t == T_JSON:
        size = m["length_size"]
        g[f"_json{i}"] = _json_reader(schema, table, c.name)
        return [f"n = {_uint_expr(size)}", f"p += {size}", f"{v} = _json{i}(b[p:p + n])", "p += n"]
    if t == T_NEWDECIMAL:
        size, reader = _decimal_reader(m["precision"], m["decimals"])
        g[f"_dec{i}"] = reader
        return [f"{v} = _dec{i}(b[p:p + {size}])", f"p += {size}"]
    if t == T_DATETIME2:
        fsp = m["fsp"]
        fs = _fsp_size(fsp)
        if fsp == 6:
            # The 5 bytes of date and time and the 3 of the fraction as one big-endian
            # 64-bit read (the general path below slices the fraction out and calls
            # int.from_bytes with keywords): 1.40 -> 0.73 us a value (timeit, loaded
            # machine); the usual outbox `created_at DATETIME(6)` is one a row. The fraction
            # is signed (0x800000 and up: negative, ignored as below); 1000000..0x7FFFFF
            # raises as the library's replace(microsecond=) does.
            return [
                "d = _be64(b, p)[0]",
                "us = d & 0xFFFFFF",
                "if us > 999999:",
                "    if us < 0x800000: raise ValueError('microsecond must be in 0..999999')",
                "    us = 0",
                "d >>= 24",
                "ym = (d >> 22) & 0x1FFFF",
                "try:",
                f"    {v} = _datetime(ym // 13, ym % 13, (d >> 17) & 0x1F, (d >> 12) & 0x1F, (d >> 6) & 0x3F, d & 0x3F, us)",
                "except ValueError:",
                f"    {v} = _datetime2_text(b, p, 6)",
                "p += 8",
            ]
        if fsp in (0, 2, 4):  # fast path: even fsp needs no /10 rounding
            scale = 10 ** (6 - fsp)
            lines = ["hi, lo = _be40(b, p)", "d = (hi << 8) | lo", "ym = (d >> 22) & 0x1FFFF"]
            if fs:
                us = f"_from_bytes(b[p + 5:p + {5 + fs}], 'big', signed=True)"
                lines.append(f"us = {us}{f' * {scale}' if scale != 1 else ''}")
            else:
                lines.append("us = 0")
            # One constructor call instead of the library's datetime(...).replace(microsecond=)
            # (5x cheaper); a negative fraction is ignored as the library does.
            lines += [
                "try:",
                f"    {v} = _datetime(ym // 13, ym % 13, (d >> 17) & 0x1F, (d >> 12) & 0x1F, (d >> 6) & 0x3F, d & 0x3F,"
                " us if us > 0 else 0)",
                "except ValueError:",
                f"    {v} = _datetime2_text(b, p, {fsp})",
                f"p += {5 + fs}",
            ]
            return lines
        return [f"{v} = _read_datetime2_slow(b, p, {fsp})", f"p += {5 + fs}"]
    if t == T_TIMESTAMP2:
        fsp = m["fsp"]
        return [f"{v} = _read_timestamp2(b, p, {fsp})", f"p += {4 + _fsp_size(fsp)}"]
    if t == T_TIME2:
        fsp = m["fsp"]
        return [f"{v} = _read_time2(b, p, {fsp})", f"p += {3 + _fsp_size(fsp)}"]
    if t == T_DATE:
        return [f"{v} = _read_date(b, p)", "p += 3"]
    if t == T_TIME:
        return [f"{v} = _read_time_old(b, p)", "p += 3"]
    if t == T_DATETIME:
        return [f"{v} = _read_datetime_old(b, p)", "p += 8"]
    if t == T_TIMESTAMP:
        return [f"{v} = _read_timestamp(b, p)", "p += 4"]
    if t == T_BIT:
        bits, nbytes = m["bits"], m["bytes"]
        return [
            f"{v} = format(_from_bytes(b[p:p + {nbytes}], 'big') & {(1 << bits) - 1}, '0{bits}b')",
            f"p += {nbytes}",
        ]
    if t == T_ENUM:
        size = m["size"]
        if size not in (1, 2, 3, 4, 5, 6, 7, 8):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"size {size}")
        if c.enum_values is None:
            # no value names (binlog_row_metadata=MINIMAL and no column lookup): the index
            return [f"{v} = {_uint_expr(size)}", f"p += {size}"]
        g[f"_enum{i}"] = c.enum_values  # [""] + the names: index 0 is the empty (error) value
        return [
            f"{v} = {_uint_expr(size)}",
            f"if {v} < {len(c.enum_values)}: {v} = _enum{i}[{v}]",
            f"p += {size}",
        ]
    if t == T_SET:
        size = m["size"]
        if size not in (1, 2, 3, 4, 5, 6, 7, 8):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"size {size}")
        if not c.set_values:
            # no value names (binlog_row_metadata=MINIMAL and no column lookup): the bitmask
            return [f"{v} = {_uint_expr(size)}", f"p += {size}"]
        g[f"_set{i}"] = tuple(enumerate(c.set_values))
        return [
            f"mask = {_uint_expr(size)}",
            # MySQL's text of the set (`SELECT set_col`): its names in definition order joined by
            # commas, the empty set '' (the library's set of names printed as Python's repr, and None)
            f"{v} = ','.join([val for idx, val in _set{i} if mask & (1 << idx)])",
            f"p += {size}",
        ]
    raise UnsupportedColumnType(schema, table, str(c.name), t)


def _check_supported(tbl: _Table) -> None:
    """Generate (and drop) the code of the full-image reader: raises UnsupportedColumnType early."""
    assert tbl.columns is not None
    for i, c in enumerate(tbl.columns):
        _column_code(i, c, tbl.schema, tbl.table, {})


class _Diffs:
    """A partial JSON column of a Partial_update_rows after image: its diffs."""

    __slots__ = ("diffs",)

    def __init__(self, diffs: list):
        self.diffs = diffs


def _diffs_reader(schema: str, table: str, column: str | None):
    """f(b, p) -> (_Diffs, new p): a partial JSON column's diffs (connectors/mysql/json_diff.py)."""

    from connectors.mysql import json_diff as _json_diff

    def read(b: bytes, p: int) -> tuple[_Diffs, int]:
        try:
            diffs, p = _json_diff.read_diffs(b, p, len(b))
        except _json_diff.JsonDiffError as exc:
            raise BinlogDecodeError(
                f"column {column!r} of {schema}.{table}: malformed partial JSON update: {exc}"
            ) from None
        return _Diffs(diffs), p

    return read


def _image_code(tbl: _Table, present: bytes, partial: frozenset[int] | None, g: dict[str, Any]) -> list[str]:
    """Lines (not indented) that read one row image with this columns-present bitmap from
    b[p:] into v0, v1, ... and advance p; what they call goes into `g`. `partial`: see
    `_make_reader`."""
    cols = tbl.columns
    assert cols is not None
    present_idx = [i for i in range(tbl.ncols) if present[i >> 3] & (1 << (i & 7))]
    nb = (len(present_idx) + 7) // 8
    body = []
    if nb == 1:
        body.append("nulls = b[p]")
    elif nb:
        body.append(f"nulls = _from_bytes(b[p:p + {nb}], 'little')")
    body.append(f"p += {nb}")
    is_present = set(present_idx)
    null_index = 0
    for i, c in enumerate(cols):
        if i not in is_present:
            body.append(f"v{i} = None")
            continue
        if partial is not None and i in partial:
            g[f"_diffs{i}"] = _diffs_reader(tbl.schema, tbl.table, c.name)
            code = [f"v{i}, p = _diffs{i}(b, p)"]
        elif partial is not None and c.type == T_JSON:
            g[f"_doc{i}"] = _json_reader(tbl.schema, tbl.table, c.name, document=True)
            size = c.meta["length_size"]
            code = [f"n = {_uint_expr(size)}", f"p += {size}", f"v{i} = _doc{i}(b[p:p + n])", "p += n"]
        else:
            code = _column_code(i, c, tbl.schema, tbl.table, g)
        body.append(f"if nulls & {1 << null_index}:")
        body.append(f"    v{i} = None")
        body.append("else:")
        body.extend("    " + line for line in code)
        null_index += 1
    return body


def _values_code(tbl: _Table) -> str:
    """The row's values dict of v0, v1, ... (`_image_code`), by column name."""
    return "{" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(tbl.names)) + "}"


def _compiled(tbl: _Table, src: str, name: str, g: dict[str, Any]):
    exec(compile(src, f"<binlog row reader {tbl.schema}.{tbl.table}>", "exec"), g)
    fn: Any = g[name]
    fn.__source__ = src
    return fn


def _make_reader(tbl: _Table, present: bytes, partial: frozenset[int] | None = None):
    """A function (b, p) -> (values dict, new p) for one row image with this bitmap.
    `partial` (a Partial_update_rows image): JSON values as documents (mysql_json.parse),
    and the columns in `partial` as their diffs."""
    g = dict(_GLOBALS_BASE)
    body = ["def _read_row(b, p):"]
    body.extend("    " + line for line in _image_code(tbl, present, partial, g))
    body.append(f"    return {_values_code(tbl)}, p")
    return _compiled(tbl, "\n".join(body) + "\n", "_read_row", g)


def _make_inserter(tbl: _Table, present: bytes):
    """A function (b, p, stop, file, pos, append) that appends the `RowInsert` of each row
    image in b[p:stop] (a Write_rows event's rows, this columns-present bitmap), all ending
    at file:pos. The row reader of `_make_reader` inside the loop, and the rows built there
    with the table's names as constants: no call and no (values, p) tuple per row
    (outbox-only `decode_batch`: one row per Write_rows event). A row's slots are set by
    plain stores, its end as the file and offset it keeps (cdc/source_events.py)."""
    g = dict(_GLOBALS_BASE)
    g.update(_schema=tbl.schema, _table=tbl.table, _RowInsert=RowInsert, _new=_new)
    body = ["def _read_inserts(b, p, stop, file, pos, append):", "    while p < stop:"]
    body.extend("        " + line for line in _image_code(tbl, present, None, g))
    body += [
        "        row = _new(_RowInsert)",
        "        row.schema = _schema",
        "        row.table = _table",
        f"        row.values = {_values_code(tbl)}",
        "        row._end_file = file",
        "        row._end_pos = pos",
        "        append(row)",
    ]
    return _compiled(tbl, "\n".join(body) + "\n", "_read_inserts", g)


# -- MySQL's GTID event ------------------------------------------------------------------


@dataclass(frozen=True)
class MysqlGtid:
    """The fields of a MySQL Gtid_log_event (type 33) body, as MySQL 8.0 writes it
    (libbinlogevents `Gtid_event`): flags (1), source uuid (16), gno (8), then, when the
    event is long enough, the logical clock (type code 2 (1), last_committed (8),
    sequence_number (8)), immediate_commit_timestamp (7 bytes, microseconds; its top bit
    set: original_commit_timestamp (7) follows, else it equals the immediate one),
    transaction_length (a packed integer), immediate_server_version (4; top bit set:
    original_server_version (4) follows). MySQL 5.6 / 5.7 events end earlier; absent
    fields are None."""

    flags: int
    gtid: str
    last_committed: int | None = None
    sequence_number: int | None = None
    immediate_commit_us: int | None = None
    original_commit_us: int | None = None
    transaction_length: int | None = None
    immediate_server_version: int | None = None
    original_server_version: int | None = None


def _packed_int(b: bytes, p: int) -> tuple[int, int]:
    """MySQL's net_field_length: < 251 one byte; 252 + 2, 253 + 3, 254 + 8 bytes."""
    first = b[p]
    if first < 251:
        return first, p + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None:
        raise BinlogDecodeError(f"malformed packed integer (first byte {first}) in a GTID event")
    return int.from_bytes(b[p + 1 : p + 1 + width], "little"), p + 1 + width


def parse_mysql_gtid(ev: bytes, crc: int = 4) -> MysqlGtid:
    """A whole Gtid_log_event (header + body [+ CRC of `crc` bytes]) -> its fields."""
    end = len(ev) - crc
    h = ev[20:36].hex()
    gtid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}:{_U64(ev, 36)[0]}"
    p = 44
    if p + 17 > end or ev[p] != 2:  # no logical clock (MySQL 5.6)
        return MysqlGtid(ev[19], gtid)
    last_committed, sequence_number = _U64(ev, p + 1)[0], _U64(ev, p + 9)[0]
    p += 17
    fields: dict[str, Any] = {}
    if p + 7 <= end:
        immediate = int.from_bytes(ev[p : p + 7], "little")
        p += 7
        original = immediate & ~(1 << 55)
        if immediate & (1 << 55):
            immediate = original
            original = int.from_bytes(ev[p : p + 7], "little")
            p += 7
        fields.update(immediate_commit_us=immediate, original_commit_us=original)
        if p < end:
            fields["transaction_length"], p = _packed_int(ev, p)
        if p + 4 <= end:
            server = _U32(ev, p)[0]
            p += 4
            original_server = server & 0x7FFFFFFF
            if server & 0x80000000:
                server = original_server
                original_server = _U32(ev, p)[0]
                p += 4
            fields.update(immediate_server_version=server, original_server_version=original_server)
    return MysqlGtid(ev[19], gtid, last_committed, sequence_number, **fields)


# -- the decoder -----------------------------------------------------------------------


def _skippable_rows(ph_rows_v1: int) -> frozenset[int]:
    """The rows event types whose handler's first act, for a table that is not watched, is
    to return: every one but Update_rows_v1 / Delete_rows_v1 on a server without v1 rows
    events, whose handlers refuse them first (`_v1_start`)."""
    v1_changes = {UPDATE_ROWS_V1, DELETE_ROWS_V1} if ph_rows_v1 else set()
    return frozenset(
        {WRITE_ROWS_V1, WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2, PARTIAL_UPDATE_ROWS_EVENT}
        | v1_changes
        | set(MARIADB_ROWS_COMPRESSED)
    )


class BinlogDecoder:
    """Turns raw binlog events into `cdc.source_events`; keeps the current file name.

    `watched`: the (schema, table) pairs whose rows are decoded; `start_file`: the file
    the stream starts in (None for a GTID start: the server's first, fake, Rotate names
    it). `flavor`: "mariadb" / "mysql" (charset tables differ); None = from the
    Format_description event. `legacy_begin_start`: reproduce `_Converter`'s TxBegin.start
    (see the module docstring). `verify_checksum`: check every event's CRC32.
    `table_columns`: where a watched table's column names and ENUM/SET values come from
    when its Table_map lacks them (binlog_row_metadata=MINIMAL; connectors/mysql/table_columns.py);
    None: such a table's columns are named UNKNOWN_COLn, an ENUM is its index and a SET its
    bitmask (ints).
    """

    TABLE_CACHE_LIMIT = 4096

    def __init__(
        self,
        watched: set[tuple[str, str]],
        start_file: str | None,
        *,
        flavor: str | None = None,
        legacy_begin_start: bool = False,
        verify_checksum: bool = False,
        table_columns: _table_columns.TableColumns | None = None,
    ):
        self.watched = set(watched)
        self.table_columns = table_columns
        self.file = ""  # "": not known until the stream's first Rotate event
        if start_file is not None:
            file_sequence(start_file)
            self.file = start_file
        self.dbms = flavor or "mysql"
        self._flavor_fixed = flavor is not None
        self.legacy_begin_start = legacy_begin_start
        self.verify_checksum = verify_checksum
        self.crc = 4  # bytes of checksum at the end of each event (until a FDE says otherwise)
        self._crc_known = False
        self.post_header: bytes = b""
        self._ph_query = 13
        self._ph_load_query = 26
        self._ph_table_map = 8
        self._ph_rows_v1 = 8
        self._ph_rows_v2 = 10
        self._ph_compressed_rows: dict[int, int] = {}  # MariaDB's compressed rows types, from the FDE
        self._skippable_rows = _skippable_rows(self._ph_rows_v1)
        self.server_version: str | None = None
        self._tables: dict[bytes, _Table] = {}  # 6-byte table id -> layout
        self._layouts: dict[bytes, _Table] = {}  # Table_map body after the table id -> layout
        self.table_maps_decoded = 0
        h: dict[int, Any] = {
            QUERY_EVENT: self._query,
            ROTATE_EVENT: self._rotate,
            FORMAT_DESCRIPTION_EVENT: self._fde,
            XID_EVENT: self._xid,
            TABLE_MAP_EVENT: self._table_map,
            WRITE_ROWS_V1: self._write_v1,
            WRITE_ROWS_V2: self._write_v2,
            UPDATE_ROWS_V1: self._update_v1,
            UPDATE_ROWS_V2: self._update_v2,
            DELETE_ROWS_V1: self._delete_v1,
            DELETE_ROWS_V2: self._delete_v2,
            PARTIAL_UPDATE_ROWS_EVENT: self._partial_update,
            HEARTBEAT_LOG_EVENT: self._heartbeat,
            GTID_LOG_EVENT: self._mysql_gtid,
            GTID_TAGGED_LOG_EVENT: self._mysql_tagged_gtid,
            MARIADB_GTID_EVENT: self._mariadb_gtid,
            XA_PREPARE_LOG_EVENT: self._xa_prepare,
            EXECUTE_LOAD_QUERY_EVENT: self._load_query,
            TRANSACTION_PAYLOAD_EVENT: self._payload,
            MARIADB_QUERY_COMPRESSED: self._query_compressed,
        }
        for t in MARIADB_ROWS_COMPRESSED:
            h[t] = self._rows_compressed
        self._handlers = h
        self._known_handlers = dict(h)  # h less what a Format_description says the server lacks
        self._get_handler = h.get

    # -- entry point ----------------------------------------------------------------

    def decode_batch(self, events: list[bytes], out: list) -> None:
        """`decode` for each event of `events` (a list of `bytes`, as
        `BinlogConnection.event_batches` yields them, and as `event_runs` hands over an
        event `decode_reads` left or one that was split across reads). The relay's loop
        over a socket read's events, with the events that do nothing handled in place, is
        `decode_reads`: this one stays the plain loop, so that the fast path is written
        once."""
        for ev in events:
            self.decode(ev, out)

    def decode_reads(self, item: Any, out: list) -> None:
        """`decode` for the events of one item of `BinlogConnection.event_runs`: a list of
        events (`decode_batch`), or a socket read's buffer (`PacketRun`), whose complete
        event packets this loop frames itself from `item.pos` on, leaving `item.pos` at
        the first one it does not take (the connection hands that one over as a list).

        A rows event of a table that is not watched and a Table_map of a cached layout
        are read in the buffer and never become a bytes object (on the mixed binlog of
        bench/workloads.py, 20 events in 22); every other event reaches its handler as
        the same bytes `event_batches` gives: the packet's payload after the OK byte."""
        if type(item) is list:
            self.decode_batch(item, out)
            return
        data, p = item.data, item.pos
        # a packet of 16 MiB - 1 continues in the next physical packet: ending past `size`,
        # it is left to the framing like a packet the read has not completed
        size = min(len(data), _MAX_PACKET)
        last = size - _RUN_HEAD_SIZE
        head = _RUN_HEAD
        if self.verify_checksum:  # every event checked: no skipping
            while p <= last:
                n, ok, t, tid = head(data, p)
                n &= 0xFFFFFF
                end = p + 4 + n
                if ok or end > size or n < _RUN_MIN:
                    break
                self.decode(data[p + 5 : end], out)
                p = end
            item.pos = p
            return
        get = self._get_handler
        skippable = self._skippable_rows
        tables, layouts = self._tables, self._layouts  # changed in place only
        crc = self.crc
        append = out.append
        while p <= last:
            n, ok, t, tid = head(data, p)
            n &= 0xFFFFFF
            end = p + 4 + n
            if ok or end > size or n < _RUN_MIN:
                break  # not an event packet, not complete, or shorter than a table id
            # the event is data[p + 5 : end]; the Table_map first: on a mixed binlog it is
            # every other event
            if t == TABLE_MAP_EVENT:
                tbl = layouts.get(data[p + 30 : end - crc])  # the event's [25 : -crc]
                if tbl is not None and not tbl.looked_up:
                    tables[tid] = tbl
                    p = end
                    if tbl.columns is None and p <= last:
                        # A table that is not watched: the next event is most often this
                        # Table_map's rows event (one per statement), dropped here when it
                        # is (what the loop's next turn would decide, one table look-up
                        # and one turn fewer: 7% of this loop on the mixed capture).
                        n, ok, t, rows_tid = head(data, p)
                        n &= 0xFFFFFF
                        end = p + 4 + n
                        # (a rows event too short to hold a table id is dropped either way)
                        if rows_tid == tid and not ok and end <= size and t in skippable:
                            p = end
                    continue
            elif t in skippable:
                tbl = tables.get(tid)
                if tbl is None or tbl.columns is None:
                    p = end
                    continue
                if t == WRITE_ROWS_V2 or (t == WRITE_ROWS_V1 and self._ph_rows_v1):
                    # A watched table's inserts: what _write_v1 / _write_v2 do after the same
                    # look-up, the table's kept inserter called here (else _inserts makes
                    # one): 3.85 -> 3.69 us a one-row event (outbox-only capture, in-process
                    # A/B). Write_rows_v1 on a server without v1 rows events goes to its
                    # handler, which refuses it.
                    ev, p = data[p + 5 : end], end
                    q = self._rows_start(ev, True) if t == WRITE_ROWS_V2 else 19 + self._ph_rows_v1
                    insert = tbl.inserters.get(ev[q : q + tbl.head])
                    if insert is None:
                        self._inserts(ev, out, tbl, q)
                    else:
                        insert(ev, q + tbl.head, len(ev) - crc, self.file, _U32(ev, 13)[0], append)
                    continue
            handler = get(t)
            if handler is not None:
                ev, p = data[p + 5 : end], end
                handler(ev, out)
                skippable = self._skippable_rows  # a Format_description may change it,
                crc = self.crc  # and the CRC's presence
            else:
                p = end
        item.pos = p

    def decode(self, event: bytes, out: list) -> None:
        """Append the source events of one raw binlog event (header + body [+ CRC])."""
        handler = self._get_handler(event[4])
        if handler is not None:
            if type(event) is not bytes:
                event = bytes(event)
            if self.verify_checksum and self.crc and event[4] != FORMAT_DESCRIPTION_EVENT:
                self._verify(event)
            handler(event, out)

    def _verify(self, ev: bytes) -> None:
        if zlib.crc32(ev[:-4]) != _U32(ev, len(ev) - 4)[0]:
            raise BinlogDecodeError(
                f"CRC32 mismatch in an event of type {ev[4]} ending at {self.file}:{_U32(ev, 13)[0]}"
            )

    # -- compressed events ---------------------------------------------------------------

    def _undecodable(self, ev: bytes, why: str) -> UndecodableEvent:
        t = ev[4]
        size, log_pos = _U32(ev, 9)[0], _U32(ev, 13)[0]
        return UndecodableEvent(
            f"cannot decode the {_EVENT_NAMES.get(t, 'binlog')} event (type {t}) at {self.file}:{log_pos - size} "
            f"(ending at {log_pos}): {why}; nothing from it on was published and the checkpoint stays before it: "
            "restore this binlog file from an intact copy (a backup, or a replica's), then restart the relay"
        )

    def _post_header(self, t: int, default: int) -> int:
        ph = self.post_header
        return ph[t - 1] if len(ph) >= t and ph[t - 1] else default

    def _query_compressed(self, ev: bytes, out: list) -> None:
        from connectors.mysql import binlog_compression as _compression

        ph = self._post_header(MARIADB_QUERY_COMPRESSED, self._ph_query)
        try:
            plain = _compression.mariadb_query(ev, ph, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        self._query(plain, out, ph)

    def _rows_compressed(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        # not watched (or a table id whose Table_map lies before where the stream started,
        # which only happens inside a transaction the relay never starts in): skipped
        # without decompressing
        if tbl is None or tbl.columns is None:
            return
        t = ev[4]
        ph = self._ph_rows_v1 if t < 169 else self._ph_rows_v2
        if self._ph_compressed_rows.get(t, ph) != ph:
            raise self._undecodable(ev, "its post-header length differs from the plain rows event's")
        from connectors.mysql import binlog_compression as _compression

        try:
            plain = _compression.mariadb_rows(ev, ph, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        if t == 166:  # Write_rows_compressed_v1: MariaDB's usual one
            self._inserts(plain, out, tbl, 19 + ph)
        else:
            self._handlers[plain[4]](plain, out)

    def _payload(self, ev: bytes, out: list) -> None:
        """MySQL Transaction_payload: its events, each placed where the payload is."""
        from connectors.mysql import binlog_compression as _compression

        try:
            inner = _compression.transaction_payload(ev, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        size, log_pos = _U32(ev, 9)[0], _U32(ev, 13)[0]
        pad = b""
        if self.crc:
            first = inner[0]
            has_own = len(first) > 23 and zlib.crc32(first[:-4]) == _U32(first, len(first) - 4)[0]
            pad = b"" if has_own else b"\0" * self.crc
        last = len(inner) - 1
        get = self._get_handler
        for i, raw in enumerate(inner):
            t = raw[4]
            if t in (TRANSACTION_PAYLOAD_EVENT, FORMAT_DESCRIPTION_EVENT, ROTATE_EVENT):
                raise self._undecodable(ev, f"inner event {i} has type {t}, which a payload never holds")
            handler = get(t)
            if handler is None:
                continue
            before = len(out)
            try:
                handler(_compression.positioned(raw, size, log_pos, pad), out)
            except (IndexError, struct.error, UnicodeDecodeError) as exc:
                raise self._undecodable(ev, f"inner event {i} (type {t}) is malformed ({exc})") from None
            if i < last and len(out) > before and isinstance(out[-1], _TX_ENDS):
                raise self._undecodable(
                    ev,
                    f"inner event {i} of {last + 1} ends a transaction and more events follow it; MySQL writes "
                    "one transaction per payload, and a checkpoint cannot name a place inside one",
                )

    # -- bookkeeping events ------------------------------------------------------------

    def _rotate(self, ev: bytes, out: list) -> None:
        crc = self.crc
        if not self._crc_known:  # the fake Rotate at stream start precedes any FDE
            crc = 4 if len(ev) >= 31 and zlib.crc32(ev[:-4]) == _U32(ev, len(ev) - 4)[0] else 0
        name = ev[19 + 8 : len(ev) - crc].decode()
        file_sequence(name)
        self.file = name
        if _U32(ev, 0)[0] != 0:
            self._tables.clear()  # a real rotate: table ids may be reused (the library does the same)

    def _fde(self, ev: bytes, out: list) -> None:
        body = ev[19:]
        version = body[2:52].rstrip(b"\0").decode("ascii", "replace")
        self.server_version = version
        # The post-header list is as long as the server's event types: every server that
        # writes checksums (MySQL 5.6.1+, MariaDB 5.3+) ends the event with the algorithm
        # byte (0 none, 1 CRC32) and a 4-byte checksum, with binlog_checksum=NONE too
        # (MySQL libbinlogevents control_events.cpp, Format_description_event's reading
        # constructor: number_of_event_types less BINLOG_CHECKSUM_ALG_DESC_LEN from
        # checksum_version_product on). A 5.7 server lists types 1-38, 8.0 up to 41, 9.x 42.
        if writes_checksum_algorithm(version):
            self.crc = 4 if ev[-5] == 1 else 0
            ph = body[57:-5]
        else:
            self.crc = 0
            ph = body[57:]
        self._crc_known = True
        # `created` (4 bytes after the 50-byte server version) is set only in the binlog a
        # server opens at its start; a rotation writes 0, and the dump thread zeroes it when
        # a stream starts inside the file (MySQL libbinlogevents control_events.h
        # Format_description_event::created, sql/rpl_binlog_sender.cc
        # send_format_description_event; MariaDB sql/sql_repl.cc). Non-zero: every earlier
        # file predates a server start (cdc/assembly/feed.py's proof of a prepare lost in a crash).
        if len(body) >= 56 and _U32(body, 52)[0] and self.file:
            out.append(ServerStarted(_pos(self.file, 4)))
        if not self._flavor_fixed:
            self.dbms = "mariadb" if "mariadb" in version.lower() else "mysql"
        self.post_header = ph
        self._refuse_types_past(len(ph))
        self._ph_query = ph[QUERY_EVENT - 1] if len(ph) >= QUERY_EVENT else 13
        self._ph_load_query = ph[EXECUTE_LOAD_QUERY_EVENT - 1] if len(ph) >= EXECUTE_LOAD_QUERY_EVENT else 26
        # The table id size follows from the post-header lengths of the Table_map and rows
        # events (MySQL's Table_map_event / Rows_event constructors: 6 = a 4-byte table id,
        # servers before 5.1.4; otherwise 6 bytes). A length 0 means the server has no such
        # event type: MySQL 9.0 removed the v1 rows events (23-25).
        lengths = {}
        for t, (name, default, readable) in _ROWS_POST_HEADERS.items():
            n = ph[t - 1] if len(ph) >= t else default
            if n not in readable and (t != PARTIAL_UPDATE_ROWS_EVENT or self.dbms == "mysql"):
                why = (
                    "4-byte table ids (servers before MySQL 5.1.4), which this decoder does not read"
                    if n == 6
                    else f"this decoder reads {' or '.join(str(r) for r in readable if r)}"
                )
                raise BinlogDecodeError(
                    f"unsupported binlog layout from server {version}: its Format_description gives {name} "
                    f"(event type {t}) post-header length {n}: {why}"
                )
            lengths[t] = n
        self._ph_table_map = lengths[TABLE_MAP_EVENT]
        self._ph_rows_v1 = lengths[WRITE_ROWS_V1]
        self._ph_rows_v2 = lengths[WRITE_ROWS_V2] or 10
        self._ph_compressed_rows = {t: ph[t - 1] for t in MARIADB_ROWS_COMPRESSED if len(ph) >= t and ph[t - 1]}
        self._skippable_rows = _skippable_rows(self._ph_rows_v1)

    def _refuse_types_past(self, listed: int) -> None:
        """An event type past the Format_description's list does not exist on that server
        (a 5.7 server has no Partial_update_rows, Transaction_payload or tagged GTID): its
        handler refuses it instead of reading it with lengths from past the list. MariaDB's
        own types (160 on) are left to their handlers, which read their defaults."""
        h = self._handlers
        h.update(self._known_handlers)
        if self.dbms != "mysql":
            return
        for t in self._known_handlers:
            if listed < t < _MARIADB_TYPES:
                h[t] = self._nonexistent

    def _nonexistent(self, ev: bytes, out: list) -> None:
        raise BinlogDecodeError(
            f"an event of type {ev[4]} ending at {self.file}:{_U32(ev, 13)[0]}, a type server {self.server_version} "
            f"does not have (its Format_description lists event types 1-{len(self.post_header)})"
        )

    def _xid(self, ev: bytes, out: list) -> None:
        ts, _, _, _, log_pos, _ = _HDR.unpack_from(ev)
        out.append(TxCommit(_pos(self.file, log_pos), ts))

    def _heartbeat(self, ev: bytes, out: list) -> None:
        log_pos = _U32(ev, 13)[0]
        if self.file and log_pos:
            out.append(Heartbeat(_pos(self.file, log_pos)))

    def _begin_start(self, size: int, log_pos: int) -> int:
        if self.legacy_begin_start:
            return log_pos - (size - 19 - self.crc)
        return log_pos - size

    def _mariadb_gtid(self, ev: bytes, out: list) -> None:
        _, _, server_id, size, log_pos, _ = _HDR.unpack_from(ev)
        seq = _U64(ev, 19)[0]
        domain = _U32(ev, 27)[0]
        flags = ev[31]
        file = self.file
        standalone = bool(flags & FL_STANDALONE)
        out.append(
            TxBegin(
                _pos(file, self._begin_start(size, log_pos)),
                _pos(file, log_pos),
                f"{domain}-{server_id}-{seq}",
                standalone,
                not standalone,
            )
        )

    def _mysql_gtid(self, ev: bytes, out: list) -> None:
        _, _, _, size, log_pos, _ = _HDR.unpack_from(ev)
        gtid = parse_mysql_gtid(ev, self.crc).gtid
        file = self.file
        out.append(TxBegin(_pos(file, self._begin_start(size, log_pos)), _pos(file, log_pos), gtid, False))

    def _mysql_tagged_gtid(self, ev: bytes, out: list) -> None:
        """A tagged transaction's GTID event: the same TxBegin as a Gtid_log_event's, its
        GTID `uuid:tag:gno`."""
        from connectors.mysql.gtid_tagged import TaggedGtidError, read_tagged_gtid

        _, _, _, size, log_pos, _ = _HDR.unpack_from(ev)
        start = _pos(self.file, self._begin_start(size, log_pos))
        try:
            gtid = read_tagged_gtid(ev[19 : len(ev) - self.crc]).gtid
        except TaggedGtidError as exc:
            raise BinlogDecodeError(f"Gtid_tagged_log_event at {start}: {exc}") from None
        out.append(TxBegin(start, _pos(self.file, log_pos), gtid, False))

    def _query(self, ev: bytes, out: list, post_header: int = 0) -> None:
        ts, _, _, size, log_pos, _ = _HDR.unpack_from(ev)
        db_len = ev[19 + 8]
        status_len = _U16(ev, 19 + 11)[0]
        db_at = 19 + (post_header or self._ph_query) + status_len
        start = db_at + db_len + 1
        sql = ev[start : len(ev) - self.crc].decode("utf-8", "backslashreplace").strip()
        schema = ev[db_at : db_at + db_len].decode("utf-8", "backslashreplace") if db_len else ""
        file = self.file
        out.append(query_event(sql, _pos(file, self._begin_start(size, log_pos)), _pos(file, log_pos), ts, schema))

    def _load_query(self, ev: bytes, out: list) -> None:
        """Execute_load_query (LOAD DATA in statement format): a Query event whose
        post-header also names the loaded file; its text is the LOAD DATA statement."""
        self._query(ev, out, self._ph_load_query)

    def _xa_prepare(self, ev: bytes, out: list) -> None:
        """XA_prepare (type 38): one_phase (1), formatID (4), gtrid length (4), bqual
        length (4), gtrid + bqual bytes."""
        ts, _, _, _, log_pos, _ = _HDR.unpack_from(ev)
        one_phase = ev[19] != 0
        format_id, gtrid_len, bqual_len = struct.unpack_from("<iII", ev, 20)
        if 32 + gtrid_len + bqual_len > len(ev) - self.crc or gtrid_len > 64 or bqual_len > 64:
            raise BinlogDecodeError(
                f"malformed XA_prepare event ending at {self.file}:{log_pos} (xid lengths {gtrid_len}/{bqual_len})"
            )
        gtrid = ev[32 : 32 + gtrid_len]
        bqual = ev[32 + gtrid_len : 32 + gtrid_len + bqual_len]
        out.append(XaPrepare(xid_text(format_id, gtrid, bqual), _pos(self.file, log_pos), ts, one_phase))

    # -- Table_map ---------------------------------------------------------------------

    def _table_map(self, ev: bytes, out: list) -> None:
        key = ev[25 : len(ev) - self.crc]
        tbl = self._layouts.get(key)
        if tbl is None or (tbl.looked_up and tbl.table_id != ev[19:25]):
            tbl = self._parse_table_map(key)
            tbl.table_id = ev[19:25]
            if len(self._layouts) >= self.TABLE_CACHE_LIMIT:
                self._layouts.clear()
            self._layouts[key] = tbl
        self._tables[ev[19:25]] = tbl

    def _parse_table_map(self, body: bytes) -> _Table:
        """`body`: the Table_map event body after the 6-byte table id, without CRC."""
        self.table_maps_decoded += 1
        p = 2  # flags
        n = body[p]
        schema = body[p + 1 : p + 1 + n].decode()
        p += 1 + n + 1
        n = body[p]
        table = body[p + 1 : p + 1 + n].decode()
        p += 1 + n + 1
        tbl = _Table(schema, table)
        if (schema, table) not in self.watched:
            return tbl
        ncols, p = _lenenc(body, p)
        cols = [_Column(t) for t in body[p : p + ncols]]
        p += ncols
        meta_len, p = _lenenc(body, p)
        q = p
        for c in cols:
            q = _parse_column_meta(c, body, q)
        p += meta_len
        nbytes = (ncols + 7) // 8
        nullable = int.from_bytes(body[p : p + nbytes], "little")
        p += nbytes
        for i, c in enumerate(cols):
            c.nullable = bool(nullable & (1 << i))
        meta = _read_optional_metadata(cols, body, p, len(body))
        if self.table_columns is not None and _lacks_metadata(cols, meta):
            self._look_up(tbl, cols, meta)
        _assign_metadata(cols, meta, self.dbms)
        tbl.columns = cols
        tbl.ncols = ncols
        tbl.head = 1 + ((ncols + 7) >> 3) if ncols < 251 else 0
        tbl.names = tuple(c.name for c in cols)
        tbl.json_columns = tuple(i for i, c in enumerate(cols) if c.type == T_JSON)
        _check_supported(tbl)
        return tbl

    def _look_up(self, tbl: _Table, cols: list[_Column], meta: _RowMetadata) -> None:
        """Column names and ENUM/SET values the Table_map lacks (binlog_row_metadata=MINIMAL),
        from the `table_columns` port (connectors/mysql/table_columns.py)."""
        assert self.table_columns is not None
        tbl.looked_up = True
        try:
            defs = list(self.table_columns(tbl.schema, tbl.table))
        except _table_columns.TableColumnsError as exc:
            raise BinlogDecodeError(str(exc)) from None
        fix = (
            "so the column names and ENUM/SET values of the binlog's rows cannot be known: set "
            "binlog_row_metadata=FULL on the server (the binlog then carries them), then restart the relay"
        )
        where = f"{tbl.schema}.{tbl.table}"
        if len(defs) != len(cols):
            raise ServerSettingRequired(
                f"{where} has {len(defs)} columns in information_schema.COLUMNS but {len(cols)} in the binlog's "
                f"Table_map (the table was altered after the event was written), {fix}"
            )
        for c, d in zip(cols, defs, strict=True):
            want = _DATA_TYPES.get(c.type)
            if d.data_type in _KNOWN_DATA_TYPES and want is not None and d.data_type not in want:
                raise ServerSettingRequired(
                    f"column {d.name!r} of {where} is {d.data_type} in information_schema.COLUMNS but of binlog type "
                    f"{c.type} ({_TYPE_NAMES.get(c.type, 'unknown')}) in the Table_map (the table was altered after "
                    f"the event was written), {fix}"
                )
        meta.names = [d.name for d in defs]
        if meta.enum_values is None:
            meta.enum_values = [list(d.values or ()) for c, d in zip(cols, defs, strict=True) if c.type == T_ENUM]
        if meta.set_values is None:
            meta.set_values = [list(d.values or ()) for c, d in zip(cols, defs, strict=True) if c.type == T_SET]
        if meta.unsigned is None:
            meta.unsigned = [d.unsigned for d in defs]
        if meta.charsets is None:
            meta.encodings = [
                _charset_encoding(d.charset)
                for c, d in zip(cols, defs, strict=True)
                if _is_character(c.type, self.dbms)
            ]

    # -- rows ----------------------------------------------------------------------------

    def _rows_start(self, ev: bytes, v2: bool) -> int:
        if v2:
            extra = _U16(ev, 19 + 8)[0]
            return 19 + self._ph_rows_v2 + extra - 2
        return self._v1_start(ev)

    def _v1_start(self, ev: bytes) -> int:
        """Where a v1 rows event's body starts; refused when the server has no v1 rows events."""
        ph = self._ph_rows_v1
        if not ph:
            raise BinlogDecodeError(
                f"a rows event of event type {ev[4]} ending at {self.file}:{_U32(ev, 13)[0]}, a type server "
                f"{self.server_version} does not have (its Format_description gives it post-header length 0)"
            )
        return 19 + ph

    def _write_v1(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        self._inserts(ev, out, tbl, self._v1_start(ev))

    def _write_v2(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        self._inserts(ev, out, tbl, self._rows_start(ev, True))

    def _inserts(self, ev: bytes, out: list, tbl: _Table, p: int) -> None:
        # The column count and the columns-present bitmap (sql/log_event.h, Rows_log_event:
        # "m_width" as a packed integer, then "m_cols") are the same bytes on every rows event
        # of a table in practice: those bytes, sliced by the Table_map's count, name the
        # inserter (`_Table.inserters`), one look-up instead of parsing them per event.
        insert = tbl.inserters.get(ev[p : p + tbl.head])
        if insert is None:
            insert, p = self._inserter(ev, tbl, p)
        else:
            p += tbl.head
        insert(ev, p, len(ev) - self.crc, self.file, _U32(ev, 13)[0], out.append)

    def _inserter(self, ev: bytes, tbl: _Table, p: int) -> tuple[Any, int]:
        """The inserter of a Write_rows event's bitmap at ev[p:], and where its rows start."""
        start = p
        ncols = ev[p]
        if ncols >= 251:
            ncols, p = _lenenc(ev, p)
        else:
            p += 1
        nb = (ncols + 7) >> 3
        present = ev[p : p + nb]
        p += nb
        inserters = tbl.inserters
        insert = inserters.get((ncols, present))
        if insert is None:
            insert = inserters[(ncols, present)] = _make_inserter(tbl, present)
            if ncols == tbl.ncols and ncols < 251:
                # the key `_inserts` slices: 1 + nb bytes (a Table_map's count below 251
                # is one byte; a rows event of another width never starts with that byte)
                inserters[ev[start:p]] = insert
        return insert, p

    def _update_v1(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, self._v1_start(ev), True)

    def _update_v2(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, None, True)

    def _delete_v1(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, self._v1_start(ev), False)

    def _delete_v2(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, None, False)

    def _changes(self, ev: bytes, out: list, p: int | None, update: bool) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        if p is None:
            p = self._rows_start(ev, True)
        ncols, p = _lenenc(ev, p)
        nb = (ncols + 7) >> 3
        present = ev[p : p + nb]
        p += nb
        readers = tbl.readers
        reader = readers.get(present)
        if reader is None:
            reader = readers[present] = _make_reader(tbl, present)
        after = reader
        if update:
            present2 = ev[p : p + nb]
            p += nb
            after = readers.get(present2)
            if after is None:
                after = readers[present2] = _make_reader(tbl, present2)
        stop = len(ev) - self.crc
        end = _pos(self.file, _U32(ev, 13)[0])
        kind = "update" if update else "delete"
        schema, table = tbl.schema, tbl.table
        while p < stop:
            values, p = reader(ev, p)
            if update:
                values, p = after(ev, p)
            out.append(RowChange(kind, schema, table, values, end))

    def _partial_update(self, ev: bytes, out: list) -> None:
        """Partial_update_rows (type 39, binlog_row_value_options=PARTIAL_JSON): as
        Update_rows v2, but each after image starts with value_options (a packed integer:
        1 = PARTIAL_JSON) and, when it is 1, one bit per JSON column of the table (in
        column order, low bit first) saying whether that column's value is a list of diffs
        (MySQL sql/rpl_record.cc pack_row / start_partial_bit_reader). The diffs are applied
        to the before image's document (connectors/mysql/json_diff.py), so the row change is the
        same UPDATE an Update_rows event with the whole document gives."""
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        from connectors.mysql import json_binary as _mysql_json

        p = self._rows_start(ev, True)
        ncols, p = _lenenc(ev, p)
        nb = (ncols + 7) >> 3
        before_present, after_present = ev[p : p + nb], ev[p + nb : p + 2 * nb]
        p += 2 * nb
        readers = tbl.readers
        no_partial: frozenset[int] = frozenset()
        before_reader = readers.get((before_present, no_partial))
        if before_reader is None:
            before_reader = readers[(before_present, no_partial)] = _make_reader(tbl, before_present, no_partial)
        json_columns = tbl.json_columns
        stop = len(ev) - self.crc
        end = _pos(self.file, _U32(ev, 13)[0])
        while p < stop:
            before, p = before_reader(ev, p)
            options, p = _lenenc(ev, p)
            if options > 1:
                raise BinlogDecodeError(
                    f"malformed Partial_update_rows event ending at {self.file}:{end.pos} (value options {options})"
                )
            partial = no_partial
            if options:
                jb = (len(json_columns) + 7) >> 3
                bits = int.from_bytes(ev[p : p + jb], "little")
                p += jb
                partial = frozenset(i for k, i in enumerate(json_columns) if bits >> k & 1)
            key = (after_present, partial)
            after_reader = readers.get(key)
            if after_reader is None:
                after_reader = readers[key] = _make_reader(tbl, after_present, partial)
            after, p = after_reader(ev, p)
            for i in json_columns:
                name = tbl.names[i]
                value = after[name]
                if type(value) is _Diffs:
                    value = self._apply_diffs(tbl, i, before_present, before[name], value, end)
                if value is not None:
                    after[name] = _mysql_json.text(value)
            out.append(RowChange("update", tbl.schema, tbl.table, after, end))

    def _apply_diffs(self, tbl: _Table, i: int, before_present: bytes, doc: Any, diffs: _Diffs, end) -> Any:
        from connectors.mysql import json_diff as _json_diff

        name = tbl.names[i]
        where = f"column {name!r} of {tbl.schema}.{tbl.table} in the Partial_update_rows event ending at {end}"
        if not before_present[i >> 3] & (1 << (i & 7)):
            raise ServerSettingRequired(
                f"{where} changes a JSON document the before image does not hold, so its new value cannot be "
                "rebuilt: set binlog_row_image=FULL on the server (or binlog_row_value_options='' to log whole "
                "documents)"
            )
        if doc is None:
            raise BinlogDecodeError(f"{where}: a partial update of a NULL document, which MySQL never writes")
        try:
            return _json_diff.apply_diffs(doc, diffs.diffs)
        except _json_diff.JsonDiffError as exc:
            raise BinlogDecodeError(f"{where}: {exc}") from None
