"""The RabbitMQ exchange sink on a 3-node RabbitMQ 3.10 cluster (testbed/rabbitmq_cluster.py,
three nodes on this machine): a topic exchange, the audit stream a replicated stream
(`x-initial-cluster-size: 3`, its leader on the second node) and a consumer's quorum queue
(`x-queue-type: quorum`, its leader on the third) both bound with `#`. While a writer commits
mixed transactions (1-5 events, some rolled back, a tenth XA) and one `cdc run` publishes
(`host` the first node, `hosts` and `stream_hosts` the other two), the node the relay's AMQP
0-9-1 connection is on is SIGKILLed: the relay must go on through the next node, re-sending
only what the audit stream (read on its leader) does not hold; the node is restarted; then the
audit stream's leader's node is SIGKILLed and restarted. Afterwards a clean relay catches up
and:

* the independent checker compares the binlog's committed outbox inserts with the audit
  stream, read on its leader by the verifier's reader: 0 missing, 0 duplicates, 0 keys out of
  order;
* and with the quorum queue, drained over AMQP 0-9-1 (its order per key is the queue's order,
  a copy's first place counted): 0 keys out of order, and only what docs/sinks.md ("What your
  queues get") says a node crash can do to a queue beside the audit stream: missing at most
  the messages unconfirmed at a node's death that the audit stream held (the relay's
  reconnect lines count them; it does not send those again), copies at most those it sent
  again (seen: 587 missing of 611 such messages in one long run; 0 in the short runs);
* `cdc verify` (Spark) on the audit stream is clean.

Short by default (two node kills). The long run is the `extended` tier (tests/README.md: left
out of `./run.sh test`, run by `-m extended`): >= 50k events, node kills round the cluster (each round the
AMQP-connected node, the audit stream's leader, then the node neither was, the first time the
quorum queue's leader) and the relay SIGKILLed after every other round:

    python -m pytest tests/integration/test_rabbitmq_exchange_cluster.py -m extended -s
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cdc.config import load_config
from connectors.rabbitmq.exchange_sink import check_rabbitmq_exchange
from testbed.process import HOST
from tests.integration.final_relay import catch_up_and_check
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.independent_checker import TopicRecord, check, committed_outbox_events
from tests.integration.rabbit_exchange import audit_records, drain_queue, event_id_of, exchange_raw_config, names
from tests.integration.rabbit_streams import rabbit_cluster, rabbit_env  # noqa: F401  # the module's cluster fixture
from tests.integration.test_faults import Writer
from tests.integration.test_nats_sink_faults import _delivers

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.slow]
LONG_EVENTS = int(os.environ.get("CDC_RABBIT_EXCHANGE_CLUSTER_EVENTS", "50000"))


def _declare(cluster, prefix: str) -> None:
    """The exchange; the audit stream declared through the second node, the quorum queue
    through the third, each with `x-queue-leader-locator: client-local` (its first leader on
    the node it is declared through: https://www.rabbitmq.com/streams.html#leader-election,
    https://www.rabbitmq.com/quorum-queues.html), on all three nodes."""
    import aiormq

    n = names(prefix)

    async def on(node, fn) -> None:
        connection = await aiormq.connect(f"amqp://{node.user}:{node.password}@{HOST}:{node.amqp_port}/")
        try:
            await fn(await connection.channel())
        finally:
            await connection.close()

    async def exchange(ch) -> None:
        await ch.exchange_declare(n.exchange, exchange_type="topic", durable=True)

    async def audit(ch) -> None:
        args = {"x-queue-type": "stream", "x-initial-cluster-size": 3, "x-queue-leader-locator": "client-local"}
        await ch.queue_declare(n.audit, durable=True, arguments=args)
        await ch.queue_bind(n.audit, n.exchange, routing_key="#")

    async def quorum(ch) -> None:
        args = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3, "x-queue-leader-locator": "client-local"}
        await ch.queue_declare(n.queue, durable=True, arguments=args)
        await ch.queue_bind(n.queue, n.exchange, routing_key="#")

    first, second, third = cluster.nodes
    for node, fn in ((first, exchange), (second, audit), (third, quorum)):
        asyncio.run(asyncio.wait_for(on(node, fn), 60))


def _raw(mariadb, cluster, database: str, prefix: str, cp: Path) -> dict:
    raw = exchange_raw_config(mariadb, cluster.nodes[0], database, prefix, cp)
    raw["sink"]["rabbitmq_exchange"].update(
        hosts=[f"{n.host}:{n.amqp_port}" for n in cluster.nodes[1:]],
        stream_hosts=[f"{n.host}:{n.stream_port}" for n in cluster.nodes[1:]],
        management_port=0,  # the cluster's nodes run no management plugin: `cdc check` warns, no more
    )
    return raw


def _amqp_node(cluster, relay: RelayProcess) -> Any:
    """The node the relay publishes through now (its last "publishing ... through host:port" line)."""
    ports = re.findall(r"publishing (?:to .* )?through [\w.]+:(\d+)", relay.log_text())
    assert ports, relay.log_text()[-2000:]
    return next(n for n in cluster.nodes if n.amqp_port == int(ports[-1]))


_RECONNECT = re.compile(
    r"(\d+) unconfirmed message\(s\) were routed \(the audit stream holds them\), (\d+) are sent again"
)


def _reconnects(workdir: Path) -> tuple[int, int]:
    """Over every relay of the run (their logs): the unconfirmed messages a reconnect found in
    the audit stream (not sent again), and those it sent again."""
    routed = again = 0
    for path in workdir.glob("relay-*.log"):
        for r, a in _RECONNECT.findall(path.read_text(errors="replace")):
            routed, again = routed + int(r), again + int(a)
    return routed, again


def _check_through_another_node(cfg, dead) -> None:
    """`cdc check` with `host` dead: AMQP 0-9-1 answered by the next node of `hosts`, the
    exchange and the audit stream found there."""
    lines = [(r.name, r.ok, r.message) for r in check_rabbitmq_exchange(cfg)]
    assert all(ok for _name, ok, _message in lines), lines
    said = next(message for name, _ok, message in lines if name == "rabbitmq")
    assert said.startswith(f"{HOST}:") and f":{dead.amqp_port} " not in said, said
    assert sum(name == "rabbitmq_exchange" for name, _ok, _message in lines) == 2, lines


def _leader_or_none(cluster, stream: str) -> Any:
    try:
        return cluster.stream_leader(stream)
    except Exception:  # no leader elected yet, or the node asked does not answer yet
        return None


def _audit_members(cluster, stream: str) -> bool:
    try:
        _leader, replicas = cluster.leader_and_replicas(stream)
    except Exception:
        return False
    return len(replicas) == len(cluster.nodes) - 1


def _queue_records(cluster, prefix: str) -> tuple[list[TopicRecord], int]:
    """The quorum queue's messages as the checker's records (the queue's order as offsets:
    a queue has no partitions, so its order per key is its order), and how many it held."""
    node = cluster.running_nodes()[0]
    out = []
    for i, m in enumerate(drain_queue(node, names(prefix).queue)):
        key = m.headers.get("cdc.key")
        out.append(TopicRecord(m.routing_key, 0, i, event_id_of(m.body), None if key is None else str(key)))
    return out, len(out)


def _kill_and_restart(
    cluster, relay: RelayProcess, cp: Path, node, audit: str, what: str, log: list[str], while_dead: Any = None
) -> None:
    t0 = time.monotonic()
    node.kill()
    _delivers(relay, cp)  # published through another node, this one still dead
    log.append(f"{what} {node.nodename.split('-')[0]} killed: publishing again after {time.monotonic() - t0:.1f}s")
    if while_dead is not None:
        while_dead()
    node.restart(graceful=False)  # SIGKILLed already: starts it on its data, and it rejoins
    wait_until(lambda: _audit_members(cluster, audit), 120, "the restarted node back in the audit stream")
    _delivers(relay, cp)


def _run(mariadb, cluster, database: str, prefix: str, tmp_path: Path, spark, events: int) -> None:
    long = events > 0
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    _declare(cluster, prefix)
    audit = names(prefix).audit
    assert cluster.stream_leader(audit) is cluster.nodes[1]
    cp = tmp_path / "cp.json"
    raw = _raw(mariadb, cluster, database, prefix, cp)
    env = rabbit_env(mariadb, cluster.nodes[0])
    cfg = load_config(raw, env)
    writer = Writer(
        lambda: mariadb.connect(database), 10**9, pause_s=0.01 if long else 0.004, max_rows=30 if long else 5
    )
    writer.start()
    t0 = time.monotonic()
    happened: list[str] = []
    relay_kills = 0
    relay = RelayProcess(raw, env, tmp_path)
    try:
        _delivers(relay, cp)
        assert _amqp_node(cluster, relay) is cluster.nodes[0]
        rounds = 0
        while rounds < 1 or (long and writer.attempted < events and writer.is_alive()):
            rounds += 1
            # the node the AMQP connection is on (not the audit stream's leader: the first time the first node)
            amqp_node = _amqp_node(cluster, relay)
            _kill_and_restart(
                cluster, relay, cp, amqp_node, audit, "AMQP node", happened,
                lambda: _check_through_another_node(cfg, amqp_node) if rounds == 1 else None,
            )  # fmt: skip
            leader = wait_until(lambda: _leader_or_none(cluster, audit), 60, "the audit stream's leader")
            _kill_and_restart(cluster, relay, cp, leader, audit, "audit leader", happened)
            if long:  # the node killed neither time this round (the first time the quorum queue's leader)
                rest = [n for n in cluster.nodes if n is not amqp_node and n is not leader]
                _kill_and_restart(cluster, relay, cp, rest[0], audit, "other node", happened)
            if long and rounds % 2 == 0:  # the relay dies too: a new one recovers from the audit stream
                relay.kill()
                relay_kills += 1
                relay = RelayProcess(raw, env, tmp_path)
                _delivers(relay, cp)
        assert relay.alive(), f"the relay did not ride out the node deaths:\n{relay.log_text()[-3000:]}"
    finally:
        relay.kill()
        writer.stop_flag.set()
        writer.finish()

    def audit_on_leader() -> list[TopicRecord]:
        return audit_records(cluster.stream_leader(audit), prefix)

    result = catch_up_and_check(mariadb, database, raw, env, tmp_path, audit_on_leader, 900 if long else 300)
    queued, held = _queue_records(cluster, prefix)
    firsts: dict[str, TopicRecord] = {}
    for record in queued:  # a copy (sent again) keeps its original's place: the order is the first copies'
        firsts.setdefault(record.event_id, record)
    copies = held - len(firsts)
    file, pos = raw["source"]["start"].split(":")
    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=file, start_pos=int(pos))
    in_queue = check(committed, list(firsts.values()))
    routed_unconfirmed, sent_again = _reconnects(tmp_path)

    from cdc_cli.verify_commands import verify_config
    from spark_jobs.verify import run_verify

    report = run_verify(verify_config(cfg, str(tmp_path / "verify"), start_file=file), spark=spark)
    print(
        f"\nRabbitMQ exchange sink on a 3-node cluster: {'; '.join(happened)}; {relay_kills} relay SIGKILLs; "
        f"unconfirmed at the reconnects: {routed_unconfirmed} in the audit stream already, {sent_again} sent again; "
        f"{writer.attempted} attempted events "
        f"({writer.xa_prepared} XA) in {time.monotonic() - t0:.0f}s; cluster start {cluster.timings['start']:.1f}s; "
        f"audit stream: {result.summary()}; quorum queue ({held} messages, {copies} copies): {in_queue.summary()}; "
        f"cdc verify: ok={report.ok} delivered={report.counts.get('delivered')}"
    )
    assert result.committed >= (events // 2 if long else 1)
    assert result.clean, result.summary()
    assert not (in_queue.reordered_keys or in_queue.phantoms or in_queue.duplicates), in_queue.summary()
    assert len(in_queue.missing) <= routed_unconfirmed, (in_queue.summary(), routed_unconfirmed)
    assert copies <= sent_again, (copies, sent_again)
    assert report.ok, report.problems
    assert report.counts["delivered"] == result.committed


@pytest.mark.spark
def test_amqp_node_and_audit_leader_killed_under_a_running_relay(
    mariadb,
    rabbit_cluster,  # noqa: F811
    database,
    topic_prefix,
    tmp_path,
    spark,
):
    _run(mariadb, rabbit_cluster, database, topic_prefix, tmp_path, spark, 0)


@pytest.mark.spark
@pytest.mark.extended
def test_long_node_kills_round_the_cluster(
    mariadb,
    rabbit_cluster,  # noqa: F811
    database,
    topic_prefix,
    tmp_path,
    spark,
):
    _run(mariadb, rabbit_cluster, database, topic_prefix, tmp_path, spark, LONG_EVENTS)
