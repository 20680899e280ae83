"""The lab server: MySQL's client and replication protocol over TCP on loopback, one
thread per connection, serving the binlog files of a data directory (binlog_dir.py).

The command phase (page_protocol_command_phase.html; command bytes from
include/my_command.h): COM_QUIT 0x01, COM_INIT_DB 0x02, COM_QUERY 0x03, COM_PING 0x0e,
COM_BINLOG_DUMP 0x12, COM_REGISTER_SLAVE 0x15, COM_SET_OPTION 0x1b (answered with EOF, as
MySQL does), COM_BINLOG_DUMP_GTID 0x1e, COM_RESET_CONNECTION 0x1f; anything else
ER_UNKNOWN_COM_ERROR (1047). Each command starts at sequence id 0; its answer continues it.

COM_REGISTER_SLAVE (page_protocol_com_register_slave.html): server_id 4, hostname (1-byte
length + text), user (same), password (same), port 2, rank 4, source id 4; answered OK and
listed by SHOW REPLICAS while the session runs a dump. A new dump with a server id (or
replica uuid) another dump uses ends that other dump, as MySQL's kill_zombie_dump_threads.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable

from testbed.mysql_lab import dump
from testbed.mysql_lab.auth import CACHING_SHA2, NATIVE, Accounts, authenticate, greeting, make_nonce
from testbed.mysql_lab.binlog_dir import BinlogDir
from testbed.mysql_lab.locks import UserLocks
from testbed.mysql_lab.protocol import (
    ConnectionClosed,
    IdleTimeout,
    MysqlError,
    PacketChannel,
    eof_packet,
    ok_packet,
    result_set_packets,
)
from testbed.mysql_lab.queries import Done, Statements, variables_of, version_of
from testbed.mysql_lab.sessions import Replica, Session
from testbed.mysql_lab.variables import DEFAULT_VERSION, version_tuple

log = logging.getLogger("testbed.mysql_lab")

COM_QUIT = 0x01
COM_INIT_DB = 0x02
COM_QUERY = 0x03
COM_PING = 0x0E
COM_BINLOG_DUMP = 0x12
COM_REGISTER_SLAVE = 0x15
COM_SET_OPTION = 0x1B
COM_BINLOG_DUMP_GTID = 0x1E
COM_RESET_CONNECTION = 0x1F

ER_UNKNOWN_COM_ERROR = 1047
ER_UNKNOWN_ERROR = 1105
ER_CLIENT_INTERACTION_TIMEOUT = 4031
_IDLE_MESSAGE = (
    "The client was disconnected by the server because of inactivity. See wait_timeout and "
    "interactive_timeout for configuring this behavior."
)


class LabServer:
    """Listens on `host:port` (0: a free port; see `.port`) and serves `datadir`."""

    def __init__(self, datadir: str, user: str, password: str, host: str = "127.0.0.1", port: int = 0,
                 version: str = DEFAULT_VERSION, tls: ssl.SSLContext | None = None):  # fmt: skip
        self.tls = tls
        self.dir = BinlogDir(datadir)
        self.accounts = Accounts(user, password)
        self.locks = UserLocks()
        self.started = time.monotonic()
        self.default_version = version
        self._sessions: dict[int, tuple[Session, PacketChannel]] = {}
        self._lock = threading.Lock()
        self._next_id = 8
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._stopping = threading.Event()

    # -- what the statements see (queries.Lab) -------------------------------------------

    def sessions(self) -> list[Session]:
        with self._lock:
            return [s for s, _c in self._sessions.values()]

    def kill(self, conn_id: int, query_only: bool) -> bool:
        with self._lock:
            found = self._sessions.get(conn_id)
        if found is None:
            return False
        session, channel = found
        if query_only and not session.command.startswith("Binlog Dump"):
            session.interrupted.set()  # a GET_LOCK or SLEEP waiting returns now (NULL / 1)
            return True
        session.killed.set()
        channel.close()
        return True

    # -- serving ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopping.is_set():
            try:
                sock, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._connection, args=(sock, addr), daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        for session, channel in [v for v in self._sessions.values()]:
            session.killed.set()
            channel.close()

    def _connection(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        channel = PacketChannel(sock)
        with self._lock:
            conn_id = self._next_id
            self._next_id += 1
        nonce = make_nonce()
        try:
            v = version_tuple(version_of(self))
            # MySQL 5.7's only and default plugin here is mysql_native_password (caching_sha2_password
            # is 8.0.3's, its default from 8.0.4); MySQL 9.0 removed mysql_native_password.
            plugin = NATIVE if v < (8, 0, 0) else CACHING_SHA2
            channel.write_packet(greeting(version_of(self), conn_id, nonce, tls=self.tls is not None, plugin=plugin))
            answer = authenticate(
                channel,
                self.accounts,
                nonce,
                addr[0],
                native_available=v < (9, 0, 0),
                tls=self.tls,
                native_only=v < (8, 0, 0),
            )
        except MysqlError as exc:
            self._send_error(channel, exc)
            channel.close()
            return
        except (ConnectionClosed, IdleTimeout, ValueError):
            channel.close()
            return
        session = Session(conn_id, answer.user, addr[0], addr[1])
        with self._lock:
            self._sessions[conn_id] = (session, channel)
        statements = Statements(self, session)
        try:
            if answer.database:
                statements.use(answer.database)
            self._commands(session, channel, statements)
        except MysqlError as exc:
            self._send_error(channel, exc)
        except ConnectionClosed:
            pass
        finally:
            with self._lock:
                self._sessions.pop(conn_id, None)
            self.locks.release_all(conn_id)
            channel.close()

    def _send_error(self, channel: PacketChannel, exc: MysqlError) -> None:
        try:
            channel.write_packet(exc.packet())
        except ConnectionClosed:
            pass

    def _commands(self, session: Session, channel: PacketChannel, statements: Statements) -> None:
        handlers: dict[int, Callable[[Session, PacketChannel, Statements, bytes], bool]] = {
            COM_QUERY: self._com_query,
            COM_PING: lambda s, c, st, p: self._ok(c),
            COM_INIT_DB: self._com_init_db,
            COM_SET_OPTION: lambda s, c, st, p: self._reply(c, eof_packet()),
            COM_RESET_CONNECTION: self._com_reset,
            COM_REGISTER_SLAVE: self._com_register_slave,
            COM_BINLOG_DUMP: self._com_binlog_dump,
            COM_BINLOG_DUMP_GTID: self._com_binlog_dump,
        }
        while not session.killed.is_set():
            try:
                payload = channel.read_packet(timeout=self._wait_timeout(session))
            except IdleTimeout:
                # MySQL 8.0.24+: ER_CLIENT_INTERACTION_TIMEOUT, then the session ends (and its
                # user-level locks with it: what the lease's wait_timeout relies on).
                log.info("session %d ended: idle for wait_timeout", session.id)
                channel.seq = 0
                self._send_error(channel, MysqlError(ER_CLIENT_INTERACTION_TIMEOUT, "HY000", _IDLE_MESSAGE))
                return
            if not payload or payload[0] == COM_QUIT:
                return
            handler = handlers.get(payload[0])
            if handler is None:
                channel.write_packet(MysqlError(ER_UNKNOWN_COM_ERROR, "08S01", "Unknown command").packet())
                continue
            if not handler(session, channel, statements, payload):
                return

    def _wait_timeout(self, session: Session) -> float:
        value = session.session_vars.get("wait_timeout", variables_of(self).get("wait_timeout", 28800))
        try:
            return max(1.0, float(value))
        except (TypeError, ValueError):
            return 28800.0

    def _ok(self, channel: PacketChannel) -> bool:
        channel.write_packet(ok_packet())
        return True

    def _reply(self, channel: PacketChannel, packet: bytes) -> bool:
        channel.write_packet(packet)
        return True

    def _com_query(self, session: Session, channel: PacketChannel, statements: Statements, payload: bytes) -> bool:
        sql = payload[1:].decode("utf-8", "replace")
        session.interrupted.clear()
        session.set_command("Query", "executing")
        try:
            result = statements.answer(sql)
        except MysqlError as exc:
            channel.write_packet(exc.packet())
            return True
        except Exception:  # a bug of the lab's: the client sees an error, the log the traceback
            log.exception("lab error on statement: %s", sql)
            channel.write_packet(MysqlError(ER_UNKNOWN_ERROR, "HY000", f"lab error on statement: {sql[:200]}").packet())
            return True
        finally:
            session.set_command("Sleep")
        if session.killed.is_set():
            return False
        if isinstance(result, Done):
            channel.write_packet(ok_packet(result.affected))
        else:
            channel.write_packets(result_set_packets(result.columns, result.rows))
        return True

    def _com_init_db(self, session: Session, channel: PacketChannel, statements: Statements, payload: bytes) -> bool:
        try:
            statements.use(payload[1:].decode("utf-8", "replace"))
        except MysqlError as exc:
            channel.write_packet(exc.packet())
            return True
        return self._ok(channel)

    def _com_reset(self, session: Session, channel: PacketChannel, statements: Statements, payload: bytes) -> bool:
        session.user_vars.clear()
        session.session_vars.clear()
        self.locks.release_all(session.id)
        return self._ok(channel)

    def _com_register_slave(
        self, session: Session, channel: PacketChannel, statements: Statements, payload: bytes
    ) -> bool:
        try:
            server_id = struct.unpack_from("<I", payload, 1)[0]
            at = 5
            texts = []
            for _ in range(3):  # hostname, user, password
                n = payload[at]
                texts.append(payload[at + 1 : at + 1 + n].decode("utf-8", "replace"))
                at += 1 + n
            port, _rank, source_id = struct.unpack_from("<HII", payload, at)
        except (struct.error, IndexError):
            channel.write_packet(MysqlError(1043, "08S01", "Bad handshake").packet())
            return False
        session.replica = Replica(server_id, texts[0], port, source_id)
        return self._ok(channel)

    def _com_binlog_dump(
        self, session: Session, channel: PacketChannel, statements: Statements, payload: bytes
    ) -> bool:
        gtid = payload[0] == COM_BINLOG_DUMP_GTID
        try:
            req = dump.DumpRequest.parse_gtid(payload) if gtid else dump.DumpRequest.parse_file(payload)
        except (struct.error, IndexError):
            channel.write_packet(MysqlError(1043, "08S01", "Bad handshake").packet())
            return False
        except MysqlError as exc:
            channel.write_packet(exc.packet())
            return False
        replica_uuid = session.user_var("replica_uuid", "slave_uuid")
        session.replica_uuid = str(replica_uuid or "")
        self._end_zombie_dumps(session, req.server_id)
        if session.replica is None or session.replica.server_id != req.server_id:
            session.replica = Replica(req.server_id, "", 0, 0)
        session.set_command("Binlog Dump GTID" if gtid else "Binlog Dump", "Source has sent all binlog to replica")
        server_id = int(variables_of(self).get("server_id", 1))
        log.info("dump for replica %d from %s:%d (%s)", req.server_id, req.file, req.pos, "gtid" if gtid else "file")
        dump.BinlogSender(self.dir, session, channel, req, server_id).run()
        return False  # the session ends with its dump

    def _end_zombie_dumps(self, session: Session, server_id: int) -> None:
        """sql/rpl_source.cc kill_zombie_dump_threads: a dump with this replica's server id
        (or uuid) is a previous connection of the same replica."""
        for other in self.sessions():
            if other.id == session.id or not other.command.startswith("Binlog Dump"):
                continue
            same_uuid = bool(session.replica_uuid) and other.replica_uuid == session.replica_uuid
            if (other.replica is not None and other.replica.server_id == server_id) or same_uuid:
                log.info("ending dump %d: replica %d connected again", other.id, server_id)
                self.kill(other.id, False)
