"""A binlog connection that goes silent (a network that drops packets without a reset)
is noticed through the missing heartbeats, and the relay reconnects from its own
position: nothing lost, nothing repeated."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.harness import (
    OUTBOX_DDL,
    RelayThread,
    TcpProxy,
    insert_events,
    read_topic,
    relay_config,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_a_silent_connection_is_noticed_and_the_relay_reconnects(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    kafka.create_topic(f"{topic_prefix}.order", 2)
    proxy = TcpProxy(mariadb.port)
    try:
        cfg = relay_config(
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path / "cp.json",
            source__port=proxy.port,
            source__heartbeat_s=0.5,
        )
        relay = RelayThread(cfg)
        ids = [str(uuid.uuid4()) for _ in range(40)]
        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(i, "order", "k", "T", "{}") for i in ids[:20]])
            conn.commit()
            relay.wait_delivered(20)
            proxy.freeze_busiest()  # the relay's binlog stream now hears nothing at all (its lease session does)
            insert_events(conn, "outbox", [(i, "order", "k", "T", "{}") for i in ids[20:]])
            conn.commit()
        wait_until(lambda: relay.metrics.reconnects >= 1 or relay.error, 30, "the relay to notice the silence")
        relay.wait_delivered(40, timeout=30)
        relay.stop()
        got = [r.value["id"] for r in read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")]
        assert sorted(got) == sorted(ids) and len(got) == 40
        assert relay.metrics.reconnects >= 1
    finally:
        proxy.close()
