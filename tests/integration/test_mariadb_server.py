"""Integration tests for the embedded, throwaway MariaDB (testbed.mariadb).

They start real mariadbd processes (about 0.7 s each) and read the binlog back
with python-mysql-replication, the way the relay does.
"""

from __future__ import annotations

import itertools
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import WriteRowsEvent

import testbed.mariadb as module
from connectors.mysql.client import binlog_end
from testbed.mariadb import EmbeddedMariaDB, MariaDBServerError

pytestmark = [
    pytest.mark.integration,
    # python-mysql-replication 1.0.17 itself passes PyMySQL the deprecated "db" key
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "cdc_test"
TABLE = "outbox"
COLUMNS = ["id", "aggregate_type", "aggregate_id", "event_type", "payload", "created_at"]
_reader_ids = itertools.count(1001)  # replica server ids: unique, != the server's id 1


# ----------------------------------------------------------------------------- helpers


def _alive(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _is_mariadbd(pid: int) -> bool:
    try:
        return b"mariadbd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _binlog_position(db: EmbeddedMariaDB) -> tuple[str, int]:
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            row = binlog_end(cur)
    finally:
        conn.close()
    assert row is not None, "binary logging is off"
    return str(row[0]), int(row[1])


def _insert(db: EmbeddedMariaDB, aggregate_id: str, *, commit: bool = True, payload: str = '{"n": 1}') -> None:
    conn = db.connect(SCHEMA)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {TABLE} (aggregate_type, aggregate_id, event_type, payload) VALUES (%s, %s, %s, %s)",
                ("order", aggregate_id, "OrderPlaced", payload),
            )
        if commit:
            conn.commit()
        else:
            conn.rollback()
    finally:
        conn.close()


def _read_binlog(db: EmbeddedMariaDB, log_file: str, log_pos: int) -> list[dict[str, Any]]:
    """Every event from (log_file, log_pos) to the current end of the binlog.

    is_mariadb stays False: with is_mariadb=True (and no auto_position) the
    reader sends an empty file name and position 4, i.e. starts at the oldest
    binlog whatever log_file/log_pos say. resume_stream=True is what makes it
    honour log_pos (otherwise it starts at position 4 of log_file).
    """
    stream = BinLogStreamReader(
        connection_settings=db.connection_settings(),
        server_id=next(_reader_ids),
        only_events=[WriteRowsEvent, XidEvent, GtidEvent, MariadbGtidEvent, QueryEvent],
        blocking=False,
        resume_stream=True,
        log_file=log_file,
        log_pos=log_pos,
    )
    events: list[dict[str, Any]] = []
    try:
        for event in stream:
            events.append(
                {
                    "event": event,
                    "type": type(event),
                    "log_file": stream.log_file,
                    "log_pos": event.packet.log_pos,  # end position of the event in log_file
                }
            )
    finally:
        stream.close()
    return events


def _written_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        row["values"]
        for e in events
        if e["type"] is WriteRowsEvent and e["event"].schema == SCHEMA and e["event"].table == TABLE
        for row in e["event"].rows
    ]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedMariaDB]:
    db = EmbeddedMariaDB.start()
    try:
        db.create_database(SCHEMA)
        conn = db.connect(SCHEMA)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"""CREATE TABLE {TABLE} (
                        id BIGINT AUTO_INCREMENT PRIMARY KEY,
                        aggregate_type VARCHAR(64) NOT NULL,
                        aggregate_id VARCHAR(64) NOT NULL,
                        event_type VARCHAR(64) NOT NULL,
                        payload LONGTEXT NOT NULL,
                        created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                    ) ENGINE=InnoDB"""
                )
            conn.commit()
        finally:
            conn.close()
        yield db
    finally:
        db.cleanup()


@pytest.fixture()
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make start()'s temporary datadirs land in tmp_path, to check none leaks."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


# ----------------------------------------------------------------------------- tests


def test_server_settings(server: EmbeddedMariaDB) -> None:
    settings = server.connection_settings()
    assert set(settings) == {"host", "port", "user", "password"}
    assert settings["host"] == "127.0.0.1" and settings["port"] == server.port
    conn = server.connect()
    try:
        assert conn.get_autocommit() is False
        with conn.cursor() as cur:
            cur.execute(
                "SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata, "
                "@@server_id, @@sync_binlog, @@innodb_flush_log_at_trx_commit, @@bind_address, @@port"
            )
            row = cur.fetchone()
    finally:
        conn.close()
    assert row == (1, "ROW", "FULL", "FULL", 1, 1, 1, "127.0.0.1", server.port)
    assert server.pid is not None and _alive(server.pid)
    assert (server.datadir / "mysql").is_dir()
    assert "ready for connections" in server.log_tail(50)


def test_committed_row_is_read_from_binlog_with_column_names_and_position(server: EmbeddedMariaDB) -> None:
    start_file, start_pos = _binlog_position(server)
    _insert(server, "order-1", payload='{"total": 12.5, "note": "caf\u00e9 \u2615"}')
    end_file, end_pos = _binlog_position(server)
    assert end_file == start_file and end_pos > start_pos

    events = _read_binlog(server, start_file, start_pos)
    types = [e["type"] for e in events]
    # MariaDB opens a transaction with its own GTID event (no BEGIN query event,
    # never MySQL's GtidEvent) and ends an InnoDB one with an Xid event.
    assert types == [MariadbGtidEvent, WriteRowsEvent, XidEvent], types
    gtid, write, xid = events

    (values,) = _written_rows(events)
    assert list(values) == COLUMNS  # real column names: binlog_row_metadata=FULL
    assert values["aggregate_id"] == "order-1"
    assert values["payload"] == '{"total": 12.5, "note": "caf\u00e9 \u2615"}'
    assert isinstance(values["id"], int) and values["id"] > 0

    for e in events:
        assert e["log_file"] == start_file
    assert start_pos < gtid["log_pos"] < write["log_pos"] < xid["log_pos"] == end_pos

    conn = server.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            (gtid_pos,) = cur.fetchone()
    finally:
        conn.close()
    assert gtid["event"].gtid == gtid_pos  # "0-1-N": domain 0, server_id 1


def test_rolled_back_row_never_reaches_the_binlog(server: EmbeddedMariaDB) -> None:
    start_file, start_pos = _binlog_position(server)
    _insert(server, "rolled-back", commit=False)
    assert _binlog_position(server) == (start_file, start_pos)  # nothing written at all
    _insert(server, "committed-after")

    ids = [values["aggregate_id"] for values in _written_rows(_read_binlog(server, start_file, start_pos))]
    assert ids == ["committed-after"]


def test_kill_then_restart_keeps_committed_rows_and_port(server: EmbeddedMariaDB) -> None:
    start_file, start_pos = _binlog_position(server)
    _insert(server, "before-crash")
    port, old_pid = server.port, server.pid
    assert old_pid is not None

    server.kill()
    assert server.pid is None and not server.running
    assert _wait_dead(old_pid, 5)

    server.restart()
    assert server.port == port
    assert server.pid is not None and server.pid != old_pid
    assert server.timings["restart"] < 30

    conn = server.connect(SCHEMA)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {TABLE} WHERE aggregate_id = 'before-crash'")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()
    # The pre-crash binlog file is still readable from the saved position, and
    # the restarted server writes to a new file.
    assert "before-crash" in [v["aggregate_id"] for v in _written_rows(_read_binlog(server, start_file, start_pos))]
    assert _binlog_position(server)[0] != start_file

    # A clean stop() followed by restart() keeps the port too.
    server.stop()
    assert server.pid is None
    server.restart()
    assert server.port == port
    _insert(server, "after-clean-restart")


ORPHAN_PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from testbed.mariadb import EmbeddedMariaDB
    db = EmbeddedMariaDB.start()
    print(db.pid, db.root, flush=True)
    if {exit_normally!r}:
        sys.exit(0)  # without cleanup(): the atexit handler must kill it
    time.sleep(120)
    """
)


def _run_parent(exit_normally: bool) -> tuple[subprocess.Popen[str], int, Path]:
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_PARENT.format(root=str(REPO_ROOT), exit_normally=exit_normally)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(parent.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=60):
            parent.kill()
            parent.wait()
            pytest.fail("the parent process did not report a mariadbd pid within 60 s")
    line = parent.stdout.readline()
    if not line:
        parent.wait(timeout=10)
        pytest.fail(f"the parent process failed: {parent.stderr.read() if parent.stderr else ''}")
    pid_text, root = line.split()
    return parent, int(pid_text), Path(root)


@pytest.mark.parametrize("exit_normally", [False, True], ids=["parent-sigkilled", "parent-exits"])
def test_no_orphan_server_outlives_its_parent(exit_normally: bool) -> None:
    parent, pid, root = _run_parent(exit_normally)
    try:
        if not exit_normally:
            assert _alive(pid) and _is_mariadbd(pid)
            parent.send_signal(signal.SIGKILL)  # no atexit, no finally: only PDEATHSIG helps
        parent.wait(timeout=30)
        assert _wait_dead(pid, 10), f"mariadbd {pid} survived its parent"
        if exit_normally:
            assert not root.exists(), "the atexit handler should delete the temporary datadir"
        else:  # a SIGKILLed parent cannot clean up: the next start() sweeps its datadir
            assert root.exists()
            module._sweep_stale_roots()
            assert not root.exists()
    finally:
        if _alive(pid) and _is_mariadbd(pid):
            os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        shutil.rmtree(root, ignore_errors=True)  # a SIGKILLed parent cannot clean up


def test_missing_mariadbd_names_the_package(monkeypatch: pytest.MonkeyPatch, private_tmp: Path) -> None:
    monkeypatch.setenv("CDC_MARIADBD", "/nonexistent")
    with pytest.raises(MariaDBServerError) as info:
        EmbeddedMariaDB.start()
    message = str(info.value)
    assert message.startswith("mariadbd not found: install it with 'apt-get install mariadb-server'")
    assert "CDC_MARIADBD" in message and "\n" not in message
    assert list(private_tmp.iterdir()) == []


def test_missing_install_db_names_the_package(monkeypatch: pytest.MonkeyPatch, private_tmp: Path) -> None:
    monkeypatch.setenv("CDC_MARIADB_INSTALL_DB", "/nonexistent/mariadb-install-db")
    with pytest.raises(MariaDBServerError, match="apt-get install mariadb-server") as info:
        EmbeddedMariaDB.start()
    assert str(info.value).startswith("mariadb-install-db not found")
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize("bind_host", ["127.0.0.1", "0.0.0.0"])
def test_port_in_use_names_the_port(bind_host: str, private_tmp: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((bind_host, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(MariaDBServerError) as info:
            EmbeddedMariaDB.start(port=port)
    message = str(info.value)
    assert f"port {port}" in message and "already in use" in message and "pick another port" in message
    assert "\n" not in message
    assert list(private_tmp.iterdir()) == []  # detected before any datadir was created


def test_failing_start_reports_error_log_lines(private_tmp: Path) -> None:
    with pytest.raises(MariaDBServerError) as info:
        EmbeddedMariaDB.start(extra_args=["--no-such-option"], startup_timeout=30)
    message = str(info.value)
    assert "mariadbd exited with code" in message
    assert "unknown option '--no-such-option'" in message  # a line of its error log
    assert "\n" not in message
    assert list(private_tmp.iterdir()) == []  # the failed server's temp datadir is removed


def test_cleanup_stops_the_server_and_deletes_the_datadir() -> None:
    with EmbeddedMariaDB.start() as db:
        pid, root, datadir = db.pid, db.root, db.datadir
        assert pid is not None and _alive(pid)
        assert datadir.is_dir()
    assert db.pid is None
    assert _wait_dead(pid, 5)
    assert not datadir.exists() and not root.exists()
    db.cleanup()  # idempotent
    with pytest.raises(MariaDBServerError, match="use start"):
        db.restart()


def test_auto_picked_port_taken_before_bind_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    real_free_port = module.free_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(module, "free_port", lambda: next(picks, None) or real_free_port())
        with EmbeddedMariaDB.start() as db:
            assert db.port != taken
            assert "Address already in use" in db.log_tail(100)  # the first attempt hit the held port
            db.connect().close()


def test_given_datadir_is_initialised_once_reused_and_kept(tmp_path: Path) -> None:
    datadir = tmp_path / "data"
    with EmbeddedMariaDB.start(datadir=datadir) as db:
        assert db.datadir == datadir.resolve() and "install" in db.timings
        db.create_database("kept")
    assert db.pid is None and (datadir / "kept").is_dir()  # cleanup() keeps a caller's datadir
    with EmbeddedMariaDB.start(datadir=datadir) as again:
        assert "install" not in again.timings  # already initialised: reused as is
        conn = again.connect("kept")
        conn.close()
