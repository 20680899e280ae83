"""Binlog event type codes, the common event header, and the integer encodings every
event body uses (MySQL libbinlogevents binlog_event.h Log_event_type; MariaDB's own types
from 160, sql/log_event.h)."""

from __future__ import annotations

import struct

from connectors.mysql.binlog_decode_errors import BinlogDecodeError

QUERY_EVENT = 2
ROTATE_EVENT = 4
FORMAT_DESCRIPTION_EVENT = 15
XID_EVENT = 16
EXECUTE_LOAD_QUERY_EVENT = 18  # LOAD DATA logged as a statement: a Query event with 13 more post-header bytes
TABLE_MAP_EVENT = 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
HEARTBEAT_LOG_EVENT = 27
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32
GTID_LOG_EVENT = 33
XA_PREPARE_LOG_EVENT = 38
PARTIAL_UPDATE_ROWS_EVENT = 39
TRANSACTION_PAYLOAD_EVENT = 40
GTID_TAGGED_LOG_EVENT = 42  # MySQL 8.3+: connectors/mysql/gtid_tagged.py
MARIADB_GTID_EVENT = 162
MARIADB_TYPES = 160  # MariaDB's own event types start here (Annotate_rows)
MARIADB_QUERY_COMPRESSED = 165
MARIADB_ROWS_COMPRESSED = range(166, 172)
EVENT_NAMES = {
    TRANSACTION_PAYLOAD_EVENT: "Transaction_payload",
    MARIADB_QUERY_COMPRESSED: "Query_compressed",
    166: "Write_rows_compressed_v1",
    167: "Update_rows_compressed_v1",
    168: "Delete_rows_compressed_v1",
    169: "Write_rows_compressed",
    170: "Update_rows_compressed",
    171: "Delete_rows_compressed",
}
# post-header lengths this decoder reads: event type -> (name, length when the
# Format_description's table is shorter, lengths read; 0 = the server has no such event)
ROWS_POST_HEADERS = {
    TABLE_MAP_EVENT: ("Table_map", 8, (8,)),
    WRITE_ROWS_V1: ("Write_rows_v1", 8, (0, 8)),
    UPDATE_ROWS_V1: ("Update_rows_v1", 8, (0, 8)),
    DELETE_ROWS_V1: ("Delete_rows_v1", 8, (0, 8)),
    WRITE_ROWS_V2: ("Write_rows", 10, (0, 10)),
    UPDATE_ROWS_V2: ("Update_rows", 10, (0, 10)),
    DELETE_ROWS_V2: ("Delete_rows", 10, (0, 10)),
    PARTIAL_UPDATE_ROWS_EVENT: ("Partial_update_rows", 10, (0, 10)),
}
FL_STANDALONE = 0x01

HDR = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
U16 = struct.Struct("<H").unpack_from
U32 = struct.Struct("<I").unpack_from
U64 = struct.Struct("<Q").unpack_from


def lenenc(buf: bytes, p: int) -> tuple[int, int]:
    c = buf[p]
    if c < 251:
        return c, p + 1
    if c == 252:
        return buf[p + 1] | (buf[p + 2] << 8), p + 3
    if c == 253:
        return buf[p + 1] | (buf[p + 2] << 8) | (buf[p + 3] << 16), p + 4
    if c == 254:
        return U64(buf, p + 1)[0], p + 9
    raise BinlogDecodeError(f"bad length-encoded integer (first byte {c})")
