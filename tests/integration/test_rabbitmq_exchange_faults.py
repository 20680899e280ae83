"""The fault suite's kinds on the RabbitMQ exchange sink, against a real RabbitMQ 3.10 node: a
topic exchange with the audit stream and a consumer's durable classic queue bound beside it
(both with `#`). While a workload of mixed transactions (1-5 or, long, 1-30 events, 5% rolled
back, 10% XA) runs, the relay (`cdc run`, its own process) is killed with SIGKILL at random
moments and at every named crash point, the node is SIGKILLed and restarted under a running
relay, and cut off (SIGSTOP) and back. Then a clean relay reaches the binlog's end and:

* the audit stream, read by the verifier's own reader, holds every committed outbox insert
  exactly once, in commit order per key (the independent checker: 0 missing, 0 duplicates);
* the consumer's queue holds every event at least once, except what docs/sinks.md says a
  node crash can leave out (counted and printed, never above the messages unconfirmed at
  the node's kills); every copy carries its original's message_id and body.

Short by default (about 2k events, 3 random kills, each crash point once, one node restart,
one cut-off). The long run, over >= 50k events with 30 random kills, 2 rounds of crash points,
2 node restarts and 2 cut-offs:

    CDC_FAULT_LONG=1 python -m pytest tests/integration/test_rabbitmq_exchange_faults.py -s
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections import defaultdict

import pytest

from cdc import crashpoints
from tests.integration.final_relay import catch_up_and_check
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.rabbit_exchange import audit_records, declare, drain_queue, event_id_of, exchange_raw_config
from tests.integration.rabbit_streams import publishers_unread, rabbit_env
from tests.integration.test_faults import LONG, Writer
from tests.integration.test_rabbitmq_faults import POINTS, _wait_publishing, crash_point_reached

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]


def test_audit_stream_exactly_once_and_queue_at_least_once_across_relay_kills_crash_points_and_node_faults(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path
):
    node = rabbitmq_managed
    assert set(POINTS) == set(crashpoints.POINTS) - {"txn_before_commit", "txn_after_commit"}
    events, kills, rounds, node_faults = (50_000, 30, 2, 2) if LONG else (2_000, 3, 1, 1)
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    names = declare(node, topic_prefix, audit_keys=["#"], queue_keys=["#"])
    raw = exchange_raw_config(mariadb, node, database, topic_prefix, tmp_path / "cp.json")
    env = rabbit_env(mariadb, node)
    rng = random.Random(31)
    schedule = [p for _ in range(rounds) for p in POINTS] + ["kill"] * kills + ["restart", "pause"] * node_faults
    rng.shuffle(schedule)
    writer = Writer(lambda: mariadb.connect(database), 10**9, pause_s=0.002 if LONG else 0.004)
    writer.start()
    reached = dict.fromkeys(POINTS, 0)
    relay_kills = 0
    t0 = time.monotonic()
    try:
        for kind in schedule:
            if kind in POINTS:
                reached[kind] += crash_point_reached(kind, raw, env, tmp_path, rng)
                relay_kills += 1
                continue
            relay = RelayProcess(raw, env, tmp_path)
            if kind in ("restart", "pause"):  # the node's fault comes to a relay that publishes
                _wait_publishing(relay, tmp_path / "cp.json")
            time.sleep(rng.uniform(0.8, 3.0))  # the fault's timing, not a wait for a condition
            if kind == "restart":
                node.restart(graceful=False)  # SIGKILL: what was routed and not confirmed is in doubt
                time.sleep(rng.uniform(1.0, 3.0))
                assert relay.alive(), f"the relay stopped on a node restart:\n{relay.log_text()[-3000:]}"
            elif kind == "pause":
                node.pause()
                time.sleep(rng.uniform(2.0, 6.0))
                node.resume()
                time.sleep(rng.uniform(0.5, 2.0))
                assert relay.alive(), f"the relay stopped on a cut-off:\n{relay.log_text()[-3000:]}"
            relay.kill()
            relay_kills += 1
        while writer.attempted < events:  # the rest of the workload, under random kills
            relay = RelayProcess(raw, env, tmp_path)
            time.sleep(rng.uniform(0.8, 3.0))
            relay.kill()
            relay_kills += 1
    finally:
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(
        mariadb, database, raw, env, tmp_path, lambda: audit_records(node, topic_prefix), 900 if LONG else 300
    )
    # the consumer's own queue
    queued = drain_queue(node, names.queue)
    by_id: dict[str, list] = defaultdict(list)
    for m in queued:
        by_id[m.message_id or ""].append(m)
    copies = sum(len(v) - 1 for v in by_id.values())
    for same in by_id.values():  # a copy is its original again: same message id, same body
        assert len({(m.body, m.routing_key) for m in same}) == 1
    queued_events = {event_id_of(m.body) for m in queued}
    audit_events = {r.event_id for r in audit_records(node, topic_prefix)}
    missing_in_queue = audit_events - queued_events
    print(
        f"\nRabbitMQ exchange faults: {writer.attempted} attempted events ({writer.xa_prepared} XA prepared), "
        f"schedule {len(schedule)} faults + random kills to the end ({relay_kills} relay kills), crash points "
        f"reached {reached}, in {time.monotonic() - t0:.0f}s: audit stream {result.summary()}; consumer queue "
        f"{len(queued)} messages, {len(by_id)} distinct message ids, {copies} copies, {len(missing_in_queue)} "
        "events missing"
    )
    assert result.committed >= (events * 0.9 if LONG else 1000)
    assert all(n == rounds for n in reached.values()), reached
    assert result.clean, result.summary()
    assert not (queued_events - audit_events), "the consumer's queue holds an event the audit stream does not"
    # docs/sinks.md: only a node crash can leave an event out of the consumer's queue, and at
    # most what was unconfirmed then (max_in_flight per node kill)
    assert len(missing_in_queue) <= node_faults * 5_000, len(missing_in_queue)


def _writing(mariadb, node, database: str, prefix: str, tmp_path, **overrides):
    """The outbox, the exchange with the audit stream and a queue bound with '#', the relay's
    config and environment, and a writer committing outbox transactions (started)."""
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    declare(node, prefix, audit_keys=["#"], queue_keys=["#"])
    raw = exchange_raw_config(mariadb, node, database, prefix, tmp_path / "cp.json", **overrides)
    writer = Writer(lambda: mariadb.connect(database), 10**9, xa=0.0)
    writer.start()
    return raw, rabbit_env(mariadb, node), writer


def test_a_relay_killed_while_the_node_holds_its_unread_messages_is_not_repeated_by_the_next(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path
):
    """The node routes what a dead relay sent after the next relay has started: a memory alarm
    (`vm_memory_high_watermark` 0) makes it stop reading publishers' sockets, as a frozen or
    loaded node does. The next relay must not read the audit stream before the node has read
    the dead relay's socket to its end, or it publishes those messages again (before the fence,
    462 copies in the audit stream here). It waits for the fence, says so, and publishes no copy."""
    node = rabbitmq_managed
    raw, env, writer = _writing(mariadb, node, database, topic_prefix, tmp_path)
    second = None
    try:
        first = RelayProcess(raw, env, tmp_path)
        _wait_publishing(first, tmp_path / "cp.json")
        time.sleep(1.0)
        with publishers_unread(node):
            time.sleep(3.0)  # the relay's messages pile up unread on the node
            first.kill()
            second = RelayProcess(raw, env, tmp_path)
            wait_until(lambda: "holds the fence" in second.log_text() or not second.alive(), 60, "the fence wait")
            assert second.alive(), second.log_text()[-3000:]
            time.sleep(1.0)
            assert "recovering from checkpoint" not in second.log_text()  # no scan while the fence is held
        wait_until(lambda: "recovery complete" in second.log_text() or not second.alive(), 120, "the recovery")
        assert second.alive(), second.log_text()[-3000:]
        time.sleep(2.0)
        second.kill()
    finally:
        writer.stop_flag.set()
        writer.finish()
        if second is not None and second.alive():
            second.kill()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: audit_records(node, topic_prefix), 300)
    print(f"\nRabbitMQ exchange, a relay killed while its messages wait unread on the node: {result.summary()}")
    assert result.committed >= 1000
    assert result.clean, result.summary()


def test_a_connection_lost_inside_a_run_waits_for_the_node_to_read_it_before_its_scan(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path
):
    """The reconnect inside a run takes the fence again before its scan: the relay's AMQP
    socket is torn down on the relay's side (`ss -K`) while the node, under a memory alarm,
    has not read what the relay sent on it. The relay connects again at once; the old
    connection still lives on the node, so the relay waits (and says so) until the node has
    ended it; its scan then decides, and there is no copy. Here the node ends the reset
    connection without routing what it had not read (the relay's line: 0 unconfirmed routed,
    5000 sent again), so this shows the wait inside a run and its outcome; the race itself (a
    node that routes a dead connection's unread messages) is the start's test above."""
    node = rabbitmq_managed
    raw, env, writer = _writing(mariadb, node, database, topic_prefix, tmp_path)
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _wait_publishing(relay, tmp_path / "cp.json")
        time.sleep(1.0)
        with publishers_unread(node):
            time.sleep(2.0)  # the relay's messages pile up unread on the node
            # the relay's side of its connections to the node's AMQP port, torn down
            cut = subprocess.run(
                ["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(node.amqp_port)], capture_output=True, text=True
            )
            assert cut.returncode == 0, cut.stderr
            wait_until(lambda: "holds the fence" in relay.log_text() or not relay.alive(), 60, "the fence wait")
            assert relay.alive(), relay.log_text()[-3000:]
            time.sleep(1.0)
        wait_until(lambda: "reachable again" in relay.log_text() or not relay.alive(), 120, "the reconnect")
        assert relay.alive(), relay.log_text()[-3000:]
        time.sleep(2.0)
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: audit_records(node, topic_prefix), 300)
    line = next(ln for ln in relay.log_text().splitlines() if "reachable again" in ln)
    print(
        f"\nRabbitMQ exchange, a connection lost while the node holds its messages unread: {result.summary()}\n{line}"
    )
    assert result.committed >= 1000
    assert result.clean, result.summary()


def test_a_standby_relay_outwaits_publish_timeout_and_takes_over_without_a_copy(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path
):
    """A standby (the lease held by a running relay) makes its publisher and waits for the
    lease, not for the fence: it is still waiting well past `publish_timeout_s`. The node is
    then SIGKILLed and restarted, which ends the standby's idle connection too; when the active
    relay is gone, the standby takes the lease, connects again, takes the fence, scans and
    publishes: the audit stream clean."""
    node = rabbitmq_managed
    raw, env, writer = _writing(mariadb, node, database, topic_prefix, tmp_path)
    active = RelayProcess(raw, env, tmp_path)  # publish_timeout_s 60 s: it rides out the restart
    standby = None
    try:
        _wait_publishing(active, tmp_path / "cp.json")
        standby_raw = json.loads(json.dumps(raw))
        standby_raw["sink"]["rabbitmq_exchange"]["publish_timeout_s"] = 4.0
        standby = RelayProcess(standby_raw, env, tmp_path)
        wait_until(lambda: "standby: the lease" in standby.log_text() or not standby.alive(), 60, "the standby")
        time.sleep(8.0)  # twice publish_timeout_s
        assert standby.alive(), standby.log_text()[-3000:]
        assert "fence" not in standby.log_text()
        node.restart(graceful=False)  # the standby's idle connection goes with the node
        time.sleep(3.0)
        assert active.alive() and standby.alive(), (active.log_text() + standby.log_text())[-3000:]
        active.kill()
        wait_until(lambda: "recovery complete" in standby.log_text() or not standby.alive(), 60, "the takeover")
        assert standby.alive(), standby.log_text()[-3000:]
        time.sleep(2.0)
    finally:
        active.kill()
        if standby is not None:
            standby.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: audit_records(node, topic_prefix), 300)
    print(f"\nRabbitMQ exchange, a standby's takeover: {result.summary()}")
    assert result.committed >= 1000
    assert result.clean, result.summary()


def test_a_message_timed_out_in_a_node_restart_fails_every_later_one_so_per_key_order_holds(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path
):
    """`publish_timeout_s` (2 s) shorter than a node's restart (SIGKILL, then up again): the
    messages unconfirmed at the crash time out while the relay connects again. Every later
    message must fail with them and none be sent, or the younger ones reach the audit stream
    before the older ones, which the next relay then sends after them (per-key order broken).
    The relay stops (exit 1); the next one catches up: clean."""
    node = rabbitmq_managed
    raw, env, writer = _writing(
        mariadb, node, database, topic_prefix, tmp_path, sink__rabbitmq_exchange__publish_timeout_s=2.0
    )
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _wait_publishing(relay, tmp_path / "cp.json")
        time.sleep(1.0)
        node.restart(graceful=False)
        assert relay.wait(120) == 1, relay.log_text()[-3000:]
        assert "TIMED_OUT" in relay.log_text(), relay.log_text()[-3000:]
        time.sleep(1.0)
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, lambda: audit_records(node, topic_prefix), 300)
    print(f"\nRabbitMQ exchange, messages timed out in a node restart: {result.summary()}")
    assert result.committed >= 500
    assert result.clean, result.summary()
