"""The relay's binlog sessions on the server: the tag a session registers with, ending
one's own session at a clean stop, and settling who holds the replica server id at start
(the decisions are cdc/replica_session.py's; this module queries, KILLs and waits).

Why: the server keeps a binlog dump thread after its client went away until a heartbeat
write to the dead socket fails (one or two heartbeat periods; a COM_QUIT is never read,
the dump thread does not read its socket). A relay restarted at once found its own
previous session there and took it for another relay.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import pymysql

from cdc.replica_session import (
    DumpThread,
    Finding,
    Listed,
    Machine,
    SessionTag,
    assess,
    refusal,
    source_mark,
    wait_bound,
)
from cdc.server_version import replicas_statement
from connectors.mysql.client import connect

ER_NO_SUCH_THREAD = 1094
ER_KILL_DENIED = 1095
ER_SPECIFIC_ACCESS_DENIED = 1227


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pidns() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # 'pid:[4026531836]'
    except OSError:
        return ""
    digits = "".join(ch for ch in link if ch.isdigit())
    return digits


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22),
    or None when there is no such process (or no /proc)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    if not fields or fields[0] in ("Z", "X"):
        return None  # a zombie: dead, not yet reaped (a reader process whose relay was killed)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start: int) -> bool:
    """Does the process `pid`, started at `start`, still run (a reused pid is another)?"""
    return process_start(pid) == start


def local_machine() -> Machine:
    return Machine(socket.gethostname(), _read("/proc/sys/kernel/random/boot_id").replace("-", "")[:8], _pidns())


_source = [""]  # this process's source, as its source_mark


def set_source(source_name: str) -> None:
    """Name the source this process relays, for the tags of its binlog sessions."""
    _source[0] = source_mark(source_name)


def own_tag(conn_id: int) -> SessionTag:
    """The tag of a binlog session this process owns, with connection id `conn_id`."""
    here = local_machine()
    pid = os.getpid()
    return SessionTag(conn_id, here.host, here.boot, here.pidns, pid, process_start(pid) or 0, _source[0])


def end_session(settings: Mapping[str, Any], conn_id: int, timeout: float = 2.0) -> bool:
    """KILL the binlog connection `conn_id` from a side connection (`settings`: a
    connection dict, connectors/mysql/client.py), so that the server forgets the session
    at once. An account may always kill its own connections. True when the server ended
    it (or it was already gone); never raises."""
    try:
        conn = connect(settings, connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout, autocommit=True)
    except Exception:
        return False
    try:
        with conn.cursor() as cur:
            cur.execute(f"KILL CONNECTION {int(conn_id)}")
        return True
    except pymysql.err.MySQLError as exc:
        return bool(exc.args) and exc.args[0] == ER_NO_SUCH_THREAD
    except Exception:
        return False
    finally:
        try:
            conn.close()
        except Exception:
            pass


class ReplicasUnknown(Exception):
    """The server would not list its replicas: whether the id is free cannot be told."""


ER_PARSE_ERROR = 1064


def unverifiable(server_id: int, exc: ReplicasUnknown) -> str:
    """Not "free": a second relay or replica with this id would make the server end one
    of the two sessions, again and again."""
    return (
        f"cannot verify that replica server id {server_id} is free: {exc}, or make sure no other replica uses id "
        f"{server_id}"
    )


def replicas_listable(cur, user: str, mariadb: bool) -> ReplicasUnknown | None:
    """Whether this account may list the replicas (None: it may)."""
    try:
        _listed(cur, user, mariadb)
    except ReplicasUnknown as exc:
        return exc
    return None


def _listed(cur, user: str, mariadb: bool) -> list[Listed]:
    """The replicas the server lists (SHOW SLAVE HOSTS; MySQL 8.0.22+: SHOW REPLICAS, the
    only one 8.4 knows: `cdc.server_version.replicas_statement`). Raises ReplicasUnknown,
    with the grant that would allow it, when it will not say."""
    try:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
    except pymysql.err.MySQLError:
        version = "mariadb" if mariadb else ""
    statements = [replicas_statement(version)]
    for statement in statements:
        try:
            cur.execute(statement)
            return [Listed(int(row[0]), str(row[1] or "")) for row in cur.fetchall()]
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == ER_SPECIFIC_ACCESS_DENIED:
                # MariaDB 10.5.2+ needs REPLICATION MASTER ADMIN; MySQL (and MariaDB
                # before 10.5.2) REPLICATION SLAVE, which the relay needs anyway.
                raise ReplicasUnknown(
                    f"{statement} is denied to user {user!r}: GRANT REPLICATION MASTER ADMIN ON *.* TO '{user}'@'%' "
                    "(MariaDB 10.5.2+; MySQL: REPLICATION SLAVE)"
                    if mariadb
                    else f"{statement} is denied to user {user!r}: GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%' "
                    "(MariaDB 10.5.2+: REPLICATION MASTER ADMIN)"
                ) from None
            raise ReplicasUnknown(f"{statement} failed ({exc.args[-1] if exc.args else exc})") from None
    return []


def _sessions(cur, user: str, mariadb: bool) -> tuple[list[Listed], list[DumpThread]]:
    listed = _listed(cur, user, mariadb)
    try:
        cur.execute("SELECT ID, USER, HOST FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
        dumps = [DumpThread(int(r[0]), str(r[1] or ""), str(r[2] or "")) for r in cur.fetchall()]
    except pymysql.err.MySQLError:
        try:
            cur.execute("SHOW PROCESSLIST")
            dumps = [
                DumpThread(int(r[0]), str(r[1] or ""), str(r[2] or ""))
                for r in cur.fetchall()
                if str(r[4] or "").startswith("Binlog Dump")
            ]
        except pymysql.err.MySQLError:
            dumps = []
    return listed, dumps


def settle(
    cur,
    server_id: int,
    user: str,
    mariadb: bool,
    heartbeat_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    machine: Machine | None = None,
    alive: Callable[[int, int], bool] = process_alive,
    lease_held: str = "",
) -> tuple[bool, str]:
    """Make sure no other session holds `server_id`: KILL this relay's own dead sessions,
    wait out the others for `wait_bound(heartbeat_s)`. (ok, one line)."""
    machine = machine or local_machine()
    began = clock()
    bound = wait_bound(heartbeat_s)
    ended: list[str] = []
    denied: set[int] = set()
    waited: Finding | None = None
    while True:
        try:
            listed, dumps = _sessions(cur, user, mariadb)
        except ReplicasUnknown as exc:
            return False, unverifiable(server_id, exc)
        findings = assess(server_id, listed, dumps, user, machine, alive, lease_held)
        if not findings:
            if ended:
                return True, (
                    f"replica server id {server_id} is free (ended this relay's previous session: "
                    + "; ".join(ended)
                    + ")"
                )
            if waited is not None:
                return True, (
                    f"replica server id {server_id} is free (waited {clock() - began:.1f} s for {waited.where} to end)"
                )
            return True, f"replica server id {server_id} is free"
        for f in findings:
            if f.kind == "dead" and f.conn is not None and f.conn not in denied:
                try:
                    cur.execute(f"KILL CONNECTION {int(f.conn)}")
                    ended.append(f.where)
                except pymysql.err.MySQLError as exc:
                    if exc.args and exc.args[0] == ER_NO_SUCH_THREAD:
                        ended.append(f.where)
                    else:  # not allowed: wait it out like any other
                        denied.add(f.conn)
        waiting = [f for f in findings if f.kind != "dead" or f.conn in denied]
        if waiting:
            waited = waiting[0]
            if clock() - began >= bound:
                return False, refusal(server_id, waited, clock() - began)
        sleep(0.05)
