"""Binlog layouts of MySQL servers no server here can run, on byte sequences written out
from MySQL's source (tests/unit/binlog_bytes.py cites the layouts): the Format_description
of MySQL 9 (v1 rows events removed, their post-header lengths 0); partial JSON updates
(Partial_update_rows)."""

from __future__ import annotations

import struct

import pytest

from cdc.position import BinlogPosition
from cdc.source_events import RowChange, RowInsert, ServerStarted, TxCommit
from connectors.mysql.binlog_decoder import BinlogDecodeError, BinlogDecoder, ServerSettingRequired
from tests.unit import binlog_bytes as bb
from tests.unit import mysql_json_bytes as jb


def _decode(log: bb.Binlog) -> list:
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    return out


def _one_insert(version: str, post_header: bytes) -> bb.Binlog:
    log = bb.Binlog()
    log.add(15, bb.fde_body(version, post_header))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, bb.write_rows_body([("e-1", b"{}", 7)]))
    log.add(16, bb.xid_body(3))
    return log


@pytest.mark.parametrize(
    "version, post_header",
    [("9.0.1", bb.MYSQL_90_POST_HEADER), ("9.6.0", bb.MYSQL_90_POST_HEADER), ("8.2.0", bb.MYSQL_82_POST_HEADER)],
    ids=["9.0.1", "9.6.0", "8.2.0"],
)
def test_the_format_description_of_mysql_9_is_read(version, post_header):
    """MySQL 9 gives post-header length 0 for event types 23-25 (refused before: 'unsupported
    binlog layout from server 9.0.1 (table id size)')."""
    out = _decode(_one_insert(version, post_header))
    rows = [e for e in out if isinstance(e, RowInsert)]
    assert [(r.values["id"], r.values["n"]) for r in rows] == [("e-1", 7)]
    assert len([e for e in out if isinstance(e, TxCommit)]) == 1


def test_four_byte_table_ids_are_refused_naming_them():
    """A Table_map post-header of 6 bytes means 4-byte table ids (servers before MySQL 5.1.4)."""
    post_header = bytearray(bb.MYSQL_82_POST_HEADER)
    post_header[19 - 1] = 6
    log = bb.Binlog()
    log.add(15, bb.fde_body("5.1.3-beta", bytes(post_header)))
    with pytest.raises(BinlogDecodeError, match=r"Table_map .*post-header length 6.*4-byte table ids"):
        _decode(log)


def test_a_rows_event_of_a_type_the_format_description_removed_is_refused():
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.0.1", bb.MYSQL_90_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(23, bb.write_rows_body([("e-1", b"{}", 7)], v2=False))
    with pytest.raises(BinlogDecodeError, match=r"event type 23 .*9\.0\.1.*post-header length 0"):
        _decode(log)


def test_an_unexpected_v2_rows_post_header_is_refused_naming_it():
    post_header = bytearray(bb.MYSQL_90_POST_HEADER)
    post_header[30 - 1] = 12
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.9.9", bytes(post_header)))
    with pytest.raises(BinlogDecodeError, match=r"Write_rows \(event type 30\).*post-header length 12.*10"):
        _decode(log)


# -- partial JSON updates ----------------------------------------------------------------------
#
# Partial_update_rows (39): the post-header and body of Update_rows v2 (table id 6, flags 2,
# extra-info length 2 | column count, before and after bitmaps); each row is a before image
# as usual, then the after image: value_options (packed integer, 1 = PARTIAL_JSON), if 1 one
# bit per JSON column of the table (low bit first), the null bits, the values, where a
# partial JSON column holds its diffs: their size (4 bytes), then per diff the operation (0
# REPLACE, 1 INSERT, 2 REMOVE), the path's length (packed) and text, and unless REMOVE the
# value's length (packed) and binary JSON (MySQL sql/rpl_record.cc pack_row, sql/json_diff.cc
# Json_diff_vector::write_binary).

DOC_TABLE = "docs"


def _doc_table_map(table_id: int = 91) -> bytes:
    """id VARCHAR(64) NOT NULL, doc JSON NULL, n INT NULL, note JSON NULL (names as
    binlog_row_metadata=FULL writes them)."""
    types = bytes([15, 245, 3, 245])
    meta = struct.pack("<H", 256) + b"\x04" + b"\x04"
    names = b"".join(bb.lenenc(len(c)) + c.encode() for c in ("id", "doc", "n", "note"))
    optional = b"\x04" + bb.lenenc(len(names)) + names
    return (
        struct.pack("<Q", table_id)[:6]
        + b"\x01\x00"
        + bytes([len(bb.SCHEMA)])
        + bb.SCHEMA.encode()
        + b"\x00"
        + bytes([len(DOC_TABLE)])
        + DOC_TABLE.encode()
        + b"\x00"
        + bb.lenenc(4)
        + types
        + bb.lenenc(len(meta))
        + meta
        + b"\x0e"
        + optional
    )


def _json_value(doc) -> bytes:
    raw = jb.encode(doc)
    return struct.pack("<I", len(raw)) + raw


def _image(event_id: str, doc, n: int, note, present: int = 0b1111) -> bytes:
    """A plain row image of the columns in `present` (null bits of those only)."""
    cols = [c for c in range(4) if present >> c & 1]
    values = {0: event_id, 1: doc, 2: n, 3: note}
    nulls = 0
    body = b""
    for k, c in enumerate(cols):
        v = values[c]
        if v is None:
            nulls |= 1 << k
        elif c == 0:
            body += struct.pack("<H", len(v)) + v.encode()
        elif c == 2:
            body += struct.pack("<i", v)
        else:
            body += _json_value(v)
    return bytes([nulls]) + body


def _diff(op: int, path: str, value=None) -> bytes:
    out = bytes([op]) + bb.lenenc(len(path.encode())) + path.encode()
    if op != 2:
        raw = jb.encode(value)
        out += bb.lenenc(len(raw)) + raw
    return out


def _diffs(*diffs: bytes) -> bytes:
    body = b"".join(diffs)
    return struct.pack("<I", len(body)) + body


def _partial_after(event_id: str, doc_diffs: bytes, n: int, note) -> bytes:
    """After image with PARTIAL_JSON: value_options 1, partial bits (doc partial, note not),
    null bits, values."""
    nulls = 8 if note is None else 0
    body = struct.pack("<H", len(event_id)) + event_id.encode() + doc_diffs + struct.pack("<i", n)
    if note is not None:
        body += _json_value(note)
    return b"\x01" + b"\x01" + bytes([nulls]) + body


def _rows_head(table_id: int = 91, before: int = 0b1111, after: int = 0b1111) -> bytes:
    return struct.pack("<Q", table_id)[:6] + b"\x01\x00" + b"\x02\x00" + bb.lenenc(4) + bytes([before, after])


def _decode_docs(*rows_events: tuple[int, bytes]) -> list:
    log = bb.Binlog()
    log.add(15, bb.fde_body("8.0.40", bb.MYSQL_82_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, _doc_table_map())
    for kind, body in rows_events:
        log.add(kind, body)
    log.add(16, bb.xid_body(5))
    dec = BinlogDecoder({(bb.SCHEMA, DOC_TABLE)}, "binlog.000001")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    return [e for e in out if isinstance(e, RowChange)]


BEFORE = {"n": 1, "ok": True, "tag": "x", "arr": [1, 2, 3]}


def test_a_partial_json_update_is_the_update_of_the_whole_document():
    """Partial_update_rows had no handler: its row changes vanished (an 8.0.22 binlog gave
    6 of its 12 updates)."""
    diffs = _diffs(
        _diff(0, "$.n", 2),
        _diff(1, "$.a", "new"),
        _diff(2, "$.tag"),
        _diff(1, "$.arr[1]", 9),
        _diff(0, "$.arr[last]", {"z": None}),
        _diff(2, "$.arr[0]"),
        _diff(1, '$."key with space"', 1.5),
    )
    partial = _decode_docs(
        (39, _rows_head() + _image("e-1", BEFORE, 7, {"k": 1}) + _partial_after("e-1", diffs, 8, {"k": 2}))
    )
    after = {"a": "new", "n": 2, "ok": True, "arr": [9, 2, {"z": None}], "key with space": 1.5}
    whole = _decode_docs((31, _rows_head() + _image("e-1", BEFORE, 7, {"k": 1}) + _image("e-1", after, 8, {"k": 2})))
    assert len(partial) == 1
    assert [(r.kind, r.values) for r in partial] == [(r.kind, r.values) for r in whole]
    assert partial[0].kind == "update"
    assert partial[0].values == {
        "id": "e-1",
        "doc": '{"a": "new", "n": 2, "ok": true, "arr": [9, 2, {"z": null}], "key with space": 1.5}',
        "n": 8,
        "note": '{"k": 2}',
    }


def test_rows_with_and_without_diffs_in_one_partial_update_event():
    one = _image("e-1", BEFORE, 1, None) + _partial_after("e-1", _diffs(_diff(0, "$.ok", False)), 2, None)
    # value_options 0: a whole after image (no partial bits)
    two = _image("e-2", [1], 1, None) + b"\x00" + _image("e-2", [1, 2], 3, {"x": [1]})
    rows = _decode_docs((39, _rows_head() + one + two))
    assert [r.values for r in rows] == [
        {"id": "e-1", "doc": '{"n": 1, "ok": false, "arr": [1, 2, 3], "tag": "x"}', "n": 2, "note": None},
        {"id": "e-2", "doc": "[1, 2]", "n": 3, "note": '{"x": [1]}'},
    ]


def test_a_partial_update_without_the_before_document_is_refused_naming_the_setting():
    """binlog_row_image=MINIMAL: the before image holds the key only."""
    body = _rows_head(before=0b0001) + _image("e-1", None, 0, None, present=0b0001)
    body += _partial_after("e-1", _diffs(_diff(0, "$.n", 2)), 8, None)
    with pytest.raises(ServerSettingRequired, match=r"column 'doc' of shop\.docs .*binlog_row_image=FULL"):
        _decode_docs((39, body))


@pytest.mark.parametrize(
    "diff, why",
    [
        (_diff(0, "$.missing", 1), 'REPLACE of \\$."missing"'),
        (_diff(1, "$.n", 1), 'INSERT of \\$."n", which the before image has already'),
        (_diff(2, "$.arr[7]"), "REMOVE"),
        (b"\x05" + bb.lenenc(3) + b"$.n", "unknown diff operation 5"),
    ],
)
def test_a_diff_that_does_not_apply_is_refused(diff, why):
    body = _rows_head() + _image("e-1", BEFORE, 1, None) + _partial_after("e-1", _diffs(diff), 1, None)
    with pytest.raises(BinlogDecodeError, match=why):
        _decode_docs((39, body))


def test_a_format_description_written_at_a_server_start_says_so():
    """`created` is set only in the binlog a server opens at its start: the relay learns
    from it that everything in earlier files predates a server start (cdc/assembly/feed.py's proof
    of an XA prepare the server lost in a crash)."""
    started, rotated = bb.Binlog(), bb.Binlog()
    started.add(15, bb.fde_body("8.4.0", bb.MYSQL_82_POST_HEADER, created=1_795_719_178))
    rotated.add(15, bb.fde_body("8.4.0", bb.MYSQL_82_POST_HEADER, created=0))
    assert _decode(started) == [ServerStarted(BinlogPosition("binlog.000001", 4))]
    assert _decode(rotated) == []


def _mysql57_transaction(fde: bytes, crc: bool) -> bb.Binlog:
    """A real MySQL 5.7 Format_description, then a transaction as 5.7 writes it: a 42-byte
    Anonymous_gtid (no commit timestamps, no transaction length), BEGIN, Table_map,
    Write_rows v2, XID."""
    log = bb.Binlog(start=4 + len(fde))
    log.events.append(fde)
    log.add(34, bb.gtid_body(1), crc)
    log.add(2, bb.query_body("BEGIN"), crc)
    log.add(19, bb.table_map_body(), crc)
    log.add(30, bb.write_rows_body([("e-57", b"{}", 57)]), crc)
    log.add(16, bb.xid_body(9), crc)
    return log


@pytest.mark.parametrize(
    "fde, crc",
    [(bb.MYSQL_5721_FDE, True), (bb.MYSQL_5720_FDE_NO_CHECKSUM, False)],
    ids=["5.7.21-crc32", "5.7.20-none"],
)
def test_the_format_description_of_mysql_57_is_read(fde, crc):
    """A 5.7 Format_description lists event types 1-38: the byte after them is the checksum
    algorithm (1 = CRC32), not a post-header length of type 39 (refused before: 'its
    Format_description gives Partial_update_rows (event type 39) post-header length 1')."""
    out = _decode(_mysql57_transaction(fde, crc))
    rows = [e for e in out if isinstance(e, RowInsert)]
    assert [(r.values["id"], r.values["n"]) for r in rows] == [("e-57", 57)]
    assert len([e for e in out if isinstance(e, TxCommit)]) == 1


def test_an_event_type_past_the_format_descriptions_list_does_not_exist_on_that_server():
    """A 5.7 server has no Partial_update_rows (type 39): such an event is refused as
    one its server cannot write, not read with a length from past the list."""
    log = _mysql57_transaction(bb.MYSQL_5721_FDE, True)
    log.add(39, bb.write_rows_body([("e-x", b"{}", 1)]))
    with pytest.raises(BinlogDecodeError, match="5.7.21-log"):
        _decode(log)


@pytest.mark.parametrize("in_use", [False, True], ids=["closed", "in-use"])
@pytest.mark.parametrize(
    "fde, checksum", [(bb.MYSQL_5721_FDE, 4), (bb.MYSQL_5720_FDE_NO_CHECKSUM, 0)], ids=["5.7.21-crc32", "5.7.20-none"]
)
def test_the_verifiers_reader_lists_the_event_types_of_a_mysql_57_server(fde, checksum, in_use):
    """The verifier's own reading of a Format_description: 38 event types on 5.7, whether
    the file was copied while the server had it open (LOG_EVENT_BINLOG_IN_USE_F set, the
    CRC computed without it) or not; a type past the list takes the caller's default."""
    from spark_jobs.mysql.binlog_compressed import _Format

    raw = bytearray(fde)
    raw[17] |= 0x01 if in_use else 0
    fmt = _Format()
    fmt.learn(bytes(raw))
    assert (len(fmt.post_header), fmt.checksum, fmt.server_version[:4]) == (38, checksum, "5.7.")
    assert fmt.post_header_len(39, 10) == 10
    assert fmt.post_header_len(19, 0) == 8
