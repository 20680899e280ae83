"""The checkpoint: the first binlog position not yet proven delivered, and the topics'
offsets at that moment.

It is written only at transaction boundaries and only past transactions whose every
message Kafka acknowledged, so restarting from it re-reads everything not proven
delivered; recovery then reads each partition from the recorded offset on to find what
was delivered after the checkpoint, and skips those events (docs/DESIGN.md, promise 4).

The stored form is a versioned dict of primitives (`to_dict`/`from_dict`), short keys,
stable across releases; a newer version than this code knows is refused, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc.adoption import AdoptedWindow
from cdc.errors import ConfigError
from cdc.position import BinlogPosition

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    source: str
    position: BinlogPosition  # first position not yet proven delivered
    gtids: str | None = None  # GTIDs of every transaction before `position` (set string)
    server_id: int = 0
    # topic -> partition -> offset right after the last message of a transaction before
    # `position`; messages of later transactions sit at or after it.
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)  # topic -> partition count
    written_at_ms: int = 0
    events_delivered: int = 0  # running total, for the operator
    # XA transactions prepared and undecided when it was written, oldest first:
    # (xid, prepare group's start "file:pos", prepare time in seconds). For the operator
    # (`cdc check` ages them); recovery does not need it: `position` lies before them.
    xa_held: tuple[tuple[str, str, int], ...] = ()
    # The lease (cdc/lease.py): the epoch of the relay that wrote it (0: written without
    # a lease), that relay's lock session tag, and whether it wrote this one at a clean
    # stop with everything acknowledged. A checkpoint of an older epoch never wins over
    # one of a newer epoch.
    epoch: int = 0
    holder: str = ""
    released: bool = False
    # Written in the same Kafka transaction as every message before `position`
    # (kafka.delivery = "transactional", no XA prepare held): no message of a transaction
    # at or after `position` is visible to read_committed readers, so a restart needs no
    # recovery scan of the topics' tails.
    exact: bool = False
    # Taken over from Debezium (`cdc adopt`, cdc/adoption.py): until `position` passes
    # `adopted.until`, recovery also recognises Debezium's messages by their `id` header.
    adopted: AdoptedWindow | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "source": self.source,
            "file": self.position.file,
            "pos": self.position.pos,
            "gtids": self.gtids,
            "server_id": self.server_id,
            "offsets": {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(self.offsets.items())},
            "partitions": dict(sorted(self.partitions.items())),
            "written_at_ms": self.written_at_ms,
            "events_delivered": self.events_delivered,
            "xa": [list(h) for h in self.xa_held],
            "epoch": self.epoch,
            "holder": self.holder,
            "released": self.released,
            **({"exact": True} if self.exact else {}),
            **({"adopted": self.adopted.to_dict()} if self.adopted is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        version = data.get("v")
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"checkpoint format version {version!r} is not supported by this relay "
                f"(it reads version {FORMAT_VERSION}); upgrade the relay or point it at another checkpoint"
            )
        try:
            return cls(
                source=str(data["source"]),
                position=BinlogPosition(str(data["file"]), int(data["pos"])),
                gtids=data.get("gtids") or None,
                server_id=int(data.get("server_id", 0)),
                offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in data.get("offsets", {}).items()},
                partitions={t: int(n) for t, n in data.get("partitions", {}).items()},
                written_at_ms=int(data.get("written_at_ms", 0)),
                events_delivered=int(data.get("events_delivered", 0)),
                xa_held=tuple((str(x), str(at), int(ts)) for x, at, ts in data.get("xa", ())),
                epoch=int(data.get("epoch", 0)),
                holder=str(data.get("holder", "")),
                released=bool(data.get("released", False)),
                exact=bool(data.get("exact", False)),
                adopted=AdoptedWindow.from_dict(data["adopted"]) if data.get("adopted") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"checkpoint is damaged ({exc!r}); restore it or start with a start position") from exc
