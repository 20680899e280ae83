"""The binlog source: a binlog stream on a MySQL or MariaDB server -> `cdc.source_events`.

Two readers, chosen by `source.decoder`:

* `"fast"` (the default): the relay's own replication client (connectors/mysql/binlog_protocol.py,
  COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID) hands raw event bytes to its own decoder
  (connectors/mysql/binlog_decoder.py), which decodes only the watched tables' rows and reads
  compressed events (connectors/mysql/binlog_compression.py).
* `"library"`: python-mysql-replication's event objects, converted by
  `binlog_library.LibraryConverter` (it skips compressed events: `cdc check` refuses that
  combination).

Threads. In the reader process (`source.reader = "process"`, connectors/mysql/reader_process.py)
the source has no thread of its own: `read` reads the socket itself (`threaded=False`).
With `source.reader = "thread"` a reader thread runs the blocking stream and hands
converted events to the relay through a bounded queue: the relay's thread stays free to
serve Kafka delivery callbacks while the socket waits, and a slow Kafka slows the reader
instead of filling memory.

Positions. An event's header holds `log_pos`, the end of the event; an event starts at
`log_pos - event_size` (the whole event, header and checksum included). A transaction
is named by the start of its GTID (or BEGIN) event; the stream resumes at the end of a
commit event.

Reconnects are the relay's job, never a reader's: a dropped connection surfaces as
`SourceError` (python-mysql-replication would reconnect by itself from its own last
`log_pos`, which can sit in the middle of a transaction; its list of "expected" error
codes is emptied in connectors/mysql/binlog_library.py), and the relay's feed (cdc/assembly/feed.py)
reopens the stream at the end of the last complete transaction it read.

Starting points: a file/pos start is a plain COM_BINLOG_DUMP, which MariaDB serves
too; a GTID start is MariaDB's GTID dump or MySQL's COM_BINLOG_DUMP_GTID. (With
`is_mariadb=True` python-mysql-replication ignores `log_file`/`log_pos`; the library
reader therefore uses `resume_stream=True` for a file/pos start.)
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import pymysql

from cdc.errors import ConfigError, PositionError, PositionPurgedError, SourceError, UndecodableEventError
from cdc.gtid import GtidSet, MariadbGtidPosition
from cdc.position import BinlogPosition
from cdc.server_version import ServerVersion, binlog_status_statement
from cdc.source_events import (
    RowInsert,
    ServerInfo,
    SourceEvent,
    recovered_xid,
)
from cdc.tls import TlsConfig
from connectors.mysql.binlog_protocol import (
    BinlogConnection,
    BinlogConnectionError,
    BinlogPositionError,
)
from connectors.mysql.client import connect, pymysql_args
from connectors.mysql.errors import error_text

log = logging.getLogger(__name__)

_ER_MASTER_FATAL_READING_BINLOG = 1236  # purged or unknown start position
_END = object()


class MySQLBinlogSource:
    """One open binlog stream (implements cdc.ports.BinlogSource).

    `events` yields the stream's raw items and `convert(item, out)` appends source events
    for each: python-mysql-replication's event objects with `binlog_library.LibraryConverter`, or
    socket reads of raw events with `BinlogDecoder.decode_reads` (the default, see
    connectors/mysql/binlog_decoder.py)."""

    def __init__(self, events, convert, close, info: ServerInfo, queue_events: int, threaded: bool = True):
        """`threaded=False`: no reader thread; `read` reads the socket itself and blocks
        until an event converts to something (at the latest the next heartbeat), whatever
        its timeout. For a process that does nothing else (connectors/mysql/reader_process.py):
        two threads there would only take turns on the interpreter lock."""
        self._events = events
        self._convert = convert
        self._close_stream = close
        self._queue: queue.Queue[Any] | None = None  # only with a reader thread
        self._pending: list[SourceEvent] = [info]
        self._index = 0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._deferred: Any = None  # without a thread: the end or error met after a batch
        if threaded:
            self._queue = queue.Queue(maxsize=max(1, queue_events // 64))
            self._thread = threading.Thread(target=self._pump, name="binlog-reader", daemon=True)
            self._thread.start()

    def _next_batch(self) -> Any:
        """Without a reader thread: the next non-empty batch, _END, or the exception."""
        if self._deferred is not None:
            item, self._deferred = self._deferred, None
            return item
        batch: list[SourceEvent] = []
        convert, events = self._convert, self._events
        try:
            while not batch:
                convert(next(events), batch)
        except StopIteration:
            self._deferred = _END
        except BaseException as exc:
            self._deferred = exc
        return batch or self._next_batch()

    def _pump(self) -> None:
        convert = self._convert
        batch: list[SourceEvent] = []
        if self._queue is None:
            return
        put, empty = self._queue.put, self._queue.empty
        try:
            for ev in self._events:
                convert(ev, batch)
                if len(batch) >= 64 or (batch and empty()):
                    if self._closed.is_set():
                        return
                    put(batch)
                    batch = []
            put(batch)
            put(_END)
        except BaseException as exc:  # surfaces in read() as SourceError
            if batch:
                put(batch)
            if not self._closed.is_set():
                put(exc)

    def ready_rows(self) -> list[SourceEvent]:
        """The row inserts at the head of what was read already, consumed, without waiting:
        `cdc.assembly.feed.LocalFeed` takes such a run in one call, not one `read` each."""
        pending, start = self._pending, self._index
        end, n = start, len(pending)
        while end < n and type(pending[end]) is RowInsert:
            end += 1
        self._index = end
        return pending[start:end]

    def read(self, timeout: float) -> SourceEvent | None:
        pending = self._pending
        if self._index < len(pending):
            event = pending[self._index]
            self._index += 1
            return event
        q = self._queue
        if q is None:
            item = self._next_batch()
        else:
            try:
                item = q.get(timeout=timeout)
            except queue.Empty:
                return None
        if type(item) is list:
            if not item:
                return None
            self._pending, self._index = item, 1
            return item[0]
        if item is _END:
            raise SourceError("the binlog stream ended (the server closed it)")
        if isinstance(item, BinlogPositionError) or (
            isinstance(item, pymysql.err.OperationalError)
            and item.args
            and item.args[0] == _ER_MASTER_FATAL_READING_BINLOG
        ):
            raise PositionPurgedError(f"the server refused the start position: {error_text(item)}")
        # imported here: a relay whose reader process decodes never loads the decoder
        from connectors.mysql.binlog_decoder import (
            BinlogDecodeError,
            ServerSettingRequired,
            UndecodableEvent,
            UnsupportedColumnType,
        )

        if isinstance(item, UnsupportedColumnType):
            raise ConfigError(f'{item}; set source.decoder = "library" to read it with python-mysql-replication')
        if isinstance(item, ServerSettingRequired):
            raise ConfigError(str(item)) from None
        if isinstance(item, UndecodableEvent):
            raise UndecodableEventError(str(item)) from None
        if isinstance(item, BinlogDecodeError):
            raise SourceError(f"cannot decode the binlog: {item}") from item
        raise SourceError(f"binlog connection failed: {error_text(item)}") from item

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._close_stream()
        except Exception:  # closing a dead socket can fail; nothing to recover
            pass
        # Unblock a reader thread waiting on a full queue.
        while self._thread is not None and self._queue is not None and self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


class MySQLBinlogSourceFactory:
    """Opens binlog streams on a MySQL or MariaDB server (implements
    cdc.ports.BinlogSourceFactory).

    `connection` holds host, port, user, password and the TLS settings (a connection dict,
    connectors/mysql/client.py); `replica_server_id` is the id this relay registers with
    (it must differ from every other replica's)."""

    def __init__(
        self,
        connection: dict[str, Any],
        replica_server_id: int,
        watched_tables: set[tuple[str, str]],
        heartbeat_s: float = 1.0,
        queue_events: int = 20_000,
        threaded: bool = True,
        connect_timeout: float = 5.0,
        decoder: str = "fast",
    ):
        if decoder not in ("fast", "library"):
            raise ConfigError(f'source.decoder must be "fast" or "library", got {decoder!r}')
        self._decoder = decoder
        self._tls = TlsConfig.from_settings(connection)
        self._conn = {
            "host": connection["host"],
            "port": int(connection["port"]),
            "user": connection["user"],
            "password": connection.get("password") or connection.get("passwd") or "",
            "connect_timeout": connect_timeout,
            **self._tls.settings(),
        }
        self._replica_id = replica_server_id
        self._watched = set(watched_tables)
        self._heartbeat = heartbeat_s
        self._queue_events = queue_events
        self._threaded = threaded
        self._flavor: str | None = None
        self._server_id: int | None = None
        self._version: ServerVersion | None = None

    def _query(self, sql: str) -> list[tuple]:
        try:
            conn = connect(self._conn)
        except pymysql.err.MySQLError as exc:
            raise SourceError(
                f"cannot connect to {self._conn['host']}:{self._conn['port']} as {self._conn['user']!r}: {error_text(exc)}"
            ) from exc
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"query {sql!r} failed: {error_text(exc)}") from exc
        finally:
            conn.close()

    def _facts(self) -> tuple[str, int]:
        if self._flavor is None or self._server_id is None:
            version, server_id = self._query("SELECT VERSION(), @@server_id")[0]
            self._version = ServerVersion.parse(str(version))
            self._flavor = "mariadb" if "mariadb" in str(version).lower() else "mysql"
            self._server_id = int(server_id)
        return self._flavor, self._server_id

    def server_id(self) -> int:
        return self._facts()[1]

    def prepared_xids(self) -> set[str] | None:
        try:
            rows = self._query("XA RECOVER")
        except SourceError as exc:
            if "1227" in str(exc) or "1044" in str(exc) or "1045" in str(exc) or "denied" in str(exc).lower():
                return None  # MySQL 8 needs XA_RECOVER_ADMIN
            raise
        return {recovered_xid(row) for row in rows}

    def server_started_at(self) -> float | None:
        """When the server started (its clock, seconds since the epoch)."""
        uptime = self._query("SHOW GLOBAL STATUS LIKE 'Uptime'")  # MySQL 8 has no information_schema copy
        now = self._query("SELECT UNIX_TIMESTAMP()")
        if not uptime or not now:
            return None
        return float(now[0][0]) - float(uptime[0][1])

    def binary_logs(self) -> list[tuple[str, int]]:
        return [(str(r[0]), int(r[1])) for r in self._query("SHOW BINARY LOGS")]

    def resolve(self, mode: str) -> BinlogPosition:
        if mode == "latest":
            self._facts()
            statement = binlog_status_statement(self._version or ServerVersion.parse(""))
            rows = self._query(statement)
            if not rows:
                raise SourceError(f"{statement} returned nothing: binary logging is off (set log_bin)")
            return BinlogPosition(str(rows[0][0]), int(rows[0][1]))
        if mode == "earliest":
            logs = self.binary_logs()
            if not logs:
                raise SourceError("the server lists no binary logs: binary logging is off (set log_bin)")
            return BinlogPosition(logs[0][0], 4)
        raise PositionError(f"unknown start mode {mode!r}: use latest, earliest, <file>:<pos> or a GTID set")

    def check_available(self, start: BinlogPosition | GtidSet) -> None:
        if not isinstance(start, BinlogPosition):
            return  # the server checks a GTID start itself (error 1236 -> PositionPurgedError)
        logs = self.binary_logs()
        names = {name: size for name, size in logs}
        if start.file in names:
            if start.pos > names[start.file]:
                raise PositionError(
                    f"start position {start} is past the end of {start.file} ({names[start.file]} bytes): "
                    "the checkpoint belongs to another server or the binlog was rewritten"
                )
            return
        oldest = logs[0][0] if logs else None
        if oldest is not None and BinlogPosition(oldest, 4) > start:
            raise PositionPurgedError(
                f"the binlog holding the start position {start} was purged; the oldest binlog on the server is "
                f"{oldest}. Events from {start} up to {oldest}:4 can no longer be read: restore those binlogs "
                "(or re-publish from the outbox table), then start again; the relay will not skip them"
            )
        raise PositionError(
            f"binlog file {start.file} is not on the server (it has {', '.join(list(names)[:5])}...): "
            "the checkpoint belongs to another server"
        )

    def open(self, start: BinlogPosition | GtidSet) -> MySQLBinlogSource:
        # Ask again which server this is: a reconnect may land on another one behind the
        # same address (a moved virtual IP), and its stream must carry that server's id.
        self._flavor = self._server_id = None
        if self._decoder == "fast":
            return self._open_fast(start)
        return self._open_library(start)

    def _open_fast(self, start: BinlogPosition | GtidSet) -> MySQLBinlogSource:
        """The relay's own protocol client and decoder (22x python-mysql-replication)."""
        flavor, server_id = self._facts()
        c = self._conn
        # The server sends a heartbeat after `heartbeat_s` idle seconds; a stream silent
        # for several of them is dead (a network that dropped without a reset).
        conn = BinlogConnection(
            c["host"],
            c["port"],
            c["user"],
            c["password"],
            self._replica_id,
            connect_timeout=c["connect_timeout"],
            heartbeat_s=self._heartbeat,
            read_timeout=max(5.0, 4 * self._heartbeat),
            tls=self._tls,
        )
        try:
            if isinstance(start, BinlogPosition):
                conn.dump_file(start.file, start.pos)
                file = start.file
            elif isinstance(start, MariadbGtidPosition):
                conn.dump_mariadb_gtid(str(start))
                file = None
            else:
                conn.dump_mysql_gtid(str(start))
                file = None
        except BinlogPositionError as exc:
            conn.close()
            raise PositionPurgedError(f"the server refused the start position {start}: {exc}") from exc
        except (BinlogConnectionError, OSError) as exc:
            conn.close()
            raise SourceError(f"cannot open the binlog stream: {exc}") from exc
        from connectors.mysql.binlog_decoder import BinlogDecoder
        from connectors.mysql.table_columns import InformationSchemaColumns

        # A watched table's Table_map without column names or ENUM/SET value names
        # (binlog_row_metadata=MINIMAL) is completed from information_schema.COLUMNS, over a
        # connection of its own opened on first need (connectors/mysql/table_columns.py).
        columns = InformationSchemaColumns(self._conn)
        decoder = BinlogDecoder(self._watched, file, flavor=flavor, table_columns=columns)
        info = ServerInfo(server_id=server_id, flavor=flavor)

        def close() -> None:
            try:
                conn.close()
            finally:
                columns.close()

        # a socket read at a time (see BinlogConnection.event_runs)
        return MySQLBinlogSource(
            conn.event_runs(), decoder.decode_reads, close, info, self._queue_events, self._threaded
        )

    def _open_library(self, start: BinlogPosition | GtidSet) -> MySQLBinlogSource:
        from connectors.mysql.binlog_library import LibraryConverter, open_library_stream

        flavor, server_id = self._facts()
        reader, file = open_library_stream(
            pymysql_args(self._conn), self._replica_id, self._watched, self._heartbeat, start
        )
        info = ServerInfo(server_id=server_id, flavor=flavor)
        converter = LibraryConverter(self._watched, file)
        c = self._conn

        def close() -> None:
            # The library only closes its socket; end the dump on the server too (see
            # BinlogConnection.close), so that a restart finds the replica id free.
            stream = getattr(reader, "_stream_connection", None)
            conn_id = stream.thread_id() if stream is not None and getattr(stream, "_sock", None) else None
            reader.close()
            if conn_id:
                from connectors.mysql.replica_sessions import end_session

                end_session(c, conn_id)

        return MySQLBinlogSource(iter(reader), converter.convert, close, info, self._queue_events, self._threaded)
