"""Binlog events as MySQL 5.7 / 8.0 / 8.4 / 9.x writes them: the common header, the CRC32 footer,
and each event body the lab writes.

Common header (`libs/mysql/binlog/event/binlog_event.h` Log_event_header): timestamp (4),
type (1), server_id (4), event_size (4, header + body + checksum), log_pos (4, where the
next event starts), flags (2). Footer: CRC32 of everything before it (4), when the
Format_description's checksum_alg is 1 (`Log_event_footer`). A Format_description is
checksummed with LOG_EVENT_BINLOG_IN_USE_F (0x1) cleared (`Log_event::write_footer`,
`Log_event_footer::event_checksum_test`); MySQL sets that flag while the file is the active
one and clears it in place when it closes the file, and a dump thread clears it before
sending the event (`sql/rpl_binlog_sender.cc` send_format_description_event).
"""

from __future__ import annotations

import struct
import uuid as uuid_mod
import zlib

from testbed.mysql_lab.gtids import GtidInfo
from testbed.mysql_lab.packed_int import net_field_length

__all__ = [
    "ANONYMOUS_GTID",
    "FORMAT_DESCRIPTION",
    "GTID",
    "GTID_TAGGED",
    "PARTIAL_UPDATE_ROWS",
    "PREVIOUS_GTIDS",
    "QUERY",
    "ROTATE",
    "TABLE_MAP",
    "TRANSACTION_PAYLOAD",
    "XA_PREPARE",
    "XID",
    "frame",
]

QUERY, ROTATE, FORMAT_DESCRIPTION, XID, TABLE_MAP = 2, 4, 15, 16, 19
WRITE_ROWS, UPDATE_ROWS, DELETE_ROWS = 30, 31, 32
GTID, ANONYMOUS_GTID, PREVIOUS_GTIDS = 33, 34, 35
XA_PREPARE, PARTIAL_UPDATE_ROWS, TRANSACTION_PAYLOAD, GTID_TAGGED = 38, 39, 40, 42

LOG_EVENT_BINLOG_IN_USE_F = 0x1
STMT_END_F = 0x1  # Rows_event flag on the last rows event of a statement (rows_event.h)
TM_BIT_LEN_EXACT_F = 0x1  # Table_map flag MySQL always sets (rows_event.h)
HEADER = struct.Struct("<IBIIIH")
HEADER_LEN = 19


def frame(
    kind: int, body: bytes, *, server_id: int, log_pos: int, timestamp: int, checksum: bool, flags: int = 0
) -> bytes:
    """Header + body (+ CRC32). `log_pos` is the end of this event in its file (0 inside a
    Transaction_payload, where MySQL writes the inner events without checksums)."""
    size = HEADER_LEN + len(body) + (4 if checksum else 0)
    raw = HEADER.pack(timestamp, kind, server_id, size, log_pos, flags) + body
    if not checksum:
        return raw
    crc_input = raw
    if kind == FORMAT_DESCRIPTION and flags & LOG_EVENT_BINLOG_IN_USE_F:
        crc_input = raw[:17] + struct.pack("<H", flags & ~LOG_EVENT_BINLOG_IN_USE_F) + raw[19:]
    return raw + struct.pack("<I", zlib.crc32(crc_input) & 0xFFFFFFFF)


# -- Format_description (control_events.cpp Format_description_event) ---------------------

_QUERY_HEADER_LEN, _ROTATE_HEADER_LEN, _TABLE_MAP_HEADER_LEN = 13, 8, 8
_ROWS_V1, _ROWS_V2, _GTID_POST_HEADER = 8, 10, 42  # Gtid_event::POST_HEADER_LENGTH = 1+16+8+1+16
_START_V3_HEADER_LEN, _LOAD_HEADER_LEN = 2 + 50 + 4, 18  # MySQL 5.7's, for its deprecated events


def version_tuple(version: str) -> tuple[int, int, int]:
    parts = [int(p) for p in version.split("-")[0].split(".")[:3]]
    return (parts + [0, 0, 0])[0], (parts + [0, 0, 0])[1], (parts + [0, 0, 0])[2]


def event_type_count(version: str) -> int:
    """How many event types a server's Format_description lists (its LOG_EVENT_TYPES, one
    post-header length each), by the last type the version knows (`Log_event_type` in
    libbinlogevents/include/binlog_event.h, the release notes of each addition):
    5.7 ends at XA_PREPARE_LOG_EVENT (38, 5.7.7); 8.0 adds PARTIAL_UPDATE_ROWS_EVENT (39,
    8.0.3), TRANSACTION_PAYLOAD_EVENT (40, 8.0.20), HEARTBEAT_LOG_EVENT_V2 (41, 8.0.28,
    bug #29913991) and 8.4 GTID_TAGGED_LOG_EVENT (42). Real files agree: 5.7.19 / 5.7.20 /
    5.7.21 list 38, 8.0.26 40, 8.0.28 / 8.0.31 / 8.2.0 41, 9.0.1 / 9.6.0 42."""
    v = version_tuple(version)
    if v < (8, 0, 0):
        return 38
    if v < (8, 0, 20):
        return 39
    if v < (8, 0, 28):
        return 40
    if v < (8, 4, 0):
        return 41
    return 42


def post_header_lengths(version: str) -> bytes:
    """The post-header length table of `server_event_header_length[]`, one byte per event
    type from 1 (control_events.cpp, Format_description_event's constructor), as many as
    `event_type_count`. 8.4 and 9.x write 0 for the v1 rows events 23-25, whose code 8.4.0
    removed. 5.7 still writes the lengths of the events 8.0.2 deprecated (the 8.0 table
    has 0 there): START_V3_HEADER_LEN (56 = 2 + 50 + 4) for 1, LOAD_HEADER_LEN (18) for 6,
    CREATE_FILE_HEADER_LEN (4) for 8, EXEC_LOAD_HEADER_LEN (4) for 10, NEW_LOAD_HEADER_LEN
    (18) for 12 (the 5.7 branch's control_events.cpp; a 5.7.21 file's bytes in
    tests/unit/binlog_bytes.py MYSQL_5721_FDE). The entry of TRANSACTION_PAYLOAD_EVENT (40)
    holds the value 40: the source puts the event type's enum there, not
    TRANSACTION_PAYLOAD_HEADER_LEN, and every server writes that."""
    v = version_tuple(version)
    rows_v1 = 0 if v >= (8, 4, 0) else _ROWS_V1
    types = event_type_count(version)
    mysql57 = v < (8, 0, 0)
    format_description_len = 2 + 50 + 4 + 1 + types  # START_V3_HEADER_LEN + 1 + LOG_EVENT_TYPES
    table = [
        _START_V3_HEADER_LEN if mysql57 else 0,  # 1 START_EVENT_V3
        _QUERY_HEADER_LEN,  # 2 QUERY_EVENT
        0,  # 3 STOP_EVENT
        _ROTATE_HEADER_LEN,  # 4 ROTATE_EVENT
        0,  # 5 INTVAR_EVENT
        _LOAD_HEADER_LEN if mysql57 else 0,  # 6 (LOAD_EVENT, unused)
        0,  # 7 (SLAVE_EVENT, unused)
        4 if mysql57 else 0,  # 8 (CREATE_FILE_EVENT, unused)
        4,  # 9 APPEND_BLOCK_EVENT
        4 if mysql57 else 0,  # 10 (EXEC_LOAD_EVENT, unused)
        4,  # 11 DELETE_FILE_EVENT
        _LOAD_HEADER_LEN if mysql57 else 0,  # 12 (NEW_LOAD_EVENT, unused)
        0,  # 13 RAND_EVENT
        0,  # 14 USER_VAR_EVENT
        format_description_len,  # 15 FORMAT_DESCRIPTION_EVENT
        0,  # 16 XID_EVENT
        4,  # 17 BEGIN_LOAD_QUERY_EVENT
        26,  # 18 EXECUTE_LOAD_QUERY_EVENT
        _TABLE_MAP_HEADER_LEN,  # 19 TABLE_MAP_EVENT
        0,  # 20 (PRE_GA_WRITE_ROWS_EVENT)
        0,  # 21 (PRE_GA_UPDATE_ROWS_EVENT)
        0,  # 22 (PRE_GA_DELETE_ROWS_EVENT)
        rows_v1,  # 23 WRITE_ROWS_EVENT_V1
        rows_v1,  # 24 UPDATE_ROWS_EVENT_V1
        rows_v1,  # 25 DELETE_ROWS_EVENT_V1
        2,  # 26 INCIDENT_EVENT
        0,  # 27 HEARTBEAT_LOG_EVENT
        0,  # 28 IGNORABLE_LOG_EVENT
        0,  # 29 ROWS_QUERY_LOG_EVENT
        _ROWS_V2,  # 30 WRITE_ROWS_EVENT
        _ROWS_V2,  # 31 UPDATE_ROWS_EVENT
        _ROWS_V2,  # 32 DELETE_ROWS_EVENT
        _GTID_POST_HEADER,  # 33 GTID_LOG_EVENT
        _GTID_POST_HEADER,  # 34 ANONYMOUS_GTID_LOG_EVENT
        0,  # 35 PREVIOUS_GTIDS_LOG_EVENT
        18,  # 36 TRANSACTION_CONTEXT_EVENT
        52,  # 37 VIEW_CHANGE_EVENT
        0,  # 38 XA_PREPARE_LOG_EVENT
        _ROWS_V2,  # 39 PARTIAL_UPDATE_ROWS_EVENT
        TRANSACTION_PAYLOAD,  # 40 TRANSACTION_PAYLOAD_EVENT (see the docstring)
        0,  # 41 HEARTBEAT_LOG_EVENT_V2
        0,  # 42 GTID_TAGGED_LOG_EVENT
    ]
    return bytes(table[:types])


def format_description_body(version: str, checksum: bool, created: int = 0) -> bytes:
    """binlog_version (2) = 4, server_version (50, NUL-padded), create_timestamp (4),
    common header length (1) = 19, the post-header lengths, checksum_alg (1: 1 CRC32, 0 off)."""
    return (
        struct.pack("<H", 4)
        + version.encode("ascii").ljust(50, b"\x00")
        + struct.pack("<I", created)
        + bytes([HEADER_LEN])
        + post_header_lengths(version)
        + bytes([1 if checksum else 0])
    )


def rotate_body(next_file: str, position: int = 4) -> bytes:
    """Rotate_event: position of the first event in the next file (8), its name."""
    return struct.pack("<Q", position) + next_file.encode("ascii")


# -- GTID events (control_events.h Gtid_event) ----------------------------------------------


def server_version_number(version: str) -> int:
    major, minor, patch = version_tuple(version)
    return major * 10000 + minor * 100 + patch


def gtid_body(sid: str | None, gno: int, info: GtidInfo, mysql57: bool = False) -> bytes:
    """GTID (33) / anonymous GTID (34, sid None: zero UUID, gno 0): flags (1), UUID (16),
    gno (8), logical clock type code (1) = 2, last_committed (8), sequence_number (8); then
    immediate_commit_timestamp (7, bit 55 set when original_commit_timestamp (7) follows),
    transaction_length (net_field_length), immediate_server_version (4, bit 31 set when
    original_server_version (4) follows). MySQL 5.7 (`mysql57=True`) ends the body after
    sequence_number: 42 bytes, its POST_HEADER_LENGTH and nothing more (the commit
    timestamps came in 8.0.1, the transaction length in 8.0.2, the server versions in
    8.0.14; a 5.7.21 file's anonymous GTID events are 42 bytes)."""
    raw_sid = uuid_mod.UUID(sid).bytes if sid else bytes(16)
    out = bytearray(struct.pack("<B16sqB", info.flags, raw_sid, gno if sid else 0, 2))
    out += struct.pack("<qq", info.last_committed, info.sequence_number)
    if mysql57:
        return bytes(out)
    immediate = info.immediate_commit_timestamp
    if info.original_commit_timestamp != immediate:
        out += (immediate | (1 << 55)).to_bytes(7, "little") + info.original_commit_timestamp.to_bytes(7, "little")
    else:
        out += immediate.to_bytes(7, "little")
    out += net_field_length(info.transaction_length)
    if info.original_server_version != info.immediate_server_version:
        out += struct.pack("<II", info.immediate_server_version | (1 << 31), info.original_server_version)
    else:
        out += struct.pack("<I", info.immediate_server_version)
    return bytes(out)


# -- Query (statement_events.h Query_event) -------------------------------------------------

# Status variables of a DML session's Query event, as an 8.0 server writes them for BEGIN:
# Q_FLAGS2_CODE (0) 4 bytes; Q_SQL_MODE_CODE (1) 8 bytes (8.0's default sql_mode);
# Q_CATALOG_NZ_CODE (6) "std"; Q_CHARSET_CODE (4) client / connection / server collation
# (2 bytes each: utf8mb4_0900_ai_ci); Q_DEFAULT_COLLATION_FOR_UTF8MB4 (18) 2 bytes.
_SQL_MODE = 0x20 | 0x400000 | 0x800000 | 0x1000000 | 0x2000000 | 0x40000000
_STATUS_VARS = (
    b"\x00"
    + struct.pack("<I", 0)
    + b"\x01"
    + struct.pack("<Q", _SQL_MODE)
    + b"\x06\x03std"
    + b"\x04"
    + struct.pack("<HHH", 255, 255, 255)
    + b"\x12"
    + struct.pack("<H", 255)
)


# A MySQL 5.7 session's (a 5.7.21 file's BEGIN has these codes): no
# Q_DEFAULT_COLLATION_FOR_UTF8MB4 (8.0.11 added it); 5.7's default sql_mode (8.0's and
# NO_AUTO_CREATE_USER, 1 << 29, which 8.0 removed); collations utf8mb4_general_ci (45, 5.7's
# utf8mb4 default) for client and connection, latin1_swedish_ci (8) for the server.
_STATUS_VARS_57 = (
    b"\x00"
    + struct.pack("<I", 0)
    + b"\x01"
    + struct.pack("<Q", _SQL_MODE | 0x20000000)
    + b"\x06\x03std"
    + b"\x04"
    + struct.pack("<HHH", 45, 45, 8)
)


def query_body(sql: str, schema: str = "", thread_id: int = 8, mysql57: bool = False) -> bytes:
    """Post-header: thread_id (4), exec_time (4), schema length (1), error_code (2), status
    variables length (2); then the status variables, the schema, NUL, the statement."""
    db = schema.encode("utf-8")
    status = _STATUS_VARS_57 if mysql57 else _STATUS_VARS
    return struct.pack("<IIBHH", thread_id, 0, len(db), 0, len(status)) + status + db + b"\x00" + sql.encode("utf-8")


def xid_body(xid: int) -> bytes:
    return struct.pack("<Q", xid)


def xa_prepare_body(one_phase: bool, format_id: int, gtrid: bytes, bqual: bytes) -> bytes:
    """XA_prepare_event (control_events.h): one_phase (1), formatID (4), gtrid length (4),
    bqual length (4), gtrid and bqual bytes."""
    return struct.pack("<BiII", 1 if one_phase else 0, format_id, len(gtrid), len(bqual)) + gtrid + bqual


def transaction_payload_body(inner: bytes, compress: bool) -> bytes:
    """Transaction_payload_event (libs/mysql/binlog/event/codecs/binary.cpp): fields as
    (type, length, value) net_field_length triplets in the order MySQL writes them,
    compression type (2: 0 zstd, 255 none), uncompressed size (3, zstd only), payload size
    (1), then the end mark 0 and the payload: the transaction's events without checksums."""

    def fld(code: int, value: int) -> bytes:
        enc = net_field_length(value)
        return net_field_length(code) + net_field_length(len(enc)) + enc

    if compress:
        import zstandard

        data = zstandard.ZstdCompressor(level=3).compress(inner)
        head = fld(2, 0) + fld(3, len(inner))
    else:
        data = inner
        head = fld(2, 255)
    return head + fld(1, len(data)) + b"\x00" + data
