"""A standby only stops when told to: the server ending its waiting session (its
`wait_timeout` ran out while the process was frozen, a network drop, a KILL) opens a new
session and the standby waits on, then takes the lease when it comes free.

Found with a standby frozen (SIGSTOP) for 25 s, past its session's `wait_timeout`: it woke
to "MySQL server has gone away" and exited 1. Here the server ends the session with KILL,
which is what it does itself after `wait_timeout`, without a 25 s freeze."""

from __future__ import annotations

import threading
import uuid

import pytest

from cdc.lease import LeaseSettings
from connectors.mysql.lease import MySQLLease
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration


def _connection(mariadb) -> dict:
    s = mariadb.connection_settings()
    return {"host": s["host"], "port": s["port"], "user": s["user"], "password": s["password"]}


def test_a_standby_whose_session_the_server_ended_waits_on_a_new_one_and_takes_the_lease(mariadb):
    name = f"cdc-test-{uuid.uuid4().hex[:8]}"
    settings = LeaseSettings(ttl_s=3.0, renew_s=0.5)
    holder = MySQLLease(_connection(mariadb), name, settings)
    assert holder.acquire(lambda: False, lambda _h: None)

    standby = MySQLLease(_connection(mariadb), name, settings)
    stop = threading.Event()
    outcome: dict = {}
    waiting = threading.Event()

    def wait_as_standby() -> None:
        try:
            outcome["got"] = standby.acquire(stop.is_set, lambda _h: waiting.set())
        except Exception as exc:  # the defect: the standby gave up
            outcome["error"] = exc

    thread = threading.Thread(target=wait_as_standby, daemon=True)
    thread.start()
    try:
        assert waiting.wait(30), "the standby never saw the holder"
        first = standby.conn_id
        with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"KILL {first}")  # what the server does after wait_timeout
        wait_until(lambda: standby.conn_id != first or "error" in outcome, 30, "the standby to open a new session")
        assert "error" not in outcome, f"the standby stopped: {outcome.get('error')}"
        assert thread.is_alive(), "the standby stopped waiting although nothing told it to"

        holder.close()  # the lease comes free: the standby, on its new session, takes it
        thread.join(30)
        assert outcome == {"got": True}
        with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
            assert cur.fetchone()[0] == standby.conn_id
    finally:
        stop.set()
        thread.join(10)
        holder.close()
        standby.close()
