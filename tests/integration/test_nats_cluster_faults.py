"""The NATS JetStream sink on a 3-node JetStream cluster (testbed/nats.py `NatsCluster`,
three nats-servers on this machine), its streams R3: while a writer commits mixed
transactions (1-5 events, some rolled back, a tenth XA) and one `cdc run` publishes
through all three servers, the server that leads the events' stream is SIGKILLed, the
relay must go on publishing (a new leader is elected among the two left), `cdc check`'s
lines name the stream and the missing replica, then the server is started again and
catches up. Afterwards a clean relay catches up and the independent checker compares the
binlog's committed outbox inserts with what the streams hold, read by the verifier's
reader: 0 missing, 0 duplicates, 0 keys out of order. Beside it, the publisher alone
(connected to a server that does not lead the stream, up to 8,000 messages waiting) while the
leader is SIGKILLed three times or asked to step down ten times: every message once, in
publish order.

Short by default (two leader deaths). The run of record (a leader killed again and
again until 50k events were written):

    CDC_NATS_CLUSTER_EVENTS=50000 python -m pytest tests/integration/test_nats_cluster_faults.py -s

Before the publisher chained a replicated stream's messages (connectors/nats/chain.py), that
run once found every key out of order (0 missing, 0 duplicates): a message refused while the
stream had no leader was sent again after a later one the new leader stored. The step-down
test found it with the old publisher in 3 of 3 runs (3 of 436,999 messages out of order once,
`JS_10158` "duplicate message id is in process" failures twice); the SIGKILL tests did not
show it in the runs made (docs/sinks.md "A JetStream cluster").
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from cdc.config import load_config
from connectors.nats.sink import check_nats
from tests.integration.final_relay import catch_up_and_check
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config, stream_records
from tests.integration.test_faults import AGGREGATES, Writer
from tests.integration.test_nats_sink_faults import _delivers

pytestmark = [pytest.mark.integration, pytest.mark.fault]
EVENTS = int(os.environ.get("CDC_NATS_CLUSTER_EVENTS", "0"))
LONG = EVENTS >= 20_000


@pytest.fixture
def cluster():
    from testbed.nats import NatsCluster

    with NatsCluster.start() as started:
        yield started


def _replicas_current(cluster, stream: str) -> bool:
    try:
        info = cluster.stream_cluster(stream)
    except Exception:  # no leader yet: the request is not answered
        return False
    return bool(info.leader) and len(info.replicas or []) == 2 and all(p.current for p in info.replicas)


def _new_leader(cluster, stream: str, old: str) -> str | None:
    try:
        leader = cluster.stream_cluster(stream).leader
    except Exception:
        return None
    return leader if leader and leader != old else None


def _replica_lines(cfg, dlq: str) -> list[tuple[bool, bool]]:
    return [(r.ok, r.warn) for r in check_nats(cfg.sink.nats_jetstream, dlq) if r.name == "nats_replicas"]


def _warns_of(cfg, dlq: str, stream: str, server: str) -> bool:
    """`cdc check` warns that `stream` runs without its replica on `server`."""
    results = check_nats(cfg.sink.nats_jetstream, dlq)
    return any(r.warn and repr(stream) in r.message and server in r.message for r in results)


def test_stream_leader_killed_under_a_running_relay(mariadb, cluster, database, topic_prefix, tmp_path):
    prefix = topic_prefix
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    subjects = [f"{prefix}.{a}" for a in AGGREGATES]
    stream, dlq = f"{prefix}_events", f"{prefix}.dlq"
    create_streams(cluster, {stream: subjects, f"{prefix}_dlq": [dlq]}, num_replicas=3)
    raw = nats_raw_config(mariadb, cluster.nodes[0], database, prefix, tmp_path / "cp.json")
    raw["sink"]["nats_jetstream"]["servers"] = cluster.urls
    env = nats_env(mariadb, cluster.nodes[0])
    cfg = load_config(raw, env)
    cp = Path(raw["checkpoint"]["path"])
    writer = Writer(lambda: mariadb.connect(database), 10**9, pause_s=0.002, max_rows=30 if LONG else 5)
    writer.start()
    t0 = time.monotonic()
    kills, elections = 0, []
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _delivers(relay, cp)
        while kills < 2 or (LONG and writer.attempted < EVENTS and writer.is_alive()):
            leader = cluster.stream_leader(stream)
            name = leader.cluster.name
            leader.kill()
            kills += 1
            t_kill = time.monotonic()
            wait_until(lambda: _new_leader(cluster, stream, name), 60, "a new leader of the stream")
            elections.append(time.monotonic() - t_kill)
            _delivers(relay, cp)  # published through the new leader, the old one still dead
            if kills == 1:  # JetStream's meta group may still be electing: asked until it answers
                wait_until(lambda: _warns_of(cfg, dlq, stream, name), 60, f"cdc check to name {stream} and {name}")
            leader.restart(graceful=False)  # SIGKILLed already: starts it on its store
            wait_until(lambda: _replicas_current(cluster, stream), 120, "the restarted replica to catch up")
            _delivers(relay, cp)
        # the dead-letter stream's replica on the restarted server catches up on its own time
        wait_until(lambda: _replica_lines(cfg, dlq) == [(True, False)], 60, "cdc check to see every replica current")
        assert relay.alive(), f"the relay did not ride out the leader's deaths:\n{relay.log_text()[-3000:]}"
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(
        mariadb, database, raw, env, tmp_path, lambda: stream_records(cluster, [*subjects, dlq]), 600 if LONG else 240
    )
    print(
        f"\nNATS cluster: {kills} stream leader SIGKILLs (new leader after "
        f"{', '.join(f'{s:.1f}' for s in elections)} s) over {writer.attempted} attempted events "
        f"({writer.xa_prepared} XA) in {time.monotonic() - t0:.0f}s: {result.summary()}"
    )
    assert not (result.missing or result.duplicates or result.phantoms or result.truncated), result.summary()
    assert result.committed > (EVENTS // 2)
    # Before the publisher chained a replicated stream's messages (connectors/nats/chain.py), one
    # refused by the stream while it had no leader was sent again after a later one the new leader
    # stored: every key out of order in the long run.
    assert not result.reordered_keys, result.summary()


def _step_down(cluster, stream: str) -> None:
    """Ask the stream's leader to hand over (`$JS.API.STREAM.LEADER.STEPDOWN.<stream>`)."""
    import asyncio

    import nats

    async def ask() -> None:
        nc = await nats.connect(**cluster.connect_settings())
        try:
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
        finally:
            await nc.close()

    asyncio.run(ask())


@pytest.mark.parametrize("fault", ["kill", "step_down"])
def test_the_publisher_keeps_order_across_stream_leader_changes(cluster, topic_prefix, fault):
    """The publisher alone, connected to one server that does not lead the stream, publishing
    without pause (up to 8,000 messages waiting) while the stream's leader is SIGKILLed three
    times, or asked to step down ten times: a message on the wire when the leader goes can be
    lost with it or refused (503) while later ones reach the new leader; the stream must hold
    every message once, in publish order (connectors/nats/chain.py)."""
    import threading

    from cdc.config import NatsJetStreamConfig, Secret
    from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE
    from connectors.nats.sink import NatsJetStreamPublisher
    from spark_jobs.nats.source import plan_nats, read_range

    subject, stream = f"{topic_prefix}.order", f"{topic_prefix}_events"
    create_streams(cluster, {stream: [subject]}, num_replicas=3)
    s = cluster.connect_settings()
    leader = cluster.stream_leader(stream)
    follower = next(node for node in cluster.nodes if node is not leader)
    cfg = NatsJetStreamConfig(
        servers=(follower.url,), user=s["user"], password=Secret(s["password"]), ack_timeout_s=3.0
    )
    publisher = NatsJetStreamPublisher(cfg)
    reports: list = []
    stop = threading.Event()
    published, left = [0], [-1]

    def publish() -> None:  # in a thread of its own: a server restarted from a thread dies with it
        n = 0
        while not stop.is_set():
            n += 1
            headers = [(H_SOURCE, b"s"), (H_FILE, b"bin.000001"), (H_POS, str(n).encode()), (H_ROW, b"0")]
            publisher.publish(subject, b"k", b"v%d" % n, headers, reports.append)
            publisher.poll(0 if publisher.pending() < 8000 else 0.05)
            if fault == "kill" and n % 10 == 0:
                # about 10,000 a second at most: the read-back stays short. Step-downs get the
                # publisher's full rate: the old publisher's reorder showed at that rate only
                # (3 of 436,999 out of order), not at this one.
                time.sleep(0.001)
        published[0] = n
        left[0] = publisher.flush(120)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        for _ in range(10 if fault == "step_down" else 0):
            time.sleep(1.0)
            name = cluster.stream_leader(stream).cluster.name
            _step_down(cluster, stream)
            wait_until(lambda name=name: _new_leader(cluster, stream, name), 60, "a new leader of the stream")
        for _ in range(3 if fault == "kill" else 0):
            time.sleep(1.5)
            leader = cluster.stream_leader(stream)
            if leader is follower:  # the publisher's server took the lead: kill another one
                leader = next(node for node in cluster.nodes if node is not follower)
            name = leader.cluster.name
            leader.kill()
            wait_until(lambda name=name: _new_leader(cluster, stream, name), 60, "a new leader of the stream")
            time.sleep(1.5)
            leader.restart(graceful=False)
            wait_until(lambda: _replicas_current(cluster, stream), 120, "the restarted replica to catch up")
        time.sleep(1.5)
    finally:
        stop.set()
        thread.join(180)
        publisher.close()
    n = published[0]
    print(f"\nNATS publisher, leader {fault}: {n} messages published, {publisher.reconnects} reconnects")
    assert left[0] == 0, f"{left[0]} of {n} messages not acknowledged"
    assert len(reports) == n and not [r for r in reports if r.failure is not None]
    [part] = plan_nats(s, [subject])["partitions"]
    stored = [int(dict(r.headers())[H_POS]) for r in read_range(s, subject, part["stream"], part["low"], part["high"])]
    out_of_order = sum(1 for a, b in itertools.pairwise(stored) if b < a)
    assert stored == list(range(1, n + 1)), f"{n} published, {len(stored)} stored, {out_of_order} out of order"


def test_a_replicated_streams_dropped_messages_are_sent_again_in_order(topic_prefix):
    """On a replicated stream a message dropped for a full buffer (429, the servers'
    `jetstream.max_buffered_msgs` below the publisher's window) is sent again, in order: the
    chain (connectors/nats/chain.py) has every later message refused behind it, so none is
    stored before it. Every message once, in publish order, none failed."""
    from cdc.config import NatsJetStreamConfig, Secret
    from cdc.events.identity import H_POS
    from connectors.nats.sink import NatsJetStreamPublisher
    from spark_jobs.nats.source import plan_nats, read_range
    from testbed.nats import NatsCluster
    from tests.integration.test_nats_sink import _publish_burst

    subject, stream = f"{topic_prefix}.order", f"{topic_prefix}_events"
    with NatsCluster.start(max_buffered_msgs=500) as cluster:
        create_streams(cluster, {stream: [subject]}, num_replicas=3)
        s = cluster.connect_settings()
        cfg = NatsJetStreamConfig(
            servers=tuple(s["servers"]), user=s["user"], password=Secret(s["password"]), max_in_flight=20_000
        )
        publisher = NatsJetStreamPublisher(cfg)
        try:
            reports, _ = _publish_burst(publisher, subject, 30_000, b"s")
        finally:
            publisher.close()
        assert len(reports) == 30_000 and not [r.failure for r in reports if r.failure is not None]
        [part] = plan_nats(s, [subject])["partitions"]
        records = read_range(s, subject, part["stream"], part["low"], part["high"])
        assert [int(dict(r.headers())[H_POS]) for r in records] == list(range(1, 30_001))
