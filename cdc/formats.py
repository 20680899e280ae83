"""Output formats: what a message's value, extra headers and timestamp are, per outbox table.

    envelope  (default) the relay's Avro record `avro/outbox_event.avsc` (Confluent wire format)
    string    the payload as the value, as Debezium's EventRouter + StringConverter write it:
              the stored text unchanged, UTF-8; a NULL payload is a null value
    json      the payload as Debezium's EventRouter with `table.expand.json.payload=true` +
              JsonConverter (`schemas.enable=false`) write it: the JSON re-serialised compactly
              (`{"n": 0}` -> `{"n":0}`, non-ASCII as UTF-8); a NULL payload is the 4 bytes `null`
    bytes     the payload's bytes as the value (text as UTF-8), a NULL payload a null value
    avro      the payload as an Avro value (Confluent wire format) registered under `<topic>-value`:
              schema `["null","string"]` for text (`"string"` with `payload_nullable = false`),
              `["null","bytes"]` / `"bytes"` for binary payloads: the schemas Debezium's
              AvroConverter registers for a nullable / NOT NULL payload column

In every format but the envelope, as Debezium's router does: the key is the aggregate id as
text, header `id` the event id, the record timestamp the `timestamp_column` (DATETIME -> epoch
ms) or else the commit time, additional columns go to headers (and, for `json`, into an
envelope `{"payload": ..., "<alias>": ...}`) by `additional_placement`
(`table.fields.additional.placement` syntax), a `traceparent_column` / `tracestate_column` is
copied to headers `traceparent` / `tracestate`, and `tombstone_on_empty_payload` makes a NULL or
blank payload a tombstone (null value). Header `cdc.format` names the format; the identity
headers (cdc/identity.py) are on every message in every format.

How Debezium's expansion (EventRouterDelegate, SchemaBuilderUtil, StructBuilderUtil in
debezium-core) shapes the JSON, and `debezium_json` follows: only a payload that starts with
`{` or `[` is parsed; one that does not, or does not parse, or whose inferred schema does not
hold its values, stays a string (the value is then a JSON string literal); object members whose
value is null are dropped (a null has no schema); an array's element type is its first non-null
element's, and an array mixing types (numbers of different kinds: int, long, double) is not
expandable; a top-level array becomes `{}` (its schema is a struct without fields; observed:
Debezium 3.6.3's JsonConverter fails the record, "Invalid type for ARRAY", for a top-level
array of objects, so its consumers never saw one); integers
beyond 64 bits are not expandable; doubles are written as Java's Double.toString does
(`1.0E7`, `1.0E-4`); control characters as Jackson escapes them (`\\u001F`).

Speed: the general rules are Python; an object whose shape makes json.dumps write exactly
those bytes (`_compact_as_debezium`: no null member, 64-bit integers, doubles Python and Java
both write in plain decimal, arrays of one kind or of objects with the same members) goes
through orjson's reader and writer instead (differential property tests, on documents and on
arbitrary texts, hold the two paths equal).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import uuid as _uuid
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from orjson import dumps as _orjson_dumps
from orjson import loads as _orjson_loads

from cdc.errors import ConfigError

ENVELOPE = "envelope"
FORMATS = (ENVELOPE, "string", "json", "bytes", "avro")
PAYLOAD_FORMATS = FORMATS[1:]
PLACEMENTS = ("header", "envelope")
H_FORMAT = "cdc.format"  # the format of a message's value (absent: the envelope)
H_TRACEPARENT = "traceparent"
H_TRACESTATE = "tracestate"


@dataclass(frozen=True, slots=True)
class AdditionalField:
    column: str
    placement: str  # header | envelope
    alias: str


@lru_cache(maxsize=64)
def parse_placement(text: str) -> tuple[AdditionalField, ...]:
    """Debezium's `table.fields.additional.placement`: `column:placement[:alias]`, comma
    separated; the alias defaults to the column's name."""
    out: list[AdditionalField] = []
    if not isinstance(text, str):
        raise ConfigError(f'additional_placement must be a string like "type:header:eventType", got {text!r}')
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        bits = [b.strip() for b in part.split(":")]
        if len(bits) not in (2, 3) or not all(bits):
            raise ConfigError(
                f'additional_placement entry {part!r} must be column:placement[:alias], e.g. "type:header:eventType"'
            )
        column, placement = bits[0], bits[1].lower()
        if placement == "partition":
            raise ConfigError(
                f'additional_placement entry {part!r}: placement "partition" is not supported (the '
                "relay partitions by the key, the aggregate id); use header or envelope"
            )
        if placement not in PLACEMENTS:
            raise ConfigError(f"additional_placement entry {part!r}: placement must be header or envelope")
        out.append(AdditionalField(column, placement, bits[2] if len(bits) == 3 else column))
    return tuple(out)


class MessageExtras:
    """What a non-envelope message carries besides its payload (one per event, built by the
    outbox mapper while it holds the row). Plain slots: built on the hot path and pickled
    to the relay's process."""

    __slots__ = ("envelope", "format", "headers", "null_value", "nullable", "timestamp_ms", "tombstone")

    def __init__(
        self,
        format: str,
        headers: list[tuple[str, bytes | None]],
        timestamp_ms: int | None,
        envelope: tuple[tuple[str, Any], ...],
        tombstone: bool,
        nullable: bool,
        null_value: bool = False,
    ):
        self.format, self.headers, self.timestamp_ms = format, headers, timestamp_ms
        self.envelope, self.tombstone, self.nullable = envelope, tombstone, nullable
        self.null_value = null_value  # set once encoded: the value is null (a tombstone, or a NULL payload)

    def __reduce__(self) -> Any:
        return (
            MessageExtras,
            (
                self.format,
                self.headers,
                self.timestamp_ms,
                self.envelope,
                self.tombstone,
                self.nullable,
                self.null_value,
            ),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageExtras) and self.__reduce__() == other.__reduce__()

    def __repr__(self) -> str:
        return f"MessageExtras({self.format!r}, headers={self.headers!r}, timestamp_ms={self.timestamp_ms!r})"


# ------------------------------------------------------------------------ column values


def header_value(value: Any) -> bytes | None:
    """A column as Kafka Connect's SimpleHeaderConverter writes it: text as UTF-8, numbers as
    their decimal text, booleans `true`/`false`, NULL as a null header. Dates and times as
    ISO-8601 text (Debezium would write its epoch number for them: see docs/output-formats.md)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, (bytes, bytearray)):
        if len(value) == 16:  # a BINARY(16) id reads as a UUID, as cdc.outbox.text_of reads it
            return str(_uuid.UUID(bytes=bytes(value))).encode()
        return bytes(value)
    if isinstance(value, float):
        return java_double(value).encode()
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat().encode()
    return str(value).encode()


def epoch_ms(value: Any) -> int | None:
    """An event-time column as a record timestamp: DATETIME (read as UTC, as the binlog
    holds it) -> epoch milliseconds, truncated toward zero like Debezium's `micros / 1000`;
    an integer column is taken as epoch milliseconds; NULL or anything else: None."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        micros = (value - (_EPOCH if value.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND  # exact, in C
        return micros // 1000 if micros >= 0 else -((-micros) // 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=_dt.UTC)
_MICROSECOND = _dt.timedelta(microseconds=1)


def blank(payload: str | bytes | None) -> bool:
    """Debezium's `payload == null || payload.toString().trim().isEmpty()`: Java's trim()
    removes characters up to U+0020 only."""
    if payload is None:
        return True
    if isinstance(payload, str):
        return not payload.strip(_JAVA_TRIM)
    return not payload


_JAVA_TRIM = "".join(chr(c) for c in range(33))


# ------------------------------------------------------------------------------- values


def payload_value(fmt: str, payload: str | bytes | None, extras: MessageExtras | None = None) -> bytes | None:
    """The value bytes of `payload` in the text formats (string, json, bytes); None is a
    null value. Raises ValueError for a payload the format cannot hold."""
    envelope = extras.envelope if extras is not None else ()
    if fmt == "json":
        if envelope:
            return json_envelope(payload, envelope).encode()
        return debezium_json_bytes(payload)
    if fmt == "string":
        if payload is None:
            return None
        if isinstance(payload, bytes):
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(
                    "the payload is binary and not UTF-8 text; the string format carries text: use "
                    'format = "bytes" for this table'
                ) from None
            return payload
        return payload.encode()
    if fmt == "bytes":
        if payload is None:
            return None
        return payload if isinstance(payload, bytes) else payload.encode()
    raise ValueError(f"format {fmt!r} has no text value")


def debezium_json(payload: str | bytes | None) -> str:
    """The JSON text Debezium's JsonConverter writes for `payload` after the router's
    expansion (see the module docstring)."""
    fast = _fast_json(payload)
    if fast is not None:
        return fast.decode()
    if payload is None:
        return "null"
    if isinstance(payload, bytes):
        # Debezium does not expand a binary payload: JsonConverter writes bytes as base64
        import base64

        return '"' + base64.b64encode(payload).decode() + '"'
    return _expand_text(payload)


def debezium_json_bytes(payload: str | bytes | None) -> bytes:
    """`debezium_json(payload)` as UTF-8: the value bytes of the json format. Raises
    ValueError for a document with a lone surrogate escape (`"\\ud800"`), which UTF-8
    cannot carry."""
    fast = _fast_json(payload)
    if fast is not None:
        return fast
    try:
        return debezium_json(payload).encode()
    except UnicodeEncodeError:
        raise ValueError(
            "the JSON payload holds a lone surrogate escape (\\uD800-\\uDFFF without its pair), which "
            'UTF-8 cannot carry; fix the writer, or use format = "string" for this table'
        ) from None


def _fast_json(payload: str | bytes | None) -> bytes | None:
    """The common case at C speed, or None for the general path: when the document is one
    `_compact_as_debezium` accepts, orjson writes exactly the bytes the general rules would.
    Anything orjson will not read (not JSON, NaN, a lone surrogate, beyond 1024 levels)
    takes the general path, which decides; an integer beyond 64 bits orjson reads as a
    double of at least 1.8e19, which `_compact_as_debezium` sends there too."""
    if type(payload) is not str or payload[:1] != "{":
        return None
    try:
        doc = _orjson_loads(payload)
        if type(doc) is dict and _compact_as_debezium(doc):
            out = _orjson_dumps(doc)
            if b"\\u00" not in out:  # no control character (Jackson writes upper-case hex)
                return out
    except (ValueError, TypeError, RecursionError):  # orjson.JSONDecodeError is a ValueError
        pass
    return None


def _expand_text(payload: str) -> str:
    """The general path of `debezium_json` for a text payload: every rule of the module
    docstring, in Python."""
    if payload[:1] not in ("{", "["):
        return _string_literal(payload)
    floats: list[float] = []
    try:
        doc = json.loads(payload, parse_float=lambda s: _note_float(floats, s), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return _string_literal(payload)
    try:
        return _expand(doc)
    except _NotExpandable:
        return _string_literal(payload)


_I32_LO, _I32_HI, _I64_LO, _I64_HI = -(2**31), 2**31 - 1, -(2**63), 2**63 - 1


def _plain_double(v: float) -> bool:
    """Python's repr of `v` is Java's Double.toString: zero, or 10^-3 <= |v| < 10^7 (plain
    decimal in both, the same shortest digits; NaN and infinities fail every comparison)."""
    return 1e-3 <= v < 1e7 or -1e7 < v <= -1e-3 or v == 0


def _compact_as_debezium(obj: dict) -> bool:
    """Whether `json.dumps(obj)` (compact) is Debezium's expansion of `obj` byte for byte:
    no null member (Debezium drops them), integers within 64 bits, doubles that Python and
    Java write alike, and arrays whose elements share one kind (`_array_as_debezium`).
    False only means "take the general path", never "not expandable"."""
    for v in obj.values():
        t = type(v)
        if t is str or t is bool:
            continue
        if t is int:
            if _I64_LO <= v <= _I64_HI:
                continue
            return False
        if t is float:
            if _plain_double(v):
                continue
            return False
        if t is dict:
            if _compact_as_debezium(v):
                continue
            return False
        if t is list:
            if _array_as_debezium(v):
                continue
            return False
        return False  # None
    return True


def _member_kind(v: Any) -> Any:
    t = type(v)
    if t is int:
        return "int32" if _I32_LO <= v <= _I32_HI else "int64"
    return t


def _array_as_debezium(items: list) -> bool:
    """An array Debezium writes as json.dumps does: empty; scalars of one kind (int32,
    int64, double, string, boolean; no null); or objects with the same members in the same
    order, each member of one kind across the elements (so the union schema adds nothing).
    Arrays of arrays take the general path."""
    if not items:
        return True
    first = items[0]
    t = type(first)
    if t is str or t is bool:
        return all(type(x) is t for x in items)
    if t is int:
        if not all(type(x) is int for x in items):
            return False
        if all(_I32_LO <= x <= _I32_HI for x in items):
            return True
        return all(_I64_LO <= x <= _I64_HI and not _I32_LO <= x <= _I32_HI for x in items)
    if t is float:
        return all(type(x) is float and _plain_double(x) for x in items)
    if t is dict:
        keys = list(first)
        kinds = list(map(_member_kind, first.values()))
        for x in items:
            if type(x) is not dict or not _compact_as_debezium(x):
                return False
            if x is not first and (list(x) != keys or list(map(_member_kind, x.values())) != kinds):
                return False
        return True
    return False


def json_envelope(payload: str | bytes | None, fields: tuple[tuple[str, Any], ...]) -> str:
    """The value when additional fields are placed in the envelope: a struct with `payload`
    and each alias, written by JsonConverter without schemas (a NULL column as null)."""
    parts = ['"payload":' + debezium_json(payload)]
    for alias, value in fields:
        parts.append(_jstr(alias) + ":" + _scalar(value))
    return "{" + ",".join(parts) + "}"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, str):
        return _jstr(value)
    return _jstr((header_value(value) or b"").decode())


class _NotExpandable(Exception):
    pass


def _note_float(floats: list[float], text: str) -> float:
    value = float(text)
    floats.append(value)
    return _JFloat(value)


class _JFloat(float):
    """A JSON number with a fraction or exponent: Jackson reads it as a double."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _kind(v: Any) -> str:
    """Debezium's inferred Connect type of a JSON value (None: no schema)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, str):
        return "str"
    if isinstance(v, _JFloat):
        return "double"
    if isinstance(v, int):
        if _INT32[0] <= v <= _INT32[1]:
            return "int32"
        if _INT64[0] <= v <= _INT64[1]:
            return "int64"
        raise _NotExpandable  # a BigInteger: FLOAT64 schema, BigDecimal value: the struct refuses it
    if isinstance(v, list):
        return "array"
    return "object"


def _expand(doc: Any) -> str:
    if isinstance(doc, list):
        return "{}"  # the schema of a top-level array is a struct with no fields
    return _object(doc)


def _object(obj: dict) -> str:
    parts = []
    for k, v in obj.items():
        if v is None:
            continue  # no schema for a null: the field is dropped
        parts.append(_jstr(k) + ":" + _value(v))
    return "{" + ",".join(parts) + "}"


def _value(v: Any) -> str:
    kind = _kind(v)
    if kind == "str":
        return _jstr(v)
    if kind == "bool":
        return "true" if v else "false"
    if kind == "double":
        return java_double(float(v))
    if kind in ("int32", "int64"):
        return str(v)
    if kind == "array":
        return _array(v)
    return _object(v)


def _array(items: list) -> str:
    if not items:
        return "[]"
    first = next((x for x in items if x is not None), None)
    if first is None:
        raise _NotExpandable  # no element to take a schema from
    kind = _kind(first)
    if kind == "object":
        return _object_array(items)
    for x in items:
        if x is not None and _kind(x) != kind:
            raise _NotExpandable  # not homogeneous, or a value its schema does not hold
    return "[" + ",".join("null" if x is None else _value(x) for x in items) + "]"


def _object_array(items: list) -> str:
    """Objects in an array share one struct schema, the union of their fields (in order of
    first appearance); a member an element lacks is written as null."""
    fields: dict[str, str] = {}
    for x in items:
        if x is None:
            continue
        if not isinstance(x, dict):
            raise _NotExpandable
        for k, v in x.items():
            if v is None:
                continue
            kind = _kind(v)
            if fields.setdefault(k, kind) != kind:
                raise _NotExpandable
    out = []
    for x in items:
        if x is None:
            out.append("null")
            continue
        out.append(
            "{" + ",".join(_jstr(k) + ":" + ("null" if x.get(k) is None else _value(x[k])) for k in fields) + "}"
        )
    return "[" + ",".join(out) + "]"


_LOWER_U = re.compile(r"\\u00([0-9a-f]{2})")


def _jstr(text: str) -> str:
    """A JSON string as Jackson writes it: non-ASCII as is, control characters escaped
    with upper-case hex (`\\u001F`), \\b \\t \\n \\f \\r short."""
    out = json.dumps(text, ensure_ascii=False)
    if "\\u00" in out:
        out = _LOWER_U.sub(lambda m: "\\u00" + m.group(1).upper(), out)
    return out


def _string_literal(text: str) -> str:
    return _jstr(text)


def java_double(value: float) -> str:
    """`Double.toString(value)`: plain decimal with at least one fraction digit for
    10^-3 <= |v| < 10^7, else `d.dddE[-]n`; digits are Python's shortest round-trip ones
    (Java 17's algorithm agrees except in rare cases that it writes one digit longer)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    digits, exponent = _shortest(abs(value))  # value = 0.d1d2d3... x 10^exponent
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        if exponent <= 0:
            return sign + "0." + "0" * (-exponent) + digits
        if exponent >= len(digits):
            return sign + digits + "0" * (exponent - len(digits)) + ".0"
        return sign + digits[:exponent] + "." + digits[exponent:]
    frac = digits[1:] or "0"
    return f"{sign}{digits[0]}.{frac}E{exponent - 1}"


def _shortest(value: float) -> tuple[str, int]:
    """(digits, point) with value = 0.<digits> x 10^point, digits the shortest round trip."""
    t = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    return digits, len(digits) + (t.exponent if isinstance(t.exponent, int) else 0)  # finite: always an int


# ------------------------------------------------------------------ what the verifier checks


def payload_matches(fmt: str, value: bytes | None, payload: bytes | None, is_text: bool | None = True) -> bool:
    """Whether a record's value (for `avro`, the payload decoded from it) carries `payload`
    (the binlog row's payload bytes, text as UTF-8) in format `fmt`. A null value matches a
    blank payload (a tombstone); a json value also matches as Debezium's envelope struct whose
    first member is the payload (additional fields placed in the envelope)."""
    if value is None:
        return payload is None or not payload.strip(_JAVA_TRIM.encode())
    if payload is None and fmt != "json":
        return False
    if fmt != "json":
        return value == payload
    text = payload.decode("utf-8", "surrogateescape") if payload is not None and is_text is not False else payload
    try:
        expected = debezium_json_bytes(text)
    except ValueError:  # a lone surrogate: the relay dead-letters such a payload, no value carries it
        return False
    if value == expected:
        return True
    head = b'{"payload":' + expected
    return value.startswith(head) and value[len(head) : len(head) + 1] in (b",", b"}")


def expected_timestamp_ms(timestamp_us: int | None, commit_ts_ms: int | None) -> int | None:
    """A payload format's record timestamp: the event-time column (microseconds, truncated
    toward zero to milliseconds), else the commit time."""
    if timestamp_us is None:
        return commit_ts_ms
    return timestamp_us // 1000 if timestamp_us >= 0 else -((-timestamp_us) // 1000)
