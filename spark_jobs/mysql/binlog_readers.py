"""The two binlog readers of `cdc_binlog` (`binlog_reader` option): `read_binlog_file`
(python-mysql-replication, independent of the relay: the default) and
`read_binlog_file_fast` (the relay's own reader: faster, NOT independent). Both hand the
events of one file range to the verifier's own assembly (`binlog_assembly.py`) and yield
its committed transactions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from cdc.events.outbox import OutboxTable
from spark_jobs.common import scrub, where
from spark_jobs.mysql.binlog_assembly import (
    XA_COMMITTED,
    XA_ROLLED_BACK,
    CommittedTx,
    TxAssembler,
    assemble_query,
    canonical_xid,
    mysql_commit_us,
    xid_text,
)  # fmt: skip
from spark_jobs.mysql.binlog_plan import connect_mysql

# -------------------------------------------------------------------------- reading


@contextmanager
def _reading(
    file: str,
    settings: Mapping[str, Any],
    asm: TxAssembler,
    end: int,
    close: Callable[[], None],
    on_anomaly: Callable[[str], None] | None,
) -> Iterator[None]:
    """The common ending of both binlog readers: a transaction left open at the end of the
    range is an anomaly, a failure becomes one line without the password, and the stream
    is closed and the anomalies reported whatever happened."""
    try:
        yield
        if asm.open and asm.rows:
            asm.anomalies.append(
                f"{len(asm.rows)} outbox row(s) of the transaction at {asm.start} not committed by {end}"
            )
    except Exception as exc:
        raise RuntimeError(
            f"cdc_binlog: reading {file} from {where(settings)} failed: {scrub(str(exc), settings)}"
        ) from None
    finally:
        close()
        if on_anomaly is not None:
            for text in asm.anomalies:
                on_anomaly(f"{file}: {text}")


def _assembler(tables: Sequence[OutboxTable]) -> TxAssembler:
    return TxAssembler(id_columns={(t.schema, t.table): t.id_column for t in tables})


def read_binlog_file(
    settings: Mapping[str, Any],
    file: str,
    start: int,
    end: int,
    server_id: int,
    tables: Sequence[OutboxTable],
    on_anomaly: Any = None,
    expected_only: bool = False,
) -> Iterator[CommittedTx]:
    """The committed transactions (with their outbox rows) of one binlog file, from
    `start` up to (not past) `end`; and the XA prepare and outcome groups (`xa` set).
    With `expected_only` only the outbox tables' expected columns (what the proof
    compares) get their value converted; a temporal column beside them keeps the
    library's integer or string of bits (binlog_table_map.py)."""
    from pymysqlreplication.event import (
        ExecuteLoadQueryEvent,
        GtidEvent,
        MariadbGtidEvent,
        QueryEvent,
        RotateEvent,
        XAPrepareEvent,
        XidEvent,
    )  # fmt: skip
    from pymysqlreplication.row_event import DeleteRowsEvent, WriteRowsEvent

    from spark_jobs.mysql.binlog_compressed import ExpandingConnection, tagged_gtid
    from spark_jobs.mysql.binlog_compressed import event_start as event_start_of
    from spark_jobs.mysql.binlog_table_map import TableMapRewriter, stream_reader_class

    wanted = {(t.schema, t.table) for t in tables}
    from connectors.mysql.client import pymysql_args

    columns = _ColumnLookup(settings)
    # the columns the proof reads (EventMapper, the assembly's id): others get no conversion
    needed: dict[tuple[str, str], frozenset[str]] | None = None
    if expected_only:
        needed = {}
        for t in tables:
            needed[(t.schema, t.table)] = needed.get((t.schema, t.table), frozenset()) | frozenset(t.expected_columns)
    table_maps = TableMapRewriter(wanted, columns, needed=needed)
    shapes = table_maps.shapes
    stream = stream_reader_class()(
        connection_settings=pymysql_args(settings),  # TLS as the relay's config says
        # compressed events reach the library as plain ones, Table_maps of watched tables
        # as it must read them (spark_jobs/mysql/binlog_table_map.py)
        pymysql_wrapper=functools.partial(ExpandingConnection, table_maps=table_maps),
        server_id=server_id,
        resume_stream=True,
        log_file=file,
        log_pos=start,
        blocking=False,
        only_events=[
            MariadbGtidEvent,
            GtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            DeleteRowsEvent,
            RotateEvent,
            XAPrepareEvent,
            ExecuteLoadQueryEvent,
        ],
        only_tables=sorted({t.table for t in tables}),
        only_schemas=sorted({t.schema for t in tables}),
        enable_logging=False,
        # A table id already mapped is not parsed again (half the reader's CPU at 10 events a
        # transaction). Safe within one file: the server gives a table a new id whenever its
        # definition is loaded anew (ALTER, FLUSH TABLES), ids are reused only across a restart,
        # which starts a new file, and this stream reads one file.
        freeze_schema=True,
    )
    asm = _assembler(tables)

    def close() -> None:
        stream.close()
        columns.close()

    with _reading(file, settings, asm, end, close, on_anomaly):
        for event in stream:
            packet = event.packet
            event_end = packet.log_pos
            if isinstance(event, RotateEvent):
                if event.next_binlog != file:
                    break  # the end of this file
                continue
            if event_end and event_end > end:
                break
            event_start = event_start_of(packet)
            if isinstance(event, (WriteRowsEvent, DeleteRowsEvent)):
                if (event.schema, event.table) not in wanted:
                    continue
                rows = row_values(event, shapes.get(event.table_id), asm, event_start)
                if rows is None:
                    pass
                elif isinstance(event, WriteRowsEvent):
                    asm.add_rows(event.schema, event.table, rows, event_start)
                else:
                    asm.delete_rows(event.schema, event.table, rows)
            elif isinstance(event, XidEvent):
                tx = asm.commit(event_end, event.timestamp)
                if tx is not None:
                    yield tx
            elif isinstance(event, XAPrepareEvent):
                xid = xid_text(event.xid_format_id, event.xid_gtrid, event.xid_bqual)
                tx = asm.xa_prepare(xid, event_end, event.timestamp, event.one_phase)
                if tx is not None:
                    yield tx
            elif isinstance(event, MariadbGtidEvent):
                asm.gtid_event(
                    event_start, event.gtid, packet.server_id, standalone=bool(event.flags & 0x01), implies_begin=True
                )
            elif isinstance(event, GtidEvent):
                # The library stops after the logical clock (MySQL 5.7's layout); MySQL 8 goes on
                # with the commit time in microseconds: read it here.
                # A MySQL 8.4 tagged GTID event reaches the library as this event; its GTID
                # (uuid:tag:gno) is on the packet (spark_jobs/mysql/binlog_tagged_gtid.py).
                rest = event.event_size - 42 if hasattr(event, "sequence_number") else 0
                asm.gtid_event(
                    event_start,
                    tagged_gtid(packet) or event.gtid,
                    packet.server_id,
                    commit_us=mysql_commit_us(event.packet.read(rest)) if rest >= 7 else None,
                )
            elif isinstance(event, ExecuteLoadQueryEvent):
                # LOAD DATA logged as a statement: the library reads only the post-header;
                # status variables, default schema and the statement follow.
                event.packet.read(event.status_vars_length)
                schema = event.packet.read(event.schema_length).decode("utf-8", "replace")
                event.packet.advance(1)
                size = event.event_size - 26 - event.status_vars_length - event.schema_length - 1
                query = event.packet.read(size).decode("utf-8", "replace") if size > 0 else ""
                asm.statement(schema, query, event_start, wanted)
            elif isinstance(event, QueryEvent):
                query = event.query if isinstance(event.query, str) else event.query.decode("utf-8", "replace")
                schema = event.schema if isinstance(event.schema, str) else event.schema.decode("utf-8", "replace")
                tx = assemble_query(
                    asm, query, schema, event_start, event_end, event.timestamp, packet.server_id, wanted
                )
                if tx is not None:
                    yield tx


class _ColumnLookup:
    """information_schema.COLUMNS of a table (binlog_table_map.lookup_columns) over the
    verifier's own connection, opened at the first look-up (most reads need none)."""

    def __init__(self, settings: Mapping[str, Any]):
        self.settings = settings
        self.conn: Any = None

    def __call__(self, schema: str, table: str) -> list[Any]:
        from spark_jobs.mysql.binlog_table_map import lookup_columns

        if self.conn is None:
            self.conn = connect_mysql(self.settings)
        with self.conn.cursor() as cur:
            return lookup_columns(cur, schema, table)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def row_values(event: Any, shape: Any, asm: TxAssembler, at: int) -> Iterable[dict[str, Any]] | None:
    """The rows of a library rows event of a watched table, with MySQL's values where the
    library has none of its own (`shape`: binlog_table_map.TableShape of its table id): a
    JSON column as MySQL's JSON text (spark_jobs/mysql/json_text.py), a SET as its names
    joined by commas in definition order (`SELECT set_col`; the empty set is ''), DATE /
    DATETIME / TIMESTAMP / YEAR from their bytes (MySQL's text where Python has no value). None,
    with an anomaly naming the cause, for a table id whose columns cannot be known."""
    if shape is None or not (shape.json or shape.sets or shape.undecidable or shape.raw):
        return (r["values"] for r in event.rows)
    if shape.undecidable:
        asm.anomalies.append(f"the outbox row(s) of the rows event at {at} are undecidable: {shape.undecidable}")
        return None
    return (_mysql_values(r, shape) for r in event.rows)


def _mysql_values(row: dict[str, Any], shape: Any) -> dict[str, Any]:
    from spark_jobs.mysql.json_text import to_text

    values = row["values"]
    if shape.raw:  # dates, times and YEAR the library was given as BIT (binlog_table_map.py)
        shape.read_raw(values)
    for i in shape.json:
        name = shape.names[i]
        raw = values.get(name)
        if raw is not None:  # SQL NULL stays None
            values[name] = to_text(raw)
    for i, names in shape.sets.items():
        name = shape.names[i]
        value = values.get(name)
        if value is None and row.get("none_sources", {}).get(name) == "empty set":
            values[name] = ""  # the library's None for an empty SET; the value is ''
        elif isinstance(value, (set, frozenset)):
            values[name] = ",".join(n for n in names if n in value)
    return values


def read_binlog_file_fast(
    settings: Mapping[str, Any],
    file: str,
    start: int,
    end: int,
    server_id: int,
    tables: Sequence[OutboxTable],
    on_anomaly: Any = None,
    expected_only: bool = False,  # the same signature; the decoder converts every column anyway
) -> Iterator[CommittedTx]:
    """`read_binlog_file` through the RELAY's own binlog reader
    (`connectors.mysql.binlog_protocol.BinlogConnection` + `connectors.mysql.binlog_decoder.BinlogDecoder`)
    instead of python-mysql-replication: several times faster, but NOT independent of the
    relay's reading path (a decoder bug would be made by both sides and hide itself).
    Opt-in only (`binlog_reader="fast"`). The decoded events are taken by their type's
    name (this module imports neither `cdc.source_events` nor `cdc.assembly.transaction`) and go
    through the verifier's own `TxAssembler`; a `Statement` (any query the decoder does
    not take for transaction control) is classified again by the verifier's own rules
    (`classify_query`, `statement_insert_target`)."""
    from cdc.tls import TlsConfig
    from connectors.mysql.binlog_decoder import BinlogDecoder
    from connectors.mysql.binlog_protocol import BinlogConnection

    wanted = {(t.schema, t.table) for t in tables}
    conn = BinlogConnection(
        str(settings.get("host", "127.0.0.1")), int(settings.get("port", 3306)), str(settings.get("user", "root")),
        str(settings.get("password", "") or ""), server_id, read_timeout=120.0, tls=TlsConfig.from_settings(settings),
    )  # fmt: skip
    decoder = BinlogDecoder(wanted, file)
    asm = _assembler(tables)
    out: list[Any] = []
    rows: list[tuple[str, str, dict[str, Any]]] = []  # consecutive inserts of one row event
    with _reading(file, settings, asm, end, conn.close, on_anomaly):
        conn.dump_file(file, start, blocking=False)
        for raw in conn.events():
            kind = raw[4]
            event_end = int.from_bytes(raw[13:17], "little")
            if kind == _ROTATE_EVENT:
                decoder.decode(raw, out)
                out.clear()
                if event_end and decoder.file != file:
                    break  # the end of this file
                continue
            if event_end and event_end > end:
                break
            decoder.decode(raw, out)
            if not out:
                continue
            event_start = event_end - int.from_bytes(raw[9:13], "little")
            for ev in out:
                t = type(ev).__name__
                if t == "RowInsert":
                    rows.append((ev.schema, ev.table, ev.values))
                    continue
                if rows:
                    asm.add_rows_of(rows, event_start)
                    rows = []
                tx = None
                sid = int.from_bytes(raw[5:9], "little")
                if t == "TxCommit":
                    tx = asm.commit(event_end, ev.timestamp)
                elif t == "TxBegin":
                    if ev.gtid is not None:
                        mariadb = kind == _MARIADB_GTID_EVENT
                        asm.gtid_event(event_start, ev.gtid, sid, standalone=ev.standalone, implies_begin=mariadb)
                    else:
                        asm.begin(event_start, sid)
                elif t == "RowChange":
                    if ev.kind == "delete":
                        asm.delete_rows(ev.schema, ev.table, [ev.values])
                elif t == "TxRollback":
                    asm.rollback()
                elif t == "Savepoint":
                    asm.savepoint(ev.name)
                elif t == "RollbackToSavepoint":
                    asm.rollback_to(ev.name, event_start)
                elif t == "Statement":
                    tx = assemble_query(asm, ev.sql, ev.schema, event_start, event_end, ev.timestamp, sid, wanted)
                elif t == "XaPrepare":
                    tx = asm.xa_prepare(canonical_xid(ev.xid), event_end, ev.timestamp, ev.one_phase)
                elif t == "XaCommit":
                    if ev.one_phase:
                        tx = asm.commit(event_end, ev.timestamp)
                    else:
                        tx = asm.xa_outcome(
                            XA_COMMITTED, canonical_xid(ev.xid), event_start, event_end, ev.timestamp, sid
                        )
                elif t == "XaRollback":
                    # the decoder's XaRollback carries no timestamp: the event header's
                    tx = asm.xa_outcome(XA_ROLLED_BACK, canonical_xid(ev.xid), event_start, event_end,
                                        int.from_bytes(raw[0:4], "little"), sid)  # fmt: skip
                if tx is not None:
                    yield tx
            if rows:
                asm.add_rows_of(rows, event_start)
                rows = []
            out.clear()


_ROTATE_EVENT = 4
_MARIADB_GTID_EVENT = 162
