"""The reader's batch path: `BinlogConnection.event_batches` (the events of each socket
read as one list) and `BinlogDecoder.decode_batch` (a list decoded in one loop, the
events of tables that are not watched skipped in the loop itself) give what the
event-at-a-time path gives: the same events, the same source events, the same errors
after the same output."""

from __future__ import annotations

import struct

import pytest

from cdc.source_events import RowChange, RowInsert
from connectors.mysql.binlog_decoder import BinlogDecodeError, BinlogDecoder
from connectors.mysql.binlog_protocol import BinlogConnection, BinlogConnectionError
from tests.unit import binlog_bytes as bb

OTHER_ID = 78  # a table that is not watched


def _rows(table_id: int, rows: list, v2: bool = True, update: bool = False) -> bytes:
    head = bb.rows_head(table_id, v2, update)
    if update:
        return head + b"".join(bb.row_image(*a) + bb.row_image(*b) for a, b in rows)
    return head + b"".join(bb.row_image(*r) for r in rows)


def _mixed_log(post_header: bytes = bb.MYSQL_82_POST_HEADER, version: str = "8.2.0") -> bb.Binlog:
    """Two transactions over the watched table and another one, with every rows event
    kind the batch loop skips for the other table, repeated Table_maps (the cached
    layout), a rotate between them (after which a table id means nothing until its next
    Table_map) and a Table_map of the other table under the watched table's earlier id."""
    log = bb.Binlog()
    log.add(15, bb.fde_body(version, post_header))
    log.add(2, bb.query_body("BEGIN"))
    for i in range(3):
        log.add(19, bb.table_map_body(OTHER_ID, table="other"))
        log.add(30, _rows(OTHER_ID, [(f"o-{i}", b"{}", i)]))
        log.add(19, bb.table_map_body())
        log.add(30, _rows(bb.TABLE_ID, [(f"e-{i}", b'{"a":1}', i), (f"f-{i}", None, None)]))
    log.add(19, bb.table_map_body(OTHER_ID, table="other"))
    log.add(31, _rows(OTHER_ID, [(("o-1", b"{}", 1), ("o-1", b"{}", 2))], update=True))
    log.add(32, _rows(OTHER_ID, [("o-2", b"{}", 2)]))
    log.add(19, bb.table_map_body())
    log.add(31, _rows(bb.TABLE_ID, [(("e-1", b"{}", 1), ("e-1", b"{}", 5))], update=True))
    log.add(16, bb.xid_body(7))
    log.add(4, struct.pack("<Q", 4) + b"binlog.000002")  # a real rotate: table ids are forgotten
    log.add(2, bb.query_body("BEGIN"))
    log.add(30, _rows(bb.TABLE_ID, [("forgotten", b"{}", 0)]))  # no Table_map since the rotate: skipped
    if post_header[23 - 1]:
        log.add(19, bb.table_map_body(OTHER_ID, table="other"))
        log.add(23, _rows(OTHER_ID, [("o-3", b"{}", 3)], v2=False))
        log.add(24, _rows(OTHER_ID, [(("o-3", b"{}", 3), ("o-3", b"{}", 4))], v2=False, update=True))
        log.add(25, _rows(OTHER_ID, [("o-3", b"{}", 4)], v2=False))
        log.add(19, bb.table_map_body())
        log.add(23, _rows(bb.TABLE_ID, [("e-9", b"{}", 9)], v2=False))
    log.add(30, _rows(99, [("lost", b"{}", 0)]))  # a table id without a Table_map: skipped
    log.add(19, bb.table_map_body(bb.TABLE_ID, table="other"))  # the id now names another table
    log.add(30, _rows(bb.TABLE_ID, [("o-4", b"{}", 4)]))
    log.add(16, bb.xid_body(8))
    return log


def _one_by_one(events: list[bytes]) -> tuple[list, BaseException | None]:
    dec, out = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001"), []
    try:
        for ev in events:
            dec.decode(ev, out)
    except BinlogDecodeError as exc:
        return out, exc
    return out, None


def _in_batches(events: list[bytes], size: int) -> tuple[list, BaseException | None]:
    dec, out = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001"), []
    try:
        for i in range(0, len(events), size):
            dec.decode_batch(events[i : i + size], out)
    except BinlogDecodeError as exc:
        return out, exc
    return out, None


@pytest.mark.parametrize(
    "post_header, version",
    [(bb.MYSQL_82_POST_HEADER, "8.2.0"), (bb.MYSQL_90_POST_HEADER, "9.0.1")],
    ids=["8.2.0", "9.0.1"],
)
def test_batches_of_any_size_decode_as_the_events_one_by_one(post_header, version):
    events = _mixed_log(post_header, version).events
    expected, error = _one_by_one(events)
    assert error is None
    inserts = [e.values["id"] for e in expected if isinstance(e, RowInsert)]
    assert inserts == ["e-0", "f-0", "e-1", "f-1", "e-2", "f-2"] + (["e-9"] if version == "8.2.0" else [])
    files = {e.values["id"]: e.end.file for e in expected if isinstance(e, RowInsert)}
    assert files["e-0"] == "binlog.000001" and files.get("e-9", "binlog.000002") == "binlog.000002"
    assert [e.values["n"] for e in expected if isinstance(e, RowChange)] == [5]
    for size in (1, 2, 3, 7, len(events)):
        assert _in_batches(events, size) == (expected, None), size


def test_a_removed_v1_rows_event_of_another_table_is_refused_as_one_by_one():
    """MySQL 9 has no v1 rows events: an Update_rows_v1 is refused even for a table that is
    not watched (its handler reads the post-header first), in a batch too."""
    log = _mixed_log(bb.MYSQL_90_POST_HEADER, "9.0.1")
    log.add(19, bb.table_map_body(OTHER_ID, table="other"))
    log.add(24, _rows(OTHER_ID, [(("o-3", b"{}", 3), ("o-3", b"{}", 4))], v2=False, update=True))
    log.add(16, bb.xid_body(9))
    expected, error = _one_by_one(log.events)
    assert error is not None and "post-header length 0" in str(error)
    out, batch_error = _in_batches(log.events, len(log.events))
    assert out == expected
    assert str(batch_error) == str(error)


@pytest.mark.parametrize("v2", [False, True])
def test_the_watched_tables_inserts_v1_and_v2_decode_as_one_by_one(v2):
    """The loop hands a watched table's Write_rows to _inserts itself (v1: MariaDB's,
    v2: MySQL's): the same source events as its handler gives."""
    log = bb.Binlog()
    log.add(15, bb.fde_body("8.2.0", bb.MYSQL_82_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30 if v2 else 23, _rows(bb.TABLE_ID, [("e-1", b'{"a":1}', 1), ("e-2", None, None)], v2=v2))
    log.add(16, bb.xid_body(5))
    expected, error = _one_by_one(log.events)
    assert error is None and [e.values["id"] for e in expected if isinstance(e, RowInsert)] == ["e-1", "e-2"]
    assert _in_batches(log.events, len(log.events)) == (expected, None)
    assert _read_runs(_streaming([_stream(log.events)])) == (expected, None)  # decode_reads' own copy


def test_inserts_of_one_table_with_other_bitmaps_and_widths_read_their_own_columns():
    """`_inserts` finds a rows event's generated inserter by its column count and
    columns-present bitmap as bytes (the Table_map's count): events of one table that
    alternate between bitmaps (binlog_row_image=MINIMAL: only the columns an INSERT gave),
    or that are written with another column count, still read their own columns, each row
    ending at its own event's end."""
    head = struct.pack("<Q", bb.TABLE_ID)[:6] + b"\x01\x00\x02\x00"
    log = bb.Binlog()
    log.add(15, bb.fde_body("8.2.0", bb.MYSQL_82_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, head + b"\x03\x07" + bb.row_image("a", b"{}", 1))
    log.add(30, head + b"\x03\x03" + bb.row_image("b", b"[]", None))  # n not given: not in the image
    log.add(30, head + b"\x03\x05" + b"\x00\x01\x00c" + struct.pack("<i", 3))  # payload not given
    log.add(30, head + b"\x03\x07" + bb.row_image("d", None, 4) + bb.row_image("e", b"1", 5))
    log.add(30, head + b"\x02\x03" + bb.row_image("f", b"2", None))  # a width of 2 columns
    log.add(30, head + b"\x03\x03" + bb.row_image("g", b"3", None))
    log.add(16, bb.xid_body(5))
    runs = _read_runs(_streaming([_stream(log.events)]))  # the reader's path: decode_reads
    for out, error in (_one_by_one(log.events), _in_batches(log.events, len(log.events)), runs):
        assert error is None
        rows = [e for e in out if isinstance(e, RowInsert)]
        assert [r.values for r in rows] == [
            {"id": "a", "payload": b"{}", "n": 1},
            {"id": "b", "payload": b"[]", "n": None},
            {"id": "c", "payload": None, "n": 3},
            {"id": "d", "payload": None, "n": 4},
            {"id": "e", "payload": b"1", "n": 5},
            {"id": "f", "payload": b"2", "n": None},
            {"id": "g", "payload": b"3", "n": None},
        ]
        ends = [log.starts[i + 1] for i in (3, 4, 5, 6, 6, 7, 8)]
        assert [r.end.pos for r in rows] == ends
        assert all(r.end.file == "binlog.000001" for r in rows)


def test_a_removed_v1_insert_of_the_watched_table_is_refused_as_one_by_one():
    """MySQL 9 has no v1 rows events: a Write_rows_v1 of the watched table is refused in a
    batch too (the loop leaves it to its handler)."""
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.0.1", bb.MYSQL_90_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(23, _rows(bb.TABLE_ID, [("e-1", b"{}", 7)], v2=False))
    expected, error = _one_by_one(log.events)
    assert error is not None and "post-header length 0" in str(error)
    out, batch_error = _in_batches(log.events, len(log.events))
    assert out == expected
    assert str(batch_error) == str(error)


def test_a_checksum_verifying_decoder_checks_every_event_of_a_batch():
    log = _mixed_log()
    bad = bytearray(log.events[3])  # the other table's rows event, skipped without a call
    bad[-1] ^= 0xFF
    events = [*log.events[:3], bytes(bad), *log.events[4:]]
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", verify_checksum=True)
    out: list = []
    with pytest.raises(BinlogDecodeError, match="CRC32 mismatch in an event of type 30"):
        dec.decode_batch(events, out)


# -- framing ----------------------------------------------------------------------------


class _Socket:
    """Hands out the stream in the given pieces, then closes the connection."""

    def __init__(self, pieces: list[bytes], conn: BinlogConnection):
        self._pieces, self._conn = iter(pieces), conn

    def recv(self, _n: int) -> bytes:
        for piece in self._pieces:
            return piece
        self._conn._closed.set()  # close(): the iterator ends quietly
        return b""


def _streaming(pieces: list[bytes]) -> BinlogConnection:
    conn = BinlogConnection("localhost", 3306, "u", "", server_id=5)
    conn._streaming = conn._live = True  # as after a dump's start
    conn._sock = _Socket(pieces, conn)  # type: ignore[assignment]
    return conn


def _packet(payload: bytes, seq: int = 1) -> bytes:
    out = b""
    while True:  # a payload of 16 MiB - 1 or more: physical packets of 16 MiB - 1, then the rest
        part, payload = payload[:0xFFFFFF], payload[0xFFFFFF:]
        out += struct.pack("<I", len(part))[:3] + bytes([seq & 0xFF]) + part
        seq += 1
        if len(part) < 0xFFFFFF:
            return out


EOF_PACKET = _packet(b"\xfe\x00\x00\x02\x00")


def test_event_batches_yield_the_events_wherever_the_reads_split_the_stream():
    events = _mixed_log().events + [bb.event(30, b"x" * 300_000, 0)]  # longer than one read
    stream = b"".join(_packet(b"\x00" + ev) for ev in events) + EOF_PACKET
    cuts = sorted({1, 3, 4, 5, 40, 41, len(stream) // 2, len(stream) - 300_000, len(stream) - 3})
    for cut in cuts:
        for pieces in ([stream[:cut], stream[cut:]], [stream[i : i + cut] for i in range(0, len(stream), cut)]):
            conn = _streaming(pieces)
            batches = list(conn.event_batches())
            assert all(batches), cut
            assert [ev for batch in batches for ev in batch] == events, cut
            assert not conn._live  # the EOF ended the dump
    assert list(_streaming([stream]).events()) == events


def test_a_packet_of_16_mib_and_more_is_reassembled():
    big = bb.event(30, b"y" * 0xFFFFFF, 0)
    stream = _packet(b"\x00" + big) + _packet(b"\x00" + bb.xid_body(1)) + EOF_PACKET
    pieces = [stream[i : i + (1 << 18)] for i in range(0, len(stream), 1 << 18)]
    assert [ev for batch in _streaming(pieces).event_batches() for ev in batch] == [big, bb.xid_body(1)]


def test_the_events_before_an_error_packet_are_yielded_before_the_error():
    events = _mixed_log().events[:4]
    error = _packet(b"\xff" + struct.pack("<H", 1236) + b"#HY000" + b"Could not find first log file name")
    conn = _streaming([b"".join(_packet(b"\x00" + ev) for ev in events) + error])
    got: list[bytes] = []
    with pytest.raises(BinlogConnectionError, match="1236"):
        for batch in conn.event_batches():
            got += batch
    assert got == events


def test_a_closed_stream_ends_after_the_events_it_read():
    events = _mixed_log().events[:5]
    conn = _streaming([b"".join(_packet(b"\x00" + ev) for ev in events)])
    assert [ev for batch in conn.event_batches() for ev in batch] == events


# -- the reader's path: event_runs + decode_reads (the decoder frames the packets) -------


def _log_with_every_shape(crc: bool) -> list[bytes]:
    """The mixed log (checksums on or off) with the events the run loop leaves to the
    framing: a Stop event too short to hold a table id, the stream's last event one; an
    event longer than a read (it reaches the decoder as a list of one); a heartbeat."""
    events = _mixed_log().events
    if not crc:
        plain = bb.Binlog()
        plain.add(15, bb.fde_body("8.2.0", bb.MYSQL_82_POST_HEADER)[:-1] + b"\x00", crc=False)
        for ev in events[1:]:
            plain.add(ev[4], ev[19:-4], crc=False)
        events = plain.events
    return [
        *events[:6],
        bb.event(3, b"", 0, crc),  # Stop: 19 (+4) bytes, shorter than a table id's end
        bb.event(27, b"binlog.000001", 0, crc),  # a heartbeat
        *events[6:9],
        bb.event(30, b"x" * 300_000, 0, crc),  # longer than one read; table id 0x787878787878
        *events[9:],
        bb.event(3, b"", 0, crc),
    ]


def _stream(events: list[bytes]) -> bytes:
    return b"".join(_packet(b"\x00" + ev) for ev in events)


def _read_runs(conn: BinlogConnection, verify: bool = False) -> tuple[list, BaseException | None]:
    dec, out = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", verify_checksum=verify), []
    try:
        for item in conn.event_runs():
            dec.decode_reads(item, out)
    except (BinlogDecodeError, BinlogConnectionError) as exc:
        return out, exc
    return out, None


@pytest.mark.parametrize("crc", [True, False], ids=["crc32", "no-checksum"])
def test_decode_reads_gives_what_the_events_one_by_one_give_wherever_the_reads_split(crc):
    events = _log_with_every_shape(crc)
    expected, error = _one_by_one(events)
    assert error is None and len([e for e in expected if isinstance(e, RowInsert)]) == 7
    stream = _stream(events) + EOF_PACKET
    cuts = sorted({1, 3, 4, 5, 29, 30, 31, 40, 41, len(stream) // 2, len(stream) - 300_000, len(stream) - 3})
    for cut in cuts:
        for pieces in ([stream[:cut], stream[cut:]], [stream[i : i + cut] for i in range(0, len(stream), cut)]):
            conn = _streaming(pieces)
            assert _read_runs(conn) == (expected, None), cut
            assert not conn._live  # the EOF ended the dump


def test_a_consumer_that_takes_nothing_still_gets_every_event_from_event_runs():
    events = _log_with_every_shape(True)
    got = []
    for item in _streaming([_stream(events)]).event_runs():
        if type(item) is list:
            got += item  # item.pos left where it was: every packet comes as a list
    assert got == events


def test_decode_reads_verifies_every_event_in_checksum_mode():
    events = _log_with_every_shape(True)
    bad = bytearray(events[3])  # the other table's rows event, skipped without a bytes object otherwise
    bad[-1] ^= 0xFF
    out, error = _read_runs(_streaming([_stream([*events[:3], bytes(bad), *events[4:]])]), verify=True)
    assert isinstance(error, BinlogDecodeError) and "CRC32 mismatch in an event of type 30" in str(error)
    assert _read_runs(_streaming([_stream(events)]), verify=True) == _one_by_one(events)


def test_decode_reads_takes_a_packet_of_16_mib_and_more_from_the_framing():
    big = bb.event(30, b"y" * 0xFFFFFF, 0)
    head = _mixed_log().events[:4]
    stream = _stream([*head, big, bb.event(16, bb.xid_body(1), 0)]) + EOF_PACKET
    for pieces in ([stream], [stream[i : i + (1 << 18)] for i in range(0, len(stream), 1 << 18)]):
        assert _read_runs(_streaming(pieces)) == _one_by_one([*head, big, bb.event(16, bb.xid_body(1), 0)])


def test_decode_reads_decodes_the_events_before_an_error_packet_then_raises_it():
    events = _mixed_log().events[:8]
    expected, _ = _one_by_one(events)
    assert any(isinstance(e, RowInsert) for e in expected)
    error = _packet(b"\xff" + struct.pack("<H", 1236) + b"#HY000" + b"Could not find first log file name")
    out, exc = _read_runs(_streaming([_stream(events) + error]))
    assert out == expected
    assert isinstance(exc, BinlogConnectionError) and exc.code == 1236


def _other_table_map_then(*rest: bytes) -> list[bytes]:
    head = bb.Binlog()
    head.add(15, bb.fde_body("8.2.0", bb.MYSQL_82_POST_HEADER))
    head.add(2, bb.query_body("BEGIN"))
    head.add(19, bb.table_map_body(OTHER_ID, table="other"))
    head.add(30, _rows(OTHER_ID, [("o-0", b"{}", 0)]))
    head.add(19, bb.table_map_body())
    head.add(19, bb.table_map_body(OTHER_ID, table="other"))  # a cached layout: the loop's own
    return [*head.events, *rest]


def test_after_another_tables_table_map_only_its_own_rows_event_is_dropped_with_it():
    """decode_reads drops the rows event right after a Table_map of a table that is not
    watched in the same turn: only when it is a complete event packet of that table id."""
    watched_rows = bb.event(30, _rows(bb.TABLE_ID, [("e-1", b"{}", 1)]), 0)
    cases = [
        [watched_rows],  # another table id: decoded
        [bb.event(19, bb.table_map_body(), 0), watched_rows],  # not a rows event
        [bb.event(3, b"", 0), watched_rows],  # too short to hold a table id
        [bb.event(30, _rows(OTHER_ID, [("o-1", b"{}", 1)]), 0), watched_rows],  # dropped
        # the same table id given to the watched table: a Table_map, not dropped
        [bb.event(19, bb.table_map_body(OTHER_ID), 0), bb.event(30, _rows(OTHER_ID, [("e-1", b"{}", 1)]), 0)],
    ]
    for rest in cases:
        events = _other_table_map_then(*rest)
        expected, error = _one_by_one(events)
        assert error is None and [e.values["id"] for e in expected if isinstance(e, RowInsert)] == ["e-1"]
        stream = _stream(events) + EOF_PACKET
        after_map = len(_stream(events[:6]))  # where the packet after the cached Table_map starts
        for pieces in (
            [stream],
            [stream[: after_map + 40], stream[after_map + 40 :]],  # that packet split across reads
            [stream[i : i + 50] for i in range(0, len(stream), 50)],
        ):
            assert _read_runs(_streaming(pieces)) == (expected, None), rest


def test_an_error_packet_after_another_tables_table_map_is_raised_whatever_its_bytes():
    """An error packet whose bytes at the event type and table id offsets read as the
    other table's rows event is still the framing's: the loop checks the OK byte."""
    events = _other_table_map_then()
    expected, _ = _one_by_one(events)
    message = b"Could not  N\0\0\0\0\0 find the log"  # message[11:17]: the other table's id
    error = _packet(b"\xff" + struct.pack("<H", 1236) + b"#H\x1e000" + message)  # byte 9: type 30
    assert error[9] == 30 and error[24:30] == struct.pack("<Q", OTHER_ID)[:6]
    out, exc = _read_runs(_streaming([_stream(events) + error]))
    assert out == expected
    assert isinstance(exc, BinlogConnectionError) and exc.code == 1236
