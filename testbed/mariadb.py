"""A throwaway, embedded MariaDB server for tests and the demo.

``EmbeddedMariaDB.start()`` initialises a datadir with ``mariadb-install-db``,
starts ``mariadbd`` on 127.0.0.1 and waits (with a deadline) until it accepts
connections. The binlog is configured the way the CDC relay needs it.

Flags passed to ``mariadb-install-db`` (about 0.5 s):

* ``--no-defaults``: never read /etc/mysql/*.cnf or ~/.my.cnf, so the host's
  configuration cannot change or break the throwaway server.
* ``--auth-root-authentication-method=normal``: root gets the historical
  password-less accounts (root@localhost, root@127.0.0.1) instead of unix-socket
  auth, so root can also log in over TCP.
* ``--skip-test-db``: no ``test`` database: less work, nothing unexpected.
* ``--skip-name-resolve``: grant rows use IP addresses; no DNS look-ups.
* ``--user=root`` (only when running as root): mariadbd refuses to run as root
  otherwise.
* ``--extra-file``: creates the ``cdc`` user (password ``cdc-test``) with all
  privileges (including REPLICATION SLAVE / BINLOG MONITOR) for 127.0.0.1 and
  localhost, so the relay and the tests log in with a real password.
* the small InnoDB sizes below, so the files it creates are small.

Flags passed to ``mariadbd`` (start to connectable: about 0.1 s):

* ``--no-defaults``: see above; must be the first argument.
* ``--datadir``, ``--socket``, ``--pid-file``, ``--log-error``: everything
  lives inside the datadir, so two servers never collide and one
  ``rmtree`` removes all traces.
* ``--bind-address=127.0.0.1 --port=N``: TCP on loopback only, on a free port
  (picked by binding port 0) unless one is requested.
* ``--skip-name-resolve``: no reverse DNS on every connection (slow, flaky in
  containers).
* ``--user=root`` (only when running as root): see above.
* ``--log-bin=mysql-bin``: binary logging on; files are ``mysql-bin.NNNNNN``
  in the datadir.
* ``--binlog-format=ROW``: row events (what python-mysql-replication decodes),
  not SQL statements.
* ``--binlog-row-image=FULL``: every column of the row in every row event,
  not only the changed/key columns.
* ``--binlog-row-metadata=FULL``: table-map events carry column names, so
  python-mysql-replication keys row ``values`` by real column names without
  looking at information_schema (which may have changed since the event).
* ``--server-id=N``: mandatory with binary logging; readers must use another.
* ``--sync-binlog=1 --innodb-flush-log-at-trx-commit=1``: a transaction is
  durable in both the binlog and InnoDB when COMMIT returns, so committed rows
  (and their binlog events) survive ``kill -9``.
* ``--character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci``:
  with ``--no-defaults`` the compiled-in default is latin1; Debian's config
  (which we no longer read) sets utf8mb4.
* ``--default-time-zone=+00:00``: TIMESTAMP values do not depend on the host
  time zone.
* ``--innodb-buffer-pool-size=16M --innodb-log-file-size=8M
  --innodb-temp-data-file-path=ibtmp1:1M:autoextend
  --performance-schema=OFF``: small memory and disk footprint, fast start.

No orphan servers: the child sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` before
exec, so the kernel kills mariadbd when its parent dies, even by SIGKILL, and an
``atexit`` handler kills (SIGKILL) every server still running at interpreter
exit and removes their temporary datadirs. A parent killed by a signal runs
no atexit, so its temporary datadir (``$TMPDIR/cdc-mariadb-*``, stamped with the
owner's pid and start time) is deleted by the next ``start()`` that finds its
owner and server gone. Caveat: the kernel sends the
parent-death signal when the *thread* that forked the child exits, not the
process. Call ``start()`` and ``restart()`` from a long-lived thread (the main
thread); a server started from a short-lived worker thread dies with it.

Binaries: ``mariadbd`` is looked up in ``$CDC_MARIADBD``, then on PATH, then in
/usr/sbin, /usr/local/sbin and /usr/local/mysql/bin; ``mariadb-install-db``
in ``$CDC_MARIADB_INSTALL_DB``, then on PATH and the usual directories.
"""

from __future__ import annotations

import atexit
import errno
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pymysql

from connectors.process import die_with_parent
from testbed.process import OWNER_FILE, free_port, owner_stamp, stale_roots

__all__ = ["EmbeddedMariaDB", "MariaDBServerError"]

HOST = "127.0.0.1"
DEFAULT_USER = "cdc"
DEFAULT_PASSWORD = "cdc-test"

_ENV_MARIADBD = "CDC_MARIADBD"
_ENV_INSTALL_DB = "CDC_MARIADB_INSTALL_DB"
_MARIADBD_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin")
_INSTALL_DB_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/mysql/scripts", "/usr/local/mysql/bin")
_INSTALL_HINT = "install it with 'apt-get install mariadb-server' (Debian/Ubuntu)"

_ROOT_PREFIX = "cdc-mariadb-"
_ERROR_LOG = "mariadbd.err"
_PID_FILE = "mariadbd.pid"
_SOCKET = "mariadbd.sock"
_INSTALL_LOG = "install-db.log"
_USER_SQL = "create-user.sql"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the trailing NUL

_PR_SET_PDEATHSIG = 1
_INSTALL_TIMEOUT = 120.0
_POLL_INTERVAL = 0.05
_AUTO_PORT_ATTEMPTS = 3

_SIZE_ARGS = (
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=8M",
)


class MariaDBServerError(Exception):
    """The embedded MariaDB server could not be found, started or stopped.

    The message is one line that names the fix.
    """


# --------------------------------------------------------------------------
# binaries


def _executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _find_binary(names: Sequence[str], env_var: str, dirs: Sequence[str]) -> str:
    """Return the path of the first of ``names`` found, or raise a one-line error."""
    label = names[0]
    override = os.environ.get(env_var)
    if override:
        if _executable(override):
            return override
        raise MariaDBServerError(
            f"{label} not found: {_INSTALL_HINT}; or point {env_var} "
            f"(now {override!r}, not an executable file) at the {label} binary"
        )
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for directory in dirs:
            candidate = os.path.join(directory, name)
            if _executable(candidate):
                return candidate
    raise MariaDBServerError(f"{label} not found: {_INSTALL_HINT}")


def find_mariadbd() -> str:
    """Path of the ``mariadbd`` binary (``$CDC_MARIADBD`` overrides)."""
    return _find_binary(("mariadbd",), _ENV_MARIADBD, _MARIADBD_DIRS)


def find_install_db() -> str:
    """Path of ``mariadb-install-db`` (``$CDC_MARIADB_INSTALL_DB`` overrides)."""
    return _find_binary(("mariadb-install-db", "mysql_install_db"), _ENV_INSTALL_DB, _INSTALL_DB_DIRS)


# --------------------------------------------------------------------------
# ports


def _check_port_free(port: int) -> None:
    """Raise if ``HOST:port`` cannot be bound the way mariadbd binds it (SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise MariaDBServerError(
                    f"port {port} on {HOST} is already in use: pick another port "
                    f"(or pass port=None for a free one) or stop the process holding {port}"
                ) from None
            raise MariaDBServerError(f"cannot bind {HOST}:{port} ({exc.strerror}): pick another port") from None


# --------------------------------------------------------------------------
# child set-up: die with the parent


def _make_preexec(parent_pid: int) -> Callable[[], None]:
    # Runs in the child between fork and exec: prctl and getppid only.
    return functools.partial(die_with_parent, parent_pid)


# --------------------------------------------------------------------------
# temporary datadirs left behind by parents that were killed


def _sweep_stale_roots() -> None:
    """Delete temporary roots whose owning process is gone.

    A parent killed by a signal gets no atexit: PR_SET_PDEATHSIG kills its
    mariadbd but the temporary datadir stays. Only roots carrying an owner stamp
    whose process no longer exists are removed; anything else is left alone.
    """
    for root in stale_roots(_ROOT_PREFIX):
        server_pid = _read_pid(root / "data" / _PID_FILE)
        if server_pid is not None and owner_stamp(server_pid) is not None:
            continue  # a server still runs there: leave it to whoever owns it
        shutil.rmtree(root, ignore_errors=True)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------
# registry for the atexit handler

_running: set[EmbeddedMariaDB] = set()
_running_lock = threading.Lock()


def _kill_all_at_exit() -> None:
    with _running_lock:
        servers = list(_running)
    for server in servers:
        try:
            server.kill()
            if server.owns_datadir:
                shutil.rmtree(server.root, ignore_errors=True)
        except Exception:
            pass


atexit.register(_kill_all_at_exit)


# --------------------------------------------------------------------------


def _tail(path: Path, n: int) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return []
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-n:] if n > 0 else []


def _error_lines(path: Path, n: int = 6) -> list[str]:
    """ERROR lines of a log (mariadb-install-db buries them above a long banner), else its tail."""
    lines = _tail(path, 400)
    errors = [line for line in lines if "ERROR" in line]
    return errors[-n:] if errors else lines[-n:]


def _one_line(lines: Sequence[str]) -> str:
    return " | ".join(line.strip() for line in lines) if lines else "(empty)"


class EmbeddedMariaDB:
    """A throwaway mariadbd bound to 127.0.0.1 with a ROW binlog.

    Use ``EmbeddedMariaDB.start()`` (not the constructor), from the main thread
    (see the module docstring about PR_SET_PDEATHSIG)::

        with EmbeddedMariaDB.start() as db:
            conn = db.connect()
            stream = BinLogStreamReader(connection_settings=db.connection_settings(), server_id=100, ...)
    """

    def __init__(
        self,
        *,
        root: Path,
        datadir: Path,
        port: int,
        server_id: int,
        owns_datadir: bool,
        mariadbd: str,
        startup_timeout: float,
        extra_args: Sequence[str],
    ) -> None:
        self.root = root
        self._datadir = datadir
        self._port = port
        self.server_id = server_id
        self.owns_datadir = owns_datadir
        self._mariadbd = mariadbd
        self.startup_timeout = startup_timeout
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket_dir: str | None = None
        self._auto_port = False
        self._restarting = False
        self.timings: dict[str, float] = {}
        """Seconds: ``install`` (install-db), ``start`` (spawn to connectable),
        ``restart`` (last restart() call, spawn to connectable)."""

    # ------------------------------------------------------------------ start

    @classmethod
    def start(
        cls,
        datadir: Path | None = None,
        port: int | None = None,
        server_id: int = 1,
        startup_timeout: float = 60.0,
        extra_args: Sequence[str] = (),
    ) -> EmbeddedMariaDB:
        """Initialise a datadir, start mariadbd and wait until it accepts connections.

        ``datadir=None`` creates a temporary one that ``cleanup()`` deletes; a
        given datadir is initialised when it holds no ``mysql`` schema yet,
        reused otherwise, and kept by ``cleanup()``. ``port=None`` picks a free
        port. ``extra_args`` are appended to the mariadbd command line (and can
        override the defaults). Must be called from a long-lived thread.
        """
        mariadbd = find_mariadbd()
        if port is not None:
            _check_port_free(port)
        install_db = find_install_db()

        owns = datadir is None
        if datadir is None:
            _sweep_stale_roots()
            root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX))
            (root / OWNER_FILE).write_text(owner_stamp(os.getpid()) or "")
            data = root / "data"
        else:
            data = Path(datadir).resolve()
            root = data
        server = cls(
            root=root,
            datadir=data,
            port=port if port is not None else free_port(),
            server_id=server_id,
            owns_datadir=owns,
            mariadbd=mariadbd,
            startup_timeout=startup_timeout,
            extra_args=extra_args,
        )
        server._auto_port = port is None
        try:
            if not (data / "mysql").is_dir():
                t0 = time.monotonic()
                server._install(install_db)
                server.timings["install"] = time.monotonic() - t0
            attempts = 1 if port is not None else _AUTO_PORT_ATTEMPTS
            for attempt in range(attempts):
                try:
                    server.timings["start"] = server._spawn_and_wait(startup_timeout)
                    break
                except _PortTaken:
                    if attempt + 1 == attempts:
                        raise MariaDBServerError(
                            f"mariadbd could not bind a free port on {HOST} after {attempts} attempts: "
                            f"stop whatever grabs ports; {server._log_excerpt(server.log_lines(40))}"
                        ) from None
                    server._port = free_port()
        except BaseException:
            server._discard_after_failed_start()
            raise
        return server

    def _install(self, install_db: str) -> None:
        self._datadir.mkdir(parents=True, exist_ok=True)
        user_sql = self.root / _USER_SQL
        quoted = DEFAULT_PASSWORD.replace("'", "''")
        # Bootstrap mode runs with the grant tables unloaded; FLUSH PRIVILEGES
        # loads them so that CREATE USER / GRANT work.
        # The rows for the host name are dropped: --skip-name-resolve ignores
        # them anyway, with a warning on every start.
        local = "('localhost', '127.0.0.1', '::1')"
        user_sql.write_text(
            f"DELETE FROM mysql.global_priv WHERE Host NOT IN {local};\n"
            f"DELETE FROM mysql.proxies_priv WHERE Host NOT IN {local};\n"
            "FLUSH PRIVILEGES;\n"
            + "".join(
                f"CREATE USER IF NOT EXISTS '{DEFAULT_USER}'@'{host}' IDENTIFIED BY '{quoted}';\n"
                f"GRANT ALL PRIVILEGES ON *.* TO '{DEFAULT_USER}'@'{host}' WITH GRANT OPTION;\n"
                for host in (HOST, "localhost")
            )
        )
        cmd = [
            install_db,
            "--no-defaults",
            f"--datadir={self._datadir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            f"--extra-file={user_sql}",
            *self._user_args(),
            *self._tmpdir_args(),
            *_SIZE_ARGS,
        ]
        log_path = self.install_log
        try:
            with log_path.open("wb") as log:
                result = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=_INSTALL_TIMEOUT,
                    check=False,
                )
        except subprocess.TimeoutExpired:
            raise MariaDBServerError(
                f"mariadb-install-db did not finish within {_INSTALL_TIMEOUT:.0f}s for {self._datadir}: "
                f"check disk space and that directory; last lines: {_one_line(_tail(log_path, 8))}"
            ) from None
        finally:
            user_sql.unlink(missing_ok=True)
        if result.returncode != 0:
            raise MariaDBServerError(
                f"mariadb-install-db failed (exit {result.returncode}) for {self._datadir}: "
                f"use an empty, writable datadir; output: {_one_line(_error_lines(log_path))}"
            )

    @staticmethod
    def _user_args() -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _tmpdir_args(self) -> list[str]:
        """Temporary tables in the server's own root, not the machine's /tmp: a fresh-clone
        run beside other suites failed twice in mariadb-install-db with "Unknown table
        'mysql.tmp_user_nopasswd,mysql.tmp_user_socket'" (the bootstrap's temporary tables,
        created moments before, were gone from /tmp when it dropped them)."""
        if not self.owns_datadir:
            return []  # a given datadir's parent is not ours to write into
        tmp = self.root / "tmp"
        tmp.mkdir(exist_ok=True)
        return [f"--tmpdir={tmp}"]

    def _socket_path(self) -> str:
        path = str(self._datadir / _SOCKET)
        if len(path.encode()) <= _SOCKET_PATH_MAX:
            return path
        if self._socket_dir is None:  # datadir too deep for a unix socket path
            self._socket_dir = tempfile.mkdtemp(prefix="cdc-mdb-")
        return os.path.join(self._socket_dir, _SOCKET)

    def _command(self) -> list[str]:
        return [
            self._mariadbd,
            "--no-defaults",
            f"--datadir={self._datadir}",
            f"--socket={self._socket_path()}",
            f"--pid-file={self._datadir / _PID_FILE}",
            f"--log-error={self.error_log}",
            f"--bind-address={HOST}",
            f"--port={self._port}",
            "--skip-name-resolve",
            *self._user_args(),
            *self._tmpdir_args(),
            "--log-bin=mysql-bin",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            f"--server-id={self.server_id}",
            "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            "--default-time-zone=+00:00",
            *_SIZE_ARGS,
            "--innodb-temp-data-file-path=ibtmp1:1M:autoextend",
            "--performance-schema=OFF",
            *self.extra_args,
        ]

    def _spawn_and_wait(self, timeout: float) -> float:
        """Spawn mariadbd and wait until it is connectable; return the seconds taken."""
        log_offset = self.error_log.stat().st_size if self.error_log.exists() else 0
        t0 = time.monotonic()
        with self.error_log.open("ab") as err:
            # stderr also goes to the error log: option errors are printed before
            # mariadbd opens --log-error.
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                cwd=self._datadir,
                preexec_fn=_make_preexec(os.getpid()),
                start_new_session=True,  # a terminal Ctrl-C reaches us, not the server
            )
        with _running_lock:
            _running.add(self)
        deadline = t0 + timeout
        last_error: Exception | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                self._reap()
                new_log = self._log_since(log_offset)
                where = "" if self.owns_datadir and not self._restarting else f" or the datadir {self._datadir}"
                if any("Address already in use" in line or "Bind on TCP/IP port" in line for line in new_log):
                    if self._port_was_auto_picked():
                        raise _PortTaken()
                    raise MariaDBServerError(
                        f"port {self._port} on {HOST} is already in use: pick another port or stop "
                        f"the process holding {self._port}; {self._log_excerpt(new_log)}"
                    )
                raise MariaDBServerError(
                    f"mariadbd exited with code {code} during start-up: fix the server options "
                    f"(extra_args){where}; {self._log_excerpt(new_log)}"
                )
            try:
                # read/write timeouts too: a listener that is not mariadbd (a port
                # grabbed by someone else) accepts TCP and then never answers.
                conn = pymysql.connect(connect_timeout=2, read_timeout=2, write_timeout=2, **self.connection_settings())
                conn.close()
                return time.monotonic() - t0
            except pymysql.err.MySQLError as exc:
                last_error = exc
            now = time.monotonic()
            if now >= deadline:
                self.kill()
                raise MariaDBServerError(
                    f"mariadbd did not accept connections on {HOST}:{self._port} within {timeout:.0f}s "
                    f"(last error: {last_error}): raise startup_timeout or look into the error log; "
                    f"{self._log_excerpt(self._log_since(log_offset))}"
                )
            time.sleep(min(_POLL_INTERVAL, deadline - now))

    def _log_excerpt(self, lines: Sequence[str]) -> str:
        """One-line excerpt of an error log: its [ERROR] lines and its last lines."""
        keep = {i for i, line in enumerate(lines) if "[ERROR]" in line}
        keep = set(sorted(keep)[-4:]) | set(range(max(0, len(lines) - 4), len(lines)))
        excerpt = _one_line([lines[i] for i in sorted(keep)])
        # a failed start() deletes a temporary datadir, so only name a log that survives
        if self.owns_datadir and not self._restarting:
            return f"last lines of its error log: {excerpt}"
        return f"last lines of {self.error_log}: {excerpt}"

    def _port_was_auto_picked(self) -> bool:
        return self._auto_port and not self._restarting

    def _log_since(self, offset: int) -> list[str]:
        try:
            with self.error_log.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            return []
        return [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]

    def _discard_after_failed_start(self) -> None:
        self.kill()
        if self.owns_datadir:
            shutil.rmtree(self.root, ignore_errors=True)
        self._remove_socket_dir()

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    # ------------------------------------------------------------- properties

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def user(self) -> str:
        return DEFAULT_USER

    @property
    def password(self) -> str:
        return DEFAULT_PASSWORD

    @property
    def datadir(self) -> Path:
        return self._datadir

    @property
    def error_log(self) -> Path:
        return self._datadir / _ERROR_LOG

    @property
    def install_log(self) -> Path:
        return self.root / _INSTALL_LOG

    @property
    def pid(self) -> int | None:
        """Process id of the running mariadbd, None when it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    def connection_settings(self) -> dict[str, Any]:
        """A fresh dict for ``pymysql.connect(**s)`` and BinLogStreamReader(connection_settings=s).

        Keys: host, port, user, password. python-mysql-replication passes the
        dict straight to ``pymysql.connect`` (adding ``charset``), so the key is
        ``password``; ``passwd`` also works but PyMySQL deprecates it.
        """
        return {"host": HOST, "port": self._port, "user": DEFAULT_USER, "password": DEFAULT_PASSWORD}

    def connect(self, database: str | None = None, *, autocommit: bool = False) -> pymysql.Connection[Any]:
        """A new PyMySQL connection (utf8mb4, autocommit off unless asked)."""
        return pymysql.connect(
            database=database,
            charset="utf8mb4",
            autocommit=autocommit,
            connect_timeout=10,
            **self.connection_settings(),
        )

    def create_database(self, name: str) -> None:
        """CREATE DATABASE IF NOT EXISTS ``name``."""
        if not name or "\x00" in name:
            raise MariaDBServerError(f"invalid database name {name!r}: use a non-empty name")
        quoted = "`" + name.replace("`", "``") + "`"
        conn = self.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {quoted}")
        finally:
            conn.close()

    def log_lines(self, n: int = 20) -> list[str]:
        """The last ``n`` non-empty lines of the server's error log."""
        return _tail(self.error_log, n)

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` non-empty lines of the server's error log, newline-joined."""
        return "\n".join(self.log_lines(n))

    # -------------------------------------------------------------- lifecycle

    def _reap(self) -> None:
        with _running_lock:
            _running.discard(self)

    def stop(self, timeout: float = 30.0) -> None:
        """Clean shutdown (SIGTERM), SIGKILL if it is not gone within ``timeout`` seconds."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self._reap()

    def kill(self) -> None:
        """SIGKILL the server without any cleanup, like a crash."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        self._reap()

    def restart(self, startup_timeout: float | None = None) -> EmbeddedMariaDB:
        """Start again on the same datadir and port (stopping first if running)."""
        if self.running:
            self.stop()
        if not (self._datadir / "mysql").is_dir():
            raise MariaDBServerError(
                f"cannot restart: datadir {self._datadir} is gone (cleanup() was called); use start()"
            )
        _check_port_free(self._port)
        self._restarting = True
        try:
            self.timings["restart"] = self._spawn_and_wait(
                self.startup_timeout if startup_timeout is None else startup_timeout
            )
        finally:
            self._restarting = False
        return self

    def cleanup(self) -> None:
        """Stop if running, then delete the datadir if start() created it (idempotent)."""
        self.stop()
        if self.owns_datadir:
            shutil.rmtree(self.root, ignore_errors=True)
        self._remove_socket_dir()

    def __enter__(self) -> EmbeddedMariaDB:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"EmbeddedMariaDB(host={HOST!r}, port={self._port}, pid={self.pid}, datadir={str(self._datadir)!r})"


class _PortTaken(Exception):
    """Internal: an auto-picked port was grabbed by someone else before mariadbd bound it."""
