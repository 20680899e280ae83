"""COM_QUERY: the statements the relay, `cdc check`, the lease, `cdc locate` / `repair`,
the verifier, python-mysql-replication and PyMySQL send, answered as MySQL 8.4 / 9.x
answers them (column names and values as the server's own; reference manual, "SHOW
Statements", "INFORMATION_SCHEMA Tables", "Locking Functions", "XA Transaction SQL
Statements"). Anything else gets a MySQL error naming the statement, and is logged
(`unknown statement: ...`) so that a test sees what the lab does not know.

Errors (share/messages_to_clients.txt): 1064 ER_PARSE_ERROR, 1146 ER_NO_SUCH_TABLE,
1193 ER_UNKNOWN_SYSTEM_VARIABLE, 1094 ER_NO_SUCH_THREAD, 1220 ER_ERROR_WHEN_EXECUTING_COMMAND,
1227 ER_SPECIFIC_ACCESS_DENIED_ERROR, 1305 ER_SP_DOES_NOT_EXIST, 1049 ER_BAD_DB_ERROR.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from testbed.mysql_lab import information_schema as i_s
from testbed.mysql_lab.binlog_dir import HEADER_LEN, BinlogDir, EventHeader
from testbed.mysql_lab.binlog_event_info import EVENT_NAMES, event_info
from testbed.mysql_lab.locks import UserLocks
from testbed.mysql_lab.protocol import Column, MysqlError
from testbed.mysql_lab.sessions import Session
from testbed.mysql_lab.sql_text import Parser, SqlSyntaxError, like_regex, parse_error, tokenize
from testbed.mysql_lab.variables import BOOLEAN_VARIABLES, SESSION_ONLY, global_variables, server_version, version_tuple

log = logging.getLogger("testbed.mysql_lab")

ER_NO_SUCH_TABLE = 1146
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_NO_SUCH_THREAD = 1094
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_SP_DOES_NOT_EXIST = 1305
ER_BAD_DB = 1049
ER_WRONG_ARGUMENTS = 1210


@dataclass
class Result:
    columns: list[Column]
    rows: list[tuple[Any, ...]]


@dataclass
class Done:
    """An OK packet."""

    affected: int = 0


def version_of(lab: Lab) -> str:
    return server_version(lab.dir, lab.default_version)


def variables_of(lab: Lab) -> dict[str, Any]:
    return global_variables(lab.dir, lab.default_version)


class Lab(Protocol):
    """What the statements need of the server."""

    dir: BinlogDir
    locks: UserLocks
    started: float
    default_version: str

    def sessions(self) -> list[Session]: ...

    def kill(self, conn_id: int, query_only: bool) -> bool: ...


def _text(value: Any) -> str:
    return str(value) if value is not None else ""


# -- expressions ------------------------------------------------------------------------


class _Evaluator:
    """Values of the scalar expressions clients select: literals, variables, the functions
    they call. `fn_*` methods name MySQL functions."""

    def __init__(self, lab: Lab, session: Session):
        self.lab = lab
        self.session = session

    def value(self, p: Parser) -> Any:
        tok = p.next()
        if tok.is_op("-"):
            v = self.value(p)
            return -v if isinstance(v, (int, float)) else v
        if tok.kind == "str":
            return tok.value
        if tok.kind == "num":
            return float(tok.value) if any(c in tok.value for c in ".eE") else int(tok.value)
        if tok.kind == "sysvar":
            return self.system_variable(tok.value)
        if tok.kind == "uvar":
            return self.session.user_var(tok.value[1:].strip("'`"))
        if tok.is_word("NULL"):
            return None
        if tok.is_word("TRUE"):
            return 1
        if tok.is_word("FALSE"):
            return 0
        if tok.is_op("("):
            v = self.value(p)
            if not p.accept_op(")"):
                raise parse_error(p.rest())
            return v
        if tok.kind == "id" and p.accept_op("("):
            args = []
            if not p.accept_op(")"):
                while True:
                    args.append(self.value(p))
                    if p.accept_op(")"):
                        break
                    if not p.accept_op(","):
                        raise parse_error(p.rest())
            fn = getattr(self, "fn_" + tok.value.lower(), None)
            if fn is None:
                raise MysqlError(ER_SP_DOES_NOT_EXIST, "42000", f"FUNCTION {tok.value} does not exist")
            return fn(*args)
        if tok.kind == "id" and tok.value.upper() in ("CURRENT_USER", "CURRENT_TIMESTAMP", "NOW"):
            return getattr(self, "fn_" + tok.value.lower())()
        raise parse_error(p.sql[tok.start :])

    def system_variable(self, text: str) -> Any:
        name = text[2:].lower()
        scope = "session"
        for prefix in ("global.", "session.", "local."):
            if name.startswith(prefix):
                scope, name = prefix[:-1], name[len(prefix) :]
        values = variables_of(self.lab)
        if scope != "global" and name in self.session.session_vars:
            return self.session.session_vars[name]
        if name == "port":
            return self.lab_port()
        if name in values:
            value = values[name]
            # Boolean variables select as 1 / 0 (SHOW VARIABLES prints them ON / OFF).
            if name in BOOLEAN_VARIABLES and str(value).upper() in ("ON", "OFF"):
                return 1 if str(value).upper() == "ON" else 0
            return value
        raise MysqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")

    def lab_port(self) -> int:
        return int(getattr(self.lab, "port", 3306))

    # functions (reference manual, "Information Functions", "Locking Functions")
    def fn_version(self) -> str:
        return version_of(self.lab)

    def fn_connection_id(self) -> int:
        return self.session.id

    def fn_unix_timestamp(self, *args: Any) -> int:
        return int(time.time())

    def fn_now(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())

    fn_current_timestamp = fn_now

    def fn_current_user(self) -> str:
        return f"{self.session.user}@%"

    def fn_user(self) -> str:
        return f"{self.session.user}@{self.session.host}"

    fn_session_user = fn_system_user = fn_user

    def fn_database(self) -> str | None:
        return self.session.db

    fn_schema = fn_database

    def fn_uuid(self) -> str:
        return str(uuidlib.uuid4())

    def fn_get_lock(self, name: Any, timeout: Any) -> int | None:
        if name is None or name == "":
            raise MysqlError(ER_WRONG_ARGUMENTS, "HY000", "Incorrect user-level lock name ''.")
        return self.lab.locks.get(str(name), float(timeout), self.session.id, self.session.stopped)

    def fn_release_lock(self, name: Any) -> int | None:
        return self.lab.locks.release(str(name), self.session.id)

    def fn_is_used_lock(self, name: Any) -> int | None:
        return self.lab.locks.holder(str(name))

    def fn_is_free_lock(self, name: Any) -> int:
        return 1 if self.lab.locks.holder(str(name)) is None else 0

    def fn_release_all_locks(self) -> int:
        self.lab.locks.release_all(self.session.id)
        return 0

    def fn_sleep(self, seconds: Any) -> int:
        end = time.monotonic() + float(seconds)
        while time.monotonic() < end and not self.session.stopped():
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return 1 if self.session.stopped() else 0


def _column_for(name: str, values: Sequence[Any], binary: bool = False) -> Column:
    integer = any(isinstance(v, int) and not isinstance(v, bool) for v in values) and all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values
    )
    return Column(name, integer=integer, binary=binary)


def _one_of(wanted: set[str]) -> Callable[[Any], bool]:
    """`col = x` / `col IN (...)`, compared as the case-insensitive collations of the names do."""
    return lambda v: v is not None and str(v).lower() in wanted


def _like(pattern: str) -> Callable[[Any], bool]:
    rx = like_regex(pattern)
    return lambda v: v is not None and bool(rx.match(str(v)))


# -- the statements ---------------------------------------------------------------------


class Statements:
    """Answers one session's statements."""

    def __init__(self, lab: Lab, session: Session):
        self.lab = lab
        self.session = session
        self.ev = _Evaluator(lab, session)

    def answer(self, sql: str) -> Result | Done:
        try:
            tokens = tokenize(sql)
        except SqlSyntaxError as exc:
            raise parse_error(str(exc)) from None
        if not tokens:
            raise MysqlError(1065, "42000", "Query was empty")
        p = Parser(tokens, sql)
        first = tokens[0].value.upper() if tokens[0].kind == "id" else ""
        handler: Callable[[Parser], Result | Done] | None = getattr(self, "stmt_" + first.lower(), None)
        if handler is None:
            return self.unknown(sql)
        p.next()
        return handler(p)

    def unknown(self, sql: str) -> NoReturn:
        log.warning("unknown statement: %s", sql)
        raise parse_error(sql)

    def _version(self) -> tuple[int, int, int]:
        return version_tuple(version_of(self.lab))

    # -- transactions and sessions -------------------------------------------------------

    def stmt_begin(self, p: Parser) -> Done:
        return Done()

    stmt_commit = stmt_rollback = stmt_begin

    def stmt_start(self, p: Parser) -> Done:
        p.expect_word("TRANSACTION")
        return Done()

    def stmt_use(self, p: Parser) -> Done:
        db = p.name()
        self.use(db)
        return Done()

    def use(self, db: str) -> None:
        known = {"information_schema", "mysql", "performance_schema", "sys", *i_s.schemas(self.lab.dir.state())}
        if db.lower() not in {k.lower() for k in known}:
            raise MysqlError(ER_BAD_DB, "42000", f"Unknown database '{db}'")
        self.session.db = db

    def stmt_kill(self, p: Parser) -> Done:
        query_only = p.accept_word("QUERY")
        p.accept_word("CONNECTION")
        tok = p.next()
        if tok.kind != "num":
            raise parse_error(p.sql[tok.start :])
        target = int(tok.value)
        if not self.lab.kill(target, query_only):
            raise MysqlError(ER_NO_SUCH_THREAD, "HY000", f"Unknown thread id: {target}")
        return Done()

    def stmt_set(self, p: Parser) -> Done:
        if p.accept_word("NAMES"):
            p.next()
            if p.accept_word("COLLATE"):
                p.next()
            return Done()
        if p.accept_word("CHARACTER"):
            p.expect_word("SET")
            p.next()
            return Done()
        if p.accept_word("TRANSACTION"):
            return Done()
        while True:
            scope = "session"
            if p.accept_word("GLOBAL", "PERSIST", "PERSIST_ONLY"):
                scope = "global"
            elif p.accept_word("SESSION", "LOCAL"):
                scope = "session"
            tok = p.next()
            if tok.kind == "uvar":
                if not (p.accept_op("=") or p.accept_op(":=")):
                    raise parse_error(p.rest())
                self.session.user_vars[tok.value[1:].strip("'`").lower()] = self.ev.value(p)
            else:
                if tok.kind == "sysvar":
                    name = tok.value[2:].lower()
                    for prefix in ("global.", "session.", "local."):
                        if name.startswith(prefix):
                            scope, name = prefix[:-1], name[len(prefix) :]
                elif tok.kind in ("id", "bq"):
                    name = tok.value.lower()
                else:
                    raise parse_error(p.sql[tok.start :])
                if not (p.accept_op("=") or p.accept_op(":=")):
                    raise parse_error(p.rest())
                value = p.next().value if p.peek_kind() == "id" else self.ev.value(p)
                if scope == "global":
                    raise MysqlError(
                        ER_SPECIFIC_ACCESS_DENIED,
                        "42000",
                        "Access denied; you need (at least one of) the SUPER or SYSTEM_VARIABLES_ADMIN "
                        "privilege(s) for this operation",
                    )
                if name not in SESSION_ONLY and name not in variables_of(self.lab):
                    raise MysqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
                self.session.session_vars[name] = value
            if not p.accept_op(","):
                break
        if not p.done():
            raise parse_error(p.rest())
        return Done()

    # -- SELECT --------------------------------------------------------------------------

    def stmt_select(self, p: Parser) -> Result:
        distinct = p.accept_word("DISTINCT")
        items: list[tuple[int, int, str | None]] = []  # token span and alias
        start = p.i
        depth = 0
        while not p.done():
            tok = p.peek()
            assert tok is not None
            if depth == 0 and (tok.is_word("FROM", "WHERE", "ORDER", "LIMIT") or tok.is_op(",")):
                if tok.is_op(","):
                    items.append((start, p.i, None))
                    p.next()
                    start = p.i
                    continue
                break
            if tok.is_op("("):
                depth += 1
            elif tok.is_op(")"):
                depth -= 1
            p.next()
        items.append((start, p.i, None))
        if p.accept_word("FROM"):
            return self._select_from(p, items, distinct)
        row = []
        names = []
        for a, b, _ in items:
            sub = Parser(p.toks[a:b], p.sql)
            value = self.ev.value(sub)
            alias = None
            if sub.accept_word("AS") or sub.peek_kind() in ("id", "bq"):
                alias = sub.name()
            if not sub.done():
                raise parse_error(sub.rest())
            end_tok = p.toks[b - 1] if alias is None else p.toks[a]
            names.append(alias or p.sql[p.toks[a].start : end_tok.end])
            row.append(value)
        limit, _offset = self._limit(p)  # `SELECT @@version_comment LIMIT 1` (the mysql client)
        if not p.done():
            raise parse_error(p.rest())
        rows = [tuple(row)] if limit != 0 else []
        return Result([_column_for(n, [v]) for n, v in zip(names, row, strict=True)], rows)

    def _select_from(self, p: Parser, items: list[tuple[int, int, str | None]], distinct: bool) -> Result:
        first = p.name()
        table = p.name() if p.accept_op(".") else None
        schema = first if table is not None else self.session.db
        table = table if table is not None else first
        where = self._where(p)
        order: list[tuple[str, bool]] = []
        if p.accept_word("ORDER"):
            p.expect_word("BY")
            while True:
                col = p.name()
                desc = p.accept_word("DESC")
                p.accept_word("ASC")
                order.append((col, desc))
                if not p.accept_op(","):
                    break
        limit, offset = self._limit(p)
        if not p.done():
            raise parse_error(p.rest())
        if (schema or "").lower() != "information_schema":
            return self._select_user_table(p, schema, table, items, limit)
        rows = self._virtual_table(table.upper())
        for col, test in where:
            rows = [r for r in rows if test(r.get(col.upper()))]
        for col, desc in reversed(order):
            rows.sort(key=lambda r: (r.get(col.upper()) is None, r.get(col.upper())), reverse=desc)
        names: list[str] = []
        for a, b, _ in items:
            toks = p.toks[a:b]
            if len(toks) == 1 and toks[0].is_op("*"):
                names += list(rows[0].keys()) if rows else []
            elif (len(toks) == 1 and toks[0].kind in ("id", "bq")) or (len(toks) == 3 and toks[1].is_word("AS")):
                names.append(toks[0].value.upper())
            else:
                return self.unknown(p.sql)
        out = [tuple(r.get(n) for n in names) for r in rows]
        if distinct:
            out = list(dict.fromkeys(out))
        out = out[offset:] if limit is None else out[offset : offset + limit]
        return Result([_column_for(n, [r[i] for r in out]) for i, n in enumerate(names)], out)

    def _virtual_table(self, name: str) -> list[dict[str, Any]]:
        tables: dict[str, Callable[[], list[dict[str, Any]]]] = {
            "COLUMNS": lambda: i_s.columns(self.lab.dir.state()),
            "COLLATIONS": i_s.collations,
            "TABLES": lambda: i_s.tables(self.lab.dir.state()),
            "PROCESSLIST": lambda: i_s.processlist(self.lab.sessions()),
            "USER_PRIVILEGES": lambda: i_s.user_privileges(self.lab.dir.state(), self.session.user),
            "SCHEMATA": lambda: i_s.schemata(self.lab.dir.state()),
        }
        if name not in tables:
            raise MysqlError(ER_NO_SUCH_TABLE, "42S02", f"Table 'information_schema.{name.lower()}' doesn't exist")
        return tables[name]()

    def _select_user_table(
        self, p: Parser, schema: str | None, table: str, items: list[tuple[int, int, str | None]], limit: int | None
    ) -> Result:
        tables = self.lab.dir.state().get("tables") or {}
        if schema is None:
            raise MysqlError(1046, "3D000", "No database selected")
        if f"{schema}.{table}" not in tables:
            raise MysqlError(ER_NO_SUCH_TABLE, "42S02", f"Table '{schema}.{table}' doesn't exist")
        if limit != 0:  # the lab holds no rows: only the existence probe is answerable
            return self.unknown(p.sql)
        names = [p.sql[p.toks[a].start : p.toks[b - 1].end] for a, b, _ in items]
        return Result([Column(n) for n in names], [])

    def _where(self, p: Parser) -> list[tuple[str, Callable[[Any], bool]]]:
        conds: list[tuple[str, Callable[[Any], bool]]] = []
        if not p.accept_word("WHERE"):
            return conds
        while True:
            col = p.name()
            if p.accept_op("="):
                conds.append((col, _one_of({str(self.ev.value(p)).lower()})))
            elif p.accept_word("IN"):
                if not p.accept_op("("):
                    raise parse_error(p.rest())
                wanted = set()
                while True:
                    wanted.add(str(self.ev.value(p)).lower())
                    if p.accept_op(")"):
                        break
                    if not p.accept_op(","):
                        raise parse_error(p.rest())
                conds.append((col, _one_of(wanted)))
            elif p.accept_word("LIKE"):
                conds.append((col, _like(str(self.ev.value(p)))))
            else:
                raise parse_error(p.rest())
            if not p.accept_word("AND"):
                return conds

    def _limit(self, p: Parser) -> tuple[int | None, int]:
        if not p.accept_word("LIMIT"):
            return None, 0
        a = int(p.next().value)
        if p.accept_op(","):
            return int(p.next().value), a
        if p.accept_word("OFFSET"):
            return a, int(p.next().value)
        return a, 0

    # -- SHOW ----------------------------------------------------------------------------

    def stmt_show(self, p: Parser) -> Result:
        v = self._version()
        if p.accept_word("GLOBAL", "SESSION", "LOCAL"):
            global_only = p.toks[p.i - 1].is_word("GLOBAL")
            if p.accept_word("VARIABLES"):
                return self._show_variables(p, global_only)
            if p.accept_word("STATUS"):
                return self._show_status(p)
            raise parse_error(p.rest())
        if p.accept_word("VARIABLES"):
            return self._show_variables(p, False)
        if p.accept_word("STATUS"):
            return self._show_status(p)
        if p.accept_word("BINARY"):
            if p.accept_word("LOGS"):
                return self._show_binary_logs(p)
            if p.accept_word("LOG") and p.accept_word("STATUS") and v >= (8, 2, 0):
                return self._binary_log_status()
            raise parse_error(p.sql[p.toks[1].start :])
        if p.accept_word("MASTER"):
            # MySQL 8.4 removed SHOW MASTER STATUS / LOGS: a syntax error there.
            if v < (8, 4, 0):
                if p.accept_word("STATUS"):
                    return self._binary_log_status()
                if p.accept_word("LOGS"):
                    return self._show_binary_logs(p)
            raise parse_error(p.sql[p.toks[1].start :])
        if p.accept_word("BINLOG"):
            p.expect_word("EVENTS")
            return self._show_binlog_events(p)
        if p.accept_word("REPLICAS") and v >= (8, 0, 22):
            return self._show_replicas()
        if p.accept_word("SLAVE") and v < (8, 4, 0):
            p.expect_word("HOSTS")
            return self._show_replicas(old_names=v < (8, 0, 22))
        if p.accept_word("GRANTS"):
            lines = i_s.grants(self.lab.dir.state(), self.session.user)
            return Result([Column(f"Grants for {self.session.user}@%")], [(line,) for line in lines])
        if p.accept_word("FULL"):
            p.expect_word("PROCESSLIST")
            return self._show_processlist()
        if p.accept_word("PROCESSLIST"):
            return self._show_processlist()
        if p.accept_word("WARNINGS", "ERRORS"):
            return Result([Column("Level"), Column("Code", integer=True), Column("Message")], [])
        if p.accept_word("DATABASES", "SCHEMAS"):
            return Result([Column("Database")], [(r["SCHEMA_NAME"],) for r in i_s.schemata(self.lab.dir.state())])
        return self.unknown(p.sql)

    def _name_filter(self, p: Parser) -> Callable[[str], bool]:
        if p.accept_word("LIKE"):
            rx = like_regex(str(self.ev.value(p)))
            return lambda name: bool(rx.match(name))
        conds = self._where(p)
        if conds:
            return lambda name: all(test(name) for _col, test in conds)
        return lambda name: True

    def _show_variables(self, p: Parser, global_only: bool) -> Result:
        keep = self._name_filter(p)
        if not p.done():
            raise parse_error(p.rest())
        values = variables_of(self.lab)
        values["port"] = self.ev.lab_port()
        if not global_only:
            values.update(self.session.session_vars)
        rows = [(k, _text(v)) for k, v in sorted(values.items()) if keep(k)]
        return Result([Column("Variable_name"), Column("Value")], rows)

    def _show_status(self, p: Parser) -> Result:
        keep = self._name_filter(p)
        status = {
            "Uptime": str(int(time.monotonic() - self.lab.started)),
            "Threads_connected": str(len(self.lab.sessions())),
        }
        rows = [(k, v) for k, v in sorted(status.items()) if keep(k)]
        return Result([Column("Variable_name"), Column("Value")], rows)

    def _logs(self) -> list[tuple[str, int]]:
        return [(name, self.lab.dir.whole_end(name)) for name in self.lab.dir.names()]

    def _show_binary_logs(self, p: Parser) -> Result:
        if variables_of(self.lab).get("log_bin") != "ON":
            raise MysqlError(1381, "HY000", "You are not using binary logging")
        if self._version() < (8, 0, 14):  # the Encrypted column came with binlog encryption (8.0.14)
            return Result([Column("Log_name"), Column("File_size", integer=True)], self._logs())
        return Result(
            [Column("Log_name"), Column("File_size", integer=True), Column("Encrypted")],
            [(name, size, "No") for name, size in self._logs()],
        )

    def _binary_log_status(self) -> Result:
        """SHOW BINARY LOG STATUS (8.2+): File, Position, Binlog_Do_DB, Binlog_Ignore_DB,
        Executed_Gtid_Set; no row when binary logging is off."""
        columns = [
            Column("File"),
            Column("Position", integer=True),
            Column("Binlog_Do_DB"),
            Column("Binlog_Ignore_DB"),
            Column("Executed_Gtid_Set"),
        ]
        logs = self._logs()
        if not logs or variables_of(self.lab).get("log_bin") != "ON":
            return Result(columns, [])
        name, size = logs[-1]
        return Result(columns, [(name, size, "", "", str(variables_of(self.lab).get("gtid_executed") or ""))])

    def _show_replicas(self, old_names: bool = False) -> Result:
        """SHOW REPLICAS: Server_Id, Host, Port, Source_Id, Replica_UUID, one row per
        registered dump session (sql/rpl_source.cc show_replicas). `old_names`: SHOW SLAVE
        HOSTS before 8.0.22 (5.7's sql/rpl_master.cc show_slave_hosts): Server_id, Host,
        Port, Master_id, Slave_UUID."""
        rows = []
        for s in self.lab.sessions():
            r = s.replica
            if r is not None:
                rows.append((r.server_id, r.host, r.port, r.source_id, s.replica_uuid))
        if old_names:
            names = ("Server_id", "Host", "Port", "Master_id", "Slave_UUID")
        else:
            names = ("Server_Id", "Host", "Port", "Source_Id", "Replica_UUID")
        return Result(
            [
                Column(names[0], integer=True),
                Column(names[1]),
                Column(names[2], integer=True),
                Column(names[3], integer=True),
                Column(names[4]),
            ],
            rows,
        )

    def _show_processlist(self) -> Result:
        rows = [
            (r["ID"], r["USER"], r["HOST"], r["DB"], r["COMMAND"], r["TIME"], r["STATE"], r["INFO"])
            for r in i_s.processlist(self.lab.sessions())
        ]
        cols = [Column("Id", integer=True), Column("User"), Column("Host"), Column("db"), Column("Command")]
        cols += [Column("Time", integer=True), Column("State"), Column("Info")]
        return Result(cols, rows)

    def _show_binlog_events(self, p: Parser) -> Result:
        """SHOW BINLOG EVENTS [IN 'file'] [FROM pos] [LIMIT [offset,] count]: Log_name,
        Pos, Event_type, Server_id, End_log_pos, Info (sql/rpl_source.cc show_binlog_events,
        Log_event::pack_info per event)."""
        names = self.lab.dir.names()
        name = names[0] if names else ""
        if p.accept_word("IN"):
            name = str(self.ev.value(p))
        start = 4
        if p.accept_word("FROM"):
            start = int(self.ev.value(p))
        limit, offset = self._limit(p)
        if not p.done():
            raise parse_error(p.rest())
        columns = [
            Column("Log_name"),
            Column("Pos", integer=True),
            Column("Event_type"),
            Column("Server_id", integer=True),
            Column("End_log_pos", integer=True),
            Column("Info"),
        ]
        if name not in names:
            raise MysqlError(
                ER_ERROR_WHEN_EXECUTING_COMMAND,
                "HY000",
                "Error when executing command SHOW BINLOG EVENTS: Could not find target log",
            )
        events = self.lab.dir.events(name, 4)
        starts = {at for at, _ in events}
        if start != 4 and start not in starts and start != self.lab.dir.whole_end(name):
            raise MysqlError(
                ER_ERROR_WHEN_EXECUTING_COMMAND,
                "HY000",
                "Error when executing command SHOW BINLOG EVENTS: Wrong offset or I/O error",
            )
        checksum = bool(events) and events[0][1][4] == 15 and events[0][1][-5] == 1
        _prev, txs = self.lab.dir.sidecar(name)
        gtid_at = {t.start: t.gtid for t in txs}
        rows = []
        for at, raw in events:
            if at < start:
                continue
            h = EventHeader.parse(raw)
            body = raw[HEADER_LEN : len(raw) - (4 if checksum and h.type != 15 else 0)]
            if h.type == 15:
                body = raw[HEADER_LEN:-5] if checksum else raw[HEADER_LEN:]
            info = event_info(h.type, body, gtid_at.get(at))
            rows.append((name, at, EVENT_NAMES.get(h.type, f"Unknown({h.type})"), h.server_id, h.log_pos, info))
        rows = rows[offset:] if limit is None else rows[offset : offset + limit]
        return Result(columns, rows)

    # -- XA ------------------------------------------------------------------------------

    def stmt_xa(self, p: Parser) -> Result:
        """XA RECOVER [CONVERT XID]: formatID, gtrid_length, bqual_length, data (gtrid then
        bqual, raw; CONVERT XID shows it as hex)."""
        p.expect_word("RECOVER")
        convert = p.accept_word("CONVERT")
        if convert:
            p.expect_word("XID")
        if not p.done():
            raise parse_error(p.rest())
        rows = []
        for xa in self.lab.dir.state().get("xa_prepared") or []:
            gtrid = bytes.fromhex(str(xa.get("gtrid", "")))
            bqual = bytes.fromhex(str(xa.get("bqual", "")))
            data: Any = "0x" + (gtrid + bqual).hex().upper() if convert else gtrid + bqual
            rows.append((int(xa.get("format_id", 1)), len(gtrid), len(bqual), data))
        return Result(
            [
                Column("formatID", integer=True),
                Column("gtrid_length", integer=True),
                Column("bqual_length", integer=True),
                Column("data", binary=not convert),
            ],
            rows,
        )
