"""GTIDs: the identity of a transaction that survives a failover.

Two flavours, both immutable, with set semantics and a canonical string form:

* MySQL: a transaction is `source_uuid:sequence`, or, tagged (MySQL 8.3+,
  `SET gtid_next = 'AUTOMATIC:<tag>'`), `source_uuid:tag:sequence`; a set is
  `uuid:1-100:200:tag1:1-3:tag2:7,uuid2:1-7` (intervals inclusive, sorted and merged in the
  canonical form, uuids and tags lower-case, sorted by (uuid, tag) with the untagged
  intervals first, as `gtid_executed` prints them: sql/rpl_gtid_set.cc
  `Gtid_set::to_string`). A tagged GTID and an untagged one of the same uuid are different
  transactions: MySQL keys a GTID by its TSID, (uuid, tag) (libs/mysql/gtid/tsid.h).
* MariaDB: a transaction is `domain-server-sequence`; a position is a list with one
  entry per replication domain, `0-1-100,1-2-7`. Within a domain sequence numbers are
  strictly increasing (gtid_strict_mode), so "contains" means "sequence not greater than
  the domain's last one", whatever server wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from cdc.errors import PositionError

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_MARIADB_GTID = re.compile(r"^([0-9]+)-([0-9]+)-([0-9]+)$")
_DIGITS = re.compile(r"^[0-9]+$")
# libs/mysql/gtid/tag.cpp `Tag::from_cstring` / gtid_constants.h `tag_max_length`: a letter
# or '_', then letters, digits or '_', at most 32 characters; MySQL stores it lower-case.
_TAG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_TAG_RULE = "a tag is a letter or _ then up to 31 letters, digits or _"
# sql/rpl_gtid_set.cc parse_gno: a GTID number is 1 .. GNO_END - 1, GNO_END = INT64_MAX
_GNO_MAX = (1 << 63) - 2

Interval = tuple[int, int]


def _merge(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((a, b) for a, b in merged)


Tsid = tuple[str, str]  # (source uuid, tag); "" for an untagged GTID


@dataclass(frozen=True, slots=True)
class MysqlGtidSet:
    """A MySQL GTID set: (source uuid, tag) -> merged inclusive intervals, sorted by
    (uuid, tag) so that the untagged intervals of a uuid come before its tags."""

    intervals: tuple[tuple[Tsid, tuple[Interval, ...]], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        by_tsid: dict[Tsid, list[Interval]] = {}
        for part in text.replace("\n", "").split(","):
            part = part.strip()
            if not part:
                continue
            uuid, *items = (item.strip() for item in part.split(":"))
            if not _UUID.match(uuid) or not items:
                raise PositionError(
                    f"malformed MySQL GTID set element {part!r}: expected <server_uuid>[:<tag>]:<n>[-<m>][:<n>-<m>...]"
                )
            tag, pending, found = "", False, False  # pending: a tag not yet followed by an interval
            for item in items:
                if _TAG.match(item):
                    if pending:
                        raise PositionError(f"tag {tag!r} in {part!r} has no interval after it")
                    tag, pending = item.lower(), True
                    continue
                if item[:1].isalpha() or item[:1] == "_":
                    raise PositionError(f"malformed GTID tag {item!r} in {part!r}: {_TAG_RULE}")
                lo, dash, hi = (x.strip() for x in item.partition("-"))
                if not _DIGITS.match(lo) or (dash and not _DIGITS.match(hi)):
                    raise PositionError(f"malformed GTID interval {item!r} in {part!r}")
                start, end = int(lo), int(hi or lo)
                if start < 1 or end < start:
                    raise PositionError(f"GTID interval {item!r} in {part!r} is empty or starts below 1")
                if end > _GNO_MAX:
                    raise PositionError(f"GTID interval {item!r} in {part!r} goes past {_GNO_MAX}, MySQL's largest")
                by_tsid.setdefault((uuid.lower(), tag), []).append((start, end))
                pending, found = False, True
            if pending or not found:
                raise PositionError(f"tag {tag!r} in {part!r} has no interval after it")
        return cls._build(by_tsid)

    @classmethod
    def _build(cls, by_tsid: dict[Tsid, list[Interval]]) -> MysqlGtidSet:
        return cls(tuple(sorted((t, _merge(iv)) for t, iv in by_tsid.items() if iv)))

    def _as_dict(self) -> dict[Tsid, list[Interval]]:
        return {t: list(iv) for t, iv in self.intervals}

    @property
    def tagged(self) -> bool:
        """Whether any GTID of the set has a tag (its binary encoding then needs MySQL's
        tagged format: connectors/mysql/binlog_protocol.py)."""
        return any(tag for (_uuid, tag), _ivs in self.intervals)

    def contains(self, gtid: str) -> bool:
        tsid, seq = _split_mysql_gtid(gtid)
        for t, ivs in self.intervals:
            if t == tsid:
                return any(a <= seq <= b for a, b in ivs)
        return False

    def add(self, gtid: str) -> MysqlGtidSet:
        tsid, seq = _split_mysql_gtid(gtid)
        d = self._as_dict()
        d.setdefault(tsid, []).append((seq, seq))
        return self._build(d)

    def union(self, other: MysqlGtidSet) -> MysqlGtidSet:
        d = self._as_dict()
        for t, ivs in other.intervals:
            d.setdefault(t, []).extend(ivs)
        return self._build(d)

    def issuperset(self, other: MysqlGtidSet) -> bool:
        return self.union(other) == self

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def __str__(self) -> str:
        out: list[str] = []
        for (uuid, tag), ivs in self.intervals:
            if not out or not out[-1].startswith(uuid):
                out.append(uuid)
            out[-1] += (f":{tag}" if tag else "") + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in ivs)
        return ",".join(out)


def _split_mysql_gtid(gtid: str) -> tuple[Tsid, int]:
    """`uuid:n` or `uuid:tag:n` -> ((uuid, tag), n), uuid and tag lower-case."""
    items = [item.strip() for item in gtid.strip().split(":")]
    uuid, middle, seq = items[0], items[1:-1], items[-1]
    tag = middle[0] if len(middle) == 1 else ""
    malformed = len(items) < 2 or len(middle) > 1 or (middle and not _TAG.match(tag))
    if malformed or not _UUID.match(uuid) or not _DIGITS.match(seq) or not 1 <= int(seq) <= _GNO_MAX:
        raise PositionError(f"malformed MySQL GTID {gtid!r}: expected <server_uuid>:<n> or <server_uuid>:<tag>:<n>")
    return (uuid.lower(), tag.lower()), int(seq)


def mysql_gtid_text(gtid: str) -> str:
    """One MySQL GTID in MySQL's text form (`uuid:n`, `uuid:tag:n`; uuid and tag
    lower-case), as the relay's `cdc.gtid` header carries it; PositionError when `gtid`
    is not one."""
    (uuid, tag), seq = _split_mysql_gtid(gtid)
    return f"{uuid}:{tag}:{seq}" if tag else f"{uuid}:{seq}"


def looks_like_mysql_gtid(text: str) -> bool:
    """Whether `text` starts as a MySQL GTID does (a server uuid, then ':'): a binlog
    position never does."""
    head, sep, _rest = text.strip().partition(":")
    return bool(sep) and bool(_UUID.match(head.strip()))


@dataclass(frozen=True, slots=True)
class MariadbGtidPosition:
    """A MariaDB GTID position: the last (server, sequence) applied in each domain."""

    domains: tuple[tuple[int, int, int], ...] = ()  # (domain, server, seq), sorted by domain

    @classmethod
    def parse(cls, text: str) -> MariadbGtidPosition:
        found: dict[int, tuple[int, int]] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            domain, server, seq = _split_mariadb_gtid(part)
            if domain in found:
                raise PositionError(
                    f"MariaDB GTID position {text!r} names domain {domain} twice; a position holds one GTID per domain"
                )
            found[domain] = (server, seq)
        return cls(tuple(sorted((d, s, q) for d, (s, q) in found.items())))

    def contains(self, gtid: str) -> bool:
        domain, _server, seq = _split_mariadb_gtid(gtid)
        return any(d == domain and seq <= q for d, _s, q in self.domains)

    def add(self, gtid: str) -> MariadbGtidPosition:
        domain, server, seq = _split_mariadb_gtid(gtid)
        kept = [(d, s, q) for d, s, q in self.domains if d != domain]
        current = [(d, s, q) for d, s, q in self.domains if d == domain]
        if current and current[0][2] >= seq:
            return self
        return MariadbGtidPosition(tuple(sorted(kept + [(domain, server, seq)])))

    def union(self, other: MariadbGtidPosition) -> MariadbGtidPosition:
        result = self
        for d, s, q in other.domains:
            result = result.add(f"{d}-{s}-{q}")
        return result

    def issuperset(self, other: MariadbGtidPosition) -> bool:
        return all(self.contains(f"{d}-{s}-{q}") for d, s, q in other.domains)

    def __bool__(self) -> bool:
        return bool(self.domains)

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{q}" for d, s, q in self.domains)


def _split_mariadb_gtid(gtid: str) -> tuple[int, int, int]:
    match = _MARIADB_GTID.match(gtid.strip())
    if not match:
        raise PositionError(f"malformed MariaDB GTID {gtid!r}: expected <domain>-<server>-<sequence>")
    domain, server, seq = (int(g) for g in match.groups())
    return domain, server, seq


GtidSet = MysqlGtidSet | MariadbGtidPosition


def is_mariadb_gtid(gtid: str) -> bool:
    return bool(_MARIADB_GTID.match(gtid.strip()))


def parse_gtid_set(text: str) -> GtidSet:
    """Parse either flavour, telling them apart by shape."""
    first = text.strip().split(",")[0].strip()
    if not first:
        raise PositionError("empty GTID set: give at least one GTID")
    if _MARIADB_GTID.match(first):
        return MariadbGtidPosition.parse(text)
    return MysqlGtidSet.parse(text)


def empty_set_for(gtid: str) -> GtidSet:
    """The empty set of the flavour that `gtid` belongs to."""
    return MariadbGtidPosition() if is_mariadb_gtid(gtid) else MysqlGtidSet()
