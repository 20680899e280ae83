"""The relay's feed: committed transactions, ready to publish, from the binlog.

    BinlogSource.read() -> TransactionAssembler.feed() -> CommittedTransaction
        (its items mapped and, via `prepare`, encoded or dead-lettered)

`LocalFeed` does this in the relay's own process. `connectors.mysql.reader_process` runs the
same `LocalFeed` in a second process and ships what it returns to the relay over a pipe,
so that reading, decoding, mapping and encoding use one core while publishing and
acknowledging use the other. Either way the relay sees the same sequence: only committed
transactions, in binlog order, each with its items in row order.

Reconnects are the feed's job: on a lost connection it reopens the stream at the end of
the last complete transaction it read (never the library's memory, which may sit in the
middle of one), and gives up with SourceError after `reconnect_timeout_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdc import crashpoints
from cdc.assembly.transaction import CommittedTransaction, TransactionAssembler
from cdc.errors import SourceError
from cdc.events.outbox import DeadLetter, OutboxEvent, OutboxMapper
from cdc.events.topics import TopicRouter
from cdc.ports import BinlogSource, BinlogSourceFactory, Serializer, StartAt
from cdc.position import BinlogPosition
from cdc.relay_settings import RelaySettings
from cdc.source_events import Heartbeat, RowInsert, ServerInfo, ServerStarted

log = logging.getLogger(__name__)


class _More:
    """`LocalFeed.read` consumed an event that did not complete a transaction."""

    def __repr__(self) -> str:
        return "MORE"


MORE = _More()
LOST_PREPARE_CHECK_S = 5.0  # while XA prepares are held: how often to ask whether the server lost one
FeedItem = CommittedTransaction | Heartbeat | ServerInfo | _More | None  # None: nothing to read (caught up)


def as_dead_letter(event: OutboxEvent, cause: str, error: str) -> DeadLetter:
    """`event` kept whole as a dead letter with its cause."""
    row = {
        "id": event.event_id, "aggregatetype": event.aggregate_type, "aggregateid": event.aggregate_id,
        "type": event.event_type, "payload": event.original_payload(), "timestamp_us": event.timestamp_us,
    }  # fmt: skip
    return DeadLetter(cause, error, event.topic, event.aggregate_id, row, event.table, event.identity)


def prepare(event: OutboxEvent, serializer: Serializer, max_message_bytes: int) -> OutboxEvent | DeadLetter:
    """`event` with its encoded value set, or the dead letter it becomes when it cannot be
    encoded or is larger than a message may be."""
    try:
        value = serializer.encode(event, event.topic)
    except (ValueError, TypeError) as exc:
        return as_dead_letter(event, "encoding_failed", str(exc))
    if value is None:  # a payload format's null value (a tombstone, a NULL payload)
        event.extras.null_value = True
        return event
    if len(value) > max_message_bytes:
        return as_dead_letter(
            event, "too_large", f"encoded event is {len(value)} bytes; the limit is {max_message_bytes}"
        )
    event.encoded = value
    return event


def wire_of(
    item: OutboxEvent | DeadLetter, serializer: Serializer, max_message_bytes: int, payload_in_value: bool
) -> tuple[Any, ...]:
    """What the reader process's pipe carries for `item` (connectors/mysql/reader_process.py): an
    event `prepare`d, then its `to_wire` (see OutboxEvent.to_wire for `payload_in_value`)."""
    if type(item) is OutboxEvent:
        item = prepare(item, serializer, max_message_bytes)
        if type(item) is OutboxEvent:
            return item.to_wire(payload_in_value)
    return item.to_wire()


def assembler_for(
    settings: RelaySettings, server_id: int, on_ignored_change: Callable[[Any], None] | None = None
) -> TransactionAssembler:
    """The transaction assembly the relay's settings describe (in either process)."""
    return TransactionAssembler(
        list(settings.tables),
        OutboxMapper(TopicRouter(settings.topic_allowlist)),
        settings.source_name,
        server_id,
        settings.on_change,
        settings.spill_rows,
        settings.spill_dir,
        on_ignored_change=on_ignored_change,
        on_statement=settings.on_statement,
    )


class LocalFeed:
    """Source events in, committed transactions out, in this process."""

    def __init__(
        self,
        sources: BinlogSourceFactory,
        assembler: TransactionAssembler,
        start: StartAt,
        reconnect_timeout_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        wait: Callable[[float], None],
    ):
        self._sources = sources
        self._assembler = assembler
        self._start = start
        self._reconnect_timeout_s = reconnect_timeout_s
        self._clock, self._sleep, self._wait = clock, sleep, wait
        self.reconnects = 0
        self._source: BinlogSource | None = sources.open(start)
        # Lost prepares (see _lost_prepare): xid -> the server's binlog end when XA RECOVER
        # did not list it; dropped once the feed has read that far without its outcome.
        self._lost: dict[str, BinlogPosition] = {}
        self._next_lost_check = 0.0
        self._server_started: float | None = None  # learnt once per connection (a restart cuts it)
        # The latest binlog file read that a server start opened (ServerStarted): kept across
        # reconnects, it is a fact of the binlog, not of the connection.
        self._started_file: BinlogPosition | None = None

    @property
    def discarded_rows(self) -> int:
        return self._assembler.discarded_rows

    @property
    def outbox_changes_ignored(self) -> int:
        return self._assembler.changes_ignored

    def read(self, timeout: float) -> FeedItem:
        """The next thing the relay must act on: a committed transaction, a heartbeat, the
        server's identity; MORE when an event was consumed without completing a
        transaction; None when nothing arrived within `timeout`."""
        assert self._source is not None
        if self._assembler.holds_prepared and not self._assembler.in_transaction:
            lost = self._lost_prepare()
            if lost is not None:
                return lost
        try:
            event = self._source.read(timeout)
        except SourceError as exc:
            self._reconnect(exc)
            return MORE
        if event is None:
            return None
        if isinstance(event, Heartbeat):
            return event
        assembler = self._assembler
        if isinstance(event, ServerInfo):
            assembler.server_id = event.server_id
            return event
        if isinstance(event, ServerStarted):
            if self._started_file is None or event.end > self._started_file:
                self._started_file = event.end
            return MORE
        tx = assembler.feed(event)
        if tx is not None:
            if tx.xa is not None and tx.xa.kind == "prepare":
                crashpoints.hit("xa_prepared")
            return tx
        if type(event) is RowInsert:
            # Unarmed (always, outside the fault tests), the crash point costs one call per
            # run of rows, not one per row: `hit` was about 0.1 us a row.
            crash = assembler.in_transaction and crashpoints.armed("mid_transaction")
            if crash:
                crashpoints.hit("mid_transaction")
            # The rows that follow it in what the source has read already, taken here in one
            # call (a source that offers `ready_rows`), not one `read` each through this
            # method's checks and the caller's loop: see docs/hot-path.md, "The row
            # path". A row insert never completes a transaction.
            # The assembler takes the run in one call too (`feed_inserts`); the crash point
            # is still passed once per row, as each row read inside a transaction passes it.
            ready_rows = getattr(self._source, "ready_rows", None)
            if ready_rows is not None:
                rows = ready_rows()
                if rows:
                    assembler.feed_inserts(rows)
                    if crash:
                        hit = crashpoints.hit
                        for _ in rows:
                            hit("mid_transaction")
        return MORE

    def _lost_prepare(self) -> CommittedTransaction | None:
        """A prepared XA transaction the server lost in a crash (its prepare group reached
        the binlog, the engine's prepare did not) never gets an outcome: held, it would keep
        the checkpoint back forever, and no one can XA COMMIT or XA ROLLBACK it (XAER_NOTA).
        Proof that it is lost: it was prepared before the server's current start, XA RECOVER
        (asked after that start) does not list it, and the feed has read up to the binlog end
        taken after XA RECOVER without finding its outcome (a decided transaction leaves the
        engine's prepared list only after its outcome is in the binlog). "Before a start":
        its timestamp is over a second before the server's start time (both whole seconds),
        or it lies in a binlog file before one a server start opened (ServerStarted): a
        server restarted within the second of the prepare is told by the binlog only."""
        assembler = self._assembler
        at = assembler.resume_point
        if self._lost and at is not None:
            for xid, horizon in list(self._lost.items()):
                if xid not in assembler.prepared_xids:
                    del self._lost[xid]
                elif at >= horizon:
                    del self._lost[xid]
                    log.warning(
                        "XA transaction %s: the server lost it in a crash (prepared before the server's "
                        "start, not listed by XA RECOVER, no outcome in the binlog up to %s); it can never "
                        "commit, its rows are dropped",
                        xid,
                        horizon,
                    )
                    return assembler.drop_lost(xid)
        now = self._clock()
        if now < self._next_lost_check:
            return None
        self._next_lost_check = now + LOST_PREPARE_CHECK_S
        started_at = getattr(self._sources, "server_started_at", None)
        restarted = self._started_file
        if started_at is None and restarted is None:
            return None
        try:
            if self._server_started is None and started_at is not None:
                self._server_started = started_at()
            since = self._server_started
            older = [
                xid
                for xid, at, ts in assembler.prepared()
                if xid not in self._lost
                and ((since is not None and ts < since - 1) or (restarted is not None and at < restarted))
            ]
            if not older:
                return None
            listed = self._sources.prepared_xids()
            if listed is None:
                return None
            horizon = self._sources.resolve("latest")
        except SourceError as exc:
            log.info("checking for prepares lost in a crash failed (%s); checking again later", exc)
            return None
        for xid in older:
            if xid not in listed:
                self._lost[xid] = horizon
        return None

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None
        self._assembler.reset()

    def abandon(self) -> None:
        """Leave at once (the relay lost its lease and exits): the stream is not ended
        politely; the process's exit closes its socket."""
        self._source = None
        self._assembler.reset()

    def _reconnect(self, cause: Exception) -> None:
        """Reopen the stream from the feed's own position: the end of the last complete
        transaction read."""
        assert self._source is not None
        self._source.close()
        assembler = self._assembler
        assembler.reset()
        self._server_started = None  # the server may have restarted
        resume = assembler.resume_point or self._start
        log.warning("binlog connection lost (%s); reconnecting from %s", cause, resume)
        deadline = self._clock() + self._reconnect_timeout_s
        delay = 0.05
        while True:
            self._wait(0)
            try:
                self._source = self._sources.open(resume)
                self.reconnects += 1
                return
            except SourceError as exc:
                if self._clock() >= deadline:
                    raise SourceError(
                        f"binlog server unreachable for {self._reconnect_timeout_s:.0f} s ({exc}); "
                        "check that it is running and reachable, then restart the relay"
                    ) from exc
                self._wait(min(delay, 0.2))
                self._sleep(delay)
                delay = min(delay * 2, 0.5)
