"""Helpers for the NATS JetStream sink's integration tests: a relay config for it, the
streams of a test, and every message of some subjects read by the verifier's own reader
(spark_jobs/nats/source.py, not the relay's connectors/nats/sink.py), as the independent
checker's records."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro

from connectors.schema_registry.avro_schemas import schema
from spark_jobs.nats.source import plan_nats, read_range
from tests.integration.harness import relay_raw_config
from tests.integration.independent_checker import TopicRecord


def nats_raw_config(db, nats_server, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> dict:
    """The harness's relay config, publishing to `nats_server` (no Kafka in it)."""
    raw = relay_raw_config(db, SimpleNamespace(bootstrap_servers="127.0.0.1:9"), database, prefix, checkpoint)
    nats = {
        "servers": [nats_server.url],
        "user": nats_server.user,
        "password_env": "CDC_TEST_NATS_PASSWORD",
        "ack_timeout_s": 3,
    }
    raw["sink"] = {"kind": "nats_jetstream", "nats_jetstream": nats}
    raw["topics"] = {"missing": "dead_letter"}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        (nats if section == "nats" else raw.setdefault(section, {}))[key] = value
    return raw


def nats_env(db, nats_server) -> dict[str, str]:
    return {"CDC_TEST_MYSQL_PASSWORD": db.password or "", "CDC_TEST_NATS_PASSWORD": nats_server.password}


def create_streams(nats_server, subjects: dict[str, list[str]], **config: Any) -> None:
    """One stream per entry: name -> subjects."""
    import nats
    from nats.js.api import StreamConfig

    async def run() -> None:
        nc = await nats.connect(**nats_server.connect_settings())
        try:
            js = nc.jetstream()
            for name, subs in subjects.items():
                await js.add_stream(StreamConfig(name=name, subjects=subs, **config))
        finally:
            await nc.close()

    asyncio.run(run())


def stream_records(nats_server, subjects: list[str]) -> list[TopicRecord]:
    """Every message of `subjects`, in sequence order, as the checker's records (event id
    from the Avro envelope, or the dead letter's JSON row)."""
    settings = nats_server.connect_settings()
    parsed = fastavro.parse_schema(schema())
    out: list[TopicRecord] = []
    for part in plan_nats(settings, subjects)["partitions"]:
        for rec in read_range(settings, part["topic"], part["stream"], part["low"], part["high"]):
            value = rec.value() or b""
            if value[:1] == b"\x00":
                event_id = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)["id"]
            else:
                event_id = str(json.loads(value)["row"]["id"])
            key = rec.key()
            out.append(TopicRecord(part["topic"], 0, rec.offset(), event_id, key.decode() if key else None))
    return out
