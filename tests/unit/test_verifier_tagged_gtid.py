"""The verifier's own reading of MySQL 8.4's Gtid_tagged_log_event (type 42),
spark_jobs/mysql/binlog_tagged_gtid.py, which python-mysql-replication does not know: the
replication connection (spark_jobs/binlog_compressed.ExpandingConnection) hands the library
a Gtid_log_event in its place and keeps the tagged GTID on the packet, so the verifier's rows
carry `uuid:tag:gno`, the GTID the relay's `cdc.gtid` header carries. On byte fixtures from
tests/unit/binlog_bytes.py and the body a Percona Server 8.4.11 wrote (no MySQL server here)."""

from __future__ import annotations

import struct
import zlib
from collections import deque
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymysql.protocol import MysqlPacket
from pymysqlreplication.event import GtidEvent, QueryEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import TableMapEvent, WriteRowsEvent

from connectors.mysql.client import Connection
from connectors.mysql.gtid_tagged import TaggedGtidError, read_tagged_gtid
from spark_jobs.mysql.binlog_assembly import TxAssembler, mysql_commit_us
from spark_jobs.mysql.binlog_compressed import ExpandingConnection, _Format, event_start, tagged_gtid
from spark_jobs.mysql.binlog_tagged_gtid import TaggedGtidEventError, read_tagged
from tests.unit import binlog_bytes as bb
from tests.unit.test_mysql_protocol_bytes import REAL_TAGGED_BODY, REAL_UUID

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
SID = bytes.fromhex(U1.replace("-", ""))


def test_the_verifier_reads_the_body_mysql_84_wrote():
    ev = read_tagged(REAL_TAGGED_BODY)
    assert ev.gtid == f"{REAL_UUID}:test_tag:1"
    assert (ev.last_committed, ev.sequence_number, ev.flags) == (0, 1, 1)
    assert ev.commit_us == ev.original_commit_us == 0x065BFA00893E00


@pytest.mark.parametrize(
    "body",
    [
        bb.tagged_gtid_body(SID, "blue", 7, 5, 6, 1_700_000_000_000_001, 300, 80400),
        bb.tagged_gtid_body(SID, "Domain_1", (1 << 63) - 2, 41, 42, 1_700_000_001_654_321, 70_000, 90100,
                            original_us=1_700_000_000_123_000, original_server_version=80400, commit_group_ticket=9),
        bb.tagged_gtid_body(SID, "x", 3, 0, 1, 5, 10, 80400, extra_fields=bb.varlen(12) + bb.varlen(1 << 40)),
        REAL_TAGGED_BODY,
    ],
)  # fmt: skip
def test_the_verifier_and_the_relay_read_the_same_gtid_and_clock(body):
    verifier, relay = read_tagged(body), read_tagged_gtid(body)
    assert verifier.gtid == relay.gtid
    assert (verifier.last_committed, verifier.sequence_number) == (relay.last_committed, relay.sequence_number)
    assert (verifier.commit_us, verifier.original_commit_us) == (relay.immediate_commit_us, relay.original_commit_us)


@pytest.mark.parametrize(
    "body, problem",
    [
        (REAL_TAGGED_BODY[:30], "62 bytes"),
        (
            bb.tagged_gtid_body(SID, "t", 1, 0, 1, 1, 1, 1, extra_fields=bb.varlen(12), last_non_ignorable=13),
            "field 12",
        ),
        (bb.tagged_gtid_body(SID, "9t", 1, 0, 1, 1, 1, 1), "not a GTID tag"),
        (bb.tagged_gtid_body(SID, "t", 0, 0, 1, 1, 1, 1), "gno 0"),
        (bb.tagged_gtid_body(SID, "t", -3, 0, 1, 1, 1, 1), "gno -3"),
    ],
)
def test_what_does_not_add_up_is_refused(body, problem):
    with pytest.raises(TaggedGtidEventError, match=problem):
        read_tagged(body)
    with pytest.raises(TaggedGtidError):  # the relay's reader refuses it too
        read_tagged_gtid(body)


def _connection_over(events: list[bytes]) -> ExpandingConnection:
    """An ExpandingConnection after its dump command, its socket replaced by `events`."""
    conn = ExpandingConnection.__new__(ExpandingConnection)
    conn._binlog_format, conn._expanded, conn.encoding = _Format(), deque(), "utf8"
    feed = iter(events)
    conn._socket_packets = lambda: MysqlPacket(b"\x00" + next(feed), "utf8")  # type: ignore[attr-defined]
    return conn


def _library_events(events: list[bytes], monkeypatch) -> list:
    """python-mysql-replication's own classes on what the connection hands the library."""
    conn = _connection_over(events)
    monkeypatch.setattr(Connection, "_read_packet", lambda self, packet_type=MysqlPacket: self._socket_packets())
    allowed = frozenset([GtidEvent, QueryEvent, XidEvent, TableMapEvent, WriteRowsEvent])
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")
    table_map: dict = {}
    out = []
    for _ in events:
        wrapper = BinLogPacketWrapper(
            conn._read_packet(), table_map, ctl, (8, 4, 0), True, allowed,
            None, None, None, None, False, False, True, True, False,
        )  # fmt: skip
        if isinstance(wrapper.event, TableMapEvent):
            table_map[wrapper.event.table_id] = wrapper.event.get_table()
        out.append(wrapper)
    return out


def test_the_library_gets_a_gtid_event_and_the_verifier_the_tagged_gtid(monkeypatch):
    log = bb.Binlog()
    log.add(42, bb.tagged_gtid_body(SID, "Blue", 7, 5, 6, 1_700_000_000_000_001, 300, 80400))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, bb.write_rows_body([("e-1", b"{}", 1)]))
    log.add(16, bb.xid_body(11))
    wrappers = _library_events(log.events, monkeypatch)
    gtid_event = wrappers[0].event
    assert isinstance(gtid_event, GtidEvent) and gtid_event.gtid == f"{U1}:7"  # the library's own reading
    assert tagged_gtid(wrappers[0]) == f"{U1}:blue:7"
    assert all(tagged_gtid(w) is None for w in wrappers[1:])
    # where the stored event starts and ends, as the relay's headers name them
    assert event_start(wrappers[0]) == log.starts[0] and wrappers[0].log_pos == log.starts[1]
    assert (gtid_event.last_committed, gtid_event.sequence_number) == (5, 6)
    # the commit time the verifier reads after the library's fields (binlog_readers.read_binlog_file)
    assert mysql_commit_us(gtid_event.packet.read(gtid_event.event_size - 42)) == 1_700_000_000_000_001
    raw = wrappers[0].packet.get_all_data()[1:]
    assert raw[4] == 33 and zlib.crc32(raw[:-4]) == struct.unpack("<I", raw[-4:])[0]
    # the verifier's rows of that transaction carry the tagged GTID
    asm = TxAssembler(id_columns={(bb.SCHEMA, bb.TABLE): "id"})
    asm.gtid_event(event_start(wrappers[0]), tagged_gtid(wrappers[0]) or gtid_event.gtid, 1)
    asm.begin(log.starts[1], 1)
    asm.add_rows(bb.SCHEMA, bb.TABLE, [{"id": "e-1"}], log.starts[3])
    tx = asm.commit(log.pos, 1_700_000_000)
    assert tx is not None and tx.gtid == f"{U1}:blue:7" and tx.start == log.starts[0]


def test_a_malformed_tagged_gtid_event_fails_the_read_naming_it(monkeypatch):
    log = bb.Binlog()
    log.add(42, REAL_TAGGED_BODY[:30])
    with pytest.raises(TaggedGtidEventError, match=f"ending at {log.pos}: .*62 bytes"):
        _library_events(log.events, monkeypatch)


@given(
    gno=st.integers(1, (1 << 63) - 2),
    clock=st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 63), (1 << 63) - 1)),
    commit=st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)),
    length=st.integers(0, (1 << 64) - 1),
    tag=st.from_regex(r"[a-z_][a-z0-9_]{0,31}", fullmatch=True),
    sid=st.binary(min_size=16, max_size=16),
)
def test_both_readers_read_back_every_value_the_builder_writes(gno, clock, commit, length, tag, sid):
    """Every width of MySQL's variable-length integers (1 to 9 bytes, signed and not)."""
    body = bb.tagged_gtid_body(sid, tag, gno, clock[0], clock[1], commit[0], length, 80400, original_us=commit[1])
    verifier, relay = read_tagged(body), read_tagged_gtid(body)
    assert (verifier.sid, verifier.tag, verifier.gno) == (sid, tag, gno)
    assert (verifier.last_committed, verifier.sequence_number) == clock
    assert (verifier.commit_us, verifier.original_commit_us) == commit
    assert (relay.tag, relay.gno, relay.last_committed, relay.sequence_number) == (tag, gno, *clock)
    assert (relay.immediate_commit_us, relay.original_commit_us, relay.transaction_length) == (*commit, length)
    assert relay.gtid == verifier.gtid
