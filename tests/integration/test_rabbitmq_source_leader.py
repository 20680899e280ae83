"""The verifier's `cdc_rabbitmq` source on a 3-node RabbitMQ 3.10 cluster
(testbed/rabbitmq_cluster.py): each stream is planned and read on its leader, not on the node
named in `host`, whose replica may lag.

The lag is made, not hoped for: on each leader's node, the osiris replica readers that ship
the streams' chunks to the first node's replicas are suspended (`sys:suspend`), so what is
published next is committed by the leader and the third node's replica (a majority of three)
and never reaches the first node, which still answers. Read there, a stream ends early; read
from its leader, it holds everything. The source's options are the ones `cdc verify` builds
from the relay's config (`cdc_cli.verify_commands.sink_source_options`: `host` the first node,
`hosts` the others). Then: the leader's advertised port made one nothing listens on (the
fallback through the configured node, with a warning), and the `host` node SIGKILLed (the
other nodes of `hosts` are asked). Read by the source's planner and reader as its Spark reader
calls them, and once through Spark (marker `spark`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from cdc.config import load_config
from cdc_cli.verify_commands import sink_source_options
from testbed.process import free_port
from tests.integration.harness import wait_until
from tests.integration.rabbit_streams import rabbit_cluster  # noqa: F401  # the module's cluster fixture

pytestmark = [pytest.mark.integration, pytest.mark.fault]


def _publish(node, stream: str, keys: range) -> None:
    """Messages with key `k<n>` and value `v<n>`, each confirmed (rstream publishes on the
    stream's leader)."""
    from rstream import AMQPMessage, Producer

    async def go() -> None:
        async with Producer(**node.stream_settings()) as producer:
            for n in keys:
                msg = AMQPMessage(body=f"v{n}".encode(), application_properties={"cdc.key": f"k{n}"})
                await producer.send_wait(stream, msg)

    asyncio.run(asyncio.wait_for(go(), 60))


def _replica_readers_to(node, replica_node, suspend: bool) -> int:
    """Suspend (or resume) the osiris replica readers on `node` whose state holds a pid on
    `replica_node` (the replica they ship chunks to): how many."""
    call = "suspend" if suspend else "resume"
    said = node.ctl_eval(
        "length([sys:%s(P) || P <- processes(), "
        "proc_lib:translate_initial_call(P) =:= {osiris_replica_reader, init, 1}, "
        "lists:any(fun(E) -> is_pid(E) andalso node(E) =:= '%s' end, tuple_to_list(sys:get_state(P)))])."
        % (call, replica_node.nodename)
    )
    return int(said.strip())


def _options(cluster, hosts: bool = True) -> dict[str, str]:
    """The source's options as `cdc verify` builds them from a relay config on the cluster."""
    first = cluster.nodes[0]
    rabbit: dict[str, Any] = {"host": first.host, "port": first.stream_port, "user": first.user,
                              "password_env": "CDC_TEST_RABBITMQ_PASSWORD"}  # fmt: skip
    if hosts:
        rabbit["hosts"] = [f"{n.host}:{n.stream_port}" for n in cluster.nodes[1:]]
    raw = {
        "source": {"name": "leader-test", "host": "127.0.0.1", "port": 3306, "user": "u", "password_env": "UNUSED"},
        "outbox": {"tables": [{"schema": "d", "table": "outbox", "topic": "t.{aggregate_type}"}]},
        "kafka": {"dead_letter_topic": "t.dlq"},
        "checkpoint": {"store": "file", "path": "/nonexistent/cp.json"},
        "sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": rabbit},
    }
    cfg = load_config(raw, {"UNUSED": "x", "CDC_TEST_RABBITMQ_PASSWORD": first.password})
    return sink_source_options(cfg)


def _read(options: dict[str, str], topics: list[str]) -> tuple[dict[str, tuple[int, int]], dict[str, list]]:
    """What the source plans and reads (`plan_rabbitmq`, `read_range`, as its Spark reader
    calls them): each stream's bounds, and its records as (offset, key, value)."""
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range, settings_from_options

    settings = settings_from_options(options)
    plan = plan_rabbitmq(settings, topics, empty_wait=2.0)
    bounds = {p["stream"]: (p["low"], p["high"]) for p in plan["partitions"]}
    records = {
        p["stream"]: [
            (r.offset(), r.key(), r.value())
            for r in read_range(settings, p["topic"], p["partition"], p["stream"], p["low"], p["high"])
        ]
        for p in plan["partitions"]
    }
    return bounds, records


def _bounds_on(node, stream: str) -> tuple[int, int]:
    """The stream's bounds read on `node` itself (its own member), not on the leader."""
    from spark_jobs.rabbitmq.source import _Session, stream_bounds

    session = _Session({**node.stream_settings(), "vhost": "/"}).open()
    try:
        return stream_bounds(session, stream, 2.0)
    finally:
        session.close()


def _expected(count: int) -> list[tuple[int, bytes, bytes]]:
    return [(n, f"k{n}".encode(), f"v{n}".encode()) for n in range(count)]


@pytest.mark.spark
def test_each_stream_is_read_on_its_leader(rabbit_cluster, topic_prefix, spark, caplog):  # noqa: F811
    cluster = rabbit_cluster
    first, second, third = cluster.nodes
    leaders = {f"{topic_prefix}.a": second, f"{topic_prefix}.b": third}
    topics = sorted(leaders)
    for stream, leader in leaders.items():
        cluster.create_stream(stream, leader=leader)
        assert cluster.stream_leader(stream) is leader
        _publish(leader, stream, range(5))
    # the first node's replicas have the first five before they are held back
    wait_until(lambda: all(_bounds_on(first, s) == (0, 5) for s in topics), 30, "the first node's replicas")
    try:
        for leader in (second, third):
            assert _replica_readers_to(leader, first, suspend=True) >= 1
        for stream, leader in leaders.items():
            _publish(leader, stream, range(5, 12))
        # the first node's members lag: read there, each stream ends at 5
        assert {s: _bounds_on(first, s) for s in topics} == dict.fromkeys(topics, (0, 5))

        options = _options(cluster)
        assert options["host"] == first.host and options["port"] == str(first.stream_port)
        assert options["hosts"] == f"{second.host}:{second.stream_port},{third.host}:{third.stream_port}"
        bounds, records = _read(options, topics)
        assert bounds == dict.fromkeys(topics, (0, 12))
        assert records == dict.fromkeys(topics, _expected(12))
        # the same through Spark, as `cdc verify` reads it (the options carried to the executors)
        reader = spark.read.format("cdc_rabbitmq").option("topics", ",".join(topics)).option("empty_wait", "2")
        for name, value in options.items():
            if name != "format":
                reader = reader.option(name, value)
        rows = reader.load().select("topic", "offset", "key", "value").collect()
        by_stream: dict[str, list] = {}
        for row in sorted(rows, key=lambda r: (r.topic, r.offset)):
            by_stream.setdefault(row.topic, []).append((row.offset, bytes(row.key), bytes(row.value)))
        assert by_stream == dict.fromkeys(topics, _expected(12))

        # the leader's advertised address reaches nothing: read through the configured node
        # (`host`, whose member lags: what the warning says), not a failure
        stream = topics[0]
        second.ctl_eval(f"application:set_env(rabbitmq_stream, advertised_port, {free_port()}).")
        try:
            with caplog.at_level(logging.WARNING, logger="spark_jobs.rabbitmq.source"):
                bounds, records = _read(options, [stream])
        finally:
            second.ctl_eval(f"application:set_env(rabbitmq_stream, advertised_port, {second.stream_port}).")
        assert bounds == {stream: (0, 5)} and records == {stream: _expected(5)}
        warned = [r.getMessage() for r in caplog.records if "advertised address" in r.getMessage()]
        assert warned and all(repr(stream) in w and f"{first.host}:{first.stream_port}" in w for w in warned)
        assert first.password not in caplog.text
    finally:
        for leader in (second, third):
            _replica_readers_to(leader, first, suspend=False)
    wait_until(lambda: all(_bounds_on(first, s) == (0, 12) for s in topics), 30, "the first node to catch up")


def test_a_stream_gone_since_the_plan_is_one_line(rabbit_cluster, topic_prefix):  # noqa: F811
    from spark_jobs.rabbitmq.source import read_range, settings_from_options

    gone = f"{topic_prefix}.gone"
    with pytest.raises(RuntimeError, match=rf"^cdc_rabbitmq: stream '{gone}' does not exist") as refused:
        list(read_range(settings_from_options(_options(rabbit_cluster)), gone, 0, gone, 0, 3))
    assert "\n" not in str(refused.value)


def test_the_host_node_down(rabbit_cluster, topic_prefix):  # noqa: F811
    """`host` SIGKILLed: the streams' metadata is asked of the nodes in `hosts`; without
    `hosts`, one line naming the node. Last in the module: the node stays down."""
    from spark_jobs.rabbitmq.source import plan_rabbitmq, settings_from_options

    cluster = rabbit_cluster
    first, second, third = cluster.nodes
    leaders = {f"{topic_prefix}.c": second, f"{topic_prefix}.d": third}
    topics = sorted(leaders)
    for stream, leader in leaders.items():
        cluster.create_stream(stream, leader=leader)
        _publish(leader, stream, range(4))
    first.kill()
    bounds, records = _read(_options(cluster), topics)
    assert bounds == dict.fromkeys(topics, (0, 4))
    assert records == dict.fromkeys(topics, _expected(4))
    with pytest.raises(RuntimeError) as refused:
        plan_rabbitmq(settings_from_options(_options(cluster, hosts=False)), topics)
    said = str(refused.value)
    assert f"{first.host}:{first.stream_port}" in said and "\n" not in said and first.password not in said


def test_a_hosts_entry_not_host_port_is_one_line():
    from spark_jobs.rabbitmq.source import settings_from_options

    assert settings_from_options({"hosts": " r2:5552, r3:5553 ,"})["hosts"] == [("r2", 5552), ("r3", 5553)]
    with pytest.raises(RuntimeError, match=r"^cdc_rabbitmq: option hosts: 'r2' is not \"host:port\"") as refused:
        settings_from_options({"hosts": "r2"})
    assert "\n" not in str(refused.value)
