"""The python-mysql-replication path of the binlog source (`source.decoder = "library"`):
its stream, and its events turned into `cdc.source_events`. Imported only when that
decoder is chosen, so the default path never loads the library.

Reconnects are the relay's job, never the library's (see connectors/mysql/binlog_source.py):
its list of "expected" error codes is emptied here, so that a dropped connection
surfaces as SourceError instead of a silent reconnect from the library's own position.
"""

from __future__ import annotations

from typing import Any

import pymysql
import pymysqlreplication.binlogstream as _binlogstream
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent,
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc.errors import ConfigError, SourceError
from cdc.gtid import GtidSet, MariadbGtidPosition, MysqlGtidSet
from cdc.position import BinlogPosition
from cdc.source_events import (
    Heartbeat,
    RowChange,
    RowInsert,
    ServerStarted,
    SourceEvent,
    TxBegin,
    TxCommit,
    XaPrepare,
    query_event,
    xid_text,
)
from connectors.mysql.binlog_event_types import FL_STANDALONE, GTID_TAGGED_LOG_EVENT
from connectors.mysql.binlog_library_values import LibraryValues, use_mysql_json_text
from connectors.mysql.client import Connection
from connectors.mysql.errors import error_text
from connectors.mysql.gtid_tagged import TaggedGtidError, read_tagged_gtid

_binlogstream.MYSQL_EXPECTED_ERROR_CODES = []


def open_library_stream(
    conn: dict[str, Any],
    replica_id: int,
    watched: set[tuple[str, str]],
    heartbeat: float,
    start: BinlogPosition | GtidSet,
) -> tuple[Any, str | None]:
    """The library's blocking stream from `start`, and the file it starts in (None for a GTID start)."""
    use_mysql_json_text()  # MySQL JSON as MySQL prints it, as the default decoder publishes it
    kwargs: dict[str, Any] = {
        "connection_settings": conn,
        "pymysql_wrapper": Connection,  # TLS as configured, the preferred mode's context built once
        "server_id": replica_id,
        "blocking": True,
        "only_events": [
            FormatDescriptionEvent,
            RotateEvent,
            GtidEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            UpdateRowsEvent,
            DeleteRowsEvent,
            HeartbeatLogEvent,
            XAPrepareEvent,
            ExecuteLoadQueryEvent,
            # the library does not know MySQL 8.4's Gtid_tagged_log_event (type 42): it comes
            # as a NotImplementedEvent, read by `LibraryConverter` with the relay's own reader
            NotImplementedEvent,
        ],
        "filter_non_implemented_events": False,
        "only_schemas": sorted({schema for schema, _ in watched}) or None,
        "only_tables": sorted({table for _, table in watched}) or None,
        "slave_heartbeat": heartbeat,
        "enable_logging": False,
    }
    if isinstance(start, BinlogPosition):
        kwargs.update(resume_stream=True, log_file=start.file, log_pos=start.pos)
        file = start.file
    else:
        if isinstance(start, MysqlGtidSet) and start.tagged:
            raise ConfigError(
                f'source.decoder = "library" cannot start from a GTID set with tags ({start}): '
                'python-mysql-replication encodes untagged sets only; use source.decoder = "fast"'
            )
        kwargs.update(auto_position=str(start), is_mariadb=isinstance(start, MariadbGtidPosition))
        file = None
    try:
        return BinLogStreamReader(**kwargs), file
    except pymysql.err.MySQLError as exc:
        raise SourceError(f"cannot open the binlog stream: {error_text(exc)}") from exc


class LibraryConverter:
    """Turns library events into source events; keeps the current file name."""

    def __init__(self, watched: set[tuple[str, str]], file: str | None):
        self.watched = watched
        self.file = file or ""  # "": not known until the stream's first Rotate event
        self._values = LibraryValues()  # the values the library changes, put back (binlog_library_values.py)

    def convert(self, ev: Any, out: list[SourceEvent]) -> None:
        kind = type(ev)
        if kind is WriteRowsEvent:
            schema, table = ev.schema, ev.table
            if (schema, table) not in self.watched:
                return  # rows of other tables are never decoded (`rows` is lazy)
            end = BinlogPosition(self.file, ev.packet.log_pos)
            mend = self._values.mender(ev)
            for row in ev.rows:
                out.append(RowInsert(schema, table, row["values"] if mend is None else mend(row, "values"), end))
            return
        if kind is XidEvent:
            out.append(TxCommit(BinlogPosition(self.file, ev.packet.log_pos), ev.timestamp))
            return
        if kind is MariadbGtidEvent or kind is GtidEvent:
            end = ev.packet.log_pos
            start = BinlogPosition(self.file, end - ev.packet.event_size)
            standalone = bool(getattr(ev, "flags", 0) & FL_STANDALONE) if kind is MariadbGtidEvent else False
            opens = kind is MariadbGtidEvent and not standalone
            out.append(TxBegin(start, BinlogPosition(self.file, end), ev.gtid, standalone, opens))
            return
        if kind is QueryEvent:
            self._query(ev, out)
            return
        if kind is XAPrepareEvent:
            format_id = ev.xid_format_id - (1 << 32) if ev.xid_format_id >= 1 << 31 else ev.xid_format_id
            out.append(
                XaPrepare(
                    xid_text(format_id, ev.xid_gtrid, ev.xid_bqual),
                    BinlogPosition(self.file, ev.packet.log_pos),
                    ev.timestamp,
                    ev.one_phase,
                )
            )
            return
        if kind is ExecuteLoadQueryEvent:
            self._load_query(ev, out)
            return
        if kind is RotateEvent:
            self.file = ev.next_binlog
            return
        if kind is FormatDescriptionEvent:
            if ev.created and self.file:  # opened by a server start: see BinlogDecoder._fde
                out.append(ServerStarted(BinlogPosition(self.file, 4)))
            return
        if kind is UpdateRowsEvent or kind is DeleteRowsEvent:
            if (ev.schema, ev.table) in self.watched:
                end = BinlogPosition(self.file, ev.packet.log_pos)
                change = "update" if kind is UpdateRowsEvent else "delete"
                mend = self._values.mender(ev)
                for row in ev.rows:
                    values = row.get("after_values") or row.get("values") or {}
                    if mend is not None and values:
                        values = mend(row, "after_values" if "after_values" in row else "values")
                    out.append(RowChange(change, ev.schema, ev.table, values, end))
            return
        if kind is HeartbeatLogEvent:
            if self.file and ev.packet.log_pos:
                out.append(Heartbeat(BinlogPosition(self.file, ev.packet.log_pos)))
            return
        if kind is NotImplementedEvent and ev.packet.event_type == GTID_TAGGED_LOG_EVENT:
            self._tagged_gtid(ev, out)

    def _tagged_gtid(self, ev: Any, out: list[SourceEvent]) -> None:
        """A tagged transaction's GTID event (connectors/mysql/gtid_tagged.py): the TxBegin
        a GtidEvent gives. The packet still holds the whole event (the OK byte, the header,
        the body, the checksum after the message, which the message's own size leaves out)."""
        end = ev.packet.log_pos
        start = BinlogPosition(self.file, end - ev.packet.event_size)
        try:
            gtid = read_tagged_gtid(bytes(ev.packet.packet.get_all_data()[20:])).gtid
        except TaggedGtidError as exc:
            raise SourceError(f"Gtid_tagged_log_event at {start}: {exc}") from None
        out.append(TxBegin(start, BinlogPosition(self.file, end), gtid, False, False))

    def _query(self, ev: Any, out: list[SourceEvent]) -> None:
        sql = ev.query.strip() if isinstance(ev.query, str) else ev.query.decode("utf-8", "replace").strip()
        end_pos = ev.packet.log_pos
        start = BinlogPosition(self.file, end_pos - ev.packet.event_size)
        schema = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else (ev.schema or "")
        out.append(query_event(sql, start, BinlogPosition(self.file, end_pos), ev.timestamp, schema))

    def _load_query(self, ev: Any, out: list[SourceEvent]) -> None:
        """The library reads Execute_load_query's post-header only: the rest (status
        variables, default database, the LOAD DATA text) is read here the way its
        QueryEvent reads a query's."""
        packet = ev.packet
        packet.read(ev.status_vars_length)
        schema = packet.read(ev.schema_length).decode("utf-8", "replace")
        packet.read(1)
        sql = packet.read(ev.event_size - 26 - ev.status_vars_length - ev.schema_length - 1)
        end_pos = packet.log_pos
        start = BinlogPosition(self.file, end_pos - packet.event_size)
        out.append(
            query_event(
                sql.decode("utf-8", "replace").strip(), start, BinlogPosition(self.file, end_pos), ev.timestamp, schema
            )
        )
