"""The verifier's default reader on rows as MySQL 8.4 / 9.x writes them (byte fixtures,
tests/unit/mysql_row_bytes.py): what the verifier's connection hands
python-mysql-replication (`binlog_compressed.prepare_event` with the Table_map
preparation of `spark_jobs/mysql/binlog_table_map.py`), decoded by the library's own event
classes, then the reader's `row_values` (JSON as MySQL's text, SET as its names).

MySQL 9's Format_description (post-header length 0 for the removed v1 rows events);
ENUM / SET / names without binlog_row_metadata=FULL (from information_schema); JSON
columns as MySQL prints them; VECTOR as the bytes MySQL holds; a YEAR column before
an unsigned one; a Table_map information_schema does not match (undecidable, named)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.mysql.binlog_assembly import TxAssembler
from spark_jobs.mysql.binlog_compressed import _Format, prepare_event
from spark_jobs.mysql.binlog_readers import row_values
from spark_jobs.mysql.binlog_table_map import ColumnInfo, TableMapRewriter, stream_reader_class
from spark_jobs.mysql.json_text import Double, Opaque, to_binary
from tests.unit import mysql_row_bytes as mb
from tests.unit.binlog_bytes import Binlog, lenenc

# id VARCHAR(64), payload JSON, kind ENUM('created','shipped'), tags SET('a','b','c'),
# y YEAR, n INT UNSIGNED, vec VECTOR(2)
COLUMNS = [(15, struct.pack("<H", 256)), (245, b"\x04"), (254, bytes([247, 1])), (254, bytes([248, 1])),
           (13, b""), (3, b""), (242, b"\x04")]  # fmt: skip
INFO = [
    ColumnInfo("id", "varchar", "varchar(64)", 255),
    ColumnInfo("payload", "json", "json", None),
    ColumnInfo("kind", "enum", "enum('created','shipped')", 255),
    ColumnInfo("tags", "set", "set('a','b','c')", 255),
    ColumnInfo("y", "year", "year", None),
    ColumnInfo("n", "int", "int unsigned", None),
    ColumnInfo("vec", "vector", "vector(2)", 63),
]
NAMES = [c.name for c in INFO]
# What MySQL writes under binlog_row_metadata=MINIMAL: signedness (n: unsigned; YEAR has
# no bit), default charset 255 with the VECTOR (the 2nd character column) binary,
# ENUM/SET default charset, and (MySQL 9) the VECTOR's dimensions.
MINIMAL = (
    mb.tlv(1, b"\x80")
    + mb.tlv(2, lenenc(255) + lenenc(1) + lenenc(63))
    + mb.tlv(10, lenenc(255))
    + mb.tlv(13, lenenc(2))
)
FULL = (
    MINIMAL
    + mb.tlv(4, mb.strings(NAMES))
    + mb.tlv(5, lenenc(3) + mb.strings(["a", "b", "c"]))
    + mb.tlv(6, lenenc(2) + mb.strings(["created", "shipped"]))
)
TIME_87H = struct.pack("<q", (((87 << 12) | (31 << 6) | 46) << 24) + 654321)  # 87:31:46.654321, packed
DOC = {
    "amount": Opaque(246, bytes([10, 3]) + bytes.fromhex("8000007b01c8")),  # DECIMAL(10,3) 123.456
    "n": 1,
    "f": Double(2.0),
    "t": Opaque(11, TIME_87H),  # the library's JSON parser raised ValueError on it
}
DOC_TEXT = '{"amount": 123.456, "n": 1, "f": 2.0, "t": "87:31:46.654321"}'
VECTOR = struct.pack("<2f", 1.5, -2.0)


def image(doc: bytes = to_binary(DOC), kind: int = 2, tags: int = 0b101) -> bytes:
    return (
        b"\x00"
        + struct.pack("<H", 3)
        + b"e-1"
        + struct.pack("<I", len(doc))
        + doc
        + bytes([kind, tags, 2024 - 1900])
        + struct.pack("<I", 4294967295)
        + struct.pack("<I", len(VECTOR))
        + VECTOR
    )


def binlog(optional: bytes, rows: list[bytes], version: str = "9.0.1") -> list[bytes]:
    log = Binlog()
    log.add(15, mb.fde_body(version, 0 if version.startswith("9") else 8))
    log.add(19, mb.table_map_body(COLUMNS, optional))
    log.add(30, mb.write_rows_body(len(COLUMNS), rows))
    return log.events


class Lookup:
    def __init__(self, columns: list[ColumnInfo]):
        self.columns = columns
        self.calls: list[tuple[str, str]] = []

    def __call__(self, schema: str, table: str) -> list[ColumnInfo]:
        self.calls.append((schema, table))
        return self.columns


def library_events(events: list[bytes], rewriter: TableMapRewriter, dbms: str = "mysql") -> list[tuple[int, object]]:
    """(type, library event) for each event as the verifier's connection hands it to the
    library (`prepare_event`), decoded by the library's own classes with the optional
    metadata read (as `stream_reader_class` makes it)."""
    from pymysql.protocol import MysqlPacket
    from pymysqlreplication.event import FormatDescriptionEvent
    from pymysqlreplication.packet import BinLogPacketWrapper
    from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    allowed = frozenset([FormatDescriptionEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent])
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: dbms)
    fmt, table_map, post_headers, out = _Format(), {}, None, []
    for raw in events:
        for ev, _start in prepare_event(raw, fmt, rewriter) or [(raw, 0)]:
            wrapper = BinLogPacketWrapper(
                MysqlPacket(b"\x00" + ev, "utf8"), table_map, ctl, (9, 0, 1), True, allowed,
                None, None, None, None, True, False, True, True, False, False, post_headers,
            )  # fmt: skip
            event = wrapper.event
            if isinstance(event, FormatDescriptionEvent):
                post_headers = event.post_header_len
            elif isinstance(event, TableMapEvent):
                table_map[event.table_id] = event.get_table()
            out.append((ev[4], event))
    return out


def read(events: list[bytes], lookup: Lookup | None = None) -> tuple[list, TxAssembler]:
    """The rows of the Write_rows events through the reader's `row_values`."""
    from pymysqlreplication.row_event import WriteRowsEvent

    rewriter = TableMapRewriter({(mb.SCHEMA, mb.TABLE)}, lookup or Lookup(INFO))
    asm = TxAssembler(open=True)
    rows: list = []
    for _kind, event in library_events(events, rewriter):
        if isinstance(event, WriteRowsEvent):
            rows += list(row_values(event, rewriter.shapes.get(event.table_id), asm, 4) or [])
    return rows, asm


EXPECTED = {"id": "e-1", "payload": DOC_TEXT, "kind": "shipped", "tags": "a,c", "y": 2024, "n": 4294967295,
            "vec": VECTOR}  # fmt: skip


def test_mysql_9_full_metadata_rows_read_as_mysql_means_them():
    """MySQL 9's Format_description (v1 rows post-headers 0), a Table_map with a VECTOR
    and its VECTOR_DIMENSIONALITY field (unknown to the library: it raised), JSON with a
    DECIMAL (the library made it a string), a YEAR before an unsigned INT (the library
    shifted the signedness bits: n read as -1)."""
    rows, asm = read(binlog(FULL, [image()]))
    assert rows == [EXPECTED] and not asm.anomalies


def test_mysql_8_4_layout_reads_alike():
    rows, _ = read(binlog(FULL, [image()], version="8.4.3"))
    assert rows == [EXPECTED]


def test_minimal_metadata_takes_names_and_enum_set_values_from_information_schema():
    """binlog_row_metadata=MINIMAL (MySQL's default): before, the library named the
    columns UNKNOWN_COL<i> and gave None for the non-NULL ENUM and SET."""
    lookup = Lookup(INFO)
    rows, asm = read(binlog(MINIMAL, [image(), image(kind=1, tags=0)]), lookup)
    assert rows == [EXPECTED, {**EXPECTED, "kind": "created", "tags": ""}]
    assert lookup.calls == [(mb.SCHEMA, mb.TABLE)] and not asm.anomalies


def test_no_optional_metadata_at_all_gets_every_field_from_information_schema():
    """MariaDB's default (NO_LOG) or MySQL 5.7: no TLV; signedness and charsets too."""
    rows, _ = read(binlog(b"", [image()]))
    assert rows == [EXPECTED]


def test_enum_index_0_is_the_empty_value_not_null():
    rows, _ = read(binlog(MINIMAL, [image(kind=0)]))
    assert rows[0]["kind"] == ""


@pytest.mark.parametrize(
    "columns, why",
    [
        (INFO[:-1], "6 column(s) there, 7 in the Table_map"),
        ([*INFO[:2], ColumnInfo("kind", "varchar", "varchar(10)", 255), *INFO[3:]], "column 3 `kind` is varchar(10)"),
    ],
)
def test_a_table_information_schema_does_not_match_is_undecidable_with_its_cause(columns, why):
    rows, asm = read(binlog(MINIMAL, [image()]), Lookup(columns))
    assert rows == []
    (text,) = asm.anomalies
    assert "undecidable" in text and why in text and "binlog_row_metadata" in text and "shop.outbox" in text


def test_the_verifier_stream_always_reads_optional_metadata():
    """The library reads a Table_map's optional metadata only when the server says FULL."""
    reader = stream_reader_class()(connection_settings={"host": "127.0.0.1"}, server_id=5)
    reader._BinLogStreamReader__check_optional_meta_data()
    assert reader._BinLogStreamReader__optional_meta_data is True


# -- PARTIAL_UPDATE_ROWS_EVENT (binlog_row_value_options=PARTIAL_JSON) -------------------

# id VARCHAR(64), payload JSON, n INT; names in the Table_map (FULL)
SMALL = [(15, struct.pack("<H", 256)), (245, b"\x04"), (3, b"")]
SMALL_FULL = mb.tlv(1, b"\x00") + mb.tlv(2, lenenc(255)) + mb.tlv(4, mb.strings(["id", "payload", "n"]))


def small_image(doc: bytes | None, n: int = 5, options: bytes = b"") -> bytes:
    nulls = 0 if doc is not None else 2
    out = options + bytes([nulls]) + struct.pack("<H", 3) + b"e-1"
    if doc is not None:
        out += struct.pack("<I", len(doc)) + doc
    return out + struct.pack("<i", n)


def partial_log(before_doc: bytes | None, diffs: bytes) -> list[bytes]:
    after = small_image(b"", n=6, options=b"\x01\x01")[: -4 - 4] + struct.pack("<I", len(diffs)) + diffs
    after += struct.pack("<i", 6)
    before = small_image(before_doc)
    log = Binlog()
    log.add(15, mb.fde_body("8.4.3", 8))
    log.add(19, mb.table_map_body(SMALL, SMALL_FULL))
    log.add(39, mb.update_rows_body(3, [(before, after)], kind_39=True))
    return log.events


def updates(events: list[bytes]) -> tuple[list[int], list]:
    """(event types the library gets, the rows of its UpdateRowsEvents)."""
    from pymysqlreplication.row_event import UpdateRowsEvent

    got = library_events(events, TableMapRewriter({(mb.SCHEMA, mb.TABLE)}, Lookup([])))
    return [kind for kind, _ in got], [r for _, e in got if type(e) is UpdateRowsEvent for r in e.rows]


def test_partial_json_update_becomes_the_update_of_the_whole_document():
    """Type 39: before, the library read the first diff only and applied none. Now the
    verifier's connection hands it the Update_rows event (31) it stands for, the after
    document made as MySQL applies the diffs: REPLACE, INSERT into an array, INSERT of a
    member (into MySQL's key order: length, then bytes), REMOVE, a quoted member name."""
    before = to_binary({"a": 1, "b": [1, 2]})
    diffs = b"".join(
        [
            mb.json_diff(0, "$.a", to_binary(2)),
            mb.json_diff(1, "$.b[1]", to_binary("x")),
            mb.json_diff(1, '$."k y"', to_binary(None)),
            mb.json_diff(1, "$.aa", to_binary(True)),
            mb.json_diff(1, "$.c", to_binary({"d": DOC["amount"]})),
            mb.json_diff(2, "$.b[0]"),
            mb.json_diff(1, "$.b[last]", to_binary(Double(0.5))),
        ]
    )
    kinds, rows = updates(partial_log(before, diffs))
    assert kinds == [15, 19, 31]
    (row,) = rows
    assert row["before_values"]["n"] == 5 and row["after_values"]["n"] == 6
    from spark_jobs.mysql.json_text import to_text

    assert to_text(row["before_values"]["payload"]) == '{"a": 1, "b": [1, 2]}'
    assert to_text(row["after_values"]["payload"]) == (
        '{"a": 2, "b": ["x", 0.5, 2], "c": {"d": 123.456}, "aa": true, "k y": null}'
    )


def test_a_partial_update_without_its_document_in_the_before_image_stays_unread():
    """binlog_row_image=MINIMAL: no document to apply the diffs to; the event stays a
    type 39, which the verifier does not read (as it does not read Update_rows)."""
    kinds, rows = updates(partial_log(None, mb.json_diff(0, "$.a", to_binary(2))))
    assert kinds == [15, 19, 39] and rows == []


@pytest.mark.parametrize(
    "diff",
    [mb.json_diff(0, "$.zz", to_binary(1)), mb.json_diff(1, "$.a", to_binary(1)), mb.json_diff(2, "$.b[5]")],
    ids=["replace-missing", "insert-existing", "remove-out-of-range"],
)
def test_a_diff_mysql_would_reject_leaves_the_event_unread(diff):
    kinds, _ = updates(partial_log(to_binary({"a": 1, "b": [1, 2]}), diff))
    assert kinds[-1] == 39


def _mysql_sorted(value):
    """Objects in MySQL's stored key order (length, then bytes), as MySQL writes them."""
    if isinstance(value, dict):
        keys = sorted(
            value, key=lambda k: (len(k.encode("utf-8", "surrogateescape")), k.encode("utf-8", "surrogateescape"))
        )
        return {k: _mysql_sorted(value[k]) for k in keys}
    if isinstance(value, list):
        return [_mysql_sorted(v) for v in value]
    return value


def _containers(value, path=()):
    if isinstance(value, (dict, list)):
        yield list(path)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for leg, item in items:
            yield from _containers(item, (*path, leg))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _json_values, max_size=4).map(_mysql_sorted), _json_values, st.data())
def test_insert_then_remove_gives_the_document_back(doc, value, data):
    """json_diff.cc semantics, fuzzed: an INSERT puts the value at its path (an array
    cell shifts the rest; a member takes its place in key order), a REMOVE of the same
    path gives back the very document, text included."""
    from spark_jobs.mysql.binlog_partial_json import apply_diffs
    from spark_jobs.mysql.json_text import parse, render

    original = render(doc)
    parent_path = data.draw(st.sampled_from(list(_containers(doc))))
    parent = parse(to_binary(doc))  # a copy
    for leg in parent_path:
        parent = parent[leg]
    if isinstance(parent, dict):
        leg = data.draw(st.text(max_size=5).filter(lambda k: k not in parent))
    else:
        leg = data.draw(st.integers(0, len(parent)))
    legs = [*parent_path, leg]
    apply_diffs(doc, [(1, legs, value)])
    at = doc
    for step in legs:
        at = at[step]
    assert at == value
    apply_diffs(doc, [(2, legs, None)])
    assert render(doc) == original


def test_mariadb_without_metadata_counts_geometry_among_character_columns():
    """MariaDB (binlog_row_metadata NO_LOG, its default): no TLV at all. MariaDB and the
    library (for a MariaDB server) give GEOMETRY a charset entry; the injected
    COLUMN_CHARSET does too, or the VARCHAR after it would have none (IndexError)."""
    from pymysqlreplication.row_event import WriteRowsEvent

    columns = [(15, struct.pack("<H", 256)), (255, b"\x04"), (15, struct.pack("<H", 40))]
    info = [ColumnInfo("id", "varchar", "varchar(64)", 45), ColumnInfo("shape", "point", "point", None),
            ColumnInfo("note", "varchar", "varchar(10)", 45)]  # fmt: skip
    point = b"\x00" * 4 + b"\x01\x01\x00\x00\x00" + struct.pack("<2d", 1.0, 2.0)
    row = b"\x00" + struct.pack("<H", 3) + b"e-1" + struct.pack("<I", len(point)) + point + b"\x02hi"
    log = Binlog()
    log.add(15, mb.fde_body("10.11.6-MariaDB-log", 8))
    log.add(19, mb.table_map_body(columns, b""))
    log.add(30, mb.write_rows_body(3, [row]))
    rewriter = TableMapRewriter({(mb.SCHEMA, mb.TABLE)}, Lookup(info))
    (event,) = [e for _, e in library_events(log.events, rewriter, dbms="mariadb") if isinstance(e, WriteRowsEvent)]
    assert event.rows[0]["values"] == {"id": "e-1", "shape": point, "note": "hi"}


def test_a_table_map_seen_again_reads_alike_with_one_lookup():
    """A Table_map precedes every transaction's rows: the same table id and bytes again
    (its rewrite is reused) gives the same rows, and information_schema is asked once."""
    lookup = Lookup(INFO)
    log = binlog(MINIMAL, [image()])
    log_again = [*log, log[1], log[2]]
    rows, _ = read(log_again, lookup)
    assert rows == [EXPECTED, EXPECTED] and lookup.calls == [(mb.SCHEMA, mb.TABLE)]
