"""MySQL GTID sets as the lab server reads them: the text form (tagged too) and the
binary form of COM_BINLOG_DUMP_GTID.

Text (MySQL 8.4 reference manual, "GTID Format and Storage"; sql/rpl_gtid_set.cc
Gtid_set::add_gtid_text): `uuid:1-5:7,uuid2:tag:1-3` — after a uuid, each `:`-separated
element is an interval (`n` or `a-b`) or a tag (letters, digits, `_`, starting with a letter
or `_`, at most 32, compared lower-cased) that the intervals after it belong to.

Binary (sql/rpl_gtid_set.cc Gtid_set::encode / encode_nsids_format): a u64 header, then per
(uuid, tag) entry: uuid 16 bytes, [tagged format: tag length << 1 in one byte, then the tag],
interval count u64, intervals as start u64 and end + 1 u64. The header is the entry count in
the untagged format (top byte 0); the tagged format (MySQL 8.3+) sets format byte 1 both in
the top byte and the low byte, the count in bits 8..55.
"""

from __future__ import annotations

import re
import struct
import uuid as uuidlib
from dataclasses import dataclass, field

Key = tuple[str, str]  # (uuid text, tag or "")

_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")


class GtidSetError(ValueError):
    """A malformed GTID set (text or encoding)."""


@dataclass
class GtidSet:
    """Intervals per (uuid, tag), inclusive, merged and sorted."""

    sets: dict[Key, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> GtidSet:
        out = cls()
        for part in (p.strip() for p in (text or "").replace("\n", "").split(",")):
            if not part:
                continue
            elements = part.split(":")
            sid = elements[0].strip().lower()
            try:
                uuidlib.UUID(sid)
            except ValueError:
                raise GtidSetError(f"malformed GTID set {text!r}: {sid!r} is not a uuid") from None
            tag = ""
            for element in (e.strip() for e in elements[1:]):
                if _TAG.match(element.lower()):
                    tag = element.lower()
                    continue
                lo, _, hi = element.partition("-")
                try:
                    start, end = int(lo), int(hi or lo)
                except ValueError:
                    raise GtidSetError(f"malformed GTID set {text!r}: bad interval {element!r}") from None
                out._add((sid, tag), start, end)
        return out

    @classmethod
    def decode(cls, data: bytes) -> GtidSet:
        if len(data) < 8:
            raise GtidSetError("GTID set encoding shorter than its header")
        header = struct.unpack_from("<Q", data, 0)[0]
        fmt = header >> 56
        if fmt == 0:
            count, tagged = header, False
        elif fmt == 1:
            count, tagged = (header >> 8) & ((1 << 48) - 1), True
        else:
            raise GtidSetError(f"unknown GTID set encoding format {fmt}")
        out = cls()
        pos = 8
        try:
            for _ in range(count):
                sid = str(uuidlib.UUID(bytes=bytes(data[pos : pos + 16])))
                pos += 16
                tag = ""
                if tagged:
                    n = data[pos] >> 1
                    tag = bytes(data[pos + 1 : pos + 1 + n]).decode("ascii").lower()
                    pos += 1 + n
                (intervals,) = struct.unpack_from("<Q", data, pos)
                pos += 8
                for _ in range(intervals):
                    start, end = struct.unpack_from("<QQ", data, pos)
                    pos += 16
                    out._add((sid, tag), start, end - 1)
        except (struct.error, IndexError, ValueError) as exc:
            raise GtidSetError(f"truncated GTID set encoding ({exc})") from None
        return out

    def _add(self, key: Key, start: int, end: int) -> None:
        if start < 1 or end < start:
            raise GtidSetError(f"bad GTID interval {start}-{end}")
        merged = sorted([*self.sets.get(key, []), (start, end)])
        out: list[tuple[int, int]] = []
        for a, b in merged:
            if out and a <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        self.sets[key] = out

    def contains(self, gtid: str) -> bool:
        """Whether `uuid:n` or `uuid:tag:n` is in the set."""
        parts = gtid.strip().lower().split(":")
        key = (parts[0], parts[1] if len(parts) == 3 else "")
        n = int(parts[-1])
        return any(a <= n <= b for a, b in self.sets.get(key, ()))

    def issubset(self, other: GtidSet) -> bool:
        for key, intervals in self.sets.items():
            theirs = other.sets.get(key, [])
            for a, b in intervals:
                if not any(x <= a and b <= y for x, y in theirs):
                    return False
        return True

    def minus(self, other: GtidSet) -> GtidSet:
        out = GtidSet()
        for key, intervals in self.sets.items():
            for a, b in intervals:
                for n in range(a, b + 1):
                    if not any(x <= n <= y for x, y in other.sets.get(key, ())):
                        out._add(key, n, n)
        return out

    def __str__(self) -> str:
        """MySQL's canonical text: uuids sorted, untagged intervals first, then each tag."""
        by_uuid: dict[str, list[tuple[str, list[tuple[int, int]]]]] = {}
        for (sid, tag), intervals in sorted(self.sets.items()):
            by_uuid.setdefault(sid, []).append((tag, intervals))
        parts = []
        for sid, groups in by_uuid.items():
            text = sid
            for tag, intervals in groups:
                if tag:
                    text += f":{tag}"
                text += "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in intervals)
            parts.append(text)
        return ",\n".join(parts)
