"""The MySQL lab's binlog writer (testbed/mysql_lab/binlog_writer.py): files written and read
back with decoders that share no code with it: python-mysql-replication's event classes
(fed the file's events as packets, the verifier's expansion for Transaction_payload), the
relay's `connectors.mysql.binlog_decoder.BinlogDecoder`, `mariadb-binlog -vv` (MySQL 8 files of
tables without JSON, which MariaDB cannot print), and readers written here from MySQL's
documented layouts (binary JSON, TIME2, the serialization library). Every event's CRC32 and
end position are checked on every file written."""

from __future__ import annotations

import datetime
import decimal
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.source_events import RowChange, RowInsert, TxBegin, TxCommit, XaCommit, XaPrepare, XaRollback
from connectors.mysql.binlog_decoder import BinlogDecoder
from spark_jobs.mysql.binlog_compressed import _Format, expand_event
from testbed.mysql_lab.binlog_writer import Column, JsonDiff, MysqlBinlogWriter, Xid
from testbed.mysql_lab.column_values import parse_column_type, time2
from testbed.mysql_lab.gtids import GtidSet, varlen_int, varlen_uint
from testbed.mysql_lab.json_binary import JsonDecimal, JsonOpaque, JsonTimestamp, JsonUInt, encode_json
from tests.unit import binlog_bytes as bb

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
FILE = "binlog.000001"

# -- readers ------------------------------------------------------------------------------


def file_events(path: Path) -> list[bytes]:
    """The events of a binlog file, each checked: sizes chain from 4, log_pos is the end,
    the CRC32 (a Format_description's with LOG_EVENT_BINLOG_IN_USE_F cleared) matches.
    Returned as a dump thread sends them: the Format_description with that flag cleared
    (rpl_binlog_sender.cc), so its checksum holds for a reader."""
    data = path.read_bytes()
    assert data[:4] == b"\xfebin"
    out, pos = [], 4
    while pos < len(data):
        size, log_pos = struct.unpack_from("<II", data, pos + 9)
        raw = data[pos : pos + size]
        assert len(raw) == size and log_pos == pos + size, f"event at {pos}"
        covered = bytearray(raw[:-4])
        if raw[4] == 15:
            covered[17] &= 0xFE
        assert zlib.crc32(bytes(covered)) == struct.unpack("<I", raw[-4:])[0], f"CRC of the event at {pos}"
        out.append(bytes(covered) + raw[-4:])
        pos += size
    return out


def relay_decode(raws: list[bytes], watched=frozenset({("shop", "outbox")}), table_columns=None) -> list:
    dec = BinlogDecoder(set(watched), FILE, flavor="mysql", verify_checksum=True, table_columns=table_columns)
    out: list = []
    for raw in raws:
        dec.decode(raw, out)
    return out


def library_events(raws: list[bytes]) -> list:
    """python-mysql-replication's classes on each event (a Transaction_payload expanded as
    the verifier's connection does)."""
    from pymysqlreplication.event import GtidEvent, QueryEvent, XAPrepareEvent, XidEvent
    from pymysqlreplication.row_event import (
        DeleteRowsEvent,
        PartialUpdateRowsEvent,
        TableMapEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    allowed = frozenset(
        [GtidEvent, QueryEvent, XidEvent, XAPrepareEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent]
        + [DeleteRowsEvent, PartialUpdateRowsEvent]
    )
    fmt, table_map, out = _Format(), {}, []
    for raw in raws:
        for e, _ in expand_event(raw, fmt) or [(raw, None)]:
            event = bb.library_event(e, table_map, allowed).event
            if event is not None:
                out.append(event)
    return out


def plain(value):
    """The library's JSON (bytes for strings and keys) as str."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def read_json(data: bytes):
    """A reader of MySQL's binary JSON written here from json_binary.h: (type, value) with
    opaque values as ("opaque", field type, bytes) and unsigned ints as ("u", n)."""
    return _json_value(data[0], data, 1)


def _json_value(kind: int, data: bytes, at: int):
    if kind in (0, 1, 2, 3):
        large = kind in (1, 3)
        w = 4 if large else 2
        fmt = "<I" if large else "<H"
        count = struct.unpack_from(fmt, data, at)[0]
        size = struct.unpack_from(fmt, data, at + w)[0]
        assert at + size <= len(data)
        is_object = kind in (0, 1)
        entries = at + 2 * w + (count * (w + 2) if is_object else 0)
        keys = []
        for i in range(count if is_object else 0):
            off, ln = struct.unpack_from(fmt + "H", data, at + 2 * w + i * (w + 2))
            keys.append(data[at + off : at + off + ln].decode())
        values = []
        for i in range(count):
            e = entries + i * (1 + w)
            t = data[e]
            if t in (4, 5, 6) or (large and t in (7, 8)):
                values.append(_json_value(t, data, e + 1))
            else:
                values.append(_json_value(t, data, at + struct.unpack_from(fmt, data, e + 1)[0]))
        if is_object:
            assert keys == sorted(keys, key=lambda k: (len(k.encode()), k.encode()))
            return dict(zip(keys, values, strict=True))
        return values
    if kind == 4:
        return {0: None, 1: True, 2: False}[data[at]]
    sizes = {5: "<h", 6: "<H", 7: "<i", 8: "<I", 9: "<q", 10: "<Q", 11: "<d"}
    if kind in sizes:
        v = struct.unpack_from(sizes[kind], data, at)[0]
        return ("u", v) if kind in (6, 8, 10) else v
    n, shift, p = 0, 0, at + (1 if kind == 15 else 0)
    while True:
        b = data[p]
        n |= (b & 0x7F) << shift
        shift += 7
        p += 1
        if not b & 0x80:
            break
    if kind == 12:
        return data[p : p + n].decode()
    assert kind == 15, kind
    return ("opaque", data[at], data[p : p + n])


def as_written(value):
    """What read_json gives for a value encode_json took."""
    if isinstance(value, bool) or value is None or isinstance(value, float | str):
        return value
    if isinstance(value, int):
        return value if value <= (1 << 63) - 1 else ("u", value)
    if isinstance(value, dict):
        return {k: as_written(v) for k, v in value.items()}
    return [as_written(v) for v in value]


# -- Format_description, files, index, sidecar, lab_state ----------------------------------


def simple_writer(tmp_path, **kw) -> MysqlBinlogWriter:
    w = MysqlBinlogWriter(tmp_path / "lab", server_uuid=UUID, **kw)
    w.create_table(
        "shop",
        "outbox",
        [Column("id", "varchar(64)", nullable=False, key="PRI"), Column("payload", "json"), Column("n", "int")],
    )
    return w


@pytest.mark.parametrize(
    "version, types, rows_v1", [("8.0.40", 41, 8), ("8.4.3", 42, 0), ("9.1.0", 42, 0)], ids=["8.0", "8.4", "9.1"]
)
def test_format_description_as_each_version_writes_it(tmp_path, version, types, rows_v1):
    """control_events.cpp: the post-header table (v1 rows 0 from 8.4.0), 40 at
    TRANSACTION_PAYLOAD's entry, CRC32 algorithm byte, the in-use flag while active."""
    w = simple_writer(tmp_path, version=version)
    fde = file_events(w.current_file)[0]
    body = fde[19:-4]
    assert fde[4] == 15 and struct.unpack_from("<H", body)[0] == 4
    assert body[2:52].rstrip(b"\x00").decode() == version and body[56] == 19
    table = body[57:-1]
    assert len(table) == types and body[-1] == 1
    assert list(table[22:25]) == [rows_v1] * 3
    assert table[18] == 8 and list(table[29:32]) == [10, 10, 10] and table[32] == 42 and table[38] == 10
    assert table[39] == 40 and table[14] == 57 + types
    assert w.current_file.read_bytes()[4 + 17] & 1  # LOG_EVENT_BINLOG_IN_USE_F: the active file


def test_the_relay_reads_a_mysql_8_0_file(tmp_path):
    w = simple_writer(tmp_path, version="8.0.40")
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "payload": {"a": 1}, "n": 7}])
    out = relay_decode(file_events(w.current_file))
    # The lab's first file is the one its server start opened (Format_description `created` set).
    assert [type(e).__name__ for e in out] == ["ServerStarted", "TxBegin", "TxBegin", "RowInsert", "TxCommit"]
    assert out[1].gtid == f"{UUID}:1" and out[3].values == {"id": "e1", "payload": '{"a": 1}', "n": 7}


@pytest.mark.parametrize("version", ["8.4.3", "9.1.0"])
def test_the_relay_reads_a_mysql_8_4_and_9_file(tmp_path, version):
    w = simple_writer(tmp_path, version=version)
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "payload": None, "n": 7}])
    out = relay_decode(file_events(w.current_file))
    assert [e.values for e in out if isinstance(e, RowInsert)] == [{"id": "e1", "payload": None, "n": 7}]


def test_files_index_sidecar_and_state(tmp_path):
    w = simple_writer(tmp_path, version="8.4.3")
    starts = []
    for i in range(3):
        starts.append(w.position()[1])
        with w.transaction(tag="blue" if i == 1 else None) as tx:
            tx.insert("shop", "outbox", [{"id": f"e{i}", "n": i}])
    end = w.position()
    w.rotate()
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e9"}])
    lab = tmp_path / "lab"
    assert (lab / "binlog.index").read_text() == "./binlog.000001\n./binlog.000002\n"
    lines = (lab / "binlog.000001.gtids").read_text().splitlines()
    assert lines == [
        "# previous ",
        f"{UUID}:1 {starts[0]} {starts[1]}",
        f"{UUID}:blue:1 {starts[1]} {starts[2]}",
        f"{UUID}:2 {starts[2]} {end[1]}",
    ]
    assert (lab / "binlog.000002.gtids").read_text().splitlines()[0] == f"# previous {UUID}:1-2:blue:1"
    old = file_events(lab / "binlog.000001")
    assert old[-1][4] == 4 and old[-1][19:27] == struct.pack("<Q", 4) and old[-1][27:-4] == b"binlog.000002"
    assert not (lab / "binlog.000001").read_bytes()[4 + 17] & 1  # closed: in-use flag cleared, CRC still right
    new = file_events(lab / "binlog.000002")
    assert [e[4] for e in new] == [15, 35, 33, 2, 19, 30, 16] and w.position() == (
        "binlog.000002",
        len((lab / "binlog.000002").read_bytes()),
    )
    state = json.loads((lab / "lab_state.json").read_text())
    assert state["gtid_executed"] == f"{UUID}:1-3:blue:1" and state["server_uuid"] == UUID
    assert state["variables"]["binlog_row_metadata"] == "FULL" and state["variables"]["gtid_mode"] == "ON"
    assert state["tables"]["shop.outbox"][0] == {
        "name": "id",
        "ordinal": 1,
        "column_type": "varchar(64)",
        "data_type": "varchar",
        "nullable": False,
        "character_set": "utf8mb4",
        "key": "PRI",
    }
    assert state["tables"]["shop.outbox"][1]["character_set"] is None


def test_lab_state_keeps_what_the_writer_does_not_own(tmp_path):
    """The lab writes lab_state.json before the writer starts; variables the writer does
    not own survive, the ones it does describe what it writes."""
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "lab_state.json").write_text(
        json.dumps({"server_version": "8.4.3", "variables": {"max_connections": "151", "binlog_row_metadata": "FULL"}})
    )
    w = MysqlBinlogWriter(lab, version="8.4.3", row_metadata="MINIMAL")
    with w.transaction() as tx:
        assert tx.statements == []
    variables = json.loads((lab / "lab_state.json").read_text())["variables"]
    assert variables["max_connections"] == "151" and variables["binlog_row_metadata"] == "MINIMAL"
    assert not list(lab.glob("*.tmp"))


def test_an_exception_inside_a_transaction_writes_nothing(tmp_path):
    w = simple_writer(tmp_path)
    before = w.current_file.read_bytes()
    with pytest.raises(RuntimeError), w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
        raise RuntimeError("rollback")
    assert w.current_file.read_bytes() == before and str(w.gtid_executed) == ""


def test_a_writer_refuses_a_directory_that_holds_a_binlog(tmp_path):
    simple_writer(tmp_path)
    with pytest.raises(FileExistsError, match="already holds a binlog"):
        MysqlBinlogWriter(tmp_path / "lab")


# -- GTID events -------------------------------------------------------------------------


def test_gtid_event_fields_and_transaction_length(tmp_path):
    """control_events.h Gtid_event: logical clock, 7-byte commit timestamp, transaction
    length (the GTID event included), server version; read by the library and here."""
    w = simple_writer(tmp_path, version="8.4.3")
    for _ in range(2):
        with w.transaction() as tx:
            tx.insert("shop", "outbox", [{"id": "e", "payload": {"k": "v" * 300}}])
    raws = file_events(w.current_file)
    gtids = [i for i, e in enumerate(raws) if e[4] == 33]
    lib = [e for e in library_events(raws) if type(e).__name__ == "GtidEvent"]
    assert [(g.gtid, g.last_committed, g.sequence_number) for g in lib] == [(f"{UUID}:1", 0, 1), (f"{UUID}:2", 1, 2)]
    for n, i in enumerate(gtids):
        body = raws[i][19:-4]
        p = 42
        ts = int.from_bytes(body[p : p + 7], "little")
        assert not ts & (1 << 55) and abs(ts / 1e6 - struct.unpack_from("<I", raws[i])[0]) < 2
        p += 7
        assert body[p] == 0xFC  # net_field_length of a length over 250
        length = struct.unpack_from("<H", body, p + 1)[0]
        stop = gtids[n + 1] if n + 1 < len(gtids) else len(raws)
        assert length == sum(len(e) for e in raws[i:stop])
        assert struct.unpack_from("<I", body, p + 3)[0] == 80403 and len(body) == p + 7


def serialization_message(data: bytes) -> dict[int, bytes]:
    """libs/mysql/serialization readme: <id 1 = format version> <size> <last
    non-ignorable id> {<field id> <data>}; returns field id -> raw field bytes."""

    def uint(p: int) -> tuple[int, int]:
        first = data[p]
        n = 0
        while n < 8 and first >> n & 1:
            n += 1
        if n == 8:
            return int.from_bytes(data[p + 1 : p + 9], "little"), p + 9
        return int.from_bytes(data[p : p + n + 1], "little") >> (n + 1), p + n + 1

    version, p = uint(0)
    size, p = uint(p)
    _last, p = uint(p)
    assert version == 1 and size == len(data)
    fields = {}
    sizes = {0: 1, 1: 16, 2: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1}
    while p < len(data):
        fid, p = uint(p)
        start = p
        if fid == 3:
            n, p = uint(p)
            p += n
        else:
            for _ in range(sizes[fid]):
                _, p = uint(p)
        fields[fid] = data[start:p]
    return fields


def test_tagged_gtid_event_and_previous_gtids(tmp_path):
    w = simple_writer(tmp_path, version="9.1.0")
    with w.transaction(tag="Blue_1") as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
    with w.transaction(tag="blue_1") as tx:
        tx.insert("shop", "outbox", [{"id": "e2"}])
    w.rotate()
    raws = file_events(w.current_file)
    assert raws[1][4] == 35
    body = raws[1][19:-4]
    assert struct.unpack_from("<Q", body)[0] == (1 << 56) | (1 << 8) | 1
    assert body[8:24] == bytes.fromhex(UUID.replace("-", "")) and body[24:31] == bytes([12]) + b"blue_1"
    assert struct.unpack_from("<QQQ", body, 31) == (1, 1, 3) and len(body) == 55
    old = file_events(tmp_path / "lab" / FILE)
    tagged = [e for e in old if e[4] == 42]
    assert len(tagged) == 2
    fields = serialization_message(tagged[1][19:-4])
    assert fields[3] == bytes([12]) + b"blue_1" and fields[2] == varlen_int(2)
    assert fields[1] == b"".join(varlen_uint(b) for b in bytes.fromhex(UUID.replace("-", "")))
    assert fields[0] == b"\x00" and fields[4] == varlen_int(1) and fields[5] == varlen_int(2)
    assert fields[9] == varlen_uint(90100) and 7 not in fields and 10 not in fields
    start = old.index(tagged[1])
    rest = old[start : next(i for i, e in enumerate(old) if e[4] == 4)]
    assert fields[8] == varlen_uint(sum(len(e) for e in rest))


def test_the_relay_names_a_tagged_gtid(tmp_path):
    w = simple_writer(tmp_path, version="8.4.3")
    with w.transaction(tag="blue") as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
    begins = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, TxBegin) and e.gtid]
    assert [b.gtid for b in begins] == [f"{UUID}:blue:1"]


def test_varlen_integers_match_the_serialization_readme():
    """The readme's examples: 65535 unsigned = 00000111 11111111 11111011 (big-endian
    drawing), signed 65535 / -65535 / -65536 likewise."""
    assert varlen_uint(65535) == bytes([0b11111011, 0xFF, 0b00000111])
    assert varlen_int(65535) == bytes([0b11110011, 0xFF, 0b00001111])
    assert varlen_int(-65535) == bytes([0b11101011, 0xFF, 0b00001111])
    assert varlen_int(-65536) == bytes([0b11111011, 0xFF, 0b00001111])
    assert varlen_uint(0) == b"\x00" and varlen_uint(127) == b"\xfe" and varlen_uint(128) == b"\x01\x02"
    assert varlen_uint((1 << 64) - 1) == b"\xff" + b"\xff" * 8


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_varlen_uint_round_trip(n):
    data = varlen_uint(n)
    ones = 0
    while ones < 8 and data[0] >> ones & 1:
        ones += 1
    assert len(data) == ones + 1 or (ones == 8 and len(data) == 9)
    value = int.from_bytes(data[1:], "little") if ones == 8 else int.from_bytes(data, "little") >> (ones + 1)
    assert value == n


_tags = st.one_of(st.just(""), st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True))


@given(
    st.lists(
        st.tuples(st.sampled_from([UUID, "00000000-0000-0000-0000-000000000001"]), _tags, st.integers(1, 40)),
        max_size=30,
    )
)
def test_gtid_set_text_round_trip(gtids):
    s = GtidSet()
    for sid, tag, gno in gtids:
        s = s.add(sid, gno, tag)
    assert GtidSet.parse(str(s)) == s
    assert all((sid, tag, gno) in s for sid, tag, gno in gtids)
    if s.entries:
        first_sid = s.entries[0][0]
        assert str(s).startswith(first_sid + ":") and str(s).count(first_sid) == 1


def test_anonymous_gtids_without_gtid_mode(tmp_path):
    w = simple_writer(tmp_path, gtids=False, version="8.0.40")
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
    raws = file_events(w.current_file)
    assert [e[4] for e in raws] == [15, 35, 34, 2, 19, 30, 16]
    assert raws[2][20:44] == bytes(24)  # zero UUID, GNO 0
    assert (tmp_path / "lab" / "binlog.000001.gtids").read_text().splitlines()[1].startswith("- ")
    assert json.loads((tmp_path / "lab" / "lab_state.json").read_text())["variables"]["gtid_mode"] == "OFF"
    assert [type(e).__name__ for e in relay_decode(raws)][-2:] == ["RowInsert", "TxCommit"]


# -- every column type -------------------------------------------------------------------

ALL_COLUMNS = [
    ("id", "varchar(64)", "e-1", "e-1"),
    ("t8", "tinyint", -128, -128),
    ("u8", "tinyint unsigned", 255, 255),
    ("i16", "smallint", -32768, -32768),
    ("i24", "mediumint unsigned", 16777215, 16777215),
    ("i32", "int", -2147483648, -2147483648),
    ("u64", "bigint unsigned", (1 << 64) - 1, (1 << 64) - 1),
    ("i64", "bigint", -(1 << 63), -(1 << 63)),
    ("f", "float", 1.5, 1.5),
    ("d", "double", -2.25e300, -2.25e300),
    ("dec", "decimal(10,2)", decimal.Decimal("-12345678.91"), decimal.Decimal("-12345678.91")),
    (
        "dec2",
        "decimal(30,10)",
        decimal.Decimal("12345678901234567890.0123456789"),
        decimal.Decimal("12345678901234567890.0123456789"),
    ),
    ("dt", "date", datetime.date(2024, 2, 29), datetime.date(2024, 2, 29)),
    (
        "dtm6",
        "datetime(6)",
        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
    ),
    ("dtm0", "datetime", datetime.datetime(9999, 12, 31, 23, 59, 59), datetime.datetime(9999, 12, 31, 23, 59, 59)),
    (
        "ts6",
        "timestamp(6)",
        datetime.datetime(2038, 1, 19, 3, 14, 7, 999999),
        datetime.datetime(2038, 1, 19, 3, 14, 7, 999999),
    ),
    (
        "tm6",
        "time(6)",
        datetime.timedelta(hours=838, minutes=59, seconds=59),
        datetime.timedelta(hours=838, minutes=59, seconds=59),
    ),
    (
        "tm0",
        "time",
        datetime.timedelta(hours=-87, minutes=-31, seconds=-46),
        datetime.timedelta(hours=-87, minutes=-31, seconds=-46),
    ),
    ("yr", "year", 2155, 2155),
    ("ch", "char(5)", "ab", "ab"),
    ("vc", "varchar(300)", "né😀" * 20, "né😀" * 20),
    ("vb", "varbinary(10)", b"\x00\xff", b"\x00\xff"),
    ("tx", "text", "text é", "text é"),
    ("bl", "mediumblob", b"\x01" * 70000, b"\x01" * 70000),
    ("en", "enum('a','b','c')", "c", "c"),
    ("se", "set('x','y','z')", "x,z", {"x", "z"}),
    ("bi", "bit(12)", 0xABC, "101010111100"),  # the library's (and relay's) text of a BIT
    ("js", "json", {"k": [1, "two", None]}, {"k": [1, "two", None]}),
    ("nul", "int", None, None),
]


def all_types_writer(tmp_path, version="8.0.40", **kw) -> MysqlBinlogWriter:
    w = MysqlBinlogWriter(tmp_path / "lab", version=version, server_uuid=UUID, **kw)
    w.create_table("shop", "outbox", [Column(n, t, key="PRI" if n == "id" else "") for n, t, _, _ in ALL_COLUMNS])
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{n: v for n, _, v, _ in ALL_COLUMNS}])
    return w


def test_every_column_type_round_trips_through_the_library(tmp_path):
    raws = file_events(all_types_writer(tmp_path).current_file)
    [rows] = [e for e in library_events(raws) if type(e).__name__ == "WriteRowsEvent"]
    got = rows.rows[0]["values"]
    for name, _, _, expected in ALL_COLUMNS:
        value = got[name]
        if name == "js":
            value = plain(value)
        assert value == expected, name


def test_every_column_type_round_trips_through_the_relay_decoder(tmp_path):
    raws = file_events(all_types_writer(tmp_path).current_file)
    [row] = [e for e in relay_decode(raws) if isinstance(e, RowInsert)]
    for name, _, written, expected in ALL_COLUMNS:
        value = row.values[name]
        if name == "js":
            value = json.loads(value)
        if name == "se":
            expected = written  # MySQL's text of a SET, where the library gives a Python set
        assert value == expected, name


def test_mariadb_binlog_prints_the_values_of_a_table_without_json(tmp_path):
    if shutil.which("mariadb-binlog") is None:
        pytest.fail("mariadb-binlog is not installed (it comes with mariadb-server, which the tests need)")
    w = MysqlBinlogWriter(tmp_path / "lab", version="8.0.40", server_uuid=UUID)
    w.create_table(
        "shop",
        "outbox",
        [Column("id", "varchar(10)", charset="latin1"), Column("n", "bigint unsigned"), Column("d", "decimal(10,2)")]
        + [Column("t", "datetime(6)"), Column("e", "enum('a','b')"), Column("b", "bit(4)"), Column("tm", "time(3)")],
    )
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "x", "n": 18446744073709551615, "d": decimal.Decimal("-1.5")}])
        tx.insert("shop", "outbox", [{"t": datetime.datetime(2024, 5, 6, 7, 8, 9, 10), "e": "b", "b": 5}])
        tx.insert("shop", "outbox", [{"tm": datetime.timedelta(hours=-100, seconds=-1, milliseconds=-500)}])
    out = subprocess.run(
        ["mariadb-binlog", "-vv", "--base64-output=decode-rows", str(w.current_file)],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    for text in (
        "@1='x'",
        "@2=-1 (18446744073709551615)",
        "@3=-1.50",
        "@4='2024-05-06 07:08:09.000010'",
        "@5=2",
        "@6=b'0101'",
        "@7='-100:00:01.500'",
    ):
        assert text in out, text
    assert "Xid = " in out


# -- temporal and decimal encodings against readers written here ---------------------------


def read_time2(data: bytes, fsp: int) -> datetime.timedelta:
    """my_time.cc my_time_packed_from_binary, then TIME_from_longlong_time_packed."""
    if fsp == 0:
        packed = (int.from_bytes(data[:3], "big") - 0x800000) << 24
    elif fsp <= 2:
        intpart = int.from_bytes(data[:3], "big") - 0x800000
        frac = data[3]
        if intpart < 0 and frac:
            intpart += 1
            frac -= 0x100
        packed = (intpart << 24) + frac * 10000
    elif fsp <= 4:
        intpart = int.from_bytes(data[:3], "big") - 0x800000
        frac = int.from_bytes(data[3:5], "big")
        if intpart < 0 and frac:
            intpart += 1
            frac -= 0x10000
        packed = (intpart << 24) + frac * 100
    else:
        packed = int.from_bytes(data[:6], "big") - 0x800000000000
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms, frac = packed >> 24, packed % (1 << 24)
    return sign * datetime.timedelta(hours=hms >> 12, minutes=(hms >> 6) & 0x3F, seconds=hms & 0x3F, microseconds=frac)


@given(st.integers(-(838 * 3600 + 59 * 60 + 59) * 10**6, (838 * 3600 + 59 * 60 + 59) * 10**6), st.integers(0, 6))
def test_time2_round_trips_negative_and_fractional(micros, fsp):
    step = 10 ** (6 - fsp)
    micros = (abs(micros) // step * step) * (1 if micros >= 0 else -1)
    value = datetime.timedelta(microseconds=micros)
    data = time2(value, fsp)
    assert len(data) == 3 + (fsp + 1) // 2
    assert read_time2(data, fsp) == value


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 65), st.data())
def test_decimal_round_trips_through_the_relays_reader(precision, data):
    from connectors.mysql.binlog_value_readers import decimal_reader

    scale = data.draw(st.integers(0, min(30, precision)))
    digits = data.draw(st.integers(-(10**precision) + 1, 10**precision - 1))
    value = decimal.Decimal(digits).scaleb(-scale, decimal.Context(prec=100))
    ct = parse_column_type(f"decimal({precision},{scale})")
    from testbed.mysql_lab.column_values import encode_value

    raw = encode_value(value, ct)
    size, read = decimal_reader(precision, scale)
    assert len(raw) == size and read(raw) == value


# -- binary JSON -------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


@given(json_values)
def test_binary_json_round_trips(value):
    data = encode_json(value)
    assert read_json(data) == as_written(value)
    from pymysqlreplication.json_binary import parse_json

    assert plain(parse_json(data[0], data[1:])) == value


def test_binary_json_sizes_and_kinds():
    """Smallest integer type by value (uint only above INT64_MAX or for JsonUInt), large
    containers past 64 KiB, keys sorted by length then bytes."""
    assert [encode_json(v)[0] for v in (1, -40000, 1 << 40, 1 << 63, JsonUInt(1), JsonUInt(1 << 20), 1.0, "s")] == [
        5,
        7,
        9,
        10,
        6,
        8,
        11,
        12,
    ]
    big = {"k": "x" * 70000, "a": [1, 2]}
    data = encode_json(big)
    assert data[0] == 1 and read_json(data) == big
    assert encode_json(["y" * 70000])[0] == 3 and encode_json({"bb": 1, "a": 2, "c": 3})[:1] == b"\x00"
    assert list(read_json(encode_json({"bb": 1, "c": 3, "a": 2}))) == ["a", "c", "bb"]


def test_binary_json_opaque_values():
    """json_dom.cc: DECIMAL as precision, scale, decimal2bin; temporal values as the
    8-byte packed integer of my_time.cc; other types as raw bytes."""
    doc = {
        "dec": JsonDecimal(decimal.Decimal("123.45"), 10, 2),
        "d2": decimal.Decimal("-0.5"),
        "date": datetime.date(2024, 2, 29),
        "dt": datetime.datetime(2024, 2, 29, 13, 14, 15, 500),
        "ts": JsonTimestamp(datetime.datetime(2024, 2, 29, 13, 14, 15)),
        "time": datetime.timedelta(hours=-87, minutes=-31, seconds=-46, microseconds=-654321),
        "blob": JsonOpaque(252, b"\x00\x01"),
        "bit": JsonOpaque(16, b"\x05"),
    }
    got = read_json(encode_json(doc))
    assert got["dec"] == ("opaque", 246, bytes([10, 2]) + bytes.fromhex("8000007b2d"))
    assert got["d2"] == ("opaque", 246, bytes([2, 1]) + bytes([0x80 ^ 0xFF, 5 ^ 0xFF]))
    ymd = (2024 * 13 + 2) << 5 | 29
    assert got["date"] == ("opaque", 10, struct.pack("<q", (ymd << 17) << 24))
    hms = 13 << 12 | 14 << 6 | 15
    assert got["dt"] == ("opaque", 12, struct.pack("<q", (((ymd << 17) | hms) << 24) + 500))
    assert got["ts"] == ("opaque", 7, struct.pack("<q", ((ymd << 17) | hms) << 24))
    assert got["time"] == ("opaque", 11, struct.pack("<q", -(((87 << 12 | 31 << 6 | 46) << 24) + 654321)))
    assert got["blob"] == ("opaque", 252, b"\x00\x01") and got["bit"] == ("opaque", 16, b"\x05")


# -- Table_map optional metadata -----------------------------------------------------------


def optional_metadata(table_map: bytes) -> dict[int, bytes]:
    body = table_map[19:-4]
    p = 8
    p += 1 + body[p] + 1
    p += 1 + body[p] + 1
    n = body[p]
    p += 1 + n
    meta_len = body[p]
    p += 1 + meta_len + (n + 7) // 8
    fields = {}
    while p < len(body):
        kind, length = body[p], body[p + 1]
        assert length < 251
        fields[kind] = body[p + 2 : p + 2 + length]
        p += 2 + length
    return fields


@pytest.mark.parametrize(
    "metadata, expected", [("FULL", [1, 3, 4, 5, 6, 8, 10, 12]), ("MINIMAL", [1, 3])], ids=["full", "minimal"]
)
def test_table_map_optional_metadata(tmp_path, metadata, expected):
    w = MysqlBinlogWriter(tmp_path / "lab", version="8.0.40", row_metadata=metadata)
    w.create_table(
        "shop",
        "outbox",
        [Column("id", "varchar(8)", key="PRI"), Column("u", "int unsigned"), Column("s", "int")]
        + [
            Column("e", "enum('a','b')"),
            Column("st", "set('x')"),
            Column("b", "blob"),
            Column("h", "int", visible=False),
        ],
    )
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "1", "e": "b"}])
    [tm] = [e for e in file_events(w.current_file) if e[4] == 19]
    fields = optional_metadata(tm)
    assert sorted(fields) == expected
    assert fields[1] == bytes([0b10000000])  # u unsigned, s and h signed
    assert fields[3] == b"\xfc\xff\x00\x3f"  # per column (shorter): utf8mb4_0900_ai_ci, the blob's binary
    if metadata == "FULL":
        assert fields[4] == b"\x02id\x01u\x01s\x01e\x02st\x01b\x01h" and fields[6] == b"\x02\x01a\x01b"
        assert fields[5] == b"\x01\x01x" and fields[8] == b"\x00" and fields[12] == bytes([0b11111100])
        assert fields[10] == b"\xfc\xff\x00"  # ENUM and SET: one default, no exception
    if metadata == "FULL":
        [row] = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, RowInsert)]
        assert row.values["e"] == "b"


# -- rows events, partial JSON, XA, compression ---------------------------------------------


def test_large_statements_split_into_events_of_8k(tmp_path):
    w = simple_writer(tmp_path)
    rows = [{"id": f"e{i}", "payload": {"pad": "p" * 1000}, "n": i} for i in range(40)]
    with w.transaction() as tx:
        tx.insert("shop", "outbox", rows)
        tx.delete("shop", "outbox", rows[:2])
    raws = file_events(w.current_file)
    writes = [e for e in raws if e[4] in (30, 32)]
    assert len(writes) > 4 and all(len(e) <= 8192 + 60 for e in writes)
    assert [struct.unpack_from("<H", e, 25)[0] for e in writes] == [0] * (len(writes) - 2) + [1, 1]
    assert [e[4] for e in raws].count(19) == 2  # a Table_map per statement
    lib = [r["values"]["id"] for e in library_events(raws) if type(e).__name__ == "WriteRowsEvent" for r in e.rows]
    assert lib == [r["id"] for r in rows]


def test_updates_and_deletes(tmp_path):
    w = simple_writer(tmp_path, version="8.0.40")
    a, b = {"id": "e1", "payload": {"v": 1}, "n": 1}, {"id": "e1", "payload": {"v": 2}, "n": 2}
    with w.transaction() as tx:
        tx.update("shop", "outbox", [(a, b)])
        tx.delete("shop", "outbox", [b])
    out = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, RowChange)]
    assert [(e.kind, e.values["n"]) for e in out] == [("update", 2), ("delete", 2)]


def test_partial_json_update(tmp_path):
    """PARTIAL_UPDATE_ROWS_EVENT: value_options 1, a partial bit per JSON column, the
    column's after value a diff list; the library reads one diff's operation, path, value."""
    w = simple_writer(tmp_path, version="8.0.40", partial_json=True)
    before = {"id": "e1", "payload": {"a": 1, "b": [1, 2]}, "n": 1}
    after = {"id": "e1", "payload": {"a": 1, "b": [1, 2], "c": "new"}, "n": 1}
    with w.transaction() as tx:
        tx.update_json_partial("shop", "outbox", [(before, after, {"payload": [JsonDiff(1, "$.c", "new")]})])
        tx.update("shop", "outbox", [(after, before)])
    raws = file_events(w.current_file)
    assert [e[4] for e in raws if e[4] in (31, 39)] == [39, 39]
    lib = [e for e in library_events(raws) if type(e).__name__ == "PartialUpdateRowsEvent"]
    diff = lib[0].rows[0]["after_values"]["payload"]
    assert (diff.op.name.lower(), diff.path, plain(diff.value)) == ("insert", b"$.c", "new")
    assert plain(lib[1].rows[0]["after_values"]["payload"]) == before["payload"]
    assert (
        json.loads((tmp_path / "lab" / "lab_state.json").read_text())["variables"]["binlog_row_value_options"]
        == "PARTIAL_JSON"
    )


def test_the_relay_applies_a_partial_json_update(tmp_path):
    w = simple_writer(tmp_path, version="8.0.40", partial_json=True)
    before = {"id": "e1", "payload": {"a": 1}, "n": 1}
    with w.transaction() as tx:
        tx.update_json_partial("shop", "outbox", [(before, before, {"payload": [JsonDiff(0, "$.a", 2)]})])
    [change] = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, RowChange)]
    assert json.loads(change.values["payload"]) == {"a": 2}


def test_xa_prepare_commit_and_rollback(tmp_path):
    w = simple_writer(tmp_path, version="8.0.40")
    g1, g2 = Xid(b"g1", b"b1", 7), Xid(b"g2")
    with w.xa_prepare(g1) as tx:
        tx.insert("shop", "outbox", [{"id": "x1"}])
    with w.xa_prepare(g2) as tx:
        tx.insert("shop", "outbox", [{"id": "x2"}])
    state = json.loads((tmp_path / "lab" / "lab_state.json").read_text())
    assert state["xa_prepared"] == [
        {"format_id": 7, "gtrid": "6731", "bqual": "6231"},
        {"format_id": 1, "gtrid": "6732", "bqual": ""},
    ]
    w.xa_commit(g1)
    w.xa_rollback(g2)
    assert json.loads((tmp_path / "lab" / "lab_state.json").read_text())["xa_prepared"] == []
    raws = file_events(w.current_file)
    assert [e[4] for e in raws][2:9] == [33, 2, 19, 30, 2, 38, 33]
    queries = [e[19 + 13 + 29 + 1 : -4].decode() for e in raws if e[4] == 2]
    assert queries[:2] == ["XA START X'6731',X'6231',7", "XA END X'6731',X'6231',7"]
    assert queries[-2:] == ["XA COMMIT X'6731',X'6231',7", "XA ROLLBACK X'6732',X'',1"]
    out = relay_decode(raws)
    assert [type(e).__name__ for e in out if isinstance(e, XaPrepare | XaCommit | XaRollback)] == [
        "XaPrepare",
        "XaPrepare",
        "XaCommit",
        "XaRollback",
    ]
    assert str(w.gtid_executed) == f"{UUID}:1-4"
    with pytest.raises(KeyError, match="not prepared"):
        w.xa_commit(g1)


@pytest.mark.parametrize("version", ["8.0.40"])
def test_compressed_transactions(tmp_path, version):
    """Transaction_payload (zstd): the GTID event outside, every other event inside
    without a checksum and with log_pos 0; read by the relay and by the library."""
    w = simple_writer(tmp_path, version=version, compression=True)
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": f"e{i}", "payload": {"i": i}, "n": i} for i in range(50)])
    raws = file_events(w.current_file)
    assert [e[4] for e in raws] == [15, 35, 33, 40]
    import zstandard

    body = raws[3][19:-4]
    assert body[:3] == b"\x02\x01\x00" and body[3] == 3
    data = body[body.index(b"\x00", 8) + 1 :]
    inner = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 20)
    kinds, p = [], 0
    while p < len(inner):
        size, log_pos = struct.unpack_from("<II", inner, p + 9)
        assert log_pos == 0
        kinds.append(inner[p + 4])
        p += size
    assert kinds == [2, 19, 30, 16]
    rows = [e for e in relay_decode(raws) if isinstance(e, RowInsert)]
    assert [r.values["n"] for r in rows] == list(range(50))
    lib = [r["values"]["n"] for e in library_events(raws) if type(e).__name__ == "WriteRowsEvent" for r in e.rows]
    assert lib == list(range(50)) and isinstance(relay_decode(raws)[-1], TxCommit)


def test_vector_on_mysql_9(tmp_path):
    """MYSQL_TYPE_VECTOR (242): metadata 4 (length bytes), the value float32s; VECTOR
    dimensionality in the optional metadata; refused before 9.0."""
    w = MysqlBinlogWriter(tmp_path / "lab", version="9.1.0")
    w.create_table("shop", "vec", [Column("v", "vector(3)")])
    with w.transaction() as tx:
        tx.insert("shop", "vec", [{"v": [1.0, -2.5, 0.25]}])
    raws = file_events(w.current_file)
    [tm] = [e for e in raws if e[4] == 19]
    assert b"\x01\xf2\x01\x04" in tm and optional_metadata(tm)[13] == b"\x03"
    [rows] = [e for e in raws if e[4] == 30]
    assert rows[19 + 10 + 2 : -4] == b"\x00" + struct.pack("<I3f", 12, 1.0, -2.5, 0.25)
    with pytest.raises(ValueError, match="VECTOR needs MySQL 9.0"):
        MysqlBinlogWriter(tmp_path / "old", version="8.4.3").create_table("s", "t", [Column("v", "vector(3)")])


def test_the_relay_renders_opaque_json_values_as_mysql(tmp_path):
    w = simple_writer(tmp_path, version="8.0.40")
    doc = {
        "d": JsonDecimal(decimal.Decimal("123.456"), 6, 3),
        "t": datetime.timedelta(hours=87, minutes=31, seconds=46, microseconds=654321),
    }
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "payload": doc}])
    [row] = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, RowInsert)]
    assert json.loads(row.values["payload"], parse_float=decimal.Decimal) == {
        "d": decimal.Decimal("123.456"),
        "t": "87:31:46.654321",
    }


def test_the_relay_names_or_publishes_a_vector(tmp_path):
    from connectors.mysql.binlog_decoder import UnsupportedColumnType

    w = MysqlBinlogWriter(tmp_path / "lab", version="9.1.0")
    w.create_table("shop", "outbox", [Column("id", "varchar(8)"), Column("v", "vector(2)")])
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "v": [1.0, 2.0]}])
    try:
        [row] = [e for e in relay_decode(file_events(w.current_file)) if isinstance(e, RowInsert)]
    except UnsupportedColumnType as exc:
        assert "242 (VECTOR)" in str(exc)
    else:
        assert row.values["v"] == struct.pack("<2f", 1.0, 2.0)


_opaque_leaves = st.one_of(
    st.builds(JsonUInt, st.integers(0, (1 << 64) - 1)),
    st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-(10**20), max_value=10**20),
    st.dates(min_value=datetime.date(1000, 1, 1)),
    st.datetimes(min_value=datetime.datetime(1000, 1, 1)),
    st.timedeltas(min_value=-datetime.timedelta(hours=838), max_value=datetime.timedelta(hours=838)),
    st.builds(JsonOpaque, st.sampled_from([16, 252, 253]), st.binary(max_size=20)),
)


def _expected_rich(value):
    """What read_json gives for the values _opaque_leaves draws (see json_binary.py)."""
    from testbed.mysql_lab.json_binary import _decimal_shape, date_packed, datetime_packed, decimal_binary, time_packed

    if isinstance(value, JsonUInt):
        return ("u", value.value)
    if isinstance(value, decimal.Decimal):
        precision, scale = _decimal_shape(value)
        return ("opaque", 246, bytes([precision, scale]) + decimal_binary(value, precision, scale))
    if isinstance(value, datetime.datetime):
        return ("opaque", 12, struct.pack("<q", datetime_packed(value)))
    if isinstance(value, datetime.date):
        return ("opaque", 10, struct.pack("<q", date_packed(value)))
    if isinstance(value, datetime.timedelta):
        return ("opaque", 11, struct.pack("<q", time_packed(value)))
    if isinstance(value, JsonOpaque):
        return ("opaque", value.field_type, value.data)
    if isinstance(value, dict):
        return {k: _expected_rich(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expected_rich(v) for v in value]
    return as_written(value)


@given(
    st.recursive(
        _opaque_leaves | st.integers().filter(lambda n: -(1 << 63) <= n < 1 << 63),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
        max_leaves=12,
    )
)
def test_binary_json_round_trips_opaque_and_unsigned_values(value):
    assert read_json(encode_json(value)) == _expected_rich(value)


def test_decimal_in_json_keeps_its_value():
    """The DECIMAL inside opaque type 246 decodes (decimal2bin, read by the relay's
    column reader) to the number written."""
    from connectors.mysql.binlog_value_readers import decimal_reader

    for text in ("123.456", "-0.5", "0", "99999999999999999999.0001"):
        _, _, data = read_json(encode_json(decimal.Decimal(text)))
        _, read = decimal_reader(data[0], data[1])
        assert read(data[2:]) == decimal.Decimal(text)


def test_partial_json_update_with_several_diffs(tmp_path):
    """Json_diff_vector::write_binary: a 4-byte length, then per diff the operation, the
    path (net_field_length + text) and, unless REMOVE, the value (net_field_length + binary
    JSON); the partial bit of the second JSON column stays 0 (stored whole)."""
    w = MysqlBinlogWriter(tmp_path / "lab", version="8.4.3", partial_json=True)
    w.create_table("shop", "outbox", [Column("id", "int"), Column("a", "json"), Column("b", "json")])
    diffs = [JsonDiff(0, "$.x", 5), JsonDiff(2, '$."y z"'), JsonDiff(1, "$.l[0]", "s")]
    with w.transaction() as tx:
        tx.update_json_partial(
            "shop", "outbox", [({"id": 1, "a": {"x": 1}, "b": [1]}, {"id": 1, "a": {}, "b": [2]}, {"a": diffs})]
        )
    [rows] = [e for e in file_events(w.current_file) if e[4] == 39]
    body = rows[19:-4]
    p = 10 + 1 + 1 + 1  # post-header, column count, two bitmaps
    p += 1 + 4 + len(encode_json({"x": 1})) + 4 + len(encode_json([1])) + 4  # before image (id, a, b)
    assert body[p : p + 2] == b"\x01\x01"  # value_options PARTIAL_JSON_UPDATES, partial bits: a only
    p += 2 + 1 + 4  # after image: NULL bitmap, id
    length = struct.unpack_from("<I", body, p)[0]
    expected = b"\x00\x03$.x" + bytes([len(encode_json(5))]) + encode_json(5) + b'\x02\x07$."y z"' + b"\x01\x06$.l[0]"
    expected += bytes([len(encode_json("s"))]) + encode_json("s")
    assert body[p + 4 : p + 4 + length] == expected
    assert body[p + 4 + length :] == struct.pack("<I", len(encode_json([2]))) + encode_json([2])


def test_previous_gtids_and_rotate_read_by_the_library(tmp_path):
    from pymysqlreplication.event import PreviousGtidsEvent, RotateEvent

    w = simple_writer(tmp_path, version="8.0.40")
    for _ in range(3):
        with w.transaction() as tx:
            tx.insert("shop", "outbox", [{"id": "e"}])
    w.rotate()
    old = file_events(tmp_path / "lab" / FILE)
    new = file_events(w.current_file)
    allowed = frozenset([PreviousGtidsEvent, RotateEvent])
    rotate = bb.library_event(old[-1], {}, allowed).event
    assert (rotate.next_binlog, rotate.position) == ("binlog.000002", 4)
    previous = bb.library_event(new[1], {}, allowed).event
    assert previous._previous_gtids == f"{UUID}-:['1-4']"  # the library shows the stored end (exclusive)


# -- MySQL 5.7 and 8.0 before 8.0.28 ------------------------------------------------------------

# Post-header tables of real files (the test data of rust_mysql_common,
# binlog-invisible-columns.000001 by 8.0.26, and of mysql-binlog-connector-java,
# mysql-bin.compressed by 8.0.28): 8.0.26 has Transaction_payload (40) and not yet Heartbeat_v2 (41, 8.0.28).
REAL_8026_TABLE = bytes.fromhex("000d0008000000000400040000006100041a08000000080808020000000a0a0a2a2a001234000a28")
REAL_8028_TABLE = bytes.fromhex("000d0008000000000400040000006200041a08000000080808020000000a0a0a2a2a001234000a2800")


def fde_body(raw: bytes, checksum: bool = True) -> bytes:
    return raw[19 : -4 if checksum else len(raw)]


@pytest.mark.parametrize(
    "real, version, checksum",
    [(bb.MYSQL_5721_FDE, "5.7.21-log", True), (bb.MYSQL_5720_FDE_NO_CHECKSUM, "5.7.20-log", False)],
    ids=["5.7.21-crc32", "5.7.20-none"],
)
def test_a_mysql_5_7_format_description_is_the_real_one_in_its_fixed_parts(tmp_path, real, version, checksum):
    """The lab's 5.7 Format_description against one a real 5.7 server wrote: the same
    header (type, server id, size 119, log_pos 123), binlog version, server version, common
    header length, the 38 post-header lengths (56 / 18 / 4 / 4 / 18 for the events 8.0.2
    deprecated, 95 for itself), the checksum algorithm byte. Only the timestamps and the
    CRC differ. With binlog_checksum=NONE 5.7 still ends the body with the algorithm byte
    (0) and 4 bytes (control_events.cpp: the room of the checksum value is written)."""
    w = MysqlBinlogWriter(tmp_path / "lab", version=version, server_uuid=UUID, checksum=checksum)
    data = w.current_file.read_bytes()
    size = struct.unpack_from("<I", data, 4 + 9)[0]
    lab = bytearray(data[4 : 4 + size])
    lab[17] &= 0xFE  # the in-use flag of the active file (cleared when sent or closed)
    assert len(lab) == len(real) == 119
    lab_body, real_body = bytes(lab[19 : 19 + 95 + 1]), real[19 : 19 + 95 + 1]
    assert lab[4:19] == real[4:19]  # type, server id, size, log_pos, flags
    assert lab_body[:52] == real_body[:52]  # binlog version 4, server version
    assert lab_body[56:] == real_body[56:]  # header length 19, the 38 lengths, algorithm byte
    assert len(lab_body[57:-1]) == 38 and lab_body[-1] == (1 if checksum else 0)


def test_a_mysql_5_7_format_description_without_checksums_has_the_4_bytes_the_real_one_has():
    """A 5.7.20 server with binlog_checksum=NONE: the body is still 95 bytes, then the
    algorithm byte 0 and 4 bytes (the real event is 119 bytes like the CRC32 one); the
    relay's decoder must read the table as 38 entries either way (fixed in ccd1a20)."""
    assert len(bb.MYSQL_5720_FDE_NO_CHECKSUM) == len(bb.MYSQL_5721_FDE) == 119
    assert bb.MYSQL_5720_FDE_NO_CHECKSUM[19 + 95] == 0 and bb.MYSQL_5721_FDE[19 + 95] == 1


@pytest.mark.parametrize(
    "version, types, real",
    [
        ("5.7.44", 38, bb.MYSQL_5721_FDE[19 + 57 : 19 + 95]),
        ("8.0.17", 39, REAL_8026_TABLE[:39]),  # before Transaction_payload (8.0.20)
        ("8.0.20", 40, REAL_8026_TABLE),
        ("8.0.26", 40, REAL_8026_TABLE),
        ("8.0.28", 41, REAL_8028_TABLE),
        ("8.0.40", 41, REAL_8028_TABLE),
    ],
)
def test_format_description_event_types_by_version(tmp_path, version, types, real):
    """One post-header length per event type the version knows (events.event_type_count);
    where a real file of that table exists, byte for byte; 8.0.17's is 8.0.26's without
    Transaction_payload, with its own length at the Format_description's entry (96)."""
    w = MysqlBinlogWriter(tmp_path / "lab", version=version, server_uuid=UUID)
    table = fde_body(file_events(w.current_file)[0])[57:-1]
    assert len(table) == types and table[14] == 57 + types
    expected = bytearray(real)
    expected[14] = 57 + types
    assert table == bytes(expected)
    out = relay_decode(file_events(w.current_file))
    assert [type(e).__name__ for e in out] == ["ServerStarted"]


def mysql57_writer(tmp_path, **kw) -> MysqlBinlogWriter:
    w = MysqlBinlogWriter(tmp_path / "lab", version="5.7.44-log", server_uuid=UUID, **kw)
    w.create_table(
        "shop",
        "outbox",
        [Column("id", "varchar(64)", nullable=False, key="PRI"), Column("payload", "json")]
        + [Column("n", "int unsigned"), Column("e", "enum('new','sent')"), Column("s", "set('x','y')")],
    )
    return w


def mysql57_columns(schema: str, table: str):
    from connectors.mysql.table_columns import ColumnDefinition

    assert (schema, table) == ("shop", "outbox")
    return [
        ColumnDefinition("id", "varchar", charset="utf8mb4"),
        ColumnDefinition("payload", "json"),
        ColumnDefinition("n", "int", unsigned=True),
        ColumnDefinition("e", "enum", charset="utf8mb4", values=("new", "sent")),
        ColumnDefinition("s", "set", charset="utf8mb4", values=("x", "y")),
    ]


def test_mysql_5_7_gtid_events_are_42_bytes(tmp_path):
    """control_events.h Gtid_event as 5.7 writes it: flags, UUID, gno, logical clock type
    2, last_committed, sequence_number and nothing more (a 5.7.21 file's GTID events are
    42 bytes); the library and the relay's decoder read the GTID and the clock."""
    for gtids in (True, False):
        w = mysql57_writer(tmp_path / str(gtids), gtids=gtids)
        for i in range(2):
            with w.transaction() as tx:
                tx.insert("shop", "outbox", [{"id": f"e{i}", "n": i}])
        raws = file_events(w.current_file)
        kind = 33 if gtids else 34
        gtid_events = [e for e in raws if e[4] == kind]
        assert [len(e) - 19 - 4 for e in gtid_events] == [42, 42]
        assert [struct.unpack_from("<qq", e, 19 + 26) for e in gtid_events] == [(0, 1), (1, 2)]
        out = relay_decode(raws, table_columns=mysql57_columns)
        if gtids:  # (the library's GtidEvent class does not read type 34)
            lib = [e for e in library_events(raws) if type(e).__name__ == "GtidEvent"]
            want = [(f"{UUID}:1", 0, 1), (f"{UUID}:2", 1, 2)]
            assert [(g.gtid, g.last_committed, g.sequence_number) for g in lib] == want
            assert [e.gtid for e in out if isinstance(e, TxBegin) and e.gtid] == [f"{UUID}:1", f"{UUID}:2"]
        assert [e.values["id"] for e in out if isinstance(e, RowInsert)] == ["e0", "e1"]


def test_mysql_5_7_table_maps_end_at_the_null_bitmap_and_names_come_from_information_schema(tmp_path):
    """5.7 has no binlog_row_metadata: its Table_map ends at the NULL-able bitmap (no
    signedness, no charsets, no names, no ENUM / SET values; real 5.7.19 and 5.7.21 files
    have nothing after it). The relay's decoder takes names, unsignedness and ENUM / SET
    values from information_schema.COLUMNS, as for MINIMAL metadata; the library reads
    the values by position."""
    w = mysql57_writer(tmp_path)
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "payload": {"a": [1]}, "n": 4000000000, "e": "sent", "s": "x,y"}])
    raws = file_events(w.current_file)
    [tm] = [e for e in raws if e[4] == 19]
    assert optional_metadata(tm) == {}
    [row] = [e for e in relay_decode(raws, table_columns=mysql57_columns) if isinstance(e, RowInsert)]
    assert row.values == {"id": "e1", "payload": '{"a": [1]}', "n": 4000000000, "e": "sent", "s": "x,y"}
    [rows] = [e for e in library_events(raws) if type(e).__name__ == "WriteRowsEvent"]
    values = list(rows.rows[0]["values"].values())
    assert values[0] == "e1" and plain(values[1]) == {"a": [1]}


def test_mysql_5_7_begin_has_a_5_7_sessions_status_variables(tmp_path):
    """A 5.7 BEGIN's status variables (a 5.7.21 file's): Q_FLAGS2, Q_SQL_MODE, Q_CATALOG_NZ,
    Q_CHARSET and no Q_DEFAULT_COLLATION_FOR_UTF8MB4 (18, 8.0)."""
    w = mysql57_writer(tmp_path)
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
    [begin] = [e for e in file_events(w.current_file) if e[4] == 2]
    body = begin[19:-4]
    status = body[13 : 13 + struct.unpack_from("<H", body, 11)[0]]
    codes, p = [], 0
    sizes = {0: 4, 1: 8, 4: 6}
    while p < len(status):
        code = status[p]
        codes.append(code)
        p += 1 + (1 + status[p + 1] if code == 6 else sizes[code])
    assert codes == [0, 1, 6, 4] and body.endswith(b"\x00BEGIN")
    assert [e.query for e in library_events(file_events(w.current_file)) if type(e).__name__ == "QueryEvent"] == [
        "BEGIN"
    ]


def test_mysql_5_7_refuses_what_5_7_does_not_have(tmp_path):
    with pytest.raises(ValueError, match="no binlog_row_metadata"):
        MysqlBinlogWriter(tmp_path / "a", version="5.7.44", row_metadata="FULL")
    with pytest.raises(ValueError, match="compression nor partial JSON"):
        MysqlBinlogWriter(tmp_path / "b", version="5.7.44", compression=True)
    w = mysql57_writer(tmp_path / "c")
    with pytest.raises(ValueError, match="tagged GTIDs need MySQL 8.3"), w.transaction(tag="blue"):
        pass
    w.compression = True
    with pytest.raises(ValueError, match="Transaction_payload needs MySQL 8.0.20"), w.transaction():
        pass
    w.compression = False
    w.partial_json = True
    with pytest.raises(ValueError, match="PARTIAL_UPDATE_ROWS_EVENT needs MySQL 8.0.3"), w.transaction() as tx:
        tx.update("shop", "outbox", [({"id": "e"}, {"id": "e"})])
    w8 = simple_writer(tmp_path / "d", version="8.0.17")
    w8.compression = True
    with pytest.raises(ValueError, match="8.0.20"), w8.transaction():
        pass
    variables = json.loads((tmp_path / "c" / "lab" / "lab_state.json").read_text())["variables"]
    assert "binlog_row_metadata" not in variables and "binlog_transaction_compression" not in variables
    assert variables["version"] == "5.7.44-log"


def test_mysql_8_0_before_8_0_20_files_read_back(tmp_path):
    """8.0.17: 39 event types, GTID events with commit timestamps and lengths, FULL metadata."""
    w = simple_writer(tmp_path, version="8.0.17")
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "payload": {"a": 1}, "n": 7}])
    raws = file_events(w.current_file)
    out = relay_decode(raws)
    assert [e.values for e in out if isinstance(e, RowInsert)] == [{"id": "e1", "payload": '{"a": 1}', "n": 7}]
    [g] = [e for e in library_events(raws) if type(e).__name__ == "GtidEvent"]
    assert g.gtid == f"{UUID}:1" and len(raws[2]) - 19 - 4 > 42  # commit timestamp, length, server version
    assert len(fde_body(raws[0])[57:-1]) == 39


def test_a_stale_5_7_table_map_is_refused_with_a_fix_that_exists_on_5_7(tmp_path):
    """A 5.7 table altered after its rows were written: the decoder cannot name the columns
    and stops, and its line must not send the user to a variable 5.7 lacks (the fix there:
    no ALTER of an outbox table while the relay is behind, or MySQL 8.0.1+ with FULL)."""
    from connectors.mysql.binlog_decoder import BinlogDecodeError

    w = mysql57_writer(tmp_path)
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1"}])
    with pytest.raises(BinlogDecodeError) as err:
        relay_decode(file_events(w.current_file), table_columns=lambda s, t: mysql57_columns(s, t)[:4])
    assert "binlog_row_metadata=FULL" not in str(err.value) and "5.7" in str(err.value)


@pytest.mark.parametrize("version", ["5.7.20-log", "8.0.40"])
def test_without_checksums_only_the_format_description_carries_a_crc(tmp_path, version):
    """binlog_checksum=NONE: the Format_description ends with algorithm byte 0 and a valid
    CRC32 (as a real 5.7.20 server's does), every other event without one; the relay's
    decoder reads the rows."""
    w = MysqlBinlogWriter(tmp_path / "lab", version=version, server_uuid=UUID, checksum=False)
    w.create_table("shop", "outbox", [Column("id", "varchar(8)", nullable=False, key="PRI"), Column("n", "int")])
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "n": 5}])
    data, raws, pos = w.current_file.read_bytes(), [], 4
    while pos < len(data):
        size, log_pos = struct.unpack_from("<II", data, pos + 9)
        assert log_pos == pos + size
        raws.append(data[pos : pos + size])
        pos += size
    fde = bytearray(raws[0])
    fde[17] &= 0xFE
    assert fde[-5] == 0 and zlib.crc32(bytes(fde[:-4])) == struct.unpack("<I", fde[-4:])[0]
    [gtid] = [e for e in raws if e[4] == 33]
    assert (len(gtid) - 19 == 42) == version.startswith("5.7")  # 8.0: timestamps, length, version follow

    def columns(schema: str, table: str):
        from connectors.mysql.table_columns import ColumnDefinition

        return [ColumnDefinition("id", "varchar", charset="utf8mb4"), ColumnDefinition("n", "int")]

    out = [e for e in relay_decode([bytes(fde), *raws[1:]], table_columns=columns) if isinstance(e, RowInsert)]
    assert [e.values for e in out] == [{"id": "e1", "n": 5}]
