"""Passwords with characters beyond ASCII, sent as UTF-8 wherever a password goes (as the
`mariadb` client, RabbitMQ's and NATS's own tools send them): a MariaDB user logs in for
`cdc check` and for the relay's binlog (replication) connection, a RabbitMQ user over the
stream protocol, a NATS user; and a `cdc check` whose MySQL login fails does not say the
lease is free (it could not ask)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from cdc.config import load_config
from connectors.mysql.client import connect
from tests.integration.harness import OUTBOX_DDL, ROOT, RelayThread, _to_toml, insert_events
from tests.integration.nats_harness import create_streams, nats_raw_config, stream_records
from tests.integration.rabbit_streams import create_topic

pytestmark = pytest.mark.integration

# é and ü are two bytes in UTF-8 and one in latin-1; 日本 has no latin-1 form at all
PASSWORD = "pässwörd-日本-é"


@pytest.fixture
def utf8_nats():
    from testbed.nats import EmbeddedNats

    class Utf8Nats(EmbeddedNats):
        password = PASSWORD

    with Utf8Nats.start() as server:
        yield server


def _mariadb_user(mariadb, database: str) -> str:
    user = f"u{uuid.uuid4().hex[:8]}"
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (PASSWORD,))
        cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{user}'@'%'")
    # the server's own client logs in with it (it sends UTF-8)
    done = subprocess.run(
        ["mariadb", "-h", mariadb.host, "-P", str(mariadb.port), "-u", user, f"-p{PASSWORD}", "-e", "SELECT 1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return user


def test_a_mysql_and_nats_password_beyond_ascii(mariadb, utf8_nats, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    user = _mariadb_user(mariadb, database)
    settings = {"host": mariadb.host, "port": mariadb.port, "user": user, "password": PASSWORD}
    connect(settings).close()  # PyMySQL sent latin-1 before: 1045 access denied

    create_streams(utf8_nats, {f"{topic_prefix}_events": [f"{topic_prefix}.order"]})
    create_streams(utf8_nats, {f"{topic_prefix}_dlq": [f"{topic_prefix}.dlq"]})
    raw = nats_raw_config(mariadb, utf8_nats, database, topic_prefix, tmp_path / "cp.json")
    raw["source"]["user"] = user
    env = {"CDC_TEST_MYSQL_PASSWORD": PASSWORD, "CDC_TEST_NATS_PASSWORD": PASSWORD}

    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    check = subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", "check", "--config", str(path)],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"ok   connect: connected to {mariadb.host}:{mariadb.port} as {user!r}" in check.stdout, check.stdout
    assert "ok   lease:" in check.stdout and "FAIL nats" not in check.stdout, check.stdout
    assert PASSWORD not in check.stdout + check.stderr

    # the relay's binlog connection (COM_BINLOG_DUMP after its own login) and the NATS sink
    relay = RelayThread(load_config(raw, env), check=False)
    with mariadb.connect(database) as conn:
        insert_events(conn, "outbox", [(str(uuid.uuid4()), "order", f"k{i}", "Happened", "{}") for i in range(5)])
        conn.commit()
    relay.wait_delivered(5, timeout=120)
    relay.stop()
    assert len(stream_records(utf8_nats, [f"{topic_prefix}.order"])) == 5

    # a failed login: the lease is not said to be free
    wrong = subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", "check", "--config", str(path)],
        cwd=ROOT, env={**os.environ, **env, "CDC_TEST_MYSQL_PASSWORD": "wrong-é"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert wrong.returncode == 2
    assert "FAIL connect:" in wrong.stdout, wrong.stdout
    assert "ok   lease" not in wrong.stdout and "is free" not in wrong.stdout, wrong.stdout
    assert "warn lease: not checked" in wrong.stdout, wrong.stdout


def test_a_rabbitmq_password_beyond_ascii(rabbitmq, topic_prefix):
    from connectors.rabbitmq.stream_reader import RabbitStreamReader, StreamSettings

    user = f"u{uuid.uuid4().hex[:8]}"
    # RabbitMQ's internal users take the password as the UTF-8 binary (rabbitmqctl add_user)
    rabbitmq.ctl_eval(
        f'rabbit_auth_backend_internal:add_user(<<"{user}">>, <<"{PASSWORD}"/utf8>>, <<"cdc-test">>), '
        f'rabbit_auth_backend_internal:set_permissions(<<"{user}">>, <<"/">>, <<".*">>, <<".*">>, <<".*">>, '
        '<<"cdc-test">>).'
    )
    topic = f"{topic_prefix}.order"
    create_topic(rabbitmq, topic)
    reader = RabbitStreamReader(StreamSettings("127.0.0.1", rabbitmq.stream_port, "/", user, PASSWORD))
    try:
        assert reader.partition_count(topic) == 1
        assert reader.watermarks(topic, 0) == (0, 0)
    finally:
        reader.close()
