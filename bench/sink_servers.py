"""The sinks beyond Kafka for the benchmarks: a real server started for the run, the
`[sink]` TOML a relay config needs for it, and a check that its first message arrived.

    with sink_server("nats_jetstream", "bench") as sink:   # topics bench.order, bench.dlq
        sink.toml, sink.env, sink.first_moved(), ...
        round2 = sink.with_prefix("r1")                        # topics r1.order, r1.dlq, same server

`first_moved` is None for RabbitMQ 3.10: it has no command that says where a stream ends
(StreamStats came with 3.11), and subscribing to find out takes seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class SinkServer:
    toml: str  # the [sink] section (and its [sink.<kind>] table) for the relay's config
    env: dict[str, str]  # the secrets the section names by _env
    first_moved: Callable[[], bool] | None  # has the first event reached the topic? (None: not asked)
    close: Callable[[], None]  # after the watch
    pid: int | None = None  # the server's process (beam.smp, nats-server): its CPU beside the relay's
    # the same server with the topics of another prefix (a relay of its own, a later round)
    with_prefix: Callable[[str], SinkServer] | None = None


@contextmanager
def sink_server(kind: str, prefix: str) -> Iterator[SinkServer]:
    if kind == "rabbitmq_stream":
        with _rabbitmq(prefix) as sink:
            yield sink
        return
    if kind == "rabbitmq_exchange":
        with _rabbitmq_exchange(prefix) as sink:
            yield sink
        return
    if kind != "nats_jetstream":
        raise SystemExit(f"--sink {kind}: not one of: rabbitmq_stream, rabbitmq_exchange, nats_jetstream")
    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:
        yield _nats_prefix(server, prefix)


def _nats_prefix(server: Any, prefix: str) -> SinkServer:
    import nats
    from nats.js.api import StreamConfig

    async def stream_last(create: bool = False) -> int:
        nc = await nats.connect(**server.connect_settings())
        try:
            js = nc.jetstream()
            if create:
                await js.add_stream(StreamConfig(name=f"{prefix}_events", subjects=[f"{prefix}.order"]))
                await js.add_stream(StreamConfig(name=f"{prefix}_dlq", subjects=[f"{prefix}.dlq"]))
            return int((await js.stream_info(f"{prefix}_events")).state.last_seq)
        finally:
            await nc.close()

    asyncio.run(stream_last(create=True))
    toml = f"""
[sink]
kind = "nats_jetstream"
[sink.nats_jetstream]
servers = ["{server.url}"]
user = "{server.user}"
password_env = "BENCH_NATS_PASSWORD"
"""
    return SinkServer(
        toml,
        {"BENCH_NATS_PASSWORD": server.password},
        lambda: asyncio.run(stream_last()) > 0,
        lambda: None,
        server.pid,
        lambda other: _nats_prefix(server, other),
    )


@contextmanager
def _rabbitmq(prefix: str) -> Iterator[SinkServer]:
    """A RabbitMQ 3.10 node (testbed/rabbitmq.py) with the stream `<prefix>.order` (the
    dead-letter stream is made by the relay)."""
    from testbed.rabbitmq import EmbeddedRabbitMQ

    with EmbeddedRabbitMQ.start() as mq:
        yield _rabbitmq_prefix(mq, prefix)


def _rabbitmq_prefix(mq: Any, prefix: str) -> SinkServer:
    from rstream import Producer

    async def create() -> None:
        async with Producer(**mq.stream_settings()) as producer:
            await producer.create_stream(f"{prefix}.order", exists_ok=True)

    asyncio.run(create())
    toml = f"""
[sink]
kind = "rabbitmq_stream"
[sink.rabbitmq_stream]
host = "{mq.host}"
port = {mq.stream_port}
user = "{mq.user}"
password_env = "BENCH_RABBITMQ_PASSWORD"
"""
    return SinkServer(
        toml,
        {"BENCH_RABBITMQ_PASSWORD": mq.password},
        None,
        lambda: None,
        mq.pid,
        lambda other: _rabbitmq_prefix(mq, other),
    )


@contextmanager
def _rabbitmq_exchange(prefix: str) -> Iterator[SinkServer]:
    """A RabbitMQ 3.10 node (testbed/rabbitmq.py) with the topic exchange `<prefix>.ex`, its
    audit stream `<prefix>.audit` and a consumer's durable classic queue `<prefix>.consumer`,
    both bound with `#`: what a user of the exchange sink runs, and what the node does per
    message (a stream write and a persistent classic-queue write)."""
    from testbed.rabbitmq import EmbeddedRabbitMQ

    with EmbeddedRabbitMQ.start() as mq:
        yield _rabbitmq_exchange_prefix(mq, prefix)


def _rabbitmq_exchange_prefix(mq: Any, prefix: str) -> SinkServer:
    import aiormq

    async def declare() -> None:
        connection = await aiormq.connect(f"amqp://{mq.user}:{mq.password}@{mq.host}:{mq.amqp_port}/")
        try:
            ch = await connection.channel()
            await ch.exchange_declare(f"{prefix}.ex", exchange_type="topic", durable=True)
            await ch.queue_declare(f"{prefix}.audit", durable=True, arguments={"x-queue-type": "stream"})
            await ch.queue_declare(f"{prefix}.consumer", durable=True)
            for queue in (f"{prefix}.audit", f"{prefix}.consumer"):
                await ch.queue_bind(queue, f"{prefix}.ex", routing_key="#")
        finally:
            await connection.close()

    asyncio.run(declare())
    toml = f"""
[sink]
kind = "rabbitmq_exchange"
[sink.rabbitmq_exchange]
host = "{mq.host}"
port = {mq.amqp_port}
stream_port = {mq.stream_port}
management_port = 0
user = "{mq.user}"
password_env = "BENCH_RABBITMQ_PASSWORD"
exchange = "{prefix}.ex"
audit_stream = "{prefix}.audit"
"""
    return SinkServer(
        toml,
        {"BENCH_RABBITMQ_PASSWORD": mq.password},
        None,
        lambda: None,
        mq.pid,
        lambda other: _rabbitmq_exchange_prefix(mq, other),
    )
