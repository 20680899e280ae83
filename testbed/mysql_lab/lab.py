"""`MysqlLab`: the MySQL lab server as a child process over a data directory, and the
binlog writer for the same directory, for tests and demos.

    with MysqlLab.start(version="9.1.0") as lab:
        w = lab.writer()                   # testbed.mysql_lab.binlog_writer.MysqlBinlogWriter
        w.create_table("shop", "outbox", [...])
        with w.transaction() as tx:
            tx.insert("shop", "outbox", [{...}])
        pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password=lab.password)

The server runs as `python -m testbed.mysql_lab` on 127.0.0.1 and a free port (the kernel's
choice, announced on its stdout), in a temporary directory unless `datadir` is given. It
dies with its parent (PR_SET_PDEATHSIG, `connectors.process.die_with_parent`) and is killed
at interpreter exit. Until the writer writes `lab_state.json`, `start()` writes one that
describes an empty server of that version (GTIDs on, binlog_row_metadata FULL, CRC32).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from connectors.process import die_with_parent

__all__ = ["MysqlLab", "MysqlLabError"]

HOST = "127.0.0.1"
DEFAULT_USER = "cdc"
DEFAULT_PASSWORD = "cdc-test"
STATE_FILE = "lab_state.json"
LOG_FILE = "lab_server.log"
ERR_FILE = "lab_server.err"
_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT = 30.0

_running: set[MysqlLab] = set()
_running_lock = threading.Lock()


class MysqlLabError(Exception):
    """The lab server could not be started (one line naming why)."""


def _kill_all_at_exit() -> None:
    with _running_lock:
        labs = list(_running)
    for lab in labs:
        lab.stop()


atexit.register(_kill_all_at_exit)


def default_state(version: str, server_id: int, server_uuid: str) -> dict[str, Any]:
    """lab_state.json of an empty server (the writer's contract, docs/mysql-lab.md); as MySQL
    5.7 without the variables 8.0 added (binlog_row_metadata and the others)."""
    state: dict[str, Any] = {
        "server_version": version,
        "server_id": server_id,
        "server_uuid": server_uuid,
        "variables": {
            "log_bin": "ON",
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL",
            "binlog_checksum": "CRC32",
            "gtid_mode": "ON",
            "enforce_gtid_consistency": "ON",
            "binlog_transaction_compression": "OFF",
            "binlog_row_value_options": "",
            "server_uuid": server_uuid,
        },
        "gtid_executed": "",
        "gtid_purged": "",
        "xa_prepared": [],
        "tables": {},
    }
    if version.startswith("5."):
        for name in ("binlog_row_metadata", "binlog_transaction_compression", "binlog_row_value_options"):
            del state["variables"][name]
    return state


def write_state(datadir: Path, state: dict[str, Any]) -> None:
    """Atomically, as the writer does (temp file + os.replace)."""
    tmp = datadir / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, datadir / STATE_FILE)


class MysqlLab:
    def __init__(
        self, datadir: Path, owns_datadir: bool, version: str, user: str, password: str, tls: tuple[str, str] | None
    ):
        self.tls = tls  # (certificate, key) files: the server offers TLS
        self.datadir = datadir
        self.owns_datadir = owns_datadir
        self.version = version
        self.host = HOST
        self.port = 0
        self.user = user
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        version: str = "8.4.3",
        datadir: str | os.PathLike[str] | None = None,
        server_id: int = 1,
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> MysqlLab:
        """A running lab. `tls_cert` / `tls_key` (PEM files): the server offers TLS (without
        them it does not, and caching_sha2_password's full login uses the RSA exchange)."""
        owns = datadir is None
        path = Path(tempfile.mkdtemp(prefix="cdc-mysql-lab-")) if datadir is None else Path(datadir)
        path.mkdir(parents=True, exist_ok=True)
        if not (path / STATE_FILE).exists():
            write_state(path, default_state(version, server_id, str(uuid.uuid4())))
        tls = (str(tls_cert), str(tls_key or "")) if tls_cert else None
        lab = cls(path, owns, version, user, password, tls)
        lab._spawn()
        return lab

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["CDC_LAB_PASSWORD"] = self.password
        env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-m", "testbed.mysql_lab", "--datadir", str(self.datadir), "--port", str(self.port)]
        cmd += ["--user", self.user, "--version", self.version]
        if self.tls:
            cmd += ["--tls-cert", self.tls[0], "--tls-key", self.tls[1]]
        # stderr to a file: a pipe nobody reads would stall the server once full.
        with (self.datadir / ERR_FILE).open("ab") as err_file:
            proc = subprocess.Popen(
                cmd,
                cwd=str(_ROOT),
                env=env,
                stdout=subprocess.PIPE,
                stderr=err_file,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        assert proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 64)
                if not chunk:
                    break
                line += chunk
        if not line.startswith(b"ready "):
            proc.kill()
            proc.wait()
            err = (self.datadir / ERR_FILE).read_text(errors="replace").strip()
            raise MysqlLabError(f"the MySQL lab server did not start: {err.splitlines()[-1] if err else 'no output'}")
        self.port = int(line.split()[1])
        self._proc = proc
        with _running_lock:
            _running.add(self)

    # -- the data directory --------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.datadir / STATE_FILE).read_text())
        return data

    def update_state(self, **changes: Any) -> None:
        """Change lab_state.json (tests that build files without the writer)."""
        state = self.state()
        state.update(changes)
        write_state(self.datadir, state)

    def writer(self, **kwargs: Any) -> Any:
        """A MysqlBinlogWriter for this directory, as this server (version, server id and
        uuid from the state file unless given)."""
        # Imported when asked: the writer is built on another branch (and this module works without it).
        writer_class = importlib.import_module("testbed.mysql_lab.binlog_writer").MysqlBinlogWriter
        state = self.state()
        kwargs.setdefault("version", state.get("server_version", self.version))
        kwargs.setdefault("server_id", int(state.get("server_id", 1)))
        kwargs.setdefault("server_uuid", state.get("server_uuid"))
        return writer_class(self.datadir, **kwargs)

    def log_lines(self) -> list[str]:
        try:
            return (self.datadir / LOG_FILE).read_text().splitlines()
        except OSError:
            return []

    def unknown_statements(self) -> list[str]:
        marker = "unknown statement: "
        return [line.split(marker, 1)[1] for line in self.log_lines() if marker in line]

    def lab_errors(self) -> list[str]:
        """Log lines of statements the lab failed on (its own bugs, answered with error 1105)."""
        return [line for line in self.log_lines() if "lab error on statement" in line]

    def connection_settings(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}

    def connect(self, database: str | None = None, *, autocommit: bool = False) -> Any:
        """A PyMySQL connection to the lab, as `EmbeddedMariaDB.connect` gives one (the test
        harness's helpers take either server)."""
        import pymysql

        return pymysql.connect(database=database, autocommit=autocommit, **self.connection_settings())

    # -- stopping --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _end_process(self, timeout: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self._proc = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); remove a temporary directory."""
        self._end_process()
        with _running_lock:
            _running.discard(self)
        if self.owns_datadir:
            shutil.rmtree(self.datadir, ignore_errors=True)

    def restart(self) -> None:
        """Stop the server process and start it again on the same port and directory (a
        server restart: sessions, locks and the caching_sha2 cache are gone)."""
        self._end_process()
        self._spawn()

    def __enter__(self) -> MysqlLab:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
