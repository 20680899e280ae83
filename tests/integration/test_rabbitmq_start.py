"""How a RabbitMQ Streams relay starts (docs/sinks.md, "The RabbitMQ Streams sink"), against a
real RabbitMQ 3.10 node and mariadbd: a start's recovery scan does not wait on the topic's
empty streams (3.10's stream protocol has no StreamStats: the end of a stream is read by
subscribing to it, and an empty stream delivers nothing)."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime

import pytest

from connectors.rabbitmq.stream_reader import RabbitStreamReader, StreamSettings
from connectors.rabbitmq.stream_sink import murmur2_partition
from tests.integration.harness import OUTBOX_DDL, RelayProcess, insert_events, wait_until
from tests.integration.rabbit_streams import create_topic, rabbit_env, rabbit_raw_config, stream_messages

pytestmark = pytest.mark.integration

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _logged_at(log: str, words: str) -> datetime:
    for line in log.splitlines():
        if words in line and (m := _STAMP.match(line)):
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no log line with {words!r}:\n{log}")


def test_a_start_does_not_wait_on_empty_streams(mariadb, rabbitmq, database, topic_prefix, tmp_path):
    """Six streams `<topic>-0..5`, the keys on two of them: the restart's recovery scan reads
    all six. Before, each empty stream cost `empty_wait_s` (here 5 s: 20 s for four) on every
    start; the bound is 3 s from the start line to the recovery line, the reader's look at
    all six under 1 s."""
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topic = f"{topic_prefix}.order"
    create_topic(rabbitmq, topic, partitions=6)
    keys = [k for k in (f"k{n}" for n in range(200)) if murmur2_partition(k.encode(), 6) in (0, 1)][:10]
    raw = rabbit_raw_config(
        mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json",
        topics__missing="dead_letter", sink__rabbitmq_stream__empty_wait_s=5.0,
    )  # fmt: skip
    env = rabbit_env(mariadb, rabbitmq)
    first = RelayProcess(raw, env, tmp_path / "first")
    with mariadb.connect(database) as conn:
        events = [(str(uuid.uuid4()), "order", k, "Happened", "{}") for k in keys * 3]
        insert_events(conn, "outbox", events)
        conn.commit()

    def checkpointed() -> int:
        cp = tmp_path / "cp.json"
        offsets = json.loads(cp.read_text()).get("offsets", {}).get(topic, {}) if cp.exists() else {}
        return sum(int(v) for v in offsets.values())

    wait_until(lambda: checkpointed() == len(events), 120, "a checkpoint past the first run's messages")
    assert first.terminate() == 0, first.log_text()
    held = {p: 0 for p in range(6)}
    for message in stream_messages(rabbitmq, [topic]):
        held[message.partition()] += 1
    assert sum(held.values()) == len(events) and {p for p, n in held.items() if n} == {0, 1}, held

    settings = StreamSettings(
        "127.0.0.1", rabbitmq.stream_port, "/", rabbitmq.user, rabbitmq.password, empty_wait_s=5.0
    )
    reader = RabbitStreamReader(settings)
    try:
        t0 = time.monotonic()
        assert reader.partition_count(topic) == 6
        marks = [reader.watermarks(topic, p) for p in range(6)]
        looked = time.monotonic() - t0
    finally:
        reader.close()
    assert marks == [(0, held[p]) for p in range(6)], (marks, held)
    assert looked < 1.0, f"reading the bounds of six streams (four empty) took {looked:.1f} s"

    second = RelayProcess(raw, env, tmp_path / "second")
    try:
        wait_until(lambda: "recovering from checkpoint" in second.log_text() or not second.alive(), 60, "recovery")
        log = second.log_text()
        took = (_logged_at(log, "recovering from checkpoint") - _logged_at(log, "relay for source")).total_seconds()
        print(f"\nsix streams' bounds (four empty): {looked:.2f} s; start line to recovery line: {took:.2f} s")
        assert took < 3.0, f"{took:.1f} s from the start line to the recovery line:\n{log}"
    finally:
        assert second.terminate() == 0, second.log_text()
