"""Compressed binlog events on byte fixtures (tests/unit/binlog_bytes.py, from the protocol
documentation): MySQL Transaction_payload (zstd and uncompressed; one transaction, several
transactions in a row, many row events in one; cut short, sizes that disagree, an unknown
compression type, a second transaction inside one payload) and MariaDB's compressed
events (V1 and V2 rows, query; a flipped byte, an unknown algorithm). The relay's decoder
and the verifier's expansion (spark_jobs/mysql/binlog_compressed.py) both read them; no MySQL
server runs here, so this is the only test of the Transaction_payload path."""

from __future__ import annotations

import struct
import zlib

import pytest

from cdc.errors import NeedsOperator, UndecodableEventError
from cdc.position import BinlogPosition
from cdc.source_events import RowChange, RowInsert, ServerInfo, TxBegin, TxCommit
from connectors.mysql.binlog_decoder import BinlogDecoder, UndecodableEvent
from connectors.mysql.binlog_source import MySQLBinlogSource
from spark_jobs.mysql.binlog_compressed import CompressedEventError, _Format, expand_event
from tests.unit import binlog_bytes as bb

FILE = "binlog.000001"
WATCHED = {(bb.SCHEMA, bb.TABLE)}
ROWS = [("e-1", "é😀 payload".encode(), 1), ("e-2", None, None), ("e-3", b"x" * 60_000, -7)]


def decode(events: list[bytes], watched=WATCHED) -> list:
    dec = BinlogDecoder(watched, FILE, flavor="mysql")
    out: list = []
    for ev in events:
        dec.decode(ev, out)
    return out


def strip_positions(events: list) -> list:
    return [(type(e).__name__, getattr(e, "values", None)) for e in events]


def compressed_log(transactions: list[bytes], compression: int = 0) -> bb.Binlog:
    """GTID event (outside, as MySQL writes it) + Transaction_payload, per transaction."""
    log = bb.Binlog()
    for gno, inner in enumerate(transactions, 1):
        log.add(33, bb.gtid_body(gno))
        log.add(40, bb.payload_body(inner, compression))
    return log


def plain_log(transactions: list[bytes]) -> bb.Binlog:
    """The same transactions uncompressed: GTID, then the inner events with a CRC each."""
    log = bb.Binlog()
    for gno, inner in enumerate(transactions, 1):
        log.add(33, bb.gtid_body(gno))
        p = 0
        while p < len(inner):
            size = struct.unpack_from("<I", inner, p + 9)[0]
            log.add(inner[p + 4], inner[p + 19 : p + size])
            p += size
    return log


# -- MySQL Transaction_payload ------------------------------------------------------------


@pytest.mark.parametrize("compression", [0, 255], ids=["zstd", "none"])
def test_payload_of_one_transaction(compression):
    inner = bb.transaction_inner(5, ROWS)
    log = compressed_log([inner], compression)
    out = decode(log.events)
    gtid_start, payload_start, payload_end = log.starts[0], log.starts[1], log.pos
    assert strip_positions(out) == strip_positions(decode(plain_log([inner]).events))
    begin, explicit_begin, *rows, commit = out
    assert begin == TxBegin(
        BinlogPosition(FILE, gtid_start),
        BinlogPosition(FILE, payload_start),
        "3e11fa47-71ca-11e1-a4f1-000c29a2f5b1:1",
        False,
    )
    assert explicit_begin.gtid is None and explicit_begin.start == BinlogPosition(FILE, payload_start)
    assert [r.values for r in rows] == [
        {"id": "e-1", "payload": "é😀 payload".encode(), "n": 1},
        {"id": "e-2", "payload": None, "n": None},
        {"id": "e-3", "payload": b"x" * 60_000, "n": -7},
    ]
    assert all(r.end == BinlogPosition(FILE, payload_end) for r in rows)
    assert commit == TxCommit(BinlogPosition(FILE, payload_end), 1_700_000_000)


def test_several_transactions_and_a_restart_between_two_payloads():
    """Each transaction's commit ends with its payload: a checkpoint there, and a restart
    from it, read exactly the transactions after it."""
    txs = [bb.transaction_inner(10 + i, [(f"t{i}-{j}", b"p", j) for j in range(3)]) for i in range(3)]
    log = compressed_log(txs)
    out = decode(log.events)
    commits = [e for e in out if isinstance(e, TxCommit)]
    assert [c.end.pos for c in commits] == [log.starts[2], log.starts[4], log.pos]
    assert [e.values["id"] for e in out if isinstance(e, RowInsert)] == [
        f"t{i}-{j}" for i in range(3) for j in range(3)
    ]
    resumed_at = log.starts.index(commits[0].end.pos)
    again = decode(log.events[resumed_at:])
    assert [e.values["id"] for e in again if isinstance(e, RowInsert)] == [
        f"t{i}-{j}" for i in (1, 2) for j in range(3)
    ]
    assert [e for e in again if isinstance(e, TxBegin) and e.gtid] == [
        e for e in out if isinstance(e, TxBegin) and e.gtid
    ][1:]


def test_one_payload_with_many_row_events_and_tables():
    """Several transactions' worth of row events in one payload: 40 Write_rows of 25 rows
    into the outbox, an UPDATE, and rows of a table that is not watched."""
    rows = [(f"r{j}", b"v" * j, j) for j in range(25)]
    inner = bb.inner_events(
        (2, bb.query_body("BEGIN")),
        (19, bb.table_map_body()),
        *[(30, bb.write_rows_body(rows))] * 40,
        (19, bb.table_map_body(table_id=78, table="other")),
        (30, bb.write_rows_body(rows, table_id=78)),
        (31, bb.update_rows_body([(("r1", b"v", 1), ("r1", b"w", 2))])),
        (16, bb.xid_body(3)),
    )
    log = compressed_log([inner])
    out = decode(log.events)
    assert strip_positions(out) == strip_positions(decode(plain_log([inner]).events))
    assert sum(isinstance(e, RowInsert) for e in out) == 1000
    assert [(e.kind, e.values["payload"]) for e in out if isinstance(e, RowChange)] == [("update", b"w")]


def test_inner_events_with_their_own_checksum_are_read_too():
    inner = b"".join(
        bb.event(k, b, 0)
        for k, b in [
            (2, bb.query_body("BEGIN")),
            (19, bb.table_map_body()),
            (30, bb.write_rows_body(ROWS)),
            (16, bb.xid_body(1)),
        ]
    )
    out = decode(compressed_log([inner]).events)
    assert [e.values["id"] for e in out if isinstance(e, RowInsert)] == ["e-1", "e-2", "e-3"]


def _payload_event(body: bytes, start: int = 4) -> bytes:
    return bb.event(40, body, start + 19 + len(body) + 4)


@pytest.mark.parametrize(
    "body, why",
    [
        (bb.payload_body(bb.transaction_inner(1, ROWS))[:-9], "payload is"),  # cut short
        (bb.payload_body(bb.transaction_inner(1, ROWS), declared_size=None)[:40], "payload is"),
        (bb.payload_body(bb.transaction_inner(1, ROWS), 255)[:-30], "payload is"),
        (
            bb.payload_body(
                bb.transaction_inner(1, ROWS),
                255,
                declared_size=len(bb.transaction_inner(1, ROWS)) - 30,
                declared_uncompressed=len(bb.transaction_inner(1, ROWS)) - 30,
            )[:-30],
            "inner event 2 claims",
        ),
        (bb.payload_body(bb.transaction_inner(1, ROWS), 1), "unknown compression type 1"),
        (bb.payload_body(bb.transaction_inner(1, ROWS), declared_uncompressed=5), "decompresses to"),
        (bb.payload_body(b"", 255), "holds no event"),
        (b"\x01\x09", "runs past the end"),
    ],
    ids=["zstd-cut", "header-only", "none-cut", "inner-cut", "unknown-type", "size-disagrees", "empty", "bad-header"],
)
def test_a_payload_that_does_not_add_up_is_refused_with_one_line(body, why):
    ev = _payload_event(body, 4000)
    with pytest.raises(UndecodableEvent) as info:
        decode([ev])
    text = str(info.value)
    assert f"Transaction_payload event (type 40) at {FILE}:4000 " in text and why in text
    assert "restore this binlog file" in text and "\n" not in text


def test_corrupt_zstd_bytes_are_refused():
    body = bytearray(bb.payload_body(bb.transaction_inner(1, ROWS)))
    body[-20] ^= 0xFF
    with pytest.raises(UndecodableEvent, match="zstd"):
        decode([_payload_event(bytes(body))])


def test_a_second_transaction_inside_one_payload_is_refused():
    """MySQL writes one transaction per payload; two would need a checkpoint inside it."""
    inner = bb.transaction_inner(1, ROWS[:1]) + bb.transaction_inner(2, ROWS[1:2])
    with pytest.raises(UndecodableEvent, match="inner event 3 of 8 ends a transaction"):
        decode(compressed_log([inner]).events)


def test_the_relay_stops_with_a_needs_operator_error_not_a_reconnect():
    """Through the binlog source: UndecodableEventError (exit 2), after the events before it."""
    good = compressed_log([bb.transaction_inner(1, ROWS)])
    bad = bytearray(bb.payload_body(bb.transaction_inner(2, ROWS)))
    bad[-15] ^= 0x55
    events = good.events + [
        bb.event(33, bb.gtid_body(2), good.pos + 19 + 42 + 4),
        _payload_event(bytes(bad), good.pos + 19 + 42 + 4),
    ]
    dec = BinlogDecoder(WATCHED, FILE, flavor="mysql")
    source = MySQLBinlogSource(iter(events), dec.decode, lambda: None, ServerInfo(1, "mysql"), 1000, threaded=False)
    seen = []
    with pytest.raises(UndecodableEventError) as info:
        while True:
            seen.append(source.read(0.1))
    assert isinstance(info.value, NeedsOperator) and not info.value.retriable
    assert sum(isinstance(e, TxCommit) for e in seen) == 1
    assert f"at {FILE}:{good.pos + 65} " in str(info.value) and "\n" not in str(info.value)


def test_the_verifier_expands_payloads_alike():
    """spark_jobs/mysql/binlog_compressed.py: the inner events, each ending where the payload
    ends, with a CRC, the start of each the payload's."""
    for compression in (0, 255):
        inner = bb.transaction_inner(5, ROWS)
        log = compressed_log([inner], compression)
        fmt = _Format()
        expanded = expand_event(log.events[1], fmt)
        assert [s for _, s in expanded] == [log.starts[1]] * 4
        assert [e[4] for e, _ in expanded] == [2, 19, 30, 16]
        for e, _ in expanded:
            size, end = struct.unpack_from("<II", e, 9)
            assert size == len(e) and end == log.pos and zlib.crc32(e[:-4]) == struct.unpack("<I", e[-4:])[0]
    with pytest.raises(CompressedEventError, match="type 40 at 4 "):
        expand_event(_payload_event(bb.payload_body(bb.transaction_inner(1, ROWS), 1)), _Format())


def library_events(raw_events: list[bytes]) -> list:
    """python-mysql-replication's own event classes on the verifier's expansion of each
    event (what spark_jobs/binlog_compressed.ExpandingConnection hands the library)."""
    from pymysqlreplication.event import GtidEvent, QueryEvent, XidEvent
    from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    allowed = frozenset([GtidEvent, QueryEvent, XidEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent])
    fmt, table_map, out = _Format(), {}, []
    for raw in raw_events:
        for ev, start in expand_event(raw, fmt) or [(raw, None)]:
            wrapper = bb.library_event(ev, table_map, allowed)
            event = wrapper.event
            if event is not None:
                out.append((type(event).__name__, wrapper.log_pos, start, event))
    return out


def test_the_library_decodes_the_verifiers_expansion_like_the_relay():
    """The MySQL path of the verifier end to end without a server: expanded payload
    events (CRC checked by the library) decoded by python-mysql-replication's classes give
    the rows the relay's decoder gives, at the payload's end, started at its start."""
    txs = [bb.transaction_inner(10 + i, ROWS) for i in range(2)]
    for compression in (0, 255):
        log = compressed_log(txs, compression)
        lib = library_events(log.events)
        rows = [r["values"] for name, _, _, e in lib if name == "WriteRowsEvent" for r in e.rows]
        assert rows == [e.values for e in decode(log.events) if isinstance(e, RowInsert)]
        ends = [(end, start) for name, end, start, _ in lib if name == "XidEvent"]
        assert ends == [(log.starts[2], log.starts[1]), (log.pos, log.starts[3])]


# -- MariaDB compressed events ------------------------------------------------------------


def mariadb_pair(kind: int, plain_body: bytes, keep: int, algorithm: int = 0) -> tuple[bytes, bytes]:
    """(plain event, its compressed twin) at position 4000; `keep` bytes stay plain."""
    compressed_body = plain_body[:keep] + bb.mariadb_block(plain_body[keep:], algorithm)
    plain_kind = {165: 2, 166: 23, 167: 24, 168: 25, 169: 30, 170: 31, 171: 32}[kind]
    return bb.event(plain_kind, plain_body, 4000 + 23 + len(plain_body)), bb.event(
        kind, compressed_body, 4000 + 23 + len(compressed_body)
    )


def _rows_cases() -> list[tuple[int, bytes, int]]:
    pair = [(("e-1", b"old", 1), ("e-1", "né😀".encode(), 2))]
    return [
        (166, bb.write_rows_body(ROWS, v2=False), len(bb.rows_head(v2=False))),
        (167, bb.update_rows_body(pair, v2=False), len(bb.rows_head(v2=False, update=True))),
        (168, bb.write_rows_body(ROWS, v2=False), len(bb.rows_head(v2=False))),
        (169, bb.write_rows_body(ROWS), len(bb.rows_head())),
        (170, bb.update_rows_body(pair), len(bb.rows_head(update=True))),
        (171, bb.write_rows_body(ROWS), len(bb.rows_head())),
    ]


@pytest.mark.parametrize("kind, body, keep", _rows_cases(), ids=[str(k) for k in range(166, 172)])
def test_mariadb_compressed_rows_decode_like_the_plain_event(kind, body, keep):
    table_map = bb.event(19, bb.table_map_body(), 3000)
    plain, compressed = mariadb_pair(kind, body, keep)
    got = decode([table_map, compressed])
    assert strip_positions(got) == strip_positions(decode([table_map, plain])) and got
    assert all(e.end == BinlogPosition(FILE, struct.unpack_from("<I", compressed, 13)[0]) for e in got)
    fmt = _Format()
    [(expanded, start)] = expand_event(compressed, fmt)
    assert start == 4000
    # the plain event's bytes, at the compressed event's end position, its size and CRC made right
    assert expanded[:9] == plain[:9] and expanded[17:-4] == plain[17:-4]
    assert struct.unpack_from("<II", expanded, 9) == (len(plain), struct.unpack_from("<I", compressed, 13)[0])
    assert zlib.crc32(expanded[:-4]) == struct.unpack("<I", expanded[-4:])[0]


def test_mariadb_query_compressed_decodes_like_the_query():
    sql = "INSERT INTO outbox (id) VALUES ('statement logged, é😀')"
    body = bb.query_body(sql)
    plain, compressed = mariadb_pair(165, body, len(body) - len(sql.encode()))
    got = decode([compressed])
    assert [e.sql for e in got] == [sql] and got[0].end.pos == struct.unpack_from("<I", compressed, 13)[0]
    [(expanded, _)] = expand_event(compressed, _Format())
    assert expanded[19:-4] == plain[19:-4] and expanded[4] == 2


def test_mariadb_compressed_rows_of_an_unwatched_table_are_skipped_unread():
    table_map = bb.event(19, bb.table_map_body(table_id=5, table="other"), 3000)
    body = bytearray(mariadb_pair(169, bb.write_rows_body(ROWS, table_id=5), len(bb.rows_head(5)))[1])
    body[-10] ^= 0xFF  # not even looked at
    assert decode([table_map, bytes(body)]) == []


@pytest.mark.parametrize(
    "damage, why",
    [
        ("flip", "its zlib data"),
        ("algorithm", "unknown compression algorithm 1"),
        ("size", "does not decompress to the"),
        ("no-header", "no compression header"),
    ],
)
def test_a_damaged_mariadb_compressed_event_is_refused_with_one_line(damage, why):
    table_map = bb.event(19, bb.table_map_body(), 3000)
    keep = len(bb.rows_head())
    _plain, ev = mariadb_pair(169, bb.write_rows_body(ROWS), keep, algorithm=1 if damage == "algorithm" else 0)
    ev = bytearray(ev)
    if damage == "flip":
        ev[-12] ^= 0x5A
    elif damage == "size":
        ev[19 + keep + 2] ^= 0x01
    elif damage == "no-header":
        ev[19 + keep] = 0x02
    with pytest.raises(UndecodableEvent) as info:
        decode([table_map, bytes(ev)])
    text = str(info.value)
    assert f"Write_rows_compressed event (type 169) at {FILE}:4000 (ending at {4000 + len(ev)})" in text, text
    assert why in text and "\n" not in text
    with pytest.raises(CompressedEventError):
        expand_event(bytes(ev), _Format())


def test_the_verifier_connection_hands_the_library_only_events_it_takes_something_from():
    """ExpandingConnection._redundant: a Table_map the library already holds (same id and
    body since the last Rotate) is not handed over again, nor rows of a table not watched,
    nor Annotate_rows; a Table_map after a Rotate (the library forgets its ids there), one
    whose body changed, and rows of a watched table are."""
    from spark_jobs.mysql.binlog_compressed import ExpandingConnection
    from spark_jobs.mysql.binlog_table_map import TableMapRewriter

    def no_lookup(schema: str, table: str) -> list:
        raise AssertionError("FULL metadata: information_schema is not asked")

    rewriter = TableMapRewriter({(bb.SCHEMA, bb.TABLE)}, no_lookup)
    conn = ExpandingConnection.__new__(ExpandingConnection)  # no server: only the event filter
    conn._table_maps = rewriter
    fmt = _Format()
    log = bb.Binlog()
    other = bb.TABLE_ID + 1

    def handed(kind: int, body: bytes) -> bool:
        ev = log.add(kind, body)
        if conn._redundant(b"\x00" + ev, fmt):
            return False
        if kind == 19:
            rewriter.rewrite(ev[19:-4])  # as prepare_event does for what is handed over
        return True

    watched_map, rows = bb.table_map_body(), bb.write_rows_body([("e1", b"{}", 1)])
    assert handed(19, watched_map)
    assert not handed(19, watched_map)  # the same again: the library keeps the first (freeze_schema)
    assert handed(30, rows)
    assert handed(19, bb.table_map_body(other, bb.SCHEMA, "not_watched"))
    assert not handed(30, bb.write_rows_body([("x", None, 2)], table_id=other))
    assert not handed(160, b"\x00INSERT INTO t VALUES (1)")  # Annotate_rows
    assert handed(19, bb.table_map_body(bb.TABLE_ID, bb.SCHEMA, bb.TABLE + "_renamed"))  # body changed
    assert handed(4, struct.pack("<Q", 4) + b"binlog.000002")  # Rotate
    assert handed(19, bb.table_map_body(bb.TABLE_ID, bb.SCHEMA, bb.TABLE + "_renamed"))  # forgotten at the Rotate
