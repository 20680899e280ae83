"""The verifier's own reading of compressed binlog events, for python-mysql-replication.

python-mysql-replication 1.0.17 knows neither MariaDB's compressed events
(`log_bin_compress=ON`: Query_compressed 165, Write/Update/Delete_rows_compressed_v1
166-168 and Write/Update/Delete_rows_compressed 169-171) nor MySQL's Transaction_payload
(type 40, `binlog_transaction_compression=ON`): it drops them without a word. So the
verifier's replication connection (`ExpandingConnection`, handed to the library as its
`pymysql_wrapper`) rewrites each such event packet, before the library sees it, into the
plain event packet(s) it stands for, and the library's own event classes decode them:

* a MariaDB compressed event becomes the plain event of the same header (type 2, 23..25 or
  30..32, the same end position), with its compressed part inflated and its size and
  checksum made right for the new length;
* a Transaction_payload becomes its inner events, one packet each, every one ending where
  the payload ends (the library's `log_pos`), with a checksum added when the server writes
  them.

`stored_start` on the packet (`event_start`) names where the event stored in the binlog
starts: the compressed event's own start, or the payload's start for every event inside a
payload. So a transaction begun inside a payload starts at the payload, and one that ends
inside it ends with it, as in the relay's headers.

The same connection stands in a MySQL 8.4 Gtid_tagged_log_event (type 42), which the
library does not know either, by the Gtid_log_event of the same transaction and keeps its
tagged GTID on the packet (`tagged_gtid`): see spark_jobs/mysql/binlog_tagged_gtid.py.

This module shares no code with the relay's `connectors/mysql/binlog_compression.py`; it
decompresses with other calls (`zlib.decompress`, zstandard's one-shot `decompress`), so
one bug cannot hide itself in both. What does not add up raises `CompressedEventError`
(the read of that range fails with one line naming the event).
"""

from __future__ import annotations

import struct
import zlib
from collections import deque
from typing import Any

from pymysql.protocol import MysqlPacket

from connectors.mysql.client import Connection
from spark_jobs.mysql.binlog_tagged_gtid import GTID_TAGGED_EVENT, TaggedGtidEventError, as_gtid_event_body, read_tagged

__all__ = [
    "CompressedEventError", "ExpandingConnection", "event_start", "expand_event", "lenenc_int", "prepare_event",
    "rebuilt_event", "tagged_gtid",
]  # fmt: skip

_FDE, _QUERY, _PAYLOAD, _TABLE_MAP = 15, 2, 40, 19
_PARTIAL_UPDATE_ROWS = 39
_PREPARED = frozenset({_TABLE_MAP, _PARTIAL_UPDATE_ROWS})  # given to a TableMapRewriter's `prepare`
_MARIADB_QUERY_COMPRESSED = 165
_MARIADB_ROWS = {166: 23, 167: 24, 168: 25, 169: 30, 170: 31, 171: 32}  # compressed -> plain type
_EXPANDED_OR_LEARNED = frozenset({_FDE, _PAYLOAD, _MARIADB_QUERY_COMPRESSED, *_MARIADB_ROWS, GTID_TAGGED_EVENT})
_GTID = 33
_UPDATES = (167, 170)
_V2 = (169, 170, 171)
_COM_BINLOG_DUMP, _COM_BINLOG_DUMP_GTID = 0x12, 0x1E
_ROTATE = 4
# Rows events (Write / Update / Delete v1 and v2, MySQL's partial update): the table id is the
# first 6 bytes of the post-header (rows_event.h, as for a Table_map)
_ROWS = frozenset({23, 24, 25, 30, 31, 32, _PARTIAL_UPDATE_ROWS})
# Events the verifier's reader never asks the library for and the library only reads the
# header of: MariaDB's Annotate_rows (the statement text before each statement's rows with
# binlog_annotate_row_events, on by default) and MySQL's Rows_query
_UNREAD = frozenset({160, 29})
_HEADER = struct.Struct("<IBIIIH")


class CompressedEventError(RuntimeError):
    """A compressed binlog event the verifier cannot expand exactly."""


class _Packet(MysqlPacket):
    __slots__ = ("stored_start", "tagged_gtid")


def tagged_gtid(packet: Any) -> str | None:
    """The tagged GTID (`uuid:tag:gno`) of a library GtidEvent's packet that stands for a
    Gtid_tagged_log_event; None for any other packet."""
    inner = packet.packet
    return getattr(inner, "tagged_gtid", None) if type(inner) is _Packet else None


def tagged_as_gtid_event(ev: bytes, fmt: _Format) -> tuple[bytes, str]:
    """A Gtid_tagged_log_event -> (the Gtid_log_event that stands for it, its tagged GTID);
    the same header (end position, time, server id), its size and checksum made right."""
    header = _HEADER.unpack_from(ev)
    try:
        tagged = read_tagged(ev[19 : len(ev) - fmt.checksum])
    except (TaggedGtidEventError, IndexError) as exc:
        raise TaggedGtidEventError(f"Gtid_tagged_log_event ending at {header[4]}: {exc}") from None
    return _event(header, as_gtid_event_body(tagged), fmt.checksum, _GTID), tagged.gtid


def event_start(packet: Any) -> int:
    """Where the event of a library event's packet (`event.packet`) starts in the binlog."""
    inner = packet.packet  # the library's wrapper around the connection's packet
    if type(inner) is _Packet:
        return inner.stored_start
    return packet.log_pos - packet.event_size


class _Format:
    """What the Format_description event says: checksums, post-header lengths, the
    server's version (MariaDB's contains "MariaDB")."""

    def __init__(self) -> None:
        self.checksum = 4
        self.post_header = b""
        self.server_version = ""

    def learn(self, ev: bytes) -> None:
        self.server_version = ev[21:71].rstrip(b"\x00").decode("ascii", "replace")  # after binlog version (2)
        # Every server that writes checksums ends its Format_description with the algorithm
        # byte and a 4-byte CRC (with binlog_checksum=NONE too), computed with the "file in
        # use" flag (0x01 of the header's flags) clear: a file copied from a running server
        # keeps the flag set. The post-header lengths before them are one per event type the
        # server has (5.7: 38, 8.0: 41, 9.x: 42): a type past the list does not exist there.
        flags = struct.unpack_from("<H", ev, 17)[0]
        signed = ev[:17] + struct.pack("<H", flags & ~1) + ev[19:-4]
        crc_ok = zlib.crc32(signed) & 0xFFFFFFFF == struct.unpack("<I", ev[-4:])[0]
        self.checksum = 4 if crc_ok and ev[-5] == 1 else 0
        self.post_header = ev[19 + 57 : len(ev) - (5 if crc_ok else 0)]

    def post_header_len(self, kind: int, default: int) -> int:
        if kind <= len(self.post_header) and self.post_header[kind - 1]:
            return self.post_header[kind - 1]
        return default


def _event(header: tuple, body: bytes, checksum: int, kind: int | None = None) -> bytes:
    """An event from header fields and body, its size field and checksum made right."""
    ts, old_kind, server_id, _size, log_pos, flags = header
    size = 19 + len(body) + checksum
    raw = _HEADER.pack(ts, old_kind if kind is None else kind, server_id, size, log_pos, flags) + body
    if checksum:
        raw += struct.pack("<I", zlib.crc32(raw) & 0xFFFFFFFF)
    return raw


def lenenc_int(data: bytes, at: int) -> tuple[int, int]:
    """A length-encoded integer (MySQL protocol) at `at`: (value, where it ends)."""
    first = data[at]
    if first < 0xFB:
        return first, at + 1
    if first == 0xFC:
        return struct.unpack_from("<H", data, at + 1)[0], at + 3
    if first == 0xFD:
        return int.from_bytes(data[at + 1 : at + 4], "little"), at + 4
    if first == 0xFE:
        return struct.unpack_from("<Q", data, at + 1)[0], at + 9
    raise CompressedEventError(f"a length-encoded integer starts with 0x{first:02x}")


def _unzip(data: bytes) -> bytes:
    flags = data[0]
    if not flags & 0x80 or (flags >> 4) & 0x07:
        raise CompressedEventError(f"compression header 0x{flags:02x} names no zlib block")
    width = flags & 0x07
    expected = int.from_bytes(data[1 : 1 + width], "big")
    try:
        plain = zlib.decompress(data[1 + width :], zlib.MAX_WBITS, max(expected, 1))
    except zlib.error as exc:
        raise CompressedEventError(f"zlib: {exc}") from None
    if len(plain) != expected:
        raise CompressedEventError(f"inflated to {len(plain)} bytes, the header says {expected}")
    return plain


def _mariadb(ev: bytes, fmt: _Format) -> bytes:
    header = _HEADER.unpack_from(ev)
    kind = header[1]
    body = ev[19 : len(ev) - fmt.checksum]
    if kind == _MARIADB_QUERY_COMPRESSED:
        fixed = fmt.post_header_len(kind, 13)
        schema_len = body[8]
        (status_len,) = struct.unpack_from("<H", body, 11)
        cut = fixed + status_len + schema_len + 1
        return _event(header, body[:cut] + _unzip(body[cut:]), fmt.checksum, _QUERY)
    cut = fmt.post_header_len(kind, 10 if kind in _V2 else 8)
    if kind in _V2:
        cut += struct.unpack_from("<H", body, 8)[0] - 2
    width, cut = lenenc_int(body, cut)
    cut += (width + 7) // 8 * (2 if kind in _UPDATES else 1)
    return _event(header, body[:cut] + _unzip(body[cut:]), fmt.checksum, _MARIADB_ROWS[kind])


def _payload_events(ev: bytes, fmt: _Format) -> list[bytes]:
    header = _HEADER.unpack_from(ev)
    body = ev[19 : len(ev) - fmt.checksum]
    fields: dict[int, int] = {}
    at = 0
    while True:
        code, at = lenenc_int(body, at)
        if code == 0:
            break
        length, at = lenenc_int(body, at)
        fields[code], _ = lenenc_int(body[at : at + length], 0)
        at += length
    data = body[at:]
    if 1 in fields and fields[1] != len(data):
        raise CompressedEventError(f"payload of {len(data)} bytes, the header says {fields[1]}")
    method = fields.get(2, 255)
    if method == 0:
        import zstandard

        try:
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=fields.get(3, 1 << 30))
        except zstandard.ZstdError as exc:
            raise CompressedEventError(f"zstd: {exc}") from None
    elif method != 255:
        raise CompressedEventError(f"compression type {method} is neither zstd (0) nor none (255)")
    if 3 in fields and fields[3] != len(data):
        raise CompressedEventError(f"payload of {len(data)} bytes uncompressed, the header says {fields[3]}")
    events = []
    view = memoryview(data)
    while view:
        if len(view) < 19:
            raise CompressedEventError("an inner event is cut short")
        inner = _HEADER.unpack_from(view)
        size = inner[3]
        if size < 19 or size > len(view):
            raise CompressedEventError(f"an inner event of {size} bytes with {len(view)} left")
        # the inner event ends where the payload ends; MySQL writes it without a checksum
        placed = (inner[0], inner[1], inner[2], 0, header[4], inner[5])
        events.append(_event(placed, bytes(view[19:size]), fmt.checksum))
        view = view[size:]
    return events


def expand_event(ev: bytes, fmt: _Format) -> list[tuple[bytes, int]] | None:
    """(plain event, start of the stored event) for each event a compressed event stands
    for; None for an event that is not compressed."""
    kind = ev[4]
    if kind == _FDE:
        fmt.learn(ev)
        return None
    if kind != _PAYLOAD and kind != _MARIADB_QUERY_COMPRESSED and kind not in _MARIADB_ROWS:
        return None
    size, end = struct.unpack_from("<II", ev, 9)
    start = end - size
    try:
        if kind == _PAYLOAD:
            return [(inner, start) for inner in _payload_events(ev, fmt)]
        return [(_mariadb(ev, fmt), start)]
    except (IndexError, struct.error) as exc:
        raise CompressedEventError(f"event of type {kind} at {start}: malformed ({exc})") from None
    except CompressedEventError as exc:
        raise CompressedEventError(f"event of type {kind} at {start} cannot be expanded: {exc}") from None


class ExpandingConnection(Connection):
    """A PyMySQL connection (python-mysql-replication's `pymysql_wrapper`) that, once it
    has asked for a binlog dump, hands out compressed events as the plain events they
    stand for, and (with `table_maps`, a binlog_table_map.TableMapRewriter) the Table_maps
    and partial JSON updates of watched tables as the library must read them. Other
    connections made with it (the library's control connection) are plain PyMySQL
    connections."""

    _table_maps: Any = None  # set per connection below; None: nothing to prepare
    _given: dict[int, bytes] | None = None  # table id -> the Table_map body the library was given

    def __init__(self, *args: Any, table_maps: Any = None, **kwargs: Any):
        self._binlog_format: _Format | None = None
        self._expanded: deque = deque()
        # spark_jobs/binlog_table_map.TableMapRewriter: Table_maps and partial updates of
        # watched tables as the library must read them
        self._table_maps = table_maps
        self._given = {}
        super().__init__(*args, **kwargs)

    def _write_bytes(self, data: bytes) -> None:
        if len(data) > 4 and data[4] in (_COM_BINLOG_DUMP, _COM_BINLOG_DUMP_GTID):
            self._binlog_format = _Format()
        super()._write_bytes(data)

    def _read_packet(self, packet_type: Any = MysqlPacket) -> Any:
        if self._expanded:
            return self._expanded.popleft()
        packet = super()._read_packet(packet_type)
        fmt = self._binlog_format
        if fmt is None:
            return packet
        data = packet.get_all_data()
        while self._table_maps is not None and len(data) >= 26 and data[0] == 0 and self._redundant(data, fmt):
            packet = super()._read_packet(packet_type)
            data = packet.get_all_data()
        if len(data) < 20 or data[0] != 0:
            return packet  # not an event
        kind = data[5]
        table_maps = self._table_maps
        if kind not in _EXPANDED_OR_LEARNED and (kind not in _PREPARED or table_maps is None):
            return packet  # neither compressed, a format description nor an event to prepare
        raw = bytes(data[1:])
        if kind == GTID_TAGGED_EVENT:
            ev, gtid = tagged_as_gtid_event(raw, fmt)
            size, end = struct.unpack_from("<II", raw, 9)
            out = _Packet(b"\x00" + ev, self.encoding)
            out.stored_start, out.tagged_gtid = end - size, gtid
            return out
        prepared = prepare_event(raw, fmt, table_maps)
        if prepared is None:
            return packet
        for ev, start in prepared:
            out = _Packet(b"\x00" + ev, self.encoding)
            out.stored_start, out.tagged_gtid = start, None
            self._expanded.append(out)
        return self._expanded.popleft()

    def _redundant(self, data: Any, fmt: _Format) -> bool:
        """Whether the library would take nothing from this event (`data`: the packet, its OK
        byte first), so it is not handed over: the library builds an object for every event
        it is given, and at ten single-row INSERTs a transaction these were more than half
        of them. With the verifier's `freeze_schema=True` the library keeps the first
        Table_map of a table id and ignores the later ones (row_event.py TableMapEvent);
        so a Table_map whose body is the one last handed over for its id since the last
        Rotate / Format_description (the library forgets its table ids at a Rotate) is
        not handed over again. A rows event of a table id whose Table_map named a table not
        watched is one the library drops (its `only_tables`: that Table_map is not kept,
        the rows event finds no table); so are Annotate_rows and Rows_query events (not
        among the events the reader asks for)."""
        kind = data[5]
        given = self._given
        if given is None:  # a subclass that sets its fields itself
            given = self._given = {}
        if kind == _TABLE_MAP:
            table_id = int.from_bytes(data[20:26], "little")
            body = bytes(data[20 : len(data) - fmt.checksum])
            if given.get(table_id) == body:
                return True
            given[table_id] = body
            return False
        if kind in _ROWS:
            return bool(self._table_maps.unwatched(int.from_bytes(data[20:26], "little")))
        if kind in _UNREAD:
            return True
        if kind in (_ROTATE, _FDE):
            given.clear()
        return False


def prepare_event(raw: bytes, fmt: _Format, table_maps: Any = None) -> list[tuple[bytes, int]] | None:
    """What the library gets for one event read: `expand_event`'s events, each Table_map
    and partial update among them prepared by `table_maps` (a
    binlog_table_map.TableMapRewriter, optional); None when the event goes to the library
    as it is."""
    expanded = expand_event(raw, fmt)
    if table_maps is None:
        return expanded
    if expanded is None:
        if raw[4] not in _PREPARED:
            return None
        size, end = struct.unpack_from("<II", raw, 9)
        expanded = [(raw, end - size)]
    return [(table_maps.prepare(ev, fmt) if ev[4] in _PREPARED else ev, start) for ev, start in expanded]


def rebuilt_event(ev: bytes, body: bytes, checksum: int, kind: int | None = None) -> bytes:
    """`ev` with a new body (and type), its size and checksum made right."""
    return _event(_HEADER.unpack_from(ev), body, checksum, kind)
