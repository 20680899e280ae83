"""Helpers of the RabbitMQ exchange sink's tests: a node of `testbed/rabbitmq.py` with the
management plugin too (`cdc check` reads the audit stream's bindings through its HTTP API),
the relay's configuration for it, the exchange / audit stream / a consumer's queue made
ready, the audit stream read back by the verifier's own reader (`spark_jobs/rabbitmq/source.py`,
not the relay's connectors/rabbitmq/exchange_sink.py) as the independent checker's records,
and a consumer's queue drained over AMQP 0-9-1."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro

from connectors.schema_registry.avro_schemas import schema
from testbed.process import HOST, free_port
from testbed.rabbitmq import EmbeddedRabbitMQ, _chown_tree
from tests.integration.independent_checker import TopicRecord
from tests.integration.rabbit_streams import PASSWORD_ENV, rabbit_raw_config


class ManagedRabbitMQ(EmbeddedRabbitMQ):
    """EmbeddedRabbitMQ with rabbitmq_management on a free port of 127.0.0.1; started with
    `tls`, the management API over HTTPS too (`management.ssl.*` on `management_tls_port`,
    the node's certificate: https://www.rabbitmq.com/management.html#single-listener-https)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.management_port = free_port()
        self.management_tls_port = 0

    def _write_files(self) -> None:
        super()._write_files()
        with self.config_file.open("a") as conf:
            conf.write(f"management.tcp.port = {self.management_port}\nmanagement.tcp.ip = {HOST}\n")
            if self.tls is not None:
                self.management_tls_port = free_port()
                conf.write(
                    f"management.ssl.port = {self.management_tls_port}\nmanagement.ssl.ip = {HOST}\n"
                    f"management.ssl.cacertfile = {self.tls.ca}\nmanagement.ssl.certfile = {self.tls.cert}\n"
                    f"management.ssl.keyfile = {self.tls.key}\n"
                )
        (self.root / "enabled_plugins").write_text("[rabbitmq_stream,rabbitmq_management].\n")
        _chown_tree(self.root, self._ids)


@dataclass(frozen=True)
class Names:
    exchange: str
    audit: str
    queue: str  # a consumer's own queue, bound beside the audit stream


def names(prefix: str) -> Names:
    return Names(f"{prefix}.ex", f"{prefix}.audit", f"{prefix}.consumer")


def exchange_raw_config(db, node, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> dict:
    """rabbit_streams.rabbit_raw_config with `[sink] kind = "rabbitmq_exchange"` on `node`
    (exchange `<prefix>.ex`, audit stream `<prefix>.audit`), topics.missing "dead_letter"."""
    raw = rabbit_raw_config(db, node, database, prefix, checkpoint, topics__missing="dead_letter")
    n = names(prefix)
    raw["sink"] = {
        "kind": "rabbitmq_exchange",
        "rabbitmq_exchange": {
            "host": node.host, "port": node.amqp_port, "stream_port": node.stream_port,
            "management_port": getattr(node, "management_port", 0), "user": node.user, "password_env": PASSWORD_ENV,
            "exchange": n.exchange, "audit_stream": n.audit, "empty_wait_s": 1.0,
        },
    }  # fmt: skip
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        sub, _, subkey = key.partition("__")
        if subkey:
            raw.setdefault(section, {}).setdefault(sub, {})[subkey] = value
        elif key:
            raw.setdefault(section, {})[key] = value
    return raw


async def _channel(node) -> tuple[Any, Any]:
    import aiormq

    connection = await aiormq.connect(f"amqp://{node.user}:{node.password}@{node.host}:{node.amqp_port}/")
    return connection, await connection.channel()


def declare(
    node,
    prefix: str,
    audit_keys: list[str],
    queue_keys: list[str],
    audit: bool = True,
    audit_arguments: dict[str, Any] | None = None,
) -> Names:
    """The topic exchange, the audit stream bound with `audit_keys` (when `audit`; declared
    with `audit_arguments` too, e.g. retention), and a consumer's durable classic queue
    bound with `queue_keys`."""
    n = names(prefix)

    async def go() -> None:
        connection, ch = await _channel(node)
        try:
            await ch.exchange_declare(n.exchange, exchange_type="topic", durable=True)
            if audit:
                await ch.queue_declare(
                    n.audit, durable=True, arguments={"x-queue-type": "stream", **(audit_arguments or {})}
                )
                for key in audit_keys:
                    await ch.queue_bind(n.audit, n.exchange, routing_key=key)
            await ch.queue_declare(n.queue, durable=True)
            for key in queue_keys:
                await ch.queue_bind(n.queue, n.exchange, routing_key=key)
        finally:
            await connection.close()

    asyncio.run(go())
    return n


@dataclass(frozen=True)
class QueuedMessage:
    routing_key: str
    message_id: str | None
    delivery_mode: int | None
    headers: dict[str, Any]
    body: bytes


def drain_queue(node, queue: str) -> list[QueuedMessage]:
    """Everything `queue` holds, taken with basic.get and acknowledged (as its consumer would)."""

    async def go() -> list[QueuedMessage]:
        connection, ch = await _channel(node)
        out = []
        try:
            while True:
                msg = await ch.basic_get(queue, no_ack=True)
                if msg.delivery_tag is None or getattr(msg.delivery, "message_count", None) is None:
                    break
                props = msg.header.properties
                headers = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (props.headers or {}).items()}
                out.append(
                    QueuedMessage(msg.routing_key or "", props.message_id, props.delivery_mode, headers, msg.body)
                )
        finally:
            await connection.close()
        return out

    return asyncio.run(go())


def audit_messages(node, prefix: str) -> list[Any]:
    """Every message the audit stream holds, as the verifier reads it (LogRecords, the topic
    being each message's routing key)."""
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range

    settings = {**node.stream_settings(), "vhost": "/", "audit_stream": names(prefix).audit}
    out: list[Any] = []
    for part in plan_rabbitmq(settings, [], empty_wait=2.0)["partitions"]:
        out.extend(
            read_range(
                settings, part["topic"], part["partition"], part["stream"], part["low"], part["high"], routed=True
            )
        )
    return out


_PARSED = None


def event_id_of(value: bytes) -> str:
    global _PARSED
    if _PARSED is None:
        _PARSED = fastavro.parse_schema(schema())
    if value[:1] == b"\x00":
        record: Any = fastavro.schemaless_reader(io.BytesIO(value[5:]), _PARSED, None)
        return str(record["id"])
    return str(json.loads(value)["row"]["id"])


def audit_records(node, prefix: str) -> list[TopicRecord]:
    """The independent checker's records from the audit stream."""
    out = []
    for rec in audit_messages(node, prefix):
        key = rec.key().decode() if rec.key() is not None else None
        out.append(TopicRecord(rec.topic(), rec.partition(), rec.offset(), event_id_of(rec.value() or b""), key))
    return out
