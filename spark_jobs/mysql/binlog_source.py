"""PySpark Python data source `cdc_binlog`: the committed outbox inserts of a MariaDB /
MySQL binlog, one row per event, with the coordinates the relay puts in its headers.

    spark.read.format("cdc_binlog")
        .option("host", ...).option("port", ...).option("user", ...).option("password", ...)
        .option("source", "shop-db")                       # the relay's source name
        .option("tables", tables_to_json([OutboxTable(...)]))
        .option("server_id_base", "1234567")               # optional
        .option("start_file", "mysql-bin.000003")          # optional
        .option("end_position", "mysql-bin.000007:1234")   # optional, default: now
        .option("split_bytes", str(8 << 20))               # optional: pieces of ~8 MiB
        .option("binlog_reader", "default")                # or "fast" (NOT independent)
        .option("plan", json.dumps(plan_binlog(...)))      # optional: a fixed snapshot
        .load()

Partitions: one per binlog file (`SHOW BINARY LOGS`), or with `split_bytes` (the verify
job sets it: about three pieces per core) pieces of about that many bytes cut at
transaction starts (`SHOW BINLOG EVENTS`: GTID events, or BEGIN without GTIDs), so more
cores finish sooner. Each piece is read over its own replication connection with its own
server_id (`server_id_base + index`; two dump threads with one server_id would disconnect
each other). Every partition reads `[start, end)` of one file; the end of the newest file
is the server's position when the plan was made, so a read is a consistent snapshot even
while the server keeps writing.

Readers (`binlog_reader`): "default" decodes with python-mysql-replication - a second,
independent decoder, so a bug of the relay's decoder cannot hide itself. Compressed
events (MariaDB's log_bin_compress, MySQL's Transaction_payload), which the library does
not know, are expanded into the plain events they stand for by the verifier's own code
(`spark_jobs/mysql/binlog_compressed.py`) before the library decodes them, and what the
library misreads of MySQL 8.4 / 9.x rows is prepared by the verifier's own code too:
Table_maps without `binlog_row_metadata=FULL` get names and ENUM / SET values from
information_schema, JSON reaches the payload as MySQL's own text, VECTOR as its bytes,
a partial JSON update as the whole document (`spark_jobs/mysql/binlog_table_map.py`,
`mysql_json_text.py`, `binlog_partial_json.py`; docs/verifier.md, "Reading what MySQL writes"). "fast" uses the
relay's own reader (`connectors.mysql.binlog_protocol` + `connectors.mysql.binlog_decoder`) and is
several times faster, but a decoder bug would then be made by both sides: opt in only
when that trade is acceptable. Either way the events go through the verifier's own
transaction assembly below, and rows reach Spark as Arrow batches built column by column.

The transaction assembly here is the verifier's own (buffer outbox rows until XID or
`COMMIT`; drop them on `ROLLBACK`; cut back to the savepoint on `ROLLBACK TO`); it shares
nothing with the relay's `cdc/assembly/transaction.py` / `cdc/source_events.py` / `cdc/recovery.py`,
so a bug there cannot hide itself. Beyond that:

* XA. A prepare group (MariaDB: GTID event, rows, `XA END`, XA_prepare event) yields its
  outbox rows as `kind = xa_row` rows tagged with the xid (`xa_xid`, text form
  `X'<gtrid hex>',X'<bqual hex>',<formatID>`) and the prepare group's coordinates, with
  no identity yet; an outcome group (`XA COMMIT <xid>` / `XA ROLLBACK <xid>`, its own GTID
  event) yields one marker row (`xa_commit` / `xa_rollback`) with the outcome group's
  coordinates. A prepare and its outcome are often read by different partitions (other
  byte ranges, other files), so nothing is decided here: `spark_jobs/reconcile.py`
  `resolve_xa` pairs them over the whole read before reconciling. `XA COMMIT ... ONE
  PHASE` (and MySQL's one-phase XA_prepare event) is an ordinary commit.
* A statement-logged INSERT / REPLACE / LOAD DATA into an outbox table (a Query or
  Execute_load_query event inside a multi-statement transaction; an unqualified table is
  in the event's default schema) takes one row index, like the relay's dead letter for it;
  its row has `dlq_cause = statement_format` and no content (the binlog holds no row image).
* A Write_rows of an outbox id that a Delete_rows of the same table removed earlier in the
  same transaction (REPLACE written as delete + insert) is not an event: the relay treats
  it as a change of an existing event. So both readers read Delete_rows of outbox tables.

Schema: see `BINLOG_SCHEMA`. `payload` is binary: the UTF-8 bytes of a text payload
(`payload_is_text` true) or the raw bytes of a binary one (`payload_is_text` false);
NULL for a NULL payload. `dlq_cause` is set when the relay must dead-letter the row
(`missing_column`, `null_column`, `illegal_topic`, `topic_not_allowed`,
`statement_format`). `kind` is `event`, `xa_row`, `xa_commit`, `xa_rollback` or
`anomaly` (something the assembly could not make sense of, text in `dlq_error`).

The password is never logged and is scrubbed from error messages.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import functools
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from cdc.events.column_text import special_text
from cdc.events.outbox import OutboxTable, text_of
from cdc.events.topics import topic_problem
from cdc.position import BinlogPosition, file_sequence
from connectors.mysql.client import binlog_end
from spark_jobs.common import (
    KEY_SEP,
    DataSource,
    DataSourceReader,
    InputPartition,
    identity_key,
    mysql_settings_from_options,
    opt_int,
    opt_json,
    scrub,
    settle_worker,
    where,
)

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
BATCH_ROWS = 8192


# --------------------------------------------------------------------------- config


def tables_to_json(tables: Sequence[OutboxTable]) -> str:
    return json.dumps([asdict(t) for t in tables])


def tables_from_json(text: str | None) -> list[OutboxTable]:
    if not text:
        raise ValueError("cdc_binlog: option 'tables' (JSON list of outbox tables) is required")
    return [OutboxTable(**item) for item in json.loads(text)]


# ------------------------------------------------------------------ transaction assembly


@dataclass
class CommittedTx:
    start: int  # position of the transaction's first event (GTID or BEGIN)
    end: int  # position right after its commit event
    gtid: str | None
    server_id: int
    commit_ts: int  # commit event header time, seconds
    # (schema, table, values) in binlog order; `values` is the SQL text (a str) for an
    # outbox insert logged as a statement (no row image: cause statement_format)
    rows: list[tuple[str, str, Any]]
    # An XA group: (XA_PREPARED, xid) for a prepare group (`rows` are held, not yet
    # events), (XA_COMMITTED | XA_ROLLED_BACK, xid) for an outcome group (no rows).
    xa: tuple[str, str] | None = None
    commit_us: int | None = None  # MySQL: the GTID event's immediate_commit_timestamp (microseconds)


def mysql_commit_us(rest: bytes) -> int | None:
    """MySQL 8's Gtid_log_event after sequence_number: immediate_commit_timestamp, 7
    little-endian bytes of microseconds whose top bit (55) flags an original_commit_timestamp
    after it. None when the event ends before it (MySQL 5.7) or it is 0."""
    if len(rest) < 7:
        return None
    return (int.from_bytes(rest[:7], "little") & ~(1 << 55)) or None


XA_PREPARED, XA_COMMITTED, XA_ROLLED_BACK = "prepare", "commit", "rollback"


@dataclass
class TxAssembler:
    """Feeds on binlog events of ONE file, in order; `commit` returns the transaction.

    States: no transaction open; open (after a GTID or BEGIN). Rows of the configured
    outbox tables are buffered; `commit` hands them over, `rollback` drops them,
    `rollback_to(name)` cuts them back to what was buffered at `savepoint(name)`.
    Unexpected sequences are counted in `anomalies` (and their rows dropped), never
    silently turned into events.

    XA: `xa_prepare` ends a prepare group and hands its rows over tagged
    (XA_PREPARED, xid) - they are not events until an outcome for the xid is read,
    maybe in another partition (see spark_jobs/reconcile.py `resolve_xa`);
    `xa_outcome` hands over an outcome marker (XA_COMMITTED / XA_ROLLED_BACK, xid) with
    the outcome group's coordinates. `XA COMMIT ... ONE PHASE` is an ordinary commit.

    Statement-logged inserts into an outbox table (`statement`) take one row index, as
    a row whose values are the SQL text. A Write_rows of an outbox id that a Delete_rows
    of the same table removed earlier in the same transaction (REPLACE written as
    delete + insert) is a change of an existing event, not an event (`delete_rows`)."""

    open: bool = False
    start: int = 0
    gtid: str | None = None
    server_id: int = 0
    standalone: bool = False
    multi: bool = False  # a multi-statement transaction (BEGIN, or MariaDB's non-standalone GTID)
    commit_us: int | None = None  # from a MySQL GTID event
    rows: list[tuple[str, str, Any]] = field(default_factory=list)
    savepoints: dict[str, int] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    # (schema, table) -> its id column: which deletes can turn a later insert into a change
    id_columns: dict[tuple[str, str], str] = field(default_factory=dict)
    deleted: set[tuple[str, str, Any]] = field(default_factory=set)

    def _reset(self) -> None:
        self.open = False
        self.start = 0
        self.gtid = None
        self.server_id = 0
        self.standalone = False
        self.multi = False
        self.commit_us = None
        self.rows = []
        self.savepoints = {}
        self.deleted = set()

    def _drop_open(self, why: str, at: int) -> None:
        if self.open and self.rows:
            self.anomalies.append(
                f"{len(self.rows)} outbox row(s) of the transaction at {self.start} dropped: {why} at {at}"
            )
        self._reset()

    def gtid_event(self, start: int, gtid: str, server_id: int, standalone: bool = False, implies_begin: bool = False,
                   commit_us: int | None = None) -> None:  # fmt: skip
        """MariaDB's GTID event opens the transaction itself unless it is standalone
        (`implies_begin`); MySQL's is followed by a BEGIN query (or by DDL)."""
        self._drop_open("a new GTID event before its commit", start)
        self.commit_us = commit_us
        self.open = True
        self.start = start
        self.gtid = gtid
        self.server_id = server_id
        self.standalone = standalone
        self.multi = implies_begin and not standalone

    def begin(self, start: int, server_id: int) -> None:
        if self.open and self.gtid is not None and not self.multi and not self.rows and not self.standalone:
            self.multi = True  # MySQL: GTID then BEGIN; the transaction started at its GTID event
            return
        self._drop_open("BEGIN before the previous transaction's commit", start)
        self.open = True
        self.multi = True
        self.start = start
        self.server_id = server_id

    def add_rows(self, schema: str, table: str, rows: Iterable[dict[str, Any]], at: int) -> None:
        if not self.open:
            # Rows outside a transaction cannot come from a well-formed binlog.
            n = sum(1 for _ in rows)
            self.anomalies.append(f"{n} outbox row(s) outside any transaction at {at} ignored")
            return
        if self.deleted:
            self.add_rows_of([(schema, table, values) for values in rows], at)
            return
        for values in rows:
            self.rows.append((schema, table, values))

    def add_rows_of(self, rows: list[tuple[str, str, dict[str, Any]]], at: int) -> None:
        """`add_rows` for (schema, table, values) triples already built."""
        if not self.open:
            self.anomalies.append(f"{len(rows)} outbox row(s) outside any transaction at {at} ignored")
            return
        if self.deleted:
            deleted, ids = self.deleted, self.id_columns
            rows = [r for r in rows if (r[0], r[1], _hashable(r[2].get(ids.get((r[0], r[1]), "id")))) not in deleted]
        self.rows.extend(rows)

    def delete_rows(self, schema: str, table: str, rows: Iterable[dict[str, Any]]) -> None:
        """Outbox rows deleted (Delete_rows): an insert of one of these ids later in the
        same transaction is the second half of a REPLACE, not a new event."""
        if not self.open:
            return
        column = self.id_columns.get((schema, table), "id")
        for values in rows:
            self.deleted.add((schema, table, _hashable(values.get(column))))

    def statement(self, default_schema: str, sql: str, at: int, wanted: Any) -> None:
        """A Query event that is not transaction control: inside a multi-statement
        transaction a statement-logged INSERT / REPLACE / LOAD DATA into an outbox table
        (`wanted`: the (schema, table) pairs) takes one row index; anything else is
        ignored there. Outside one, a statement ends a standalone group (DDL)."""
        if self.open and self.multi:
            target = statement_insert_target(sql, default_schema)
            if target is not None and target in wanted:
                self.rows.append((target[0], target[1], sql))
            return
        self.other_statement(at)

    def savepoint(self, name: str) -> None:
        if self.open:
            self.savepoints[name.lower()] = len(self.rows)

    def rollback_to(self, name: str, at: int) -> None:
        if not self.open:
            return
        mark = self.savepoints.get(name.lower())
        if mark is None:
            self.anomalies.append(f"ROLLBACK TO unknown savepoint {name!r} at {at}")
            return
        del self.rows[mark:]
        # savepoints set after this one are gone (SQL semantics)
        self.savepoints = {k: v for k, v in self.savepoints.items() if v <= mark}

    def rollback(self) -> None:
        self._reset()

    def commit(self, end: int, timestamp: int) -> CommittedTx | None:
        if not self.open:
            self.anomalies.append(f"commit event without a transaction at {end}")
            return None
        tx = CommittedTx(self.start, end, self.gtid, self.server_id, timestamp, self.rows, commit_us=self.commit_us)
        self._reset()
        return tx

    def xa_prepare(self, xid: str, end: int, timestamp: int, one_phase: bool = False) -> CommittedTx | None:
        """The XA_prepare event ending a prepare group: its rows, tagged with the xid
        (MySQL's one-phase XA_prepare commits at once)."""
        if not self.open:
            self.anomalies.append(f"XA prepare of {xid} without a transaction at {end}")
            return None
        if one_phase:
            return self.commit(end, timestamp)
        tx = CommittedTx(
            self.start,
            end,
            self.gtid,
            self.server_id,
            timestamp,
            self.rows,
            (XA_PREPARED, xid),
            commit_us=self.commit_us,
        )
        self._reset()
        return tx

    def xa_outcome(self, kind: str, xid: str, start: int, end: int, timestamp: int, server_id: int) -> CommittedTx:
        """`XA COMMIT <xid>` / `XA ROLLBACK <xid>`: the outcome group of a prepared
        transaction, starting at its GTID event (or at the query without GTIDs)."""
        if self.open and self.rows:
            self.anomalies.append(f"{len(self.rows)} outbox row(s) in the XA outcome group at {self.start} ignored")
        commit_us = None
        if self.open:
            start, gtid, server_id, commit_us = self.start, self.gtid, self.server_id, self.commit_us
        else:
            gtid = None
        tx = CommittedTx(start, end, gtid, server_id, timestamp, [], (kind, xid), commit_us=commit_us)
        self._reset()
        return tx

    def other_statement(self, at: int) -> None:
        """A statement that is not transaction control (DDL): it ends a standalone
        GTID group; inside a multi-statement transaction it is ignored."""
        if self.open and not self.multi:
            self._drop_open("DDL", at)


def _hashable(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray) else value


_SAVEPOINT = re.compile(r"^SAVEPOINT\s+`?([^`]+?)`?\s*;?$", re.IGNORECASE | re.DOTALL)
_ROLLBACK_TO = re.compile(
    r"^ROLLBACK\s+(?:WORK\s+)?TO\s+(?:SAVEPOINT\s+)?`?([^`]+?)`?\s*;?$", re.IGNORECASE | re.DOTALL
)
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_XA = re.compile(r"^XA\s+(END|COMMIT|ROLLBACK)\s+(.*?)(\s+ONE\s+PHASE)?\s*$", re.IGNORECASE | re.DOTALL)


def classify_query(query: str) -> tuple[str, str | None]:
    """A Query event's statement as ("begin"|"commit"|"rollback"|"savepoint"|
    "rollback_to"|"xa_end"|"xa_commit"|"xa_commit_one_phase"|"xa_rollback"|"other",
    the savepoint name or the xid in `xid_text` form)."""
    text = _COMMENT.sub(" ", query).strip().rstrip(";").strip()
    upper = text.upper()
    if upper in ("BEGIN", "START TRANSACTION") or upper.startswith(("XA START", "XA BEGIN")):
        return "begin", None
    if upper in ("COMMIT", "COMMIT WORK"):
        return "commit", None
    if upper in ("ROLLBACK", "ROLLBACK WORK"):
        return "rollback", None
    m = _XA.match(text)
    if m:
        verb = m.group(1).upper()
        kind = {"END": "xa_end", "COMMIT": "xa_commit", "ROLLBACK": "xa_rollback"}[verb]
        if m.group(3) and verb == "COMMIT":
            kind = "xa_commit_one_phase"
        return kind, canonical_xid(m.group(2))
    m = _ROLLBACK_TO.match(text)
    if m:
        return "rollback_to", m.group(1)
    m = _SAVEPOINT.match(text)
    if m:
        return "savepoint", m.group(1)
    return "other", None


def xid_text(format_id: int, gtrid: bytes, bqual: bytes) -> str:
    """An xid as the server writes it in `XA COMMIT` queries (and as the relay's
    `cdc.xa.prepare` peers name it): X'<gtrid hex>',X'<bqual hex>',<formatID>."""
    return f"X'{gtrid.hex()}',X'{bqual.hex()}',{format_id}"


_XID_PART = re.compile(r"""\s*(?:[Xx]'([0-9A-Fa-f]*)'|'((?:[^']|'')*)'|"((?:[^"]|"")*)"|(\d+))\s*""")


def canonical_xid(text: str) -> str:
    """The xid of an XA statement in `xid_text` form: the server writes
    X'..',X'..',n; a hand-written binlog may carry 'gtrid'[,'bqual'[,formatID]]. Text
    that is not an xid is returned unchanged (it still pairs with itself)."""
    parts: list[str | bytes] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _XID_PART.match(text, pos)
        if m is None:
            return text
        if m.group(1) is not None:
            if len(m.group(1)) % 2:
                return text
            parts.append(bytes.fromhex(m.group(1)))
        elif m.group(2) is not None:
            parts.append(m.group(2).replace("''", "'").encode())
        elif m.group(3) is not None:
            parts.append(m.group(3).replace('""', '"').encode())
        else:
            parts.append(m.group(4))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                return text
            pos += 1
    if not parts or not isinstance(parts[0], bytes) or len(parts) > 3:
        return text
    gtrid = parts[0]
    bqual = parts[1] if len(parts) > 1 else b""
    fmt = parts[2] if len(parts) > 2 else "1"
    if not isinstance(bqual, bytes) or not isinstance(fmt, str):
        return text
    return xid_text(int(fmt), gtrid, bqual)


# statement-logged DML: only the target of INSERT / REPLACE / LOAD DATA matters here
_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_TARGET = rf"(?P<a>{_IDENT})(?:\s*\.\s*(?P<b>{_IDENT}))?"
_LEADING = re.compile(r"^(?:\s+|/\*.*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$))*", re.DOTALL)
_INSERT_INTO = re.compile(
    rf"(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?{_TARGET}", re.IGNORECASE
)
_LOAD_INTO = re.compile(rf"LOAD\s+(?:DATA|XML)\b.*?\bINTO\s+TABLE\s+{_TARGET}", re.IGNORECASE | re.DOTALL)


def _ident(text: str) -> str:
    return text[1:-1].replace("``", "`") if text.startswith("`") else text


def statement_insert_target(sql: str, default_schema: str) -> tuple[str, str] | None:
    """(schema, table) that a statement-logged INSERT, REPLACE or LOAD DATA writes new
    rows into, or None for any other statement. An unqualified name is in the Query
    event's default schema. `INSERT INTO t SELECT ... FROM outbox` writes t, not the
    outbox."""
    body = sql[_LEADING.match(sql).end() :]  # type: ignore[union-attr]  # matches the empty string
    for pattern in (_INSERT_INTO, _LOAD_INTO):
        m = pattern.match(body)
        if m is not None:
            if m.group("b") is not None:
                return _ident(m.group("a")), _ident(m.group("b"))
            return default_schema, _ident(m.group("a"))
    return None


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


# ------------------------------------------------------------------------- planning


def connect_mysql(settings: Mapping[str, Any]) -> Any:
    from connectors.mysql.client import connect

    try:
        return connect({"connect_timeout": 10, **settings})  # TLS as the relay's config says
    except Exception as exc:
        raise RuntimeError(f"cdc_binlog: cannot connect to {where(settings)}: {scrub(str(exc), settings)}") from None


def plan_binlog(
    settings: Mapping[str, Any],
    start_file: str | None = None,
    end_position: str | None = None,
    server_id_base: int | None = None,
) -> dict[str, Any]:
    """A snapshot of what to read: the binlog files on the server and, for each, the
    byte range `[start, end)`; the end of the newest file is the server's current
    position (SHOW MASTER STATUS) unless `end_position` says otherwise."""
    conn = connect_mysql(settings)
    try:
        with conn.cursor() as cur:
            status = binlog_end(cur)
            if not status:
                raise RuntimeError(f"cdc_binlog: binary logging is off on {where(settings)}: start it with --log-bin")
            current = BinlogPosition(status[0], status[1])
            cur.execute("SHOW BINARY LOGS")
            logs = [(r[0], int(r[1])) for r in cur.fetchall()]
            cur.execute("SELECT @@server_id")
            server_id = int(cur.fetchone()[0])
            gtid_pos = None
            try:
                cur.execute("SELECT @@gtid_binlog_pos")
                gtid_pos = cur.fetchone()[0]
            except Exception:
                try:
                    cur.execute("SELECT @@gtid_executed")
                    gtid_pos = cur.fetchone()[0]
                except Exception:
                    gtid_pos = None
    finally:
        conn.close()
    end = BinlogPosition.parse(end_position) if end_position else current
    if end > current:
        end = current
    oldest = logs[0][0] if logs else current.file
    start_seq = file_sequence(start_file)[1] if start_file else None
    files = []
    for name, size in sorted(logs, key=lambda item: file_sequence(item[0])[1]):
        seq = file_sequence(name)[1]
        if start_seq is not None and seq < start_seq:
            continue
        if seq > end.sequence:
            continue
        stop = end.pos if seq == end.sequence else size
        files.append({"file": name, "start": 4, "end": stop})
    if server_id_base is None:
        server_id_base = random.randint(1 << 30, (1 << 31) - 100_000)
    first = files[0]["file"] if files else end.file
    return {
        "server_id": server_id,
        "oldest_file": oldest,
        "range_start": {"file": first, "pos": 4},
        "range_end": {"file": end.file, "pos": end.pos},
        "gtid_binlog_pos": gtid_pos,
        "server_id_base": server_id_base,
        "files": files,
    }


# SHOW BINLOG EVENTS' names (libs/mysql/binlog/event/binlog_event.cpp `event_type_to_string`):
# MySQL 8.4 names a tagged GTID event (type 42) "Gtid_tagged_log_event".
_CUT_EVENTS = ("Gtid", "Anonymous_Gtid", "Gtid_tagged_log_event")


def transaction_starts(
    settings: Mapping[str, Any], file: str, start: int, end: int, until: int | None = None
) -> list[int]:
    """Positions in `(start, end)` of `file` where a transaction begins (its GTID event;
    without GTIDs its BEGIN), from `SHOW BINLOG EVENTS` (the server reads the file; the
    rows are streamed, not buffered). With `until`, the scan stops at the first
    transaction start at or after it."""
    import pymysql.cursors

    conn = connect_mysql({**settings, "cursorclass": pymysql.cursors.SSCursor})
    cuts: list[int] = []
    try:
        cur = conn.cursor()
        cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, start))
        prev = None
        for row in cur:
            pos, kind = int(row[1]), row[2]
            if pos >= end:
                break
            if pos > start and (
                kind in _CUT_EVENTS
                or (kind == "Query" and str(row[5]).strip().upper() == "BEGIN" and prev not in _CUT_EVENTS)
            ):
                cuts.append(pos)
                if until is not None and pos >= until:
                    break
            prev = kind
    finally:
        # Close without draining the rest of the listing: tell PyMySQL's unbuffered
        # result it is done, or its cleanup would try to read from the closed socket.
        result = getattr(cur, "_result", None) if "cur" in locals() else None
        if result is not None:
            result.unbuffered_active = False
            cur._result = None
        conn.close()
    return cuts


def split_ranges(settings: Mapping[str, Any], plan: Mapping[str, Any], split_bytes: int) -> dict[str, Any]:
    """The plan with `ranges`: each file's `[start, end)` cut at transaction starts into
    ceil(size / split_bytes) pieces of about equal size (more Spark tasks than files:
    better balance, and more cores finish sooner). A piece always starts at a
    transaction's first event, so the verifier's assembly of every piece sees whole
    transactions."""
    ranges = []
    for f in plan["files"]:
        start, end = int(f["start"]), int(f["end"])
        pieces = -(-(end - start) // split_bytes) if split_bytes > 0 else 1
        if pieces <= 1:
            ranges.append({"file": f["file"], "start": start, "end": end})
            continue
        targets = [start + (end - start) * i // pieces for i in range(1, pieces)]
        lo = start
        for pos in transaction_starts(settings, f["file"], start, end, until=targets[-1]):
            if targets and pos >= targets[0]:
                ranges.append({"file": f["file"], "start": lo, "end": pos})
                lo = pos
                while targets and targets[0] <= pos:
                    targets.pop(0)
        ranges.append({"file": f["file"], "start": lo, "end": end})
    return {**plan, "ranges": ranges}


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
) -> Iterator[CommittedTx]:
    """The committed transactions (with their outbox rows) of one binlog file, from
    `start` up to (not past) `end`; and the XA prepare and outcome groups (`xa` set)."""
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
    table_maps = TableMapRewriter(wanted, columns)
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
                tx = _query(asm, query, schema, event_start, event_end, event.timestamp, packet.server_id, wanted)
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


def _query(asm: TxAssembler, query: str, schema: str, start: int, end: int, timestamp: int, server_id: int,
           wanted: Any) -> CommittedTx | None:  # fmt: skip
    """A Query event's text through the assembly (both readers)."""
    kind, name = classify_query(query)
    if kind == "begin":
        asm.begin(start, server_id)
    elif kind == "commit":
        return asm.commit(end, timestamp)
    elif kind == "rollback":
        asm.rollback()
    elif kind == "savepoint":
        asm.savepoint(name or "")
    elif kind == "rollback_to":
        asm.rollback_to(name or "", start)
    elif kind == "xa_commit":
        return asm.xa_outcome(XA_COMMITTED, name or "", start, end, timestamp, server_id)
    elif kind == "xa_rollback":
        return asm.xa_outcome(XA_ROLLED_BACK, name or "", start, end, timestamp, server_id)
    elif kind == "xa_commit_one_phase":
        return asm.commit(end, timestamp)
    elif kind == "xa_end":
        pass
    else:
        asm.statement(schema, query, start, wanted)
    return None


def read_binlog_file_fast(
    settings: Mapping[str, Any],
    file: str,
    start: int,
    end: int,
    server_id: int,
    tables: Sequence[OutboxTable],
    on_anomaly: Any = None,
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
                    tx = _query(asm, ev.sql, ev.schema, event_start, event_end, ev.timestamp, sid, wanted)
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
BINLOG_READERS = ("default", "fast")


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


def _reader_of(options: Mapping[str, str]) -> Any:
    name = (options.get("binlog_reader") or "default").strip().lower()
    if name not in BINLOG_READERS:
        raise ValueError(f"cdc_binlog: option 'binlog_reader' must be one of {BINLOG_READERS}, got {name!r}")
    return read_binlog_file_fast if name == "fast" else read_binlog_file


def iter_binlog_batches(
    options: Mapping[str, str], part: Mapping[str, Any], batch_rows: int = BATCH_ROWS
) -> Iterator[Any]:
    """The event rows of one planned file range as Arrow record batches (BINLOG_FIELDS),
    anomaly rows last."""
    settings = mysql_settings_from_options(options)
    tables = tables_from_json(options.get("tables"))
    mapper = EventMapper(tables, opt_json(options, "topic_allowlist", []) or [])
    source = options.get("source") or ""
    if not source:
        raise ValueError("cdc_binlog: option 'source' (the relay's source name) is required")
    read = _reader_of(options)
    anomalies: list[str] = []
    cols = EventColumns(source, mapper)
    file = part["file"]
    for tx in read(settings, file, part["start"], part["end"], part["server_id"], tables, anomalies.append):
        cols.add_tx(file, tx)
        if cols.n >= batch_rows:
            yield cols.take()
    for text in anomalies:
        cols.add_row(anomaly_row(source, file, text))
    if cols.n:
        yield cols.take()


def anomaly_row(source: str, file: str, text: str) -> dict[str, Any]:
    """Something the verifier's transaction assembly could not make sense of, carried in
    the event stream as a row without identity (`ikey` NULL, `row` -1, text in
    `dlq_error`): the verify job lists these in its report instead of losing them."""
    row: dict[str, Any] = {name: None for name, _ in BINLOG_FIELDS}
    row.update(source=source, file=file, file_seq=file_sequence(file)[1], row=-1, dlq_error=text, kind=KIND_ANOMALY)
    return row


# ----------------------------------------------------------------------- data source


class BinlogReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)

    def _plan(self) -> dict[str, Any]:
        plan = opt_json(self.options, "plan")
        if plan is None:
            plan = plan_binlog(
                mysql_settings_from_options(self.options),
                self.options.get("start_file") or None,
                self.options.get("end_position") or None,
                opt_int(self.options, "server_id_base"),
            )
        return plan

    def partitions(self) -> Sequence[InputPartition]:
        plan = self._plan()
        split = opt_int(self.options, "split_bytes")
        if split and not plan.get("ranges"):
            plan = split_ranges(mysql_settings_from_options(self.options), plan, split)
        base = int(plan["server_id_base"])
        parts = [
            InputPartition({"file": f["file"], "start": f["start"], "end": f["end"], "server_id": base + i})
            for i, f in enumerate(plan.get("ranges") or plan["files"])
            if f["end"] > f["start"]
        ]
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        part = partition.value
        if part is None:
            return
        yield from iter_binlog_batches(self.options, part)


class BinlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_binlog"

    def schema(self) -> str:
        return BINLOG_SCHEMA

    def reader(self, schema: Any) -> BinlogReader:
        return BinlogReader(self.options)
