"""The sinks beyond Kafka for the benchmarks: a real server started for the run, the
`[sink]` TOML a relay config needs for it, and a check that its first message arrived.

    with sink_server("nats_jetstream", "bench") as sink:   # topics bench.order, bench.dlq
        sink.toml, sink.env, sink.first_moved(), ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class SinkServer:
    toml: str  # the [sink] section (and its [sink.<kind>] table) for the relay's config
    env: dict[str, str]  # the secrets the section names by _env
    first_moved: Callable[[], bool]  # has the first event reached the topic?
    close: Callable[[], None]  # after the watch


@contextmanager
def sink_server(kind: str, prefix: str) -> Iterator[SinkServer]:
    if kind != "nats_jetstream":
        raise SystemExit(f"--sink {kind}: not one of: nats_jetstream")
    import nats
    from nats.js.api import StreamConfig

    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:

        async def stream_last() -> int:
            nc = await nats.connect(**server.connect_settings())
            try:
                js = nc.jetstream()
                if not await js.streams_info():
                    await js.add_stream(StreamConfig(name=f"{prefix}_events", subjects=[f"{prefix}.order"]))
                    await js.add_stream(StreamConfig(name=f"{prefix}_dlq", subjects=[f"{prefix}.dlq"]))
                return int((await js.stream_info(f"{prefix}_events")).state.last_seq)
            finally:
                await nc.close()

        asyncio.run(stream_last())
        toml = f"""
[sink]
kind = "nats_jetstream"
[sink.nats_jetstream]
servers = ["{server.url}"]
user = "{server.user}"
password_env = "BENCH_NATS_PASSWORD"
"""
        yield SinkServer(
            toml, {"BENCH_NATS_PASSWORD": server.password}, lambda: asyncio.run(stream_last()) > 0, lambda: None
        )
