"""MySQL client/server protocol packets, as the lab server writes and reads them.

Every layout here is from MySQL's protocol documentation (dev.mysql.com/doc/dev/mysql-server/
latest/, pages named next to each function) and sql/protocol_classic.cc:

  packet            payload length 3 (little-endian), sequence id 1, payload; a payload of
                    0xffffff bytes or more is split, the last part shorter than 0xffffff
                    (page_protocol_basic_packets.html)
  lenenc integer    < 251: 1 byte; 0xfc + 2; 0xfd + 3; 0xfe + 8 (page_protocol_basic_dt_integers)
  OK                0x00, affected rows (lenenc), last insert id (lenenc), status flags 2,
                    warnings 2 (page_protocol_basic_ok_packet.html)
  ERR               0xff, error code 2, '#', SQLSTATE 5, message (page_protocol_basic_err_packet)
  EOF               0xfe, warnings 2, status flags 2 (page_protocol_basic_eof_packet.html; the
                    lab never offers CLIENT_DEPRECATE_EOF, so result sets end with EOF)
  text result set   column count (lenenc); one ColumnDefinition41 per column; EOF; one row per
                    packet (each value a lenenc string, NULL as 0xfb); EOF
                    (page_protocol_com_query_response_text_resultset.html)
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.mysql_lab.packed_int import net_field_length as lenenc_int  # the protocol's name for it

MAX_PAYLOAD = 0xFFFFFF

# Capability flags (include/mysql_com.h, page_protocol_basic_capabilities? "Capabilities Flags").
CLIENT_LONG_PASSWORD = 1
CLIENT_FOUND_ROWS = 2
CLIENT_LONG_FLAG = 4
CLIENT_CONNECT_WITH_DB = 8
CLIENT_NO_SCHEMA = 16
CLIENT_ODBC = 64
CLIENT_IGNORE_SPACE = 256
CLIENT_PROTOCOL_41 = 512
CLIENT_INTERACTIVE = 1024
CLIENT_SSL = 2048
CLIENT_IGNORE_SIGPIPE = 4096
CLIENT_TRANSACTIONS = 8192
CLIENT_RESERVED2 = 32768  # CLIENT_SECURE_CONNECTION in older headers
CLIENT_MULTI_STATEMENTS = 1 << 16
CLIENT_MULTI_RESULTS = 1 << 17
CLIENT_PS_MULTI_RESULTS = 1 << 18
CLIENT_PLUGIN_AUTH = 1 << 19
CLIENT_CONNECT_ATTRS = 1 << 20
CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 1 << 21
CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS = 1 << 22

# What the lab offers: MySQL 8.4's set without TLS, compression, session tracking, query
# attributes and CLIENT_DEPRECATE_EOF (so the classic EOF packets are always right).
SERVER_CAPABILITIES = (
    CLIENT_LONG_PASSWORD
    | CLIENT_FOUND_ROWS
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_NO_SCHEMA
    | CLIENT_ODBC
    | CLIENT_IGNORE_SPACE
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_IGNORE_SIGPIPE
    | CLIENT_TRANSACTIONS
    | CLIENT_RESERVED2
    | CLIENT_MULTI_STATEMENTS
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS
)

SERVER_STATUS_AUTOCOMMIT = 0x0002

# utf8mb4_0900_ai_ci: MySQL 8's default collation, announced in the greeting and used for
# text columns; 63 is "binary" (numbers).
UTF8MB4_0900_AI_CI = 255
BINARY_COLLATION = 63

# Column types (include/field_types.h).
TYPE_LONGLONG = 8
TYPE_VAR_STRING = 253
TYPE_BLOB = 252

# Column flags (include/mysql_com.h).
NOT_NULL_FLAG = 1
BINARY_FLAG = 128


class ConnectionClosed(Exception):
    """The peer closed the connection (or the server ended it: KILL)."""


class IdleTimeout(Exception):
    """No command within the session's wait_timeout."""


def lenenc_str(data: bytes) -> bytes:
    return lenenc_int(len(data)) + data


def read_lenenc_int(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the length-encoded integer at `pos`."""
    first = data[pos]
    if first < 251:
        return first, pos + 1
    if first == 0xFC:
        return struct.unpack_from("<H", data, pos + 1)[0], pos + 3
    if first == 0xFD:
        return int.from_bytes(data[pos + 1 : pos + 4], "little"), pos + 4
    if first == 0xFE:
        return struct.unpack_from("<Q", data, pos + 1)[0], pos + 9
    raise ValueError(f"bad length-encoded integer prefix 0x{first:02x} at {pos}")


class PacketChannel:
    """One client socket: packets in and out, with MySQL's sequence ids.

    Writes are serialised by a lock, because KILL from another session may close the
    socket while a dump thread writes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.seq = 0
        self._buf = b""
        self._write_lock = threading.Lock()

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                # Never more than the packet needs: the bytes after an SSLRequest belong to TLS.
                chunk = self.sock.recv(min(n - len(self._buf), 1 << 20))
            except TimeoutError:
                raise IdleTimeout() from None
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from None
            if not chunk:
                raise ConnectionClosed("closed by the client")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def read_packet(self, timeout: float | None = None) -> bytes:
        """One logical packet's payload (parts of a split payload joined); IdleTimeout when
        nothing arrives within `timeout` seconds."""
        try:
            self.sock.settimeout(timeout)
        except OSError as exc:
            raise ConnectionClosed(str(exc)) from None
        parts = []
        while True:
            header = self._recv_exact(4)
            length = header[0] | header[1] << 8 | header[2] << 16
            self.seq = (header[3] + 1) & 0xFF
            parts.append(self._recv_exact(length))
            if length < MAX_PAYLOAD:
                return b"".join(parts)

    def write_packet(self, payload: bytes) -> None:
        """`payload` as one or more packets, from the current sequence id."""
        self.send(self._frame(payload))

    def write_packets(self, payloads: list[bytes]) -> None:
        """Several packets in one write (a result set, a run of binlog events)."""
        if payloads:
            self.send(b"".join(self._frame(p) for p in payloads))

    def _frame(self, payload: bytes) -> bytes:
        out = []
        pos = 0
        while True:
            part = payload[pos : pos + MAX_PAYLOAD]
            out.append(struct.pack("<I", len(part))[:3] + bytes([self.seq]) + part)
            self.seq = (self.seq + 1) & 0xFF
            pos += len(part)
            if len(part) < MAX_PAYLOAD:
                break
        return b"".join(out)

    def send(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self.sock.sendall(data)
            except OSError as exc:
                raise ConnectionClosed(str(exc)) from None

    def start_tls(self, context: ssl.SSLContext) -> None:
        """The server side of the TLS handshake after an SSLRequest."""
        if self._buf:
            raise ConnectionClosed("data after the SSLRequest before the TLS handshake")
        try:
            self.sock.settimeout(10)
            self.sock = context.wrap_socket(self.sock, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectionClosed(f"TLS handshake failed: {exc}") from None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def ok_packet(affected: int = 0, insert_id: int = 0, status: int = SERVER_STATUS_AUTOCOMMIT) -> bytes:
    """OK_Packet with CLIENT_PROTOCOL_41 (page_protocol_basic_ok_packet.html)."""
    return b"\x00" + lenenc_int(affected) + lenenc_int(insert_id) + struct.pack("<HH", status, 0)


def eof_packet(status: int = SERVER_STATUS_AUTOCOMMIT) -> bytes:
    """EOF_Packet (page_protocol_basic_eof_packet.html): 0xfe, warnings 2, status 2."""
    return b"\xfe" + struct.pack("<HH", 0, status)


def err_packet(code: int, sqlstate: str, message: str) -> bytes:
    """ERR_Packet (page_protocol_basic_err_packet.html)."""
    return b"\xff" + struct.pack("<H", code) + b"#" + sqlstate.encode()[:5] + message.encode("utf-8")


class MysqlError(Exception):
    """An error the lab answers with an ERR packet: MySQL's code, SQLSTATE and message
    (share/messages_to_clients.txt)."""

    def __init__(self, code: int, sqlstate: str, message: str):
        super().__init__(code, message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message

    def packet(self) -> bytes:
        return err_packet(self.code, self.sqlstate, self.message)

    def __str__(self) -> str:
        return f"({self.code}) {self.message}"


@dataclass(frozen=True)
class Column:
    """One result set column: its name and whether its values are integers or bytes."""

    name: str
    integer: bool = False
    binary: bool = False


def column_definition(col: Column, table: str = "", schema: str = "") -> bytes:
    """ColumnDefinition41 (page_protocol_com_query_response_text_resultset_column_definition):
    catalog "def", schema, table, org_table, name, org_name (lenenc strings), length of
    the fixed fields (0x0c), character set 2, column length 4, type 1, flags 2,
    decimals 1, filler 2."""
    name = col.name.encode("utf-8")
    if col.integer:
        charset, length, kind, flags, decimals = BINARY_COLLATION, 21, TYPE_LONGLONG, BINARY_FLAG, 0
    elif col.binary:
        charset, length, kind, flags, decimals = BINARY_COLLATION, 1024, TYPE_VAR_STRING, BINARY_FLAG, 31
    else:
        charset, length, kind, flags, decimals = UTF8MB4_0900_AI_CI, 1024, TYPE_VAR_STRING, 0, 31
    return (
        lenenc_str(b"def")
        + lenenc_str(schema.encode())
        + lenenc_str(table.encode())
        + lenenc_str(table.encode())
        + lenenc_str(name)
        + lenenc_str(name)
        + b"\x0c"
        + struct.pack("<HIBHB", charset, length, kind, flags, decimals)
        + b"\x00\x00"
    )


def text_value(value: object) -> bytes:
    """One value of a text-protocol row: NULL is 0xfb, anything else a lenenc string."""
    if value is None:
        return b"\xfb"
    if isinstance(value, bytes):
        return lenenc_str(value)
    if isinstance(value, bool):
        return lenenc_str(b"1" if value else b"0")
    return lenenc_str(str(value).encode("utf-8"))


def result_set_packets(columns: Sequence[Column], rows: Sequence[Sequence[object]]) -> list[bytes]:
    """The payloads of a text result set, in order."""
    out = [lenenc_int(len(columns))]
    out += [column_definition(c) for c in columns]
    out.append(eof_packet())
    out += [b"".join(text_value(v) for v in row) for row in rows]
    out.append(eof_packet())
    return out
