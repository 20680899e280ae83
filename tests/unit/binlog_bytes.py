"""Binlog events as bytes, built by hand from the MySQL / MariaDB replication protocol
documentation, for the decoder's unit tests (no server here).

Layouts used (all integers little-endian unless said):
  common header   timestamp 4, type 1, server_id 4, event_size 4, log_pos 4 (end of the
                  event), flags 2; the body; CRC32 of everything before it (4)
  Query (2)       thread_id 4, exec_time 4, schema length 1, error code 2, status vars
                  length 2 | status vars, schema, NUL, statement
  Xid (16)        xid 8
  GTID (33)       flags 1, source uuid 16, gno 8, logical clock 1+8+8
  Gtid_tagged (42)  one message of MySQL's serialization library (see `tagged_gtid_body`)
  Table_map (19)  table id 6, flags 2 | schema length 1, schema, NUL, table length 1,
                  table, NUL, column count (lenenc), types, metadata length (lenenc),
                  metadata, nullable bitmap, optional metadata (type 1, lenenc length,
                  value): 4 = column names
  Write_rows v2 (30) / v1 (23)   table id 6, flags 2, [v2: extra info length 2 (= 2)] |
                  column count (lenenc), columns-present bitmap, rows: null bitmap of
                  the present columns, values
  Update_rows v2 (31)  as Write_rows with two bitmaps and before/after images
  Transaction_payload (40)  fields (type, length, value) as lenenc integers: 1 payload
                  size, 2 compression type (0 zstd, 255 none), 3 uncompressed size; 0
                  ends them | the payload: events without CRC
  MariaDB compressed (165-171)  as the plain event, its statement / row data replaced by
                  0x80 | size bytes (1-4), the size big-endian, a zlib stream
"""

from __future__ import annotations

import struct
import zlib

SCHEMA, TABLE = "shop", "outbox"
TABLE_ID = 77
UUID = bytes.fromhex("3e11fa4771ca11e1a4f1000c29a2f5b1")


def lenenc(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)


def event(kind: int, body: bytes, log_pos: int, crc: bool = True, ts: int = 1_700_000_000) -> bytes:
    """One event ending at `log_pos` (its size counts the CRC when there is one)."""
    size = 19 + len(body) + (4 if crc else 0)
    raw = struct.pack("<IBIIIH", ts, kind, 1, size, log_pos, 0) + body
    return raw + struct.pack("<I", zlib.crc32(raw)) if crc else raw


def query_body(sql: str, schema: str = SCHEMA) -> bytes:
    return struct.pack("<IIBHH", 9, 0, len(schema), 0, 0) + schema.encode() + b"\x00" + sql.encode()


def xid_body(xid: int) -> bytes:
    return struct.pack("<Q", xid)


def gtid_body(gno: int) -> bytes:
    return b"\x01" + UUID + struct.pack("<Q", gno) + b"\x02" + struct.pack("<QQ", 0, gno)


def varlen(value: int, signed: bool = False) -> bytes:
    """An integer as MySQL's serialization library writes it
    (libs/mysql/serialization/variable_length_integers.h `write_varlen_bytes_unsigned`,
    computed as that function does; signed values zigzag-coded first)."""
    if signed:
        value = (value << 1) if value >= 0 else ((-(value + 1)) << 1) | 1
    count = ((value.bit_length() * 575) >> 12) + 1
    first = ((1 << (count - 1)) - 1) | ((value << count) & 0xFF)
    if count == 1:
        return bytes([first])
    rest = value >> (8 - count + ((count + 7) >> 4))
    return bytes([first]) + rest.to_bytes(8, "little")[: count - 1]


def tagged_gtid_body(
    uuid: bytes,
    tag: str,
    gno: int,
    last_committed: int,
    sequence_number: int,
    immediate_us: int,
    tx_length: int,
    server_version: int,
    *,
    flags: int = 0,
    original_us: int | None = None,
    original_server_version: int | None = None,
    commit_group_ticket: int = 0,
    extra_fields: bytes = b"",
    last_non_ignorable: int = 0,
) -> bytes:
    """A Gtid_tagged_log_event body as MySQL 8.4 writes it: `Gtid_event::define_fields`
    (libs/mysql/binlog/event/control_events.h) through the serialization library
    (libs/mysql/serialization/readme.md): format version 1, the message size (counting
    itself and the version), last_non_ignorable_field_id, then (field id, value) pairs;
    original_commit_timestamp (7), original_server_version (10) and commit_group_ticket
    (11) only when they differ from the immediate values / 0, as its encode predicates say.
    `extra_fields` go after field 11 (a newer server's)."""
    fields = varlen(0) + varlen(flags)
    fields += varlen(1) + b"".join(varlen(b) for b in uuid)
    fields += varlen(2) + varlen(gno, signed=True)
    fields += varlen(3) + varlen(len(tag)) + tag.encode()
    fields += varlen(4) + varlen(last_committed, signed=True)
    fields += varlen(5) + varlen(sequence_number, signed=True)
    fields += varlen(6) + varlen(immediate_us)
    if original_us is not None and original_us != immediate_us:
        fields += varlen(7) + varlen(original_us)
    fields += varlen(8) + varlen(tx_length)
    fields += varlen(9) + varlen(server_version)
    if original_server_version is not None and original_server_version != server_version:
        fields += varlen(10) + varlen(original_server_version)
    if commit_group_ticket:
        fields += varlen(11) + varlen(commit_group_ticket)
    fields += extra_fields
    head = varlen(1)  # serialization_format_version
    tail = varlen(last_non_ignorable) + fields
    size = len(head) + 1 + len(tail)
    while len(head) + len(varlen(size)) + len(tail) != size:
        size = len(head) + len(varlen(size)) + len(tail)
    return head + varlen(size) + tail


def table_map_body(table_id: int = TABLE_ID, schema: str = SCHEMA, table: str = TABLE) -> bytes:
    """id VARCHAR(64) utf8mb4 NOT NULL, payload LONGBLOB NULL, n INT NULL; as
    binlog_row_metadata=FULL writes it: signedness, default charset (utf8mb4_0900_ai_ci,
    255) with the blob's binary (63), column names."""
    types = bytes([15, 252, 3])
    meta = struct.pack("<H", 256) + b"\x04"
    names = b"".join(lenenc(len(c)) + c.encode() for c in ("id", "payload", "n"))
    charsets = lenenc(255) + lenenc(1) + lenenc(63)
    optional = b"\x01\x01\x00" + b"\x02" + lenenc(len(charsets)) + charsets + b"\x04" + lenenc(len(names)) + names
    return (
        struct.pack("<Q", table_id)[:6]
        + b"\x01\x00"
        + bytes([len(schema)])
        + schema.encode()
        + b"\x00"
        + bytes([len(table)])
        + table.encode()
        + b"\x00"
        + lenenc(3)
        + types
        + lenenc(len(meta))
        + meta
        + b"\x06"
        + optional
    )


def row_image(event_id: str, payload: bytes | None, n: int | None) -> bytes:
    nulls = (2 if payload is None else 0) | (4 if n is None else 0)
    out = bytes([nulls]) + struct.pack("<H", len(event_id.encode())) + event_id.encode()
    if payload is not None:
        out += struct.pack("<I", len(payload)) + payload
    if n is not None:
        out += struct.pack("<i", n)
    return out


def rows_head(table_id: int = TABLE_ID, v2: bool = True, update: bool = False) -> bytes:
    """Post-header and the column count and bitmap(s): what a compressed rows event keeps plain."""
    head = struct.pack("<Q", table_id)[:6] + b"\x01\x00" + (b"\x02\x00" if v2 else b"")
    return head + lenenc(3) + b"\x07" + (b"\x07" if update else b"")


def write_rows_body(
    rows: list[tuple[str, bytes | None, int | None]], table_id: int = TABLE_ID, v2: bool = True
) -> bytes:
    return rows_head(table_id, v2) + b"".join(row_image(*r) for r in rows)


def update_rows_body(pairs: list[tuple[tuple, tuple]], v2: bool = True) -> bytes:
    return rows_head(TABLE_ID, v2, update=True) + b"".join(row_image(*a) + row_image(*b) for a, b in pairs)


def mariadb_block(data: bytes, algorithm: int = 0) -> bytes:
    """MariaDB's compressed block: 0x80 | algorithm << 4 | size bytes, the size, zlib."""
    width = max(1, (len(data).bit_length() + 7) // 8)
    return bytes([0x80 | algorithm << 4 | width]) + len(data).to_bytes(width, "big") + zlib.compress(data)


def payload_body(
    inner: bytes, compression: int = 0, declared_size: int | None = None, declared_uncompressed: int | None = None
) -> bytes:
    """A Transaction_payload body around `inner` (events without CRC)."""
    if compression == 0:
        import zstandard

        data = zstandard.ZstdCompressor().compress(inner)
    else:
        data = inner

    def field(code: int, value: int) -> bytes:
        enc = lenenc(value)
        return lenenc(code) + lenenc(len(enc)) + enc

    return (
        field(1, len(data) if declared_size is None else declared_size)
        + field(2, compression)
        + field(3, len(inner) if declared_uncompressed is None else declared_uncompressed)
        + b"\x00"
        + data
    )


class Binlog:
    """Events laid out one after the other from position 4, as a binlog file holds them."""

    def __init__(self, start: int = 4):
        self.pos = start
        self.events: list[bytes] = []
        self.starts: list[int] = []

    def add(self, kind: int, body: bytes, crc: bool = True) -> bytes:
        size = 19 + len(body) + (4 if crc else 0)
        ev = event(kind, body, self.pos + size, crc)
        self.starts.append(self.pos)
        self.events.append(ev)
        self.pos += size
        return ev


def inner_events(*events: tuple[int, bytes]) -> bytes:
    """Events as a Transaction_payload holds them: no CRC, log_pos 0."""
    return b"".join(event(kind, body, 0, crc=False) for kind, body in events)


def transaction_inner(xid: int, rows: list[tuple[str, bytes | None, int | None]], row_events: int = 1) -> bytes:
    """BEGIN, Table_map, `row_events` Write_rows (v2) of `rows` each, XID: one transaction."""
    parts = [(2, query_body("BEGIN")), (19, table_map_body())]
    parts += [(30, write_rows_body(rows))] * row_events
    parts.append((16, xid_body(xid)))
    return inner_events(*parts)


def library_event(raw: bytes, table_map: dict, allowed: frozenset, version: tuple = (8, 0, 40)):
    """python-mysql-replication's event object for one raw event (header + body + CRC), as
    its BinLogStreamReader builds it from a packet (no server: a stand-in control
    connection); TableMapEvents are added to `table_map` for the rows events after them."""
    from types import SimpleNamespace

    from pymysql.protocol import MysqlPacket
    from pymysqlreplication.packet import BinLogPacketWrapper
    from pymysqlreplication.row_event import TableMapEvent

    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mysql")
    # positional: table_map, ctl_connection, mysql_version, use_checksum, allowed_events,
    # only_tables, ignored_tables, only_schemas, ignored_schemas, freeze_schema,
    # ignore_decode_errors, verify_checksum, optional_meta_data, enable_logging
    wrapper = BinLogPacketWrapper(
        MysqlPacket(b"\x00" + raw, "utf8"),
        table_map,
        ctl,
        version,
        True,
        allowed,
        None,
        None,
        None,
        None,
        False,
        False,
        True,
        True,
        False,
    )
    event = wrapper.event
    if isinstance(event, TableMapEvent):
        table_map[event.table_id] = event.get_table()
    return wrapper


# -- Format_description ------------------------------------------------------------------
#
# Format_description (15): binlog version 2, server version 50 (NUL-padded), create
# timestamp 4, common header length 1 (19), one post-header length per event type from
# type 1 on, checksum algorithm 1 (1 = CRC32); then the CRC. The lengths are MySQL's
# `server_event_header_length` table (libs/mysql/binlog/event/control_events.cpp,
# Format_description_event's constructor): Query 13, Rotate 8, Table_map 8, the v1 rows
# events (23-25) 8 up to MySQL 8.x and 0 from 9.0 on (the events were removed), the v2 rows
# events (30-32) and Partial_update_rows (39) 10, Gtid 42.


def _post_header_lengths(v1_rows: int) -> bytes:
    lengths = [0] * 41
    for kind, n in {2: 13, 4: 8, 9: 4, 11: 4, 17: 4, 18: 26, 19: 8, 26: 2, 33: 42, 34: 42, 35: 0}.items():
        lengths[kind - 1] = n
    lengths[15 - 1] = 57 + len(lengths)  # its own: the fixed part and this table
    for kind in (23, 24, 25):
        lengths[kind - 1] = v1_rows
    for kind in (30, 31, 32, 39):
        lengths[kind - 1] = 10
    lengths[36 - 1], lengths[37 - 1] = 18, 52  # Transaction_context, View_change
    lengths[40 - 1] = 40  # Transaction_payload
    return bytes(lengths)


MYSQL_82_POST_HEADER = _post_header_lengths(8)
MYSQL_90_POST_HEADER = _post_header_lengths(0)


def fde_body(server_version: str = "9.0.1", post_header: bytes = MYSQL_90_POST_HEADER, created: int = 0) -> bytes:
    """`created`: non-zero only in the binlog a server opens at its start (a rotation writes 0)."""
    version = server_version.encode().ljust(50, b"\0")
    return struct.pack("<H", 4) + version + struct.pack("<I", created) + bytes([19]) + post_header + b"\x01"


# Real Format_description events, as MySQL 5.7 servers wrote them (the first event of the
# binlogs in mysql-binlog-connector-java's src/test/resources, commit c4a5af8: mysql-bin.checksum-crc32
# by 5.7.21-log, mysql-bin.checksum-none by 5.7.20-log). A 5.7 server lists post-header
# lengths for event types 1-38 only; the byte after type 38 is the checksum algorithm (1 =
# CRC32, 0 = none), and a 4-byte checksum closes the event in both.
MYSQL_5721_FDE = bytes.fromhex(
    "9e18ec5a0f01000000770000007b00000000000400352e372e32312d6c6f6700000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000009e18ec5a13380d00080012000404040412"
    "00005f00041a08000000080808020000000a0a0a2a2a0012340001a7dabdaa"
)
MYSQL_5720_FDE_NO_CHECKSUM = bytes.fromhex(
    "6422d85b0f01000000770000007b00000000000400352e372e32302d6c6f6700000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000006422d85b13380d00080012000404040412"
    "00005f00041a08000000080808020000000a0a0a2a2a00123400002eefbb3f"
)
