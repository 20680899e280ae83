"""Helpers of the RabbitMQ Streams sink's tests: the relay's configuration for a node of
`testbed/rabbitmq.py`, streams made ready, and everything the streams hold read back by the
verifier's own reader (`spark_jobs/rabbitmq/source.py`, not the relay's
`connectors/rabbitmq/stream_sink.py`) as the independent checker's records."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest

from cdc.events.sink_fields import partition_stream
from connectors.schema_registry.avro_schemas import schema
from tests.integration.harness import relay_raw_config
from tests.integration.independent_checker import TopicRecord

PASSWORD_ENV = "CDC_TEST_RABBITMQ_PASSWORD"


def rabbit_raw_config(db, rabbitmq, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> dict:
    """harness.relay_raw_config with `[sink] kind = "rabbitmq_stream"` on `rabbitmq`."""
    raw = relay_raw_config(db, SimpleNamespace(bootstrap_servers="unused:9"), database, prefix, checkpoint)
    raw["sink"] = {
        "kind": "rabbitmq_stream",
        "rabbitmq_stream": {
            "host": rabbitmq.host,
            "port": rabbitmq.stream_port,
            "user": rabbitmq.user,
            "password_env": PASSWORD_ENV,
            "empty_wait_s": 1.0,
        },
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        sub, _, subkey = key.partition("__")
        if subkey:
            raw.setdefault(section, {}).setdefault(sub, {})[subkey] = value
        elif key:
            raw.setdefault(section, {})[key] = value
        else:
            raw[section] = value
    return raw


def rabbit_env(db, rabbitmq) -> dict[str, str]:
    return {"CDC_TEST_MYSQL_PASSWORD": db.password or "", PASSWORD_ENV: rabbitmq.password}


def create_streams(rabbitmq, streams: list[str]) -> None:
    from rstream import Producer

    async def go() -> None:
        async with Producer(**rabbitmq.stream_settings()) as producer:
            for stream in streams:
                await producer.create_stream(stream)

    asyncio.run(go())


def create_topic(rabbitmq, topic: str, partitions: int = 1) -> None:
    create_streams(rabbitmq, [topic] if partitions == 1 else [partition_stream(topic, n) for n in range(partitions)])


def reader_settings(rabbitmq) -> dict[str, Any]:
    return {**rabbitmq.stream_settings(), "vhost": "/"}


def stream_messages(rabbitmq, topics: list[str]) -> list[Any]:
    """Every message the topics' streams hold, as the verifier reads them (LogRecords)."""
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range

    settings = reader_settings(rabbitmq)
    out: list[Any] = []
    for part in plan_rabbitmq(settings, topics, empty_wait=2.0)["partitions"]:
        out.extend(read_range(settings, part["topic"], part["partition"], part["stream"], part["low"], part["high"]))
    return out


def stream_records(rabbitmq, topics: list[str]) -> list[TopicRecord]:
    """The independent checker's records: event id from the Avro value (or, on the
    dead-letter topic, from the JSON row), key as text."""
    parsed = fastavro.parse_schema(schema())
    out = []
    for rec in stream_messages(rabbitmq, topics):
        value = rec.value() or b""
        if value[:1] == b"\x00":
            event_id = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)["id"]
        else:
            event_id = str(json.loads(value)["row"]["id"])
        key = rec.key().decode() if rec.key() is not None else None
        out.append(TopicRecord(rec.topic(), rec.partition(), rec.offset(), event_id, key))
    return out


@pytest.fixture(scope="module")
def rabbit_cluster():
    """A throwaway 3-node RabbitMQ 3.10 cluster (testbed/rabbitmq_cluster.py) for one test
    module: its tests kill and restart nodes, so a module gets its own (about 20-30 s to
    start here; `cluster.timings`)."""
    from testbed.rabbitmq_cluster import RabbitCluster

    with RabbitCluster.start() as cluster:
        yield cluster


def cluster_raw_config(db, cluster, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> dict:
    """`rabbit_raw_config` on the cluster: `host`/`port` the first node, `hosts` the others."""
    raw = rabbit_raw_config(db, cluster.nodes[0], database, prefix, checkpoint, **overrides)
    raw["sink"]["rabbitmq_stream"]["hosts"] = [f"{n.host}:{n.stream_port}" for n in cluster.nodes[1:]]
    return raw


def cluster_stream_records(cluster, topics: list[str]) -> list[TopicRecord]:
    """`stream_records` of each topic read from its stream's leader (a replica may lag it)."""
    out: list[TopicRecord] = []
    for topic in topics:
        out += stream_records(cluster.stream_leader(topic), [topic])
    return out


@contextmanager
def publishers_unread(node) -> Iterator[None]:
    """While inside, `node` reads no publisher's socket: a memory alarm (`vm_memory_high_watermark`
    0 blocks every publishing connection, https://www.rabbitmq.com/memory.html), as a frozen or
    loaded node reads late; what publishers send piles up unread. The default (0.4) again after."""
    node.ctl(["set_vm_memory_high_watermark", "0"])
    try:
        yield
    finally:
        node.ctl(["set_vm_memory_high_watermark", "0.4"])
