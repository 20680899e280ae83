"""The identity every published message carries, and the Kafka header names for it.

A message's identity is (source, transaction, row): the transaction is named by its GTID
where the server assigns one, else by the binlog coordinates of its first event; `row`
is the event's 0-based index among the outbox inserts of that transaction. Recovery,
the verifier and `cdc locate` all read these headers; their names are part of the
product's contract and never change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdc.position import BinlogPosition

# Header names: short, stable, lower-case. Values are UTF-8 text.
H_EVENT_ID = "id"  # Debezium's outbox EventRouter uses the same name
H_EVENT_TYPE = "cdc.event.type"
H_SOURCE = "cdc.source"
H_SERVER_ID = "cdc.server.id"
H_FILE = "cdc.binlog.file"
H_POS = "cdc.binlog.pos"
H_ROW = "cdc.binlog.row"
H_GTID = "cdc.gtid"
H_COMMIT_TS = "cdc.commit.ts"  # commit time, milliseconds since the epoch
H_TABLE = "cdc.table"  # schema.table the outbox row came from
H_REPAIR = "cdc.repair"  # present on messages re-published by `cdc repair`
H_XA_PREPARE = "cdc.xa.prepare"  # an XA transaction's events: where its prepare group starts (file:pos)
# Dead-letter headers.
H_DLQ_CAUSE = "cdc.dlq.cause"
H_DLQ_ERROR = "cdc.dlq.error"
H_DLQ_TOPIC = "cdc.dlq.topic"


@dataclass(frozen=True, slots=True)
class TxIdentity:
    """Where a transaction sits in the binlog, and its GTID when it has one."""

    source: str
    start: BinlogPosition
    gtid: str | None
    server_id: int
    commit_ts_ms: int
    # An XA transaction committed in a later group than its prepare: the prepare group's
    # start (where its rows are); `start` and `gtid` are the commit group's.
    xa_prepared_at: BinlogPosition | None = None

    def headers(self) -> list[tuple[str, bytes]]:
        """The headers every event of this transaction shares (all but the row index)."""
        out = [
            (H_SOURCE, self.source.encode()),
            (H_SERVER_ID, str(self.server_id).encode()),
            (H_FILE, self.start.file.encode()),
            (H_POS, str(self.start.pos).encode()),
            (H_COMMIT_TS, str(self.commit_ts_ms).encode()),
        ]
        if self.gtid:
            out.append((H_GTID, self.gtid.encode()))
        if self.xa_prepared_at is not None:
            out.append((H_XA_PREPARE, str(self.xa_prepared_at).encode()))
        return out

    def key(self) -> tuple:
        """What recognises this transaction again: the GTID survives a failover to
        another server of the same topology; file/pos does not."""
        if self.gtid:
            return (self.source, self.gtid)
        return (self.source, self.start.file, self.start.pos)


@dataclass(slots=True)
class EventIdentity:
    """One per published row; treated as immutable (not `frozen`: see OutboxEvent)."""

    tx: TxIdentity
    row: int

    def key(self) -> tuple:
        return (*self.tx.key(), self.row)

    def headers(self) -> list[tuple[str, bytes]]:
        return self.tx.headers() + [(H_ROW, str(self.row).encode())]


def header_dict(headers: Iterable[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    """Kafka headers as a dict of text (the last value wins for a repeated name)."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if value is None:
            continue
        out[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return out


def identity_key_from_headers(headers: dict[str, str]) -> tuple | None:
    """The identity key of a message from its headers, or None for a message that does
    not carry the relay's identity (written by someone else)."""
    try:
        source = headers[H_SOURCE]
        row = int(headers[H_ROW])
        gtid = headers.get(H_GTID)
        if gtid:
            return (source, gtid, row)
        return (source, headers[H_FILE], int(headers[H_POS]), row)
    except (KeyError, ValueError):
        return None


def identity_from_headers(headers: dict[str, str]) -> EventIdentity | None:
    try:
        tx = TxIdentity(
            source=headers[H_SOURCE],
            start=BinlogPosition(headers[H_FILE], int(headers[H_POS])),
            gtid=headers.get(H_GTID) or None,
            server_id=int(headers.get(H_SERVER_ID, "0")),
            commit_ts_ms=int(headers.get(H_COMMIT_TS, "0")),
        )
        return EventIdentity(tx, int(headers[H_ROW]))
    except (KeyError, ValueError):
        return None
