"""No value MySQL stores becomes NULL (or another value): the zero-like encodings of every
column type, as MySQL 8.4 writes them (byte fixtures, tests/unit/mysql_row_bytes.py), read by
the relay's default decoder (`connectors/mysql/binlog_decoder.py`), its library decoder
(`source.decoder = "library"`: python-mysql-replication through
`connectors/mysql/binlog_library_values.py`) and the verifier's reader
(`spark_jobs/mysql/binlog_table_map.py` + `binlog_source.row_values`). The representations
are docs/mysql.md's "Zero-like values".

Hypothesis draws every column's stored bytes (zero parts and invalid days included) and
NULLs: a cell that is not NULL is never None, the relay's decoder and the verifier's reader
give the same value, and a date Python cannot hold is MySQL's text."""

from __future__ import annotations

import datetime
import decimal
import struct
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.source_events import RowInsert
from connectors.mysql.binlog_decoder import BinlogDecoder
from connectors.mysql.binlog_library import LibraryConverter
from connectors.mysql.binlog_library_values import MysqlJsonPacket
from spark_jobs.mysql.binlog_assembly import TxAssembler
from spark_jobs.mysql.binlog_compressed import _Format, prepare_event
from spark_jobs.mysql.binlog_readers import row_values
from spark_jobs.mysql.binlog_table_map import TableMapRewriter
from spark_jobs.mysql.json_text import to_binary
from tests.unit import mysql_row_bytes as mb
from tests.unit.binlog_bytes import Binlog, lenenc

# (name, type, metadata): every column nullable
COLUMNS: list[tuple[str, int, bytes]] = [
    ("id", 15, struct.pack("<H", 256)),  # VARCHAR(64) utf8mb4
    ("dt", 10, b""),  # DATE
    ("d0", 18, b"\x00"),  # DATETIME
    ("d3", 18, b"\x03"),  # DATETIME(3)
    ("d6", 18, b"\x06"),  # DATETIME(6)
    ("od", 12, b""),  # DATETIME before MySQL 5.6.4 (a table never altered since)
    ("t0", 17, b"\x00"),  # TIMESTAMP
    ("t3", 17, b"\x03"),  # TIMESTAMP(3)
    ("ot", 7, b""),  # TIMESTAMP before 5.6.4
    ("y", 13, b""),  # YEAR
    ("s", 254, bytes([248, 1])),  # SET('a','b')
    ("e", 254, bytes([247, 1])),  # ENUM('x','y')
    ("bt", 16, bytes([0, 1])),  # BIT(8)
    ("j", 245, b"\x04"),  # JSON
    ("dec", 246, bytes([10, 2])),  # DECIMAL(10,2)
    ("f", 5, b"\x08"),  # DOUBLE
    ("tm", 19, b"\x00"),  # TIME
    ("bl", 252, b"\x02"),  # BLOB
    ("n", 3, b""),  # INT
]
NAMES = [c[0] for c in COLUMNS]
# FULL metadata: signedness (DECIMAL, DOUBLE, INT: signed), default charset utf8mb4 with the
# BLOB (the 2nd character column) binary, names, SET and ENUM values, their charset
FULL = (
    mb.tlv(1, b"\x00")
    + mb.tlv(2, lenenc(255) + lenenc(1) + lenenc(63))
    + mb.tlv(4, mb.strings(NAMES))
    + mb.tlv(5, lenenc(2) + mb.strings(["a", "b"]))
    + mb.tlv(6, lenenc(2) + mb.strings(["x", "y"]))
    + mb.tlv(10, lenenc(255))
)


def _date(y: int, mo: int, d: int) -> bytes:
    return (d | mo << 5 | y << 9).to_bytes(3, "little")


def _datetime2(y: int, mo: int, d: int, h: int, mi: int, s: int, fraction: bytes = b"") -> bytes:
    packed = (1 << 39) | ((y * 13 + mo) << 22) | (d << 17) | (h << 12) | (mi << 6) | s
    return packed.to_bytes(5, "big") + fraction


def _old_datetime(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bytes:
    return struct.pack("<Q", ((y * 100 + mo) * 100 + d) * 1000000 + (h * 100 + mi) * 100 + s)


DECIMAL_ZERO = bytes([0x80, 0, 0, 0, 0])  # DECIMAL(10,2) 0.00: 4 bytes of integer part, 1 of fraction
TIME_ZERO = bytes([0x80, 0, 0])  # TIME2 00:00:00: the sign bit set (non-negative)


def image(values: dict[str, bytes | None]) -> bytes:
    """A row image: the null bitmap, then each non-NULL column's stored bytes."""
    nulls = bytearray((len(COLUMNS) + 7) // 8)
    out = b""
    for i, (name, _, _) in enumerate(COLUMNS):
        raw = values.get(name)
        if raw is None:
            nulls[i // 8] |= 1 << (i % 8)
        else:
            out += raw
    return bytes(nulls) + out


ZERO_ROW = {
    "id": struct.pack("<H", 1) + b"z",
    "dt": _date(0, 0, 0),
    "d0": _datetime2(0, 0, 0, 0, 0, 0),
    "d3": _datetime2(0, 0, 0, 0, 0, 0, b"\x00\x00"),
    "d6": _datetime2(0, 0, 0, 0, 0, 0, b"\x00\x00\x00"),
    "od": _old_datetime(0, 0, 0, 0, 0, 0),
    "t0": struct.pack(">I", 0),
    "t3": struct.pack(">I", 0) + b"\x00\x00",
    "ot": struct.pack("<I", 0),
    "y": b"\x00",
    "s": b"\x00",
    "e": b"\x00",
    "bt": b"\x00",
    "j": struct.pack("<I", 2) + to_binary(None),  # the JSON literal null
    "dec": DECIMAL_ZERO,
    "f": struct.pack("<d", -0.0),
    "tm": TIME_ZERO,
    "bl": struct.pack("<H", 0),
    "n": struct.pack("<i", 0),
}
# as docs/mysql.md "Zero-like values" says each is published
ZERO_VALUES: dict[str, Any] = {
    "id": "z",
    "dt": "0000-00-00",
    "d0": "0000-00-00 00:00:00",
    "d3": "0000-00-00 00:00:00.000",
    "d6": "0000-00-00 00:00:00.000000",
    "od": "0000-00-00 00:00:00",
    "t0": "0000-00-00 00:00:00",
    "t3": "0000-00-00 00:00:00.000",
    "ot": "0000-00-00 00:00:00",
    "y": 0,
    "s": "",
    "e": "",
    "bt": "00000000",
    "j": "null",
    "dec": decimal.Decimal("0.00"),
    "f": -0.0,
    "tm": datetime.timedelta(0),
    "bl": "",  # an empty binary value: '' (python-mysql-replication's, mirrored; NULL stays None)
    "n": 0,
}
PARTS_ROW = {
    **ZERO_ROW,
    "id": struct.pack("<H", 1) + b"p",
    "dt": _date(2024, 0, 0),
    "d0": _datetime2(2024, 2, 31, 10, 11, 12),  # ALLOW_INVALID_DATES
    "d3": _datetime2(0, 1, 1, 0, 0, 0, (1230).to_bytes(2, "big")),  # year 0: no Python date
    "d6": _datetime2(2024, 5, 0, 23, 59, 59, (999999).to_bytes(3, "big")),
    "od": _old_datetime(2024, 0, 15, 1, 2, 3),
}
PARTS_VALUES = {
    **ZERO_VALUES,
    "id": "p",
    "dt": "2024-00-00",
    "d0": "2024-02-31 10:11:12",
    "d3": "0000-01-01 00:00:00.123",
    "d6": "2024-05-00 23:59:59.999999",
    "od": "2024-00-15 01:02:03",
}


def binlog(rows: list[bytes]) -> list[bytes]:
    log = Binlog()
    log.add(15, mb.fde_body("8.4.3", 8))
    log.add(19, mb.table_map_body([(t, m) for _, t, m in COLUMNS], FULL))
    log.add(30, mb.write_rows_body(len(COLUMNS), rows))
    return log.events


def relay_rows(events: list[bytes]) -> list[dict[str, Any]]:
    dec = BinlogDecoder({(mb.SCHEMA, mb.TABLE)}, "binlog.000001", flavor="mysql")
    out: list = []
    for ev in events:
        dec.decode(ev, out)
    return [e.values for e in out if isinstance(e, RowInsert)]


def _wrapper(cls: type, ev: bytes, table_map: dict, post_headers: Any) -> Any:
    from pymysql.protocol import MysqlPacket
    from pymysqlreplication.event import FormatDescriptionEvent
    from pymysqlreplication.row_event import TableMapEvent, WriteRowsEvent

    allowed = frozenset([FormatDescriptionEvent, TableMapEvent, WriteRowsEvent])
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")
    return cls(
        MysqlPacket(b"\x00" + ev, "utf8"), table_map, ctl, (8, 4, 3), True, allowed,
        None, None, None, None, True, False, True, True, False, False, post_headers,
    ).event  # fmt: skip


def _library_events(events: list[bytes], cls: type, rewriter: TableMapRewriter | None) -> list[Any]:
    """The library's events, as the verifier's connection (`rewriter`) or the relay's
    library stream (`cls`: the packet class `use_mysql_json_text` installs) builds them."""
    from pymysqlreplication.event import FormatDescriptionEvent
    from pymysqlreplication.row_event import TableMapEvent

    fmt, table_map, post_headers, out = _Format(), {}, None, []
    for raw in events:
        prepared = prepare_event(raw, fmt, rewriter) if rewriter is not None else None
        for ev, _ in prepared or [(raw, 0)]:
            event = _wrapper(cls, ev, table_map, post_headers)
            if isinstance(event, FormatDescriptionEvent):
                post_headers = event.post_header_len
            elif isinstance(event, TableMapEvent):
                table_map[event.table_id] = event.get_table()
            out.append(event)
    return out


def verifier_rows(events: list[bytes], needed: frozenset[str] | None = None) -> list[dict[str, Any]]:
    from pymysqlreplication.packet import BinLogPacketWrapper
    from pymysqlreplication.row_event import WriteRowsEvent

    def no_lookup(schema: str, table: str) -> list:
        raise AssertionError("FULL metadata: information_schema is not asked")

    wanted = {(mb.SCHEMA, mb.TABLE)}
    rewriter = TableMapRewriter(wanted, no_lookup, needed=None if needed is None else dict.fromkeys(wanted, needed))
    asm = TxAssembler(open=True)
    rows: list = []
    for event in _library_events(events, BinLogPacketWrapper, rewriter):
        if isinstance(event, WriteRowsEvent):
            rows += list(row_values(event, rewriter.shapes.get(event.table_id), asm, 4) or [])
    assert not asm.anomalies
    return rows


def library_decoder_rows(events: list[bytes]) -> list[dict[str, Any]]:
    conv, out = LibraryConverter({(mb.SCHEMA, mb.TABLE)}, "binlog.000001"), []
    for event in _library_events(events, MysqlJsonPacket, None):
        if event is not None:
            conv.convert(event, out)
    return [e.values for e in out if isinstance(e, RowInsert)]


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal values of equal types (-0.0 == 0.0 and 0 == False would hide a slip)."""
    assert a == b
    for k, v in a.items():
        assert type(v) is type(b[k]), (k, v, b[k])
        if isinstance(v, float):
            assert struct.pack("<d", v) == struct.pack("<d", b[k]), (k, v, b[k])


def test_zero_like_values_as_docs_say_in_the_relay_decoder_and_the_verifier():
    events = binlog([image(ZERO_ROW), image(PARTS_ROW)])
    for rows in (relay_rows(events), verifier_rows(events)):
        assert len(rows) == 2
        _same(rows[0], ZERO_VALUES)
        _same(rows[1], PARTS_VALUES)


def test_temporal_columns_the_proof_does_not_read_are_skipped_and_the_others_still_read_right():
    """Reading the binlog, the verifier converts only the columns it compares (an outbox
    table's expected columns): a DATETIME(6) it does not compare reaches it as the library's
    integer of its 8 bytes, and every later column still reads right (the library's
    SIGNEDNESS bits stay aligned although it now counts that column as numeric)."""
    needed = frozenset({"id", "d3", "t0", "y", "n"})
    for row, want in zip(verifier_rows(binlog([image(ZERO_ROW), image(PARTS_ROW)]), needed),
                         (ZERO_VALUES, PARTS_VALUES), strict=True):  # fmt: skip
        _same({k: row[k] for k in sorted(needed | {"f", "dec", "s", "e", "j", "bl"})},
              {k: want[k] for k in sorted(needed | {"f", "dec", "s", "e", "j", "bl"})})  # fmt: skip
        assert type(row["d6"]) is int and type(row["od"]) is int  # 8 bytes: LONGLONG, not converted
        assert type(row["d0"]) is str and set(row["d0"]) <= {"0", "1"}  # 5 bytes: BIT, not converted


def test_the_library_decoder_puts_back_json_the_empty_set_year_0_and_a_zero_timestamp():
    """What python-mysql-replication keeps nothing of (a zero or partly-zero DATE / DATETIME)
    stays None there, and `cdc check` names those columns (tests/integration/test_zero_values.py)."""
    (row,) = library_decoder_rows(binlog([image(ZERO_ROW)]))
    dates = {"dt", "d0", "d3", "d6", "od"}
    assert all(row[k] is None for k in dates)
    _same({k: v for k, v in row.items() if k not in dates}, {k: v for k, v in ZERO_VALUES.items() if k not in dates})


def test_the_library_decoder_prints_json_as_the_default_decoder_does():
    """Before, the library's parse: `{"a":1.50}` lost its DECIMAL (a string), keys were
    bytes, and the JSON literal null was SQL NULL."""
    from spark_jobs.mysql.json_text import Double, Opaque

    docs = [
        # keys in MySQL's order (to_binary writes them as given); "a" a DECIMAL(4,2) 1.80
        {"a": Opaque(246, bytes([4, 2]) + bytes.fromhex("8150")), "b": [1, Double(2.5), "é", None, True]},
        [],
        {},
        "",
        0,
        False,
    ]
    rows = [{**ZERO_ROW, "j": struct.pack("<I", len(b)) + b} for b in map(to_binary, docs)]
    events = binlog([image(r) for r in rows])
    fast = [r["j"] for r in relay_rows(events)]
    assert [r["j"] for r in library_decoder_rows(events)] == fast == [r["j"] for r in verifier_rows(events)]
    assert fast[0] == '{"a": 1.80, "b": [1, 2.5, "é", null, true]}' and fast[1:] == ["[]", "{}", '""', "0", "false"]


# -- property: any stored bytes, no non-NULL cell None -----------------------------------

_DATE_PARTS = st.tuples(st.integers(0, 9999), st.integers(0, 12), st.integers(0, 31))
_TIME_PARTS = st.tuples(st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))


def _expected_date(y: int, mo: int, d: int) -> Any:
    try:
        return datetime.date(y, mo, d)
    except ValueError:
        return f"{y:04d}-{mo:02d}-{d:02d}"


def _expected_datetime(parts: tuple[int, ...], us: int, fsp: int) -> Any:
    try:
        return datetime.datetime(*parts, us)
    except ValueError:
        y, mo, d, h, mi, s = parts
        text = f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}"
        return text + ("." + f"{us:06d}"[:fsp] if fsp else "")


@st.composite
def rows(draw: Any) -> tuple[dict[str, bytes | None], dict[str, Any]]:
    """A row's stored bytes and what each column must read as (None only for NULL)."""
    raw: dict[str, bytes | None] = dict(ZERO_ROW)
    want: dict[str, Any] = dict(ZERO_VALUES)
    date = draw(_DATE_PARTS)
    raw["dt"], want["dt"] = _date(*date), _expected_date(*date)
    for name, fsp in (("d0", 0), ("d3", 3), ("d6", 6)):
        parts = draw(_DATE_PARTS) + draw(_TIME_PARTS)
        us = draw(st.integers(0, 999999)) // 10 ** (6 - fsp) * 10 ** (6 - fsp)
        size = (fsp + 1) // 2
        stored = us // 10 ** (6 - 2 * size) if fsp else 0  # MySQL stores fsp 3 in 2 bytes as 1/10000 s
        raw[name] = _datetime2(*parts, stored.to_bytes(size, "big") if size else b"")
        want[name] = _expected_datetime(parts, us, fsp)
    parts = draw(_DATE_PARTS) + draw(_TIME_PARTS)
    raw["od"], want["od"] = _old_datetime(*parts), _expected_datetime(parts, 0, 0)
    for name, fsp in (("t0", 0), ("t3", 3)):
        seconds = draw(st.one_of(st.just(0), st.integers(1, 2**31 - 1)))
        ms = draw(st.integers(0, 999)) if fsp else 0
        raw[name] = struct.pack(">I", seconds) + ((ms * 10).to_bytes(2, "big") if fsp else b"")
        if seconds:
            want[name] = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds, milliseconds=ms)
        else:
            want[name] = "0000-00-00 00:00:00" + (".000" if fsp else "")
            raw[name] = struct.pack(">I", 0) + (b"\x00\x00" if fsp else b"")
    seconds = draw(st.one_of(st.just(0), st.integers(1, 2**32 - 1)))
    raw["ot"] = struct.pack("<I", seconds)
    want["ot"] = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds) if seconds else ZERO_VALUES["ot"]
    year = draw(st.integers(0, 255))
    raw["y"], want["y"] = bytes([year]), year + 1900 if year else 0
    mask = draw(st.integers(0, 3))
    raw["s"], want["s"] = bytes([mask]), ",".join(n for i, n in enumerate("ab") if mask >> i & 1)
    index = draw(st.integers(0, 2))
    raw["e"], want["e"] = bytes([index]), ["", "x", "y"][index]
    bits = draw(st.integers(0, 255))
    raw["bt"], want["bt"] = bytes([bits]), format(bits, "08b")
    f = draw(st.floats(allow_nan=False))
    raw["f"], want["f"] = struct.pack("<d", f), f
    blob = draw(st.binary(max_size=8))
    raw["bl"], want["bl"] = struct.pack("<H", len(blob)) + blob, blob or ""
    n = draw(st.integers(-(2**31), 2**31 - 1))
    raw["n"], want["n"] = struct.pack("<i", n), n
    for name in draw(st.sets(st.sampled_from(NAMES[1:]))):  # NULLs: None, and only these
        raw[name], want[name] = None, None
    return raw, want


@settings(max_examples=150, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=3))
def test_a_non_null_cell_is_never_none_and_both_readers_agree(drawn):
    events = binlog([image(raw) for raw, _ in drawn])
    relay, verifier = relay_rows(events), verifier_rows(events)
    assert len(relay) == len(verifier) == len(drawn)
    for (raw, want), a, b in zip(drawn, relay, verifier, strict=True):
        for name in NAMES:
            assert (a[name] is None) == (raw[name] is None), (name, raw[name], a[name])
        _same(a, want)
        _same(b, want)


# -- the outbox mapping: what a zero-like value of an outbox column is published as -------

_TEXTS = [
    ("0000-00-00", "0000-00-00"),
    ("0000-00-00 00:00:00.000", "0000-00-00 00:00:00.000"),
    (0, "0"),
    ("", ""),
    (decimal.Decimal("0.00"), "0.00"),
    # Java's BigDecimal.toString(), what Debezium's converters write: the same number and scale
    (decimal.Decimal("0.0000000000"), "0E-10"),
    (decimal.Decimal("-0.0000001"), "-1E-7"),
    (datetime.timedelta(0), "00:00:00"),  # str(): 0:00:00
    (datetime.timedelta(seconds=-1), "-00:00:01"),  # str(): -1 day, 23:59:59
    (datetime.timedelta(microseconds=-1), "-00:00:00.000001"),
    (datetime.timedelta(hours=838, minutes=59, seconds=59), "838:59:59"),
    (-0.0, "-0.0"),
    ("00000000", "00000000"),  # BIT(8) 0
]


def test_a_zero_like_outbox_column_is_the_same_text_as_key_header_and_payload_in_relay_and_verifier():
    """text_of (id, key, aggregate type, event type: relay and verifier), a header
    (additional_placement), a payload column of that type (relay `_payload_of`, verifier
    `payload_bytes`): MySQL's text, never NULL."""
    from cdc.events.formats import header_value
    from cdc.events.outbox import _payload_of, text_of
    from spark_jobs.mysql.binlog_rows import payload_bytes

    for value, text in _TEXTS:
        assert text_of(value) == text, value
        assert header_value(value) == text.encode(), value
        assert _payload_of(value) == text, value
        assert payload_bytes(value)[0] == text.encode(), value


def test_a_row_of_zero_like_values_maps_alike_in_relay_and_verifier():
    """The outbox columns holding zero-like values: the relay's event and the verifier's
    expectation agree, none is a dead letter for NULL; a zero DATETIME event-time column has
    no epoch: no event time (the record timestamp is the commit time), in both."""
    from cdc.events.identity import EventIdentity, TxIdentity
    from cdc.events.outbox import OutboxEvent, OutboxMapper, OutboxTable
    from cdc.events.topics import TopicRouter
    from cdc.position import BinlogPosition
    from spark_jobs.mysql.binlog_rows import EventMapper

    identity = EventIdentity(TxIdentity("src", BinlogPosition("mysql-bin.000001", 4), None, 1, 1000), 0)
    row = {
        "id": decimal.Decimal("0.0000000000"),
        "aggregatetype": "",
        "aggregateid": 0,
        "type": "",
        "payload": "null",  # a JSON column holding the literal null
        "created_at": "0000-00-00 00:00:00.000000",
    }
    for fmt in ("envelope", "json"):
        table = OutboxTable("shop", "outbox", topic="t", format=fmt, timestamp_column="created_at")
        event = OutboxMapper(TopicRouter(())).map(table, dict(row), identity)
        assert isinstance(event, OutboxEvent), event
        expected = EventMapper([table]).map("shop", "outbox", dict(row))
        assert expected["dlq_cause"] is None
        assert (event.event_id, event.aggregate_type, event.aggregate_id, event.event_type) == (
            expected["event_id"], expected["aggregate_type"], expected["aggregate_id"], expected["event_type"]
        ) == ("0E-10", "", "0", "")  # fmt: skip
        assert event.payload == "null" and expected["payload"] == b"null"
        assert event.timestamp_us is None and expected["timestamp_us"] is None
