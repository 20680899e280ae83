"""The verifier's own preparation of Table_map events for python-mysql-replication.

python-mysql-replication 1.0.17 misreads what MySQL writes for some tables; so, before the
library parses a Table_map of a watched table, the verifier's replication connection
(`spark_jobs/binlog_compressed.ExpandingConnection`) hands it here, and the library gets
a Table_map it reads right. Nothing here comes from the relay's decoder.

* Column names and ENUM / SET values without `binlog_row_metadata=FULL` (MySQL's default
  is MINIMAL, MariaDB's NO_LOG): the Table_map then has no COLUMN_NAME field and the
  library yields `UNKNOWN_COL<i>` names and None for every ENUM / SET. The project's rule
  (the relay's too): the names and values come from `information_schema.COLUMNS` (by
  ORDINAL_POSITION: COLUMN_NAME, DATA_TYPE, COLUMN_TYPE `enum('a','b')`, unsigned,
  the collation's id), looked up once per table by the verifier's own query. They are
  written into the Table_map as the optional-metadata fields MySQL writes under FULL
  (`sql/log_event.cc` Table_map_log_event::init_*_field; TLV: type 1 byte, lenenc length,
  value): SIGNEDNESS (1), COLUMN_CHARSET (3), COLUMN_NAME (4), SET_STR_VALUE (5),
  ENUM_STR_VALUE (6), ENUM_AND_SET_COLUMN_CHARSET (11) - each only when the event lacks
  it. When the looked-up columns do not match the Table_map (count, or a column's type),
  the table id is `undecidable` with the cause, and the reader reports its rows instead
  of guessing.
* JSON (245): the library's own JSON parser turns decimals into strings and fails on
  a TIME over 24 hours. The column's type byte becomes GEOMETRY (255): same metadata
  (1 byte, the length's size) and value layout (length, bytes), which the library hands
  over as raw bytes and, on MySQL, counts in no charset list (MySQL's is_character_type
  does not either); the reader renders them with `spark_jobs/mysql/json_text.py`.
* VECTOR (242, MySQL 9): unknown to the library (it reads no metadata byte for it, so
  every later column's metadata shifts, then fails on the value). It becomes BLOB (252):
  same 1-byte metadata and value layout, and like VECTOR in MySQL 9 a character column
  (its charset entry, binary, stays aligned); the value is the bytes MySQL holds.
* Optional-metadata fields the library does not know (type > 12, e.g. MySQL 9's
  VECTOR_DIMENSIONALITY) make it raise; they are dropped.
* DATE, DATETIME, TIMESTAMP (old and fsp layouts) and YEAR: the library reads a zero or
  partly-zero date as None, a TIMESTAMP of 0 seconds as 1970-01-01 and YEAR 0000 as 1900.
  Each becomes the library's integer type of its size when there is one (1, 2, 3, 4 or 8
  bytes: TINY, SHORT, INT24, LONG, LONGLONG, no metadata; a 0 SIGNEDNESS bit), else
  BIT(8 * its size) (metadata: 0 bits, the size in bytes), which the library hands over as
  a string of bits, one Python step per bit (it was a tenth of the verifier's binlog
  reading for one DATETIME(6) column); the reader reads the bytes itself
  (`spark_jobs/mysql/temporal_values.py`): MySQL's text where Python has no value. A
  column the proof reads no value of (not among the outbox table's expected columns) gets
  no reader: its value stays the library's integer or bits.
* SIGNEDNESS has one bit per numeric column, and MySQL's numeric types do not include
  YEAR (log_event.cc is_numeric_type); the library counts YEAR, so a YEAR column would
  shift the bits of every later column. A 0 bit is put in for each YEAR column.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.mysql import temporal_values
from spark_jobs.mysql.binlog_compressed import lenenc_int, rebuilt_event
from spark_jobs.mysql.binlog_partial_json import (
    PARTIAL_UPDATE_ROWS,
    UPDATE_ROWS_V2,
    PartialJsonError,
    full_update_body,
)

__all__ = ["ColumnInfo", "TableMapRewriter", "TableShape", "lookup_columns"]

TABLE_MAP = 19
_JSON, _VECTOR, _GEOMETRY, _BLOB, _STRING, _ENUM, _SET, _YEAR = 245, 242, 255, 252, 254, 247, 248, 13
_BIT = 16
# bytes of per-column metadata in a Table_map, by column type (log_event.cc / rows_event.h)
_META_1 = frozenset({4, 5, 17, 18, 19, 242, 245, 249, 250, 251, 252, 255})
_META_2 = frozenset({15, 16, 246, 253, 254, 247, 248})
_MYSQL_NUMERIC = frozenset({1, 2, 3, 4, 5, 8, 9, 246})  # log_event.cc is_numeric_type
_LIB_NUMERIC = _MYSQL_NUMERIC | {_YEAR}  # python-mysql-replication's _is_numeric_column
_CHARACTER = frozenset({15, 252, 253, 254})  # the library's _is_character_column (MySQL's, VECTOR as BLOB)
_SIGNEDNESS, _COLUMN_CHARSET, _COLUMN_NAME, _SET_VALUES, _ENUM_VALUES = 1, 3, 4, 5, 6
_DEFAULT_CHARSET, _ENUM_SET_DEFAULT_CHARSET, _ENUM_SET_COLUMN_CHARSET = 2, 10, 11
_LIBRARY_KNOWS = frozenset(range(1, 13))
_BINARY_COLLATION = 63
# information_schema DATA_TYPE -> the column types a Table_map may give it
_BINLOG_TYPES: dict[str, frozenset[int]] = {
    "tinyint": frozenset({1}), "smallint": frozenset({2}), "mediumint": frozenset({9}), "int": frozenset({3}),
    "bigint": frozenset({8}), "decimal": frozenset({246, 0}), "float": frozenset({4}), "double": frozenset({5}),
    "bit": frozenset({16}), "date": frozenset({10, 14}), "datetime": frozenset({12, 18}),
    "timestamp": frozenset({7, 17}), "time": frozenset({11, 19}), "year": frozenset({13}),
    "char": frozenset({254, 253}), "binary": frozenset({254, 253}), "varchar": frozenset({15, 253}),
    "varbinary": frozenset({15, 253}), "json": frozenset({245, 252}), "vector": frozenset({242}),
    "enum": frozenset({_ENUM}), "set": frozenset({_SET}),
    **{t: frozenset({252}) for t in ("tinyblob", "blob", "mediumblob", "longblob", "tinytext", "text",
                                     "mediumtext", "longtext")},
    **{t: frozenset({255}) for t in ("geometry", "point", "linestring", "polygon", "multipoint",
                                     "multilinestring", "multipolygon", "geometrycollection", "geomcollection")},
}  # fmt: skip


@dataclass(frozen=True)
class ColumnInfo:
    """One column as information_schema.COLUMNS describes it."""

    name: str
    data_type: str  # DATA_TYPE, lower case: "int", "enum", ...
    column_type: str  # COLUMN_TYPE: "int unsigned", "enum('a','b')", ...
    collation_id: int | None = None  # information_schema.COLLATIONS.ID of its COLLATION_NAME

    @property
    def unsigned(self) -> bool:
        return " unsigned" in self.column_type.lower()

    def values(self) -> list[str]:
        """An ENUM's / SET's value names, in definition order (COLUMN_TYPE quotes them
        SQL-style: a quote inside is doubled)."""
        inner = self.column_type[self.column_type.index("(") + 1 : self.column_type.rindex(")")]
        return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", inner)]


def lookup_columns(cursor: object, schema: str, table: str) -> list[ColumnInfo]:
    """A table's columns by ORDINAL_POSITION from information_schema (a DB-API cursor)."""
    # Two plain queries rather than a join: each names only what it reads.
    cursor.execute(  # type: ignore[attr-defined]
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    rows = [(_text(n), _text(d).lower(), _text(t), c and _text(c)) for n, d, t, c in cursor.fetchall()]  # type: ignore[attr-defined]
    names = sorted({c for *_, c in rows if c})
    ids: dict[str, int] = {}
    if names:
        cursor.execute(  # type: ignore[attr-defined]
            "SELECT COLLATION_NAME, ID FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN (%s)"
            % ", ".join(["%s"] * len(names)),
            names,
        )
        ids = {_text(n): int(i) for n, i in cursor.fetchall()}  # type: ignore[attr-defined]
    return [ColumnInfo(n, d, t, ids.get(c) if c else None) for n, d, t, c in rows]


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


@dataclass
class TableShape:
    """What the reader needs to know of a table id after the rewrite."""

    names: list[str] | None  # column names the library will give (None: it names them itself)
    json: list[int] = field(default_factory=list)  # positions of JSON columns (raw binary JSON)
    sets: dict[int, list[str]] = field(default_factory=dict)  # SET position -> its value names
    undecidable: str | None = None  # why the rows of this table id cannot be decoded
    # temporal / YEAR position -> f(the library's bit string) -> the value (temporal_values.py)
    raw: dict[int, Callable[[str], Any]] = field(default_factory=dict)

    def read_raw(self, values: dict[str, Any]) -> None:
        """The temporal and YEAR columns of a row, from their bytes, in place (NULL stays None)."""
        assert self.names is not None
        for i, read in self.raw.items():
            name = self.names[i]
            value = values.get(name)
            if value is not None:
                values[name] = read(value)


def _lenenc(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)


def _strings(values: Sequence[str]) -> bytes:
    return b"".join(_lenenc(len(b)) + b for b in (v.encode("utf-8") for v in values))


def _bits(flags: Sequence[bool]) -> bytes:
    """A bit list as MySQL writes it: the first column in the highest bit of byte 0."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i // 8] |= 0x80 >> (i % 8)
    return bytes(out)


def _bit_list(data: bytes, n: int) -> list[bool]:
    return [bool(data[i // 8] & (0x80 >> (i % 8))) if i // 8 < len(data) else False for i in range(n)]


class TableMapRewriter:
    """Rewrites the Table_map events of watched tables (`rewrite`), remembering for each
    table id what the reader must do with its rows (`shapes`)."""

    def __init__(
        self,
        watched: set[tuple[str, str]],
        lookup: Callable[[str, str], list[ColumnInfo]],
        post_header: int = 8,
        needed: dict[tuple[str, str], frozenset[str]] | None = None,
    ):
        self.watched = watched
        # (schema, table) -> the columns whose values are read (None: all): a temporal
        # column outside them gets no reader, its bytes are skipped as the library reads them
        self.needed = needed
        self.lookup = lookup
        self.post_header = post_header
        self.mariadb = False  # MariaDB counts GEOMETRY among character columns (its is_character_type)
        self.shapes: dict[int, TableShape] = {}
        # table id -> (column types as the Table_map gives them, each column's metadata):
        # how its rows events are laid out (binlog_partial_json.py walks them)
        self.layouts: dict[int, tuple[list[int], list[bytes]]] = {}
        self._columns: dict[tuple[str, str], list[ColumnInfo]] = {}
        self._done: dict[int, tuple[bytes, bytes]] = {}  # table id -> (last body, its rewrite)

    def unwatched(self, table_id: int) -> bool:
        """Whether a Table_map of this id was read and named a table not watched."""
        done = self._done.get(table_id)
        return done is not None and table_id not in self.shapes

    def _looked_up(self, schema: str, table: str) -> list[ColumnInfo]:
        key = (schema, table)
        if key not in self._columns:
            self._columns[key] = self.lookup(schema, table)
        return self._columns[key]

    def prepare(self, ev: bytes, fmt: Any) -> bytes:
        """A Table_map (19) or PARTIAL_UPDATE_ROWS_EVENT (39) as the library must read it
        (`fmt`: binlog_compressed's Format_description reading: checksum, post-headers)."""
        body = ev[19 : len(ev) - fmt.checksum]
        if ev[4] == TABLE_MAP:
            self.post_header = fmt.post_header_len(TABLE_MAP, 8)
            self.mariadb = "mariadb" in fmt.server_version.lower()
            new = self.rewrite(body)
            return ev if new == body else rebuilt_event(ev, new, fmt.checksum)
        layout = self.layouts.get(int.from_bytes(body[:6], "little"))
        if layout is None:
            return ev  # not a watched table
        try:
            full = full_update_body(body, *layout, fmt.post_header_len(PARTIAL_UPDATE_ROWS, 10))
        except (PartialJsonError, IndexError, struct.error, ValueError):
            full = None
        if full is None:
            return ev  # left a type the verifier does not read, as it does not read Update_rows
        return rebuilt_event(ev, full, fmt.checksum, UPDATE_ROWS_V2)

    def rewrite(self, body: bytes) -> bytes:
        """A Table_map event body (after the common header, without checksum) as the
        library must read it. Bodies of tables not watched come back unchanged."""
        table_id = int.from_bytes(body[:6], "little")
        done = self._done.get(table_id)
        if done is not None and done[0] == body:
            return done[1]  # the same table again (a Table_map precedes every transaction's rows)
        new = self._rewrite(table_id, body)
        self._done[table_id] = (body, new)
        return new

    def _rewrite(self, table_id: int, body: bytes) -> bytes:
        at = self.post_header
        schema_len = body[at]
        schema = body[at + 1 : at + 1 + schema_len].decode("utf-8")
        at += 2 + schema_len
        table_len = body[at]
        table = body[at + 1 : at + 1 + table_len].decode("utf-8")
        at += 2 + table_len
        if (schema, table) not in self.watched:
            return body
        count, at = lenenc_int(body, at)
        types_at = at
        types = bytearray(body[at : at + count])
        at += count
        meta_len, at = lenenc_int(body, at)
        meta_at = at
        real, metas = self._layout(types, body[at : at + meta_len])
        self.layouts[table_id] = (list(types), metas)
        at += meta_len + (count + 7) // 8
        fields = self._fields(body[at:])
        shape = TableShape(names=None)
        self.shapes[table_id] = shape
        if _COLUMN_NAME not in fields:
            columns = self._looked_up(schema, table)
            problem = _mismatch(real, columns)
            if problem is None:
                _add_missing(fields, real, columns, self.mariadb)
            else:  # the reader reports this table id's rows; nothing is guessed
                shape.undecidable = (
                    f"the Table_map of {schema}.{table} (table id {table_id}) names no columns "
                    f"(binlog_row_metadata is not FULL) and information_schema.COLUMNS does not match it: {problem}"
                )
        if shape.undecidable is None:
            shape.names = [v.decode("utf-8") for v in _split_strings(fields[_COLUMN_NAME])]
            shape.json = [i for i, t in enumerate(real) if t == _JSON]
            set_values = _split_groups(fields.get(_SET_VALUES, b""))
            shape.sets = {i: set_values.pop(0) for i, t in enumerate(real) if t == _SET and set_values}
        retyped = False
        if shape.undecidable is None:
            needed = self.needed.get((schema, table)) if self.needed else None
            assert shape.names is not None
            for i, t in enumerate(real):
                if t in temporal_values.RAW_TYPES:
                    fsp = metas[i][0] if metas[i] else 0
                    size = temporal_values.raw_size(t, fsp)
                    as_integer = size in temporal_values.INTEGER_TYPE_OF_SIZE
                    if needed is None or shape.names[i] in needed:
                        shape.raw[i] = temporal_values.reader(t, fsp, as_integer)
                    # else the proof reads no value of it: its bytes are skipped as the type says
                    retyped = True
                    types[i] = temporal_values.INTEGER_TYPE_OF_SIZE[size] if as_integer else _BIT
                    metas[i] = b"" if as_integer else bytes([0, size])
        if _SIGNEDNESS in fields:
            # the library's numeric columns now: a 0 bit for YEAR (not numeric to MySQL) and for
            # each temporal column given as an integer or BIT
            fields[_SIGNEDNESS] = _library_signedness(fields[_SIGNEDNESS], real, types)
        for i, t in enumerate(types):
            if t == _JSON:
                types[i] = _GEOMETRY
            elif t == _VECTOR:
                types[i] = _BLOB
        tlv = b"".join(bytes([k]) + _lenenc(len(v)) + v for k, v in fields.items() if k in _LIBRARY_KNOWS)
        if not retyped:
            return body[:types_at] + bytes(types) + body[types_at + count : at] + tlv
        meta = b"".join(metas)
        nulls = body[meta_at + meta_len : at]
        return body[:types_at] + bytes(types) + _lenenc(len(meta)) + meta + nulls + tlv

    @staticmethod
    def _layout(types: bytes | bytearray, meta: bytes) -> tuple[list[int], list[bytes]]:
        """Each column's type (ENUM / SET told apart from CHAR by their metadata's first
        byte) and its metadata bytes."""
        real: list[int] = []
        metas: list[bytes] = []
        at = 0
        for t in types:
            size = 2 if t in _META_2 else (1 if t in _META_1 else 0)
            metas.append(meta[at : at + size])
            real.append(meta[at] if t == _STRING and meta[at] in (_ENUM, _SET) else t)
            at += size
        return real, metas

    @staticmethod
    def _fields(data: bytes) -> dict[int, bytes]:
        fields: dict[int, bytes] = {}
        at = 0
        while at < len(data):
            kind = data[at]
            length, at = lenenc_int(data, at + 1)
            fields[kind] = data[at : at + length]
            at += length
        return fields


def _split_strings(data: bytes) -> list[bytes]:
    out = []
    at = 0
    while at < len(data):
        n, at = lenenc_int(data, at)
        out.append(data[at : at + n])
        at += n
    return out


def _split_groups(data: bytes) -> list[list[str]]:
    """SET_STR_VALUE / ENUM_STR_VALUE: per column, a count, then that many strings."""
    out = []
    at = 0
    while at < len(data):
        n, at = lenenc_int(data, at)
        group = []
        for _ in range(n):
            size, at = lenenc_int(data, at)
            group.append(data[at : at + size].decode("utf-8", "replace"))
            at += size
        out.append(group)
    return out


def _mismatch(real: list[int], columns: list[ColumnInfo]) -> str | None:
    if len(columns) != len(real):
        return f"{len(columns)} column(s) there, {len(real)} in the Table_map (the table changed since)"
    for i, (t, col) in enumerate(zip(real, columns, strict=True)):
        allowed = _BINLOG_TYPES.get(col.data_type)
        if allowed is not None and t not in allowed:
            return f"column {i + 1} `{col.name}` is {col.column_type} there, type {t} in the Table_map"
    return None


def _add_missing(fields: dict[int, bytes], real: list[int], columns: list[ColumnInfo], mariadb: bool) -> None:
    """The optional-metadata fields binlog_row_metadata=FULL would have written, from
    information_schema, each only where the event has none of its kind."""
    fields[_COLUMN_NAME] = _strings([c.name for c in columns])
    enums = [c for t, c in zip(real, columns, strict=True) if t == _ENUM]
    sets = [c for t, c in zip(real, columns, strict=True) if t == _SET]
    if enums and _ENUM_VALUES not in fields:
        fields[_ENUM_VALUES] = b"".join(_lenenc(len(c.values())) + _strings(c.values()) for c in enums)
    if sets and _SET_VALUES not in fields:
        fields[_SET_VALUES] = b"".join(_lenenc(len(c.values())) + _strings(c.values()) for c in sets)
    if _SIGNEDNESS not in fields:
        numeric = [c.unsigned for t, c in zip(real, columns, strict=True) if t in _MYSQL_NUMERIC]
        if numeric:
            fields[_SIGNEDNESS] = _bits(numeric)
    character = _CHARACTER | {_VECTOR} | ({_GEOMETRY} if mariadb else set())
    text = [c for t, c in zip(real, columns, strict=True) if t in character]
    if text and _DEFAULT_CHARSET not in fields and _COLUMN_CHARSET not in fields:
        fields[_COLUMN_CHARSET] = b"".join(_lenenc(c.collation_id or _BINARY_COLLATION) for c in text)
    if (enums or sets) and _ENUM_SET_DEFAULT_CHARSET not in fields and _ENUM_SET_COLUMN_CHARSET not in fields:
        enum_set = [c for t, c in zip(real, columns, strict=True) if t in (_ENUM, _SET)]
        fields[_ENUM_SET_COLUMN_CHARSET] = b"".join(_lenenc(c.collation_id or _BINARY_COLLATION) for c in enum_set)


def _library_signedness(data: bytes, real: list[int], types: Sequence[int] | None = None) -> bytes:
    """MySQL's SIGNEDNESS bits (one per numeric column of `real`, YEAR not among them) as
    the library reads them: one bit per column the library counts as numeric (its
    `_is_numeric_column`) in `types` (the types it is given; default `real`), MySQL's
    bit for a MySQL numeric column and 0 for the others (YEAR; a temporal column given as
    an integer)."""
    given = real if types is None else types
    mysql_bits = iter(_bit_list(data, sum(1 for t in real if t in _MYSQL_NUMERIC)))
    return _bits(
        [
            next(mysql_bits) if r in _MYSQL_NUMERIC else False
            for r, t in zip(real, given, strict=True)
            if t in _LIB_NUMERIC
        ]
    )


def stream_reader_class() -> Any:
    """python-mysql-replication's BinLogStreamReader, made to read a Table_map's optional
    metadata always. The library reads it only when the server's binlog_row_metadata is
    FULL at connect time; otherwise it drops names, signedness and charsets, which MySQL
    writes under MINIMAL too. The Table_maps of watched tables reach the library with
    names and ENUM / SET values (`TableMapRewriter`), so reading them is right whatever the
    server's setting. (A private hook of the pinned 1.0.17, kept to this one subclass.)"""
    from pymysqlreplication import BinLogStreamReader

    class MetadataStreamReader(BinLogStreamReader):
        def _BinLogStreamReader__check_optional_meta_data(self) -> None:
            self._BinLogStreamReader__optional_meta_data = True

    return MetadataStreamReader
