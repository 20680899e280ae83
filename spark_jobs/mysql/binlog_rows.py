"""The rows `cdc_binlog` yields (`BINLOG_FIELDS`): what the relay must publish for each
outbox row of a committed transaction (`EventMapper`, the contract of cdc/events/outbox.py
and cdc/events/topics.py written again here), built column by column into Arrow record
batches (`EventColumns`) or as dicts (`events_of_tx`), and the row that carries an
anomaly of the assembly (`anomaly_row`).

`payload` is binary: the UTF-8 bytes of a text payload (`payload_is_text` true) or the raw
bytes of a binary one (`payload_is_text` false); NULL for a NULL payload. `dlq_cause` is set
when the relay must dead-letter the row (`missing_column`, `null_column`, `illegal_topic`,
`topic_not_allowed`, `statement_format`). `kind` is `event`, `xa_row`, `xa_commit`,
`xa_rollback` or `anomaly` (something the assembly could not make sense of, text in
`dlq_error`).
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.events.column_text import special_text
from cdc.events.outbox import OutboxTable, text_of
from cdc.events.topics import topic_problem
from cdc.position import file_sequence
from spark_jobs.common import KEY_SEP, identity_key
from spark_jobs.mysql.binlog_assembly import XA_COMMITTED, XA_PREPARED, CommittedTx

BINLOG_FIELDS: tuple[tuple[str, str], ...] = (
    ("ikey", "string"),
    ("source", "string"),
    ("server_id", "bigint"),
    ("file", "string"),
    ("file_seq", "bigint"),
    ("tx_pos", "bigint"),
    ("tx_end", "bigint"),
    ("row", "int"),
    ("gtid", "string"),
    ("commit_ts_ms", "bigint"),
    ("table", "string"),
    ("event_id", "string"),
    ("aggregate_type", "string"),
    ("aggregate_id", "string"),
    ("event_type", "string"),
    ("payload", "binary"),
    ("payload_is_text", "boolean"),
    ("timestamp_us", "bigint"),
    ("expected_topic", "string"),
    ("dlq_cause", "string"),
    ("dlq_error", "string"),
    ("kind", "string"),
    ("xa_xid", "string"),
    ("xa_prepare", "string"),
    ("commit_us", "bigint"),  # MySQL's immediate_commit_timestamp (microseconds); NULL on MariaDB
)
# `kind` of a row: an event of an ordinary transaction; a row of an XA prepare group (not
# an event until its XA COMMIT is read); an XA outcome marker; an anomaly of the assembly.
# reconcile.resolve_xa turns XA rows into KIND_XA_EVENT / KIND_XA_UNDECIDED events.
KIND_EVENT, KIND_XA_ROW, KIND_XA_COMMIT, KIND_XA_ROLLBACK, KIND_ANOMALY = (
    "event",
    "xa_row",
    "xa_commit",
    "xa_rollback",
    "anomaly",
)
KIND_XA_EVENT, KIND_XA_UNDECIDED = "xa_event", "xa_undecided"
STATEMENT_FORMAT = "statement_format"  # the dead-letter cause of a statement-logged outbox insert
BINLOG_SCHEMA = ", ".join(f"`{name}` {kind}" for name, kind in BINLOG_FIELDS)


_ARROW_SCHEMA = None


def arrow_schema() -> Any:
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa

        kinds = {
            "string": pa.string(),
            "bigint": pa.int64(),
            "int": pa.int32(),
            "binary": pa.binary(),
            "boolean": pa.bool_(),
        }
        _ARROW_SCHEMA = pa.schema([(name, kinds[kind]) for name, kind in BINLOG_FIELDS])
    return _ARROW_SCHEMA


def anomaly_row(source: str, file: str, text: str) -> dict[str, Any]:
    """Something the verifier's transaction assembly could not make sense of, carried in
    the event stream as a row without identity (`ikey` NULL, `row` -1, text in
    `dlq_error`): the verify job lists these in its report instead of losing them."""
    row: dict[str, Any] = {name: None for name, _ in BINLOG_FIELDS}
    row.update(source=source, file=file, file_seq=file_sequence(file)[1], row=-1, dlq_error=text, kind=KIND_ANOMALY)
    return row


# ------------------------------------------------------------------- outbox mapping


def payload_bytes(value: Any) -> tuple[bytes | None, bool | None]:
    if value is None:
        return None, None
    if isinstance(value, str):
        return value.encode("utf-8"), True
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), False
    if isinstance(value, (dict, list)):  # a MySQL JSON column: keys and strings come as bytes
        return json.dumps(_text_keys(value), separators=(",", ":"), default=str).encode("utf-8"), True
    return (special_text(value) or str(value)).encode("utf-8"), True  # a TIME as MySQL prints it (column_text.py)


def _text_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {_text_keys(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_keys(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_ONE_US = _dt.timedelta(microseconds=1)


def _micros(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return (value - _EPOCH) // _ONE_US  # exact: timestamp() * 1e6 goes through a float
    if isinstance(value, (int, float)):
        return int(value)
    return None


class EventMapper:
    """What the relay must publish for one outbox row (the contract of cdc/events/outbox.py and
    cdc/events/topics.py, written again here): the event's fields, its topic, or why it belongs
    in the dead-letter topic."""

    def __init__(self, tables: Sequence[OutboxTable], allowlist: Sequence[str] = ()):
        self.tables = {(t.schema, t.table): t for t in tables}
        self._layout = {(t.schema, t.table): (t, t.required_columns, f"{t.schema}.{t.table}") for t in tables}
        self.allowlist = tuple(allowlist)
        self._topics: dict[tuple, tuple[str, str | None, str | None]] = {}

    def _route(self, cfg: OutboxTable, aggregate_type: str, event_type: str) -> tuple[str, str | None, str | None]:
        key = (cfg.topic, cfg.schema, cfg.table, aggregate_type, event_type)
        hit = self._topics.get(key)
        if hit is not None:
            return hit
        topic = cfg.topic.format(aggregate_type=aggregate_type, type=event_type, schema=cfg.schema, table=cfg.table)
        problem = topic_problem(topic)
        cause = "illegal_topic" if problem else None
        if problem is None and self.allowlist and not any(fnmatch.fnmatchcase(topic, p) for p in self.allowlist):
            problem, cause = f"topic {topic!r} is not in the allowlist", "topic_not_allowed"
        hit = (topic, cause, problem)
        if len(self._topics) < 10_000:
            self._topics[key] = hit
        return hit

    def map(self, schema: str, table: str, values: Any) -> dict[str, Any]:
        return dict(zip(MAPPED_FIELDS, self.map_values(schema, table, values), strict=True))

    def map_values(self, schema: str, table: str, values: Any) -> tuple:
        """`map` as a tuple in MAPPED_FIELDS order (no dict per row: the reader's hot path).
        `values` is a str for an insert logged as a statement: no row image, so only
        its table and the dead-letter cause `statement_format` are known."""
        cfg, required, name = self._layout[(schema, table)]
        if type(values) is str:
            return (name, None, None, None, None, None, None, None, None, STATEMENT_FORMAT,
                    f"DML logged as a statement, no row image: {values[:200]}")  # fmt: skip
        get = values.get
        out: list[Any] = [name, None, None, None, None]
        for i, column in enumerate(required, 1):  # id, aggregate type, aggregate id, type
            value = get(column)
            if value is not None:
                out[i] = value if type(value) is str else text_of(value)
        for column in required:
            if column not in values:
                return (*out, None, None, None, None, "missing_column", f"no column {column!r}")
        for column in required:
            if values[column] is None:
                return (*out, None, None, None, None, "null_column", f"NULL in required column {column!r}")
        topic, cause, problem = self._route(cfg, out[2], out[4])
        payload, is_text = payload_bytes(get(cfg.payload_column))
        ts = _micros(get(cfg.timestamp_column)) if cfg.timestamp_column else None
        return (*out, payload, is_text, ts, topic, cause, problem)


MAPPED_FIELDS = (
    "table", "event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "payload_is_text", "timestamp_us",
    "expected_topic", "dlq_cause", "dlq_error",
)  # fmt: skip
_N_COORD = 10  # ikey .. commit_ts_ms
_N_MAPPED = len(MAPPED_FIELDS)


def _tx_rows_meta(file: str, tx: CommittedTx) -> tuple[str, str | None, str | None]:
    """(kind, xa_xid, xa_prepare) of the rows a transaction yields."""
    if tx.xa is None:
        return KIND_EVENT, None, None
    kind, xid = tx.xa
    if kind == XA_PREPARED:
        return KIND_XA_ROW, xid, f"{file}:{tx.start}"
    return (KIND_XA_COMMIT if kind == XA_COMMITTED else KIND_XA_ROLLBACK), xid, None


class EventColumns:
    """The event rows of one partition, built column by column (no dict per row) and
    handed out as Arrow record batches of BINLOG_FIELDS. Same values as
    `events_of_tx` + `anomaly_row`."""

    def __init__(self, source: str, mapper: EventMapper):
        self.source = source
        self.mapper = mapper
        self._seq: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self.cols: list[list[Any]] = [[] for _ in BINLOG_FIELDS]
        self.n = 0

    def add_tx(self, file: str, tx: CommittedTx) -> None:
        rows = tx.rows
        n = len(rows)
        marker = tx.xa is not None and tx.xa[0] != XA_PREPARED
        if not n and not marker:
            return
        seq = self._seq.get(file)
        if seq is None:
            seq = self._seq[file] = file_sequence(file)[1]
        source = self.source
        cols = self.cols
        (ikey, c_source, c_sid, c_file, c_seq, c_pos, c_end, c_row, c_gtid, c_ts) = cols[:_N_COORD]
        mapped = cols[_N_COORD : _N_COORD + _N_MAPPED]
        c_kind, c_xid, c_prep, c_commit_us = cols[_N_COORD + _N_MAPPED :]
        kind, xid, prepare = _tx_rows_meta(file, tx)
        if marker:  # an XA outcome: one row, no event
            n = 1
            ikey.append(None)
            c_row.append(-1)
            for c in mapped:
                c.append(None)
        else:
            if tx.xa is None:
                prefix = (
                    f"g{KEY_SEP}{source}{KEY_SEP}{tx.gtid}{KEY_SEP}"
                    if tx.gtid
                    else f"p{KEY_SEP}{source}{KEY_SEP}{file}{KEY_SEP}{tx.start}{KEY_SEP}"
                )
                ikey.extend([prefix + str(i) for i in range(n)])
            else:
                ikey.extend([None] * n)
            c_row.extend(range(n))
            map_values = self.mapper.map_values
            appends = [c.append for c in mapped]
            for schema, table, values in rows:
                for append, value in zip(appends, map_values(schema, table, values), strict=True):
                    append(value)
        c_source.extend([source] * n)
        c_sid.extend([tx.server_id] * n)
        c_file.extend([file] * n)
        c_seq.extend([seq] * n)
        c_pos.extend([tx.start] * n)
        c_end.extend([tx.end] * n)
        c_gtid.extend([tx.gtid] * n)
        c_ts.extend([tx.commit_ts * 1000] * n)
        c_kind.extend([kind] * n)
        c_xid.extend([xid] * n)
        c_prep.extend([prepare] * n)
        c_commit_us.extend([tx.commit_us] * n)
        self.n += n

    def add_row(self, row: Mapping[str, Any]) -> None:
        for column, (name, _kind) in zip(self.cols, BINLOG_FIELDS, strict=True):
            column.append(row[name])
        self.n += 1

    def take(self) -> Any:
        """The rows so far as one Arrow record batch (and start afresh)."""
        import pyarrow as pa

        schema = arrow_schema()
        batch = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(self.cols, schema, strict=True)], schema=schema
        )
        self._reset()
        return batch


def events_of_tx(source: str, file: str, tx: CommittedTx, mapper: EventMapper) -> Iterator[dict[str, Any]]:
    """The rows of one transaction as dicts (BINLOG_FIELDS): its events; for an XA
    prepare group its held rows (kind xa_row, no identity yet); for an XA outcome group
    one marker row."""
    seq = file_sequence(file)[1]
    kind, xid, prepare = _tx_rows_meta(file, tx)
    base = {
        "source": source, "server_id": tx.server_id, "file": file, "file_seq": seq, "tx_pos": tx.start, "tx_end": tx.end,
        "gtid": tx.gtid, "commit_ts_ms": tx.commit_ts * 1000, "kind": kind, "xa_xid": xid, "xa_prepare": prepare,
        "commit_us": tx.commit_us,
    }  # fmt: skip
    if tx.xa is not None and tx.xa[0] != XA_PREPARED:
        row: dict[str, Any] = {name: None for name in MAPPED_FIELDS}
        row.update(base, ikey=None, row=-1)
        yield row
        return
    for index, (schema, table, values) in enumerate(tx.rows):
        row = mapper.map(schema, table, values)
        row.update(
            base, ikey=identity_key(source, tx.gtid, file, tx.start, index) if tx.xa is None else None, row=index
        )
        yield row
