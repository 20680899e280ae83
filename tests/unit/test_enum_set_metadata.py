"""ENUM and SET columns without binlog_row_metadata=FULL (MySQL's default is MINIMAL): the
row holds an ENUM's index and a SET's bitmask (MySQL Field_enum / Field_set pack_length
bytes, little-endian) and the Table_map names neither the columns nor the values. The
decoder asks a `TableColumns` port (connectors/mysql/table_columns.py) for a watched table; with
no port, an ENUM is its index and a SET its bitmask, never NULL. Also the VECTOR type of
MySQL 9 (242).

Table_map layouts (MySQL libs/mysql/binlog/event/rows_event.h, Table_map_event): an ENUM or
SET column is written with type STRING (254) and two metadata bytes, its real type (247 /
248) and its pack length; a VECTOR (242) has one metadata byte, the size of its length,
as a BLOB has. binlog_row_metadata=MINIMAL writes SIGNEDNESS (1) and DEFAULT_CHARSET (2);
FULL adds COLUMN_NAME (4), SET_STR_VALUE (5), ENUM_STR_VALUE (6)."""

from __future__ import annotations

import struct

import pytest

from cdc.source_events import RowInsert
from connectors.mysql.binlog_column_types import TYPE_NAMES
from connectors.mysql.binlog_decoder import BinlogDecoder, ServerSettingRequired
from connectors.mysql.table_columns import ColumnDefinition, parse_column_type
from tests.unit import binlog_bytes as bb

TABLE = "tagged"


def _table_map(table_id: int = 60, full: bool = False, extra_int: bool = False) -> bytes:
    """id VARCHAR(64) NOT NULL, e ENUM('a','b','c d') NULL, s SET('x','y','z') NULL
    [, n INT UNSIGNED NULL]."""
    types = bytes([15, 254, 254] + ([3] if extra_int else []))
    meta = struct.pack("<H", 256) + bytes([247, 1]) + bytes([248, 1])
    charsets = bb.lenenc(255)
    optional = b""
    if extra_int:
        optional += b"\x01\x01\x80"  # SIGNEDNESS: the one numeric column is unsigned
    optional += b"\x02" + bb.lenenc(len(charsets)) + charsets
    if full:
        names = b"".join(bb.lenenc(len(c)) + c.encode() for c in ("id", "e", "s"))
        # per column: the number of values, then each value (lenenc length + bytes)
        sets = bb.lenenc(3) + b"".join(bb.lenenc(1) + v.encode() for v in "xyz")
        enums = bb.lenenc(3) + b"".join(bb.lenenc(len(v)) + v.encode() for v in ("a", "b", "c d"))
        optional += b"\x04" + bb.lenenc(len(names)) + names
        optional += b"\x05" + bb.lenenc(len(sets)) + sets + b"\x06" + bb.lenenc(len(enums)) + enums
    ncols = len(types)
    return (
        struct.pack("<Q", table_id)[:6]
        + b"\x01\x00"
        + bytes([len(bb.SCHEMA)])
        + bb.SCHEMA.encode()
        + b"\x00"
        + bytes([len(TABLE)])
        + TABLE.encode()
        + b"\x00"
        + bb.lenenc(ncols)
        + types
        + bb.lenenc(len(meta))
        + meta
        + bytes([0b110])
        + optional
    )


def _rows(rows: list[tuple[str, int, int]], table_id: int = 60) -> bytes:
    out = struct.pack("<Q", table_id)[:6] + b"\x01\x00" + b"\x02\x00" + bb.lenenc(3) + b"\x07"
    for event_id, e, s in rows:
        out += b"\x00" + struct.pack("<H", len(event_id)) + event_id.encode() + bytes([e, s])
    return out


DEFS = [
    ColumnDefinition("id", "varchar", charset="utf8mb4"),
    ColumnDefinition("e", "enum", charset="utf8mb4", values=("a", "b", "c d")),
    ColumnDefinition("s", "set", charset="utf8mb4", values=("x", "y", "z")),
]


def _decode(events: list[tuple[int, bytes]], table_columns=None) -> list[dict]:
    log = bb.Binlog()
    log.add(15, bb.fde_body("8.4.3", bb.MYSQL_82_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    for kind, body in events:
        log.add(kind, body)
    dec = BinlogDecoder({(bb.SCHEMA, TABLE)}, "binlog.000001", table_columns=table_columns)
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    return [e.values for e in out if isinstance(e, RowInsert)]


ROWS = [("e-1", 2, 0b101), ("e-2", 0, 0), ("e-3", 3, 0b010)]


def test_without_names_an_enum_is_its_index_and_a_set_its_bitmask():
    """Before: a non-NULL ENUM or SET became NULL."""
    values = _decode([(19, _table_map()), (30, _rows(ROWS))])
    assert values == [
        {"UNKNOWN_COL0": "e-1", "UNKNOWN_COL1": 2, "UNKNOWN_COL2": 5},
        {"UNKNOWN_COL0": "e-2", "UNKNOWN_COL1": 0, "UNKNOWN_COL2": 0},
        {"UNKNOWN_COL0": "e-3", "UNKNOWN_COL1": 3, "UNKNOWN_COL2": 2},
    ]


def test_names_and_values_come_from_the_table_columns_port():
    calls = []

    def lookup(schema, table):
        calls.append((schema, table))
        return DEFS

    values = _decode([(19, _table_map()), (30, _rows(ROWS))], lookup)
    assert calls == [(bb.SCHEMA, TABLE)]
    assert values == [
        {"id": "e-1", "e": "b", "s": "x,z"},
        {"id": "e-2", "e": "", "s": ""},  # index 0: the empty (error) value; the empty SET is '', never None
        {"id": "e-3", "e": "c d", "s": "y"},
    ]
    full = _decode([(19, _table_map(full=True)), (30, _rows(ROWS))])
    assert values == full


def test_the_port_is_asked_once_per_table_id_and_not_when_the_table_map_has_the_metadata():
    calls = []

    def lookup(schema, table):
        calls.append(table)
        return DEFS

    _decode(
        [(19, _table_map()), (30, _rows(ROWS)), (19, _table_map()), (30, _rows(ROWS))]
        + [(19, _table_map(table_id=61)), (30, _rows(ROWS, table_id=61))],
        lookup,
    )
    assert calls == [TABLE, TABLE]  # table id 60, then 61 (a new id may be an ALTER that kept the bytes)
    calls.clear()
    _decode([(19, _table_map(full=True)), (30, _rows(ROWS))], lookup)
    assert calls == []


@pytest.mark.parametrize(
    "defs, why",
    [
        (DEFS[:2], r"shop\.tagged has 2 columns in information_schema.COLUMNS but 3 in the binlog's Table_map"),
        (DEFS + [ColumnDefinition("n", "int")], "has 4 columns"),
        ([DEFS[0], ColumnDefinition("e", "varchar"), DEFS[2]], r"column 'e' of shop\.tagged is varchar"),
    ],
)
def test_columns_that_no_longer_match_the_table_map_stop_naming_full_row_metadata(defs, why):
    with pytest.raises(ServerSettingRequired, match=why + ".*binlog_row_metadata=FULL"):
        _decode([(19, _table_map()), (30, _rows(ROWS))], lambda s, t: defs)


def test_signedness_in_the_table_map_is_kept_and_the_port_fills_names():
    defs = DEFS + [ColumnDefinition("n", "int", unsigned=False)]
    body = struct.pack("<Q", 60)[:6] + b"\x01\x00" + b"\x02\x00" + bb.lenenc(4) + b"\x0f"
    body += b"\x00" + struct.pack("<H", 3) + b"e-1" + bytes([1, 1]) + struct.pack("<I", 4_000_000_000)
    values = _decode([(19, _table_map(extra_int=True)), (30, body)], lambda s, t: defs)
    assert values == [{"id": "e-1", "e": "a", "s": "x", "n": 4_000_000_000}]


@pytest.mark.parametrize(
    "column_type, values, unsigned",
    [
        ("enum('a','b','c d')", ("a", "b", "c d"), False),
        ("enum('it''s','back\\\\slash','comma,inside','')", ("it's", "back\\slash", "comma,inside", ""), False),
        ("set('x','y')", ("x", "y"), False),
        ("int(10) unsigned", None, True),
        ("bigint unsigned zerofill", None, True),
        ("varchar(64)", None, False),
    ],
)
def test_column_types_read_as_mysql_writes_them(column_type, values, unsigned):
    assert parse_column_type(column_type) == (values, unsigned)


# -- VECTOR ---------------------------------------------------------------------------------------


def _vector_table_map() -> bytes:
    """id VARCHAR(64) NOT NULL, v VECTOR(3) NULL (binlog_row_metadata=FULL)."""
    names = b"".join(bb.lenenc(len(c)) + c.encode() for c in ("id", "v"))
    meta = struct.pack("<H", 256) + b"\x04"
    optional = b"\x04" + bb.lenenc(len(names)) + names
    return (
        struct.pack("<Q", 70)[:6]
        + b"\x01\x00"
        + bytes([len(bb.SCHEMA)])
        + bb.SCHEMA.encode()
        + b"\x00"
        + b"\x03vec\x00"
        + bb.lenenc(2)
        + bytes([15, 242])
        + bb.lenenc(len(meta))
        + meta
        + b"\x02"
        + optional
    )


def test_a_vector_is_published_as_the_bytes_mysql_holds():
    """Before: refused as 'type 242 (unknown)' (the name table had VECTOR at 243)."""
    floats = struct.pack("<3f", 1.5, -2.0, 0.25)
    body = struct.pack("<Q", 70)[:6] + b"\x01\x00" + b"\x02\x00" + bb.lenenc(2) + b"\x03"
    body += b"\x00" + struct.pack("<H", 3) + b"e-1" + struct.pack("<I", len(floats)) + floats
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.0.1", bb.MYSQL_90_POST_HEADER))
    log.add(19, _vector_table_map())
    log.add(30, body)
    dec = BinlogDecoder({(bb.SCHEMA, "vec")}, "binlog.000001")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    assert [e.values for e in out if isinstance(e, RowInsert)] == [{"id": "e-1", "v": floats}]
    assert struct.unpack("<3f", out[-1].values["v"]) == (1.5, -2.0, 0.25)
    assert TYPE_NAMES[242] == "VECTOR"
