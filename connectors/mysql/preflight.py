"""Preflight: is the server set up for the relay? Run at start and alone as `cdc check`.

Each check yields one line; a failing one names the fix. A warning (`warn`) passes but
names a risk the operator should know: an account that can log an outbox write as a
statement, an XA transaction prepared and undecided (the relay holds its checkpoint
before it and publishes nothing of it until it is decided). Where a privilege can be
tried rather than parsed out of SHOW GRANTS, it is tried (a SELECT on each outbox table,
SHOW BINARY LOGS); REPLICATION SLAVE can only be read from the grants.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pymysql

from cdc.checkpoint import Checkpoint
from cdc.config import Config
from cdc.errors import PositionError
from cdc.ports import StartAt
from cdc.position import BinlogPosition
from cdc.server_version import ServerVersion
from cdc.source_events import recovered_xid
from connectors.mysql.client import MySQLTlsError, connect, describe_tls

ER_ACCESS_DENIED = 1045
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_TABLEACCESS_DENIED = 1142
ER_NO_SUCH_TABLE = 1146
ER_BAD_DB = 1049


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str
    warn: bool = False  # passes, but names a risk


# Privileges that allow SET SESSION binlog_format (MariaDB: SUPER or BINLOG ADMIN; MySQL 8:
# SESSION_VARIABLES_ADMIN or SYSTEM_VARIABLES_ADMIN or SUPER).
SESSION_FORMAT_PRIVILEGES = ("SUPER", "BINLOG ADMIN", "SESSION_VARIABLES_ADMIN", "SYSTEM_VARIABLES_ADMIN")


# MySQL before 8.0.1 (5.7) has no binlog_row_metadata: its Table_maps carry no column
# names, no signedness and no ENUM / SET values (the optional metadata came with 8.0.1). The
# relay reads them from information_schema.COLUMNS, as for binlog_row_metadata=MINIMAL
# (connectors/mysql/table_columns.py), which only holds while the table is as it was when
# the rows were written.
_NO_ROW_METADATA = (
    "MySQL {version} has no binlog_row_metadata (MySQL 8.0.1 added it): the relay reads the outbox's column "
    "names and ENUM/SET values from information_schema.COLUMNS; an outbox table altered while the relay is "
    "behind stops it (the binlog's older rows no longer match), so alter it only once the relay has caught up"
)


def _before_row_metadata(version: str) -> bool:
    """MySQL older than 8.0.1 (not MariaDB, whose 10.5+ has the variable and older ones are
    told to upgrade)."""
    v = ServerVersion.parse(version)
    return not v.is_mariadb and not v.at_least(8, 0, 1)


def _vars(cur, names: tuple[str, ...]) -> dict[str, str]:
    cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ",".join(["%s"] * len(names)) + ")", names)
    return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def run_checks(
    cfg: Config, start: StartAt | str | None = None, checkpoint: Checkpoint | None = None, replica_id: bool = True
) -> list[CheckResult]:
    """Every check's result. `start` is the position the relay would start from (a
    checkpoint's, or the configured start when there is none); `checkpoint`, when there
    is one, dates the undecided XA transactions it recorded. `replica_id=False` leaves
    the replica server id out (a relay with a lease settles it once it holds the lease)."""
    src = cfg.source
    results: list[CheckResult] = []

    def add(name: str, ok: bool, message: str, warn: bool = False) -> None:
        results.append(CheckResult(name, ok, message, warn))

    settings = src.connection()
    try:
        conn = connect(settings, connect_timeout=5)
    except MySQLTlsError as exc:
        add("tls", False, str(exc))
        return results
    except pymysql.err.OperationalError as exc:
        code = exc.args[0] if exc.args else 0
        if code == ER_ACCESS_DENIED:
            add(
                "connect",
                False,
                f"access denied for user {src.user!r} at {src.host}:{src.port}: "
                "check source.user and the password (source.password_env / source.password_file)",
            )
        else:
            add(
                "connect",
                False,
                f"cannot connect to {src.host}:{src.port} ({exc.args[1] if len(exc.args) > 1 else exc}): "
                "check source.host/source.port and that the server is running",
            )
        return results
    add("connect", True, f"connected to {src.host}:{src.port} as {src.user!r}")
    ok, warn, line = describe_tls(conn, settings)
    add("tls", ok, line, warn=warn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION(), @@server_id")
            version, server_id = cur.fetchone()
            mariadb = "mariadb" in str(version).lower()
            v = _vars(cur, ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata"))
            add(
                "log_bin",
                v.get("log_bin", "").upper() == "ON",
                "binary logging is on"
                if v.get("log_bin", "").upper() == "ON"
                else "binary logging is off: start the server with --log-bin (log_bin=ON in its config)",
            )
            for var, want, how in (
                ("binlog_format", "ROW", "binlog_format=ROW"),
                ("binlog_row_image", "FULL", "binlog_row_image=FULL"),
                ("binlog_row_metadata", "FULL", "binlog_row_metadata=FULL (column names in the binlog)"),
            ):
                if var == "binlog_row_metadata" and var not in v and _before_row_metadata(str(version)):
                    add(var, True, _NO_ROW_METADATA.format(version=version), warn=True)
                    continue
                have = v.get(var, "(not supported)")
                ok = have.upper() == want
                add(
                    var,
                    ok,
                    f"{var} is {have}"
                    if ok
                    else f"{var} is {have}: set {how} in the server config (SET GLOBAL {var}='{want}' takes effect "
                    "for new sessions; MySQL 8.0.1+ / MariaDB 10.5+ are needed for binlog_row_metadata)",
                )
            if replica_id:
                _check_replica_id(cur, cfg, int(server_id), mariadb, add)
            else:  # settled once the lease is held; whether it can be settled is known now
                from connectors.mysql.replica_sessions import replicas_listable, unverifiable

                denied = replicas_listable(cur, cfg.source.user, mariadb)
                if denied is not None:
                    add("replica_server_id", False, unverifiable(cfg.source.replica_server_id, denied))
            _check_grants(cur, cfg, mariadb, add)
            _check_session_format(cur, cfg, add)
            _check_tables(cur, cfg, add)
            _check_start(cur, start, add)
            _check_xa_undecided(cur, checkpoint, add)
            _check_compression(cur, cfg, add)
            if cfg.source.decoder == "library":
                _check_library_values(cur, cfg, add)
    finally:
        conn.close()
    return results


def _check_replica_id(cur, cfg: Config, server_id: int, mariadb: bool, add) -> None:
    """The replica server id must be free. A session listed with it may be this relay's
    own previous one (a restart right after a stop or a crash): connectors/mysql/replica_sessions.py
    ends it (KILL) when its process is provably gone, and otherwise waits it out for a few
    heartbeat periods; one still there after that is another replica (exit 2, one line).
    A user who may not list the replicas (MariaDB 10.5.2+: no REPLICATION MASTER ADMIN)
    fails too: the id cannot be shown to be free, and two sessions with one id end each
    other's."""
    rid = cfg.source.replica_server_id
    if rid == server_id:
        add("replica_server_id", False, f"source.replica_server_id {rid} is the server's own server_id: pick another")
        return
    from connectors.mysql.replica_sessions import settle

    ok, message = settle(cur, rid, cfg.source.user, mariadb, cfg.source.heartbeat_s)
    add("replica_server_id", ok, message)


# `GRANT <privileges> ON *.* TO ...`: a global grant. Global privileges never carry
# column lists or quotes, so the privileges are the text between GRANT and ON *.*.
_GLOBAL_GRANT = re.compile(r"^GRANT\s+([A-Z_ ,]+?)\s+ON\s+\*\.\*\s+TO\s", re.IGNORECASE)
EVERYTHING = "ALL PRIVILEGES"
# Names SHOW GRANTS may show for the privilege that lets a client stream the binlog
# (MariaDB 10.5.1+ accepts REPLICATION REPLICA as its alias, and shows REPLICATION SLAVE).
REPLICATION_SLAVE = ("REPLICATION SLAVE", "REPLICATION REPLICA")


def global_privileges(grant_lines: list[str]) -> set[str]:
    """The privileges granted ON *.* in SHOW GRANTS's lines, by exact name (upper case,
    single spaces): `GRANT REPLICATION SLAVE ADMIN ON *.*` holds REPLICATION SLAVE ADMIN,
    not REPLICATION SLAVE. ALL / ALL PRIVILEGES ON *.* is `EVERYTHING`. Grants on a
    schema, a table or columns, PROXY grants and role grants (`GRANT `r` TO ...`) hold no
    global privilege.

    Roles: MariaDB's SHOW GRANTS lists the privileges of the session's active roles (a
    new session's are its default roles, nested ones included) as lines `... TO `role``,
    and those count here, as they count for the relay's own sessions. Not covered:
    MySQL 8 shows a role's privileges only with SHOW GRANTS ... USING, so a privilege
    held only through a MySQL role is reported missing; and a role that is granted but
    not a default role counts for nothing (the relay does not SET ROLE)."""
    privileges: set[str] = set()
    for line in grant_lines:
        match = _GLOBAL_GRANT.match(line.strip())
        if match is None:
            continue
        for name in match.group(1).split(","):
            name = " ".join(name.split()).upper()
            privileges.add(EVERYTHING if name in ("ALL", "ALL PRIVILEGES") else name)
    return privileges


def has_privilege(privileges: set[str], *names: str) -> bool:
    return EVERYTHING in privileges or any(name in privileges for name in names)


def _check_grants(cur, cfg: Config, mariadb: bool, add) -> None:
    user = cfg.source.user
    cur.execute("SHOW GRANTS")
    privileges = global_privileges([str(row[0]) for row in cur.fetchall()])
    has_slave = has_privilege(privileges, *REPLICATION_SLAVE)
    add(
        "grant_replication_slave",
        has_slave,
        "REPLICATION SLAVE granted"
        if has_slave
        else f"user {user!r} lacks REPLICATION SLAVE: GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%'",
    )
    try:
        cur.execute("SHOW BINARY LOGS")
        cur.fetchall()
        add("grant_replication_client", True, "can list binary logs (REPLICATION CLIENT / BINLOG MONITOR)")
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == ER_SPECIFIC_ACCESS_DENIED:
            priv = "BINLOG MONITOR" if mariadb else "REPLICATION CLIENT"
            add(
                "grant_replication_client",
                False,
                f"user {user!r} cannot list binary logs: GRANT {priv} ON *.* TO '{user}'@'%'",
            )
        else:
            add("grant_replication_client", False, f"SHOW BINARY LOGS failed: {exc.args[-1]}: is binary logging on?")


def _check_tables(cur, cfg: Config, add) -> None:
    user = cfg.source.user
    for table in cfg.tables:
        name = table.qualified_name
        try:
            cur.execute(f"SELECT 1 FROM `{table.schema}`.`{table.table}` LIMIT 0")
            cur.fetchall()
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code in (ER_NO_SUCH_TABLE, ER_BAD_DB):
                add(f"table {name}", False, f"outbox table {name} does not exist: create it, or fix outbox.tables")
            elif code == ER_TABLEACCESS_DENIED:
                add(f"table {name}", False, _denied_table(cur, user, table.schema, table.table))
            else:
                add(f"table {name}", False, f"cannot read {name}: {exc.args[-1]}")
            continue
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema=%s AND table_name=%s",
            (table.schema, table.table),
        )
        have = {str(r[0]).lower() for r in cur.fetchall()}
        missing = [c for c in table.expected_columns if c.lower() not in have]
        if missing:
            add(
                f"table {name}",
                False,
                f"outbox table {name} lacks column(s) {', '.join(missing)}: add them or map "
                "other columns in outbox.tables (id_column, aggregate_type_column, aggregate_id_column, "
                "type_column, payload_column)",
            )
        else:
            add(f"table {name}", True, f"outbox table {name} has the expected columns")


def _denied_table(cur, user: str, schema: str, table: str) -> str:
    """The line for a table whose SELECT is denied. The server answers "denied", not "no
    such table", to a user without privileges on the table, whether it exists or not;
    information_schema.TABLES lists the tables the user holds any privilege on, so a
    table listed there exists, and otherwise the line says both."""
    grant = f"GRANT SELECT ON `{schema}`.`{table}` TO '{user}'@'%'"
    try:
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME", (schema,)
        )
        visible = [str(r[0]) for r in cur.fetchall()]
    except pymysql.err.MySQLError:
        visible = []
    if table in visible:
        return f"user {user!r} cannot read {schema}.{table}: {grant}"
    shown = ", ".join(visible[:5]) + (f" and {len(visible) - 5} more" if len(visible) > 5 else "")
    sees = f"of {schema}'s tables it sees {shown}" if visible else f"it sees none of {schema}'s tables"
    return (
        f"outbox table {schema}.{table} does not exist or user {user!r} may not read it (the server does not "
        f"tell this user which; {sees}): create it, or fix outbox.tables, or {grant}"
    )


def _check_start(cur, start: StartAt | str | None, add) -> None:
    if not isinstance(start, BinlogPosition):
        return
    try:
        cur.execute("SHOW BINARY LOGS")
        logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
    except pymysql.err.MySQLError:
        return  # reported by the grant check
    names = dict(logs)
    if start.file in names and start.pos <= names[start.file]:
        add("start_position", True, f"start position {start} is on the server")
        return
    oldest = logs[0][0] if logs else "(none)"
    try:
        purged = bool(logs) and BinlogPosition(oldest, 4) > start
    except PositionError:
        purged = False
    if purged:
        add(
            "start_position",
            False,
            f"start position {start} was purged (oldest binlog: {oldest}); events from "
            f"{start} to {oldest}:4 cannot be read: restore those binlogs, the relay will not skip them",
        )
    else:
        add(
            "start_position",
            False,
            f"start position {start} is not on this server: the checkpoint belongs to "
            "another server, or the binlog was reset",
        )


def _check_session_format(cur, cfg: Config, add) -> None:
    """Who can log an outbox write as a statement: any account allowed to SET SESSION
    binlog_format. The relay stops at such a write (or dead-letters it, by
    outbox.on_statement); the fix is to run applications without these privileges."""
    try:
        cur.execute(
            "SELECT DISTINCT GRANTEE FROM information_schema.USER_PRIVILEGES WHERE PRIVILEGE_TYPE IN ("
            + ",".join(["%s"] * len(SESSION_FORMAT_PRIVILEGES))
            + ") ORDER BY GRANTEE",
            SESSION_FORMAT_PRIVILEGES,
        )
        accounts = [str(r[0]) for r in cur.fetchall()]
        cur.execute("SELECT CURRENT_USER()")
        me = str(cur.fetchone()[0])
    except pymysql.err.MySQLError as exc:
        add(
            "session_binlog_format",
            True,
            f"cannot list who may change binlog_format per session ({exc.args[-1]})",
            warn=True,
        )
        return
    user, _, host = me.partition("@")
    mine = f"'{user}'@'{host}'"
    others = [a for a in accounts if a != mine]
    fix = (
        "an outbox INSERT such an account logs with SET SESSION binlog_format='STATEMENT' stops the relay "
        "(or is dead-lettered, outbox.on_statement): run applications under accounts without SUPER / "
        "BINLOG ADMIN / SESSION_VARIABLES_ADMIN"
    )
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        add(
            "session_binlog_format",
            True,
            f"accounts that can change binlog_format per session: {shown}; {fix}",
            warn=True,
        )
    elif mine not in accounts:  # USER_PRIVILEGES shows only what this account may see
        add(
            "session_binlog_format",
            True,
            "no account with SUPER or BINLOG ADMIN is visible to "
            f"{cfg.source.user!r} (it sees only its own privileges); {fix}",
            warn=True,
        )
    else:
        add(
            "session_binlog_format",
            True,
            f"only {me} can change binlog_format per session "
            f"(other accounts' privileges are visible only with SELECT on mysql.*); {fix}",
            warn=True,
        )


def _check_xa_undecided(cur, checkpoint: Checkpoint | None, add) -> None:
    """XA transactions prepared and not decided: the relay publishes nothing of them and
    holds its checkpoint before the earliest until someone runs XA COMMIT / XA ROLLBACK."""
    try:
        cur.execute("XA RECOVER")
        rows = cur.fetchall()
    except pymysql.err.MySQLError as exc:
        add(
            "xa_undecided",
            True,
            f"cannot list prepared XA transactions ({exc.args[-1]}): on MySQL 8 "
            "GRANT XA_RECOVER_ADMIN ON *.* to the relay's user",
            warn=True,
        )
        return
    if not rows:
        add("xa_undecided", True, "no XA transaction is prepared and undecided")
        return
    known = {xid: (at, ts) for xid, at, ts in (checkpoint.xa_held if checkpoint else ())}
    now = time.time()
    lines = []
    for xid in map(recovered_xid, rows):
        if xid in known:
            at, ts = known[xid]
            lines.append(f"{xid} prepared at {at} {max(0, now - ts):.0f} s ago")
        else:
            lines.append(
                f"{xid} (not in the checkpoint: prepared after it was written, or before the relay "
                "started; age unknown)"
            )
    add(
        "xa_undecided",
        True,
        f"{len(lines)} XA transaction(s) prepared and undecided: "
        + "; ".join(lines)
        + ": the relay holds them unpublished and its checkpoint before the earliest; XA COMMIT or XA ROLLBACK "
        "each on the server",
        warn=True,
    )


def _check_compression(cur, cfg: Config, add) -> None:
    """Binlog compression: MariaDB's log_bin_compress (zlib, per event) and MySQL's
    binlog_transaction_compression (zstd, per transaction) are read by the relay's own
    decoder; python-mysql-replication (source.decoder = "library") drops compressed
    events without a word, so that combination is refused."""
    v = _vars(cur, ("log_bin_compress", "log_bin_compress_min_len", "binlog_transaction_compression"))
    found = []
    if v.get("log_bin_compress", "").upper() == "ON":
        found.append(
            f"log_bin_compress is ON (MariaDB: zlib, every statement or row image of "
            f"{v.get('log_bin_compress_min_len', '256')} bytes or more)"
        )
    if v.get("binlog_transaction_compression", "").upper() == "ON":
        found.append(
            "binlog_transaction_compression is ON (MySQL: each transaction one zstd Transaction_payload "
            "event; read by the relay's decoder, tested here only against byte fixtures)"
        )
    if not found:
        add(
            "binlog_compression",
            True,
            "binlog compression is off (log_bin_compress / "
            "binlog_transaction_compression); compressed events written earlier are read all the same",
        )
    elif cfg.source.decoder == "library":
        add(
            "binlog_compression",
            False,
            "; ".join(found) + ": python-mysql-replication (source.decoder = "
            '"library") skips compressed events and would lose their rows: set source.decoder = "fast"',
        )
    else:
        add(
            "binlog_compression",
            True,
            "; ".join(found) + ": the relay decompresses them",
            warn="binlog_transaction_compression is ON" in found[-1],
        )


def _check_library_values(cur, cfg: Config, add) -> None:
    """python-mysql-replication reads a zero or partly-zero DATE / DATETIME (`0000-00-00`,
    `2024-00-00`, stored where sql_mode allows them) as None and keeps nothing of it, so
    `source.decoder = "library"` would publish NULL where the default decoder publishes
    MySQL's text (connectors/mysql/binlog_library_values.py puts back what it can: JSON,
    the empty SET, YEAR 0, a zero TIMESTAMP). sql_mode is per session, so the server's
    global mode proves nothing: any such column of a watched table is named."""
    found: list[str] = []
    for table in cfg.tables:
        try:
            cur.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema=%s AND table_name=%s "
                "AND data_type IN ('date', 'datetime') ORDER BY ordinal_position",
                (table.schema, table.table),
            )
            found += [f"{table.qualified_name}.{r[0]}" for r in cur.fetchall()]
        except pymysql.err.MySQLError:
            continue  # the table's own check names what is wrong with it
    if found:
        add(
            "decoder_values",
            True,
            'source.decoder = "library" (python-mysql-replication) publishes a zero or partly-zero DATE / DATETIME '
            f"(0000-00-00, 2024-00-00) of {', '.join(found)} as NULL, where the default decoder publishes "
            'MySQL\'s text: set source.decoder = "fast"',
            warn=True,
        )
    else:
        add("decoder_values", True, 'source.decoder = "library" publishes the watched tables\' values as "fast" does')


def warnings(results: list[CheckResult]) -> list[str]:
    return [r.message for r in results if r.ok and r.warn]


def failures(results: list[CheckResult]) -> list[str]:
    return [r.message for r in results if not r.ok]
