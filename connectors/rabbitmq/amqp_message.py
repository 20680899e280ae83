"""The AMQP 1.0 message the RabbitMQ Streams sink stores, encoded directly: rstream's
general encoder (its vendored `_pyamqp`) makes about 5,000 messages a second on the build
machine, less than the relay reads; this makes one shape only, at struct speed.

The shape (OASIS AMQP 1.0, part 3.2 "Message Format"; the types of part 1.6): three
sections, each a described type `0x00 0x53 <code>`:

* properties (0x73): a list whose 10th field, creation-time, is a timestamp (0x83, ms since
  the epoch as a signed 64-bit integer); the nine before it are null (0x40);
* application-properties (0x74): a map (map32 0xd1: size and count, 4 bytes each) of
  string keys to string values (str32 0xb1: length, 4 bytes, then UTF-8);
* data (0x75): the body as binary (vbin32 0xb0: length, 4 bytes, then the bytes).

The 32-bit forms throughout: one rule, any length. rstream's decoder reads them back (the
verifier's `cdc_rabbitmq` source does); tests/unit/test_rabbitmq_stream_sink.py holds the
round trip.

`encode_record` makes the same bytes straight from a record's key, headers and value (the
relay's publish path): a transaction's headers are encoded once for all its messages, each
name's encoded bytes are made once, a UTF-8 value is used as it is, and no map of text is
built in between. A message's own part (its last headers, key, value and time) is made in C
when the optional build is there (`connectors/sink_native.c`, loaded by `sink_native.py`: 0.5
against 1.9 us a message), which hands anything but the common case back to the Python way.
"""

from __future__ import annotations

import struct

from cdc.events.sink_fields import H_KEY, H_NULL_VALUE
from connectors import sink_native

_PROPERTIES = b"\x00\x53\x73"
_APPLICATION_PROPERTIES = b"\x00\x53\x74"
_DATA = b"\x00\x53\x75"
_NULL = b"\x40"
_LIST8 = 0xC0
_TIMESTAMP = 0x83
_MAP32 = b"\xd1"
_STR32 = b"\xb1"
_VBIN32 = b"\xb0"
_U32 = struct.Struct(">I")
# properties as a list8 of 10 fields: 9 nulls, then creation-time (1 + 8 bytes)
_CREATED = struct.Struct(">BBB9sBq")


def encode(properties: dict[str, str], body: bytes, creation_time_ms: int) -> bytes:
    """The message's bytes: creation-time, application properties (text), body."""
    parts = [
        _PROPERTIES,
        _CREATED.pack(_LIST8, 1 + 9 + 9, 10, _NULL * 9, _TIMESTAMP, creation_time_ms),
    ]
    entries = []
    for name, value in properties.items():
        k, v = name.encode(), value.encode()
        entries += [_STR32, _U32.pack(len(k)), k, _STR32, _U32.pack(len(v)), v]
    table = b"".join(entries)
    parts += [_APPLICATION_PROPERTIES, _MAP32, _U32.pack(len(table) + 4), _U32.pack(2 * len(properties)), table]
    parts += [_DATA, _VBIN32, _U32.pack(len(body)), body]
    return b"".join(parts)


_TRUE = b"true"
_STR32_OF = struct.Struct(">BI")  # str32's constructor and length
_TIMESTAMP_MS = struct.Struct(">q")
# the properties section up to creation-time's value: a list8 of 10 fields, 9 nulls, then
# creation-time (1 + 8 bytes), as `_CREATED` packs it
_CREATED_HEAD = _PROPERTIES + bytes((_LIST8, 1 + 9 + 9, 10)) + _NULL * 9 + bytes((_TIMESTAMP,))
# name -> its str32 (constructor, length, UTF-8): the relay writes a few names only
_names: dict[str, bytes] = {}
_NAMES_KEPT = 4096


def _str32(name: str) -> bytes:
    k = name.encode()
    return _STR32_OF.pack(0xB1, len(k)) + k


def _name(name: str) -> bytes:
    entry = _names[name] = _str32(name)
    if len(_names) > _NAMES_KEPT:  # not the relay's names: keep none
        _names.clear()
    return entry


def _entry(name: str, raw: bytes) -> bytes:
    # `raw` as the UTF-8 of its text: as it is when it is UTF-8 (the relay's headers are),
    # else decoded with replacement characters, as cdc.events.sink_fields does
    v = raw if raw.isascii() else raw.decode("utf-8", "replace").encode()
    return b"".join((_names.get(name) or _name(name), _STR32_OF.pack(0xB1, len(v)), v))


class _Prefix:
    """A transaction's headers (all of a message's but its last SUFFIX), encoded once: their
    entries, how many, and their names (`closed`: with the two the record writes itself, what
    a message's own header may not be named, for the C encoder)."""

    __slots__ = ("block", "closed", "count", "names")

    def __init__(self, block: bytes, count: int, names: frozenset[str]):
        self.block, self.count, self.names = block, count, names
        self.closed = names | _OWN_NAMES


# The relay's messages (cdc/delivery/handover.py `_headers`): their transaction's headers,
# then the row, event id, type and table. The leading ones are encoded once a transaction
# (a tuple of them is the key), the last SUFFIX once a message. What this way would not
# encode as a map of text does (a name twice, the key's or null value's name among the
# headers) goes the general way.
SUFFIX = 4
_prefixes: dict[tuple, _Prefix | None] = {}  # None: the general way
_PREFIXES_KEPT = 1024  # a transaction's: older ones are not seen again
_OWN_NAMES = frozenset((H_KEY, H_NULL_VALUE))


def _prefix_of(shared: tuple) -> _Prefix | None:
    names: set[str] = set()
    parts = []
    for name, raw in shared:
        if raw is None:
            continue
        if name in names or name in _OWN_NAMES:
            return None
        names.add(name)
        parts.append(_entry(name, raw))
    return _Prefix(b"".join(parts), len(names), frozenset(names))


_UNSEEN = _Prefix(b"", 0, frozenset())  # `_prefixes` has no answer for these headers yet
# The C encoder of a message's own part (connectors/sink_native.c, sink_native.py), or None;
# its two names made as `_name` makes them (`_str32`)
_ENCODE_TAIL = sink_native.AMQP_RECORD_TAIL
_KEY_NAME = _str32(H_KEY)
_NULL_NAME = _str32(H_NULL_VALUE)


def encode_record(
    key: bytes | None, headers: list[tuple[str, bytes | None]], value: bytes | None, creation_time_ms: int
) -> bytes:
    """`encode(cdc.events.sink_fields.message_properties(key, headers, value), value or b"",
    creation_time_ms)`, byte for byte (tests/unit/test_rabbitmq_stream_sink.py compares them)."""
    cut = len(headers) - SUFFIX
    if cut <= 0:
        return _encode_general(key, headers, value, creation_time_ms)
    shared = tuple(headers[:cut])
    prefix = _prefixes.get(shared, _UNSEEN)
    if prefix is _UNSEEN:
        if len(_prefixes) >= _PREFIXES_KEPT:
            _prefixes.clear()
        prefix = _prefixes[shared] = _prefix_of(shared)
    if prefix is None:
        return _encode_general(key, headers, value, creation_time_ms)
    if _ENCODE_TAIL is not None:  # the same bytes, in C, or None for the Python way
        made = _ENCODE_TAIL(
            prefix.block, prefix.count, prefix.closed, headers, cut, key, value, creation_time_ms,
            _names, _KEY_NAME, _NULL_NAME,
        )  # fmt: skip
        if made is not None:
            return made
    taken = prefix.names
    names = _names
    pack = _STR32_OF.pack
    parts = [prefix.block]
    count = prefix.count
    own: list[str] = []
    for i in range(cut, len(headers)):
        name, raw = headers[i]
        if raw is None:
            continue
        if name in taken or name in _OWN_NAMES or name in own:
            return _encode_general(key, headers, value, creation_time_ms)
        own.append(name)
        v = raw if raw.isascii() else raw.decode("utf-8", "replace").encode()
        parts += (names.get(name) or _name(name), pack(0xB1, len(v)), v)
    count += len(own)
    if key is not None:
        v = key if key.isascii() else key.decode("utf-8", "replace").encode()
        parts += (names.get(H_KEY) or _name(H_KEY), pack(0xB1, len(v)), v)
        count += 1
    if value is None:
        parts.append(names.get(H_NULL_VALUE) or _name(H_NULL_VALUE))
        parts += (pack(0xB1, 4), _TRUE)
        count += 1
    table = b"".join(parts)
    body = value or b""
    u32 = _U32.pack
    return b"".join((
        _CREATED_HEAD, _TIMESTAMP_MS.pack(creation_time_ms),
        _APPLICATION_PROPERTIES, _MAP32, u32(len(table) + 4), u32(2 * count), table,
        _DATA, _VBIN32, u32(len(body)), body,
    ))  # fmt: skip


# (name, value) -> the entry's bytes: most headers repeat (the source, the binlog file, the
# transaction's position for each of its events, the table, the event type, the format)
_entries: dict[tuple[str, bytes], bytes] = {}
_ENTRIES_KEPT = 4096


def _encode_general(
    key: bytes | None, headers: list[tuple[str, bytes | None]], value: bytes | None, creation_time_ms: int
) -> bytes:
    """`encode_record` of any headers: a map of them first (a repeated name: its first place,
    its last value, a dict's rule)."""
    props: dict[str, bytes] = {}
    for name, raw in headers:
        if raw is not None:
            props[name] = raw
    if key is not None:
        props[H_KEY] = key
    if value is None:
        props[H_NULL_VALUE] = _TRUE
    entries = _entries
    if len(entries) > _ENTRIES_KEPT:
        entries.clear()
    parts = []
    for item in props.items():
        entry = entries.get(item)
        if entry is None:
            entry = entries[item] = _entry(*item)
        parts.append(entry)
    table = b"".join(parts)
    body = value or b""
    pack = _U32.pack
    return b"".join((
        _CREATED_HEAD, _TIMESTAMP_MS.pack(creation_time_ms),
        _APPLICATION_PROPERTIES, _MAP32, pack(len(table) + 4), pack(2 * len(props)), table,
        _DATA, _VBIN32, pack(len(body)), body,
    ))  # fmt: skip
