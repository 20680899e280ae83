"""The MySQL lab server (testbed/mysql_lab/) answers the product's clients as MySQL 8.4 /
9.x does: PyMySQL's login (caching_sha2_password, full then fast), the statements of the
relay, `cdc check`, the lease and the verifier, and the dumps of the relay's own client
(connectors/mysql/binlog_protocol.py) and python-mysql-replication, over files built here
(tests/integration/mysql_lab_files.py)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pymysql
import pytest

from connectors.mysql.binlog_protocol import BinlogConnection, BinlogConnectionError
from testbed.mysql_lab.lab import MysqlLab
from tests.integration.harness import _to_toml, wait_until
from tests.integration.mysql_lab_files import SERVER_UUID, LabFiles

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path: Path):
    files = LabFiles(tmp_path / "data")
    with MysqlLab.start(datadir=tmp_path / "data") as lab:
        lab.files = files  # type: ignore[attr-defined]
        yield lab


def connect(lab: MysqlLab, **kw) -> pymysql.connections.Connection:
    return pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password=lab.password, autocommit=True, **kw)


def query(conn, sql: str, args=None) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def header(ev: bytes) -> tuple[int, int, int, int, int, int]:
    """timestamp, type, server_id, size, log_pos, flags."""
    return struct.unpack_from("<IBIIIH", ev, 0)


# -- login ----------------------------------------------------------------------------------


def test_login_full_authentication_then_fast(lab):
    for _ in range(2):
        with connect(lab) as conn:
            assert query(conn, "SELECT 1") == [(1,)]
    logins = [line for line in lab.log_lines() if "caching_sha2_password" in line]
    assert "full authentication" in logins[0] and "fast authentication" in logins[1], logins


def test_wrong_password_is_refused_with_1045(lab):
    with pytest.raises(pymysql.err.OperationalError) as err:
        pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password="wrong")
    assert err.value.args[0] == 1045
    assert err.value.args[1] == "Access denied for user 'cdc'@'127.0.0.1' (using password: YES)"
    # A wrong password after the account is cached fails on the fast path too.
    connect(lab).close()
    with pytest.raises(pymysql.err.OperationalError) as err:
        pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password="wrong")
    assert err.value.args[0] == 1045


# -- statements -----------------------------------------------------------------------------


def test_version_variables_and_binlog_status(lab):
    files = lab.files
    files.transaction("e1")
    with connect(lab) as conn:
        version, checksum, conn_id = query(conn, "SELECT VERSION(), @@global.binlog_checksum, CONNECTION_ID()")[0]
        assert (version, checksum) == ("8.4.3", "CRC32") and conn_id == conn.thread_id()
        assert query(conn, "SELECT VERSION(), @@server_id") == [("8.4.3", 1)]
        assert dict(
            query(
                conn,
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s,%s,%s,%s)",
                ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata"),
            )
        ) == {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
        assert query(conn, "SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'") == [("binlog_checksum", "CRC32")]
        assert query(conn, "SELECT @@gtid_executed") == [(f"{SERVER_UUID}:1",)]
        with pytest.raises(pymysql.err.OperationalError) as err:
            query(conn, "SELECT @@gtid_binlog_pos")  # MariaDB's: unknown on MySQL
        assert err.value.args[0] == 1193
        size = (lab.datadir / "binlog.000001").stat().st_size
        assert query(conn, "SHOW BINARY LOG STATUS") == [("binlog.000001", size, "", "", f"{SERVER_UUID}:1")]
        assert query(conn, "SHOW BINARY LOGS") == [("binlog.000001", size, "No")]
        with pytest.raises(pymysql.err.ProgrammingError) as err:
            query(conn, "SHOW MASTER STATUS")  # removed in 8.4
        assert err.value.args[0] == 1064 and "MASTER STATUS" in err.value.args[1]
        with pytest.raises(pymysql.err.ProgrammingError):
            query(conn, "SHOW SLAVE HOSTS")
        (uptime,) = query(conn, "SHOW GLOBAL STATUS LIKE 'Uptime'")
        assert uptime[0] == "Uptime" and int(uptime[1]) >= 0
        query(conn, "SET SESSION wait_timeout = 60")
        assert query(conn, "SELECT @@wait_timeout") == [(60,)]


def test_binlog_status_follows_appends_and_a_half_written_transaction_is_not_counted(lab):
    files = lab.files
    with connect(lab) as conn:
        before = query(conn, "SHOW BINARY LOG STATUS")[0][1]
        files.transaction("e1")
        after = query(conn, "SHOW BINARY LOG STATUS")[0][1]
        assert after == files.pos > before
        with (lab.datadir / "binlog.000001").open("ab") as fh:
            fh.write(b"\x00" * 30)  # a torn event header + part of its body
        assert query(conn, "SHOW BINARY LOG STATUS")[0][1] == after


def test_show_binlog_events_as_the_verifier_reads_them(lab):
    from spark_jobs.mysql.binlog_plan import transaction_starts

    files = lab.files
    first = files.pos
    files.transaction("e1")
    second = files.pos
    files.transaction("e2", "e3")
    with connect(lab) as conn:
        rows = query(conn, "SHOW BINLOG EVENTS IN %s FROM %s", ("binlog.000001", 4))
        kinds = [r[2] for r in rows]
        assert kinds[:2] == ["Format_desc", "Previous_gtids"]
        assert kinds[2:7] == ["Gtid", "Query", "Table_map", "Write_rows", "Xid"]
        gtid_row = rows[2]
        assert gtid_row[1] == first and gtid_row[5] == f"SET @@SESSION.GTID_NEXT= '{SERVER_UUID}:1'"
        assert rows[3][5] == "BEGIN" and rows[4][5] == "table_id: 77 (shop.outbox)"
        assert rows[6][5].startswith("COMMIT /* xid=")
        assert rows[0][5] == "Server ver: 8.4.3, Binlog ver: 4"
        assert [r[1] for r in query(conn, f"SHOW BINLOG EVENTS IN 'binlog.000001' FROM {second} LIMIT 2")] == [
            second,
            second + rows[2][4] - rows[2][1],
        ]
        with pytest.raises(pymysql.err.OperationalError) as err:
            query(conn, "SHOW BINLOG EVENTS IN 'binlog.000001' FROM 5")
        assert err.value.args[0] == 1220
    settings = {"host": lab.host, "port": lab.port, "user": lab.user, "password": lab.password}
    assert transaction_starts(settings, "binlog.000001", 4, files.pos) == [first, second]


def test_grants_xa_recover_and_information_schema(lab):
    lab.update_state(xa_prepared=[{"format_id": 1, "gtrid": b"tx-1".hex(), "bqual": b"b".hex()}])
    with connect(lab) as conn:
        grants = [r[0] for r in query(conn, "SHOW GRANTS")]
        assert any("REPLICATION SLAVE" in g and "ON *.* TO `cdc`@`%`" in g for g in grants)
        assert query(conn, "XA RECOVER") == [(1, 4, 1, b"tx-1b")]
        assert query(
            conn,
            "SELECT column_name FROM information_schema.columns WHERE table_schema=%s AND table_name=%s",
            ("shop", "outbox"),
        ) == [("id",), ("payload",), ("n",)]
        assert query(
            conn,
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME",
            ("shop",),
        ) == [("outbox",)]
        assert query(conn, "SELECT 1 FROM `shop`.`outbox` LIMIT 0") == []
        with pytest.raises(pymysql.err.ProgrammingError) as err:
            query(conn, "SELECT 1 FROM `shop`.`nope` LIMIT 0")
        assert err.value.args[0] == 1146
        assert query(conn, "SELECT CURRENT_USER()") == [("cdc@%",)]


def test_an_unknown_statement_is_an_error_naming_it_and_logged(lab):
    with connect(lab) as conn:
        with pytest.raises(pymysql.err.ProgrammingError) as err:
            query(conn, "FLUSH BINARY LOGS")
        assert err.value.args[0] == 1064 and "FLUSH BINARY LOGS" in err.value.args[1]
        assert query(conn, "SELECT 2") == [(2,)]  # the session goes on
    assert "FLUSH BINARY LOGS" in lab.unknown_statements()


# -- locks and KILL -------------------------------------------------------------------------


def test_get_lock_is_held_by_a_session_until_release_or_kill(lab):
    a, b = connect(lab), connect(lab)
    try:
        a_id = query(a, "SELECT CONNECTION_ID()")[0][0]
        assert query(a, "SELECT GET_LOCK(%s, %s)", ("lease", 1)) == [(1,)]
        assert query(a, "SELECT GET_LOCK(%s, %s)", ("lease", 0)) == [(1,)]  # its own again
        began = time.monotonic()
        assert query(b, "SELECT GET_LOCK(%s, %s)", ("lease", 0.3)) == [(0,)]
        assert time.monotonic() - began >= 0.25
        assert query(b, "SELECT IS_USED_LOCK(%s), IS_FREE_LOCK(%s)", ("lease", "lease")) == [(a_id, 0)]
        assert query(b, "SELECT RELEASE_LOCK(%s)", ("lease",)) == [(0,)]  # not b's
        assert query(b, "SELECT TIME FROM information_schema.PROCESSLIST WHERE ID = %s", (a_id,))[0][0] >= 0
        # A waiter gets the lock when the holder's session is killed.
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(query(b, "SELECT GET_LOCK('lease', 10)")))
        waiter.start()
        time.sleep(0.2)
        with connect(lab) as c:
            query(c, f"KILL CONNECTION {a_id}")
            with pytest.raises(pymysql.err.OperationalError) as err:
                query(c, "KILL 99999")
            assert err.value.args[0] == 1094
        waiter.join(5)
        assert got == [[(1,)]]
        with pytest.raises(pymysql.err.OperationalError):
            query(a, "SELECT 1")  # its connection is gone
        assert query(b, "SELECT RELEASE_LOCK('lease'), RELEASE_LOCK('lease')") == [(1, None)]
    finally:
        b.close()


# -- dumps ----------------------------------------------------------------------------------


def relay_client(lab: MysqlLab, server_id: int = 4242, **kw) -> BinlogConnection:
    return BinlogConnection(lab.host, lab.port, lab.user, lab.password, server_id, read_timeout=10, **kw)


def test_the_relays_dump_client_reads_a_file_as_mysql_sends_it(lab):
    files = lab.files
    files.transaction("e1")
    files.transaction("e2")
    end = files.pos
    with relay_client(lab) as conn:
        events = list(conn.dump_file("binlog.000001", 4, blocking=False).events())
    assert conn.server_version == "8.4.3" and conn.checksum == "CRC32"
    ts, kind, _sid, size, log_pos, flags = header(events[0])
    assert (ts, kind, log_pos, flags) == (0, 4, 0, 0x20)  # the fake Rotate
    assert events[0][19:-4] == struct.pack("<Q", 4) + b"binlog.000001"
    assert header(events[1])[1] == 15 and header(events[1])[4] != 0  # FDE as stored (dump at 4)
    assert [header(e)[1] for e in events[2:]] == [35] + [33, 2, 19, 30, 16] * 2
    assert header(events[-1])[4] == end
    # From a later position: the FDE is sent with log_pos 0 and created 0.
    second = files.pos
    files.transaction("e3")
    with relay_client(lab) as conn:
        events = list(conn.dump_file("binlog.000001", second, blocking=False).events())
    fde = events[1]
    assert header(fde)[4] == 0 and fde[19 + 52 : 19 + 56] == b"\x00\x00\x00\x00"
    assert struct.unpack("<I", fde[-4:])[0] == zlib.crc32(fde[:-4])
    assert [header(e)[1] for e in events[2:]] == [33, 2, 19, 30, 16]


def test_dump_errors_as_mysql_sends_them(lab):
    with relay_client(lab) as conn, pytest.raises(BinlogConnectionError) as err:
        list(conn.dump_file("binlog.000009", 4, blocking=False).events())
    assert "Could not find first log file name in binary log index file" in str(err.value)
    with relay_client(lab) as conn, pytest.raises(BinlogConnectionError) as err:
        list(conn.dump_file("binlog.000001", 10_000, blocking=False).events())
    assert "position > file size" in str(err.value)


def test_a_gtid_dump_skips_what_the_replica_has(lab):
    files = lab.files
    files.transaction("e1")
    files.transaction("e2")
    files.rotate()
    files.transaction("e3")
    fourth_start = files.pos
    files.transaction("e4")
    with relay_client(lab) as conn:
        events = list(conn.dump_mysql_gtid(f"{SERVER_UUID}:1-3", blocking=False).events())
    # Starts in binlog.000002 (its Previous_gtids 1-2 is in the set), skips 3, sends 4.
    assert events[0][19 + 8 : -4] == b"binlog.000002"
    assert header(events[1])[1] == 15 and header(events[1])[4] == 0  # the first transaction is skipped
    kinds = [header(e)[1] for e in events[2:]]
    assert kinds[:2] == [35, 27]  # Previous_gtids, then a heartbeat at the end of the skipped one
    assert kinds[2:] == [33, 2, 19, 30, 16]
    assert header(events[3])[4] == fourth_start and events[3][19:-4] == b"binlog.000002"
    gtid = events[4]
    assert struct.unpack_from("<Q", gtid, 19 + 17)[0] == 4
    # A set that misses purged transactions is refused, naming them.
    lab.update_state(gtid_purged=f"{SERVER_UUID}:1-2")
    with relay_client(lab) as conn, pytest.raises(BinlogConnectionError) as err:
        list(conn.dump_mysql_gtid(f"{SERVER_UUID}:1", blocking=False).events())
    assert "the source purged required binary logs" in str(err.value)
    assert f"missing transactions are '{SERVER_UUID}:2'" in str(err.value)


def test_heartbeats_while_idle_then_appended_transactions_and_rotations_stream(lab):
    files = lab.files
    files.transaction("e1")
    conn = relay_client(lab, heartbeat_s=0.2)
    got: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        try:
            for ev in conn.dump_file("binlog.000001", 4).events():
                got.append(ev)
        except BinlogConnectionError:
            pass
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum(header(e)[1] == 27 for e in got) >= 2, 10, "two heartbeats")
        hb = next(e for e in got if header(e)[1] == 27)
        assert header(hb)[4] == files.pos and hb[19:-4] == b"binlog.000001"
        files.transaction("e2")
        wait_until(lambda: header(got[-1])[1] == 16 and header(got[-1])[4] == files.pos, 10, "the new transaction")
        files.rotate()
        files.transaction("e3")
        wait_until(lambda: header(got[-1])[1] == 16 and header(got[-1])[4] == files.pos, 10, "the next file")
        rotates = [e for e in got if header(e)[1] == 4]
        assert rotates[-2][19 + 8 : -4] == b"binlog.000002" and header(rotates[-2])[0] != 0  # the file's own
        assert rotates[-1][19 + 8 : -4] == b"binlog.000002" and header(rotates[-1])[0] == 0  # the fake one
        with connect(lab) as side:
            replicas = query(side, "SHOW REPLICAS")
            assert [r[0] for r in replicas] == [4242]
            dumps = query(side, "SHOW PROCESSLIST")
            assert [r[4] for r in dumps if r[0] == conn.connection_id] == ["Binlog Dump"]
    finally:
        conn.close()  # KILLs its dump from a side connection
    assert done.wait(10)
    with connect(lab) as side:
        wait_until(lambda: query(side, "SHOW REPLICAS") == [], 10, "the dump to end")


def test_python_mysql_replication_streams_rows_from_the_lab(lab):
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    files = lab.files
    files.transaction("e1")
    files.transaction("e2", "e3")
    stream = BinLogStreamReader(
        connection_settings=lab.connection_settings(),
        server_id=4343,
        blocking=False,
        resume_stream=True,
        log_file="binlog.000001",
        log_pos=4,
        only_events=[WriteRowsEvent],
    )
    try:
        rows = [row["values"] for ev in stream for row in ev.rows]
    finally:
        stream.close()
    assert [r["id"] for r in rows] == ["e1", "e2", "e3"]
    assert rows[2]["n"] == 1


def test_python_mysql_replication_gtid_dump(lab):
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import GtidEvent

    files = lab.files
    for e in ("e1", "e2", "e3"):
        files.transaction(e)
    stream = BinLogStreamReader(
        connection_settings=lab.connection_settings(),
        server_id=4344,
        blocking=False,
        auto_position=f"{SERVER_UUID}:1-2",
        only_events=[GtidEvent],
    )
    try:
        gtids = [ev.gtid for ev in stream]
    finally:
        stream.close()
    assert gtids == [f"{SERVER_UUID}:3"]


# -- cdc check ------------------------------------------------------------------------------

OUTBOX_COLUMNS = ["id", "aggregatetype", "aggregateid", "type", "payload", "created_at"]


@pytest.mark.parametrize("version", ["8.4.3", "9.1.0"])
def test_cdc_check_passes_against_the_lab(version, kafka, tmp_path):
    files = LabFiles(tmp_path / "data", version=version)
    files.transaction("e1")
    with MysqlLab.start(datadir=tmp_path / "data") as lab:
        result = _cdc_check(lab, kafka, tmp_path)
        text = result.stdout + result.stderr
        assert result.returncode == 0, text
        assert "Traceback" not in text
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        names = {line[4:].split(":")[0].strip() for line in lines}
        for name in ("connect", "log_bin", "binlog_format", "binlog_row_metadata", "replica_server_id",
                     "grant_replication_slave", "grant_replication_client", "table shop.outbox", "xa_undecided"):  # fmt: skip
            assert name in names, result.stdout
        assert lab.unknown_statements() == [] and lab.lab_errors() == []


def _cdc_check(lab: MysqlLab, kafka, tmp_path: Path):
    lab.update_state(
        tables={
            "shop.outbox": [
                {"name": c, "ordinal": i, "column_type": "varchar(255)", "data_type": "varchar", "nullable": True,
                 "character_set": "utf8mb4", "key": "PRI" if c == "id" else ""}
                for i, c in enumerate(OUTBOX_COLUMNS, 1)
            ]
        }
    )  # fmt: skip
    raw = {
        "source": {
            "name": "src-lab",
            "host": lab.host,
            "port": lab.port,
            "user": lab.user,
            "password_env": "CDC_TEST_MYSQL_PASSWORD",
            "replica_server_id": 5123,
            "start": "latest",
            "heartbeat_s": 0.5,
        },
        "outbox": {"tables": [{"schema": "shop", "table": "outbox", "topic": "lab.{aggregate_type}"}]},
        "kafka": {"bootstrap": kafka.bootstrap_servers, "dead_letter_topic": "lab.dlq"},
        "schema_registry": {"url": "mock://lab"},
        "checkpoint": {"store": "file", "path": str(tmp_path / "cp.json"), "interval_s": 0.2},
        "topics": {"missing": "auto"},
    }
    config = tmp_path / "relay.toml"
    config.write_text(_to_toml(raw))
    result = subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", "check", "--config", str(config)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "CDC_TEST_MYSQL_PASSWORD": lab.password},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result


# -- more of the protocol -------------------------------------------------------------------


def test_native_password_ping_init_db_and_replica_uuid(lab, monkeypatch):
    import pymysql.connections

    # A client that answers with mysql_native_password (as if the server had announced it).
    monkeypatch.setattr(pymysql.connections, "_DEFAULT_AUTH_PLUGIN", "mysql_native_password")
    with connect(lab, database="shop") as conn:
        conn.ping(reconnect=False)
        assert query(conn, "SELECT DATABASE()") == [("shop",)]
        conn.select_db("information_schema")
        with pytest.raises(pymysql.err.OperationalError) as err:
            conn.select_db("nope")
        assert err.value.args[0] == 1049
    with pytest.raises(pymysql.err.OperationalError) as err:
        pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password="wrong")
    assert err.value.args[0] == 1045
    assert any("mysql_native_password" in line for line in lab.log_lines())


def test_a_tagged_gtid_set_in_com_binlog_dump_gtid(lab):
    """The client's set in MySQL 8.3+'s tagged encoding (an untagged range and a tagged
    one): the lab decodes it and skips the untagged transactions it names."""
    import uuid

    files = lab.files
    for e in ("e1", "e2", "e3"):
        files.transaction(e)
    sid = uuid.UUID(SERVER_UUID).bytes
    other = uuid.UUID("11111111-2222-3333-4444-555555555555").bytes
    entries = (
        sid + b"\x00" + struct.pack("<QQQ", 1, 1, 3)  # SERVER_UUID:1-2, no tag
        + other + bytes([len(b"blue") << 1]) + b"blue" + struct.pack("<QQQ", 1, 1, 8)  # other:blue:1-7
    )  # fmt: skip
    encoded = struct.pack("<Q", (1 << 56) | (2 << 8) | 1) + entries
    payload = b"\x1e" + struct.pack("<HII", 0x04 | 0x01, 4545, 0) + struct.pack("<QI", 4, len(encoded)) + encoded
    conn = relay_client(lab, server_id=4545)
    conn._connect()
    conn._register()
    conn._start_stream(payload)
    try:
        events = list(conn.events())
    finally:
        conn.close()
    gtids = [struct.unpack_from("<Q", e, 19 + 17)[0] for e in events if header(e)[1] == 33]
    assert gtids == [3]


def test_python_mysql_replication_announces_its_uuid_and_heartbeat(lab):
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import HeartbeatLogEvent

    lab.files.transaction("e1")
    stream = BinLogStreamReader(
        connection_settings=lab.connection_settings(),
        server_id=4646,
        blocking=True,
        resume_stream=True,
        log_file="binlog.000001",
        log_pos=lab.files.pos,
        slave_uuid="aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        slave_heartbeat=0.2,
        only_events=[HeartbeatLogEvent],
    )
    try:
        first = next(iter(stream))
        assert isinstance(first, HeartbeatLogEvent) and first.ident == "binlog.000001"
        with connect(lab) as side:
            assert [(r[0], r[4]) for r in query(side, "SHOW REPLICAS")] == [
                (4646, "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
            ]
    finally:
        stream.close()


def test_a_silent_session_ends_after_its_wait_timeout_and_frees_its_locks(lab):
    """What the lease's `SET SESSION wait_timeout` relies on (connectors/mysql/lease.py)."""
    holder, other = connect(lab), connect(lab)
    try:
        query(holder, "SET SESSION wait_timeout = 1")
        assert query(holder, "SELECT GET_LOCK('lease', 0)") == [(1,)]
        assert query(other, "SELECT GET_LOCK('lease', 5)") == [(1,)]  # within ~1 s
        with pytest.raises(pymysql.err.OperationalError) as err:
            query(holder, "SELECT 1")
        assert err.value.args[0] in (4031, 2013), err.value.args
    finally:
        other.close()


def test_the_relays_lease_on_the_lab(lab):
    """connectors/mysql/lease.py as the relay runs it: one holder, a standby that names the
    holder's connection and takes over when the holder releases."""
    from cdc.lease import LeaseSettings
    from connectors.mysql.lease import MySQLLease, lease_holder

    settings = LeaseSettings(ttl_s=3, renew_s=0.5)
    first = MySQLLease(lab.connection_settings(), "cdc.relay.lab", settings)
    second = MySQLLease(lab.connection_settings(), "cdc.relay.lab", settings)
    try:
        assert first.acquire(lambda: False, lambda holder: None)
        first.hold()
        assert lease_holder("cdc.relay.lab", lab.connection_settings()) == first.conn_id
        waiting: list = []
        result: list = []
        standby = threading.Thread(target=lambda: result.append(second.acquire(lambda: False, waiting.append)))
        standby.start()
        wait_until(lambda: waiting, 5, "the standby to see the holder")
        assert waiting == [first.conn_id]
        assert first.lease is not None and first.lease.lost is None  # confirmations go through
        first.close()
        standby.join(10)
        assert result == [True]
        assert lease_holder("cdc.relay.lab", lab.connection_settings()) == second.conn_id
        assert second.previous(None).closed_while_active  # freed by a close, not a timeout
    finally:
        first.close()
        second.close()


def test_kill_query_ends_a_get_lock_wait_with_null(lab):
    holder, waiter = connect(lab), connect(lab)
    try:
        assert query(holder, "SELECT GET_LOCK('x', 0)") == [(1,)]
        waiter_id = query(waiter, "SELECT CONNECTION_ID()")[0][0]
        got: list = []
        thread = threading.Thread(target=lambda: got.append(query(waiter, "SELECT GET_LOCK('x', 30)")))
        thread.start()
        time.sleep(0.2)
        query(holder, f"KILL QUERY {waiter_id}")
        thread.join(5)
        assert got == [[(None,)]]
        assert query(waiter, "SELECT 1") == [(1,)]  # the session lives on
    finally:
        holder.close()
        waiter.close()


def test_a_restart_keeps_port_and_files_and_forgets_the_login_cache(lab):
    lab.files.transaction("e1")
    port = lab.port
    connect(lab).close()
    lab.restart()
    assert lab.port == port
    with connect(lab) as conn:
        assert query(conn, "SHOW BINARY LOGS")[0][0] == "binlog.000001"
    logins = [line for line in lab.log_lines() if "caching_sha2_password" in line]
    assert "full authentication" in logins[-1], logins


def test_mysql_9_switches_a_native_password_client_to_caching_sha2(lab, monkeypatch):
    import pymysql.connections

    lab.update_state(server_version="9.1.0")
    monkeypatch.setattr(pymysql.connections, "_DEFAULT_AUTH_PLUGIN", "mysql_native_password")
    with connect(lab) as conn:
        assert query(conn, "SELECT VERSION(), @@log_bin, @@autocommit") == [("9.1.0", 1, 1)]
        with pytest.raises(pymysql.err.ProgrammingError):
            query(conn, "SHOW MASTER STATUS")
    assert not any("mysql_native_password" in line for line in lab.log_lines())
    assert any("caching_sha2_password full authentication" in line for line in lab.log_lines())


def test_the_verifiers_plan_of_the_lab(lab):
    """spark_jobs/binlog_source.plan_binlog: the binlog end, the files, the server id and the
    executed GTIDs (after @@gtid_binlog_pos, MariaDB's, is refused)."""
    from spark_jobs.mysql.binlog_plan import plan_binlog

    files = lab.files
    files.transaction("e1")
    files.rotate()
    files.transaction("e2")
    plan = plan_binlog(lab.connection_settings(), server_id_base=7)
    assert plan["server_id"] == 1 and plan["gtid_binlog_pos"] == f"{SERVER_UUID}:1-2"
    first_end = (lab.datadir / "binlog.000001").stat().st_size
    assert plan["files"] == [
        {"file": "binlog.000001", "start": 4, "end": first_end},
        {"file": "binlog.000002", "start": 4, "end": files.pos},
    ]
    assert plan["range_end"] == {"file": "binlog.000002", "pos": files.pos}


def test_a_gtid_dump_from_a_set_ahead_of_the_server_is_refused(lab):
    lab.files.transaction("e1")
    with relay_client(lab) as conn, pytest.raises(BinlogConnectionError) as err:
        list(conn.dump_mysql_gtid(f"{SERVER_UUID}:1-5", blocking=False).events())
    assert "Replica has more GTIDs than the source has" in str(err.value)
    with connect(lab) as c:
        assert query(c, "SELECT @@version_comment LIMIT 1") == [("MySQL Community Server - GPL",)]


def test_tls_when_the_lab_has_a_certificate(tmp_path):
    """verify-identity against the lab's certificate; caching_sha2_password's full login then
    sends the password over TLS (no RSA exchange); the relay's dump client reads over TLS."""
    from cdc.tls import TlsConfig
    from connectors.mysql.client import connect as connect_source
    from connectors.mysql.client import negotiated
    from tests.integration.tls_certs import make_tls_files

    certs = make_tls_files(tmp_path / "tls")
    files = LabFiles(tmp_path / "data")
    files.transaction("e1")
    with MysqlLab.start(datadir=tmp_path / "data", tls_cert=certs.server_cert, tls_key=certs.server_key) as lab:
        tls = TlsConfig(mode="verify-identity", ca_file=str(certs.ca))
        settings = {**lab.connection_settings(), **tls.settings()}
        with connect_source(settings) as conn:
            version, _cipher, verified = negotiated(conn)
            assert version is not None and version.startswith("TLS") and verified
            assert query(conn, "SELECT 1") == [(1,)]
        assert "full authentication (over TLS)" in [line for line in lab.log_lines() if "login" in line][-1]
        with BinlogConnection(lab.host, lab.port, lab.user, lab.password, 4747, read_timeout=10, tls=tls) as conn:
            kinds = [header(e)[1] for e in conn.dump_file("binlog.000001", 4, blocking=False).events()]
        assert conn.tls_version is not None and kinds == [4, 15, 35, 33, 2, 19, 30, 16]


def test_the_relay_publishes_from_the_lab_across_a_rotation(lab, kafka, topic_prefix):
    """`run_relay` against the lab: its handshake, its dump and its checkpoint, with a
    transaction appended while it streams and a rotation (the outbox columns mapped onto the
    test table's: the aggregate type, id and event type are all the `id` column)."""
    from cdc.config import load_config
    from tests.integration.harness import RelayThread, read_topic

    files = lab.files
    files.transaction("e1")
    raw = {
        "source": {"name": f"src-{topic_prefix}", "host": lab.host, "port": lab.port, "user": lab.user,
                   "password_env": "CDC_TEST_MYSQL_PASSWORD", "replica_server_id": 5125,
                   "start": "binlog.000001:4", "heartbeat_s": 0.5},
        "outbox": {"tables": [{"schema": "shop", "table": "outbox", "topic": f"{topic_prefix}.all",
                               "aggregate_type_column": "id", "aggregate_id_column": "id", "type_column": "id"}]},
        "kafka": {"bootstrap": kafka.bootstrap_servers, "dead_letter_topic": f"{topic_prefix}.dlq"},
        "schema_registry": {"url": f"mock://{topic_prefix}"},
        "checkpoint": {"store": "file", "path": str(lab.datadir / "cp.json"), "interval_s": 0.2},
        "topics": {"missing": "auto"},
    }  # fmt: skip
    relay = RelayThread(load_config(raw, {"CDC_TEST_MYSQL_PASSWORD": lab.password}), check=False)
    try:
        relay.wait_delivered(1, timeout=60)
        files.transaction("e2", "e3")
        files.rotate()
        files.transaction("e4")
        relay.wait_delivered(4, timeout=60)
    finally:
        summary = relay.stop()
    assert summary.events_published == 4 and summary.dead_lettered == 0
    assert str(summary.position) == f"binlog.000002:{files.pos}"
    assert sorted(r.key for r in read_topic(kafka.bootstrap_servers, f"{topic_prefix}.all")) == ["e1", "e2", "e3", "e4"]
    assert lab.unknown_statements() == [] and lab.lab_errors() == []


def test_a_dump_from_inside_an_event_is_refused(lab):
    lab.files.transaction("e1")
    with relay_client(lab) as conn, pytest.raises(BinlogConnectionError) as err:
        list(conn.dump_file("binlog.000001", lab.files.pos - 10, blocking=False).events())
    assert "bogus data in log event" in str(err.value)


# -- the lab as MySQL 5.7 and 8.0 -----------------------------------------------------------


def _written_lab(tmp_path: Path, version: str) -> MysqlLab:
    """A lab of `version` with one outbox transaction, written by the lab's own writer."""
    from testbed.mysql_lab.binlog_writer import Column

    lab = MysqlLab.start(version=version, datadir=tmp_path / "data")
    w = lab.writer()
    w.create_table("shop", "outbox", [Column("id", "varchar(36)", nullable=False, key="PRI"), Column("n", "int")])
    with w.transaction() as tx:
        tx.insert("shop", "outbox", [{"id": "e1", "n": 1}])
    return lab


def test_mysql_5_7_logs_in_with_native_password_and_answers_as_5_7(tmp_path, monkeypatch):
    """5.7: mysql_native_password announced (a caching_sha2_password answer is switched to
    it), no binlog_row_metadata (1193) nor the other 8.0 variables, SHOW MASTER STATUS and
    SHOW SLAVE HOSTS (Server_id .. Slave_UUID) answered, SHOW BINARY LOG STATUS and SHOW
    REPLICAS syntax errors, SHOW BINARY LOGS without Encrypted, 5.7's SHOW GRANTS."""
    import pymysql.connections

    with _written_lab(tmp_path, "5.7.44-log") as lab:
        with connect(lab) as conn:
            assert query(conn, "SELECT VERSION(), @@log_slave_updates") == [("5.7.44-log", "ON")]
            for name in ("binlog_row_metadata", "binlog_transaction_compression", "log_replica_updates"):
                with pytest.raises(pymysql.err.OperationalError) as err:
                    query(conn, f"SELECT @@{name}")
                assert err.value.args == (1193, f"Unknown system variable '{name}'")
            assert dict(
                query(
                    conn,
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s,%s,%s,%s)",
                    ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata"),
                )
            ) == {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL"}
            size = (lab.datadir / "binlog.000001").stat().st_size
            gtids = str(lab.state()["gtid_executed"])
            assert query(conn, "SHOW MASTER STATUS") == [("binlog.000001", size, "", "", gtids)]
            assert query(conn, "SHOW BINARY LOGS") == [("binlog.000001", size)]
            for statement in ("SHOW BINARY LOG STATUS", "SHOW REPLICAS"):
                with pytest.raises(pymysql.err.ProgrammingError) as err:
                    query(conn, statement)
                assert err.value.args[0] == 1064
            with conn.cursor() as cur:
                cur.execute("SHOW SLAVE HOSTS")
                assert [d[0] for d in cur.description] == ["Server_id", "Host", "Port", "Master_id", "Slave_UUID"]
            assert [r[0] for r in query(conn, "SHOW GRANTS")] == [
                "GRANT SELECT, RELOAD, PROCESS, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%'"
            ]
        assert any("login cdc@127.0.0.1: mysql_native_password" in line for line in lab.log_lines())
        monkeypatch.setattr(pymysql.connections, "_DEFAULT_AUTH_PLUGIN", "caching_sha2_password")
        with connect(lab) as conn:  # answered with caching_sha2_password: switched to native
            assert query(conn, "SELECT 1") == [(1,)]
        assert not any("caching_sha2_password" in line for line in lab.log_lines())
        with pytest.raises(pymysql.err.OperationalError) as err:
            pymysql.connect(host=lab.host, port=lab.port, user=lab.user, password="wrong")
        assert err.value.args[0] == 1045
        assert lab.unknown_statements() == ["SHOW REPLICAS"] and lab.lab_errors() == []


def test_mysql_8_0_before_8_0_22_lists_replicas_only_as_slave_hosts(tmp_path):
    """8.0.17: SHOW MASTER STATUS and SHOW SLAVE HOSTS (SHOW REPLICAS is 8.0.22's),
    binlog_row_metadata known, Transaction_payload's variable not yet (8.0.20)."""
    with _written_lab(tmp_path, "8.0.17") as lab, connect(lab) as conn:
        assert query(conn, "SELECT @@binlog_row_metadata") == [("FULL",)]
        with pytest.raises(pymysql.err.OperationalError):
            query(conn, "SELECT @@binlog_transaction_compression")
        assert query(conn, "SHOW MASTER STATUS")[0][0] == "binlog.000001"
        with conn.cursor() as cur:
            cur.execute("SHOW SLAVE HOSTS")
            assert cur.description[0][0] == "Server_id"
        with pytest.raises(pymysql.err.ProgrammingError):
            query(conn, "SHOW REPLICAS")
        assert [r[0] for r in query(conn, "SHOW BINARY LOGS")] == ["binlog.000001"]


@pytest.mark.parametrize("version", ["5.7.44-log", "8.0.17", "8.0.40"])
def test_cdc_check_passes_against_the_lab_as_5_7_and_8_0(version, kafka, tmp_path):
    """`cdc check` as 5.7 (no binlog_row_metadata: passes, saying the names come from
    information_schema) and as 8.0 before and after 8.0.22 (SHOW SLAVE HOSTS / SHOW REPLICAS)."""
    with _written_lab(tmp_path, version) as lab:
        result = _cdc_check(lab, kafka, tmp_path)
        text = result.stdout + result.stderr
        assert result.returncode == 0, text
        assert "Traceback" not in text
        lines = {line[4:].split(":")[0].strip(): line for line in result.stdout.splitlines() if line.strip()}
        for name in ("connect", "log_bin", "binlog_format", "binlog_row_metadata", "replica_server_id",
                     "grant_replication_slave", "grant_replication_client", "table shop.outbox", "xa_undecided"):  # fmt: skip
            assert name in lines, result.stdout
        if version.startswith("5.7"):
            assert "information_schema" in lines["binlog_row_metadata"], lines["binlog_row_metadata"]
        assert lab.unknown_statements() == [] and lab.lab_errors() == []
