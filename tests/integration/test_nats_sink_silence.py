"""The NATS publisher's two timeouts against a real nats-server (connectors/nats/sink.py):
a connection silent for `ack_timeout_s` while messages wait for their answer is left for
a new one, which sends every unanswered message again, oldest first; a message unanswered
for `delivery_timeout_s` fails, with every later one, and the relay exits 1 with one line.

The silence is made by a TCP proxy (tests/integration/harness.py `TcpProxy.freeze`): the
connection open at the time stops forwarding in both directions, so what the publisher
sent on it never reaches the server and only the copies sent again on a new connection
can be stored; without the move to a new connection, nothing sent after the freeze is
ever answered."""

from __future__ import annotations

import time
import uuid

import pytest

from cdc.config import NatsJetStreamConfig, Secret
from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE
from spark_jobs.nats.source import plan_nats, read_range
from tests.integration.harness import OUTBOX_DDL, RelayProcess, TcpProxy, insert_events, wait_until
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config

pytestmark = [pytest.mark.integration]


@pytest.fixture
def nats_own():
    """A server of this test's own: it is killed or paused."""
    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:
        yield server


def _config(server, port: int | None = None, **timeouts: float) -> NatsJetStreamConfig:
    s = server.connect_settings()
    servers = (f"nats://127.0.0.1:{port}",) if port else tuple(s["servers"])
    return NatsJetStreamConfig(servers=servers, user=s["user"], password=Secret(s["password"]), **timeouts)


def _publish(publisher, subject: str, first: int, count: int, reports: list) -> None:
    for n in range(first, first + count):
        headers = [(H_SOURCE, b"s"), (H_FILE, b"bin.000001"), (H_POS, str(n).encode()), (H_ROW, b"0")]
        publisher.publish(subject, b"k", b"v%d" % n, headers, reports.append)


def _stored(server, subject: str) -> list[int]:
    s = server.connect_settings()
    [part] = plan_nats(s, [subject])["partitions"]
    return [int(dict(r.headers())[H_POS]) for r in read_range(s, subject, part["stream"], part["low"], part["high"])]


def test_a_silent_connection_is_left_after_ack_timeout_and_the_unanswered_are_sent_again(nats_own, topic_prefix):
    from connectors.nats.sink import NatsJetStreamPublisher

    subject = f"{topic_prefix}.order"
    create_streams(nats_own, {f"{topic_prefix}_events": [subject]})
    with TcpProxy(nats_own.port) as proxy:
        publisher = NatsJetStreamPublisher(_config(nats_own, proxy.port, ack_timeout_s=1.0, delivery_timeout_s=60.0))
        reports: list = []
        try:
            _publish(publisher, subject, 1, 100, reports)
            assert publisher.flush(30) == 0
            proxy.freeze()  # the open connection goes silent; a new one is forwarded
            t0 = time.monotonic()
            _publish(publisher, subject, 101, 200, reports)
            left = publisher.flush(30)
            took = time.monotonic() - t0
        finally:
            publisher.close()
    assert left == 0, f"{left} of the 200 messages sent on the silent connection never answered"
    assert publisher.reconnects == 1
    assert took >= 1.0, f"left the connection after {took:.2f} s, before ack_timeout_s"
    assert len(reports) == 300 and not [r for r in reports if r.failure is not None]
    assert _stored(nats_own, subject) == list(range(1, 301))


def test_a_server_gone_past_delivery_timeout_fails_every_waiting_message(nats_own, topic_prefix):
    """Killed and not back (connections refused): the wait for a connection is bounded,
    and messages handed over after the connection broke fail too, not only those sent."""
    from connectors.nats.sink import NatsJetStreamPublisher

    subject = f"{topic_prefix}.order"
    create_streams(nats_own, {f"{topic_prefix}_events": [subject]})
    publisher = NatsJetStreamPublisher(_config(nats_own, ack_timeout_s=1.0, delivery_timeout_s=3.0))
    reports: list = []
    try:
        _publish(publisher, subject, 1, 10, reports)
        assert publisher.flush(30) == 0
        nats_own.kill()
        t0 = time.monotonic()
        _publish(publisher, subject, 11, 10, reports)
        time.sleep(0.5)
        _publish(publisher, subject, 21, 10, reports)  # after the pump found the connection gone
        left = publisher.flush(20)
        took = time.monotonic() - t0
    finally:
        publisher.close()
    assert left == 0, f"{left} messages neither answered nor failed {took:.1f} s after the server died"
    assert took < 3.0 + 5.0, f"failed after {took:.1f} s, delivery_timeout_s is 3"
    failed = [r for r in reports if r.failure is not None]
    assert len(failed) == 20 and {r.failure.code for r in failed} == {"TIMED_OUT"}
    assert "delivery_timeout_s" in failed[0].failure.message


def test_the_relay_exits_1_with_one_line_when_the_server_stays_silent_past_delivery_timeout(
    mariadb, nats_own, database, topic_prefix, tmp_path
):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    create_streams(nats_own, {f"{topic_prefix}_events": [f"{topic_prefix}.order"]})
    create_streams(nats_own, {f"{topic_prefix}_dlq": [f"{topic_prefix}.dlq"]})
    checkpoint = tmp_path / "cp.json"
    raw = nats_raw_config(
        mariadb, nats_own, database, topic_prefix, checkpoint, nats__ack_timeout_s=1, nats__delivery_timeout_s=4
    )

    def write(n: int) -> None:
        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(str(uuid.uuid4()), "order", "k", "Happened", "{}") for _ in range(n)])
            conn.commit()

    relay = RelayProcess(raw, nats_env(mariadb, nats_own), tmp_path / "relay")
    try:
        write(5)
        subject = f"{topic_prefix}.order"
        wait_until(lambda: len(_stored(nats_own, subject)) == 5 or not relay.alive(), 120, "the relay to deliver")
        assert relay.alive(), relay.log_text()[-3000:]
        nats_own.pause()  # silent: connections open, nothing answered, new ones wait
        t0 = time.monotonic()
        write(5)
        code = relay.wait(120)
        took = time.monotonic() - t0
    finally:
        nats_own.resume()
        if relay.alive():
            relay.kill()
    log = relay.log_text()
    errors = [line for line in log.splitlines() if "delivery_timeout_s" in line]
    assert code == 1, log[-3000:]
    assert len(errors) == 1 and "Traceback" not in log, log[-3000:]
    assert errors[0].startswith("cdc: ") and "Kafka" not in errors[0], errors[0]
    assert took < 4 + 30, f"the relay stopped {took:.0f} s after the server went silent"
