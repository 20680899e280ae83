"""The fault suite's kinds on the RabbitMQ Streams sink, against a real RabbitMQ 3.10 node:
while a workload of mixed transactions (1-5 or, long, 1-30 events, 5% rolled back, 10% XA)
runs, the relay (`cdc run`, its own process) is killed with SIGKILL at random moments and at
every named crash point, the node is SIGKILLed and restarted under a running relay, and cut
off (SIGSTOP) and back. Then a clean relay reaches the binlog's end and the independent
checker compares the committed outbox inserts with everything the streams hold, read by the
verifier's own reader: 0 missing, 0 duplicates, per-key order kept.

Short by default (about 3k events, 3 random kills, each crash point once, one node restart,
one cut-off). The long run, over >= 50k events with 30 random kills, 2 rounds of crash points,
2 node restarts and 2 cut-offs:

    CDC_FAULT_LONG=1 .venv/bin/python -m pytest tests/integration/test_rabbitmq_faults.py -s
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from cdc import crashpoints
from tests.integration.final_relay import catch_up_and_check, delivered_past_checkpoint
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.rabbit_streams import (
    create_topic,
    publishers_unread,
    rabbit_env,
    rabbit_raw_config,
    stream_records,
)
from tests.integration.test_faults import LONG, Writer

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]

POINTS = ("mid_transaction", "after_produce", "after_ack_before_checkpoint", "recovery", "checkpoint_write",
          "xa_prepared", "xa_outcome")  # fmt: skip


def _crash_at(point: str, rng: random.Random) -> str:
    nth = {"recovery": 1, "after_ack_before_checkpoint": 1}.get(point) or (
        rng.randint(1, 10) if point in ("checkpoint_write", "xa_prepared", "xa_outcome") else rng.randint(1, 400)
    )
    return f"{point}@{nth}"


def crash_point_reached(kind: str, raw: dict, env: dict[str, str], tmp_path: Path, rng: random.Random) -> bool:
    """A relay that SIGKILLs itself at crash point `kind` (`_crash_at`): did it get there within
    90 s? 'recovery' is hit only by a recovery scan that finds an event delivered past the
    checkpoint, and the relay before it may have left none: its checkpoint covered all it
    published (a fresh-clone run: 'recovery' not reached, the streams clean). So first, while
    the sink holds none, a relay dies at its second 'after_ack_before_checkpoint' (its start
    is the first): acknowledgements in, the checkpoint that records them not written."""
    if kind == "recovery":
        for _ in range(5):
            if delivered_past_checkpoint(raw, env) > 0:
                break
            _run_to(raw, env, tmp_path, "after_ack_before_checkpoint@2")
    return _run_to(raw, env, tmp_path, _crash_at(kind, rng))


def _run_to(raw: dict, env: dict[str, str], tmp_path: Path, crash_at: str) -> bool:
    relay = RelayProcess(raw, env, tmp_path, crash_at=crash_at)
    try:
        relay.wait(90)
        return True  # it died by its own SIGKILL at the point
    except Exception:
        relay.kill()
        return False


def _wait_publishing(relay: RelayProcess, checkpoint: Path) -> None:
    """Until the relay has written a checkpoint of its own (it started and publishes)."""
    before = checkpoint.stat().st_mtime_ns if checkpoint.exists() else 0
    wait_until(
        lambda: (checkpoint.exists() and checkpoint.stat().st_mtime_ns > before) or not relay.alive(),
        120,
        "the relay to checkpoint",
    )
    assert relay.alive(), relay.log_text()[-3000:]


def _world(mariadb, rabbitmq, database: str, prefix: str, tmp_path) -> tuple[list[str], dict, dict[str, str]]:
    """The outbox, a stream for `.order` and three for `.payment` (`.dlq` is not created), the
    relay's config and environment."""
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topics = [f"{prefix}.order", f"{prefix}.payment", f"{prefix}.dlq"]
    create_topic(rabbitmq, topics[0])
    create_topic(rabbitmq, topics[1], partitions=3)
    raw = rabbit_raw_config(mariadb, rabbitmq, database, prefix, tmp_path / "cp.json", topics__missing="dead_letter")
    return topics, raw, rabbit_env(mariadb, rabbitmq)


def test_exactly_once_across_relay_kills_crash_points_and_node_faults(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    assert set(POINTS) == set(crashpoints.POINTS) - {"txn_before_commit", "txn_after_commit"}
    events, kills, rounds, node_faults = (50_000, 30, 2, 2) if LONG else (3_000, 3, 1, 1)
    topics, raw, env = _world(mariadb, rabbitmq, database, topic_prefix, tmp_path)
    rng = random.Random(29)
    schedule = [p for _ in range(rounds) for p in POINTS] + ["kill"] * kills + ["restart", "pause"] * node_faults
    rng.shuffle(schedule)
    writer = Writer(lambda: mariadb.connect(database), 10**9, pause_s=0.002 if LONG else 0.004)
    writer.start()
    reached = dict.fromkeys(POINTS, 0)
    t0 = time.monotonic()
    try:
        for kind in schedule:
            if kind in POINTS:
                reached[kind] += crash_point_reached(kind, raw, env, tmp_path, rng)
                continue
            relay = RelayProcess(raw, env, tmp_path)
            if kind in ("restart", "pause"):  # the node's fault comes to a relay that publishes
                _wait_publishing(relay, tmp_path / "cp.json")
            time.sleep(rng.uniform(0.8, 3.0))  # the fault's timing, not a wait for a condition
            if kind == "restart":
                rabbitmq.restart(graceful=False)  # the node loses what it had not confirmed
                time.sleep(rng.uniform(1.0, 3.0))
                assert relay.alive(), f"the relay stopped on a node restart:\n{relay.log_text()[-3000:]}"
            elif kind == "pause":
                rabbitmq.pause()
                time.sleep(rng.uniform(2.0, 6.0))
                rabbitmq.resume()
                time.sleep(rng.uniform(0.5, 2.0))
                assert relay.alive(), f"the relay stopped on a cut-off:\n{relay.log_text()[-3000:]}"
            relay.kill()
        while writer.attempted < events:  # the rest of the workload, under random kills
            relay = RelayProcess(raw, env, tmp_path)
            time.sleep(rng.uniform(0.8, 3.0))
            relay.kill()
    finally:
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(
        mariadb, database, raw, env, tmp_path, lambda: stream_records(rabbitmq, topics), 600 if LONG else 300
    )
    print(
        f"\nRabbitMQ faults: {writer.attempted} attempted events ({writer.xa_prepared} XA prepared), schedule "
        f"{len(schedule)} faults + random kills to the end, crash points reached {reached}, in "
        f"{time.monotonic() - t0:.0f}s: {result.summary()}"
    )
    assert result.committed >= (events * 0.9 if LONG else 1000)
    assert all(n == rounds for n in reached.values()), reached
    assert result.clean, result.summary()


def test_a_relay_killed_while_the_node_holds_its_unread_messages_is_not_repeated_by_the_next(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    """The node reads a dead relay's socket after the next relay started: a memory alarm
    (`vm_memory_high_watermark` 0) blocks publishing connections, as a frozen or loaded node
    reads late. The next relay's recovery scan cannot see those messages; the streams'
    de-duplication by producer name and publishing id (docs/sink-delivery.md) must keep the
    copies out, and nothing may be lost."""
    topics, raw, env = _world(mariadb, rabbitmq, database, topic_prefix, tmp_path)
    writer = Writer(lambda: mariadb.connect(database), 10**9, xa=0.0)
    writer.start()
    second = None
    try:
        first = RelayProcess(raw, env, tmp_path)
        _wait_publishing(first, tmp_path / "cp.json")
        time.sleep(1.0)
        with publishers_unread(rabbitmq):
            time.sleep(3.0)  # the relay's messages pile up unread on the node
            first.kill()
            second = RelayProcess(raw, env, tmp_path)
            time.sleep(4.0)  # its start, its recovery scan, what it publishes waits unread too
        wait_until(lambda: "recovery complete" in second.log_text() or not second.alive(), 120, "the recovery")
        assert second.alive(), second.log_text()[-3000:]
        time.sleep(2.0)
        second.kill()
    finally:
        writer.stop_flag.set()
        writer.finish()
        if second is not None and second.alive():
            second.kill()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: stream_records(rabbitmq, topics), 300)
    print(f"\nRabbitMQ Streams, a relay killed while its messages wait unread on the node: {result.summary()}")
    assert result.committed >= 1000
    assert result.clean, result.summary()


def test_a_message_timed_out_in_a_node_restart_fails_every_later_one_so_per_key_order_holds(
    mariadb, rabbitmq, database, topic_prefix, tmp_path
):
    """`publish_timeout_s` (2 s) shorter than a node's restart (SIGKILL, then up again): the
    messages unconfirmed at the crash time out while the relay connects again. Every later
    message must fail with them and none be sent, or younger ones are stored before older ones,
    which the next relay then sends after them (before the rule: 123 keys out of order in one
    of two runs). The next relay catches up: clean."""
    topics, raw, env = _world(mariadb, rabbitmq, database, topic_prefix, tmp_path)
    raw["sink"]["rabbitmq_stream"]["publish_timeout_s"] = 2.0
    writer = Writer(lambda: mariadb.connect(database), 10**9, xa=0.0)
    writer.start()
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _wait_publishing(relay, tmp_path / "cp.json")
        time.sleep(1.0)
        rabbitmq.restart(graceful=False)
        time.sleep(6.0)  # the restart and more: the relay has stopped (exit 1) or ridden it out
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: stream_records(rabbitmq, topics), 300)
    print(f"\nRabbitMQ Streams, messages timed out in a node restart: {result.summary()}")
    assert result.committed >= 500
    assert result.clean, result.summary()
