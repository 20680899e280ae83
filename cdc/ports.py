"""The small interfaces the relay loop sees. Adapters in `connectors/` implement them for
real systems; tests implement them in memory (and with injected failures)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.checkpoint import Checkpoint
from cdc.gtid import GtidSet
from cdc.position import BinlogPosition
from cdc.source_events import SourceEvent

StartAt = BinlogPosition | GtidSet


class BinlogSource(Protocol):
    def read(self, timeout: float) -> SourceEvent | None:
        """The next event, or None when none arrived within `timeout` seconds.
        Raises SourceError when the connection is lost."""

    def close(self) -> None: ...


class BinlogSourceFactory(Protocol):
    def open(self, start: StartAt) -> BinlogSource:
        """A stream whose first event is the one at `start` (a position), or the first
        transaction not in `start` (a GTID set)."""

    def resolve(self, mode: str) -> BinlogPosition:
        """`latest` (the server's current end) or `earliest` (oldest binlog still kept)."""

    def check_available(self, start: StartAt) -> None:
        """Raise PositionPurgedError when the server no longer holds `start`."""

    def server_id(self) -> int:
        """The connected server's @@server_id (a change means a failover)."""

    def prepared_xids(self) -> set[str] | None:
        """The XA transactions the server lists as prepared (`XA RECOVER`), in
        `cdc.source_events.xid_text` form; None when the relay may not ask."""


class Feed(Protocol):
    """Committed transactions from the binlog (cdc.assembly.feed.LocalFeed, or a reader process)."""

    reconnects: int

    @property
    def discarded_rows(self) -> int:
        """Rows dropped by ROLLBACK / ROLLBACK TO SAVEPOINT / a stream cut mid-transaction."""

    @property
    def outbox_changes_ignored(self) -> int:
        """UPDATE/DELETE on an outbox table let through (`outbox.on_change` ignore / warn)."""

    def read(self, timeout: float) -> Any:
        """A CommittedTransaction-like object, Heartbeat, ServerInfo, cdc.assembly.feed.MORE, or None."""

    def close(self) -> None: ...

    def abandon(self) -> None:
        """Leave at once, without ending the stream politely (the relay lost its lease)."""


class WireTransaction(Protocol):
    """A committed transaction that also gives its items as the reader process's pipe
    carried them (connectors/mysql/reader_process.py, `ShippedTransaction`; the tuples of
    `cdc.events.outbox.OutboxEvent.to_wire`): the hand-over publishes the common envelope event
    from its tuple and asks for the object only when it needs one."""

    identity: Any  # cdc.events.identity.TxIdentity

    def wire(self) -> Iterator[tuple]:
        """The items' tuples in row order (a tuple's place is its row), in place of `items`."""

    def item(self, wire: tuple, row: int) -> Any:
        """The OutboxEvent or DeadLetter that `wire`, at `row`, stands for (as `items` gives it)."""


class FeedFactory(Protocol):
    def open(self, start: StartAt, server_id: int) -> Feed: ...


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    code: str  # the client's error name, e.g. MSG_SIZE_TOO_LARGE
    message: str
    too_large: bool = False  # the broker (or the client) refuses the message's size
    topic_missing: bool = False  # the topic does not exist (and the brokers did not create it)
    fatal: bool = False  # the producer cannot continue
    unroutable: bool = False  # the broker routed the message to no queue (AMQP 0-9-1 basic.return)


@dataclass(slots=True)
class Delivery:
    """One per acknowledged message; treated as immutable (not frozen: a frozen
    dataclass costs four times as much to build, and this is the hot path)."""

    topic: str
    partition: int
    offset: int  # -1: not known (Kafka acknowledged a retried batch it had already written)
    failure: DeliveryFailure | None = None


DeliveryCallback = Callable[[Delivery], None]
# A client library's own per-message report, as it calls it: (error or None, its message or
# None). confluent-kafka's on_delivery(err, msg) is this shape (see ReportingPublisher).
Report = Callable[[Any, Any], None]


class Publisher(Protocol):
    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue a message. Waits (serving callbacks) while the queue is full; never drops.
        `on_delivery` is called exactly once, from `poll` or `flush`."""

    def poll(self, timeout: float) -> None: ...

    def pending(self) -> int:
        """Messages handed over and not yet reported (queued or in flight)."""

    def flush(self, timeout: float) -> int:
        """Wait for outstanding messages; returns how many are still outstanding."""

    def purge(self) -> None:
        """Drop every message not yet acknowledged, queued or in flight, without waiting
        (the relay lost its lease: nothing more of it may reach Kafka)."""

    def close(self) -> None: ...


class ReportingPublisher(Publisher, Protocol):
    """A publisher whose client library calls a report per message itself (the Kafka
    publisher: confluent-kafka's `on_delivery(err, msg)`). The hand-over (cdc/delivery/handover.py)
    gives it its own method as that report: no adapter callable and no `Delivery` per
    message on the hot path. The port's `publish` stays, for every other caller."""

    def publish_reported(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        report: Report,
        timestamp_ms: int | None = None,
    ) -> None:
        """`publish`, with `report(error, message)` called exactly once, from `poll` or
        `flush` (or at once when the client refuses the message): acknowledged when
        `error` is None, at `message.partition()`, `message.offset()` (None: not known).
        `delivery` reads any report as the port's Delivery."""

    def delivery(self, topic: str, error: Any, message: Any) -> Delivery:
        """The report `publish_reported` got, as the port's Delivery of a message to `topic`."""


class TransactionalPublisher(Publisher, Protocol):
    """A publisher with Kafka transactions (`kafka.delivery = "transactional"`, cdc/delivery/kafka_transaction.py).
    Each raises cdc.delivery.kafka_transaction.TransactionAborted (or Fenced) when the broker refuses."""

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float) -> None: ...

    def abort_transaction(self, timeout: float) -> None: ...


class Serializer(Protocol):
    def encode(self, event, topic: str) -> bytes:
        """An `OutboxEvent` as the topic's value bytes (Confluent wire format).
        Raises ValueError/TypeError for an event the schema cannot hold."""


class CheckpointStore(Protocol):
    def load(self) -> Checkpoint | None: ...

    def save(self, checkpoint: Checkpoint) -> None:
        """Durably store `checkpoint`; returns only when it would survive a crash."""


class DeliveredLog(Protocol):
    """Reads back what the topics hold; recovery uses it to find what was delivered."""

    def partition_count(self, topic: str) -> int | None:
        """None when the topic does not exist."""

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high): the first offset still held and the next offset to be written."""

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        """(offset, headers as text) of each record held in [start, end)."""


class TopicAdmin(Protocol):
    """Creates a topic the relay is about to write (`topics.missing = "create"`)."""

    def create_topic(self, topic: str) -> str | None:
        """None once the topic exists (created now, or by someone else meanwhile); else
        why it could not be created, in one line naming the fix."""
        ...
