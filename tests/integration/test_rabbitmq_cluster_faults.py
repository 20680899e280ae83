"""The RabbitMQ Streams sink on a 3-node RabbitMQ 3.10 cluster (testbed/rabbitmq_cluster.py,
three nodes on this machine), its streams declared with `x-initial-cluster-size: 3`: while
a writer commits mixed transactions (1-5 events, some rolled back, a tenth XA) and one `cdc
run` publishes (`host` the first node, `hosts` the other two), the node that leads the
events' stream is SIGKILLed; the relay must go on publishing through the new leader,
`cdc check`'s lines name the dead-letter stream and the dead node, then the node is started again.
Afterwards a clean relay catches up and the independent checker compares the binlog's
committed outbox inserts with what the streams hold, read from each stream's leader by the
verifier's reader: 0 missing, 0 duplicates, 0 keys out of order.

Short by default (two leader deaths, the first of them the node named in `host`). The run
of record (a leader killed again and again while 50k events are written, and the relay
SIGKILLed and started again after every other leader death):

    CDC_RABBIT_CLUSTER_EVENTS=50000 python -m pytest tests/integration/test_rabbitmq_cluster_faults.py -s

That run, 2026-11-29: 13 leader SIGKILLs (a new leader after 0.2-4.1 s), 6 relay SIGKILLs,
51,737 events attempted, 48,338 committed and in the streams: 0 missing, 0 duplicates, 0
keys out of order (one run, clean; an earlier one stopped on the writer's lost XA decision
described in `test_faults.Writer._decide`, before it was asked again).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cdc.config import load_config
from connectors.rabbitmq.stream_sink import check_rabbitmq
from tests.integration.final_relay import catch_up_and_check
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.rabbit_streams import (
    cluster_raw_config,
    cluster_stream_records,
    rabbit_cluster,  # noqa: F401  # the module's cluster fixture
    rabbit_env,
)
from tests.integration.test_faults import AGGREGATES, Writer
from tests.integration.test_nats_sink_faults import _delivers

pytestmark = [pytest.mark.integration, pytest.mark.fault]
EVENTS = int(os.environ.get("CDC_RABBIT_CLUSTER_EVENTS", "0"))
LONG = EVENTS >= 20_000


def _new_leader(cluster, stream: str, old) -> object | None:
    try:
        leader = cluster.stream_leader(stream)
    except Exception:  # no leader elected yet (LeaderNotAvailable), or no node answers yet
        return None
    return leader if leader is not old else None


def _all_members(cluster, stream: str) -> bool:
    try:
        _leader, replicas = cluster.leader_and_replicas(stream)
    except Exception:
        return False
    return len(replicas) == len(cluster.nodes) - 1


def _replica_lines(cfg) -> list[tuple[bool, str]]:
    return [(r.warn, r.message) for r in check_rabbitmq(cfg) if r.name == "rabbitmq_replicas"]


def _warns_of(cfg, stream: str, node) -> bool:
    """`cdc check` warns that `stream` runs without its member on `node` (named by address)."""
    address = f"{node.host}:{node.stream_port}"
    return any(warn and repr(stream) in line and address in line for warn, line in _replica_lines(cfg))


def test_the_publisher_connects_to_each_streams_leader(rabbit_cluster, topic_prefix):  # noqa: F811
    """Two streams led by the two nodes not named in `host`: one publishing connection to each
    leader (RabbitMQ 3.10 also takes a publisher on a node that does not lead the stream, and
    forwards: measured, so only where the publisher is declared tells the two apart)."""
    from connectors.rabbitmq.stream_reader import StreamSettings
    from connectors.rabbitmq.stream_sink import RabbitStreamPublisher

    cluster = rabbit_cluster
    first, second, third = cluster.nodes
    streams = {f"{topic_prefix}.a": second, f"{topic_prefix}.b": third}
    for name, leader in streams.items():
        cluster.create_stream(name, leader=leader)
        assert cluster.stream_leader(name) is leader
    settings = StreamSettings(
        first.host, first.stream_port, "/", first.user, first.password,
        hosts=((second.host, second.stream_port), (third.host, third.stream_port)),
    )  # fmt: skip
    publisher = RabbitStreamPublisher(settings, f"cdc-relay.{topic_prefix}")
    try:
        deliveries: list = []
        for name in streams:
            for n in range(3):
                publisher.publish(name, f"k{n}".encode(), b"v", [], deliveries.append)
        assert publisher.flush(30) == 0
        assert sorted((d.topic, d.offset, d.failure) for d in deliveries) == [
            (name, n, None) for name in streams for n in range(3)
        ]
        declared_on = {s.name: s.client for s in publisher._streams.values()}
        at = {id(c): address for address, c in publisher._clients.items()}
        assert {name: at[id(c)] for name, c in declared_on.items()} == {
            name: (leader.host, leader.stream_port) for name, leader in streams.items()
        }
    finally:
        publisher.close()


def test_stream_leader_killed_under_a_running_relay(mariadb, rabbit_cluster, database, topic_prefix, tmp_path):  # noqa: F811
    cluster, prefix = rabbit_cluster, topic_prefix
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topics = [f"{prefix}.{a}" for a in AGGREGATES] + [f"{prefix}.dlq"]
    for topic in topics:  # x-initial-cluster-size 3; the events' leader on the first node, the others elsewhere
        cluster.create_stream(topic, leader=cluster.nodes[0 if topic == topics[0] else 1])
    events = topics[0]
    raw = cluster_raw_config(mariadb, cluster, database, prefix, tmp_path / "cp.json")
    env = rabbit_env(mariadb, cluster.nodes[0])
    cfg = load_config(raw, env)
    cp = Path(raw["checkpoint"]["path"])
    dlq = topics[-1]  # the check's streams: the dead-letter's and fixed topics' (the events' topic is a template)
    assert [warn for warn, _ in _replica_lines(cfg)] == [False]
    assert cluster.stream_leader(events) is cluster.nodes[0]  # the first death is the node named in `host`
    # the long run writes slower than the relay publishes (50k in about 2 min at a 2 ms pause):
    # a 10 ms pause spreads its events over more leader deaths
    writer = Writer(
        lambda: mariadb.connect(database), 10**9, pause_s=0.01 if LONG else 0.002, max_rows=30 if LONG else 5
    )
    writer.start()
    t0 = time.monotonic()
    kills, relay_kills, elections = 0, 0, []
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _delivers(relay, cp)

        # while the writer writes: each round waits for the relay to publish something new
        while kills < 2 or (LONG and writer.attempted < EVENTS and writer.is_alive()):
            leader = cluster.stream_leader(events)
            leader.kill()
            kills += 1
            t_kill = time.monotonic()
            wait_until(lambda: _new_leader(cluster, events, leader), 60, "a new leader of the stream")
            elections.append(time.monotonic() - t_kill)
            _delivers(relay, cp)  # published through the new leader, the old one still dead
            if kills == 1:
                # every stream has a member on every node: the dead-letter's runs without this one
                wait_until(lambda: _warns_of(cfg, dlq, leader), 30, f"cdc check to name {dlq} and the dead node")
            leader.restart(graceful=False)  # SIGKILLed already: starts it on its data
            wait_until(lambda: all(_all_members(cluster, t) for t in topics), 120, "the restarted member back")
            _delivers(relay, cp)
            if LONG and kills % 2 == 0:  # the relay dies too, and a new one starts on its checkpoint
                relay.kill()
                relay_kills += 1
                relay = RelayProcess(raw, env, tmp_path)
                _delivers(relay, cp)
        assert relay.alive(), f"the relay did not ride out the leader's deaths:\n{relay.log_text()[-3000:]}"
        assert [warn for warn, _ in _replica_lines(cfg)] == [False], _replica_lines(cfg)
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(
        mariadb, database, raw, env, tmp_path, lambda: cluster_stream_records(cluster, topics), 600 if LONG else 240
    )
    print(
        f"\nRabbitMQ cluster: {kills} stream leader SIGKILLs (new leader after "
        f"{', '.join(f'{s:.1f}' for s in elections)} s), {relay_kills} relay SIGKILLs, over {writer.attempted} "
        f"attempted events ({writer.xa_prepared} XA, {writer.retried_decisions} XA decisions asked again) in {time.monotonic() - t0:.0f}s; cluster start "
        f"{cluster.timings['start']:.1f}s: {result.summary()}"
    )
    assert result.committed > (EVENTS // 2)
    assert result.clean, result.summary()
