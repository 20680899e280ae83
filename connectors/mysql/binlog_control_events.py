"""The events that describe the stream rather than the data: Format_description (the
server's version, which event types exist and their post-header lengths, the checksum),
Rotate (the file name), Heartbeat, and each event's CRC32 check."""

from __future__ import annotations

import zlib

from cdc.position import file_sequence
from cdc.position import unchecked_position as _pos  # the file name is validated once per Rotate
from cdc.server_version import writes_checksum_algorithm
from cdc.source_events import Heartbeat, ServerStarted
from connectors.mysql.binlog_decode_errors import BinlogDecodeError
from connectors.mysql.binlog_decoder_state import DecoderState
from connectors.mysql.binlog_event_types import (
    DELETE_ROWS_V1,
    DELETE_ROWS_V2,
    EXECUTE_LOAD_QUERY_EVENT,
    MARIADB_ROWS_COMPRESSED,
    MARIADB_TYPES,
    PARTIAL_UPDATE_ROWS_EVENT,
    QUERY_EVENT,
    ROWS_POST_HEADERS,
    TABLE_MAP_EVENT,
    U32,
    UPDATE_ROWS_V1,
    UPDATE_ROWS_V2,
    WRITE_ROWS_V1,
    WRITE_ROWS_V2,
)


def skippable_rows(ph_rows_v1: int) -> frozenset[int]:
    """The rows event types whose handler's first act, for a table that is not watched, is
    to return: every one but Update_rows_v1 / Delete_rows_v1 on a server without v1 rows
    events, whose handlers refuse them first (`_v1_start`)."""
    v1_changes = {UPDATE_ROWS_V1, DELETE_ROWS_V1} if ph_rows_v1 else set()
    return frozenset(
        {WRITE_ROWS_V1, WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2, PARTIAL_UPDATE_ROWS_EVENT}
        | v1_changes
        | set(MARIADB_ROWS_COMPRESSED)
    )


class ControlEvents(DecoderState):
    """Format_description, Rotate and Heartbeat events, and checksums."""

    def _verify(self, ev: bytes) -> None:
        if zlib.crc32(ev[:-4]) != U32(ev, len(ev) - 4)[0]:
            raise BinlogDecodeError(
                f"CRC32 mismatch in an event of type {ev[4]} ending at {self.file}:{U32(ev, 13)[0]}"
            )

    def _rotate(self, ev: bytes, out: list) -> None:
        crc = self.crc
        if not self._crc_known:  # the fake Rotate at stream start precedes any FDE
            crc = 4 if len(ev) >= 31 and zlib.crc32(ev[:-4]) == U32(ev, len(ev) - 4)[0] else 0
        name = ev[19 + 8 : len(ev) - crc].decode()
        file_sequence(name)
        self.file = name
        if U32(ev, 0)[0] != 0:
            self._tables.clear()  # a real rotate: table ids may be reused (the library does the same)

    def _fde(self, ev: bytes, out: list) -> None:
        body = ev[19:]
        version = body[2:52].rstrip(b"\0").decode("ascii", "replace")
        self.server_version = version
        # The post-header list is as long as the server's event types: every server that
        # writes checksums (MySQL 5.6.1+, MariaDB 5.3+) ends the event with the algorithm
        # byte (0 none, 1 CRC32) and a 4-byte checksum, with binlog_checksum=NONE too
        # (MySQL libbinlogevents control_events.cpp, Format_description_event's reading
        # constructor: number_of_event_types less BINLOG_CHECKSUM_ALG_DESC_LEN from
        # checksum_version_product on). A 5.7 server lists types 1-38, 8.0 up to 41, 9.x 42.
        if writes_checksum_algorithm(version):
            self.crc = 4 if ev[-5] == 1 else 0
            ph = body[57:-5]
        else:
            self.crc = 0
            ph = body[57:]
        self._crc_known = True
        # `created` (4 bytes after the 50-byte server version) is set only in the binlog a
        # server opens at its start; a rotation writes 0, and the dump thread zeroes it when
        # a stream starts inside the file (MySQL libbinlogevents control_events.h
        # Format_description_event::created, sql/rpl_binlog_sender.cc
        # send_format_description_event; MariaDB sql/sql_repl.cc). Non-zero: every earlier
        # file predates a server start (cdc/assembly/feed.py's proof of a prepare lost in a crash).
        if len(body) >= 56 and U32(body, 52)[0] and self.file:
            out.append(ServerStarted(_pos(self.file, 4)))
        if not self._flavor_fixed:
            self.dbms = "mariadb" if "mariadb" in version.lower() else "mysql"
        self.post_header = ph
        self._refuse_types_past(len(ph))
        self._ph_query = ph[QUERY_EVENT - 1] if len(ph) >= QUERY_EVENT else 13
        self._ph_load_query = ph[EXECUTE_LOAD_QUERY_EVENT - 1] if len(ph) >= EXECUTE_LOAD_QUERY_EVENT else 26
        # The table id size follows from the post-header lengths of the Table_map and rows
        # events (MySQL's Table_map_event / Rows_event constructors: 6 = a 4-byte table id,
        # servers before 5.1.4; otherwise 6 bytes). A length 0 means the server has no such
        # event type: MySQL 9.0 removed the v1 rows events (23-25).
        lengths = {}
        for t, (name, default, readable) in ROWS_POST_HEADERS.items():
            n = ph[t - 1] if len(ph) >= t else default
            if n not in readable and (t != PARTIAL_UPDATE_ROWS_EVENT or self.dbms == "mysql"):
                why = (
                    "4-byte table ids (servers before MySQL 5.1.4), which this decoder does not read"
                    if n == 6
                    else f"this decoder reads {' or '.join(str(r) for r in readable if r)}"
                )
                raise BinlogDecodeError(
                    f"unsupported binlog layout from server {version}: its Format_description gives {name} "
                    f"(event type {t}) post-header length {n}: {why}"
                )
            lengths[t] = n
        self._ph_table_map = lengths[TABLE_MAP_EVENT]
        self._ph_rows_v1 = lengths[WRITE_ROWS_V1]
        self._ph_rows_v2 = lengths[WRITE_ROWS_V2] or 10
        self._ph_compressed_rows = {t: ph[t - 1] for t in MARIADB_ROWS_COMPRESSED if len(ph) >= t and ph[t - 1]}
        self._skippable_rows = skippable_rows(self._ph_rows_v1)

    def _refuse_types_past(self, listed: int) -> None:
        """An event type past the Format_description's list does not exist on that server
        (a 5.7 server has no Partial_update_rows, Transaction_payload or tagged GTID): its
        handler refuses it instead of reading it with lengths from past the list. MariaDB's
        own types (160 on) are left to their handlers, which read their defaults."""
        h = self._handlers
        h.update(self._known_handlers)
        if self.dbms != "mysql":
            return
        for t in self._known_handlers:
            if listed < t < MARIADB_TYPES:
                h[t] = self._nonexistent

    def _nonexistent(self, ev: bytes, out: list) -> None:
        raise BinlogDecodeError(
            f"an event of type {ev[4]} ending at {self.file}:{U32(ev, 13)[0]}, a type server {self.server_version} "
            f"does not have (its Format_description lists event types 1-{len(self.post_header)})"
        )

    def _heartbeat(self, ev: bytes, out: list) -> None:
        log_pos = U32(ev, 13)[0]
        if self.file and log_pos:
            out.append(Heartbeat(_pos(self.file, log_pos)))
