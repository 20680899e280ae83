"""The RabbitMQ Streams sink (`[sink] kind = "rabbitmq_stream"`, docs/sinks.md) against a real
RabbitMQ 3.10 node (fixture `rabbitmq`) and mariadbd: every committed outbox event once, in
commit order per key, read back by the verifier's own reader (tests/integration/rabbit_streams.py);
a topic partitioned over streams `<topic>-n` by Kafka's key hash; the node restarted under a
running relay (publishing ids: nothing lost, nothing twice, no stop); dead letters with their
cause (too large, a missing stream). The fault suite's kinds over 50k events:
test_rabbitmq_faults.py."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import pytest

from cdc.config import load_config
from connectors.rabbitmq.stream_sink import murmur2_partition
from tests.integration.harness import OUTBOX_DDL, RelayThread, insert_events
from tests.integration.independent_checker import check, committed_outbox_events
from tests.integration.rabbit_streams import (
    create_topic,
    rabbit_env,
    rabbit_raw_config,
    stream_messages,
    stream_records,
)

pytestmark = pytest.mark.integration


def _events(n: int, rng: random.Random, aggregates=("order", "payment"), pad: int = 100) -> list[tuple]:
    return [
        (
            str(uuid.uuid4()),
            rng.choice(aggregates),
            f"k{rng.randrange(20)}",
            "Happened",
            '{"n": %d, "p": "%s"}' % (i, "x" * pad),
        )
        for i in range(n)
    ]


def _write(db, database: str, events: list[tuple], per_tx: int = 7) -> None:
    with db.connect(database) as conn:
        for start in range(0, len(events), per_tx):
            insert_events(conn, "outbox", events[start : start + per_tx])
            conn.commit()


def _start(mariadb, database):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))


def _committed(mariadb, database: str, raw: dict):
    file, pos = raw["source"]["start"].split(":")
    return committed_outbox_events(mariadb.connection_settings(), database, start_file=file, start_pos=int(pos))


def test_relay_publishes_every_event_once_in_commit_order(mariadb, rabbitmq, database, topic_prefix, tmp_path):
    _start(mariadb, database)
    order, payment, dlq = f"{topic_prefix}.order", f"{topic_prefix}.payment", f"{topic_prefix}.dlq"
    create_topic(rabbitmq, order)
    create_topic(rabbitmq, payment, partitions=3)  # streams <topic>-0 .. -2
    raw = rabbit_raw_config(
        mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json", topics__missing="dead_letter"
    )
    relay = RelayThread(load_config(raw, rabbit_env(mariadb, rabbitmq)))
    events = _events(600, random.Random(3))
    _write(mariadb, database, events)
    relay.wait_delivered(len(events), timeout=120)
    summary = relay.stop()
    assert summary is not None
    records = stream_records(rabbitmq, [order, payment, dlq])
    result = check(_committed(mariadb, database, raw), records)
    assert result.committed == 600 and result.clean, result.summary()
    # the key's stream is Kafka's partition of the key (murmur2), always the same one
    for rec in records:
        if rec.topic == payment:
            assert rec.partition == murmur2_partition(rec.key.encode(), 3)
    assert {r.partition for r in records if r.topic == payment} == {0, 1, 2}
    # what the relay wrote besides the value: identity headers, key, creation time
    first = next(m for m in stream_messages(rabbitmq, [order]))
    headers = dict(first.headers())
    assert headers["cdc.source"] == raw["source"]["name"].encode()
    assert {"cdc.binlog.file", "cdc.binlog.pos", "id"} <= set(headers) and first.key() is not None
    assert first.timestamp()[0] == 1 and first.timestamp()[1] > 0  # create time: properties.creation-time


def test_a_restart_of_the_node_under_a_running_relay_loses_and_repeats_nothing(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    _start(mariadb, database)
    topics = [f"{topic_prefix}.order", f"{topic_prefix}.payment", f"{topic_prefix}.dlq"]
    raw = rabbit_raw_config(mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json")  # "auto": created
    relay = RelayThread(load_config(raw, rabbit_env(mariadb, rabbitmq)))
    rng = random.Random(5)
    first = _events(400, rng)
    _write(mariadb, database, first)
    relay.wait_delivered(200, timeout=120)
    rabbitmq.restart(graceful=False)  # SIGKILL: the node loses what it had not confirmed
    second = _events(400, rng)
    _write(mariadb, database, second)
    relay.wait_delivered(800, timeout=180)
    assert relay.alive, "the relay stopped on a broker restart"
    relay.stop()
    result = check(_committed(mariadb, database, raw), stream_records(rabbitmq, topics))
    assert result.committed == 800 and result.clean, result.summary()


def test_a_streams_leader_restarted_under_a_running_relay_loses_and_repeats_nothing(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    """A stream's member restarts while the node and the relay's connection stay up (its
    leader killed): the node drops the relay's publisher of that stream (a MetadataUpdate,
    then PublishError 18, publisher does not exist, for what is sent to it). Seen once on a
    loaded machine after a node restart, where the stream's member came back after the relay
    had connected again; the relay stopped. It declares the publisher again and sends what
    was unconfirmed again: nothing lost, nothing twice, no stop."""
    _start(mariadb, database)
    topics = [f"{topic_prefix}.order", f"{topic_prefix}.payment", f"{topic_prefix}.dlq"]
    raw = rabbit_raw_config(mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json")  # "auto": created
    relay = RelayThread(load_config(raw, rabbit_env(mariadb, rabbitmq)))
    rng = random.Random(7)
    _write(mariadb, database, _events(400, rng))
    relay.wait_delivered(200, timeout=120)
    for stream in topics[:2]:
        rabbitmq.kill_stream_leader(stream)
    _write(mariadb, database, _events(400, rng))
    relay.wait_delivered(800, timeout=180)
    assert relay.alive, "the relay stopped on a stream's leader restart"
    relay.stop()
    result = check(_committed(mariadb, database, raw), stream_records(rabbitmq, topics))
    assert result.committed == 800 and result.clean, result.summary()


def test_dead_letters_with_their_cause(mariadb, rabbitmq, database, topic_prefix, tmp_path):
    _start(mariadb, database)
    order, dlq = f"{topic_prefix}.order", f"{topic_prefix}.dlq"
    create_topic(rabbitmq, order)  # no stream for "payment": topic_missing; the dead-letter stream is created
    raw = rabbit_raw_config(
        mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json",
        topics__missing="dead_letter", relay__max_message_bytes=3000,
    )  # fmt: skip
    relay = RelayThread(load_config(raw, rabbit_env(mariadb, rabbitmq)))
    rng = random.Random(9)
    small = _events(20, rng, aggregates=("order",))
    big = _events(2, rng, aggregates=("order",), pad=5000)
    missing = _events(3, rng, aggregates=("payment",))
    _write(mariadb, database, small + big + missing, per_tx=5)
    relay.wait_delivered(25, timeout=120)
    relay.stop()
    import json

    causes = Counter()
    for message in stream_messages(rabbitmq, [dlq]):
        headers = dict(message.headers())
        causes[headers["cdc.dlq.cause"].decode()] += 1
        assert json.loads(message.value())["row"]["id"]
    assert causes == {"too_large": 2, "topic_missing": 3}, causes
    result = check(_committed(mariadb, database, raw), stream_records(rabbitmq, [order, dlq]))
    assert result.committed == 25 and result.clean, result.summary()


def test_cdc_check_asks_the_node_and_names_a_wrong_password_in_one_line(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    import os
    import subprocess
    import sys

    from tests.integration.harness import ROOT, _to_toml

    _start(mariadb, database)
    create_topic(rabbitmq, f"{topic_prefix}.dlq")

    def check_with(password: str) -> subprocess.CompletedProcess:
        raw = rabbit_raw_config(mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json")
        path = tmp_path / "relay.toml"
        path.write_text(_to_toml(raw))
        env = {**os.environ, **rabbit_env(mariadb, rabbitmq), "CDC_TEST_RABBITMQ_PASSWORD": password}
        return subprocess.run(
            [sys.executable, "-m", "cdc_cli.main", "check", "--config", str(path)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    good = check_with(rabbitmq.password)
    assert f"ok   rabbitmq: RabbitMQ stream 127.0.0.1:{rabbitmq.stream_port}" in good.stdout, good.stdout + good.stderr
    assert f"ok   rabbitmq_topic: {topic_prefix}.dlq: 1 stream(s)" in good.stdout
    assert "kafka" not in good.stdout.lower().replace("kafka.", "")
    bad = check_with("wrong-" + rabbitmq.password)
    assert bad.returncode == 2
    lines = [ln for ln in bad.stdout.splitlines() if ln.startswith("FAIL rabbitmq:")]
    assert len(lines) == 1 and "check sink.rabbitmq_stream" in lines[0], bad.stdout
    assert rabbitmq.password not in bad.stdout + bad.stderr
