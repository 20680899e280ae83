"""Taking over from Debezium: its stored offset, and the window in which its messages count.

A Debezium MySQL connector stores, per connector, an offset (Kafka Connect's offsets topic,
or a FileOffsetBackingStore file) whose key is `["<connector name>",{"server":"<topic.prefix>"}]`
and whose value is JSON: `file` and `pos` (the binlog position of the *start* of the
transaction it was in: its BEGIN, or its GTID event), `event` and `row` (how many events of
that transaction, and rows of the current event, to skip on restart), `gtids` (the GTID set
before that transaction, on GTID servers), `ts_sec`, `server_id`, and `snapshot` while an
initial snapshot runs.

**What the offset proves, and what it does not.** Everything before `pos` was published and
acknowledged (Kafka Connect commits an offset only past acknowledged records). From `pos` on,
Debezium may have published some events and not others: the records of the rest of its last
batch, and of batches after its last offset flush, reached Kafka before it died. So the relay
starts reading at `pos` (a transaction boundary; `event`/`row` are recorded, not trusted) and
publishes an event only when no Debezium message carries its id: the recovery scan
(cdc/recovery.py) collects the `id` header of every message in the adopted topics that lacks
the relay's identity headers, from the topics' first offsets at adoption. Outbox ids are the
events' identity in Debezium's model too (its router puts the id column in that header), so
they must be unique, as a primary key makes them.

**The window.** Debezium is stopped before adoption, so it published nothing of the binlog
past the server's head at that moment (`until`). Until the relay's checkpoint passes `until`
every checkpoint carries the window (`AdoptedWindow`), so a relay restarted inside it scans
again from the same first offsets; after it, the window is dropped and recovery is the
relay's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import ConfigError
from cdc.position import BinlogPosition


class AdoptionError(ConfigError):
    """A Debezium offset that cannot be adopted (missing, damaged, mid-snapshot)."""


@dataclass(frozen=True)
class DebeziumOffset:
    """One Debezium MySQL connector's stored source offset."""

    connector: str
    server: str  # topic.prefix
    position: BinlogPosition  # the start of the transaction Debezium was in
    events_to_skip: int = 0
    rows_to_skip: int = 0
    gtids: str | None = None
    ts_sec: int = 0
    server_id: int = 0

    def __str__(self) -> str:
        skip = (
            f" (+{self.events_to_skip} events, {self.rows_to_skip} rows)"
            if self.events_to_skip or self.rows_to_skip
            else ""
        )
        return f"{self.position}{skip}"


def connector_offset_key(connector: str, server: str) -> bytes:
    """The key Kafka Connect's JsonConverter writes for this connector's partition."""
    return json.dumps([connector, {"server": server}], separators=(",", ":")).encode()


def offset_key_matches(raw_key: bytes | None, connector: str, server: str | None) -> bool:
    """Is `raw_key` this connector's partition (any `server` when None)? Compared as JSON,
    not as bytes: other writers may space it differently."""
    if raw_key is None:
        return False
    try:
        key = json.loads(raw_key)
    except ValueError:
        return False
    if not (isinstance(key, list) and len(key) == 2 and key[0] == connector and isinstance(key[1], dict)):
        return False
    return server is None or key[1].get("server") == server


def parse_debezium_offset(raw_key: bytes, raw_value: bytes | None, where: str) -> DebeziumOffset:
    """The offset stored under `raw_key`. Refused (AdoptionError, one line): a deleted
    offset, a value that is not a MySQL connector's, one taken during a snapshot."""
    key = json.loads(raw_key)
    connector, server = str(key[0]), str(key[1].get("server", ""))
    if raw_value is None:
        raise AdoptionError(
            f"the offset of connector {connector!r} in {where} was deleted (a tombstone): there "
            "is no position to adopt; start the relay with source.start instead"
        )
    try:
        value: dict[str, Any] = json.loads(raw_value)
        if not isinstance(value, dict):
            raise ValueError("not an object")
        file, pos = value["file"], value["pos"]
        position = BinlogPosition(str(file), int(pos))
    except (ValueError, KeyError, TypeError) as exc:
        raise AdoptionError(
            f"the offset of connector {connector!r} in {where} is not a Debezium MySQL offset "
            f"(no binlog file/pos: {exc}); adopt only from a MySQL connector's offsets"
        ) from exc
    if value.get("snapshot") in (True, "true", "INITIAL", "initial") or value.get("snapshot_completed") is False:
        raise AdoptionError(
            f"connector {connector!r} stored its offset during a snapshot ({where}): the binlog "
            "position is not a streaming position yet; let Debezium finish the snapshot and stream, "
            "stop it, then adopt"
        )
    try:
        return DebeziumOffset(
            connector,
            server,
            position,
            int(value.get("event", 0) or 0),
            int(value.get("row", 0) or 0),
            str(value["gtids"]) if value.get("gtids") else None,
            int(value.get("ts_sec", 0) or 0),
            int(value.get("server_id", 0) or 0),
        )
    except (TypeError, ValueError) as exc:
        raise AdoptionError(
            f"the offset of connector {connector!r} in {where} is damaged ({exc}); "
            "restore it or start the relay with source.start"
        ) from exc


def pick_offset(
    entries: dict[bytes | None, bytes | None], connector: str, server: str | None, where: str
) -> DebeziumOffset:
    """The connector's offset among a store's entries (the last one wins, as in Connect)."""
    found = [(k, v) for k, v in entries.items() if offset_key_matches(k, connector, server)]
    if not found:
        names = sorted({str(json.loads(k)[0]) for k in entries if k and _is_json_list(k)})
        raise AdoptionError(
            f"no offset of connector {connector!r}"
            + (f" with topic.prefix {server!r}" if server else "")
            + f" in {where} (it holds: {', '.join(names) or 'no connector offsets'}); "
            "give the connector's `name` (and `topic.prefix`) as configured in Debezium"
        )
    servers = {json.loads(k)[1].get("server") for k, _ in found if k is not None}
    if len(servers) > 1:
        raise AdoptionError(
            f"connector {connector!r} has offsets for several topic prefixes in {where} "
            f"({', '.join(sorted(map(str, servers)))}): name one with --debezium-server"
        )
    key, value = found[-1]
    if key is None or value is None:
        raise AdoptionError(f"the newest offset of connector {connector!r} in {where} is a deletion: nothing to adopt")
    return parse_debezium_offset(key, value, where)


def _is_json_list(raw: bytes) -> bool:
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, list) and len(value) == 2


@dataclass(frozen=True)
class AdoptedWindow:
    """Where Debezium's messages may sit: each adopted topic's partitions from these
    offsets on, for events of the binlog before `until` (the server's head when the relay
    adopted; Debezium was stopped by then)."""

    until: BinlogPosition
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    origin: str = ""  # for the operator: which connector's offset, and where it was

    def to_dict(self) -> dict[str, Any]:
        return {
            "until": str(self.until),
            "origin": self.origin,
            "offsets": {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(self.offsets.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdoptedWindow:
        return cls(
            BinlogPosition.parse(str(data["until"])),
            {t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.get("offsets", {}).items()},
            str(data.get("origin", "")),
        )
