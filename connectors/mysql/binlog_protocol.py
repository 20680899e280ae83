"""A minimal MySQL/MariaDB replication client: the replica handshake and the raw binlog
event stream, without python-mysql-replication's per-event objects.

`BinlogConnection` logs in with PyMySQL (authentication and, per `tls`, the SSLRequest
after the server's greeting and the TLS handshake: connectors/mysql/client.py), registers as a replica (COM_REGISTER_SLAVE) and asks for the binlog (COM_BINLOG_DUMP at a
file/position, MariaDB's GTID start through `@slave_connect_state`, or MySQL's
COM_BINLOG_DUMP_GTID). From then on it reads the socket itself with its own MySQL packet
framing on the same socket (TLS-wrapped when TLS was negotiated: an `ssl.SSLSocket`
has the same `recv`, so a plain connection reads exactly as before; large reads, one slice per event; packets of 16 MiB and more, which MySQL splits
into several physical packets, are reassembled), which is several times cheaper per event
than PyMySQL's `_read_packet()`.

`events()` yields each binlog event as `bytes`: the 19-byte event header, the body and,
when the server's binlog_checksum is CRC32, the 4 checksum bytes (the OK byte that
prefixes every event packet is removed). The decoder (`connectors.mysql.binlog_decoder`) strips
the checksum. The relay's source reads `event_runs()` instead: each read's buffer, whose
event packets the decoder frames itself (`BinlogDecoder.decode_reads`), so that the
events it drops never become objects.

Errors. Everything that ends the stream other than `close()` or the end of a non-blocking
dump raises `BinlogConnectionError` (a `ConnectionError`) carrying the MySQL error code
in `.code` (2013 for a connection lost without an error packet). Error 1236
(ER_MASTER_FATAL_ERROR_READING_BINLOG: the start file was purged, the position is
unknown or past the end, the GTID is not in the binlog) raises its subclass
`BinlogPositionError`. A TLS problem at login (a certificate the settings refuse, a
server that requires TLS) raises `connectors.mysql.client.MySQLTlsError`, a
`cdc.errors.ConfigError`: a reconnect cannot cure it. Messages never contain the password.

Threads. `close()` may be called from another thread: it shuts the socket down, which
wakes a blocked `events()`; the iterator then simply ends.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pymysql

from cdc.errors import PositionError
from cdc.gtid import MysqlGtidSet
from cdc.tls import TlsConfig
from connectors.mysql.client import MySQLTlsError, connect, negotiated

__all__ = [
    "ER_MASTER_FATAL_READING_BINLOG",
    "BinlogConnection",
    "BinlogConnectionError",
    "BinlogPositionError",
    "PacketRun",
]

ER_MASTER_FATAL_READING_BINLOG = 1236
CR_SERVER_LOST = 2013
CR_CONN_HOST_ERROR = 2003

_COM_BINLOG_DUMP = 0x12
_COM_REGISTER_SLAVE = 0x15
_COM_BINLOG_DUMP_GTID = 0x1E
_BINLOG_DUMP_NON_BLOCK = 0x01
_BINLOG_THROUGH_GTID = 0x04
_MAX_PACKET = 0xFFFFFF
# A packet's header (3-byte length, sequence id) and its payload's first byte in one call:
# the event packets' loop in `event_batches` reads both for every event, and one
# unpack_from instead of four indexings, shifts and ors took 13-18% off the framing
# (0.256 -> 0.224 s CPU over a mixed capture's 660k events, best of 21 alternating).
_PACKET_HEAD = struct.Struct("<IB").unpack_from
_CHUNK = 1 << 18  # bytes per recv


class BinlogConnectionError(ConnectionError):
    """The replication connection failed or the server refused the dump.

    `code` is the MySQL error code (server error or client-side 2003/2013)."""

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"({self.code}) {self.message}"


class BinlogPositionError(BinlogConnectionError):
    """Error 1236: the requested binlog position cannot be served (file purged, position
    unknown or past the end, GTID position not in the binlog)."""


def _make_error(code: int, message: str) -> BinlogConnectionError:
    cls = BinlogPositionError if code == ER_MASTER_FATAL_READING_BINLOG else BinlogConnectionError
    return cls(code, message)


def _from_pymysql(exc: BaseException, what: str) -> BinlogConnectionError:
    """A pymysql error as BinlogConnectionError: code and server text only (PyMySQL never
    puts the password in its messages; only args[0:2] are kept to be sure)."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        text = str(exc.args[1]) if len(exc.args) > 1 else ""
        return _make_error(exc.args[0], f"{what}: {text}")
    return BinlogConnectionError(CR_CONN_HOST_ERROR, f"{what}: {type(exc).__name__}: {exc}")


def _parse_error_packet(payload: bytes) -> BinlogConnectionError:
    code = struct.unpack_from("<H", payload, 1)[0]
    text = payload[3:]
    if text[:1] == b"#":
        text = text[6:]  # '#' + 5-byte SQLSTATE
    return _make_error(code, text.decode("utf-8", "replace"))


def mysql_gtid_dump_packet(gtid_set: str, server_id: int, blocking: bool = True) -> bytes:
    """The COM_BINLOG_DUMP_GTID command (MySQL's protocol documentation,
    "COM_BINLOG_DUMP_GTID"): command 0x1e, flags (2: BINLOG_THROUGH_GTID 0x04, and
    BINLOG_DUMP_NON_BLOCK 0x01 unless `blocking`), server_id (4), binlog name length (4)
    = 0, no name, position (8) = 4, GTID data length (4), then the GTID set as
    `encode_mysql_gtid_set` writes it."""
    encoded = encode_mysql_gtid_set(MysqlGtidSet.parse(gtid_set))
    flags = _BINLOG_THROUGH_GTID | (0 if blocking else _BINLOG_DUMP_NON_BLOCK)
    return (
        bytes([_COM_BINLOG_DUMP_GTID])
        + struct.pack("<HII", flags, int(server_id), 0)
        + struct.pack("<QI", 4, len(encoded))
        + encoded
    )


def encode_mysql_gtid_set(gtids: MysqlGtidSet) -> bytes:
    """A GTID set as `Gtid_set::encode` writes it (sql/rpl_gtid_set.cc): a count (8), then
    per source its uuid (16), its number of intervals (8) and each interval as start (8)
    and end + 1 (8). A set holding a tagged GTID (MySQL 8.3+) takes the tagged format
    (`encode_nsids_format`: Gtid_format::tagged = 1, libs/mysql/gtid/gtid_format.h): the
    count is 1 in its top byte and in its low byte, the number of sources (uuid, tag) in
    the 6 bytes between, and each uuid is followed by its tag (`Tsid::encode_tsid`), a
    string of MySQL's serialization library: its length as a variable-length integer (a
    tag has at most 32 characters: one byte, length << 1), then the characters; "" for
    the untagged intervals. Sources go in (uuid, tag) order, as MySQL sorts them. A server
    older than 8.3 knows only the untagged format: an untagged set keeps it."""
    tagged = gtids.tagged
    out = bytearray()
    for (uuid, tag), intervals in gtids.intervals:
        out += bytes.fromhex(uuid.replace("-", ""))
        if tagged:
            out += bytes([len(tag) << 1]) + tag.encode("ascii")
        out += struct.pack("<Q", len(intervals))
        for start, end in intervals:
            out += struct.pack("<QQ", start, end + 1)
    count = len(gtids.intervals)
    head = (1 << 56) | (count << 8) | 1 if tagged else count
    return struct.pack("<Q", head) + bytes(out)


def decode_mysql_gtid_set(data: bytes) -> MysqlGtidSet:
    """The inverse of `encode_mysql_gtid_set`, as `Gtid_set::add_gtid_encoding` reads it
    (sql/rpl_gtid_set.cc, `decode_nsids_format`): both formats; also the body of a
    Previous_gtids event (type 35), which is such an encoding. Intervals must be
    ascending and not empty. PositionError names what does not add up."""

    def need(n: int, what: str) -> None:
        if at + n > len(data):
            raise PositionError(f"malformed encoded GTID set: {what} cut short at byte {at} of {len(data)}")

    at = 0
    need(8, "the source count")
    (head,) = struct.unpack_from("<Q", data)
    fmt = head >> 56
    if fmt not in (0, 1):
        raise PositionError(f"malformed encoded GTID set: format {fmt} (0 untagged, 1 tagged)")
    count = (head & 0x00FF_FFFF_FFFF_FF00) >> 8 if fmt else head & 0x00FF_FFFF_FFFF_FFFF
    at = 8
    text = []
    for _ in range(count):
        need(16, "a source uuid")
        h = data[at : at + 16].hex()
        at += 16
        tag = ""
        if fmt:
            need(1, "a tag")
            length = data[at] >> 1  # a variable-length integer of one byte: a tag has <= 32 characters
            if data[at] & 1 or length > 32:
                raise PositionError(f"malformed encoded GTID set: tag length byte 0x{data[at]:02x}")
            need(1 + length, "a tag")
            tag = data[at + 1 : at + 1 + length].decode("ascii", "replace")
            at += 1 + length
        need(8, "an interval count")
        (n,) = struct.unpack_from("<Q", data, at)
        at += 8
        need(16 * n, "the intervals")
        last, ranges = 0, []
        for _ in range(n):
            start, end = struct.unpack_from("<qq", data, at)
            at += 16
            if start <= last or end <= start:
                raise PositionError(f"malformed encoded GTID set: interval [{start}, {end}) after {last}")
            last = end
            ranges.append(f"{start}" if end == start + 1 else f"{start}-{end - 1}")
        if ranges:
            uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            text.append(":".join([uuid, *([tag] if tag else []), *ranges]))
    if at != len(data):
        raise PositionError(f"malformed encoded GTID set: {len(data) - at} bytes after its last source")
    return MysqlGtidSet.parse(",".join(text))


class PacketRun:
    """One socket read's buffer as `BinlogConnection.event_runs` hands it out: `data`
    holds MySQL packets from `pos` on (each a 4-byte header: 3-byte payload length and a
    sequence id, then the payload; an event packet's payload is the OK byte 0x00 and the
    event: MySQL Client/Server Protocol, "MySQL Packets" and COM_BINLOG_DUMP). A consumer
    moves `pos` past the event packets it took."""

    __slots__ = ("data", "pos")

    def __init__(self) -> None:
        self.data = b""
        self.pos = 0


class BinlogConnection:
    """One replication connection.

    Parameters: `host`, `port`, `user`, `password`, `server_id` (the replica id this
    client registers with: it must differ from the server's and from every other
    replica's), `connect_timeout` (seconds, login only), `heartbeat_s` (ask the server for
    a heartbeat event after that many idle seconds; None = none), `read_timeout`
    (seconds a blocked read may wait before BinlogConnectionError; None = forever — keep
    it well above heartbeat_s), `tls` (the source's TLS settings; None: PyMySQL's
    default, TLS when the server offers it, unverified).

    Start with exactly one of:
      * `dump_file(file, pos, blocking=True)` — COM_BINLOG_DUMP at file/pos (MySQL and
        MariaDB);
      * `dump_mariadb_gtid(gtid_pos, blocking=True)` — MariaDB GTID start: events of the
        transactions after `gtid_pos` (`domain-server-seq[,...]`, as in gtid_slave_pos);
      * `dump_mysql_gtid(gtid_set, blocking=True)` — MySQL COM_BINLOG_DUMP_GTID (the
        server sends everything not in `gtid_set`). Only MariaDB runs on this machine:
        the packet is tested on bytes built from the protocol documentation, never
        against a MySQL server.

    `blocking=False` sets BINLOG_DUMP_NON_BLOCK: the server sends an EOF packet at the end
    of the binlog and `events()` ends (tests, verification, catch-up measurements).
    """

    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        password: str,
        server_id: int,
        connect_timeout: float = 10.0,
        heartbeat_s: float | None = None,
        read_timeout: float | None = None,
        end_session_on_close: bool = True,
        tls: TlsConfig | None = None,
    ):
        if not 0 < int(server_id) < 2**32:
            raise ValueError(f"replica server_id must be in 1..{2**32 - 1}, got {server_id!r}")
        self.host, self.port, self.user = host, int(port), user
        self._password = password
        self.server_id = int(server_id)
        self.connect_timeout = connect_timeout
        self.heartbeat_s = heartbeat_s
        self.read_timeout = read_timeout
        self._conn: Any = None
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._streaming = False
        self.server_version: str | None = None
        self.flavor: str | None = None  # "mariadb" or "mysql"
        self.checksum: str | None = None  # @@global.binlog_checksum (informative)
        self.connection_id: int | None = None  # the server's CONNECTION_ID() of this connection
        self.end_session_on_close = end_session_on_close
        self.tls = tls or TlsConfig()
        self.tls_version: str | None = None  # the negotiated TLS version (None: not encrypted)
        self._live = False  # a dump runs on the server (started, no EOF, no error seen)

    def __repr__(self) -> str:  # never shows the password
        return f"BinlogConnection({self.user}@{self.host}:{self.port}, server_id={self.server_id})"

    # -- handshake --------------------------------------------------------------------

    def _connect(self) -> None:
        if self._conn is not None:
            raise RuntimeError("this BinlogConnection already started a dump; open a new one")
        where = f"cannot connect to {self.host}:{self.port} as {self.user!r}"
        try:
            self._conn = conn = connect(
                self._settings(), connect_timeout=self.connect_timeout, autocommit=True, charset="utf8mb4"
            )
        except MySQLTlsError:
            raise
        except Exception as exc:  # pymysql errors and socket errors
            raise _from_pymysql(exc, where) from None
        self.tls_version = negotiated(conn)[0]
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION(), @@global.binlog_checksum, CONNECTION_ID()")
                version, checksum, conn_id = cur.fetchone()
                self.connection_id = int(conn_id)
                self.server_version = str(version)
                self.flavor = "mariadb" if "mariadb" in self.server_version.lower() else "mysql"
                self.checksum = str(checksum)
                # Announce that we understand checksums: the server then sends events as
                # stored (with their CRC32 when binlog_checksum=CRC32).
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
                # MariaDB: MARIA_SLAVE_CAPABILITY_GTID (GTID events, GTID start).
                cur.execute("SET @mariadb_slave_capability = 4")
                if self.heartbeat_s:
                    period = min(float(self.heartbeat_s), 4294967.0)
                    cur.execute(f"SET @master_heartbeat_period = {int(period * 1_000_000_000)}")
        except Exception as exc:
            self._drop()
            raise _from_pymysql(exc, "replica handshake failed") from None

    def _settings(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self._password,
            **self.tls.settings(),
        }

    def _command(self, payload: bytes, expect_ok: bool) -> None:
        """Send one command packet (sequence id 0); read its OK when asked."""
        conn = self._conn
        try:
            conn._write_bytes(struct.pack("<I", len(payload))[:3] + b"\x00" + payload)
            conn._next_seq_id = 1
            if expect_ok:
                conn._read_packet()
        except Exception as exc:
            self._drop()
            raise _from_pymysql(exc, "replication command failed") from None

    def _register(self) -> None:
        # COM_REGISTER_SLAVE: server_id, hostname, user, password, port, rank, master_id.
        # The hostname is the session's tag (connection id, machine, process: see
        # cdc/replica_session.py), so that a restarted relay can tell its own previous
        # session from another relay's; user and password stay empty (we do not want to
        # appear with credentials in SHOW SLAVE HOSTS).
        from connectors.mysql.replica_sessions import own_tag

        tag = own_tag(self.connection_id).text().encode() if self.connection_id else b""
        payload = (
            bytes([_COM_REGISTER_SLAVE])
            + struct.pack("<I", self.server_id)
            + bytes([len(tag)])
            + tag
            + b"\x00"
            + b"\x00"
            + struct.pack("<HII", 0, 0, 0)
        )
        self._command(payload, expect_ok=True)

    def _start_stream(self, payload: bytes) -> None:
        self._command(payload, expect_ok=False)
        sock = self._conn._sock
        sock.settimeout(self.read_timeout)
        self._sock = sock
        self._streaming = True
        self._live = True
        if self._closed.is_set():  # closed while we were starting
            self._shutdown()

    def dump_file(self, file: str, pos: int, blocking: bool = True) -> BinlogConnection:
        """COM_BINLOG_DUMP from `file` at `pos` (4 = the start of the file)."""
        if not 4 <= int(pos) < 2**32:
            raise ValueError(f"binlog position must be in 4..{2**32 - 1} for COM_BINLOG_DUMP, got {pos!r}")
        self._connect()
        self._register()
        flags = 0 if blocking else _BINLOG_DUMP_NON_BLOCK
        payload = bytes([_COM_BINLOG_DUMP]) + struct.pack("<IHI", int(pos), flags, self.server_id) + file.encode()
        self._start_stream(payload)
        return self

    def dump_mariadb_gtid(self, gtid_pos: str, blocking: bool = True) -> BinlogConnection:
        """MariaDB: stream the transactions after `gtid_pos` (may be '' = from the oldest
        binlog). The first event is a fake Rotate naming the file the server starts in."""
        self._connect()
        try:
            with self._conn.cursor() as cur:
                cur.execute("SET @slave_connect_state = %s", (gtid_pos,))
                cur.execute("SET @slave_gtid_strict_mode = 1")
                cur.execute("SET @slave_gtid_ignore_duplicates = 0")
        except Exception as exc:
            self._drop()
            raise _from_pymysql(exc, "GTID start refused") from None
        self._register()
        flags = 0 if blocking else _BINLOG_DUMP_NON_BLOCK
        payload = bytes([_COM_BINLOG_DUMP]) + struct.pack("<IHI", 4, flags, self.server_id)
        self._start_stream(payload)
        return self

    def dump_mysql_gtid(self, gtid_set: str, blocking: bool = True) -> BinlogConnection:
        """MySQL 5.6+/8: COM_BINLOG_DUMP_GTID; the server skips the transactions in
        `gtid_set` (`uuid:1-100,uuid2:1-7`, tagged GTIDs too: `uuid:1-5:tag:1-3`). No MySQL server runs here: the packet
        (`mysql_gtid_dump_packet`) is tested against bytes built from the protocol
        documentation (tests/unit/test_mysql_protocol_bytes.py)."""
        payload = mysql_gtid_dump_packet(gtid_set, self.server_id, blocking)
        self._connect()
        self._register()
        self._start_stream(payload)
        return self

    # -- the stream -------------------------------------------------------------------

    def events(self) -> Iterator[bytes]:
        """Raw binlog events (header + body [+ CRC32]) until EOF (non-blocking dump), a
        `close()` (the iterator ends) or an error (BinlogConnectionError)."""
        for batch in self.event_batches():
            yield from batch

    def event_batches(self) -> Iterator[list[bytes]]:
        """The events of `events()`, a list at a time: the complete events of each read
        from the socket (the decoder then loops over a list instead of resuming a
        generator per event: on a binlog of mostly unwatched rows that resume was a fifth
        of the reader's time). A list is yielded as soon as a read completes an event, so
        a live stream's events wait for nothing; the events before an error packet or the
        end are yielded before it. (The relay's source reads `event_runs`.)"""
        head = _PACKET_HEAD
        for item in self.event_runs():
            if isinstance(item, list):
                yield item
                continue
            data, p = item.data, item.pos
            size = len(data)
            batch: list[bytes] = []
            append = batch.append
            while size - p >= 5:
                n, first = head(data, p)
                n &= 0xFFFFFF
                end = p + 4 + n
                if first or end > size or not 0 < n < _MAX_PACKET:
                    break  # not a complete event packet: event_runs' own
                append(data[p + 5 : end])
                p = end
            item.pos = p
            if batch:
                yield batch

    def event_runs(self) -> Iterator[PacketRun | list[bytes]]:
        """The stream a socket read at a time, for a consumer that frames the event packets
        itself (`BinlogDecoder.decode_reads`: on a binlog of mostly unwatched rows, the
        events it drops then never become bytes objects; 17-19% less reader CPU on the
        mixed capture: docs/hot-path.md, "The decoder's loop", and docs/benchmarks.md).

        Yields a `PacketRun` after each read (the same object every time, valid until the
        next step): the consumer takes the complete event packets it wants from
        `run.pos` on and leaves `run.pos` at the first one it did not take. Everything from
        there is this generator's: an event packet the consumer left, or one that was
        split across reads or into physical packets of 16 MiB (reassembled), comes as a
        list of that one event (as `event_batches` gives it); the end of a non-blocking
        dump ends the iterator, an error packet raises BinlogConnectionError."""
        if not self._streaming:
            raise RuntimeError("start a dump first (dump_file / dump_mariadb_gtid / dump_mysql_gtid)")
        sock = self._sock
        assert sock is not None
        recv = sock.recv
        closed = self._closed.is_set
        run = PacketRun()
        data = b""
        p = 0
        size = 0
        head = _PACKET_HEAD
        try:
            while True:
                if size - p >= 5:
                    run.data, run.pos = data, p
                    yield run
                    p = run.pos
                # -- the packet at data[p:], which the consumer left -------------------
                if size - p < 5:
                    if size - p == 4 and data[p : p + 3] == b"\0\0\0":
                        n, first = 0, 0xFE  # a packet without a first byte (read as the end)
                    else:
                        data = data[p:] + self._recv(recv, closed)
                        p = 0
                        size = len(data)
                        continue
                else:
                    n, first = head(data, p)  # length and sequence id, the payload's first byte
                    n &= 0xFFFFFF
                end = p + 4 + n
                if end <= size and n != _MAX_PACKET:
                    if first == 0 and n:
                        event = data[p + 5 : end]
                        p = end
                        yield [event]
                        continue
                    if not n:
                        first = 0xFE
                    payload = data[p + 4 : end]
                    p = end
                elif n != _MAX_PACKET:
                    # the packet continues in the next reads: read up to its end and join its
                    # bytes alone; the buffer goes on in the last read (joining the whole
                    # read to the buffer's tail copied 256 KiB per read: 4% of the reader)
                    parts = [data[p:]]
                    missing = end - size
                    while missing > 0:
                        data = self._recv(recv, closed)
                        parts.append(data if len(data) <= missing else data[:missing])
                        missing -= len(data)
                    size = len(data)
                    p = size + missing  # where the packet ends in the last read
                    packet = b"".join(parts)
                    first = packet[4] if n else 0xFE
                    if first == 0:
                        yield [packet[5:]]
                        continue
                    payload = packet[4:]
                else:
                    payload, data, p = self._read_large(recv, closed, data, p)
                    size = len(data)
                    first = payload[0] if payload else 0xFE
                    if first == 0:
                        yield [payload[1:]]
                        continue
                if first == 0xFE and len(payload) < 9:
                    self._streaming = self._live = False
                    return  # EOF: end of the binlog in a non-blocking dump
                if first == 0xFF:
                    raise _parse_error_packet(payload)
                raise BinlogConnectionError(
                    CR_SERVER_LOST, f"unexpected packet in the binlog stream (first byte {first})"
                )
        except _Closed:
            self._streaming = False
            return
        except BinlogConnectionError:
            self._live = False  # the server ended the dump, or the connection is gone
            raise

    def _recv(self, recv, closed) -> bytes:
        try:
            chunk = recv(_CHUNK)
        except OSError as exc:
            if closed():
                raise _Closed() from None
            if isinstance(exc, TimeoutError):
                raise BinlogConnectionError(
                    CR_SERVER_LOST, f"no data from the server for {self.read_timeout} s"
                ) from None
            raise BinlogConnectionError(CR_SERVER_LOST, f"lost connection to the server: {exc}") from None
        if not chunk:
            if closed():
                raise _Closed()
            raise BinlogConnectionError(CR_SERVER_LOST, "lost connection to the server (closed by the server)")
        return chunk

    def _read_exact(self, recv, closed, buf: bytes, p: int, count: int) -> tuple[bytes, bytes, int]:
        """`count` bytes starting at buf[p], reading more as needed; returns (bytes, buf, p)."""
        have = len(buf) - p
        if have >= count:
            return buf[p : p + count], buf, p + count
        parts = [buf[p:]]
        missing = count - have
        while missing > 0:
            chunk = self._recv(recv, closed)
            parts.append(chunk)
            missing -= len(chunk)
        joined = b"".join(parts)
        return joined[:count], joined[count:], 0

    def _read_large(self, recv, closed, data: bytes, p: int) -> tuple[bytes, bytes, int]:
        """A packet not entirely buffered or split into several physical packets."""
        pieces = []
        while True:
            header, data, p = self._read_exact(recv, closed, data, p, 4)
            n = header[0] | (header[1] << 8) | (header[2] << 16)
            body, data, p = self._read_exact(recv, closed, data, p, n)
            pieces.append(body)
            if n != _MAX_PACKET:
                break
        payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return payload, data, p

    # -- closing ----------------------------------------------------------------------

    def _shutdown(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _drop(self) -> None:
        """Close the login connection after a failed handshake step (the object stays:
        a BinlogConnection is single-use)."""
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to recover
                pass

    def close(self) -> None:
        """Close the connection; safe from any thread and more than once. A thread
        blocked in `events()` wakes up and its iterator ends.

        A stream that was running (no error, not ended by the server) is also ended on
        the server: a side connection KILLs this connection's dump thread, which the
        server would otherwise keep until a heartbeat write to the closed socket fails
        (one or two heartbeat periods; the dump thread never reads a COM_QUIT). A
        restart then finds the replica server id free at once. `end_session_on_close=False`
        skips it."""
        first = not self._closed.is_set()
        self._closed.set()
        self._shutdown()
        conn = self._conn
        if conn is not None:
            try:
                if conn._sock is not None:
                    conn._sock.close()
            except Exception:
                pass
        if first and self.end_session_on_close and self._live and self.connection_id is not None:
            from connectors.mysql.replica_sessions import end_session

            end_session(self._settings(), self.connection_id, timeout=min(2.0, self.connect_timeout))

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> BinlogConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Closed(Exception):
    """Internal: close() was called; events() ends quietly."""
