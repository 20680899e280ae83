"""MySQL 8.4 / 9.x binlog events as bytes, for the verifier's reading of MySQL rows
(tests/unit/test_verifier_mysql_rows.py). Layouts from MySQL's source:

  Format_description (15)  binlog version 2 (= 4), server version 50 (NUL padded),
                  create time 4, common header length 1 (= 19), one post-header length
                  per event type from type 1, checksum algorithm 1 (1 = CRC32)
                  (libs/mysql/binlog/event/control_events.h). MySQL 9 writes 0 for the
                  removed v1 rows events 23-25, 8.x writes 8.
  Table_map (19)  table id 6, flags 2 | schema, table (length-prefixed, NUL ended),
                  column count (lenenc), types, metadata (lenenc length), null bitmap,
                  optional metadata TLVs (sql/log_event.cc Table_map_log_event):
                  1 signedness (a bit per numeric column, YEAR not one), 2 default
                  charset, 4 column names, 5 SET values, 6 ENUM values, 10 ENUM/SET
                  default charset, 13 VECTOR dimensionality (MySQL 9)
  Write_rows v2 (30)  table id 6, flags 2, extra length 2 (= 2) | column count,
                  columns-present bitmap, rows: null bitmap, values
"""

from __future__ import annotations

import struct

from tests.unit.binlog_bytes import lenenc

SCHEMA, TABLE, TABLE_ID = "shop", "outbox", 91


def fde_body(version: str, v1_rows_post_header: int) -> bytes:
    """A Format_description as MySQL 8.4 / 9.x writes it (42 event types)."""
    post = [0] * 42
    post[2 - 1] = 13  # Query
    post[4 - 1] = 8  # Rotate
    post[15 - 1] = 57 + 42  # Format_description
    post[19 - 1] = 8  # Table_map
    for t in (23, 24, 25):
        post[t - 1] = v1_rows_post_header
    for t in (30, 31, 32, 39):
        post[t - 1] = 10  # rows v2, partial update
    post[33 - 1] = post[34 - 1] = 42  # GTID, anonymous GTID
    return (
        struct.pack("<H", 4) + version.encode().ljust(50, b"\x00") + struct.pack("<IB", 0, 19) + bytes(post) + b"\x01"
    )


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + lenenc(len(value)) + value


def strings(values: list[str]) -> bytes:
    return b"".join(lenenc(len(v.encode())) + v.encode() for v in values)


def table_map_body(columns: list[tuple[int, bytes]], optional: bytes, table_id: int = TABLE_ID) -> bytes:
    """`columns`: (type, metadata) each; every column nullable."""
    types = bytes(t for t, _ in columns)
    meta = b"".join(m for _, m in columns)
    n = len(columns)
    return (
        struct.pack("<Q", table_id)[:6]
        + b"\x01\x00"
        + bytes([len(SCHEMA)])
        + SCHEMA.encode()
        + b"\x00"
        + bytes([len(TABLE)])
        + TABLE.encode()
        + b"\x00"
        + lenenc(n)
        + types
        + lenenc(len(meta))
        + meta
        + b"\xff" * ((n + 7) // 8)
        + optional
    )


def write_rows_body(n_columns: int, images: list[bytes], table_id: int = TABLE_ID) -> bytes:
    """`images`: each row's null bitmap and values."""
    present = b"\xff" * ((n_columns + 7) // 8)
    return struct.pack("<Q", table_id)[:6] + b"\x01\x00\x02\x00" + lenenc(n_columns) + present + b"".join(images)


def update_rows_body(
    n_columns: int, pairs: list[tuple[bytes, bytes]], kind_39: bool, table_id: int = TABLE_ID
) -> bytes:
    """Update_rows v2 (31) or PARTIAL_UPDATE_ROWS_EVENT (39) body: both bitmaps all set;
    `pairs`: (before image, after image), the after image of type 39 starting with its
    value options (and partial bits)."""
    present = b"\xff" * ((n_columns + 7) // 8)
    head = struct.pack("<Q", table_id)[:6] + b"\x01\x00\x02\x00" + lenenc(n_columns) + present + present
    return head + b"".join(before + after for before, after in pairs)


def json_diff(op: int, path: str, value: bytes | None = None) -> bytes:
    """One diff of a partial JSON value (sql/json_diff.cc Json_diff::write_binary)."""
    out = bytes([op]) + lenenc(len(path.encode())) + path.encode()
    return out if value is None else out + lenenc(len(value)) + value
