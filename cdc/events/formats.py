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
headers (cdc/events/identity.py) are on every message in every format.

How Debezium's expansion (EventRouterDelegate, JsonSchemaData) and JsonConverter (Jackson)
shape the JSON, and `debezium_json` follows, is written down rule by rule in docs/output-formats.md
("The json format's bytes"): only a payload starting with `{` or `[` is parsed (its first
value; what follows is ignored); one that does not parse or whose schema cannot be inferred
stays a string (a JSON string literal); null and empty-array members are dropped; arrays are
homogeneous; doubles are Java 17's Double.toString (cdc/events/java_double.py), an overflow the string
`"Infinity"`; Jackson escapes control characters in upper-case hex and every character beyond
the BMP (and a lone surrogate) as UTF-16 `\\uXXXX` escapes.

Speed: the general rules are Python; an object whose shape makes orjson write exactly those
bytes (`_compact_as_debezium`: no null or empty-array member, 64-bit integers, doubles Python
and Java both write in plain decimal, arrays of one kind or of objects with the same members;
no control character or character beyond the BMP in the output; null and empty-array members
outside arrays are dropped first, `_schemaless_dropped`) goes through orjson's reader
and writer instead (differential property tests, on documents and on arbitrary texts, hold
the two paths equal).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import struct
import sys
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from orjson import dumps as _orjson_dumps
from orjson import loads as _orjson_loads

from cdc.errors import ConfigError
from cdc.events.column_text import special_text
from cdc.events.java_double import java_double
from cdc.json_kinds_native import WALK

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

    def to_wire(self) -> tuple[Any, ...]:
        """Its fields as a plain tuple (`MessageExtras(*wire)` builds it back): what the
        reader process's pipe carries (OutboxEvent.to_wire). Pickling the object goes through
        `__reduce__`, a Python call per event on one side and a REDUCE on the other; the
        tuple pickles in C: 1.56 -> 0.85 us per event for both sides (measured on 100-event
        chunks as the pipe sends them)."""
        return (
            self.format,
            self.headers,
            self.timestamp_ms,
            self.envelope,
            self.tombstone,
            self.nullable,
            self.null_value,
        )

    def __reduce__(self) -> Any:
        return (MessageExtras, self.to_wire())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageExtras) and self.__reduce__() == other.__reduce__()

    def __repr__(self) -> str:
        return f"MessageExtras({self.format!r}, headers={self.headers!r}, timestamp_ms={self.timestamp_ms!r})"


class ExtrasPlan:
    """How one payload-format table's rows become their MessageExtras, resolved once per
    table (OutboxMapper keeps one per table): the placement parsed, the header and envelope
    columns with their names, the trace columns. Per event it only reads the columns.

    A header of a text column (the usual `type:header:eventType`) is one (name, bytes)
    object per distinct text: the events of a chunk share it, so the reader process's pipe
    pickles it once per chunk (pickle memoizes by identity) and the relay unpickles one
    object; and the text is encoded once. Measured against building them per event (the
    placement looked up, every header made and encoded; 5,000 rows of `bench catchup
    --format json`'s settings, min of 15 rounds in one process): the extras 1.13 -> 0.94
    us/event, their pickling in 100-event chunks 0.55 -> 0.38, unpickling 0.53 -> 0.46.

    With one header column and no trace columns (the usual case), the whole header list is
    one object per distinct text, shared the same way: MessageExtras.headers is never
    changed once built (the relay copies it into each message's own list). Against a list
    per event (3,000 rows of the same settings, in-process, alternating, min of 25 rounds):
    the extras 0.80 -> 0.56 us/event, pickling 0.42 -> 0.33, unpickling 0.41 -> 0.33."""

    __slots__ = ("envelope", "format", "headers", "nullable", "shared", "table", "tombstone", "trace")

    _SEEN_MAX = 1024  # distinct texts kept per header column (an unbounded column would grow)

    def __init__(self, table: Any):
        self.table = table  # the OutboxTable this plan is for (the mapper checks identity)
        self.format: str = table.format
        fields = parse_placement(table.additional_placement)
        self.headers: tuple[tuple[str, str, dict[str, tuple[str, bytes | None]]], ...] = tuple(
            (f.column, f.alias, {}) for f in fields if f.placement == "header"
        )
        self.envelope = tuple((f.column, f.alias) for f in fields if f.placement != "header")
        traced = ((table.traceparent_column, H_TRACEPARENT), (table.tracestate_column, H_TRACESTATE))
        self.trace = tuple((column, name) for column, name in traced if column)
        self.tombstone: bool = table.tombstone_on_empty_payload
        self.nullable: bool = table.payload_nullable
        # the header column whose text decides the whole list, and the lists by text
        self.shared: tuple[str, dict[str, list[tuple[str, bytes | None]]]] | None = (
            (self.headers[0][0], {}) if len(self.headers) == 1 and not self.trace else None
        )

    def extras(self, row: dict[str, Any], timestamp_ms: int | None) -> MessageExtras:
        """The extras of one row: its header columns (in placement order, then the trace
        columns that are not NULL), its envelope fields, the record timestamp given."""
        shared = self.shared
        if shared is None:
            headers = self._headers(row)
        else:
            column, lists = shared
            value = row.get(column)
            if type(value) is not str:
                headers = self._headers(row)
            else:
                found = lists.get(value)
                if found is None:
                    if len(lists) >= self._SEEN_MAX:
                        lists.clear()
                    found = lists[value] = self._headers(row)
                headers = found
        envelope = tuple((alias, row.get(column)) for column, alias in self.envelope) if self.envelope else ()
        return MessageExtras(self.format, headers, timestamp_ms, envelope, self.tombstone, self.nullable)

    def _headers(self, row: dict[str, Any]) -> list[tuple[str, bytes | None]]:
        headers: list[tuple[str, bytes | None]] = []
        for column, alias, seen in self.headers:
            value = row.get(column)
            if type(value) is str:
                header = seen.get(value)
                if header is None:
                    if len(seen) >= self._SEEN_MAX:
                        seen.clear()
                    header = seen[value] = (alias, value.encode())
                headers.append(header)
            else:
                headers.append((alias, header_value(value)))
        for column, name in self.trace:
            value = row.get(column)
            if value is not None:
                headers.append((name, header_value(value)))
        return headers


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
        if len(value) == 16:  # a BINARY(16) id reads as a UUID, as cdc.events.outbox.text_of reads it
            return str(_uuid.UUID(bytes=bytes(value))).encode()
        return bytes(value)
    if isinstance(value, float):
        return java_double(value).encode()
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat().encode()
    return (special_text(value) or str(value)).encode()  # a TIME as MySQL prints it (column_text.py)


def epoch_ms(value: Any, micros: int | None = None) -> int | None:
    """An event-time column as a record timestamp: DATETIME (read as UTC, as the binlog
    holds it) -> epoch milliseconds, truncated toward zero like Debezium's `micros / 1000`;
    an integer column is taken as epoch milliseconds; NULL or anything else: None.
    `micros`: the DATETIME's `epoch_us` when the caller has it already (the outbox mapper
    does, as the event's timestamp_us; converting twice cost 0.3 us per event)."""
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        return _ms_of_us(epoch_us(value) if micros is None else micros)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _ms_of_us(micros: int) -> int:
    return micros // 1000 if micros >= 0 else -((-micros) // 1000)  # toward zero, as Java's `/`


def epoch_us(value: _dt.datetime) -> int:
    """A DATETIME (naive: UTC, as the binlog holds it) as epoch microseconds, exactly
    (`timestamp() * 1e6` goes through a float). A naive value is subtracted from a naive
    epoch: tagging it with UTC first (`replace(tzinfo=...)`, then an aware subtraction)
    gives the same number at 4x the cost (1.2 us against 0.28 us, measured), paid once per
    event of a table with a timestamp_column."""
    return (value - (_EPOCH if value.tzinfo is None else _EPOCH_UTC)) // _MICROSECOND  # exact, in C


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
    expansion (docs/output-formats.md, "The json format's bytes")."""
    fast = _fast_json(payload)
    if fast is not None:
        return fast.decode()
    return _general_json(payload)


def debezium_json_bytes(payload: str | bytes | None) -> bytes:
    """`debezium_json(payload)` as UTF-8: the value bytes of the json format (every
    character Jackson would not write raw is escaped, so the text is always UTF-8)."""
    fast = _fast_json(payload)
    if fast is not None:
        return fast
    return _general_json(payload).encode()


def _general_json(payload: str | bytes | None) -> str:
    """`debezium_json` of a payload `_fast_json` did not take."""
    if payload is None:
        return "null"
    if isinstance(payload, bytes):
        # Debezium does not expand a binary payload: JsonConverter writes bytes as base64
        import base64

        return '"' + base64.b64encode(payload).decode() + '"'
    return _expand_text(payload)


# the proof walk, compiled when built and current (cdc/json_kinds_native.py), else pure Python
_member_kinds: Callable[[dict], list[type] | None] = WALK.member_kinds

_FOUR_BYTE_UTF8 = re.compile(rb"[\xf0-\xf4]")  # the lead byte of a character beyond the BMP
_LONG_NUMBER = re.compile(r"[0-9][0-9.eE+-]{1000}")  # may hold more digits than Jackson reads


def _fast_json(payload: str | bytes | None) -> bytes | None:
    """The common case at C speed, or None for the general path: when the document is one
    `_compact_as_debezium` accepts (once its null and empty-array members outside arrays are
    dropped, `_schemaless_dropped`) and orjson's bytes hold nothing Jackson writes otherwise
    (a control character, which Jackson escapes in upper-case hex; a character beyond the
    BMP, which it escapes as a surrogate pair), orjson writes exactly the bytes the general
    rules would. Anything orjson will not read (not JSON, trailing content, NaN, a lone
    surrogate) takes the general path, which decides; so do documents near Jackson's limits
    (nesting deeper than 1000, a number of more than 1000 digits, a name longer than 50,000).
    An integer beyond 64 bits orjson reads as a double of at least 1.8e19, which
    `_compact_as_debezium` sends there too."""
    if type(payload) is not str or payload[:1] != "{":
        return None
    if len(payload) > 1000 and _near_jackson_limits(payload):
        return None
    try:
        doc = _orjson_loads(payload)
        if type(doc) is not dict:
            return None
        if _member_kinds(doc) is None:  # _compact_as_debezium, one call less
            doc = _schemaless_dropped(doc)
            if _member_kinds(doc) is None:
                return None
        out = _orjson_dumps(doc)
        # A control character is an escape `\u00XX` in orjson's bytes: looked for only when
        # they hold a backslash at all (one memchr), since the 5-byte search walks the whole
        # text (0.67 -> 0.35 us for both checks on the bench's payload, in-process, min of 40)
        if (b"\\" not in out or b"\\u00" not in out) and (out.isascii() or not _FOUR_BYTE_UTF8.search(out)):
            return out
    except (ValueError, TypeError, RecursionError):  # orjson.JSONDecodeError is a ValueError
        pass
    return None


def _schemaless_dropped(obj: dict) -> dict:
    """`obj` without the members Debezium drops because their value has no schema: null
    and the empty array, in it and in the objects nested in it (`_object`: `_name` is None
    for them, whatever the name). Not inside arrays: an object in an array writes a null
    member (`_object_array`), so `_member_kinds` still refuses those and the general path
    decides. A payload with an optional member left null used to take the general path:
    52.4 -> 7.3 us for the bench's payload with one null member (one process, min of 9)."""
    out = {}
    for k, v in obj.items():
        if v is None or (type(v) is list and not v):
            continue
        out[k] = _schemaless_dropped(v) if type(v) is dict else v
    return out


def _near_jackson_limits(payload: str) -> bool:
    if payload.count("{") + payload.count("[") > _MAX_DEPTH:
        return True
    if len(payload) > _MAX_NAME and any(
        len(k) > _MAX_NAME // 2 for k in re.findall(r'"((?:[^"\\]|\\.)*)"\s*:', payload)
    ):
        return True
    return _LONG_NUMBER.search(payload) is not None


# Jackson 2.21's StreamReadConstraints defaults: a document beyond them does not parse, and
# Debezium leaves the payload a string.
_MAX_DEPTH = 1000  # nesting of objects and arrays
_MAX_NUMBER_DIGITS = 1000  # digits of a number (integer, fraction and exponent together)
_MAX_NAME = 50_000  # UTF-16 units of a member name


class _NotExpandable(Exception):
    pass


def _expand_text(payload: str) -> str:
    """The general path of `debezium_json` for a text payload: every rule of
    docs/output-formats.md's "The json format's bytes", in Python."""
    if payload[:1] not in ("{", "["):
        return _jstr(payload)
    try:
        with _deep_enough(payload):
            # Jackson's readTree reads the first value and ignores whatever follows it
            try:
                doc, _end = _DECODER.raw_decode(payload)
            except ValueError:
                read_as_jackson = _jackson_hex_digits(payload)
                if read_as_jackson is None:
                    raise
                doc, _end = _DECODER.raw_decode(read_as_jackson)
            return _expand(doc)
    except (ValueError, RecursionError, _NotExpandable):
        return _jstr(payload)


_HEX_VALUES = {ord(c): int(c, 16) for c in "0123456789abcdefABCDEF"}


def _jackson_hex_digits(text: str) -> str | None:
    """Jackson reads the 4 hex digits of a `\\u` escape one UTF-16 unit at a time as
    `sHexValues[ch & 0xFF]` (jackson-core CharTypes.charToHex), so a non-ASCII unit whose low
    byte is a hex digit counts as that digit (`\\ud59` then U+1D11E, units D834 DD1E: the
    escape is U+D594, and DD1E is left a lone surrogate). The text with every such escape
    rewritten to the plain escape Jackson decodes it as, or None when it has none (JSON's
    own reader then refuses the text for a reason Jackson shares)."""
    if text.isascii() or "\\u" not in text:
        return None
    raw = text.encode("utf-16-le", "surrogatepass")
    units = struct.unpack(f"<{len(raw) // 2}H", raw)
    out: list[int] = []
    changed = False
    i, n = 0, len(units)
    while i < n:
        c = units[i]
        if c != 0x5C or i + 1 >= n:  # not a backslash
            out.append(c)
            i += 1
            continue
        digits = units[i + 2 : i + 6]
        if units[i + 1] == 0x75 and len(digits) == 4 and any(d >= 0x80 for d in digits):
            values = [_HEX_VALUES.get(d & 0xFF) for d in digits]
            if None not in values:
                value = (values[0] << 12) | (values[1] << 8) | (values[2] << 4) | values[3]  # type: ignore[operator]  # no None, checked
                out.extend(f"\\u{value:04x}".encode())
                changed = True
                i += 6
                continue
        out.extend(units[i : i + 2])  # any other escape, kept whole
        i += 2
    if not changed:
        return None
    # a surrogate left alone by the rewrite (the pair's other half taken as a digit) as an escape
    rebuilt = struct.pack(f"<{len(out)}H", *out).decode("utf-16-le", "surrogatepass")
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", rebuilt)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _deep_enough:
    """Room on the stack for a document nested up to Jackson's 1000 levels (Python's
    reader and `_expand` recurse once or twice per level)."""

    def __init__(self, payload: str):
        self.deep = len(payload) > 600 and payload.count("{") + payload.count("[") > 300

    def __enter__(self) -> None:
        if self.deep and sys.getrecursionlimit() < 6000:
            sys.setrecursionlimit(6000)

    def __exit__(self, *exc: object) -> None:
        return None


def _parse_float(text: str) -> float:
    """A JSON number with a fraction or exponent: Jackson reads it as a double (correctly
    rounded; 1e400 is Infinity, 1e-400 is 0.0), unless it has more than 1000 digits."""
    if len(text) > _MAX_NUMBER_DIGITS and sum(c.isdigit() for c in text) > _MAX_NUMBER_DIGITS:
        raise _NotExpandable
    return _JFloat(text)


class _JFloat(float):
    """A JSON number with a fraction or exponent: Jackson reads it as a double."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=_parse_float, parse_constant=_refuse_constant)


def _compact_as_debezium(obj: dict) -> bool:
    """Whether `json.dumps(obj)` (compact) is Debezium's expansion of `obj` byte for byte
    (`cdc/json_kinds.py`'s `member_kinds`). False only means "take the general path", never "not expandable"."""
    return _member_kinds(obj) is not None


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
        return _double(value)
    if isinstance(value, str):
        return _jstr(value)
    return _jstr((header_value(value) or b"").decode())


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _kind(v: Any) -> str:
    """Debezium's inferred Connect type of a JSON value ("null" and "empty", an empty
    array, have no schema: such a member is dropped)."""
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
        return "array" if v else "empty"
    return "object"


def _expand(doc: Any) -> str:
    if isinstance(doc, list):
        # A top-level array: Debezium's converter fails the record ("Invalid type for
        # ARRAY", docs/output-formats.md), so there are no bytes to match; the relay keeps the data and
        # writes the payload as a string, as for every payload it cannot expand (it wrote
        # {}, an empty document where the array had values).
        raise _NotExpandable
    return _object(doc, 1)


def _name(k: str, kind: str) -> str | None:
    """A member name as a Connect field name; None: the member has no schema and is
    dropped. Refused when longer than Jackson reads (whatever its value), or empty with a
    value (SchemaBuilder.field refuses an empty name)."""
    if len(k) > _MAX_NAME // 2 and len(k.encode("utf-16-le", "surrogatepass")) > 2 * _MAX_NAME:
        raise _NotExpandable
    if kind in ("null", "empty"):
        return None
    if not k:
        raise _NotExpandable
    return _jstr(k)


def _object(obj: dict, depth: int) -> str:
    if depth > _MAX_DEPTH:
        raise _NotExpandable
    parts = []
    for k, v in obj.items():
        name = _name(k, _kind(v))
        if name is not None:
            parts.append(name + ":" + _value(v, depth))
    return "{" + ",".join(parts) + "}"


def _double(v: float) -> str:
    """A double as Jackson writes it: Java's Double.toString; Infinity (from an exponent
    too large for a double) as a string, Jackson's QUOTE_NON_NUMERIC_NUMBERS."""
    text = java_double(v)
    return text if math.isfinite(v) else '"' + text + '"'


def _value(v: Any, depth: int) -> str:
    kind = _kind(v)
    if kind == "str":
        return _jstr(v)
    if kind == "bool":
        return "true" if v else "false"
    if kind == "double":
        return _double(float(v))
    if kind in ("int32", "int64"):
        return str(v)
    if kind == "array":
        return _array(v, depth + 1)
    if kind == "empty":
        return "[]"  # an empty array where a schema is known (an object in an array)
    if kind == "null":
        return "null"
    return _object(v, depth + 1)


def _array(items: list, depth: int) -> str:
    if depth > _MAX_DEPTH:
        raise _NotExpandable
    first = next((x for x in items if x is not None), None)
    if first is None:
        raise _NotExpandable  # no element to take a schema from
    kind = _kind(first)
    if kind == "object":
        return _object_array(items, depth)
    if kind == "empty":
        raise _NotExpandable  # an empty array first: "unrecognized member schema"
    for x in items:
        if x is not None and _kind(x) != kind and not (kind == "array" and _kind(x) == "empty"):
            raise _NotExpandable  # not homogeneous, or a value its schema does not hold
    return "[" + ",".join("null" if x is None else _value(x, depth) for x in items) + "]"


def _object_array(items: list, depth: int) -> str:
    """Objects in an array share one struct schema, the union of their fields (in order of
    first appearance); a member an element lacks is written as null. (Debezium merges the
    elements' distinct schemas in the order of a HashSet: when they differ other than by
    leading prefixes, its field order is not derivable; see docs/output-formats.md.)"""
    if depth + 1 > _MAX_DEPTH:
        raise _NotExpandable
    fields: dict[str, str] = {}
    for x in items:
        if x is None:
            continue
        if not isinstance(x, dict):
            raise _NotExpandable
        for k, v in x.items():
            kind = _kind(v)
            if _name(k, kind) is None:
                continue
            if fields.setdefault(k, kind) != kind:
                raise _NotExpandable
    names = {k: _jstr(k) for k in fields}
    out = []
    for x in items:
        if x is None:
            out.append("null")
            continue
        out.append("{" + ",".join(names[k] + ":" + _value(x.get(k), depth + 1) for k in fields) + "}")
    return "[" + ",".join(out) + "]"


# Jackson's JsonGenerator escapes `"`, `\` and the control characters U+0000-U+001F (\b \t
# \n \f \r short, the others \u00XX in upper-case hex); everything else inside the BMP is
# written raw (`/`, U+007F, U+2028 and U+2029 too). A character beyond the BMP is two UTF-16
# units in Java, and Jackson 2.21 (COMBINE_UNICODE_SURROGATES_IN_UTF8 off by default) escapes
# each: U+1F422 -> \uD83D\uDC22; a lone surrogate (from a `\ud800` escape) likewise.
_JACKSON_ESCAPES = {c: f"\\u{c:04X}" for c in range(32)} | {
    8: "\\b",
    9: "\\t",
    10: "\\n",
    12: "\\f",
    13: "\\r",
    34: '\\"',
    92: "\\\\",
}
_BEYOND_RAW = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")


def _utf16_escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c < 0x10000:
        return f"\\u{c:04X}"
    c -= 0x10000
    return f"\\u{0xD800 + (c >> 10):04X}\\u{0xDC00 + (c & 0x3FF):04X}"


def _jstr(text: str) -> str:
    """A JSON string as Jackson writes it (the escapes above)."""
    out = text.translate(_JACKSON_ESCAPES)
    if not out.isascii() and max(out) >= "\ud800":
        out = _BEYOND_RAW.sub(_utf16_escape, out)
    return '"' + out + '"'


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
    text: str | bytes | None = payload
    if payload is not None and is_text is not False:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:  # text that is not UTF-8: no json value carries it
            return False
    expected = debezium_json_bytes(text)
    if value == expected:
        return True
    head = b'{"payload":' + expected
    return value.startswith(head) and value[len(head) : len(head) + 1] in (b",", b"}")


def expected_timestamp_ms(timestamp_us: int | None, commit_ts_ms: int | None) -> int | None:
    """A payload format's record timestamp: the event-time column (microseconds, truncated
    toward zero to milliseconds), else the commit time. An event time of 0 ms is taken as
    none (the relay's mapper, cdc/events/outbox.py): librdkafka reads a record timestamp of
    0 as "stamp it now" (rd_kafka_producev's RD_KAFKA_VTYPE_TIMESTAMP), so 0 cannot be sent,
    and the produce time is a value the row never held."""
    if timestamp_us is None:
        return commit_ts_ms
    ms = _ms_of_us(timestamp_us)
    return commit_ts_ms if ms == 0 else ms
