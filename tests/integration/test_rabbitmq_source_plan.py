"""The verifier's `cdc_rabbitmq` source plans without waiting on empty streams, against a real
RabbitMQ 3.10 node: 3.10's stream protocol has no StreamStats, so a stream's end is read by
subscribing to it, and an empty stream delivers nothing. The plan reads emptiness at once
(a request answered after the Subscribe is the barrier: spark_jobs/rabbitmq/source.py), so
`empty_wait` no longer costs every plan of `cdc verify` (and every micro-batch of `cdc verify
--follow`) its seconds per empty stream."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.rabbit_streams import create_streams, create_topic, reader_settings

pytestmark = pytest.mark.integration


def _publish(rabbitmq, stream: str, n: int) -> None:
    from rstream import AMQPMessage, Producer

    async def go() -> None:
        async with Producer(**rabbitmq.stream_settings()) as producer:
            for i in range(n):
                await producer.send_wait(stream, AMQPMessage(body=f"m{i}".encode()))

    asyncio.run(go())


EMPTY_WAIT = 10.0


def test_a_plan_does_not_wait_on_empty_streams(rabbitmq, topic_prefix):
    """Six streams `<topic>-0..5`, messages in two, and an empty audit stream, with
    `empty_wait` 10 s: the bounds are exact and each plan takes less than one such wait
    (before: a wait per empty stream). The bound is the wait itself, not a guess at how
    fast a plan is: a plan takes about 1.5 s on this machine under a load of 10, and a
    bound of 2 s failed once under load."""
    from spark_jobs.rabbitmq.source import plan_rabbitmq

    topic = f"{topic_prefix}.order"
    create_topic(rabbitmq, topic, partitions=6)
    _publish(rabbitmq, f"{topic}-0", 3)
    _publish(rabbitmq, f"{topic}-4", 5)
    audit = f"{topic_prefix}.audit"
    create_streams(rabbitmq, [audit])
    settings = reader_settings(rabbitmq)

    t0 = time.monotonic()
    plan = plan_rabbitmq(settings, [topic], empty_wait=EMPTY_WAIT)
    planned = time.monotonic() - t0
    bounds = {p["partition"]: (p["low"], p["high"]) for p in plan["partitions"]}
    assert bounds == {0: (0, 3), 1: (0, 0), 2: (0, 0), 3: (0, 0), 4: (0, 5), 5: (0, 0)}, bounds
    assert plan["partition_counts"] == {topic: 6} and plan["missing_topics"] == []
    assert planned < EMPTY_WAIT, f"planning six streams (four empty) took {planned:.1f} s: a wait on an empty one"

    t0 = time.monotonic()
    audit_plan = plan_rabbitmq({**settings, "audit_stream": audit}, [topic], empty_wait=EMPTY_WAIT)
    planned = time.monotonic() - t0
    [part] = audit_plan["partitions"]
    assert (part["stream"], part["low"], part["high"], part["routed"]) == (audit, 0, 0, True), part
    assert planned < EMPTY_WAIT, f"planning an empty audit stream took {planned:.1f} s: a wait on it"

    _publish(rabbitmq, audit, 2)  # no longer empty: its bounds, not (0, 0)
    [part] = plan_rabbitmq({**settings, "audit_stream": audit}, [topic], empty_wait=5.0)["partitions"]
    assert (part["low"], part["high"]) == (0, 2), part
