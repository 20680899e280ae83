"""A table's layout as a Table_map event gives it: the column types and their
per-type metadata, nullability, and the optional metadata (binlog_row_metadata) that
names the columns, their signedness, charsets and ENUM/SET values. The event's handler
is in connectors/mysql/binlog_table_map.py."""

from __future__ import annotations

import codecs
from typing import Any

from pymysqlreplication.row_event import RowsEvent, find_charset

from connectors.mysql.binlog_column_types import (
    NUMERIC,
    T_BIT,
    T_BLOB,
    T_DATETIME2,
    T_DOUBLE,
    T_ENUM,
    T_FLOAT,
    T_GEOMETRY,
    T_JSON,
    T_NEWDECIMAL,
    T_SET,
    T_STRING,
    T_TIME2,
    T_TIMESTAMP2,
    T_VAR_STRING,
    T_VARCHAR,
    T_VECTOR,
)
from connectors.mysql.binlog_event_types import U16, lenenc


class Column:
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


class Table:
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
        self.columns: list[Column] | None = None
        self.ncols = 0
        self.names: tuple[str | None, ...] = ()  # None: the server sent no name (no row metadata)
        self.json_columns: tuple[int, ...] = ()  # indexes of the JSON columns (partial JSON updates)
        # columns-present bitmap -> generated row reader; (bitmap, partial JSON columns) ->
        # the reader of a Partial_update_rows image, whose JSON values are documents
        self.readers: dict[Any, Any] = {}
        # a Write_rows event's column count and columns-present bitmap -> its generated
        # inserter (`make_inserter`): as their bytes when the count is the Table_map's
        # (`head`: their length then), else as (count, bitmap)
        self.inserters: dict[Any, Any] = {}
        self.head = 0


def parse_column_meta(col: Column, buf: bytes, p: int) -> int:
    """Per-type metadata of the Table_map, as python-mysql-replication's Column reads it."""
    t = col.type
    m = col.meta
    if t == T_VARCHAR:
        m["max_length"] = U16(buf, p)[0]
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


def is_character(t: int, dbms: str) -> bool:
    """Whether the column has an entry in a Table_map's charset fields (DEFAULT_CHARSET,
    COLUMN_CHARSET): MySQL counts VECTOR (9.0+) among them (sql/log_event.cc
    `is_character_type`), MariaDB counts GEOMETRY."""
    return (
        t in (T_STRING, T_VAR_STRING, T_VARCHAR, T_BLOB)
        or (t == T_GEOMETRY and dbms == "mariadb")
        or (t == T_VECTOR and dbms == "mysql")
    )


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
        count, p = lenenc(buf, p)
        values = []
        for _ in range(count):
            n, p = lenenc(buf, p)
            raw = buf[p : p + n]
            p += n
            try:
                values.append(raw.decode())
            except UnicodeDecodeError:
                values.append("")
        result.append(values)
    return result, p


class RowMetadata:
    """The optional metadata of a Table_map (binlog_row_metadata); None = not in the event."""

    __slots__ = ("charsets", "encodings", "enum_values", "names", "set_values", "unsigned")

    def __init__(self) -> None:
        self.unsigned: list[bool] | None = None
        self.charsets: list[int] | None = None  # collation ids of the character columns
        self.encodings: list[str | None] | None = None  # python codecs of the character columns (from a lookup)
        self.names: list[str] | None = None
        self.enum_values: list[list[str]] | None = None
        self.set_values: list[list[str]] | None = None


def read_optional_metadata(cols: list[Column], buf: bytes, p: int, end: int) -> RowMetadata:
    """binlog_row_metadata TLV fields (MySQL libs/mysql/binlog/event/rows_event.h,
    Table_map_event::Optional_metadata_field_type): type 1 byte, length (lenenc), value."""
    meta = RowMetadata()
    n = len(cols)
    while p < end:
        kind = buf[p]
        length, p = lenenc(buf, p + 1)
        stop = p + length
        if kind == 1:  # SIGNEDNESS: one bit per numeric column, most significant first
            numeric = [i for i, c in enumerate(cols) if c.type in NUMERIC]
            meta.unsigned = unsigned = [False] * n
            for k, i in enumerate(numeric):
                unsigned[i] = bool(buf[p + k // 8] & (0x80 >> (k % 8)))
        elif kind == 2:  # DEFAULT_CHARSET: default, then (char column index, collation) pairs
            default, q = lenenc(buf, p)
            overrides = {}
            while q < stop:
                idx, q = lenenc(buf, q)
                coll, q = lenenc(buf, q)
                overrides[idx] = coll
            meta.charsets = [overrides.get(k, default) for k in range(n)]
        elif kind == 3:  # COLUMN_CHARSET
            q, meta.charsets = p, []
            while q < stop:
                coll, q = lenenc(buf, q)
                meta.charsets.append(coll)
        elif kind == 4:  # COLUMN_NAME
            q, meta.names = p, []
            while q < stop:
                ln, q = lenenc(buf, q)
                meta.names.append(buf[q : q + ln].decode())
                q += ln
        elif kind == 5:  # SET_STR_VALUE
            meta.set_values, _ = _read_strings(buf, p, stop)
        elif kind == 6:  # ENUM_STR_VALUE
            meta.enum_values, _ = _read_strings(buf, p, stop)
        # 7 geometry type, 8/9 primary key, 10/11 enum+set charsets, 12 visibility: unused
        p = stop
    return meta


def assign_metadata(cols: list[Column], meta: RowMetadata, dbms: str) -> None:
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
        if is_character(c.type, dbms):
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


def lacks_metadata(cols: list[Column], meta: RowMetadata) -> bool:
    """Column names, or the value names of an ENUM / SET column, are not in the Table_map."""
    if not meta.names:
        return True
    if meta.enum_values is None and any(c.type == T_ENUM for c in cols):
        return True
    return meta.set_values is None and any(c.type == T_SET for c in cols)


# information_schema.COLUMNS.DATA_TYPE of each binlog column type (a DATA_TYPE not listed


def charset_encoding(charset: str | None) -> str | None:
    """A CHARACTER_SET_NAME -> the python codec the library would use; None = bytes."""
    if charset is None:
        return "utf-8"
    name = RowsEvent.charset_to_encoding(charset)
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    return "utf-8" if info.name == "utf-8" else name
