"""Raw binlog events (from `connectors.mysql.binlog_protocol`) -> `cdc.source_events`.

A lean replacement for python-mysql-replication + `binlog_library.LibraryConverter` that yields
the same source events with the same positions and the same Python values, at a fraction
of the cost:

* A Table_map event is decoded once per distinct body (the bytes after the table id):
  repeated identical Table_maps — one before every row event — cost one dict lookup, and
  an ALTER TABLE, which changes the bytes, is decoded afresh. Column names, signedness,
  charsets and ENUM/SET values come from the optional metadata
  (binlog_row_metadata=FULL); for a watched table whose Table_map lacks names or ENUM/SET
  values (MINIMAL), from the optional `table_columns` port (connectors/mysql/table_columns.py).
* Tables that are not watched keep only (schema, table); their row events are skipped
  after one dict lookup, their rows are never decoded.
* For a watched table, one Python function per (table layout, columns-present bitmap) is
  generated (once) that decodes a whole row image with inlined per-column code and
  builds the values dict with a dict display.

Values follow python-mysql-replication 1.0.17 (the library's own conversions are reused
for charsets, and its arithmetic is mirrored for DECIMAL, temporal types and BIT), so a
row decodes to an equal dict, with these exceptions, where the library loses or mangles a
value: a MySQL JSON column is MySQL's own text of the document (connectors/mysql/json_binary.py);
Partial_update_rows (partial JSON updates, connectors/mysql/json_diff.py) is decoded; an ENUM or
SET without value names is its index / bitmask, not None; a SET is MySQL's text of it (`a,c`, the
empty set ''), not a Python set; a VECTOR is its bytes; no stored value becomes None
(docs/mysql.md, "Zero-like values"): YEAR 0 is 0 (not 1900), a
DATE / DATETIME Python cannot hold (`0000-00-00`, `2024-00-00`, `2024-02-31`) and a TIMESTAMP of 0
seconds (not 1970-01-01) are MySQL's text of them (connectors/mysql/temporal_text.py). Types the
library cannot decode raise `UnsupportedColumnType` (at the Table_map of a watched table).
The Format_description's post-header lengths say which events exist and how their
post-headers are laid out (MySQL 9 has no v1 rows events).

Compressed events (`connectors/mysql/binlog_compression.py`): a MariaDB *_COMPRESSED_* event is
decompressed into the plain event it stands for (same header, so the same position) and
decoded as that one. The events inside a MySQL Transaction_payload are decoded in order
as if each sat where the payload sits: each starts at the payload's start and ends at its
end (a payload holds one transaction, so a transaction begun inside it starts at the
payload and its commit ends with it; see docs/binlog-decoding.md, "Compressed binlogs"). A compressed event that cannot
be decompressed exactly, or a payload with a second transaction after a commit, raises
`UndecodableEvent` naming the event, its position and what to do (the library would
drop such events silently).

Where each part is: this module keeps the entry points (`decode`, `decode_batch`, and
`decode_reads`, the relay's loop over a socket read, which handles the events that do
nothing in place) and the dispatch table; the handlers are methods of one class per
event family, which `BinlogDecoder` combines:

  binlog_control_events.py     Format_description, Rotate, Heartbeat, CRC32 checks
  binlog_gtid_events.py        MySQL Gtid_log_event (and its tagged form), MariaDB Gtid_event
  binlog_query_events.py       Query, Execute_load_query, XA_prepare, Xid
  binlog_table_map.py          Table_map (layouts in binlog_table_layout.py)
  binlog_rows.py               Write/Update/Delete_rows, Partial_update_rows
  binlog_compressed_events.py  MariaDB compressed events, MySQL Transaction_payload

with the generated row readers and inserters in binlog_row_code.py (the values they call
in binlog_value_readers.py), the type codes in binlog_event_types.py and
binlog_column_types.py, the errors in binlog_decode_errors.py and the fields the
families share in binlog_decoder_state.py.
"""

from __future__ import annotations

import struct
from typing import Any

from cdc.position import file_sequence
from connectors.mysql import table_columns as _table_columns
from connectors.mysql.binlog_compressed_events import CompressedEvents
from connectors.mysql.binlog_control_events import ControlEvents, skippable_rows
from connectors.mysql.binlog_decode_errors import (
    BinlogDecodeError,
    ServerSettingRequired,
    UndecodableEvent,
    UnsupportedColumnType,
)
from connectors.mysql.binlog_event_types import (
    DELETE_ROWS_V1,
    DELETE_ROWS_V2,
    EXECUTE_LOAD_QUERY_EVENT,
    FL_STANDALONE,
    FORMAT_DESCRIPTION_EVENT,
    GTID_LOG_EVENT,
    GTID_TAGGED_LOG_EVENT,
    HEARTBEAT_LOG_EVENT,
    MARIADB_GTID_EVENT,
    MARIADB_QUERY_COMPRESSED,
    MARIADB_ROWS_COMPRESSED,
    PARTIAL_UPDATE_ROWS_EVENT,
    QUERY_EVENT,
    ROTATE_EVENT,
    TABLE_MAP_EVENT,
    TRANSACTION_PAYLOAD_EVENT,
    U32,
    UPDATE_ROWS_V1,
    UPDATE_ROWS_V2,
    WRITE_ROWS_V1,
    WRITE_ROWS_V2,
    XA_PREPARE_LOG_EVENT,
    XID_EVENT,
)
from connectors.mysql.binlog_gtid_events import GtidEvents, MysqlGtid, parse_mysql_gtid
from connectors.mysql.binlog_query_events import QueryEvents
from connectors.mysql.binlog_rows import RowsEvents
from connectors.mysql.binlog_table_layout import Table
from connectors.mysql.binlog_table_map import TableMapEvents

# Imported where first needed (in the family modules' handlers), not with this module: what
# only MySQL JSON columns, partial JSON updates, tagged GTIDs and compressed events use
# (connectors/mysql/json_binary.py, json_diff.py, gtid_tagged.py, binlog_compression.py).
# The reader process imports this module on the way to its first event, and those four
# were a third of its import time (14 of 41 ms CPU, python -X importtime, on a loaded
# machine; tests/unit/test_decoder_imports.py).

__all__ = [
    "DELETE_ROWS_V1",
    "DELETE_ROWS_V2",
    "EXECUTE_LOAD_QUERY_EVENT",
    "FL_STANDALONE",
    "FORMAT_DESCRIPTION_EVENT",
    "GTID_LOG_EVENT",
    "GTID_TAGGED_LOG_EVENT",
    "HEARTBEAT_LOG_EVENT",
    "MARIADB_GTID_EVENT",
    "MARIADB_QUERY_COMPRESSED",
    "MARIADB_ROWS_COMPRESSED",
    "PARTIAL_UPDATE_ROWS_EVENT",
    "QUERY_EVENT",
    "ROTATE_EVENT",
    "TABLE_MAP_EVENT",
    "TRANSACTION_PAYLOAD_EVENT",
    "UPDATE_ROWS_V1",
    "UPDATE_ROWS_V2",
    "WRITE_ROWS_V1",
    "WRITE_ROWS_V2",
    "XA_PREPARE_LOG_EVENT",
    "XID_EVENT",
    "BinlogDecodeError",
    "BinlogDecoder",
    "MysqlGtid",
    "ServerSettingRequired",
    "UndecodableEvent",
    "UnsupportedColumnType",
    "parse_mysql_gtid",
]

# `decode_reads` frames the binlog stream's event packets itself (MySQL Client/Server
# Protocol, "MySQL Packets": 3-byte payload length, 1-byte sequence id; COM_BINLOG_DUMP's
# reply packets: the OK byte 0x00, then the event). One unpack reads all a dropped event
# needs: the length and sequence id, the OK byte, the event type (header offset 4) and the
# 6 bytes at event offset 19, a rows event's or Table_map's table id (post-header, MySQL
# libbinlogevents rows_event.h / Table_map_event).
_RUN_HEAD = struct.Struct("<IB4xB14x6s").unpack_from
_RUN_HEAD_SIZE = 30
_RUN_MIN = 1 + 25  # an OK byte and an event long enough to hold a table id
_MAX_PACKET = 0xFFFFFF  # a payload this long continues in the next physical packet


class BinlogDecoder(ControlEvents, GtidEvents, CompressedEvents, QueryEvents, TableMapEvents, RowsEvents):
    """Turns raw binlog events into `cdc.source_events`; keeps the current file name.

    `watched`: the (schema, table) pairs whose rows are decoded; `start_file`: the file
    the stream starts in (None for a GTID start: the server's first, fake, Rotate names
    it). `flavor`: "mariadb" / "mysql" (charset tables differ); None = from the
    Format_description event. `legacy_begin_start`: reproduce `_Converter`'s TxBegin.start
    (see the module docstring). `verify_checksum`: check every event's CRC32.
    `table_columns`: where a watched table's column names and ENUM/SET values come from
    when its Table_map lacks them (binlog_row_metadata=MINIMAL; connectors/mysql/table_columns.py);
    None: such a table's columns are named UNKNOWN_COLn, an ENUM is its index and a SET its
    bitmask (ints).
    """

    def __init__(
        self,
        watched: set[tuple[str, str]],
        start_file: str | None,
        *,
        flavor: str | None = None,
        legacy_begin_start: bool = False,
        verify_checksum: bool = False,
        table_columns: _table_columns.TableColumns | None = None,
    ):
        self.watched = set(watched)
        self.table_columns = table_columns
        self.file = ""  # "": not known until the stream's first Rotate event
        if start_file is not None:
            file_sequence(start_file)
            self.file = start_file
        self.dbms = flavor or "mysql"
        self._flavor_fixed = flavor is not None
        self.legacy_begin_start = legacy_begin_start
        self.verify_checksum = verify_checksum
        self.crc = 4  # bytes of checksum at the end of each event (until a FDE says otherwise)
        self._crc_known = False
        self.post_header: bytes = b""
        self._ph_query = 13
        self._ph_load_query = 26
        self._ph_table_map = 8
        self._ph_rows_v1 = 8
        self._ph_rows_v2 = 10
        self._ph_compressed_rows: dict[int, int] = {}  # MariaDB's compressed rows types, from the FDE
        self._skippable_rows = skippable_rows(self._ph_rows_v1)
        self.server_version: str | None = None
        self._tables: dict[bytes, Table] = {}  # 6-byte table id -> layout
        self._layouts: dict[bytes, Table] = {}  # Table_map body after the table id -> layout
        self.table_maps_decoded = 0
        h: dict[int, Any] = {
            QUERY_EVENT: self._query,
            ROTATE_EVENT: self._rotate,
            FORMAT_DESCRIPTION_EVENT: self._fde,
            XID_EVENT: self._xid,
            TABLE_MAP_EVENT: self._table_map,
            WRITE_ROWS_V1: self._write_v1,
            WRITE_ROWS_V2: self._write_v2,
            UPDATE_ROWS_V1: self._update_v1,
            UPDATE_ROWS_V2: self._update_v2,
            DELETE_ROWS_V1: self._delete_v1,
            DELETE_ROWS_V2: self._delete_v2,
            PARTIAL_UPDATE_ROWS_EVENT: self._partial_update,
            HEARTBEAT_LOG_EVENT: self._heartbeat,
            GTID_LOG_EVENT: self._mysql_gtid,
            GTID_TAGGED_LOG_EVENT: self._mysql_tagged_gtid,
            MARIADB_GTID_EVENT: self._mariadb_gtid,
            XA_PREPARE_LOG_EVENT: self._xa_prepare,
            EXECUTE_LOAD_QUERY_EVENT: self._load_query,
            TRANSACTION_PAYLOAD_EVENT: self._payload,
            MARIADB_QUERY_COMPRESSED: self._query_compressed,
        }
        for t in MARIADB_ROWS_COMPRESSED:
            h[t] = self._rows_compressed
        self._handlers = h
        self._known_handlers = dict(h)  # h less what a Format_description says the server lacks
        self._get_handler = h.get

    # -- entry point ----------------------------------------------------------------

    def decode_batch(self, events: list[bytes], out: list) -> None:
        """`decode` for each event of `events` (a list of `bytes`, as
        `BinlogConnection.event_batches` yields them, and as `event_runs` hands over an
        event `decode_reads` left or one that was split across reads). The relay's loop
        over a socket read's events, with the events that do nothing handled in place, is
        `decode_reads`: this one stays the plain loop, so that the fast path is written
        once."""
        for ev in events:
            self.decode(ev, out)

    def decode_reads(self, item: Any, out: list) -> None:
        """`decode` for the events of one item of `BinlogConnection.event_runs`: a list of
        events (`decode_batch`), or a socket read's buffer (`PacketRun`), whose complete
        event packets this loop frames itself from `item.pos` on, leaving `item.pos` at
        the first one it does not take (the connection hands that one over as a list).

        A rows event of a table that is not watched and a Table_map of a cached layout
        are read in the buffer and never become a bytes object (on the mixed binlog of
        bench/workloads.py, 20 events in 22); every other event reaches its handler as
        the same bytes `event_batches` gives: the packet's payload after the OK byte."""
        if type(item) is list:
            self.decode_batch(item, out)
            return
        data, p = item.data, item.pos
        # a packet of 16 MiB - 1 continues in the next physical packet: ending past `size`,
        # it is left to the framing like a packet the read has not completed
        size = min(len(data), _MAX_PACKET)
        last = size - _RUN_HEAD_SIZE
        head = _RUN_HEAD
        if self.verify_checksum:  # every event checked: no skipping
            while p <= last:
                n, ok, t, tid = head(data, p)
                n &= 0xFFFFFF
                end = p + 4 + n
                if ok or end > size or n < _RUN_MIN:
                    break
                self.decode(data[p + 5 : end], out)
                p = end
            item.pos = p
            return
        get = self._get_handler
        skippable = self._skippable_rows
        tables, layouts = self._tables, self._layouts  # changed in place only
        crc = self.crc
        append = out.append
        while p <= last:
            n, ok, t, tid = head(data, p)
            n &= 0xFFFFFF
            end = p + 4 + n
            if ok or end > size or n < _RUN_MIN:
                break  # not an event packet, not complete, or shorter than a table id
            # the event is data[p + 5 : end]; the Table_map first: on a mixed binlog it is
            # every other event
            if t == TABLE_MAP_EVENT:
                tbl = layouts.get(data[p + 30 : end - crc])  # the event's [25 : -crc]
                if tbl is not None and not tbl.looked_up:
                    tables[tid] = tbl
                    p = end
                    if tbl.columns is None and p <= last:
                        # A table that is not watched: the next event is most often this
                        # Table_map's rows event (one per statement), dropped here when it
                        # is (what the loop's next turn would decide, one table look-up
                        # and one turn fewer: 7% of this loop on the mixed capture).
                        n, ok, t, rows_tid = head(data, p)
                        n &= 0xFFFFFF
                        end = p + 4 + n
                        # (a rows event too short to hold a table id is dropped either way)
                        if rows_tid == tid and not ok and end <= size and t in skippable:
                            p = end
                    continue
            elif t in skippable:
                tbl = tables.get(tid)
                if tbl is None or tbl.columns is None:
                    p = end
                    continue
                if t == WRITE_ROWS_V2 or (t == WRITE_ROWS_V1 and self._ph_rows_v1):
                    # A watched table's inserts: what _write_v1 / _write_v2 do after the same
                    # look-up, the table's kept inserter called here (else _inserts makes
                    # one): 3.85 -> 3.69 us a one-row event (outbox-only capture, in-process
                    # A/B). Write_rows_v1 on a server without v1 rows events goes to its
                    # handler, which refuses it.
                    ev, p = data[p + 5 : end], end
                    q = self._rows_start(ev, True) if t == WRITE_ROWS_V2 else 19 + self._ph_rows_v1
                    insert = tbl.inserters.get(ev[q : q + tbl.head])
                    if insert is None:
                        self._inserts(ev, out, tbl, q)
                    else:
                        insert(ev, q + tbl.head, len(ev) - crc, self.file, U32(ev, 13)[0], append)
                    continue
            handler = get(t)
            if handler is not None:
                ev, p = data[p + 5 : end], end
                handler(ev, out)
                skippable = self._skippable_rows  # a Format_description may change it,
                crc = self.crc  # and the CRC's presence
            else:
                p = end
        item.pos = p

    def decode(self, event: bytes, out: list) -> None:
        """Append the source events of one raw binlog event (header + body [+ CRC])."""
        handler = self._get_handler(event[4])
        if handler is not None:
            if type(event) is not bytes:
                event = bytes(event)
            # before the first Format_description the CRC's presence is not known: the fake Rotate
            # of a binlog_checksum=NONE server has none (its handler finds out itself)
            if self.verify_checksum and self.crc and self._crc_known and event[4] != FORMAT_DESCRIPTION_EVENT:
                self._verify(event)
            handler(event, out)
