"""Avro encoding of outbox events in the Confluent wire format (implements
cdc.ports.Serializer).

Wire format: magic byte 0, the schema id as 4 big-endian bytes, then the Avro binary
body. The envelope schema is `avro/outbox_event.avsc`; it is registered once per topic
under the subject `<topic>-value` (Confluent's TopicNameStrategy) in any registry that
speaks the Confluent REST API (`mock://` for tests, an in-process fake). Encoding itself
is fastavro on a pre-parsed schema: the registry is asked once per topic, not per event.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc.errors import ConfigError, RegistryError
from cdc.outbox import OutboxEvent
from connectors.avro_schemas import OUTBOX_EVENT, schema, schema_text

MAGIC = b"\x00"


def registry_client(url: str, basic_auth: str | None = None) -> SchemaRegistryClient:
    conf: dict[str, Any] = {"url": url}
    if basic_auth:
        conf["basic.auth.user.info"] = basic_auth
    try:
        # new_client gives the in-process fake for mock:// URLs, the REST client otherwise.
        return SchemaRegistryClient.new_client(conf)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"schema registry settings are invalid: {exc}") from exc


class ConfluentAvroSerializer:
    def __init__(self, client: SchemaRegistryClient, schema_name: str = OUTBOX_EVENT):
        self._client = client
        self._text = schema_text(schema_name)
        self._parsed = fastavro.parse_schema(schema(schema_name))
        self._headers: dict[str, bytes] = {}

    def schema_id(self, topic: str) -> int:
        return struct.unpack(">I", self._header(topic)[1:])[0]

    def _header(self, topic: str) -> bytes:
        header = self._headers.get(topic)
        if header is None:
            subject = f"{topic}-value"
            try:
                schema_id = self._client.register_schema(subject, Schema(self._text, "AVRO"))
            except SchemaRegistryError as exc:
                raise RegistryError(f"the schema registry refused subject {subject!r}: {exc}") from exc
            except Exception as exc:  # httpx/requests connection errors vary by version
                raise RegistryError(f"the schema registry is unreachable ({type(exc).__name__}); "
                                    "check schema_registry.url") from exc
            header = self._headers[topic] = MAGIC + struct.pack(">I", schema_id)
        return header

    def encode(self, event: OutboxEvent, topic: str) -> bytes:
        out = io.BytesIO()
        out.write(self._header(topic))
        fastavro.schemaless_writer(out, self._parsed, {
            "id": event.event_id,
            "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id,
            "type": event.event_type,
            "payload": event.payload,
            "timestamp": event.timestamp_us,
        })
        return out.getvalue()


def decode(value: bytes, schema_name: str = OUTBOX_EVENT) -> tuple[int, dict[str, Any]]:
    """(schema id, record) of a wire-format value; raises ValueError on a foreign one."""
    if len(value) < 5 or value[:1] != MAGIC:
        raise ValueError("not in the Confluent wire format (magic byte 0 and a schema id expected)")
    schema_id = struct.unpack(">I", value[1:5])[0]
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), _parsed(schema_name), None)
    if not isinstance(record, dict):  # the envelope schemas are records
        raise ValueError(f"not a {schema_name} record")
    return schema_id, record


_PARSED: dict[str, Any] = {}


def _parsed(name: str) -> Any:
    if name not in _PARSED:
        _PARSED[name] = fastavro.parse_schema(schema(name))
    return _PARSED[name]
