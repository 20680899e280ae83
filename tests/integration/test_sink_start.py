"""`cdc run` starting while its broker (RabbitMQ Streams, NATS JetStream) is not there
(docs/sinks.md): against a port that refuses, it waits like a running relay, then fails
with one line naming the broker, and nothing else on stderr but its log lines (no
traceback of the reader process, no asyncio "Task was destroyed"); started while the
broker is down, it waits, and publishes everything exactly once when the broker is back;
a SIGTERM during that wait is a clean stop (exit 0). Kafka's start is not here: librdkafka
connects again by itself and a relay on a refused bootstrap waits without end, running or
starting (tests/integration/test_delivery_health.py)."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integration.harness import OUTBOX_DDL, RelayProcess, insert_events, wait_until
from tests.integration.independent_checker import check, committed_outbox_events
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config
from tests.integration.nats_harness import stream_records as nats_records
from tests.integration.rabbit_streams import create_topic, rabbit_env, rabbit_raw_config
from tests.integration.rabbit_streams import stream_records as rabbit_records
from tests.integration.test_cli import cdc, free_port

pytestmark = pytest.mark.integration

_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) cdc[\w.]*: ")


def _outbox(mariadb, database: str) -> None:
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))


def _write(mariadb, database: str, n: int, aggregate: str = "order") -> None:
    with mariadb.connect(database) as conn:
        for i in range(n):
            insert_events(conn, "outbox", [(str(uuid.uuid4()), aggregate, f"k{i % 5}", "Happened", "{}")])
            conn.commit()


def _config(kind: str, mariadb, server, database: str, prefix: str, checkpoint: Path, timeout_s: float):
    if kind == "rabbitmq":
        raw = rabbit_raw_config(
            mariadb, server, database, prefix, checkpoint,
            sink__rabbitmq_stream__publish_timeout_s=timeout_s, relay__reconnect_timeout_s=timeout_s,
        )  # fmt: skip
        return raw, rabbit_env(mariadb, server)
    raw = nats_raw_config(
        mariadb, server, database, prefix, checkpoint,
        nats__delivery_timeout_s=timeout_s, relay__reconnect_timeout_s=timeout_s,
    )  # fmt: skip
    return raw, nats_env(mariadb, server)


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_a_refused_port_is_waited_on_then_one_line(kind, mariadb, database, topic_prefix, tmp_path):
    from tests.integration.harness import _to_toml

    _outbox(mariadb, database)
    port = free_port()
    server = SimpleNamespace(
        host="127.0.0.1", stream_port=port, user="cdc", password="pw", url=f"nats://127.0.0.1:{port}"
    )
    raw, env = _config(kind, mariadb, server, database, topic_prefix, tmp_path / "cp.json", 4.0)
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    _write(mariadb, database, 1)  # a message to wait for (after the start position): an idle relay needs no broker
    t0 = time.monotonic()
    result = cdc(["run", "--config", str(path), "--skip-check"], env, timeout=120)
    took = time.monotonic() - t0
    assert result.returncode == 1, result.stderr
    assert took >= 4.0, f"gave up after {took:.1f} s, before the 4 s timeout: {result.stderr}"
    assert "Traceback" not in result.stderr and "asyncio" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("cdc: ")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], result.stderr
    assert "4 s" in errors[0], errors[0]
    others = [line for line in lines if not line.startswith("cdc: ") and not _LOG_LINE.match(line)]
    assert others == [], result.stderr


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_a_start_while_the_broker_is_down_waits_for_it(kind, request, mariadb, database, topic_prefix, tmp_path):
    server = request.getfixturevalue("rabbitmq" if kind == "rabbitmq" else "nats_server")
    _outbox(mariadb, database)
    topic, dlq = f"{topic_prefix}.order", f"{topic_prefix}.dlq"
    if kind == "rabbitmq":
        create_topic(server, topic)
        create_topic(server, dlq)
    else:
        create_streams(server, {f"{topic_prefix}_events": [topic], f"{topic_prefix}_dlq": [dlq]})
    raw, env = _config(kind, mariadb, server, database, topic_prefix, tmp_path / "cp.json", 90.0)
    # a first run: the checkpoint names the topic, so a start reads its streams (recovery)
    first = RelayProcess(raw, env, tmp_path / "first")
    _write(mariadb, database, 10)
    records = rabbit_records if kind == "rabbitmq" else nats_records
    wait_until(lambda: len(records(server, [topic])) == 10, 120, "the first run's 10 messages")
    assert first.terminate() == 0, first.log_text()

    server.kill()
    try:
        # SIGTERM while the start waits on the broker: a clean stop
        stopped = RelayProcess(raw, env, tmp_path / "stopped")
        wait_until(lambda: "trying again" in stopped.log_text() or not stopped.alive(), 120, "the start waiting")
        assert stopped.alive(), stopped.log_text()
        assert stopped.terminate(timeout=30) == 0, stopped.log_text()
        assert "stopped while waiting for" in stopped.log_text()
        assert "Traceback" not in stopped.log_text() and "asyncio" not in stopped.log_text(), stopped.log_text()

        # a start that waits until the broker is back, then publishes
        waiting = RelayProcess(raw, env, tmp_path / "waiting")
        _write(mariadb, database, 20)
        wait_until(lambda: "trying again" in waiting.log_text() or not waiting.alive(), 120, "the start waiting")
        time.sleep(2)  # the wait goes on (two more attempts at least)
        assert waiting.alive(), waiting.log_text()
    finally:
        server.restart()
    wait_until(lambda: len(records(server, [topic])) >= 30, 180, "30 messages after the broker came back")
    assert waiting.terminate() == 0, waiting.log_text()
    file, pos = raw["source"]["start"].split(":")
    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=file, start_pos=int(pos))
    result = check(committed, records(server, [topic, dlq]))
    assert result.committed == 30 and result.clean, result.summary()
