"""Table_map and rows events (v2, and PARTIAL_UPDATE_ROWS_EVENT) as MySQL writes them.

Table_map body (`libs/mysql/binlog/event/rows_event.h` Table_map_event): table id (6),
flags (2), schema length (1), schema, NUL, table length (1), table, NUL, column count
(net_field_length), one type byte per column, metadata length (net_field_length), each
column's metadata (`column_values.py`), the NULL-able bitmap (bit i = column i, lowest bit
first), then the optional metadata as (type (1), length (net_field_length), value) fields
(`sql/log_event.cc` Table_map_log_event::init_metadata_fields):

  every binlog_row_metadata   1 SIGNEDNESS (a bit per numeric column, highest bit first, 1 =
                              unsigned), 2 DEFAULT_CHARSET (default collation, then (index
                              among character columns, collation) pairs) or 3 COLUMN_CHARSET
                              (a collation per character column), whichever is shorter;
                              13 VECTOR_DIMENSIONALITY (MySQL 9: dimensions per VECTOR)
  FULL only                   4 COLUMN_NAME (length-prefixed names), 10/11 the same charset
                              choice for ENUM and SET columns, 5 SET_STR_VALUE, 6 ENUM_STR_VALUE
                              (per column: member count, then length-prefixed members),
                              8 SIMPLE_PRIMARY_KEY (column indexes), 12 COLUMN_VISIBILITY
                              (a bit per column, highest first, 1 = visible; 8.0.23+)

Rows event v2 body (rows_event.h Rows_event): table id (6), flags (2, STMT_END_F on the
statement's last event), extra info length (2, = 2: none), column count
(net_field_length), columns-present bitmap (all columns: binlog_row_image=FULL), for an
update a second one for the after image; then each row: a NULL bitmap over the present
columns and the non-NULL values. PARTIAL_UPDATE_ROWS_EVENT (39) puts the shared image
between before and after image (`sql/rpl_record.h`): value_options (net_field_length, 1 =
PARTIAL_JSON_UPDATES) and, when set, partial_bits: a bit per JSON column of the table
(lowest first), 1 when that column's after value is a list of diffs
(`json_binary.encode_diffs`) instead of a document.
"""

from __future__ import annotations

import struct
from collections import Counter

from testbed.mysql_lab.column_values import COLLATIONS, T_JSON, T_VECTOR, Column, ColumnType, encode_value
from testbed.mysql_lab.events import STMT_END_F, TM_BIT_LEN_EXACT_F
from testbed.mysql_lab.json_binary import JsonDiff, encode_diffs
from testbed.mysql_lab.packed_int import net_field_length

__all__ = ["rows_events", "table_map_body"]

SIGNEDNESS, DEFAULT_CHARSET, COLUMN_CHARSET, COLUMN_NAME = 1, 2, 3, 4
SET_STR_VALUE, ENUM_STR_VALUE, SIMPLE_PRIMARY_KEY = 5, 6, 8
ENUM_AND_SET_DEFAULT_CHARSET, ENUM_AND_SET_COLUMN_CHARSET, COLUMN_VISIBILITY, VECTOR_DIMENSIONALITY = 10, 11, 12, 13


def bits_low_first(flags: list[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, on in enumerate(flags):
        if on:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def bits_high_first(flags: list[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, on in enumerate(flags):
        if on:
            out[i // 8] |= 0x80 >> (i % 8)
    return bytes(out)


def _tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + net_field_length(len(value)) + value


def _charset_field(collations: list[int], default_kind: int, column_kind: int) -> bytes:
    """log_event.cc init_charset_field: the most used collation (the lowest number among
    equals) as the default plus the exceptions, unless a collation per column is shorter by
    MySQL's estimate (index and collation taken as 1 byte each): n < 1 + 2 * exceptions."""
    if not collations:
        return b""
    counts = Counter(collations)
    default = min(counts, key=lambda c: (-counts[c], c))
    exceptions = len(collations) - counts[default]
    if len(collations) < 1 + 2 * exceptions:
        return _tlv(column_kind, b"".join(net_field_length(c) for c in collations))
    return _tlv(
        default_kind,
        net_field_length(default)
        + b"".join(net_field_length(i) + net_field_length(c) for i, c in enumerate(collations) if c != default),
    )


def _collation(ct: ColumnType) -> int:
    return COLLATIONS[ct.charset or "utf8mb4"]


def table_map_body(
    table_id: int,
    schema: str,
    table: str,
    columns: list[Column],
    full_metadata: bool,
    version: tuple,
    optional_metadata: bool = True,
) -> bytes:
    """`optional_metadata=False`: MySQL 5.7's Table_map, which ends at the NULL-able bitmap
    (8.0.1 added the optional metadata; a 5.7 Table_map_log_event::write_data_body
    writes nothing after m_null_bits)."""
    types = [c.binlog_type() for c in columns]
    head = struct.pack("<Q", table_id)[:6] + struct.pack("<H", TM_BIT_LEN_EXACT_F)
    db, tb = schema.encode("utf-8"), table.encode("utf-8")
    out = bytearray(head + bytes([len(db)]) + db + b"\x00" + bytes([len(tb)]) + tb + b"\x00")
    out += net_field_length(len(columns)) + bytes(t.code for t in types)
    meta = b"".join(t.metadata for t in types)
    out += net_field_length(len(meta)) + meta
    out += bits_low_first([c.nullable for c in columns])
    if not optional_metadata:
        return bytes(out)
    numeric = [t for t in types if t.numeric]
    if numeric:
        out += _tlv(SIGNEDNESS, bits_high_first([t.unsigned for t in numeric]))
    out += _charset_field([_collation(t) for t in types if t.character], DEFAULT_CHARSET, COLUMN_CHARSET)
    vectors = [t.length for t in types if t.code == T_VECTOR]
    if vectors:
        out += _tlv(VECTOR_DIMENSIONALITY, b"".join(net_field_length(n) for n in vectors))
    if not full_metadata:
        return bytes(out)
    out += _tlv(COLUMN_NAME, b"".join(net_field_length(len(c.name.encode())) + c.name.encode() for c in columns))
    out += _charset_field(
        [_collation(t) for t in types if t.enum_or_set], ENUM_AND_SET_DEFAULT_CHARSET, ENUM_AND_SET_COLUMN_CHARSET
    )

    def members(kind: str) -> bytes:
        value = bytearray()
        for t in types:
            if t.data_type == kind:
                value += net_field_length(len(t.members))
                for m in t.members:
                    raw = m.encode("utf-8")
                    value += net_field_length(len(raw)) + raw
        return bytes(value)

    if any(t.data_type == "set" for t in types):
        out += _tlv(SET_STR_VALUE, members("set"))
    if any(t.data_type == "enum" for t in types):
        out += _tlv(ENUM_STR_VALUE, members("enum"))
    keys = [i for i, c in enumerate(columns) if c.key == "PRI"]
    if keys:
        out += _tlv(SIMPLE_PRIMARY_KEY, b"".join(net_field_length(i) for i in keys))
    if version >= (8, 0, 23):
        out += _tlv(COLUMN_VISIBILITY, bits_high_first([c.visible for c in columns]))
    return bytes(out)


def row_image(
    columns: list[Column], types: list[ColumnType], row: dict, diffs: dict[str, list[JsonDiff]] | None = None
) -> bytes:
    """NULL bitmap over all columns, then the non-NULL values. `diffs`: JSON columns whose
    value is written as a list of diffs (partial update after image)."""
    unknown = set(row) - {c.name for c in columns} - set(diffs or {})
    if unknown:
        raise KeyError(f"no column {sorted(unknown)[0]!r} in the table")
    nulls = []
    values = bytearray()
    for c, t in zip(columns, types, strict=True):
        if diffs and c.name in diffs:
            nulls.append(False)
            values += encode_diffs(diffs[c.name])
            continue
        value = row.get(c.name)
        nulls.append(value is None)
        if value is None:
            if not c.nullable:
                raise ValueError(f"column {c.name!r} is NOT NULL")
            continue
        values += encode_value(value, t)
    return bits_low_first(nulls) + bytes(values)


def rows_events(table_id: int, columns: list[Column], rows: list, kind: int, max_size: int) -> list[bytes]:
    """The bodies of the Write (30) / Update (31) / Delete (32) / Partial_update (39) rows
    events of one statement. `rows`: dicts, or for updates (before, after, diffs-or-None)
    triples. A row goes to a new event when the current one would pass `max_size`
    (binlog_row_event_max_size: THD::binlog_prepare_pending_rows_event in sql/binlog.cc);
    STMT_END_F is set on the last event."""
    types = [c.binlog_type() for c in columns]
    json_columns = [c.name for c, t in zip(columns, types, strict=True) if t.code == T_JSON]
    chunks: list[bytearray] = [bytearray()]
    head_size = len(_rows_head(table_id, len(columns), kind, False))
    for row in rows:
        if kind in (31, 39):
            before, after, diffs = row
            data = row_image(columns, types, before)
            if kind == 39:  # the session has PARTIAL_JSON: value_options 1, a bit per JSON column
                data += net_field_length(1) + bits_low_first([bool(diffs and name in diffs) for name in json_columns])
            data += row_image(columns, types, after, diffs if kind == 39 else None)
        else:
            data = row_image(columns, types, row)
        if chunks[-1] and head_size + len(chunks[-1]) + len(data) > max_size:
            chunks.append(bytearray())
        chunks[-1] += data
    return [
        _rows_head(table_id, len(columns), kind, i == len(chunks) - 1) + bytes(chunk) for i, chunk in enumerate(chunks)
    ]


def _rows_head(table_id: int, ncols: int, kind: int, last: bool) -> bytes:
    """Post-header (table id, flags, extra info length 2), column count, the bitmap(s)."""
    present = bits_low_first([True] * ncols)
    head = struct.pack("<Q", table_id)[:6] + struct.pack("<HH", STMT_END_F if last else 0, 2)
    return head + net_field_length(ncols) + present + (present if kind in (31, 39) else b"")
