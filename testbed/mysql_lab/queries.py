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
import struct
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from testbed.mysql_lab.binlog_dir import HEADER_LEN, BinlogDir, EventHeader
from testbed.mysql_lab.gtid_sets import GtidSet, GtidSetError
from testbed.mysql_lab.locks import UserLocks
from testbed.mysql_lab.protocol import Column, MysqlError
from testbed.mysql_lab.sessions import Session
from testbed.mysql_lab.sql_text import SqlSyntaxError, Token, like_regex, tokenize

log = logging.getLogger("testbed.mysql_lab")

DEFAULT_VERSION = "8.4.3"

# MySQL 8.4's defaults for what the clients ask; lab_state.json's "variables" override.
GLOBAL_DEFAULTS: dict[str, Any] = {
    "autocommit": "ON",
    "binlog_checksum": "CRC32",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "MINIMAL",
    "binlog_row_value_options": "",
    "binlog_transaction_compression": "OFF",
    "character_set_client": "utf8mb4",
    "character_set_connection": "utf8mb4",
    "character_set_results": "utf8mb4",
    "character_set_server": "utf8mb4",
    "collation_connection": "utf8mb4_0900_ai_ci",
    "collation_server": "utf8mb4_0900_ai_ci",
    "enforce_gtid_consistency": "OFF",
    "gtid_mode": "OFF",
    "hostname": "mysql-lab",
    "interactive_timeout": 28800,
    "log_bin": "ON",
    "log_bin_basename": "",
    "log_replica_updates": "ON",
    "lower_case_table_names": 0,
    "max_allowed_packet": 67108864,
    "net_read_timeout": 30,
    "net_write_timeout": 60,
    "sql_mode": "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
    "system_time_zone": "UTC",
    "time_zone": "SYSTEM",
    "transaction_isolation": "REPEATABLE-READ",
    "version_comment": "MySQL Community Server - GPL",
    "version_compile_os": "Linux",
    "wait_timeout": 28800,
}
BOOLEAN_VARIABLES = {"autocommit", "log_bin", "binlog_transaction_compression", "log_replica_updates", "sql_log_bin"}
SESSION_ONLY = {"autocommit", "sql_mode", "time_zone", "wait_timeout", "interactive_timeout", "net_read_timeout",
                "net_write_timeout", "character_set_client", "character_set_connection", "character_set_results",
                "collation_connection", "transaction_isolation", "sql_log_bin", "binlog_format",
                "max_execution_time", "lock_wait_timeout", "innodb_lock_wait_timeout"}  # fmt: skip

# SHOW GRANTS of the lab's account: what the relay needs on MySQL 8 (REPLICATION SLAVE for
# the dump, REPLICATION CLIENT for SHOW BINARY LOGS, XA_RECOVER_ADMIN for XA RECOVER).
DEFAULT_GRANTS = (
    "GRANT SELECT, RELOAD, PROCESS, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `{user}`@`%`",
    "GRANT XA_RECOVER_ADMIN ON *.* TO `{user}`@`%`",
)

# Event type names of SHOW BINLOG EVENTS (libs/mysql/binlog/event/binlog_event.cpp,
# get_event_type_str).
EVENT_NAMES = {
    1: "Start_v3", 2: "Query", 3: "Stop", 4: "Rotate", 5: "Intvar", 13: "RAND", 14: "User var",
    15: "Format_desc", 16: "Xid", 17: "Begin_load_query", 18: "Execute_load_query", 19: "Table_map",
    23: "Write_rows_v1", 24: "Update_rows_v1", 25: "Delete_rows_v1", 26: "Incident", 27: "Heartbeat",
    28: "Ignorable", 29: "Rows_query", 30: "Write_rows", 31: "Update_rows", 32: "Delete_rows", 33: "Gtid",
    34: "Anonymous_Gtid", 35: "Previous_gtids", 36: "Transaction_context", 37: "View_change",
    38: "XA_prepare", 39: "Update_rows_partial", 40: "Transaction_payload", 41: "Heartbeat_v2",
    42: "Gtid_tagged",
}  # fmt: skip

ER_PARSE_ERROR = 1064
ER_NO_SUCH_TABLE = 1146
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_NO_SUCH_THREAD = 1094
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_SP_DOES_NOT_EXIST = 1305
ER_BAD_DB = 1049
ER_WRONG_ARGUMENTS = 1210


def parse_error(near: str) -> MysqlError:
    return MysqlError(
        ER_PARSE_ERROR,
        "42000",
        "You have an error in your SQL syntax; check the manual that corresponds to your MySQL server "
        f"version for the right syntax to use near '{near[:80]}' at line 1",
    )


@dataclass
class Result:
    columns: list[Column]
    rows: list[tuple[Any, ...]]


@dataclass
class Done:
    """An OK packet."""

    affected: int = 0


class Lab(Protocol):
    """What the statements need of the server."""

    dir: BinlogDir
    locks: UserLocks
    started: float
    default_version: str

    def sessions(self) -> list[Session]: ...

    def kill(self, conn_id: int, query_only: bool) -> bool: ...


def version_of(lab: Lab) -> str:
    return str(lab.dir.state().get("server_version") or lab.default_version)


def version_tuple(version: str) -> tuple[int, int, int]:
    nums = []
    for part in version.split("-")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        nums.append(int(digits or 0))
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def global_variables(lab: Lab) -> dict[str, Any]:
    state = lab.dir.state()
    out = dict(GLOBAL_DEFAULTS)
    out.update({k.lower(): v for k, v in (state.get("variables") or {}).items()})
    server_uuid = state.get("server_uuid") or out.get("server_uuid") or ""
    out.update(
        {
            "version": version_of(lab),
            "server_id": int(state.get("server_id", out.get("server_id", 1))),
            "server_uuid": server_uuid,
            "gtid_executed": state.get("gtid_executed", out.get("gtid_executed", "")),
            "gtid_purged": state.get("gtid_purged", out.get("gtid_purged", "")),
            "log_bin_basename": str(lab.dir.path / "binlog"),
            "log_bin_index": str(lab.dir.path / "binlog.index"),
        }
    )
    return out


def _text(value: Any) -> str:
    return str(value) if value is not None else ""


# -- expressions ------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[Token], sql: str):
        self.toks = tokens
        self.sql = sql
        self.i = 0

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def peek_kind(self) -> str:
        tok = self.peek()
        return tok.kind if tok is not None else ""

    def next(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise parse_error("")
        self.i += 1
        return tok

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def accept_word(self, *words: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_word(*words):
            self.i += 1
            return True
        return False

    def accept_op(self, op: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_op(op):
            self.i += 1
            return True
        return False

    def expect_word(self, *words: str) -> None:
        if not self.accept_word(*words):
            raise parse_error(self.rest())

    def rest(self) -> str:
        tok = self.peek()
        return self.sql[tok.start :] if tok else ""

    def name(self) -> str:
        tok = self.next()
        if tok.kind not in ("id", "bq"):
            raise parse_error(self.sql[tok.start :])
        return tok.value


class _Evaluator:
    """Values of the scalar expressions clients select: literals, variables, the functions
    they call. `fn_*` methods name MySQL functions."""

    def __init__(self, lab: Lab, session: Session):
        self.lab = lab
        self.session = session

    def value(self, p: _Parser) -> Any:
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
        values = global_variables(self.lab)
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


# -- virtual tables ---------------------------------------------------------------------


def _schemas(lab: Lab) -> list[str]:
    tables = lab.dir.state().get("tables") or {}
    return sorted({name.split(".", 1)[0] for name in tables})


def _is_columns(lab: Lab) -> list[dict[str, Any]]:
    rows = []
    for qualified, columns in (lab.dir.state().get("tables") or {}).items():
        schema, _, table = qualified.partition(".")
        for i, c in enumerate(columns, 1):
            rows.append(
                {
                    "TABLE_CATALOG": "def",
                    "TABLE_SCHEMA": schema,
                    "TABLE_NAME": table,
                    "COLUMN_NAME": c.get("name"),
                    "ORDINAL_POSITION": int(c.get("ordinal", i)),
                    "COLUMN_DEFAULT": c.get("default"),
                    "IS_NULLABLE": "YES" if c.get("nullable", True) else "NO",
                    "DATA_TYPE": c.get("data_type") or str(c.get("column_type", "")).split("(")[0],
                    "CHARACTER_SET_NAME": c.get("character_set"),
                    "COLUMN_TYPE": c.get("column_type"),
                    "COLUMN_KEY": c.get("key", ""),
                    "EXTRA": c.get("extra", ""),
                }
            )
    return rows


def _is_tables(lab: Lab) -> list[dict[str, Any]]:
    return [
        {
            "TABLE_CATALOG": "def",
            "TABLE_SCHEMA": q.partition(".")[0],
            "TABLE_NAME": q.partition(".")[2],
            "TABLE_TYPE": "BASE TABLE",
            "ENGINE": "InnoDB",
        }
        for q in (lab.dir.state().get("tables") or {})
    ]


def _is_processlist(lab: Lab) -> list[dict[str, Any]]:
    now = time.monotonic()
    return [
        {
            "ID": s.id,
            "USER": s.user,
            "HOST": f"{s.host}:{s.port}",
            "DB": s.db,
            "COMMAND": s.command,
            "TIME": int(now - s.since),
            "STATE": s.state,
            "INFO": None,
        }
        for s in lab.sessions()
    ]


def _is_user_privileges(lab: Lab, session: Session) -> list[dict[str, Any]]:
    rows = []
    for line in _grants(lab, session):
        head = line[len("GRANT ") : line.index(" ON *.*")]
        for priv in head.split(","):
            rows.append(
                {
                    "GRANTEE": f"'{session.user}'@'%'",
                    "TABLE_CATALOG": "def",
                    "PRIVILEGE_TYPE": priv.strip(),
                    "IS_GRANTABLE": "NO",
                }
            )
    return rows


def _is_schemata(lab: Lab) -> list[dict[str, Any]]:
    return [
        {"CATALOG_NAME": "def", "SCHEMA_NAME": s, "DEFAULT_CHARACTER_SET_NAME": "utf8mb4"}
        for s in ["information_schema", "mysql", "performance_schema", "sys", *_schemas(lab)]
    ]


def _grants(lab: Lab, session: Session) -> list[str]:
    lines = lab.dir.state().get("grants") or DEFAULT_GRANTS
    return [str(line).format(user=session.user) for line in lines]


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
        p = _Parser(tokens, sql)
        first = tokens[0].value.upper() if tokens[0].kind == "id" else ""
        handler: Callable[[_Parser], Result | Done] | None = getattr(self, "stmt_" + first.lower(), None)
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

    def stmt_begin(self, p: _Parser) -> Done:
        return Done()

    stmt_commit = stmt_rollback = stmt_begin

    def stmt_start(self, p: _Parser) -> Done:
        p.expect_word("TRANSACTION")
        return Done()

    def stmt_use(self, p: _Parser) -> Done:
        db = p.name()
        self.use(db)
        return Done()

    def use(self, db: str) -> None:
        known = {"information_schema", "mysql", "performance_schema", "sys", *_schemas(self.lab)}
        if db.lower() not in {k.lower() for k in known}:
            raise MysqlError(ER_BAD_DB, "42000", f"Unknown database '{db}'")
        self.session.db = db

    def stmt_kill(self, p: _Parser) -> Done:
        query_only = p.accept_word("QUERY")
        p.accept_word("CONNECTION")
        tok = p.next()
        if tok.kind != "num":
            raise parse_error(p.sql[tok.start :])
        target = int(tok.value)
        if not self.lab.kill(target, query_only):
            raise MysqlError(ER_NO_SUCH_THREAD, "HY000", f"Unknown thread id: {target}")
        return Done()

    def stmt_set(self, p: _Parser) -> Done:
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
                if name not in SESSION_ONLY and name not in global_variables(self.lab):
                    raise MysqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
                self.session.session_vars[name] = value
            if not p.accept_op(","):
                break
        if not p.done():
            raise parse_error(p.rest())
        return Done()

    # -- SELECT --------------------------------------------------------------------------

    def stmt_select(self, p: _Parser) -> Result:
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
            sub = _Parser(p.toks[a:b], p.sql)
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

    def _select_from(self, p: _Parser, items: list[tuple[int, int, str | None]], distinct: bool) -> Result:
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
            "COLUMNS": lambda: _is_columns(self.lab),
            "TABLES": lambda: _is_tables(self.lab),
            "PROCESSLIST": lambda: _is_processlist(self.lab),
            "USER_PRIVILEGES": lambda: _is_user_privileges(self.lab, self.session),
            "SCHEMATA": lambda: _is_schemata(self.lab),
        }
        if name not in tables:
            raise MysqlError(ER_NO_SUCH_TABLE, "42S02", f"Table 'information_schema.{name.lower()}' doesn't exist")
        return tables[name]()

    def _select_user_table(
        self, p: _Parser, schema: str | None, table: str, items: list[tuple[int, int, str | None]], limit: int | None
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

    def _where(self, p: _Parser) -> list[tuple[str, Callable[[Any], bool]]]:
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

    def _limit(self, p: _Parser) -> tuple[int | None, int]:
        if not p.accept_word("LIMIT"):
            return None, 0
        a = int(p.next().value)
        if p.accept_op(","):
            return int(p.next().value), a
        if p.accept_word("OFFSET"):
            return a, int(p.next().value)
        return a, 0

    # -- SHOW ----------------------------------------------------------------------------

    def stmt_show(self, p: _Parser) -> Result:
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
            return self._show_replicas()
        if p.accept_word("GRANTS"):
            lines = _grants(self.lab, self.session)
            return Result([Column(f"Grants for {self.session.user}@%")], [(line,) for line in lines])
        if p.accept_word("FULL"):
            p.expect_word("PROCESSLIST")
            return self._show_processlist()
        if p.accept_word("PROCESSLIST"):
            return self._show_processlist()
        if p.accept_word("WARNINGS", "ERRORS"):
            return Result([Column("Level"), Column("Code", integer=True), Column("Message")], [])
        if p.accept_word("DATABASES", "SCHEMAS"):
            return Result([Column("Database")], [(r["SCHEMA_NAME"],) for r in _is_schemata(self.lab)])
        return self.unknown(p.sql)

    def _name_filter(self, p: _Parser) -> Callable[[str], bool]:
        if p.accept_word("LIKE"):
            rx = like_regex(str(self.ev.value(p)))
            return lambda name: bool(rx.match(name))
        conds = self._where(p)
        if conds:
            return lambda name: all(test(name) for _col, test in conds)
        return lambda name: True

    def _show_variables(self, p: _Parser, global_only: bool) -> Result:
        keep = self._name_filter(p)
        if not p.done():
            raise parse_error(p.rest())
        values = global_variables(self.lab)
        values["port"] = self.ev.lab_port()
        if not global_only:
            values.update(self.session.session_vars)
        rows = [(k, _text(v)) for k, v in sorted(values.items()) if keep(k)]
        return Result([Column("Variable_name"), Column("Value")], rows)

    def _show_status(self, p: _Parser) -> Result:
        keep = self._name_filter(p)
        status = {
            "Uptime": str(int(time.monotonic() - self.lab.started)),
            "Threads_connected": str(len(self.lab.sessions())),
        }
        rows = [(k, v) for k, v in sorted(status.items()) if keep(k)]
        return Result([Column("Variable_name"), Column("Value")], rows)

    def _logs(self) -> list[tuple[str, int]]:
        return [(name, self.lab.dir.whole_end(name)) for name in self.lab.dir.names()]

    def _show_binary_logs(self, p: _Parser) -> Result:
        if global_variables(self.lab).get("log_bin") != "ON":
            raise MysqlError(1381, "HY000", "You are not using binary logging")
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
        if not logs or global_variables(self.lab).get("log_bin") != "ON":
            return Result(columns, [])
        name, size = logs[-1]
        return Result(columns, [(name, size, "", "", str(global_variables(self.lab).get("gtid_executed") or ""))])

    def _show_replicas(self) -> Result:
        """SHOW REPLICAS: Server_Id, Host, Port, Source_Id, Replica_UUID, one row per
        registered dump session (sql/rpl_source.cc show_replicas)."""
        rows = []
        for s in self.lab.sessions():
            r = s.replica
            if r is not None:
                rows.append((r.server_id, r.host, r.port, r.source_id, s.replica_uuid))
        return Result(
            [
                Column("Server_Id", integer=True),
                Column("Host"),
                Column("Port", integer=True),
                Column("Source_Id", integer=True),
                Column("Replica_UUID"),
            ],
            rows,
        )

    def _show_processlist(self) -> Result:
        rows = [
            (r["ID"], r["USER"], r["HOST"], r["DB"], r["COMMAND"], r["TIME"], r["STATE"], r["INFO"])
            for r in _is_processlist(self.lab)
        ]
        cols = [Column("Id", integer=True), Column("User"), Column("Host"), Column("db"), Column("Command")]
        cols += [Column("Time", integer=True), Column("State"), Column("Info")]
        return Result(cols, rows)

    def _show_binlog_events(self, p: _Parser) -> Result:
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
            info = _event_info(h.type, body, gtid_at.get(at))
            rows.append((name, at, EVENT_NAMES.get(h.type, f"Unknown({h.type})"), h.server_id, h.log_pos, info))
        rows = rows[offset:] if limit is None else rows[offset : offset + limit]
        return Result(columns, rows)

    # -- XA ------------------------------------------------------------------------------

    def stmt_xa(self, p: _Parser) -> Result:
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


def _event_info(kind: int, body: bytes, gtid: str | None) -> str:
    """The Info column of SHOW BINLOG EVENTS for the event kinds the lab's files hold."""
    try:
        if kind == 2:  # Query: thread 4, exec time 4, db length 1, error 2, status length 2
            db_len = body[8]
            status_len = struct.unpack_from("<H", body, 11)[0]
            db_at = 13 + status_len
            db = body[db_at : db_at + db_len].decode("utf-8", "replace")
            query = body[db_at + db_len + 1 :].decode("utf-8", "replace")
            plain = query.strip().upper().split(" ")[0] in ("BEGIN", "COMMIT", "ROLLBACK", "XA", "SAVEPOINT")
            return query if plain or not db else f"use `{db}`; {query}"
        if kind == 16:
            return f"COMMIT /* xid={struct.unpack_from('<Q', body, 0)[0]} */"
        if kind == 4:
            return f"{body[8:].decode('utf-8', 'replace')};pos={struct.unpack_from('<Q', body, 0)[0]}"
        if kind == 15:
            version = body[2:52].split(b"\x00")[0].decode("ascii", "replace")
            return f"Server ver: {version}, Binlog ver: {struct.unpack_from('<H', body, 0)[0]}"
        if kind in (33, 42):
            if gtid and gtid != "-":
                return f"SET @@SESSION.GTID_NEXT= '{gtid}'"
            if kind == 33:
                sid = uuidlib.UUID(bytes=bytes(body[1:17]))
                return f"SET @@SESSION.GTID_NEXT= '{sid}:{struct.unpack_from('<Q', body, 17)[0]}'"
            return ""
        if kind == 34:
            return "SET @@SESSION.GTID_NEXT= 'ANONYMOUS'"
        if kind == 35:
            return str(GtidSet.decode(body)).replace("\n", "")
        if kind == 19:
            table_id = int.from_bytes(body[0:6], "little")
            n = body[8]
            schema = body[9 : 9 + n].decode("utf-8", "replace")
            m = body[10 + n]
            table = body[11 + n : 11 + n + m].decode("utf-8", "replace")
            return f"table_id: {table_id} ({schema}.{table})"
        if kind in (23, 24, 25, 30, 31, 32, 39):
            table_id = int.from_bytes(body[0:6], "little")
            flags = struct.unpack_from("<H", body, 6)[0]
            return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & 1 else "")
    except (IndexError, struct.error, ValueError, GtidSetError):
        return ""
    return ""
