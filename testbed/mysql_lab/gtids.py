"""GTIDs as MySQL 8.4 / 9.x writes them: the text of a GTID set (tags too), the
Previous_gtids body, and the body of a tagged GTID event.

Text (MySQL `sql/rpl_gtid_set.cc` Gtid_set::to_string, `libs/mysql/gtid/tag.cpp`): one
entry per server UUID, sorted by UUID; its untagged intervals first, then each tag (sorted)
followed by its intervals: `3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7:blue:1-3`. A tag is
at most 32 characters, `[a-z_][a-z0-9_]*`, stored lower-case. Entries are joined with `,`
(MySQL's own default joins them with `,\\n`; one line suits the lab's files).

Previous_gtids body (`Gtid_set::encode`; rust_mysql_common's `previous_gtids.rs` describes
the same): an 8-byte little-endian header, then per (UUID, tag): the UUID (16 bytes), in
the tagged format the tag (a serialization-library string: varlen length, bytes), the
interval count (8 bytes), each interval as start and end-exclusive (8 bytes each). The
header of the untagged format is the number of entries; the tagged format (used as soon as
one entry has a tag) is `format << 56 | count << 8 | format` with format = 1.

Tagged GTID event body (type 42; `libs/mysql/binlog/event/control_events.h` Gtid_event
define_fields, encoded by `libs/mysql/serialization/`): a message
`<field id 1 = serialization_format_version> <size> <last non-ignorable field id>` then
fields `<id> <data>`: 0 gtid_flags (uint8), 1 UUID (16 x uint8, a fixed array), 2 gno
(int64), 3 tag (string), 4 last_committed (int64), 5 sequence_number (int64),
6 immediate_commit_timestamp (uint64), 7 original_commit_timestamp (only when it differs),
8 transaction_length, 9 immediate_server_version (uint32), 10 original_server_version
(only when it differs), 11 commit_group_ticket (only when set). Integers use the
library's variable-length format (`variable_length_integers.h`): the count of trailing 1
bits of the first byte is the count of bytes that follow; signed ones are zig-zag encoded.
The message size (`serializer_default_impl.hpp` get_size_serializable) counts the id, the
size field (sized for the fields' length), the last id and the fields.
"""

from __future__ import annotations

import re
import struct
import uuid as uuid_mod
from dataclasses import dataclass, field

__all__ = ["GtidSet", "tagged_gtid_body", "valid_tag", "varlen_int", "varlen_uint"]

_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")


def valid_tag(tag: str) -> str:
    """The tag as MySQL stores it (lower-case), or ValueError naming the rule."""
    low = tag.strip().lower()
    if not _TAG.match(low):
        raise ValueError(f"GTID tag {tag!r} is not 1-32 characters of [a-z0-9_] starting with a letter or _")
    return low


def varlen_uint(n: int) -> bytes:
    """libs/mysql/serialization/variable_length_integers.h write_varlen_bytes_unsigned."""
    if n < 0 or n >= 1 << 64:
        raise ValueError(f"{n} does not fit 64 unsigned bits")
    count = ((n.bit_length() * 575) >> 12) + 1
    if count == 9:
        return b"\xff" + n.to_bytes(8, "little")
    return (((n << count) | ((1 << (count - 1)) - 1)) & ((1 << (8 * count)) - 1)).to_bytes(count, "little")


def varlen_int(n: int) -> bytes:
    """write_varlen_bytes_signed: x >= 0 -> x << 1; x < 0 -> (-(x + 1) << 1) | 1."""
    return varlen_uint(n << 1 if n >= 0 else ((-(n + 1)) << 1) | 1)


@dataclass(frozen=True)
class GtidSet:
    """An immutable set of GTIDs: {(uuid, tag): sorted disjoint [start, end] intervals}.
    `tag` is "" for untagged GTIDs."""

    entries: tuple[tuple[str, str, tuple[tuple[int, int], ...]], ...] = field(default=())

    @staticmethod
    def parse(text: str) -> GtidSet:
        """MySQL's GTID set text (`uuid:1-5:7,uuid:tag:1-3`, spaces and newlines allowed)."""
        acc: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for part in text.replace("\n", "").split(","):
            part = part.strip()
            if not part:
                continue
            fields = [f.strip() for f in part.split(":")]
            sid = fields[0].lower()
            if not _UUID.match(sid):
                raise ValueError(f"{fields[0]!r} in GTID set {text!r} is not a UUID")
            sid = str(uuid_mod.UUID(sid))
            tag = ""
            for f in fields[1:]:
                m = _INTERVAL.match(f)
                if m is None:
                    tag = valid_tag(f)
                    acc.setdefault((sid, tag), [])
                    continue
                start, end = int(m.group(1)), int(m.group(2) or m.group(1))
                if start < 1 or end < start:
                    raise ValueError(f"interval {f!r} in GTID set {text!r} is empty or starts below 1")
                acc.setdefault((sid, tag), []).append((start, end))
        return GtidSet._build(acc)

    @staticmethod
    def _build(acc: dict[tuple[str, str], list[tuple[int, int]]]) -> GtidSet:
        """Sorted entries of merged intervals. (Like cdc/gtid.py's merge, on purpose not
        shared: the lab writes what the relay is checked against, so one bug must not
        sit in both.)"""
        entries = []
        for (sid, tag), intervals in sorted(acc.items()):
            merged: list[list[int]] = []
            for start, end in sorted(intervals):
                if merged and start <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            if merged:
                entries.append((sid, tag, tuple((a, b) for a, b in merged)))
        return GtidSet(tuple(entries))

    def add(self, sid: str, gno: int, tag: str = "") -> GtidSet:
        acc: dict[tuple[str, str], list[tuple[int, int]]] = {(s, t): list(iv) for s, t, iv in self.entries}
        acc.setdefault((str(uuid_mod.UUID(sid)), tag), []).append((gno, gno))
        return GtidSet._build(acc)

    def __contains__(self, gtid: tuple[str, str, int]) -> bool:
        sid, tag, gno = gtid
        for s, t, intervals in self.entries:
            if s == sid and t == tag:
                return any(a <= gno <= b for a, b in intervals)
        return False

    def last_gno(self, sid: str, tag: str = "") -> int:
        """The highest GNO of (sid, tag) in the set (0 if none): MySQL's next automatic
        GNO is the first free one, which the writer keeps as this + 1."""
        for s, t, intervals in self.entries:
            if s == sid and t == tag:
                return intervals[-1][1]
        return 0

    @property
    def tagged(self) -> bool:
        return any(tag for _, tag, _ in self.entries)

    def __str__(self) -> str:
        parts: list[str] = []
        current: str | None = None
        for sid, tag, intervals in self.entries:
            text = ":".join(f"{a}" if a == b else f"{a}-{b}" for a, b in intervals)
            if sid != current:
                parts.append(sid)
                current = sid
            parts[-1] += (f":{tag}" if tag else "") + ":" + text
        return ",".join(parts)

    def encode(self) -> bytes:
        """The Previous_gtids body (see the module docstring)."""
        tagged = self.tagged
        count = len(self.entries)
        header = (1 << 56) | (count << 8) | 1 if tagged else count
        out = bytearray(struct.pack("<Q", header))
        for sid, tag, intervals in self.entries:
            out += uuid_mod.UUID(sid).bytes
            if tagged:
                raw = tag.encode("ascii")
                out += varlen_uint(len(raw)) + raw
            out += struct.pack("<Q", len(intervals))
            for start, end in intervals:
                out += struct.pack("<QQ", start, end + 1)
        return bytes(out)


@dataclass(frozen=True)
class GtidInfo:
    """What a GTID event carries besides its GTID (control_events.h Gtid_event)."""

    last_committed: int
    sequence_number: int
    immediate_commit_timestamp: int  # microseconds since the epoch
    original_commit_timestamp: int
    transaction_length: int
    immediate_server_version: int  # e.g. 90100 for 9.1.0
    original_server_version: int
    flags: int = 0


def tagged_gtid_body(sid: str, gno: int, tag: str, info: GtidInfo) -> bytes:
    """The body of a Gtid_tagged_log_event (type 42); see the module docstring."""
    fields = bytearray()
    fields += varlen_uint(0) + varlen_uint(info.flags)
    fields += varlen_uint(1) + b"".join(varlen_uint(b) for b in uuid_mod.UUID(sid).bytes)
    fields += varlen_uint(2) + varlen_int(gno)
    raw_tag = tag.encode("ascii")
    fields += varlen_uint(3) + varlen_uint(len(raw_tag)) + raw_tag
    fields += varlen_uint(4) + varlen_int(info.last_committed)
    fields += varlen_uint(5) + varlen_int(info.sequence_number)
    fields += varlen_uint(6) + varlen_uint(info.immediate_commit_timestamp)
    if info.original_commit_timestamp != info.immediate_commit_timestamp:
        fields += varlen_uint(7) + varlen_uint(info.original_commit_timestamp)
    fields += varlen_uint(8) + varlen_uint(info.transaction_length)
    fields += varlen_uint(9) + varlen_uint(info.immediate_server_version)
    if info.original_server_version != info.immediate_server_version:
        fields += varlen_uint(10) + varlen_uint(info.original_server_version)
    version_id = varlen_uint(1)  # serialization_format_version, written as the message's field id
    last_non_ignorable = varlen_uint(0)  # every Gtid_event field is ignorable
    size = len(version_id) + len(varlen_uint(len(fields))) + len(last_non_ignorable) + len(fields)
    return version_id + varlen_uint(size) + last_non_ignorable + bytes(fields)
