"""MySQL's Gtid_tagged_log_event (type 42): the GTID event of a tagged transaction.

MySQL 8.3+ (8.4 LTS) writes it instead of a Gtid_log_event (type 33) for a transaction
whose GTID has a tag (`SET gtid_next = 'AUTOMATIC:<tag>'` or `'<uuid>:<tag>:<n>'`). Its
body has no fixed layout: it is one message of MySQL's serialization library, the fields
of `Gtid_event::define_fields` (libs/mysql/binlog/event/control_events.h), encoded as
libs/mysql/serialization/readme.md, serializer_impl.hpp and serializer_default_impl.hpp
describe (the Format_description gives type 42 a post-header length of 0):

    message  := format_version  varlen, MySQL's serialization_format_version 1 (byte 0x02)
                size            varlen, bytes of the whole message from format_version on
                last_non_ignorable_field_id  varlen (a field a reader may not skip)
                { field_id varlen, value }   ids ascending; an optional field is left out

    id  field                        value                     when left out
    0   gtid_flags                   unsigned
    1   source uuid                  16 unsigned, one a byte
    2   gno                          signed
    3   tag                          unsigned length, bytes (at most 32)
    4   last_committed               signed
    5   sequence_number              signed
    6   immediate_commit_timestamp   unsigned (microseconds)
    7   original_commit_timestamp    unsigned                  = immediate
    8   transaction_length           unsigned (with this event)
    9   immediate_server_version     unsigned
    10  original_server_version      unsigned                  = immediate
    11  commit_group_ticket          unsigned                  0

A variable-length integer (libs/mysql/serialization/variable_length_integers.h) takes
1-9 bytes, little-endian: the number of trailing 1 bits of its first byte, plus one, is
its length N; the value is the first byte's bits above those N bits followed by the next
N-1 bytes (N = 9: the next 8 bytes are the whole value). A signed value is zigzag-coded:
x >= 0 as x << 1, x < 0 as ((-(x + 1)) << 1) | 1.

Reading follows MySQL's decoder (`Serializer_default::decode`): each known field in turn
is taken when the next id is its id, else it counts as left out; fields after the last
known one (a newer server's) are skipped to the message's end, unless
last_non_ignorable_field_id names one, which MySQL refuses too. rust_mysql_common
(`src/binlog/events/gtid_event.rs`) documents the same layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TaggedGtid", "TaggedGtidError", "read_tagged_gtid"]

_FORMAT_VERSION = 1  # libs/mysql/serialization/serialization_format_version.h
_LAST_FIELD_ID = 11  # commit_group_ticket
_TAG_MAX = 32  # libs/mysql/gtid/gtid_constants.h tag_max_length
_GNO_END = (1 << 63) - 1  # control_events.h Gtid_event: MIN_GNO 1, GNO_END INT64_MAX (excluded)
_TAG = re.compile(r"^[a-z_][a-z0-9_]*$")  # libs/mysql/gtid/tag.cpp Tag::is_character_valid


class TaggedGtidError(ValueError):
    """A Gtid_tagged_log_event body that does not follow the layout above."""


@dataclass(frozen=True)
class TaggedGtid:
    """The fields of a Gtid_tagged_log_event; `gtid` is its text form, `uuid:tag:gno` as
    MySQL prints it (`Tsid::to_string`: uuid lower-case, the tag as stored, lower-case)."""

    flags: int
    uuid: str
    tag: str
    gno: int
    last_committed: int
    sequence_number: int
    immediate_commit_us: int
    original_commit_us: int
    transaction_length: int
    immediate_server_version: int
    original_server_version: int
    commit_group_ticket: int

    @property
    def gtid(self) -> str:
        return f"{self.uuid}:{self.tag}:{self.gno}" if self.tag else f"{self.uuid}:{self.gno}"


class _Reader:
    def __init__(self, data: bytes, end: int):
        self.data, self.at, self.end = data, 0, end

    def unsigned(self, what: str) -> int:
        if self.at >= self.end:
            raise TaggedGtidError(f"{what} is cut short")
        first = self.data[self.at]
        n = 1
        while n < 9 and first >> (n - 1) & 1:
            n += 1
        if self.at + n > self.end:
            raise TaggedGtidError(f"{what} is cut short ({n} bytes at {self.at}, the message ends at {self.end})")
        rest = int.from_bytes(self.data[self.at + 1 : self.at + n], "little")
        self.at += n
        if n == 9:
            return rest
        return (first >> n) | (rest << (8 - n))

    def signed(self, what: str) -> int:
        raw = self.unsigned(what)
        return -(raw >> 1) - 1 if raw & 1 else raw >> 1

    def peek_id(self) -> int | None:
        if self.at >= self.end:
            return None
        at = self.at
        try:
            return self.unsigned("a field id")
        finally:
            self.at = at


def read_tagged_gtid(body: bytes) -> TaggedGtid:
    """The body of a Gtid_tagged_log_event (after the 19-byte header, without the
    checksum) -> its fields. Raises TaggedGtidError when it does not add up."""
    r = _Reader(body, len(body))
    version = r.unsigned("the format version")
    if version != _FORMAT_VERSION:
        raise TaggedGtidError(f"serialization format version {version} (this reader knows {_FORMAT_VERSION})")
    size = r.unsigned("the message size")
    if size > len(body):
        raise TaggedGtidError(f"the message says {size} bytes, the event body has {len(body)}")
    r.end = size
    last_needed = r.unsigned("last_non_ignorable_field_id")
    if last_needed > _LAST_FIELD_ID + 1:
        raise TaggedGtidError(f"field {last_needed - 1} must be read and this reader knows fields 0-{_LAST_FIELD_ID}")
    found: dict[int, int | str] = {}
    for field_id in range(_LAST_FIELD_ID + 1):
        if r.peek_id() != field_id:
            continue  # left out
        r.unsigned("a field id")
        if field_id == 1:
            uuid = [r.unsigned("the source uuid") for _ in range(16)]
            if max(uuid) > 0xFF:
                raise TaggedGtidError(f"a source uuid byte of value {max(uuid)}")
            found[1] = bytes(uuid).hex()
        elif field_id == 3:
            length = r.unsigned("the tag's length")
            if length > _TAG_MAX or r.at + length > r.end:
                raise TaggedGtidError(f"a tag of {length} bytes (at most {_TAG_MAX}, within the message)")
            tag = body[r.at : r.at + length].decode("ascii", "replace").lower()
            if tag and not _TAG.match(tag):
                raise TaggedGtidError(f"tag {tag!r} is not a GTID tag (a letter or _, then letters, digits or _)")
            found[3] = tag
            r.at += length
        elif field_id in (2, 4, 5):
            found[field_id] = r.signed(f"field {field_id}")
        else:
            found[field_id] = r.unsigned(f"field {field_id}")
    if 1 not in found or 2 not in found:
        raise TaggedGtidError("no source uuid or gno: the event names no transaction")
    if not 1 <= int(found[2]) < _GNO_END:
        raise TaggedGtidError(f"gno {found[2]} is outside 1..{_GNO_END - 1}")
    h = str(found[1])
    immediate_us, immediate_version = int(found.get(6, 0)), int(found.get(9, 0))
    return TaggedGtid(
        flags=int(found.get(0, 0)),
        uuid=f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}",
        tag=str(found.get(3, "")),
        gno=int(found[2]),
        last_committed=int(found.get(4, 0)),
        sequence_number=int(found.get(5, 0)),
        immediate_commit_us=immediate_us,
        original_commit_us=int(found.get(7, immediate_us)),
        transaction_length=int(found.get(8, 0)),
        immediate_server_version=immediate_version,
        original_server_version=int(found.get(10, immediate_version)),
        commit_group_ticket=int(found.get(11, 0)),
    )
