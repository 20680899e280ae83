"""The verifier's own transaction assembly of a binlog file's events (both readers feed
it): buffer outbox rows until XID or `COMMIT`; drop them on `ROLLBACK`; cut back to the
savepoint on `ROLLBACK TO`. It shares nothing with the relay's
`cdc/assembly/transaction.py` / `cdc/source_events.py` /
`cdc/recovery.py`, so a bug there cannot hide itself. XA groups, statement-logged
inserts and REPLACE as delete + insert: see `spark_jobs/mysql/binlog_source.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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


def assemble_query(asm: TxAssembler, query: str, schema: str, start: int, end: int, timestamp: int, server_id: int,
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
