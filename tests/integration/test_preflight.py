"""`cdc check` (and `cdc run`'s refusal at start) against real servers set up wrong.

Each failure must be one line that names the fix, the exit status 2, and no traceback.
Servers with other settings than the session's are started here, once per module, on
first use (about a second each).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cdc.checkpoint import Checkpoint
from cdc.position import BinlogPosition
from connectors.checkpoint_stores import FileCheckpointStore
from connectors.mysql.client import binlog_end
from testbed.mariadb import EmbeddedMariaDB
from tests.integration.harness import (
    OUTBOX_DDL,
    RelayProcess,
    _to_toml,
    env_for,
    master_position,
    relay_raw_config,
    wait_until,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# -- servers with other settings --------------------------------------------------------


@pytest.fixture(scope="module")
def binlog_off_server():
    with EmbeddedMariaDB.start(server_id=11, extra_args=["--skip-log-bin"]) as db:
        yield db


@pytest.fixture(scope="module")
def statement_minimal_server():
    with EmbeddedMariaDB.start(
        server_id=12,
        extra_args=["--binlog-format=STATEMENT", "--binlog-row-image=MINIMAL", "--binlog-row-metadata=MINIMAL"],
    ) as db:
        yield db


@pytest.fixture(scope="module")
def purge_server():
    """A server of its own: the purge test removes binlogs, which the session's server keeps."""
    with EmbeddedMariaDB.start(server_id=13) as db:
        yield db


# -- helpers ------------------------------------------------------------------------------


def cdc(args: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_config(tmp_path: Path, raw: dict, name: str = "relay.toml") -> Path:
    path = tmp_path / name
    path.write_text(_to_toml(raw))
    return path


def make_outbox(db, database: str, table: str = "outbox", ddl: str = OUTBOX_DDL) -> None:
    db.create_database(database)
    with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(ddl.format(name=table))


def raw_for(server, mariadb, kafka, database: str, prefix: str, tmp_path: Path, **overrides) -> dict:
    """A relay config pointed at `server` (which may have binary logging off, so the
    session server names the start position and `start` is set explicitly)."""
    raw = relay_raw_config(mariadb, kafka, database, prefix, tmp_path / "cp.json", **overrides)
    raw["source"]["port"] = server.port
    raw["source"]["start"] = overrides.get("source__start", "latest")
    return raw


def check(tmp_path: Path, raw: dict, env: dict[str, str]) -> subprocess.CompletedProcess:
    return cdc(["check", "--config", str(write_config(tmp_path, raw))], env)


def failed_lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """`FAIL <name>: <message>` lines of `cdc check`, by check name."""
    out = {}
    for line in result.stdout.splitlines():
        if line.startswith("FAIL "):
            name, _, message = line[5:].partition(": ")
            out[name.strip()] = message
    return out


def assert_refused(result: subprocess.CompletedProcess, expected: dict[str, list[str]]) -> dict[str, str]:
    """Exit 2, no traceback, and each named check FAILs with a message holding every fragment."""
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert result.returncode == 2, f"exit {result.returncode}: {text}"
    failed = failed_lines(result)
    for name, fragments in expected.items():
        assert name in failed, f"check {name!r} did not fail: {result.stdout}"
        for fragment in fragments:
            assert fragment in failed[name], f"{name}: {fragment!r} not in {failed[name]!r}"
    assert f"{len(failed)} check(s) failed" in result.stderr
    return failed


# -- the checks ---------------------------------------------------------------------------


def test_passing_check_prints_ok_lines_and_exits_0(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    result = check(tmp_path, raw, env_for(mariadb))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines and all(line.startswith(("ok ", "warn ")) for line in lines), result.stdout
    names = {line[4:].split(":")[0].strip() for line in lines}
    for name in (
        "connect",
        "log_bin",
        "binlog_format",
        "binlog_row_image",
        "binlog_row_metadata",
        "replica_server_id",
        "grant_replication_slave",
        "grant_replication_client",
        f"table {database}.outbox",
        "start_position",
        "session_binlog_format",
        "xa_undecided",
    ):
        assert name in names, f"no ok line for {name}: {result.stdout}"
    assert "Traceback" not in result.stderr


def warn_lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    return {
        line[5:].partition(": ")[0].strip(): line[5:].partition(": ")[2]
        for line in result.stdout.splitlines()
        if line.startswith("warn ")
    }


def test_undecided_xa_transactions_are_listed_with_their_age_and_accounts_that_can_log_statements_are_named(
    mariadb, kafka, database, topic_prefix, tmp_path
):
    """Warnings pass (exit 0) but say what holds the relay back: each XA transaction
    prepared and undecided (aged from the checkpoint where it recorded it), and the
    accounts that may SET SESSION binlog_format."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
        cur.execute("SELECT @@server_id")
        server_id = int(cur.fetchone()[0])
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    result = check(tmp_path, raw, env_for(mariadb))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   xa_undecided: no XA transaction is prepared and undecided" in result.stdout
    assert "'root'@'localhost'" in warn_lines(result)["session_binlog_format"]
    gtrid = uuid.uuid4().hex[:8]
    other = uuid.uuid4().hex[:8]
    at = master_position(mariadb)
    for xid in (gtrid, other):
        with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"XA START '{xid}'")
            cur.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES (%s, 'order', 'k', 't', '{}')",
                (xid,),
            )
            cur.execute(f"XA END '{xid}'")
            cur.execute(f"XA PREPARE '{xid}'")
    try:
        FileCheckpointStore(tmp_path / "cp.json").save(
            Checkpoint(
                raw["source"]["name"],
                BinlogPosition.parse(at),
                server_id=server_id,
                xa_held=((f"X'{gtrid.encode().hex()}',X'',1", at, int(time.time()) - 125),),
            )
        )
        result = check(tmp_path, raw, env_for(mariadb))
        assert result.returncode == 0, result.stdout + result.stderr
        line = warn_lines(result)["xa_undecided"]
        assert line.startswith("2 XA transaction(s) prepared and undecided"), line
        assert f"X'{gtrid.encode().hex()}',X'',1 prepared at {at} 12" in line  # 125 s ago, give or take
        assert f"X'{other.encode().hex()}',X'',1 (not in the checkpoint" in line
        assert "XA COMMIT or XA ROLLBACK" in line and "Traceback" not in result.stderr
    finally:
        with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
            for xid in (gtrid, other):
                cur.execute(f"XA ROLLBACK '{xid}'")


def test_binlog_off_is_refused(binlog_off_server, mariadb, kafka, topic_prefix, tmp_path):
    database = f"p_{uuid.uuid4().hex[:8]}"
    make_outbox(binlog_off_server, database)
    raw = raw_for(binlog_off_server, mariadb, kafka, database, topic_prefix, tmp_path)
    result = check(tmp_path, raw, env_for(mariadb))
    assert_refused(result, {"log_bin": ["binary logging is off", "--log-bin"]})
    # `cdc run` refuses to start the same way: one line per problem, exit 2.
    run = cdc(["run", "--config", str(write_config(tmp_path, raw, "run.toml"))], env_for(mariadb))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert any(line.startswith("cdc: ") and "--log-bin" in line for line in run.stderr.splitlines()), run.stderr


def test_statement_format_and_minimal_row_image_and_metadata_are_refused(
    statement_minimal_server, mariadb, kafka, topic_prefix, tmp_path
):
    database = f"p_{uuid.uuid4().hex[:8]}"
    make_outbox(statement_minimal_server, database)
    raw = raw_for(statement_minimal_server, mariadb, kafka, database, topic_prefix, tmp_path)
    result = check(tmp_path, raw, env_for(mariadb))
    failed = assert_refused(
        result,
        {
            "binlog_format": ["STATEMENT", "binlog_format=ROW"],
            "binlog_row_image": ["MINIMAL", "binlog_row_image=FULL"],
            "binlog_row_metadata": ["MINIMAL", "binlog_row_metadata=FULL"],
        },
    )
    assert "log_bin" not in failed


def test_replica_server_id_equal_to_the_servers_own_is_refused(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
        cur.execute("SELECT @@server_id")
        own = int(cur.fetchone()[0])
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", source__replica_server_id=own)
    result = check(tmp_path, raw, env_for(mariadb))
    failed = assert_refused(result, {"replica_server_id": [str(own), "server's own server_id", "pick another"]})
    assert set(failed) == {"replica_server_id"}, failed


def test_missing_grants_are_refused_with_the_grant_to_run(mariadb, kafka, database, topic_prefix, tmp_path):
    user = f"nogrant_{uuid.uuid4().hex[:6]}"
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
        cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'x'")
        cur.execute(f"GRANT SELECT ON `{database}`.`outbox` TO '{user}'@'127.0.0.1'")
    try:
        raw = relay_raw_config(
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path / "cp.json",
            source__user=user,
            source__password_env="CDC_TEST_NOGRANT_PASSWORD",
        )
        result = check(tmp_path, raw, {"CDC_TEST_NOGRANT_PASSWORD": "x"})
        failed = assert_refused(
            result,
            {
                "grant_replication_slave": [user, "GRANT REPLICATION SLAVE ON *.*"],
                "grant_replication_client": [user, "GRANT BINLOG MONITOR ON *.*"],
            },
        )
        assert f"table {database}.outbox" not in failed, "SELECT on the outbox table was granted"
    finally:
        with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")


def grant_user(mariadb, database: str, grants: list[str], user: str | None = None) -> str:
    """A user of its own ('<user>'@'127.0.0.1', password 'x') with exactly `grants`
    (each the part of a GRANT statement before TO)."""
    user = user or f"g_{uuid.uuid4().hex[:8]}"
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'x'")
        for grant in grants:
            cur.execute(f"GRANT {grant} TO '{user}'@'127.0.0.1'")
    return user


def drop_user(mariadb, user: str) -> None:
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")


def check_as(user: str, mariadb, kafka, database, topic_prefix, tmp_path, **overrides) -> subprocess.CompletedProcess:
    raw = relay_raw_config(
        mariadb,
        kafka,
        database,
        topic_prefix,
        tmp_path / "cp.json",
        source__user=user,
        source__password_env="CDC_TEST_GRANT_PASSWORD",
        **overrides,
    )
    return check(tmp_path, raw, {"CDC_TEST_GRANT_PASSWORD": "x"})


def test_replication_slave_admin_is_not_replication_slave(mariadb, kafka, database, topic_prefix, tmp_path):
    """REPLICATION SLAVE ADMIN (and the other privileges whose names hold "REPLICATION
    SLAVE") do not let a user stream the binlog: the grant is parsed, not searched."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = grant_user(
        mariadb,
        database,
        [
            "REPLICATION SLAVE ADMIN, BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.*",
            f"SELECT ON `{database}`.`outbox`",
        ],
    )
    try:
        result = check_as(user, mariadb, kafka, database, topic_prefix, tmp_path)
        failed = assert_refused(
            result,
            {
                "grant_replication_slave": [
                    f"user '{user}' lacks REPLICATION SLAVE: GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%'"
                ]
            },
        )
        assert set(failed) == {"grant_replication_slave"}, failed
    finally:
        drop_user(mariadb, user)


def test_replication_slave_on_one_schema_only_does_not_count(mariadb, kafka, database, topic_prefix, tmp_path):
    """ALL PRIVILEGES counts as every privilege only ON *.*: on one schema it holds no
    REPLICATION SLAVE (a global privilege)."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = grant_user(
        mariadb, database, ["BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.*", f"ALL PRIVILEGES ON `{database}`.*"]
    )
    try:
        result = check_as(user, mariadb, kafka, database, topic_prefix, tmp_path)
        failed = assert_refused(result, {"grant_replication_slave": [f"user '{user}' lacks REPLICATION SLAVE"]})
        assert set(failed) == {"grant_replication_slave"}, failed
    finally:
        drop_user(mariadb, user)


def test_the_grants_the_readme_documents_pass(mariadb, kafka, database, topic_prefix, tmp_path):
    """The README's grants for MariaDB (REPLICATION SLAVE, BINLOG MONITOR, REPLICATION
    MASTER ADMIN, SELECT on the outbox table), each in its own GRANT: every check passes."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    readme = (ROOT / "README.md").read_text()
    for privilege in ("REPLICATION SLAVE", "BINLOG MONITOR", "REPLICATION MASTER ADMIN"):
        assert f"`{privilege}`" in readme, f"README does not document {privilege}"
    user = grant_user(
        mariadb,
        database,
        [
            "REPLICATION SLAVE ON *.*",
            "BINLOG MONITOR ON *.*",
            "REPLICATION MASTER ADMIN ON *.*",
            f"SELECT ON `{database}`.`outbox`",
        ],
    )
    try:
        result = check_as(user, mariadb, kafka, database, topic_prefix, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok   grant_replication_slave: REPLICATION SLAVE granted" in result.stdout, result.stdout
        assert "ok   replica_server_id: replica server id" in result.stdout, result.stdout
    finally:
        drop_user(mariadb, user)


def test_show_slave_hosts_denied_is_a_failure_not_a_free_replica_id(mariadb, kafka, database, topic_prefix, tmp_path):
    """A user who may not list the replicas cannot be told the replica id is free: the
    check fails (exit 2) naming the grant, and `cdc run` refuses to start the same way."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = grant_user(
        mariadb, database, ["REPLICATION SLAVE, BINLOG MONITOR ON *.*", f"SELECT ON `{database}`.`outbox`"]
    )
    try:
        result = check_as(user, mariadb, kafka, database, topic_prefix, tmp_path)
        rid = 5000 + (hash(topic_prefix) % 10000)
        expected = (
            f"cannot verify that replica server id {rid} is free: SHOW SLAVE HOSTS is denied to user "
            f"'{user}': GRANT REPLICATION MASTER ADMIN ON *.* TO '{user}'@'%' (MariaDB 10.5.2+; MySQL: "
            f"REPLICATION SLAVE), or make sure no other replica uses id {rid}"
        )
        failed = assert_refused(result, {"replica_server_id": [expected]})
        assert failed == {"replica_server_id": expected}, failed
        raw = relay_raw_config(
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path / "cp.json",
            source__user=user,
            source__password_env="CDC_TEST_GRANT_PASSWORD",
        )
        run = cdc(["run", "--config", str(write_config(tmp_path, raw, "run.toml"))], {"CDC_TEST_GRANT_PASSWORD": "x"})
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stdout + run.stderr
        assert [line for line in run.stderr.splitlines() if line.strip()] == [f"cdc: {expected}"], run.stderr
    finally:
        drop_user(mariadb, user)


def test_missing_outbox_table_is_refused(mariadb, kafka, database, topic_prefix, tmp_path):
    raw = relay_raw_config(
        mariadb,
        kafka,
        database,
        topic_prefix,
        tmp_path / "cp.json",
        outbox={"tables": [{"schema": database, "table": "no_such_outbox"}]},
    )
    result = check(tmp_path, raw, env_for(mariadb))
    failed = assert_refused(
        result,
        {
            f"table {database}.no_such_outbox": [
                f"outbox table {database}.no_such_outbox does not exist: create it, or fix outbox.tables"
            ]
        },
    )
    assert set(failed) == {f"table {database}.no_such_outbox"}, failed


def test_a_missing_table_the_user_may_not_see_is_not_reported_as_a_missing_grant(
    mariadb, kafka, database, topic_prefix, tmp_path
):
    """With SELECT on its outbox table only, the relay's user gets "SELECT command denied"
    for a table that does not exist (the server does not tell it which): the line says
    both, and names the tables of that schema the user can see."""
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = grant_user(
        mariadb,
        database,
        ["REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.*", f"SELECT ON `{database}`.`outbox`"],
    )
    try:
        result = check_as(
            user,
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path,
            outbox={"tables": [{"schema": database, "table": "outbx"}]},
        )
        name = f"table {database}.outbx"
        expected = (
            f"outbox table {database}.outbx does not exist or user '{user}' may not read it (the server "
            f"does not tell this user which; of {database}'s tables it sees outbox): create it, or fix "
            f"outbox.tables, or GRANT SELECT ON `{database}`.`outbx` TO '{user}'@'%'"
        )
        failed = assert_refused(result, {name: [expected]})
        assert failed == {name: expected}, failed
    finally:
        drop_user(mariadb, user)


def test_an_existing_table_the_user_may_not_read_names_the_grant(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = grant_user(
        mariadb,
        database,
        ["REPLICATION SLAVE, BINLOG MONITOR, REPLICATION MASTER ADMIN ON *.*", f"INSERT ON `{database}`.`outbox`"],
    )
    try:
        result = check_as(user, mariadb, kafka, database, topic_prefix, tmp_path)
        name = f"table {database}.outbox"
        expected = f"user '{user}' cannot read {database}.outbox: GRANT SELECT ON `{database}`.`outbox` TO '{user}'@'%'"
        failed = assert_refused(result, {name: [expected]})
        assert failed == {name: expected}, failed
    finally:
        drop_user(mariadb, user)


def test_outbox_table_lacking_a_column_is_refused(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE outbox (id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, "
            "aggregateid VARCHAR(255), payload LONGTEXT) ENGINE=InnoDB"
        )
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    result = check(tmp_path, raw, env_for(mariadb))
    failed = assert_refused(result, {f"table {database}.outbox": ["lacks column(s) type", "type_column"]})
    assert set(failed) == {f"table {database}.outbox"}, failed


def test_purged_start_position_is_refused_naming_the_lost_range(purge_server, mariadb, kafka, topic_prefix, tmp_path):
    db = purge_server
    database = f"p_{uuid.uuid4().hex[:8]}"
    make_outbox(db, database)
    old = master_position(db)
    with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
            "VALUES ('lost-1', 'order', 'a', 'created', 'x')"
        )
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("FLUSH BINARY LOGS")
        newest = binlog_end(cur)[0]

        def purged() -> bool:
            # MariaDB keeps a binlog until its binlog checkpoint is written (asynchronously
            # after a rotation): retry the purge until only the newest remains.
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            return [r[0] for r in cur.fetchall()] == [newest]

        wait_until(purged, 30, f"binlogs before {newest} purged", interval=0.1)
    raw = raw_for(db, mariadb, kafka, database, topic_prefix, tmp_path, source__start=old)
    lost = [old, f"{newest}:4"]
    result = check(tmp_path, raw, env_for(db))
    failed = assert_refused(result, {"start_position": ["purged", *lost]})
    assert set(failed) == {"start_position"}, failed

    # `cdc run` refuses to start, with the same message, exit 2, one line.
    run = cdc(["run", "--config", str(write_config(tmp_path, raw, "run.toml"))], env_for(db))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    problems = [line for line in run.stderr.splitlines() if line.startswith("cdc: ")]
    assert len(problems) == 1 and "purged" in problems[0] and all(p in problems[0] for p in lost), run.stderr

    # Without the preflight, the relay itself refuses the start position (never skips it).
    relay = RelayProcess(raw, env_for(db), tmp_path / "skip-check")
    code = relay.wait(60)
    log = relay.log_text()
    assert code == 2, log
    assert "Traceback" not in log
    refusal = [line for line in log.splitlines() if line.startswith("cdc: ")]
    assert len(refusal) == 1 and "purged" in refusal[0] and all(p in refusal[0] for p in lost), log
