"""Avro encoding of outbox events in the Confluent wire format (implements
cdc.ports.Serializer).

Wire format: magic byte 0, the schema id as 4 big-endian bytes, then the Avro binary
body. The envelope schema is `avro/outbox_event.avsc`; it is registered once per topic
under the subject `<topic>-value` (Confluent's TopicNameStrategy) in any registry that
speaks the Confluent REST API (connectors/schema_registry/client.py; `mock://` for tests, an in-process fake); the registry is
asked once per topic, not per event. The envelope's body is written by `_envelope_body`
(its six fields in their fixed order, the shapes the outbox mapping produces); an event
outside those shapes, and every other schema, goes through fastavro on a pre-parsed schema.

fastavro is imported when first needed (`_parsed`): the reader process imports this
module on its way to its first event, and the envelope's events never need fastavro
(its import was about a third of this module's: 13 of 40 ms, `python -X importtime`).
"""

from __future__ import annotations

import io
import ssl
import struct
from typing import Any

from cdc.errors import ConfigError, RegistryError
from cdc.events.formats import blank, payload_value
from cdc.events.outbox import OutboxEvent
from connectors.schema_registry.avro_schemas import OUTBOX_EVENT, schema, schema_text
from connectors.schema_registry.client import MockRegistry, RestRegistry, SchemaRegistryError, new_client

MAGIC = b"\x00"
# format = "avro": the payload's own schema, as Debezium's AvroConverter registers it for
# the payload column (a nullable column is an optional Connect schema: a union with null)
PAYLOAD_SCHEMAS = {
    (False, True): '["null","string"]',
    (False, False): '"string"',
    (True, True): '["null","bytes"]',
    (True, False): '"bytes"',
}  # (binary, nullable) -> schema text


def registry_conf(reg: Any) -> dict[str, Any]:
    """The registry client's settings from `[schema_registry]` (cdc.config.RegistryConfig):
    basic auth or a bearer token (secrets), a CA to verify the registry's certificate, a
    client certificate and key (with its password) for mutual TLS. A plain URL (tests, the
    bench) has none of them."""
    if isinstance(reg, str):
        return {"url": reg}
    conf: dict[str, Any] = {"url": reg.url}
    if reg.basic_auth:
        conf["basic.auth.user.info"] = reg.basic_auth.reveal()
    if reg.bearer_token:
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf["bearer.auth.token"] = reg.bearer_token.reveal()
        # The client sends it as `target-sr-cluster` (Confluent Cloud); other registries ignore it.
        conf["bearer.auth.logical.cluster"] = reg.bearer_logical_cluster
        if reg.bearer_identity_pool:
            conf["bearer.auth.identity.pool.id"] = reg.bearer_identity_pool
    if reg.ca_file:
        conf["ssl.ca.location"] = reg.ca_file
    if reg.cert_file:
        conf["ssl.certificate.location"] = reg.cert_file
    if reg.key_file:
        conf["ssl.key.location"] = reg.key_file
    if reg.key_password:
        conf["ssl.key.password"] = reg.key_password.reveal()
    return conf


def _scrubbed(text: str, conf: dict[str, Any]) -> str:
    for key in ("basic.auth.user.info", "bearer.auth.token", "ssl.key.password"):
        if conf.get(key):
            text = text.replace(str(conf[key]), "***")
    return text


def registry_client(reg: Any) -> MockRegistry | RestRegistry:
    """The schema registry client of `[schema_registry]` (a cdc.config.RegistryConfig)."""
    conf = registry_conf(reg)
    try:
        # new_client gives the in-process fake for mock:// URLs, the REST client otherwise.
        return new_client(conf)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"schema registry TLS file not found: {exc.filename} (schema_registry.ca_file / cert_file / key_file)"
        ) from exc
    except ssl.SSLError as exc:
        raise ConfigError(
            f"schema registry TLS files cannot be used ({exc.reason or exc.__class__.__name__}): "
            "check schema_registry.cert_file, key_file and key_password"
        ) from exc
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError(f"schema registry settings are invalid: {_scrubbed(str(exc), conf)}") from exc


def _tls_reason(exc: BaseException | None) -> str:
    """The TLS failure behind a connection error (e.g. `CERTIFICATE_VERIFY_FAILED`), or ""."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return f"TLS: certificate verify failed: {exc.verify_message}"
        if isinstance(exc, ssl.SSLError):
            return f"TLS: {exc.reason or exc}"
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return ""


class ConfluentAvroSerializer:
    def __init__(self, client: MockRegistry | RestRegistry, schema_name: str = OUTBOX_EVENT):
        self._client = client
        self._text = schema_text(schema_name)
        self._name = schema_name
        self._envelope = schema_name == OUTBOX_EVENT  # the body _envelope_body writes
        # An envelope event's value holds its payload whole (`envelope_payload` reads it
        # back): the reader process leaves the payload out of what it sends the relay.
        self.payload_in_value = self._envelope
        self._headers: dict[Any, bytes] = {}
        # cdc.events.outbox.EnvelopeEncoder, for the reader process's short way (OutboxMapper.envelope_wire)
        self.envelope_body = _envelope_fields

    def schema_id(self, topic: str) -> int:
        return struct.unpack(">I", self._header(topic)[1:])[0]

    def _header(self, topic: str, text: str | None = None) -> bytes:
        key = topic if text is None else (topic, text)
        header = self._headers.get(key)
        if header is None:
            subject = f"{topic}-value"
            try:
                schema_id = self._client.register_schema(subject, text or self._text)
            except SchemaRegistryError as exc:
                hint = ""
                if exc.http_status_code in (401, 403):
                    hint = " (check schema_registry.basic_auth / bearer_token)"
                raise RegistryError(f"the schema registry refused subject {subject!r}: {exc}{hint}") from exc
            except Exception as exc:  # urllib's URLError, an OSError, an answer that is not JSON
                why = _tls_reason(exc)
                raise RegistryError(
                    f"the schema registry is unreachable ({why or type(exc).__name__}); "
                    "check schema_registry.url" + (", ca_file and cert_file" if why else "")
                ) from exc
            header = self._headers[key] = MAGIC + struct.pack(">I", schema_id)
        return header

    def encode(self, event: OutboxEvent, topic: str) -> bytes | None:
        """The value of `event` in its table's format (None: a tombstone, or a NULL payload
        that the format writes as a null value)."""
        extras = event.extras
        if extras is not None:
            payload = event.payload
            if extras.tombstone and blank(payload):
                return None
            if extras.format != "avro":
                return payload_value(extras.format, payload, extras)
            return self._encode_payload(payload, topic, extras.nullable)
        if self._envelope:
            # the header joined with the body's parts, not added to the joined body (one
            # copy of the value less), and looked up here before the registering call:
            # encode 1.90 -> 1.79 us (median; min 1.69 -> 1.62) for a bench-shaped event
            # (in-process A/B, 40 alternating rounds, a loaded machine)
            value = _envelope_body(event, self._headers.get(topic) or self._header(topic))
            if value is not None:
                return value
        out = io.BytesIO()
        out.write(self._header(topic))
        import fastavro

        fastavro.schemaless_writer(
            out,
            _parsed(self._name),
            {
                "id": event.event_id,
                "aggregate_type": event.aggregate_type,
                "aggregate_id": event.aggregate_id,
                "type": event.event_type,
                "payload": event.payload,
                "timestamp": event.timestamp_us,
            },
        )
        return out.getvalue()

    def envelope_head(self, topic: str) -> bytes:
        """The value's header for `topic` (cdc.events.outbox.EnvelopeEncoder; only the envelope
        schema's: `envelope_body` writes its body)."""
        return self._headers.get(topic) or self._header(topic)

    def _encode_payload(self, payload: str | bytes | None, topic: str, nullable: bool) -> bytes | None:
        """The payload as an Avro value of schema string / bytes (or its union with null): a
        NULL payload is a null value, as the AvroConverter writes a null."""
        if payload is None:
            return None
        binary = isinstance(payload, bytes)
        header = self._header(topic, PAYLOAD_SCHEMAS[(binary, nullable)])
        data = payload if isinstance(payload, bytes) else payload.encode()
        return b"".join((header, b"\x02" if nullable else b"", _zigzag(len(data)), data))


# The envelope's body in Avro's binary encoding (Avro specification 1.11, "Binary Encoding"):
# a record is its fields in schema order; a string is its UTF-8 length as a long, then the
# bytes; a union is the branch's index as a long, then the value; a long is zig-zag, then a
# base-128 varint, low group first. avro/outbox_event.avsc: id, aggregate_type,
# aggregate_id, type (strings), payload ["null","string","bytes"], timestamp ["null", long].
# Byte for byte what fastavro writes (tests/unit/test_avro_envelope.py holds it to that),
# at about a fifth of its cost per event: fastavro walks the parsed schema and a dict built
# for it, this only joins the parts.
_SHORT_LONGS = [bytes((n << 1,)) if n < 64 else bytes((((n << 1) & 0x7F) | 0x80, n >> 6)) for n in range(2048)]
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def _envelope_body(event: OutboxEvent, head: bytes = b"") -> bytes | None:
    """The envelope's Avro body of `event` after `head` (the wire format's header), or None
    when a field is not of the shape the mapping produces (see `_envelope_fields`)."""
    return _envelope_fields(
        head,
        event.event_id,
        event.aggregate_type,
        event.aggregate_id,
        event.event_type,
        event.payload,
        event.timestamp_us,
    )


def _envelope_fields(
    head: bytes,
    event_id: Any,
    aggregate_type: Any,
    aggregate_id: Any,
    event_type: Any,
    payload: Any,
    timestamp: Any,
) -> bytes | None:
    """The envelope's Avro body of these fields after `head`, or None when a field is not
    of the shape the mapping produces (not exactly str, a timestamp not an int in Avro's
    long range): fastavro then writes it, and raises what it raises for a value the schema
    cannot hold. Taking the fields, not an event, lets the reader process encode a row
    without building its OutboxEvent (`ConfluentAvroSerializer.envelope_body`).

    Written out field by field and joined once (no loop, no list of parts): 2.56 -> 1.88 us
    an event with the timestamp's `_varint` (process CPU, 30k bench-shaped events, best of 15
    alternating), on the reader process's path of every outbox event."""
    if type(event_id) is not str or type(aggregate_type) is not str:
        return None
    if type(aggregate_id) is not str or type(event_type) is not str:
        return None
    kind = type(payload)
    if kind is str:
        data = payload.encode()
        branch = b"\x02"
    elif kind is bytes:
        data = payload
        branch = b"\x04"
    elif payload is None:
        data, branch = b"", b"\x00"
    else:
        return None
    if type(timestamp) is int and _LONG_MIN <= timestamp <= _LONG_MAX:
        stamp = b"\x02" + _varint((timestamp << 1) ^ (timestamp >> 63))
    elif timestamp is None:
        stamp = b"\x00"
    else:
        return None
    a, c = event_id.encode(), aggregate_id.encode()
    na, nc = len(a), len(c)
    short = _SHORT_LONGS
    if payload is not None:
        n = len(data)
        branch += short[n] if n < 2048 else _zigzag(n)
    # The aggregate type and the event type repeat on nearly every event: their encoded
    # strings (length and UTF-8 bytes) are kept per text (`_text_field`).
    b = _TEXT_FIELDS.get(aggregate_type) or _text_field(aggregate_type)
    d = _TEXT_FIELDS.get(event_type) or _text_field(event_type)
    if (na | nc) < 2048:  # both below 2048 (a power of two): the table's prefixes
        return b"".join((head, short[na], a, b, short[nc], c, d, branch, data, stamp))
    return b"".join((head, _length(na), a, b, _length(nc), c, d, branch, data, stamp))


# An Avro string as written (its length as a long, then its UTF-8 bytes), per text, for the
# envelope's aggregate type and event type: a few distinct texts on every event. One dict
# look-up instead of encode, len and the length's look-up, twice: `_envelope_fields` 1122
# -> 887 ns an event (bench-shaped fields, min of 21 alternating x 30k, in-process). Bounded:
# past `_TEXT_FIELDS_LIMIT` texts, a new one is encoded each time.
_TEXT_FIELDS: dict[str, bytes] = {}
_TEXT_FIELDS_LIMIT = 4096


def _text_field(text: str) -> bytes:
    data = text.encode()
    field = _length(len(data)) + data
    if len(_TEXT_FIELDS) < _TEXT_FIELDS_LIMIT:
        _TEXT_FIELDS[text] = field
    return field


def _length(n: int) -> bytes:
    """A string's or bytes' length as an Avro long (n >= 0)."""
    return _SHORT_LONGS[n] if n < 2048 else _zigzag(n)


# An Avro long's varint for a zig-zagged value below 2**56 (eight groups of 7 bits; a
# timestamp in microseconds, 2**51 today, is one) without a loop: the three steps spread
# 28-bit halves to 32-bit slots, 14-bit quarters to 16-bit slots and 7-bit groups to bytes
# (each group's high bit left 0), then the continuation bits of all but the last byte are
# set and the int is written little-endian, low group first as Avro's varint is. 0.89 ->
# 0.53 us for a timestamp (process CPU, best of 15): the loop in `_zigzag` runs 8 times.
_VARINT_CONTINUE = [0] + [int.from_bytes(b"\x80" * (k - 1), "little") for k in range(1, 9)]


def _varint(n: int) -> bytes:
    """The varint of a zig-zagged long `n` (0 <= n < 2**64)."""
    if n >> 56:
        return _zigzag(n, zigzagged=True)
    size = (n.bit_length() + 6) // 7 or 1
    n = ((n & 0xFFFFFFF0000000) << 4) | (n & 0xFFFFFFF)
    n = ((n & 0x0FFFC0000FFFC000) << 2) | (n & 0x00003FFF00003FFF)
    n = ((n & 0x3F803F803F803F80) << 1) | (n & 0x007F007F007F007F)
    return (n | _VARINT_CONTINUE[size]).to_bytes(size, "little")


def _zigzag(n: int, zigzagged: bool = False) -> bytes:
    """An Avro long (zig-zag, base-128 varint) for n >= 0 (`zigzagged`: `n` is already
    zig-zag encoded, any long)."""
    if not zigzagged:
        n <<= 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode(value: bytes, schema_name: str = OUTBOX_EVENT) -> tuple[int, dict[str, Any]]:
    """(schema id, record) of a wire-format value; raises ValueError on a foreign one."""
    if len(value) < 5 or value[:1] != MAGIC:
        raise ValueError("not in the Confluent wire format (magic byte 0 and a schema id expected)")
    schema_id = struct.unpack(">I", value[1:5])[0]
    import fastavro

    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), _parsed(schema_name), None)
    if not isinstance(record, dict):  # the envelope schemas are records
        raise ValueError(f"not a {schema_name} record")
    return schema_id, record


def envelope_payload(value: bytes) -> str | bytes | None:
    """The payload field of an envelope value (what the row held: text, bytes or NULL), for
    a dead letter of an event whose payload did not cross the reader process's pipe. Rare:
    fastavro's reader, not a second hand-written layout. It reads the record's fields up to
    the payload only (a record's binary encoding is its fields in order, Avro specification
    1.11, "Binary Encoding"): the timestamp after it would become a datetime, which fails
    for a long outside datetime's years where the payload is still wanted whole."""
    if len(value) < 5 or value[:1] != MAGIC:
        raise ValueError("not in the Confluent wire format (magic byte 0 and a schema id expected)")
    import fastavro

    key = OUTBOX_EVENT + "#payload"
    if key not in _PARSED:
        envelope = schema(OUTBOX_EVENT)
        names = [f["name"] for f in envelope["fields"]]
        _PARSED[key] = fastavro.parse_schema({**envelope, "fields": envelope["fields"][: names.index("payload") + 1]})
    record = fastavro.schemaless_reader(io.BytesIO(value[5:]), _PARSED[key], None)
    if not isinstance(record, dict):  # a record schema reads a dict
        raise ValueError(f"not a {OUTBOX_EVENT} record")
    payload: str | bytes | None = record["payload"]
    return payload


_PARSED: dict[str, Any] = {}


def _parsed(name: str) -> Any:
    if name not in _PARSED:
        import fastavro

        _PARSED[name] = fastavro.parse_schema(schema(name))
    return _PARSED[name]
