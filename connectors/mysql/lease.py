"""The lease on the source database: `GET_LOCK()` on a session of its own (the rules are
cdc/lease.py's).

Why a named lock: the server already there holds it, no table or grant is needed (any
account may take a user-level lock), and the server frees it the moment the holding
session ends. The session's `wait_timeout` is set to the lease time, so the server also
ends it, and frees the lock, when the holder goes silent (frozen, or cut off from the
database) for that long.

A standby waits in `GET_LOCK(name, renew_s)` and, between tries, looks at the holder's
session in the process list (an account sees its own sessions without PROCESS): how
long it has been idle tells, when the lock comes free, whether the holder's session was
closed while it confirmed on time, or timed out after it went silent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pymysql

from cdc.checkpoint import Checkpoint
from cdc.errors import SourceError
from cdc.lease import LeaseClock, LeaseLost, LeaseSettings, Previous
from cdc.replica_session import SessionTag
from connectors.mysql.client import connect
from connectors.mysql.errors import error_text
from connectors.mysql.replica_sessions import local_machine, own_tag, process_alive

log = logging.getLogger(__name__)


@dataclass
class Observed:
    """The holder a standby last saw: its lock session, how long that session had been
    idle, and when (monotonic) it looked."""

    conn: int
    idle_s: float
    at: float


class MySQLLease:
    """Acquire (waiting as a standby), hold (confirming every `renew_s` on a thread of its
    own) and release the lease named `name` on the server of `connection`."""

    def __init__(
        self,
        connection: dict,
        name: str,
        settings: LeaseSettings,
        clock: Callable[[], float] = time.monotonic,
        on_confirm: Callable[[float], None] | None = None,
    ):
        self._connection = connection
        self.name = name
        self.settings = settings
        self._clock = clock
        self._on_confirm = on_confirm or (lambda _at: None)
        self._conn: pymysql.connections.Connection | None = None
        self.conn_id = 0
        self.holder_tag = ""
        self.lease: LeaseClock | None = None
        self.observed: Observed | None = None
        self.acquired_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._newest_is_ours: Callable[[], bool] = lambda: True

    # -- waiting ------------------------------------------------------------------------

    def _connect(self) -> pymysql.connections.Connection:
        c = self._connection
        timeout = max(2.0, self.settings.ttl_s / 2)
        try:
            conn = connect(c, connect_timeout=5, read_timeout=timeout, write_timeout=timeout, autocommit=True)
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"cannot open the lease session on {c['host']}:{c['port']}: {error_text(exc)}") from exc
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION wait_timeout = {self.settings.wait_timeout}")
            cur.execute("SELECT CONNECTION_ID()")
            self.conn_id = int(cur.fetchone()[0])
        return conn

    def acquire(self, should_stop: Callable[[], bool], on_waiting: Callable[[int | None], None]) -> bool:
        """Wait for the lock (a standby meanwhile); True once held, False when
        `should_stop()` turned true first. `on_waiting(holder connection id)` is called
        once when another session holds it.

        A standby only stops when told to: when the server ends its waiting session (its
        `wait_timeout` ran out while this process was frozen, a network drop, a restart
        of the server) it waits on in a new one, and while the server cannot be reached
        it tries again every `renew_s`. Only the first session's failure to open is an
        error (the settings are wrong, or the server is not there at all)."""
        conn = self._conn = self._connect()
        told = False
        while not should_stop():
            try:
                with conn.cursor() as cur:
                    while not should_stop():
                        cur.execute("SELECT GET_LOCK(%s, %s)", (self.name, self.settings.renew_s))
                        got = cur.fetchone()[0]
                        if got == 1:
                            self.acquired_at = self._clock()
                            self.holder_tag = own_tag(self.conn_id).text()
                            return True
                        holder = self._look(cur)
                        if not told:
                            on_waiting(holder)
                            told = True
                return False
            except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
                # the session is gone, and with it any lock it could have held
                log.warning(
                    "standby: the lease session ended (%s); waiting for lease %r on a new session",
                    error_text(exc),
                    self.name,
                )
                self._close_quietly(conn)
                conn = self._conn = self._reopen(should_stop)
                if conn is None:
                    return False
            except pymysql.err.MySQLError as exc:
                raise SourceError(
                    f"the lease session failed while waiting for lease {self.name!r}: {error_text(exc)}"
                ) from exc
        return False

    def _reopen(self, should_stop: Callable[[], bool]) -> pymysql.connections.Connection | None:
        """A new waiting session, trying every `renew_s` until it opens or `should_stop()`."""
        while not should_stop():
            try:
                return self._connect()
            except SourceError as exc:
                log.warning("standby: %s; trying again in %g s", exc, self.settings.renew_s)
                self._stop.wait(self.settings.renew_s)
        return None

    @staticmethod
    def _close_quietly(conn: pymysql.connections.Connection) -> None:
        try:
            conn.close()
        except Exception:
            pass

    def _look(self, cur) -> int | None:
        cur.execute("SELECT IS_USED_LOCK(%s)", (self.name,))
        holder = cur.fetchone()[0]
        if holder is None:
            return None
        cur.execute("SELECT TIME FROM information_schema.PROCESSLIST WHERE ID = %s", (int(holder),))
        row = cur.fetchone()
        if row is not None:
            self.observed = Observed(int(holder), float(row[0] or 0), self._clock())
        return int(holder)

    def previous(self, cp: Checkpoint | None) -> Previous:
        """What is known of the holder before this one (call after `acquire`)."""
        epoch = cp.epoch if cp is not None else 0
        tag = SessionTag.parse(cp.holder) if cp is not None else None
        seen = self.observed
        gone = False
        if tag is not None and (seen is None or seen.conn == tag.conn):
            gone = local_machine().same_as(tag) and not process_alive(tag.pid, tag.start)
        closed = False
        if seen is not None:
            since = self.acquired_at - seen.at
            # The server frees a silent holder's lock `wait_timeout` after its last
            # command; freed well before that, the session was closed, not timed out.
            closed = since <= self.settings.renew_s + 1.5 and seen.idle_s + since < self.settings.wait_timeout - 2
        return Previous(epoch, bool(cp is not None and cp.released), gone, closed)

    # -- holding ------------------------------------------------------------------------

    def hold(self, newest_is_ours: Callable[[], bool] = lambda: True) -> LeaseClock:
        """Start confirming the lease every `renew_s`; the returned clock says until when
        the relay may publish. `newest_is_ours()`: no checkpoint of a newer epoch than
        this relay's exists (asked before the lease is taken again on a new session)."""
        self._newest_is_ours = newest_is_ours
        self.lease = lease = LeaseClock(self.settings, self.acquired_at)
        self._on_confirm(time.time())
        self._thread = threading.Thread(target=self._renew, args=(lease,), name="lease", daemon=True)
        self._thread.start()
        return lease

    def _renew(self, lease: LeaseClock) -> None:
        conn = self._conn
        if conn is None:  # released before the thread ran
            return
        while not self._stop.wait(self.settings.renew_s):
            sent = self._clock()
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT IS_USED_LOCK(%s)", (self.name,))
                    holder = cur.fetchone()[0]
            except Exception as exc:
                if self._stop.is_set() or not self._regain(lease, exc):
                    return
                if self._conn is None:
                    return
                conn = self._conn
                continue
            if holder != self.conn_id:
                lease.lose(
                    f"the server says connection {holder} holds lease {self.name!r} now, not this "
                    f"relay's {self.conn_id}"
                )
                return
            lease.confirmed(sent)
            self._on_confirm(time.time())

    def _regain(self, lease: LeaseClock, cause: BaseException) -> bool:
        """The lock session failed (the server restarted, the connection dropped) and the
        lock went with it. Take it again on a new session, while this relay's lease has
        not run out, if no other relay holds it and none held it meanwhile (no checkpoint
        of a newer epoch): a relay that took it meanwhile waited at least the lease time
        before publishing, so it cannot have published yet. Otherwise the lease is lost."""
        why = error_text(cause)
        log.warning("the lease session failed (%s); taking lease %r again on a new session", why, self.name)
        if self._conn is not None:
            self._close_quietly(self._conn)
        while not self._stop.is_set():
            try:
                lease.check(self._clock())
            except LeaseLost:
                lease.lose(f"the lease session failed ({why}) and the lease could not be taken again in time")
                return False
            try:
                conn = self._connect()
            except SourceError:
                self._stop.wait(self.settings.renew_s / 2)
                continue
            try:
                with conn.cursor() as cur:
                    sent = self._clock()
                    cur.execute("SELECT GET_LOCK(%s, 0)", (self.name,))
                    got = cur.fetchone()[0] == 1
                    holder = None
                    if not got:
                        cur.execute("SELECT IS_USED_LOCK(%s)", (self.name,))
                        holder = cur.fetchone()[0]
                if got and not self._newest_is_ours():
                    got, holder = False, "another relay (a checkpoint of a newer epoch exists)"
            except Exception as exc:
                conn.close()
                log.debug("taking the lease again failed: %s", error_text(exc))
                self._stop.wait(self.settings.renew_s / 2)
                continue
            if not got:
                conn.close()
                lease.lose(f"the lease session failed ({why}) and lease {self.name!r} is held by {holder} now")
                return False
            self._conn = conn
            self.holder_tag = own_tag(self.conn_id).text()
            lease.confirmed(sent)
            self._on_confirm(time.time())
            log.info("took lease %r again on connection %d", self.name, self.conn_id)
            return True
        return False

    def close(self) -> None:
        """Release the lease (if held) and end the session."""
        self._stop.set()
        if self._thread is not None and (self.lease is None or self.lease.lost is None):
            self._thread.join(self.settings.ttl_s)  # (a lost lease's thread may hang in a dead read: left)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self.lease is not None and self.lease.lost is None:
                with conn.cursor() as cur:
                    cur.execute("SELECT RELEASE_LOCK(%s)", (self.name,))
        except Exception:
            pass
        finally:
            try:
                conn.close()
            except Exception:
                pass


class LeaseUnknown(Exception):
    """The server could not be asked who holds the lease (the reason: the connection check's)."""


def lease_holder(name: str, connection: dict) -> int | None:
    """The connection id holding the lease `name` right now (None: free). For `cdc check`:
    raises LeaseUnknown when the server cannot be asked (a failed login, no answer), which
    the check reports as not known, never as free."""
    c = connection
    try:
        conn = connect(c, connect_timeout=5, read_timeout=5)
    except Exception as exc:
        raise LeaseUnknown(type(exc).__name__) from None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s)", (name,))
            holder = cur.fetchone()[0]
            return None if holder is None else int(holder)
    except Exception as exc:
        raise LeaseUnknown(type(exc).__name__) from None
    finally:
        conn.close()
