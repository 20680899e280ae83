"""What SHOW BINLOG EVENTS shows of an event: its type name and its Info column
(sql/rpl_source.cc show_binlog_events; each event's Log_event::pack_info)."""

from __future__ import annotations

import struct
import uuid as uuidlib

from testbed.mysql_lab.gtid_sets import GtidSet, GtidSetError

# Event type names of SHOW BINLOG EVENTS (libs/mysql/binlog/event/binlog_event.cpp,
# get_event_type_str).
EVENT_NAMES = {
    1: "Start_v3", 2: "Query", 3: "Stop", 4: "Rotate", 5: "Intvar", 13: "RAND", 14: "User var",
    15: "Format_desc", 16: "Xid", 17: "Begin_load_query", 18: "Execute_load_query", 19: "Table_map",
    23: "Write_rows_v1", 24: "Update_rows_v1", 25: "Delete_rows_v1", 26: "Incident", 27: "Heartbeat",
    28: "Ignorable", 29: "Rows_query", 30: "Write_rows", 31: "Update_rows", 32: "Delete_rows", 33: "Gtid",
    34: "Anonymous_Gtid", 35: "Previous_gtids", 36: "Transaction_context", 37: "View_change",
    38: "XA_prepare", 39: "Update_rows_partial", 40: "Transaction_payload", 41: "Heartbeat_v2",
    42: "Gtid_tagged",
}  # fmt: skip


def event_info(kind: int, body: bytes, gtid: str | None) -> str:
    """The Info column of SHOW BINLOG EVENTS for the event kinds the lab's files hold."""
    try:
        if kind == 2:  # Query: thread 4, exec time 4, db length 1, error 2, status length 2
            db_len = body[8]
            status_len = struct.unpack_from("<H", body, 11)[0]
            db_at = 13 + status_len
            db = body[db_at : db_at + db_len].decode("utf-8", "replace")
            query = body[db_at + db_len + 1 :].decode("utf-8", "replace")
            plain = query.strip().upper().split(" ")[0] in ("BEGIN", "COMMIT", "ROLLBACK", "XA", "SAVEPOINT")
            return query if plain or not db else f"use `{db}`; {query}"
        if kind == 16:
            return f"COMMIT /* xid={struct.unpack_from('<Q', body, 0)[0]} */"
        if kind == 4:
            return f"{body[8:].decode('utf-8', 'replace')};pos={struct.unpack_from('<Q', body, 0)[0]}"
        if kind == 15:
            version = body[2:52].split(b"\x00")[0].decode("ascii", "replace")
            return f"Server ver: {version}, Binlog ver: {struct.unpack_from('<H', body, 0)[0]}"
        if kind in (33, 42):
            if gtid and gtid != "-":
                return f"SET @@SESSION.GTID_NEXT= '{gtid}'"
            if kind == 33:
                sid = uuidlib.UUID(bytes=bytes(body[1:17]))
                return f"SET @@SESSION.GTID_NEXT= '{sid}:{struct.unpack_from('<Q', body, 17)[0]}'"
            return ""
        if kind == 34:
            return "SET @@SESSION.GTID_NEXT= 'ANONYMOUS'"
        if kind == 35:
            return str(GtidSet.decode(body)).replace("\n", "")
        if kind == 19:
            table_id = int.from_bytes(body[0:6], "little")
            n = body[8]
            schema = body[9 : 9 + n].decode("utf-8", "replace")
            m = body[10 + n]
            table = body[11 + n : 11 + n + m].decode("utf-8", "replace")
            return f"table_id: {table_id} ({schema}.{table})"
        if kind in (23, 24, 25, 30, 31, 32, 39):
            table_id = int.from_bytes(body[0:6], "little")
            flags = struct.unpack_from("<H", body, 6)[0]
            return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & 1 else "")
    except (IndexError, struct.error, ValueError, GtidSetError):
        return ""
    return ""
