"""The verifier's own reading of MySQL's Gtid_tagged_log_event (type 42).

MySQL 8.3+ (8.4 LTS) opens a transaction whose GTID has a tag (`SET gtid_next =
'AUTOMATIC:<tag>'`) with this event instead of a Gtid_log_event (type 33).
python-mysql-replication 1.0.17 does not know type 42: its transaction would reach the
verifier without a GTID. So `spark_jobs/binlog_compressed.ExpandingConnection` hands the
library, in its place, the Gtid_log_event of the same transaction (`as_gtid_event_body`:
the same uuid, gno, logical clock and commit time), and remembers the tagged GTID on the
packet, which `spark_jobs/mysql/binlog_readers.py` takes instead of the library's `uuid:gno`.

The body is one message of MySQL's serialization library (the fields of
`Gtid_event::define_fields`, libs/mysql/binlog/event/control_events.h; the message format
in libs/mysql/serialization/readme.md): format version 1, the message's size in bytes
(from its first byte), the last field id a reader may not skip, then (field id, value)
pairs in ascending id order, an optional field left out. Every number is a
variable-length integer (libs/mysql/serialization/variable_length_integers.h): the
trailing 1 bits of the first byte, plus one, give its byte count N; read those N bytes
little-endian and drop the low N bits (N = 9: the 8 bytes after the first are the value).
Signed fields (gno, last_committed, sequence_number) are zigzag-coded: the low bit is the
sign. Field ids: 0 flags, 1 uuid (16 numbers, one a byte), 2 gno, 3 tag (a length, then
the characters), 4 last_committed, 5 sequence_number, 6 immediate_commit_timestamp,
7 original_commit_timestamp (absent: the immediate one), 8 transaction_length,
9 immediate_server_version, 10 original_server_version, 11 commit_group_ticket. Ids past
11 (a newer server's) are skipped to the message's end.

This module shares no code with the relay's `connectors/mysql/gtid_tagged.py`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["GTID_TAGGED_EVENT", "TaggedGtidEvent", "TaggedGtidEventError", "as_gtid_event_body", "read_tagged"]

GTID_TAGGED_EVENT = 42
_KNOWN = 11
_SIGNED = frozenset({2, 4, 5})


class TaggedGtidEventError(ValueError):
    """A Gtid_tagged_log_event the verifier cannot read exactly."""


@dataclass(frozen=True)
class TaggedGtidEvent:
    flags: int
    sid: bytes  # the source uuid, 16 bytes
    tag: str  # lower-case, as MySQL keeps it
    gno: int
    last_committed: int
    sequence_number: int
    commit_us: int  # immediate_commit_timestamp
    original_commit_us: int

    @property
    def gtid(self) -> str:
        h = self.sid.hex()
        uuid = f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        return f"{uuid}:{self.tag}:{self.gno}" if self.tag else f"{uuid}:{self.gno}"


def _number(data: bytes, at: int, limit: int) -> tuple[int, int]:
    if at >= limit:
        raise TaggedGtidEventError(f"a number at byte {at} lies past the message's end ({limit})")
    first = data[at]
    width = (~first & (first + 1)).bit_length()  # the lowest 0 bit's place: trailing ones + 1
    if at + width > limit:
        raise TaggedGtidEventError(f"a {width}-byte number at byte {at} lies past the message's end ({limit})")
    if width == 9:
        return int.from_bytes(data[at + 1 : at + 9], "little"), at + 9
    return int.from_bytes(data[at : at + width], "little") >> width, at + width


def read_tagged(body: bytes) -> TaggedGtidEvent:
    """A Gtid_tagged_log_event's body (no header, no checksum) -> its fields."""
    version, at = _number(body, 0, len(body))
    if version != 1:
        raise TaggedGtidEventError(f"serialization format {version}, not 1")
    size, at = _number(body, at, len(body))
    if size > len(body):
        raise TaggedGtidEventError(f"a message of {size} bytes in a body of {len(body)}")
    must_read, at = _number(body, at, size)
    if must_read > _KNOWN + 1:
        raise TaggedGtidEventError(f"field {must_read - 1} may not be skipped and is unknown here")
    values: dict[int, int] = {}
    sid, tag, last = b"", "", -1
    while at < size:
        field, at = _number(body, at, size)
        if field > _KNOWN:
            break  # a newer server's fields: the message's size skips them
        if field <= last:
            raise TaggedGtidEventError(f"field {field} after field {last}")
        last = field
        if field == 1:
            parts = []
            for _ in range(16):
                byte, at = _number(body, at, size)
                parts.append(byte)
            if any(p > 255 for p in parts):
                raise TaggedGtidEventError("a uuid part above 255")
            sid = bytes(parts)
        elif field == 3:
            length, at = _number(body, at, size)
            if length > 32 or at + length > size:
                raise TaggedGtidEventError(f"a tag of {length} bytes")
            raw = body[at : at + length]
            # libs/mysql/gtid/tag.cpp: a letter or _, then letters, digits or _ (ASCII)
            if raw and not ((raw[:1].isalpha() or raw[:1] == b"_") and raw.replace(b"_", b"a").isalnum()):
                raise TaggedGtidEventError(f"tag {raw!r} is not a GTID tag")
            tag, at = raw.decode("ascii").lower(), at + length
        else:
            raw_value, at = _number(body, at, size)
            values[field] = (raw_value >> 1) ^ -(raw_value & 1) if field in _SIGNED else raw_value
    if len(sid) != 16 or 2 not in values:
        raise TaggedGtidEventError("no source uuid or no gno")
    if values[2] < 1 or values[2] >= (1 << 63) - 1:  # Gtid_event's MIN_GNO and GNO_END (control_events.h)
        raise TaggedGtidEventError(f"gno {values[2]} names no transaction")
    commit_us = values.get(6, 0)
    return TaggedGtidEvent(
        values.get(0, 0), sid, tag, values[2], values.get(4, 0), values.get(5, 0), commit_us, values.get(7, commit_us)
    )


def as_gtid_event_body(ev: TaggedGtidEvent) -> bytes:
    """The body of the Gtid_log_event (type 33) of the same transaction, in MySQL 8.0's
    layout (control_events.h, "Gtid_event_binary_format"): flags (1), uuid (16), gno (8),
    logical clock type code 2 (1), last_committed (8), sequence_number (8), then
    immediate_commit_timestamp (7; its top bit set when original_commit_timestamp (7)
    follows). Only what the library and the verifier read: no transaction length, no
    server versions."""
    body = struct.pack("<B16sqBqq", ev.flags & 0xFF, ev.sid, ev.gno, 2, ev.last_committed, ev.sequence_number)
    if ev.original_commit_us != ev.commit_us:
        return body + (ev.commit_us | 1 << 55).to_bytes(7, "little") + ev.original_commit_us.to_bytes(7, "little")
    return body + ev.commit_us.to_bytes(7, "little")
