"""MySQL paths no server here can exercise (only MariaDB runs on this machine), on byte
sequences written out from MySQL's protocol documentation, never from the project's own
encoders:

- COM_BINLOG_DUMP_GTID as the relay sends it (MySQL client/server protocol,
  "COM_BINLOG_DUMP_GTID"; the GTID set as `Gtid_set::encode` writes it);
- a MySQL 8.0 Gtid_log_event with the logical clock, immediate / original commit
  timestamps, transaction length and server versions (libbinlogevents `Gtid_event`);
- a MySQL 8.4 Gtid_tagged_log_event (type 42, MySQL's serialization format), as a
  Percona Server 8.4.11 wrote it and as `binlog_bytes.tagged_gtid_body` builds it;
- MySQL binary JSON in a JSON column (sql/json_binary.h: small object / array, inlined
  int16 and literals, strings with a variable-length size, nested values);
- the `caching_sha2_password` handshake (fast authentication; full authentication
  without TLS: the server's RSA public key and the password XOR the nonce, RSA-OAEP),
  over a scripted in-memory stream, no socket;
- statement choice by server version (SHOW BINARY LOG STATUS, SHOW REPLICAS).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct

import pymysql
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hypothesis import given
from hypothesis import strategies as st

from cdc.errors import PositionError
from cdc.gtid import MysqlGtidSet
from cdc.server_version import ServerVersion, binlog_status_statement, replicas_statement
from cdc.source_events import RowInsert, TxBegin, TxCommit
from connectors.mysql.binlog_decoder import BinlogDecodeError, BinlogDecoder, parse_mysql_gtid
from connectors.mysql.binlog_protocol import decode_mysql_gtid_set, encode_mysql_gtid_set, mysql_gtid_dump_packet
from connectors.mysql.client import pymysql_args, tls_problem
from connectors.mysql.gtid_tagged import TaggedGtidError, read_tagged_gtid
from tests.unit import binlog_bytes as bb

UUID_A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
UUID_B = "0e11fa47-71ca-11e1-9e33-c80aa9429562"


# -- statement choice --------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, status, replicas",
    [
        ("8.4.0", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
        ("8.4.3-commercial", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
        ("9.1.0", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
        ("8.2.0", "SHOW BINARY LOG STATUS", "SHOW REPLICAS"),
        ("8.1.0", "SHOW MASTER STATUS", "SHOW REPLICAS"),
        ("8.0.36-0ubuntu0.22.04.1", "SHOW MASTER STATUS", "SHOW REPLICAS"),
        ("8.0.32-google", "SHOW MASTER STATUS", "SHOW REPLICAS"),
        ("8.0.35-27", "SHOW MASTER STATUS", "SHOW REPLICAS"),  # Percona
        ("8.0.22", "SHOW MASTER STATUS", "SHOW REPLICAS"),
        ("8.0.21", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
        ("5.7.19-log", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
        ("10.11.6-MariaDB-0+deb12u1", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
        ("11.4.2-MariaDB", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
        ("5.5.5-10.11.6-MariaDB", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
        ("", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS"),
    ],
)
def test_statements_follow_the_server_version(version, status, replicas):
    assert binlog_status_statement(version) == status
    assert replicas_statement(version) == replicas


def test_version_strings_parse():
    assert ServerVersion.parse("5.5.5-10.11.6-MariaDB") == ServerVersion("mariadb", 10, 11, 6)
    assert ServerVersion.parse("8.0.36-0ubuntu0.22.04.1") == ServerVersion("mysql", 8, 0, 36)
    assert str(ServerVersion.parse("8.4.0")) == "MySQL 8.4.0"


# -- COM_BINLOG_DUMP_GTID ----------------------------------------------------------------


def _interval_block(uuid: str, intervals: list[tuple[int, int]]) -> bytes:
    """One source of an encoded GTID set: uuid (16), n_intervals (8), [start, end + 1) (8 + 8)."""
    out = bytes.fromhex(uuid.replace("-", "")) + struct.pack("<Q", len(intervals))
    return out + b"".join(struct.pack("<QQ", lo, hi + 1) for lo, hi in intervals)


def test_com_binlog_dump_gtid_packet_one_source():
    packet = mysql_gtid_dump_packet(f"{UUID_A}:1-5:7", server_id=42, blocking=True)
    data = struct.pack("<Q", 1) + _interval_block(UUID_A, [(1, 5), (7, 7)])
    expected = (
        b"\x1e"  # COM_BINLOG_DUMP_GTID
        + b"\x04\x00"  # flags: BINLOG_THROUGH_GTID
        + b"\x2a\x00\x00\x00"  # server_id 42
        + b"\x00\x00\x00\x00"  # binlog-filename-len 0 (no name)
        + b"\x04\x00\x00\x00\x00\x00\x00\x00"  # binlog-pos 4
        + struct.pack("<I", len(data))
        + data
    )
    assert packet == expected
    assert len(data) == 8 + 16 + 8 + 2 * 16


def test_com_binlog_dump_gtid_packet_non_blocking_two_sources():
    packet = mysql_gtid_dump_packet(f"{UUID_A}:1-100,{UUID_B}:3", server_id=7, blocking=False)
    assert packet[:1] == b"\x1e"
    flags, server_id, name_len = struct.unpack_from("<HII", packet, 1)
    assert (flags, server_id, name_len) == (0x04 | 0x01, 7, 0)
    pos, size = struct.unpack_from("<QI", packet, 11)
    data = packet[23:]
    assert pos == 4 and size == len(data)
    assert struct.unpack_from("<Q", data)[0] == 2
    blocks = {data[8 : 8 + 40], data[48 : 48 + 40]}  # the order of sources is free
    assert blocks == {_interval_block(UUID_A, [(1, 100)]), _interval_block(UUID_B, [(3, 3)])}


def test_com_binlog_dump_gtid_packet_with_a_tagged_set():
    """MySQL 8.3+ encodes a set holding a tagged GTID in its tagged format
    (sql/rpl_gtid_set.cc `encode_nsids_format`, `Gtid_set::encode`; libs/mysql/gtid/tsid.cpp
    `Tsid::encode_tsid`): the 8-byte count is format 1 in its top byte and its low byte
    and the number of TSIDs (uuid + tag) in the 6 bytes between; each TSID is its uuid and
    its tag as the serialization library writes a string (the length as a variable-length
    integer, length << 1 in one byte, then the characters; an untagged TSID: length 0),
    in (uuid, tag) order, then its intervals as before."""
    packet = mysql_gtid_dump_packet(f"{UUID_A}:1-5:Tag1:1-3:7,{UUID_B}:3", server_id=42)
    data = packet[23:]
    assert struct.unpack_from("<I", packet, 19)[0] == len(data)
    expected = (
        bytes([0x01, 0x03, 0, 0, 0, 0, 0, 0x01])  # format 1, 3 TSIDs, format 1
        + bytes.fromhex(UUID_B.replace("-", "")) + b"\x00" + struct.pack("<Q", 1) + struct.pack("<QQ", 3, 4)
        + bytes.fromhex(UUID_A.replace("-", "")) + b"\x00" + struct.pack("<Q", 1) + struct.pack("<QQ", 1, 6)
        + bytes.fromhex(UUID_A.replace("-", "")) + b"\x08tag1" + struct.pack("<Q", 2)
        + struct.pack("<QQ", 1, 4) + struct.pack("<QQ", 7, 8)
    )  # fmt: skip
    assert data == expected


def test_an_encoded_tagged_set_and_a_previous_gtids_body_decode():
    """`decode_mysql_gtid_set` reads what `Gtid_set::encode` writes: the packet's data above,
    and a Previous_gtids body (type 35, the same encoding; MySQL 8.0, untagged)."""
    tagged = mysql_gtid_dump_packet(f"{UUID_A}:1-5:Tag1:1-3:7,{UUID_B}:3", server_id=42)[23:]
    assert str(decode_mysql_gtid_set(tagged)) == f"{UUID_B}:3,{UUID_A}:1-5:tag1:1-3:7"
    previous = struct.pack("<Q", 2) + _interval_block(UUID_B, [(1, 9)]) + _interval_block(UUID_A, [(1, 5), (7, 7)])
    assert str(decode_mysql_gtid_set(previous)) == f"{UUID_B}:1-9,{UUID_A}:1-5:7"
    assert not decode_mysql_gtid_set(struct.pack("<Q", 0))


@pytest.mark.parametrize(
    "data, problem",
    [
        (struct.pack("<Q", 2 << 56), "format 2"),
        (struct.pack("<Q", 1) + _interval_block(UUID_A, [(5, 7), (1, 2)]), r"interval \[1, 3\) after 8"),
        (struct.pack("<Q", 1) + _interval_block(UUID_A, [(1, 2)]) + b"\x00", "1 bytes after"),
        (struct.pack("<Q", 2) + _interval_block(UUID_A, [(1, 2)]), "a source uuid cut short"),
        (
            bytes([1, 1, 0, 0, 0, 0, 0, 1])
            + bytes.fromhex(UUID_A.replace("-", ""))
            + b"\x089tag"
            + struct.pack("<QQQ", 1, 1, 2),
            "9tag",
        ),
    ],
)
def test_a_malformed_encoded_gtid_set_is_refused(data, problem):
    with pytest.raises(PositionError, match=problem):
        decode_mysql_gtid_set(data)


_tsids = st.tuples(st.sampled_from([UUID_A, UUID_B]), st.sampled_from(["", "a", "tag_1", "z" * 32]))


@given(st.lists(st.tuples(_tsids, st.integers(1, 40)), max_size=20))
def test_encoded_gtid_sets_round_trip(gtids):
    s = MysqlGtidSet()
    for (uuid, tag), n in gtids:
        s = s.add(f"{uuid}:{tag}:{n}" if tag else f"{uuid}:{n}")
    assert decode_mysql_gtid_set(encode_mysql_gtid_set(s)) == s


# -- MySQL 8.0 Gtid_log_event ------------------------------------------------------------


def _gtid80_body(
    gno: int, immediate_us: int, original_us: int | None, tx_length: int, server: int, original_server: int | None
) -> bytes:
    body = b"\x00" + bytes.fromhex(UUID_A.replace("-", "")) + struct.pack("<Q", gno)
    body += b"\x02" + struct.pack("<QQ", gno - 1, gno)  # LOGICAL_TIMESTAMP_TYPECODE, last_committed, sequence_number
    if original_us is None:
        body += immediate_us.to_bytes(7, "little")
    else:
        body += (immediate_us | 1 << 55).to_bytes(7, "little") + original_us.to_bytes(7, "little")
    body += (b"\xfc" + struct.pack("<H", tx_length)) if tx_length >= 251 else bytes([tx_length])
    if original_server is None:
        body += struct.pack("<I", server)
    else:
        body += struct.pack("<I", server | 0x80000000) + struct.pack("<I", original_server)
    return body + struct.pack("<Q", 0)  # commit_group_ticket (8.0.33+): read past


@pytest.mark.parametrize("original_us, original_server", [(None, None), (1_700_000_000_123_000, 80036)])
def test_a_mysql_80_gtid_event_with_commit_timestamps(original_us, original_server):
    immediate = 1_700_000_001_654_321
    ev = bb.event(33, _gtid80_body(9, immediate, original_us, 300, 80400, original_server), log_pos=4 + 19 + 200)
    g = parse_mysql_gtid(ev)
    assert g.gtid == f"{UUID_A}:9"
    assert (g.last_committed, g.sequence_number) == (8, 9)
    assert g.immediate_commit_us == immediate
    assert g.original_commit_us == (immediate if original_us is None else original_us)
    assert g.transaction_length == 300
    assert g.immediate_server_version == 80400
    assert g.original_server_version == (80400 if original_server is None else original_server)


def test_a_mysql_56_gtid_event_without_the_logical_clock():
    ev = bb.event(33, b"\x01" + bytes.fromhex(UUID_A.replace("-", "")) + struct.pack("<Q", 3), log_pos=100)
    g = parse_mysql_gtid(ev)
    assert g.gtid == f"{UUID_A}:3" and g.last_committed is None and g.immediate_commit_us is None


def test_a_transaction_opened_by_a_mysql_80_gtid_event_decodes():
    log = bb.Binlog()
    log.add(33, _gtid80_body(5, 1_700_000_000_000_001, None, 120, 80400, None))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, bb.write_rows_body([("e-1", b"{}", 1)]))
    log.add(16, bb.xid_body(11))
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    begins = [e for e in out if isinstance(e, TxBegin)]
    assert begins[0].gtid == f"{UUID_A}:5"  # (the BEGIN after it is a TxBegin without one)
    assert begins[0].start.pos == log.starts[0] and begins[0].end.pos == log.starts[1]
    assert [e.values["id"] for e in out if isinstance(e, RowInsert)] == ["e-1"]
    assert [e.end.pos for e in out if isinstance(e, TxCommit)] == [log.pos]


# -- MySQL 8.4 Gtid_tagged_log_event ------------------------------------------------------

# The body (no header, no checksum) of a Gtid_tagged_log_event as Percona Server 8.4.11-11
# wrote it for GTID 77d1902c-01da-11f1-9a41-908d6e5f6e8d:test_tag:1 (a 337-byte
# transaction), published as a test fixture of a binlog tail scanner.
REAL_TAGGED_BODY = bytes.fromhex(
    "027c00"  # format version 1, size 62, last_non_ignorable_field_id 0
    "0002"  # 0 gtid_flags 1
    "02ee450341025802690322c50369028241023502dcbedc3502"  # 1 uuid, a varlen a byte
    "0404"  # 2 gno 1 (signed)
    "0610746573745f746167"  # 3 tag: length 8, "test_tag"
    "0800"  # 4 last_committed 0
    "0a04"  # 5 sequence_number 1
    "0c7f003e8900fa5b06"  # 6 immediate_commit_timestamp (8 bytes)
    "104505"  # 8 transaction_length 337 (original_commit_timestamp left out: the same)
    "12dbd009"  # 9 immediate_server_version 80411
)
REAL_UUID = "77d1902c-01da-11f1-9a41-908d6e5f6e8d"


def test_a_tagged_gtid_event_as_mysql_84_wrote_it():
    g = read_tagged_gtid(REAL_TAGGED_BODY)
    assert g.gtid == f"{REAL_UUID}:test_tag:1"
    assert (g.uuid, g.tag, g.gno) == (REAL_UUID, "test_tag", 1)
    assert (g.last_committed, g.sequence_number) == (0, 1)
    assert g.transaction_length == 337
    assert g.immediate_server_version == g.original_server_version == 80411
    assert g.immediate_commit_us == g.original_commit_us == 0x065BFA00893E00  # 8 bytes: 0x7f, then 7
    assert g.flags == 1 and g.commit_group_ticket == 0


def test_the_fixture_builder_writes_what_mysql_84_wrote():
    body = bb.tagged_gtid_body(
        bytes.fromhex(REAL_UUID.replace("-", "")), "test_tag", 1, 0, 1, 0x065BFA00893E00, 337, 80411, flags=1
    )
    assert body == REAL_TAGGED_BODY


def test_a_replicas_tagged_gtid_event_with_every_optional_field():
    body = bb.tagged_gtid_body(
        bytes.fromhex(UUID_A.replace("-", "")), "domain_1", (1 << 63) - 2, 41, 42, 1_700_000_001_654_321, 70_000,
        90100, original_us=1_700_000_000_123_000, original_server_version=80400, commit_group_ticket=7,
    )  # fmt: skip
    g = read_tagged_gtid(body)
    assert g.gtid == f"{UUID_A}:domain_1:{(1 << 63) - 2}"  # a gno of 9 bytes
    assert (g.last_committed, g.sequence_number, g.transaction_length) == (41, 42, 70_000)
    assert (g.immediate_commit_us, g.original_commit_us) == (1_700_000_001_654_321, 1_700_000_000_123_000)
    assert (g.immediate_server_version, g.original_server_version, g.commit_group_ticket) == (90100, 80400, 7)


def test_a_newer_servers_extra_field_is_skipped_unless_it_must_be_read():
    uuid = bytes.fromhex(UUID_A.replace("-", ""))
    extra = bb.varlen(12) + bb.varlen(123456)
    g = read_tagged_gtid(bb.tagged_gtid_body(uuid, "t", 5, 0, 1, 1, 100, 80400, extra_fields=extra))
    assert g.gtid == f"{UUID_A}:t:5" and g.transaction_length == 100
    needed = bb.tagged_gtid_body(uuid, "t", 5, 0, 1, 1, 100, 80400, extra_fields=extra, last_non_ignorable=13)
    with pytest.raises(TaggedGtidError, match="field 12 must be read"):
        read_tagged_gtid(needed)


@pytest.mark.parametrize(
    "body, problem",
    [
        (REAL_TAGGED_BODY[:40], "says 62 bytes"),
        (b"\x04" + REAL_TAGGED_BODY[1:], "format version 2"),
        (REAL_TAGGED_BODY[:1] + bb.varlen(12) + REAL_TAGGED_BODY[2:12], "cut short"),
    ],
)
def test_a_malformed_tagged_gtid_event_is_refused(body, problem):
    with pytest.raises(TaggedGtidError, match=problem):
        read_tagged_gtid(body)


def _tagged_transaction(tag: str, gno: int) -> bb.Binlog:
    log = bb.Binlog()
    uuid = bytes.fromhex(UUID_A.replace("-", ""))
    log.add(42, bb.tagged_gtid_body(uuid, tag, gno, 0, 1, 1_700_000_000_000_001, 200, 80400))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, bb.write_rows_body([("e-1", b"{}", 1)]))
    log.add(16, bb.xid_body(11))
    return log


def test_a_transaction_opened_by_a_tagged_gtid_event_decodes_as_by_a_gtid_event():
    log = _tagged_transaction("Tag_A", 5)
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    begins = [e for e in out if isinstance(e, TxBegin)]
    assert begins[0].gtid == f"{UUID_A}:tag_a:5"
    assert not begins[0].standalone and not begins[0].opens
    assert begins[0].start.pos == log.starts[0] and begins[0].end.pos == log.starts[1]
    assert [e.values["id"] for e in out if isinstance(e, RowInsert)] == ["e-1"]
    assert [e.end.pos for e in out if isinstance(e, TxCommit)] == [log.pos]


def test_a_malformed_tagged_gtid_event_stops_the_decoder_naming_it():
    log = bb.Binlog()
    log.add(42, REAL_TAGGED_BODY[:40])
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    with pytest.raises(BinlogDecodeError, match=r"Gtid_tagged_log_event at binlog.000001:4: .*says 62 bytes"):
        dec.decode(log.events[0], [])


def test_the_library_decoder_reads_a_tagged_gtid_event_with_the_relays_reader():
    """`source.decoder = "library"`: python-mysql-replication hands type 42 over as a
    NotImplementedEvent; LibraryConverter reads it into the TxBegin the fast decoder gives."""
    from types import SimpleNamespace

    from pymysql.protocol import MysqlPacket
    from pymysqlreplication.event import NotImplementedEvent
    from pymysqlreplication.packet import BinLogPacketWrapper

    from connectors.mysql.binlog_library import LibraryConverter

    log = _tagged_transaction("Tag_A", 5)
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")
    wrapper = BinLogPacketWrapper(
        MysqlPacket(b"\x00" + log.events[0], "utf8"), {}, ctl, (8, 4, 0), True, frozenset([NotImplementedEvent]),
        None, None, None, None, False, False, True, True, False,
    )  # fmt: skip
    out: list = []
    LibraryConverter({(bb.SCHEMA, bb.TABLE)}, "binlog.000001").convert(wrapper.event, out)
    fast: list = []
    BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql").decode(log.events[0], fast)
    assert out == fast and out[0].gtid == f"{UUID_A}:tag_a:5"


def test_the_library_decoder_refuses_a_tagged_gtid_start_in_one_line():
    from cdc.errors import ConfigError
    from cdc.gtid import MysqlGtidSet
    from connectors.mysql.binlog_library import open_library_stream

    with pytest.raises(ConfigError, match='use source.decoder = "fast"'):
        open_library_stream({}, 99, set(), 5.0, MysqlGtidSet.parse(f"{UUID_A}:1-3:blue:1"))


# -- MySQL binary JSON -------------------------------------------------------------------


def _json_table_map() -> bytes:
    """id VARCHAR(64) NOT NULL, payload JSON NULL: JSON is type 245, its metadata one
    byte, the size of the value's length (4)."""
    types = bytes([15, 245])
    meta = struct.pack("<H", 256) + b"\x04"
    names = b"".join(bb.lenenc(len(c)) + c.encode() for c in ("id", "payload"))
    optional = b"\x04" + bb.lenenc(len(names)) + names
    return (
        struct.pack("<Q", bb.TABLE_ID)[:6]
        + b"\x01\x00"
        + bytes([len(bb.SCHEMA)])
        + bb.SCHEMA.encode()
        + b"\x00"
        + bytes([len(bb.TABLE)])
        + bb.TABLE.encode()
        + b"\x00"
        + bb.lenenc(2)
        + types
        + bb.lenenc(len(meta))
        + meta
        + b"\x02"
        + optional
    )


def _json_row(event_id: str, jsonb: bytes | None) -> bytes:
    head = struct.pack("<Q", bb.TABLE_ID)[:6] + b"\x01\x00" + b"\x02\x00" + bb.lenenc(2) + b"\x03"
    nulls = 2 if jsonb is None else 0
    row = bytes([nulls]) + struct.pack("<H", len(event_id)) + event_id.encode()
    if jsonb is not None:
        row += struct.pack("<I", len(jsonb)) + jsonb
    return head + row


# {"n": 1, "ok": true, "tag": "é"} as json_binary.h lays a small object out: type 0x00;
# element count (2), size (2); key entries (offset 2, length 2) in key order (by length,
# then bytes); value entries (type 1, inlined value or offset 2); keys; values.
# Offsets count from the byte after the type byte.
_OBJECT = (
    b"\x00"
    + struct.pack("<HH", 3, 34)  # 3 members, 34 bytes
    + struct.pack("<HH", 25, 1)
    + struct.pack("<HH", 26, 2)
    + struct.pack("<HH", 28, 3)  # n, ok, tag
    + b"\x05"
    + struct.pack("<H", 1)  # int16 1, inlined
    + b"\x04"
    + struct.pack("<H", 1)  # literal true, inlined
    + b"\x0c"
    + struct.pack("<H", 31)  # string at 31
    + b"n"
    + b"ok"
    + b"tag"
    + b"\x02"
    + "é".encode()
)  # length 2, utf8mb4
# [1, null, [2], "x"] as a small array: count, size, value entries, then the nested
# array and the string.
_NESTED = struct.pack("<HH", 1, 7) + b"\x05" + struct.pack("<H", 2)  # [2]: 7 bytes
_ARRAY = (
    b"\x02"
    + struct.pack("<HH", 4, 16 + len(_NESTED) + 2)
    + b"\x05"
    + struct.pack("<H", 1)  # 1
    + b"\x04"
    + struct.pack("<H", 0)  # null
    + b"\x02"
    + struct.pack("<H", 16)  # small array at 16
    + b"\x0c"
    + struct.pack("<H", 16 + len(_NESTED))  # string after it
    + _NESTED
    + b"\x01x"
)


@pytest.mark.parametrize(
    "jsonb, text",
    [
        (_OBJECT, '{"n": 1, "ok": true, "tag": "é"}'),  # MySQL's own text: ", " and ": ", utf8 as is
        (_ARRAY, '[1, null, [2], "x"]'),
        (b"\x04\x02", "false"),  # a literal on its own
        (b"\x0b" + struct.pack("<d", 2.5), "2.5"),  # a double
    ],
)
def test_mysql_binary_json_is_published_as_json_text(jsonb, text):
    assert len(_OBJECT) == 1 + 34 and len(_ARRAY) == 1 + 25
    log = bb.Binlog()
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, _json_table_map())
    log.add(30, _json_row("e-1", jsonb))
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    rows = [e for e in out if isinstance(e, RowInsert)]
    assert rows[0].values["payload"] == text
    assert json.loads(text) == json.loads(rows[0].values["payload"])


@pytest.mark.parametrize(
    "jsonb, text",
    [
        # {"t": TIME '87:31:46.654321'}: an opaque value (0x0f) of MySQL type TIME (11), its
        # 8 bytes TIME_to_longlong_time_packed (mysys/my_time.cc): hms << 24 | microseconds
        (
            b"\x00"
            + struct.pack("<HH", 1, 22)
            + struct.pack("<HH", 11, 1)
            + b"\x0f"
            + struct.pack("<H", 12)
            + b"t"
            + b"\x0b\x08"
            + struct.pack("<q", (((87 << 12) | (31 << 6) | 46) << 24) | 654321),
            '{"t": "87:31:46.654321"}',
        ),
        # {"d": DECIMAL(6,3) 123.456}: opaque NEWDECIMAL (246): precision, scale, then the
        # binary decimal (strings/decimal.cc decimal2bin: 3 integer digits in 2 bytes, big-endian,
        # the sign bit flipped, then 3 fraction digits in 2 bytes)
        (
            b"\x00"
            + struct.pack("<HH", 1, 20)
            + struct.pack("<HH", 11, 1)
            + b"\x0f"
            + struct.pack("<H", 12)
            + b"d"
            + b"\xf6\x06\x06\x03"  # DECIMAL, 6 bytes: precision 6, scale 3
            + struct.pack(">H", 0x8000 | 123)
            + struct.pack(">H", 456),
            '{"d": 123.456}',
        ),
    ],
)
def test_opaque_values_in_mysql_json_are_published_as_mysql_prints_them(jsonb, text):
    """A TIME over 24 hours raised an untyped ValueError from python-mysql-replication's
    parser; a DECIMAL came out as the string "123.456"."""
    log = bb.Binlog()
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, _json_table_map())
    log.add(30, _json_row("e-1", jsonb))
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    assert [e.values["payload"] for e in out if isinstance(e, RowInsert)] == [text]


def test_a_malformed_json_value_is_refused_naming_its_column():
    log = bb.Binlog()
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, _json_table_map())
    log.add(30, _json_row("e-1", b"\x0c\x09short"))
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001", flavor="mysql")
    with pytest.raises(BinlogDecodeError, match=r"column 'payload' of shop\.outbox .*JSON"):
        for ev in log.events:
            dec.decode(ev, [])


def test_a_json_structure_from_the_library_decoder_maps_to_text():
    """source.decoder = "library" hands over python-mysql-replication's structure, whose
    keys and strings are bytes: the mapping writes JSON text, not a crash."""
    from cdc.events.outbox import _payload_of

    assert _payload_of({b"n": 1, b"tag": "é".encode(), b"a": [b"x", None]}) == '{"n":1,"tag":"\\u00e9","a":["x",null]}'


# -- caching_sha2_password ---------------------------------------------------------------

NONCE = bytes(range(65, 85))  # 20 bytes of auth-plugin-data
PASSWORD = "s3cret-pw"
CAPS = 0x00000001 | 0x00000200 | 0x00008000 | 0x00080000 | 0x00200000  # LONG_PASSWORD, PROTOCOL_41,
#   SECURE_CONNECTION, PLUGIN_AUTH, PLUGIN_AUTH_LENENC_CLIENT_DATA (no CLIENT_SSL: the server offers no TLS)


def _greeting() -> bytes:
    """Protocol::HandshakeV10 of a MySQL 8.4 server with caching_sha2_password."""
    return (
        b"\x0a"
        + b"8.4.0\x00"
        + struct.pack("<I", 17)
        + NONCE[:8]
        + b"\x00"
        + struct.pack("<H", CAPS & 0xFFFF)
        + b"\xff"
        + struct.pack("<H", 0x0002)
        + struct.pack("<H", CAPS >> 16)
        + bytes([21])
        + b"\x00" * 10
        + NONCE[8:]
        + b"\x00"
        + b"caching_sha2_password\x00"
    )


OK = b"\x00\x00\x00\x02\x00\x00\x00"


class ScriptedServer(io.RawIOBase):
    """A connection's other end: `answer(client_payload, seq)` gives the server's packets
    for each client packet; PyMySQL reads through makefile(), writes with sendall()."""

    def __init__(self, answer):
        self._out = bytearray(self._frame(_greeting(), 0))
        self._answer = answer
        self.received: list[bytes] = []

    @staticmethod
    def _frame(payload: bytes, seq: int) -> bytes:
        return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload

    def sendall(self, data: bytes) -> None:
        while data:
            n = int.from_bytes(data[:3], "little")
            seq, payload, data = data[3], data[4 : 4 + n], data[4 + n :]
            self.received.append(payload)
            for i, packet in enumerate(self._answer(payload, len(self.received))):
                self._out += self._frame(packet, seq + 1 + i)

    def makefile(self, mode: str):
        return io.BufferedReader(self)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        del self._out[:n]
        return n

    def settimeout(self, _t) -> None:
        pass

    def setsockopt(self, *_a) -> None:
        pass

    def close(self) -> None:
        pass


def _auth_response(handshake_response: bytes) -> bytes:
    """The auth-response of a HandshakeResponse41: after capabilities (4), max packet
    (4), charset (1), 23 zero bytes and the NUL-terminated user; lenenc-prefixed."""
    p = 32
    p = handshake_response.index(b"\x00", p) + 1
    n = handshake_response[p]
    return handshake_response[p + 1 : p + 1 + n]


def _connect(server: ScriptedServer, mode: str = "disabled"):
    args = pymysql_args({"host": "db.example", "port": 3306, "user": "cdc", "password": PASSWORD, "tls_mode": mode})
    conn = pymysql.connections.Connection(**args, defer_connect=True, autocommit=None)
    conn.connect(sock=server)
    return conn


def test_caching_sha2_fast_authentication():
    def answer(payload: bytes, n: int):
        if n == 1:
            # XOR(SHA256(password), SHA256(SHA256(SHA256(password)) + nonce))
            p1 = hashlib.sha256(PASSWORD.encode()).digest()
            p3 = hashlib.sha256(hashlib.sha256(p1).digest() + NONCE).digest()
            assert _auth_response(payload) == bytes(a ^ b for a, b in zip(p1, p3))
            assert payload.rstrip(b"\x00").endswith(b"caching_sha2_password")
            return [b"\x01\x03", OK]  # fast_auth_success, then OK
        return [OK]

    server = ScriptedServer(answer)
    conn = _connect(server)
    assert conn.server_version == "8.4.0" and conn._auth_plugin_name == "caching_sha2_password"
    assert all(p[:1] == b"\x03" for p in server.received[1:])  # then queries (SET NAMES), no more auth


def test_caching_sha2_full_authentication_without_tls_uses_the_servers_rsa_key():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    seen: list[str] = []

    def answer(payload: bytes, n: int):
        if n == 1:
            return [b"\x01\x04"]  # perform_full_authentication
        if n == 2:
            assert payload == b"\x02"  # request_public_key (not the clear password: no TLS)
            return [b"\x01" + pem]
        if n == 3:
            clear = key.decrypt(
                payload, padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
            )
            text = bytes(c ^ NONCE[i % len(NONCE)] for i, c in enumerate(clear))
            seen.append(text.decode())
            return [OK]
        return [OK]

    server = ScriptedServer(answer)
    _connect(server)
    assert seen == [PASSWORD + "\x00"]
    assert PASSWORD.encode() not in b"".join(server.received)  # never in the clear


def test_required_tls_against_a_server_without_tls_is_refused_in_one_line():
    server = ScriptedServer(lambda payload, n: [OK])
    settings = {"host": "db.example", "port": 3306, "user": "cdc", "password": PASSWORD, "tls_mode": "required"}
    with pytest.raises(pymysql.err.OperationalError) as info:
        _connect(server, "required")
    line = tls_problem(info.value, settings)
    assert line is not None and "does not offer TLS" in line and "source.tls.mode" in line
    assert server.received == []  # nothing sent: no password, no SSLRequest
