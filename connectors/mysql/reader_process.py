"""The relay's feed in a second process: reading, decoding, assembling, mapping and
Avro-encoding on one core, while the relay's process publishes and serves
acknowledgements on the other (`source.reader = "process"`).

The child runs exactly the in-process pipeline (`cdc.assembly.feed.LocalFeed` over
`MySQLBinlogSourceFactory` and `TransactionAssembler`, then `cdc.assembly.feed.prepare`) and ships
what it returns over a pipe:

    ("ev", Heartbeat | ServerInfo, counters)
    ("tx", TxIdentity, end, size, items, more, counters, xa)   a committed transaction; when
    ("items", items, more)                                 `more`, further items follow;
                                                           `xa`: its XaMark, or None
    ("error", module, class name, message)                 the feed raised; the child exits

`items` are plain tuples (cheaper to pickle than objects), made by `OutboxEvent.to_wire` /
`DeadLetter.to_wire` and read back by `cdc.events.outbox.item_from_wire` (cdc/events/outbox.py, next to
the types); the common envelope row becomes its tuple without the event object
(`CommittedTransaction.wire_items`, `OutboxMapper.envelope_wire`: the same tuple). The row
index is the item's place in the transaction. An envelope event's payload stays here: its
Avro value holds it, and the relay reads it back from there
(`connectors.schema_registry.avro_serializer.envelope_payload`) only for a dead letter. Only committed
transactions are sent, in binlog order, their items in row order: what the relay receives
is what `LocalFeed` would have returned in its own process. The pipe is the back-pressure:
a child ahead of the relay blocks in `send`.

Life cycle: the child is spawned as early as possible (`cdc run` starts it before its own
imports; `build_relay` otherwise), so that its imports overlap the relay's start-up, checkpoint
load and recovery; it receives its spec, opens the stream on "open", and dies
with its parent (PR_SET_PDEATHSIG). It ignores SIGINT and SIGTERM: stopping is the
relay's decision (it drains, then closes the feed). If the child dies, the relay's next
read raises SourceError and the relay stops after checkpointing its proven prefix.
Secrets travel in the spawn arguments (a pipe), never in argv or the environment.
"""

from __future__ import annotations

import copyreg
import importlib
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from cdc import crashpoints
from cdc.assembly.feed import MORE, LocalFeed, assembler_for, wire_of
from cdc.assembly.transaction import CommittedTransaction, tx_identity
from cdc.errors import CdcError, SourceError
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import DeadLetter, OutboxEvent
from cdc.ports import StartAt
from cdc.position import BinlogPosition, unchecked_position
from cdc.relay_settings import RelaySettings
from connectors.mysql.reader_spawn import SpawnedReader, spawn
from connectors.process import die_with_parent
from connectors.schema_registry.avro_serializer import envelope_payload

CHUNK = 256  # items per pipe message


@dataclass(frozen=True)
class ReaderSpec:
    """What the child needs to build its feed (it holds the password: never log it)."""

    connection: dict[str, Any]
    replica_server_id: int
    heartbeat_s: float
    decoder: str
    registry: Any  # cdc.config.RegistryConfig (its secrets stay Secrets)
    settings: RelaySettings  # tables, mapping, spill, limits: the relay's own

    def __repr__(self) -> str:  # no password in any traceback or log line
        return f"ReaderSpec(source={self.settings.source_name!r}, host={self.connection.get('host')!r})"


class ReaderProcessFeeds:
    """FeedFactory: spawns the reader process at once (its imports then overlap the
    relay's start-up), or takes one `cdc run` spawned earlier still (`spawned`,
    connectors/mysql/reader_spawn.py); `configure` hands it the spec, `open` starts its stream."""

    def __init__(self, spec: ReaderSpec | None = None, spawned: SpawnedReader | None = None):
        self._spawn(spec, spawned)

    def _spawn(self, spec: ReaderSpec | None, spawned: SpawnedReader | None = None) -> None:
        spawned = spawned or spawn()
        self._process = _Child(spawned.popen)
        self._data = Connection(spawned.data_fd, writable=False)
        self._control = Connection(spawned.control_fd, readable=False)
        self._configured = False
        self._spec: ReaderSpec | None = None
        self._opened = False
        if spec is not None:
            self.configure(spec)

    def configure(self, spec: ReaderSpec) -> None:
        if self._configured:
            raise RuntimeError("the reader process is configured once")
        self._control.send(spec)
        self._configured, self._spec = True, spec

    def open(self, start: StartAt, server_id: int) -> ProcessFeed:
        if self._opened and self._spec is not None:
            # A second stream (transactional delivery re-reads from its last committed
            # checkpoint after an abort): the first one's child was stopped with its feed.
            self._spawn(self._spec)
        self._opened = True
        self._control.send(("open", start, server_id))
        return ProcessFeed(self._data, self._control, self._process)

    def close(self) -> None:
        """Stop the child if no feed did (a relay that failed before reading)."""
        _stop(self._data, self._control, self._process)


class _Child:
    """The bits of multiprocessing.Process the feed uses, over a Popen."""

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout: float) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        self._popen.kill()


class ShippedTransaction:
    """A committed transaction read by the reader process (CommittedTransaction's shape)."""

    __slots__ = ("_feed", "_first", "_more", "end", "identity", "size", "xa")

    def __init__(
        self,
        feed: ProcessFeed,
        identity: TxIdentity,
        end: BinlogPosition,
        size: int,
        first: list[tuple],
        more: bool,
        xa: Any = None,
    ):
        self.identity, self.end, self.size, self.xa = identity, end, size, xa
        self._feed, self._first, self._more = feed, first, more

    def wire(self) -> Iterator[tuple]:
        """The items as they crossed the pipe, in row order (the row index is the place):
        the hand-over reads the common envelope event's produce arguments from its tuple
        and asks `item` for the object only when it needs one (cdc/delivery/handover.py)."""
        chunk, more = self._first, self._more
        self._first = []
        while True:
            yield from chunk
            if not more:
                self._more = False
                return
            msg = self._feed._recv(None)
            if msg[0] != "items":
                raise SourceError(f"binlog reader process: expected the rest of a transaction, got {msg[0]!r}")
            chunk, more = msg[1], msg[2]

    def item(self, wire: tuple, row: int) -> OutboxEvent | DeadLetter:
        """The item a `wire` tuple at `row` stands for, as `items` gives it."""
        if wire[0] != 1:
            return OutboxEvent.from_wire(wire, EventIdentity(self.identity, row), envelope_payload)
        return DeadLetter.from_wire(wire, EventIdentity(self.identity, row))

    def items(self) -> Iterator[OutboxEvent | DeadLetter]:
        item = self.item
        for row, wire in enumerate(self.wire()):
            yield item(wire, row)

    def release(self) -> None:
        while self._more:  # a transaction not read to its end: drop the rest of it
            for _ in self.wire():
                pass


class PipeMessages:
    """The relay's end of the data pipe: the child's messages, framed as multiprocessing's
    Connection frames them (Connection._send_bytes in Lib/multiprocessing/connection.py:
    a 4-byte big-endian signed length, or -1 and an 8-byte length for 2 GiB and more, then
    the pickle), read many at a time. Connection.recv reads each message with two or more
    read() calls, and Connection.poll builds and closes a selector on every call (7 us
    here, once per transaction); here one read() takes whatever the child has written
    (up to `_READ_SIZE`), a message already in the buffer needs no system call, and one
    poll object, made once, waits for more."""

    _READ_SIZE = 1 << 18
    _LENGTH = struct.Struct("!i")
    _LONG_LENGTH = struct.Struct("!Q")

    def __init__(self, fd: int):
        self._fd = fd
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._buffer = bytearray()
        self._start = 0  # where the first message not yet returned begins

    def recv(self, timeout: float | None) -> Any:
        """The next message, unpickled; None if none is complete within `timeout`
        seconds (None: wait for it). EOFError once the child closed its end."""
        while True:
            message = self._next()
            if message is not _INCOMPLETE:
                return message
            if timeout is not None:
                if not self._poller.poll(timeout * 1000.0):
                    return None
                timeout = None  # something came: the rest of the message follows
            self._fill()

    def _next(self) -> Any:
        buffer, start = self._buffer, self._start
        have = len(buffer) - start
        if have < 4:
            return _INCOMPLETE
        (size,) = self._LENGTH.unpack_from(buffer, start)
        head = 4
        if size == -1:
            if have < 12:
                return _INCOMPLETE
            (size,) = self._LONG_LENGTH.unpack_from(buffer, start + 4)
            head = 12
        if have < head + size:
            return _INCOMPLETE
        begin = start + head
        self._start = begin + size
        with memoryview(buffer) as view:
            return pickle.loads(view[begin : begin + size])

    def _fill(self) -> None:
        buffer = self._buffer
        if self._start:
            del buffer[: self._start]  # what was returned (no view of it is left: _next closed its own)
            self._start = 0
        chunk = os.read(self._fd, self._READ_SIZE)
        if not chunk:
            raise EOFError
        buffer += chunk


_INCOMPLETE = object()


class ProcessFeed:
    """The relay's side of the pipe (implements cdc.ports.Feed)."""

    def __init__(self, data: Any, control: Any, process: Any):
        self._conn, self._control, self._process = data, control, process
        self._messages = PipeMessages(data.fileno())
        self.reconnects = 0
        self.discarded_rows = 0
        self.outbox_changes_ignored = 0

    def _recv(self, timeout: float | None) -> Any:
        try:
            return self._messages.recv(timeout)
        except (EOFError, OSError):
            self._process.join(1.0)
            raise SourceError(
                f"the binlog reader process stopped unexpectedly (exit code {self._process.exitcode}); "
                "restart the relay (it resumes from its checkpoint)"
            ) from None

    def read(self, timeout: float) -> Any:
        msg = self._recv(timeout)
        if msg is None:
            return None
        kind = msg[0]
        if kind == "tx":
            _, identity, end, size, items, more, counters, xa = msg
            self._counters(counters)
            return ShippedTransaction(self, identity, end, size, items, more, xa)
        if kind == "ev":
            self._counters(msg[2])
            return msg[1]
        if kind == "error":
            raise _rebuild_error(msg[1], msg[2], msg[3])
        return MORE

    def _counters(self, counters: tuple[int, int, int]) -> None:
        self.reconnects, self.discarded_rows, self.outbox_changes_ignored = counters

    def close(self) -> None:
        _stop(self._conn, self._control, self._process)

    def abandon(self) -> None:
        """Leave at once (the relay lost its lease and exits): the reader process is
        killed, not asked to end its binlog session."""
        self._process.kill()
        _stop(self._conn, self._control, self._process)


def _stop(data: Connection, control: Connection, process: _Child) -> None:
    """Ask the child to stop, take what it is still sending meanwhile (it may be blocked
    in `send`), kill it after 5 s, and close both pipes. Safe to call twice."""
    try:
        control.send(("close",))
    except OSError:
        pass
    deadline = time.monotonic() + 5.0
    while process.is_alive() and time.monotonic() < deadline:
        try:
            # Read and dropped as bytes: a ProcessFeed may have taken part of a message
            # into its buffer (PipeMessages), so what is left need not start at a frame.
            if data.poll(0.05) and not os.read(data.fileno(), 1 << 16):
                break  # the child closed its end
        except OSError:
            break
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)
    data.close()
    control.close()


def _rebuild_error(module: str, name: str, message: str) -> BaseException:
    """The child's exception as the same class here (a CdcError keeps its exit code)."""
    try:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, CdcError):
            return cls(message)
    except (ImportError, AttributeError, TypeError):
        pass
    return SourceError(f"binlog reader process failed: {name}: {message}")


# ----------------------------------------------------------------------------- child


def _child_main(conn: Any, control: Any, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    crashpoints.relay_pids.append(parent_pid)  # a crash point reached here kills the relay
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # imports first: they run while the relay starts and builds the spec
    from connectors.mysql.driver import import_deferring_rsa

    import_deferring_rsa()  # before anything imports PyMySQL: 10 MiB less (connectors/mysql/driver.py)
    import connectors.mysql.binlog_decoder  # noqa: F401  # imported for its start-up cost, before the spec arrives
    from connectors.mysql.binlog_source import MySQLBinlogSourceFactory
    from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client

    try:
        spec: ReaderSpec = control.recv()
    except (EOFError, OSError):
        return
    if isinstance(spec, tuple):
        # ("close",): the relay failed before it configured us (a sink it cannot reach). Not
        # `isinstance(spec, ReaderSpec)`: run as __main__, this module's class is another one.
        return

    from connectors.mysql.replica_sessions import set_source

    set_source(spec.settings.source_name)  # its binlog sessions' tags name the source
    feed = None
    try:
        sources = MySQLBinlogSourceFactory(
            spec.connection,
            spec.replica_server_id,
            {(t.schema, t.table) for t in spec.settings.tables},
            heartbeat_s=spec.heartbeat_s,
            decoder=spec.decoder,
            threaded=False,
        )
        serializer = ConfluentAvroSerializer(registry_client(spec.registry))
        msg = control.recv()
        if msg[0] != "open":
            return
        _, start, server_id = msg
        assembler = assembler_for(spec.settings, server_id)
        feed = LocalFeed(
            sources, assembler, start, spec.settings.reconnect_timeout_s, time.time, time.sleep, time.sleep
        )
        _ship(conn, control, feed, serializer, spec)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except BaseException as exc:
        try:
            conn.send(("error", type(exc).__module__, type(exc).__name__, str(exc)))
        except OSError:
            pass
    finally:
        if feed is not None:
            feed.close()


def _reduce_position(p: BinlogPosition) -> tuple[Any, ...]:
    return (unchecked_position, (p.file, p.pos))


def _reduce_tx_identity(t: TxIdentity) -> tuple[Any, ...]:
    return (tx_identity, (t.source, t.start, t.gtid, t.server_id, t.commit_ts_ms, t.xa_prepared_at))


class MessagePickler:
    """What `Connection.send` pickles a message into (the relay's `recv` unpickles it as
    ever), made cheaper per message, which counts on an outbox written one event per
    transaction (a message each):

    - One pickler for the process's life, its buffer and memo reset after each message:
      `ForkingPickler.dumps` built a pickler per message and copied copyreg's dispatch
      table into it.
    - A TxIdentity and a BinlogPosition (every "tx" message holds one and two) pickled by
      their fields: pickle's default for a slotted dataclass is its `__getstate__` /
      `__setstate__` (dataclasses.py), which calls `fields()` and sets each field in a loop,
      on both sides. They are rebuilt by `cdc.assembly.transaction.tx_identity` and
      `cdc.position.unchecked_position`, by name: this module is `__main__` in the
      child, which the relay cannot import from.

    A one-row transaction's message: 12.0 -> 3.6 us pickled, 8.7 -> 4.7 us unpickled by the
    relay (min of 3 x 20k, a loaded machine; docs/hot-path.md, "The reader's encoding and the pipe")."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._pickler = pickle.Pickler(self._buffer, pickle.DEFAULT_PROTOCOL)
        self._pickler.dispatch_table = {
            **copyreg.dispatch_table,
            BinlogPosition: _reduce_position,
            TxIdentity: _reduce_tx_identity,
        }

    def dumps(self, message: Any) -> bytes:
        buffer = self._buffer
        try:
            self._pickler.dump(message)
            return buffer.getvalue()
        finally:
            buffer.seek(0)
            buffer.truncate()
            self._pickler.clear_memo()


def _ship(conn: Any, control: Any, feed: LocalFeed, serializer: Any, spec: ReaderSpec) -> None:
    send_bytes, poll, dumps = conn.send_bytes, control.poll, MessagePickler().dumps

    def send(message: tuple[Any, ...]) -> None:  # Connection.send, with the pickler above
        send_bytes(dumps(message))

    max_bytes = spec.settings.max_message_bytes
    timeout = max(spec.settings.read_timeout_s, 0.05)
    payload_in_value = bool(getattr(serializer, "payload_in_value", False))  # see OutboxEvent.to_wire
    # The common envelope row goes from its values to its tuple without an OutboxEvent
    # (CommittedTransaction.wire_items); anything else is the item, prepared, to_wire'd.
    envelope = serializer if payload_in_value and hasattr(serializer, "envelope_body") else None
    slow = partial(wire_of, serializer=serializer, max_message_bytes=max_bytes, payload_in_value=payload_in_value)

    while True:
        item = feed.read(timeout)
        if item is MORE:
            continue
        if poll(0) and control.recv()[0] == "close":
            return
        if item is None:
            continue
        counters = (feed.reconnects, feed.discarded_rows, feed.outbox_changes_ignored)
        if not isinstance(item, CommittedTransaction):
            send(("ev", item, counters))
            continue
        chunk: list[tuple[Any, ...]] = []
        head = True
        for wire in item.wire_items(envelope, max_bytes, slow):
            chunk.append(wire)
            if len(chunk) >= CHUNK:
                if head:
                    send(("tx", item.identity, item.end, item.size, chunk, True, counters, item.xa))
                    head = False
                else:
                    send(("items", chunk, True))
                chunk = []
        if head:
            send(("tx", item.identity, item.end, item.size, chunk, False, counters, item.xa))
        else:
            send(("items", chunk, False))
        item.release()


if __name__ == "__main__":
    _data_fd, _control_fd, _parent = (int(a) for a in sys.argv[1:4])
    _child_main(Connection(_data_fd, readable=False), Connection(_control_fd, writable=False), _parent)
