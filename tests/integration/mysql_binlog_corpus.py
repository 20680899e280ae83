"""Binlog files written by real MySQL servers (the folder `shared/mysql-binlogs` beside the
repository), read as the replication stream hands them over, by three readers of this
project and two oracles; used by `test_mysql_binlog_corpus.py`.

Every reader yields the same kind of record, so that they compare value by value:

    ("gtid", gtid, start)                    a Gtid_log_event / Gtid_tagged_log_event
    ("begin", start)                         a BEGIN (or XA START) query
    ("commit", end)                          an XID event or a COMMIT query
    ("xa_prepare", xid, end)                 an XA_prepare event
    ("xa_end", end) / ("statement", end)     other queries (XA END; DDL and the like)
    ("insert" | "delete", schema, table, values, end)   one row image
    ("update", schema, table, before, after, end)      one row's images (the relay keeps
                                                        only `after`: its `before` is None)

Positions are the end positions the headers carry (`log_pos`) and the start the relay and
the verifier compute; `values` is a dict by column name (UNKNOWN_COL<i> where the
Table_map names none), normalised by `plain`.
"""

from __future__ import annotations

import datetime
import decimal
import re
import struct
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from connectors.mysql.table_columns import ColumnDefinition
from spark_jobs.mysql.binlog_table_map import ColumnInfo
from testbed.mysql_lab.dump import fake_rotate, format_description_for_sending

REPOSITORY = Path(__file__).resolve().parents[2]
CORPUS = REPOSITORY.parent / "shared" / "mysql-binlogs"
MAGIC = b"\xfebin"
SERVER_ID = 1
_HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags


def corpus_files() -> list[Path]:
    """Every binlog file of the corpus (each has FILE.txt beside it)."""
    return sorted(p for p in CORPUS.iterdir() if p.is_file() and not p.name.endswith(".txt"))


@dataclass
class BinlogFile:
    """One file's events as stored (`events`), what is left after the last whole one
    (`tail`), and the stream a dump thread sends for it from position 4 (`sent`)."""

    path: Path
    events: list[bytes]
    tail: bytes
    crc: bool
    sent: list[bytes] = field(default_factory=list)
    stream_name: str = "binlog.000001"

    @property
    def version(self) -> str:
        return self.events[0][21:71].rstrip(b"\0").decode("ascii", "replace")


def read_file(path: Path) -> BinlogFile:
    data = path.read_bytes()
    assert data[:4] == MAGIC, f"{path.name}: not a binlog file (no magic number)"
    events, p = [], 4
    while p + 19 <= len(data):
        size = _HEADER.unpack_from(data, p)[3]
        if size < 19 or p + size > len(data):
            break
        events.append(data[p : p + size])
        p += size
    fde = events[0]
    assert fde[4] == 15, f"{path.name}: the first event is of type {fde[4]}, not a Format_description"
    crc = fde[-5] == 1
    # the stream's file name: the stored name where it is a binlog name (`name.000003`)
    stored = path.name.split("__", 1)[-1]
    name = stored if re.fullmatch(r"[\w.-]+\.\d{6,}", stored) else "binlog.000001"
    f = BinlogFile(path, events, data[p:], crc, stream_name=name)
    # Binlog_sender (testbed/mysql_lab/dump.py): a fake Rotate naming the file, the
    # Format_description with LOG_EVENT_BINLOG_IN_USE_F cleared, then the events as stored.
    f.sent = [fake_rotate(SERVER_ID, name, 4, crc), format_description_for_sending(fde, False), *events[1:]]
    return f


def event_extents(f: BinlogFile) -> list[tuple[int, int]]:
    """(start, end) of each stored event, from its header (end = log_pos, start = log_pos
    less the event's size, as both readers compute them)."""
    return [(h[4] - h[3], h[4]) for h in (_HEADER.unpack_from(ev) for ev in f.events)]


def crc_ok(ev: bytes) -> bool:
    """The stored CRC32 of an event, computed (as MySQL computes it) with the in-use flag
    clear (MySQL sql/binlog.cc: the Format_description's CRC is written before the flag is set)."""
    flags = struct.unpack_from("<H", ev, 17)[0]
    body = ev[:17] + struct.pack("<H", flags & ~1) + ev[19:-4] if ev[4] == 15 else ev[:-4]
    return zlib.crc32(body) == struct.unpack_from("<I", ev, len(ev) - 4)[0]


# -- what the readers are told about tables whose Table_map names no columns ---------------

# information_schema DATA_TYPE of a Table_map column type (MySQL's field types, binlog.h)
_DATA_TYPE = {1: "tinyint", 2: "smallint", 9: "mediumint", 3: "int", 8: "bigint", 246: "decimal", 4: "float",
              5: "double", 16: "bit", 10: "date", 12: "datetime", 18: "datetime", 7: "timestamp",
              17: "timestamp", 11: "time", 19: "time", 13: "year", 254: "char", 15: "varchar", 252: "text",
              247: "enum", 248: "set", 245: "json", 242: "vector"}  # fmt: skip
_CHARACTER = {"char", "varchar", "text", "enum", "set"}
UTF8MB4_GENERAL_CI = 45


@dataclass
class TableMapInfo:
    schema: str
    table: str
    types: list[int]  # ENUM / SET told apart from CHAR by their metadata
    has_names: bool
    enum_values: list[list[str]] = field(default_factory=list)  # per ENUM column (binlog_row_metadata=FULL)
    set_values: list[list[str]] = field(default_factory=list)  # per SET column

    def values_of(self, column: int) -> list[str] | None:
        """The value names of an ENUM / SET column (by position), None when not in the Table_map."""
        kind = self.types[column]
        groups = self.enum_values if kind == 247 else self.set_values if kind == 248 else []
        index = sum(1 for t in self.types[:column] if t == kind)
        return groups[index] if index < len(groups) else None


def table_maps(f: BinlogFile, first: bool = False) -> dict[tuple[str, str], TableMapInfo]:
    """Each table of the file's Table_maps (those inside Transaction_payloads too): its
    last layout in the file (`first`: its first)."""
    from spark_jobs.mysql.binlog_compressed import _Format, expand_event

    fmt = _Format()
    out: dict[tuple[str, str], TableMapInfo] = {}
    for raw in f.sent[1:]:
        for ev, _ in expand_event(raw, fmt) or [(raw, 0)]:
            if ev[4] != 19:
                continue
            info = _table_map(ev[19 : len(ev) - fmt.checksum])
            if not first or (info.schema, info.table) not in out:
                out[(info.schema, info.table)] = info
    return out


def _table_map(body: bytes) -> TableMapInfo:
    """A Table_map body (after the header, without CRC): its table and column types
    (MySQL libs/mysql/binlog/event/rows_event.h, Table_map_event; every table here has
    fewer than 251 columns and optional-metadata fields shorter than 251 bytes)."""
    p = 8
    schema = body[p + 1 : p + 1 + body[p]].decode()
    p += 2 + body[p]
    table = body[p + 1 : p + 1 + body[p]].decode()
    p += 2 + body[p]
    n = body[p]
    types = list(body[p + 1 : p + 1 + n])
    p += 1 + n
    meta_len = body[p]
    meta, q = body[p + 1 : p + 1 + meta_len], 0
    for i, t in enumerate(types):
        if t == 254 and meta[q] in (247, 248):  # ENUM / SET are written as STRING
            types[i] = meta[q]
        q += _META_SIZE.get(t, 0)
    p += 1 + meta_len + (n + 7) // 8
    info = TableMapInfo(schema, table, types, False)
    while p < len(body):
        kind, length = body[p], body[p + 1]
        assert length < 251
        info.has_names |= kind == 4  # COLUMN_NAME
        if kind in (5, 6):  # SET_STR_VALUE, ENUM_STR_VALUE: per column a count, then the names
            groups, q = [], p + 2
            while q < p + 2 + length:
                count, q = body[q], q + 1
                names = []
                for _ in range(count):
                    names.append(body[q + 1 : q + 1 + body[q]].decode())
                    q += 1 + body[q]
                groups.append(names)
            if kind == 5:
                info.set_values = groups
            else:
                info.enum_values = groups
        p += 2 + length
    return info


# bytes of a column's Table_map metadata by type (log_event.cc save_field_metadata)
_META_SIZE = {**dict.fromkeys((15, 16, 246, 253, 254, 247, 248), 2),
              **dict.fromkeys((4, 5, 17, 18, 19, 242, 245, 252, 255), 1)}  # fmt: skip


class Catalogue:
    """What information_schema would answer for tables whose Table_map names no columns
    (binlog_row_metadata MINIMAL, MySQL 5.7): the column names the library gives them
    (UNKNOWN_COL<i>), signed numbers, utf8mb4 text. The relay (its `table_columns` port)
    and the verifier (its look-up) are told the same; it is what neither can know from
    these files (their servers are gone), so the test compares what they do with it."""

    def __init__(self, f: BinlogFile):
        self.maps = table_maps(f, first=True)  # the layout in force, from the stream (`see`)
        self.relay_calls: list[tuple[str, str]] = []
        self.verifier_calls: list[tuple[str, str]] = []

    def see(self, ev: bytes) -> None:
        """An event of the stream: a Table_map is the table's layout from here on (what
        information_schema said while the server wrote the events after it)."""
        if ev[4] == 19:
            info = _table_map(ev[19 : len(ev) - (4 if crc_ok(ev) else 0)])
            self.maps[(info.schema, info.table)] = info

    def _columns(self, schema: str, table: str) -> list[tuple[str, str]]:
        return [(f"UNKNOWN_COL{i}", _DATA_TYPE[t]) for i, t in enumerate(self.maps[(schema, table)].types)]

    def relay(self, schema: str, table: str) -> list[ColumnDefinition]:
        self.relay_calls.append((schema, table))
        return [
            ColumnDefinition(n, d, False, "utf8mb4" if d in _CHARACTER else None, () if d in ("enum", "set") else None)
            for n, d in self._columns(schema, table)
        ]

    def verifier(self, schema: str, table: str) -> list[ColumnInfo]:
        self.verifier_calls.append((schema, table))
        return [
            ColumnInfo(n, d, f"{d}()" if d in ("enum", "set") else d, UTF8MB4_GENERAL_CI if d in _CHARACTER else None)
            for n, d in self._columns(schema, table)
        ]


# -- the readers -------------------------------------------------------------------------


def relay_records(
    f: BinlogFile,
    catalogue: Catalogue | None = None,
    verify_checksum: bool = True,
    reads: int = 0,
    watched: set[tuple[str, str]] | None = None,
) -> list[tuple]:
    """The relay's decoder (`BinlogDecoder`, every table watched, checksums verified), fed
    event by event as the dump hands them over (`decode`); with `reads`, as the relay's
    reader feeds it a socket's reads instead (`decode_reads` on `PacketRun`s of MySQL
    packets, `reads` events a read, an event it leaves handed over alone, as
    `BinlogConnection.event_runs` does). `watched`: the tables decoded (default: all)."""
    from cdc import source_events as se
    from connectors.mysql.binlog_decoder import BinlogDecoder

    if watched is None:
        watched = set(table_maps(f))
    dec = BinlogDecoder(
        watched, None, verify_checksum=verify_checksum, table_columns=catalogue.relay if catalogue else None
    )
    out: list = []
    if reads:
        _decode_reads(dec, f, catalogue, reads, out)
    else:
        for ev in f.sent:
            if catalogue is not None:
                catalogue.see(ev)
            dec.decode(ev, out)
    records: list[tuple] = []
    for e in out:
        if isinstance(e, se.TxBegin):
            records.append(("gtid", e.gtid, e.start.pos) if e.gtid else ("begin", e.start.pos))
        elif isinstance(e, se.TxCommit):
            records.append(("commit", e.end.pos))
        elif isinstance(e, se.XaPrepare):
            records.append(("xa_prepare", e.xid, e.end.pos))
        elif isinstance(e, se.XaEnd):
            records.append(("xa_end", e.end.pos))
        elif isinstance(e, se.Statement):
            records.append(("statement", e.end.pos))
        elif isinstance(e, se.RowInsert):
            records.append(("insert", e.schema, e.table, plain(e.values), e.end.pos))
        elif isinstance(e, se.RowChange):
            if e.kind == "update":
                records.append(("update", e.schema, e.table, None, plain(e.values), e.end.pos))
            else:
                records.append((e.kind, e.schema, e.table, plain(e.values), e.end.pos))
        elif isinstance(e, se.ServerStarted):
            pass  # the file a server opened at its start: no row, no boundary
        else:
            records.append((type(e).__name__,))
    return records


def _decode_reads(dec: Any, f: BinlogFile, catalogue: Catalogue | None, reads: int, out: list) -> None:
    """`decode_reads` over runs of `reads` event packets; a run ends early before a
    Table_map that changes its table's layout (the catalogue answers for the layout in
    force, as information_schema did when the server wrote the events)."""
    from connectors.mysql.binlog_protocol import PacketRun

    def packet(ev: bytes, seq: int) -> bytes:
        payload = b"\x00" + ev  # the OK byte, then the event (COM_BINLOG_DUMP's replies)
        return struct.pack("<I", len(payload))[:3] + bytes([seq & 0xFF]) + payload

    def flush(events: list[bytes]) -> None:
        run = PacketRun()
        run.data = b"".join(packet(ev, i) for i, ev in enumerate(events))
        taken = 0
        while run.pos < len(run.data):
            before = run.pos
            dec.decode_reads(run, out)
            taken += _packets_between(run.data, before, run.pos)
            if run.pos == before:  # not taken from the buffer: handed over as a list
                dec.decode_reads([events[taken]], out)
                run.pos += 4 + int.from_bytes(run.data[run.pos : run.pos + 3], "little")
                taken += 1

    pending: list[bytes] = []
    for ev in f.sent:
        if catalogue is not None and ev[4] == 19:
            info = _table_map(ev[19 : len(ev) - (4 if crc_ok(ev) else 0)])
            if catalogue.maps.get((info.schema, info.table), info).types != info.types:
                flush(pending)
                pending = []
            catalogue.see(ev)
        pending.append(ev)
        if len(pending) == reads:
            flush(pending)
            pending = []
    flush(pending)


def _packets_between(data: bytes, start: int, end: int) -> int:
    n = 0
    while start < end:
        start += 4 + int.from_bytes(data[start : start + 3], "little")
        n += 1
    return n


def _library_allowed(verifier: bool) -> frozenset:
    from pymysqlreplication.event import (
        ExecuteLoadQueryEvent,
        FormatDescriptionEvent,
        GtidEvent,
        QueryEvent,
        RotateEvent,
        XAPrepareEvent,
        XidEvent,
    )
    from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

    # spark_jobs/mysql/binlog_source.py read_binlog_file's only_events, with UpdateRowsEvent
    # (the verifier reads no updates; here its wiring decodes them for the comparison) and
    # the events the library always adds (TableMapEvent, FormatDescriptionEvent, RotateEvent)
    return frozenset(
        [GtidEvent, QueryEvent, XidEvent, WriteRowsEvent, DeleteRowsEvent, UpdateRowsEvent, RotateEvent]
        + [XAPrepareEvent, ExecuteLoadQueryEvent, TableMapEvent, FormatDescriptionEvent]
    )


class LibraryReader:
    """python-mysql-replication 1.0.17's BinLogStreamReader.fetchone without a server: each
    packet through `BinLogPacketWrapper` with what the stream reader passes it (the table
    map, the Format_description's post-header lengths and version, checksums as the
    server's `binlog_checksum`, optional metadata always read: `stream_reader_class`)."""

    def __init__(self, crc: bool):
        self.table_map: dict = {}
        self.post_headers: Any = None
        self.version = (5, 7, 0)
        self.crc = crc
        self.ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")

    def event(self, packet: Any, allowed: frozenset) -> Any:
        from pymysqlreplication.event import FormatDescriptionEvent, RotateEvent
        from pymysqlreplication.packet import BinLogPacketWrapper

        # positional: table_map, ctl_connection, mysql_version, use_checksum, allowed_events,
        # only_tables, ignored_tables, only_schemas, ignored_schemas, freeze_schema,
        # ignore_decode_errors, verify_checksum, optional_meta_data, enable_logging,
        # use_column_name_cache, post_header_lengths
        w = BinLogPacketWrapper(
            packet, self.table_map, self.ctl, self.version, self.crc, allowed, None, None, None, None, True, False,
            False, True, False, False, self.post_headers,
        )  # fmt: skip
        ev = w.event
        if isinstance(ev, RotateEvent) and w.timestamp != 0:
            self.table_map.clear()
        if isinstance(ev, FormatDescriptionEvent):
            self.version = ev.mysql_version
            self.post_headers = ev.post_header_len
        return ev


def _rows(kind: str, ev: Any, rows: Any, end: int) -> Iterator[tuple]:
    for r in rows:
        if kind == "update":
            yield ("update", ev.schema, ev.table, plain(r["before_values"]), plain(r["after_values"]), end)
        else:
            yield (kind, ev.schema, ev.table, plain(r["values"]), end)


def verifier_records(f: BinlogFile, catalogue: Catalogue) -> tuple[list[tuple], list[str]]:
    """The verifier's own reader: the packets through its replication connection
    (`ExpandingConnection._read_packet`: compressed events expanded, tagged GTIDs, Table_maps
    of watched tables prepared by `TableMapRewriter`), the library's classes as
    `stream_reader_class` makes them read, `row_values`, and the queries classified by
    `classify_query` as `read_binlog_file` does. Also the anomalies its assembly noted."""
    from pymysql.protocol import MysqlPacket
    from pymysqlreplication.event import GtidEvent, QueryEvent, XAPrepareEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from spark_jobs.mysql.binlog_assembly import TxAssembler, classify_query, xid_text
    from spark_jobs.mysql.binlog_compressed import _Format, event_start, tagged_gtid
    from spark_jobs.mysql.binlog_readers import _mysql_values, row_values
    from spark_jobs.mysql.binlog_table_map import TableMapRewriter

    rewriter = TableMapRewriter(set(table_maps(f)), catalogue.verifier)
    conn = _replay_connection([b"\x00" + ev for ev in f.sent], rewriter, catalogue)
    conn._binlog_format = _Format()  # as after its COM_BINLOG_DUMP (ExpandingConnection._write_bytes)
    lib = LibraryReader(f.crc)
    allowed = _library_allowed(True)
    asm = TxAssembler(open=True)
    records: list[tuple] = []
    while conn.pending():
        packet = conn._read_packet(MysqlPacket)
        ev = lib.event(packet, allowed)
        if ev is None:
            continue
        p = ev.packet
        end = p.log_pos
        if isinstance(ev, GtidEvent):
            records.append(("gtid", tagged_gtid(p) or ev.gtid, event_start(p)))
        elif isinstance(ev, XidEvent):
            records.append(("commit", end))
        elif isinstance(ev, XAPrepareEvent):
            records.append(("xa_prepare", xid_text(ev.xid_format_id, ev.xid_gtrid, ev.xid_bqual), end))
        elif isinstance(ev, QueryEvent):
            query = ev.query if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace")
            kind, _ = classify_query(query)
            records.append(
                ("begin", event_start(p))
                if kind == "begin"
                else ("commit", end)
                if kind == "commit"
                else ("xa_end", end)
                if kind == "xa_end"
                else ("statement", end)
            )
        elif isinstance(ev, (WriteRowsEvent, DeleteRowsEvent, UpdateRowsEvent)):
            shape = rewriter.shapes.get(ev.table_id)
            if isinstance(ev, UpdateRowsEvent):
                # the verifier reads no Update_rows; its `row_values` conversions on both images
                rows = [
                    {f"{side}_values": _mysql_values({"values": r[f"{side}_values"],
                                                       "none_sources": r.get(f"{side}_none_sources", {})}, shape)
                     if shape is not None and (shape.json or shape.sets or shape.raw) else r[f"{side}_values"]
                     for side in ("before", "after")}
                    for r in ev.rows
                ]  # fmt: skip
                records += _rows("update", ev, [{k: _sets(v, shape) for k, v in r.items()} for r in rows], end)
                continue
            values = row_values(ev, shape, asm, event_start(p))
            kind = "insert" if isinstance(ev, WriteRowsEvent) else "delete"
            records += _rows(kind, ev, ({"values": _sets(v, shape)} for v in values or []), end)
    return records, asm.anomalies


def _sets(values: dict[str, Any], shape: Any) -> dict[str, Any]:
    """The verifier's SET text (`a,c`; '' the empty set), as the relay gives it too: compared
    as text. (`sets_as_names` reads it as python-mysql-replication's set of names.)"""
    return values


def sets_as_names(records: list[tuple], like: list[tuple]) -> list[tuple]:
    """`records` with each SET text (`a,c`, '') read as the frozenset of its names wherever
    the record at the same place in `like` (python-mysql-replication's) holds a set there."""
    out = []
    for rec, other in zip(records, like, strict=False):
        rec = list(rec)
        for i, (mine, theirs) in enumerate(zip(rec, other, strict=False)):
            if isinstance(mine, dict) and isinstance(theirs, dict):
                rec[i] = {
                    k: (frozenset(v.split(",")) if v else frozenset())
                    if isinstance(v, str) and isinstance(theirs.get(k), frozenset)
                    else v
                    for k, v in mine.items()
                }
        out.append(tuple(rec))
    return out + list(records[len(out) :])


def _sent_class() -> type:
    from connectors.mysql.client import Connection

    class Sent(Connection):
        """The stream connection's socket side: the dump's packets, in order (never connected)."""

        def __init__(self, packets: list[bytes], catalogue: Catalogue):
            self._packets = list(packets)
            self._catalogue = catalogue

        def pending(self) -> bool:
            return bool(self._packets) or bool(getattr(self, "_expanded", None))

        def _read_packet(self, packet_type: Any = None) -> Any:
            data = self._packets.pop(0)
            self._catalogue.see(data[1:])
            return packet_type(data, "utf8")

    return Sent


def _replay_class() -> type:
    from spark_jobs.mysql.binlog_compressed import ExpandingConnection

    sent = _sent_class()

    class ReplayConnection(ExpandingConnection, sent):  # type: ignore[misc,valid-type]
        """ExpandingConnection's own `_read_packet` over `Sent`'s (its `super()`)."""

        def __init__(self, packets: list[bytes], table_maps: Any, catalogue: Catalogue):
            sent.__init__(self, packets, catalogue)  # type: ignore[misc]  # Sent is made at run time: no subclass differs
            from collections import deque

            self._binlog_format = None
            self._expanded = deque()
            self._table_maps = table_maps
            self.encoding = "utf8"

    return ReplayConnection


def _replay_connection(packets: list[bytes], table_maps: Any, catalogue: Catalogue) -> Any:
    return _replay_class()(packets, table_maps, catalogue)


def library_records(f: BinlogFile) -> tuple[list[tuple], list[str]]:
    """Oracle: python-mysql-replication's own classes on the packets as sent, nothing
    prepared (no expansion, no Table_map rewriting). Also the events it could not read:
    (type, end, why)."""
    from pymysql.protocol import MysqlPacket

    lib = LibraryReader(f.crc)
    allowed = _library_allowed(False)
    records: list[tuple] = []
    unread: list[str] = []
    for raw in f.sent:
        try:
            records += _library_event(lib.event(MysqlPacket(b"\x00" + raw, "utf8"), allowed))
        except Exception as exc:
            unread.append(f"type {raw[4]} ending at {_HEADER.unpack_from(raw)[4]}: {type(exc).__name__}: {exc}")
    return records, unread


def _library_event(ev: Any) -> list[tuple]:
    from pymysqlreplication.event import GtidEvent, QueryEvent, XAPrepareEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from spark_jobs.mysql.binlog_assembly import xid_text

    if ev is None:
        return []
    end = ev.packet.log_pos
    start = end - ev.packet.event_size
    if isinstance(ev, GtidEvent):
        return [("gtid", ev.gtid, start)]
    if isinstance(ev, XidEvent):
        return [("commit", end)]
    if isinstance(ev, XAPrepareEvent):
        return [("xa_prepare", xid_text(ev.xid_format_id, ev.xid_gtrid, ev.xid_bqual), end)]
    if isinstance(ev, QueryEvent):
        return [("query", ev.query if isinstance(ev.query, str) else ev.query.decode(), start, end)]
    if isinstance(ev, UpdateRowsEvent):
        return list(_rows("update", ev, ev.rows, end))
    if isinstance(ev, (WriteRowsEvent, DeleteRowsEvent)):
        return list(_rows("insert" if isinstance(ev, WriteRowsEvent) else "delete", ev, ev.rows, end))
    return []


# -- values ------------------------------------------------------------------------------


def plain(values: dict[str, Any]) -> dict[str, Any]:
    """Values as the comparison reads them: a Python set (the library's SET) as a frozenset of
    its names (the relay and the verifier give MySQL's text `a,c`: `sets_as_names`)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, (set, frozenset)):
            v = frozenset(v)
        out[k] = v
    return out


# -- mariadb-binlog ------------------------------------------------------------------------


@dataclass
class MariadbRow:
    kind: str  # insert / update / delete
    schema: str
    table: str
    images: list[list[tuple[str, str]]]  # (value text, type comment) per column, per image
    end: int


_STATEMENT = re.compile(r"^### (INSERT INTO|UPDATE|DELETE FROM) `(.*)`\.`(.*)`$")
_VALUE = re.compile(r"^###   @(\d+)=(.*) /\* (.*) meta=\d+ nullable=\d is_null=(\d) \*/$")


@dataclass
class MariadbOutput:
    rows: list[MariadbRow]
    events: list[tuple[int, int, str]]  # (start, end, what its header line says after the CRC)
    stderr: str
    code: int


_EVENT = re.compile(r"^#\d{6} +\d+:\d\d:\d\d server id \d+ +end_log_pos (\d+) (?:CRC32 0x[0-9a-f]{8} )?\t(.*)$")


def mariadb_binlog(path: Path) -> MariadbOutput:
    """`mariadb-binlog -vv --base64-output=decode-rows FILE`: its rows with the end
    position of their rows event, its events (`# at N` and the header line after it; an
    "Ignorable" event's type is on the next line), its stderr and exit code."""
    proc = subprocess.run(
        ["mariadb-binlog", "-vv", "--base64-output=decode-rows", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    rows: list[MariadbRow] = []
    events: list[tuple[int, int, str]] = []
    end = at = 0
    current: MariadbRow | None = None
    for line in proc.stdout.decode("utf-8", "surrogateescape").splitlines():
        if line.startswith("# at "):
            at = int(line[5:])
            continue
        if line.startswith("# Ignorable event type ") and events:
            events[-1] = (events[-1][0], events[-1][1], line[2:])
            continue
        m = _EVENT.match(line)
        if m:
            end = int(m.group(1))
            events.append((at, end, m.group(2)))
            continue
        m = _STATEMENT.match(line)
        if m:
            kind = {"INSERT INTO": "insert", "UPDATE": "update", "DELETE FROM": "delete"}[m.group(1)]
            current = MariadbRow(kind, m.group(2), m.group(3), [], end)
            rows.append(current)
            continue
        if line in ("### SET", "### WHERE") and current is not None:
            current.images.append([])
            continue
        m = _VALUE.match(line)
        if m and current is not None:
            text = "NULL" if m.group(4) == "1" else m.group(2)
            current.images[-1].append((text, m.group(3)))
    return MariadbOutput(rows, events, proc.stderr.decode("utf-8", "replace"), proc.returncode)


def mariadb_text(value: Any, comment: str, names: list[str] | None = None) -> str:
    """A decoded value as mariadb-binlog prints it (MariaDB log_event_client.cc
    log_event_print_value), for the column type in its comment (`names`: an ENUM's or a
    SET's value names). A negative integer it prints with its unsigned reading after it,
    `-1 (4294967295)` (the binlog does not say which one the column is): this gives the
    first part."""
    if value is None:
        return "NULL"
    kind = comment.split("(")[0].split(" ")[0]
    if isinstance(value, bool):
        value = int(value)
    if kind in ("TINYINT", "SHORTINT", "MEDIUMINT", "INT", "LONGINT"):
        bits = {"TINYINT": 8, "SHORTINT": 16, "MEDIUMINT": 24, "INT": 32, "LONGINT": 64}[kind]
        signed = value - (1 << bits) if value >= 1 << (bits - 1) else value
        if signed < 0:
            return f"{signed} ({signed + (1 << bits)})"
        return str(signed)
    if kind == "DECIMAL":
        return str(value)
    if kind in ("DOUBLE", "FLOAT"):
        return f"{value:.{17 if kind == 'DOUBLE' else 9}g}"
    if kind == "TIMESTAMP":
        stamp = value.replace(tzinfo=datetime.UTC).timestamp()
        return str(int(stamp)) if stamp == int(stamp) else f"{stamp:.6f}".rstrip("0")
    if kind in ("DATETIME",):
        return f"'{value:%Y-%m-%d %H:%M:%S}'" + (f".{value.microsecond:06d}'" if value.microsecond else "")
    if kind == "DATE":
        return f"'{value:%Y:%m:%d}'"
    if kind in ("STRING", "VARSTRING") or "BLOB" in kind:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return "'" + _escaped(raw) + "'"
    if kind == "BIT":
        return f"b'{value}'"
    if kind == "ENUM":  # the index (1 = the first name); `names`: the Table_map's
        return str(value if isinstance(value, int) else (names or []).index(value) + 1)
    if kind == "SET":  # the bitmask in binary, 8 bits a byte
        if isinstance(value, str):  # MySQL's text of the set, as the relay gives it
            value = value.split(",") if value else []
        if not isinstance(value, int):
            value = sum(1 << (names or []).index(n) for n in value)
        return f"b'{value:0{8 * int(comment.split('(')[1].split(' ')[0])}b}'"
    if isinstance(value, decimal.Decimal):
        return str(value)
    return repr(value)


def _escaped(raw: bytes) -> str:
    """A string as mariadb-binlog 3.5 prints it (my_b_write_quoted, MariaDB
    log_event_client.cc; as its output here shows): a byte above 0x1F as it is (a quote
    too), any other as \\xNN; read back as the output is read (UTF-8, undecodable bytes
    kept)."""
    out = bytearray()
    for b in raw:
        out += bytes([b]) if b > 0x1F else f"\\x{b:02x}".encode()
    return out.decode("utf-8", "surrogateescape")
