"""The RabbitMQ Streams sink (`[sink] kind = "rabbitmq_stream"`, docs/sinks.md): the
publisher (cdc.ports.ReportingPublisher, as the Kafka one), the reader of what the streams hold (cdc.ports.DeliveredLog)
and the creator of missing streams (cdc.ports.TopicAdmin), over rstream's stream-protocol
client (RabbitMQ 3.10's stream plugin).

rstream is asyncio; the relay is synchronous. One event loop runs in a daemon thread
(`connectors/loop_thread.py`); the relay's thread hands messages over in batches (at most
`_HANDOFF_EVERY`, the rest at `poll`) and takes the confirmations back in `poll` / `flush`,
where the callbacks run (the Publisher port's contract, as Kafka's).

What maps to what: a topic is the stream of its name, or, when `<topic>-0`, `<topic>-1`,
... exist instead (3.10 has no super streams), the stream of the key's partition, Kafka's
murmur2 of the key modulo the count (so a key goes where a Kafka producer would put it);
key, headers and a null value are AMQP application properties (cdc.events.sink_fields), the
timestamp is `properties.creation-time`, the value is the body.

Publishing ids (docs/sink-delivery.md, "RabbitMQ Streams"). Every message is published under one
producer name (`cdc-relay.<source.name>` unless `producer_name`) with a publishing id; the
broker keeps the highest id stored per name and stream and confirms, without storing, any
id not above it (pinned in tests/integration/test_sink_servers.py). Ids are given in
publishing order per stream, from the highest the broker holds when the run first publishes
to the stream (`query_publisher_sequence`). While a message is unconfirmed the publisher
keeps it; when the connection is lost (the node restarted, or cut off), or the node drops
a stream's publisher on a live connection (the stream's leader restarted: a MetadataUpdate,
then PublishError 18 for what is sent to it), it connects again, declares every publisher
again and sends every unconfirmed message again, in order, with its own id: what the node had
stored is confirmed and dropped, the rest is stored. So a broker restart inside a run
neither loses nor repeats a message and does not stop the relay. Across a relay restart the
ids start above the old ones: the checkpoint and the recovery scan of identity headers
(cdc/recovery.py) decide what is published again, not the ids.

A cluster (docs/sinks.md, "A RabbitMQ cluster"): each stream's publisher is declared on a
connection to the stream's leader, found by the Metadata command asked of any configured
node (`host`, then `hosts`); one connection per leader node. A leader's death is one of the
losses above: the connections are made again to the leaders asked again (LeaderNotAvailable
while an election runs: asked again every second, within publish_timeout_s), and the
unconfirmed are sent again with their ids; the stream's de-duplication state is replicated
with it, so the new leader drops what the old one had stored.

Offsets. A confirmation carries no offset (3.10's stream protocol). The offset reported is
`end + (id - highest - 1)`, with `end` the stream's end and `highest` the broker's highest id
when the run first published to the stream: exact while the relay is the only writer, and
never above the true offset otherwise (another writer only pushes the relay's messages
further). A checkpoint's offsets are where a recovery scan starts, so a low one costs a
longer scan, never a missed message. A message the broker refuses (PublishError) would make
the count run ahead: such a refusal stops the relay.

The end of a stream: 3.10 has no StreamStats (3.11), so a subscription at `last` gives the
last chunk (its first offset and count); a stream that has delivered no chunk by the time a
request sent after the subscription is answered is empty (`Reading.bounds`): a start does
not wait on empty streams.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cdc.errors import BrokerUnreachable, DeliveryError
from cdc.events.sink_fields import partition_stream
from cdc.ports import Delivery, DeliveryCallback, DeliveryFailure, Report
from connectors.loop_thread import LoopThread
from connectors.rabbitmq import amqp_message
from connectors.rabbitmq.stream_reader import (
    REQUEST_TIMEOUT_S,
    Reading,
    StreamSettings,
    cannot,
    connect,
    connect_leader,
    rstream_module,
    stream_count,
    stream_of,
)

T = TypeVar("T")
log = logging.getLogger("cdc.rabbitmq")

# A Publish frame around one message: frame size (4), key (2), version (2), publisher id (1),
# message count (4), publishing id (8), message size (4): the stream protocol's Publish
# command (rabbitmq-server deps/rabbitmq_stream/docs/PROTOCOL.adoc).
_FRAME_OVERHEAD = 25
_RECONNECT_EVERY_S = 1.0
_TICK_S = 0.2
_BATCH_BYTES = 1_048_576 - 4096  # one Publish frame's messages (the frame holds 1 MiB)
# Publish frames sent and not yet confirmed before the next waits: a node short of CPU confirms
# late, and 4 left the publisher waiting for it (docs/sinks.md)
_FRAMES_IN_FLIGHT = 16
# Messages the relay's thread gathers before it hands them to the loop's thread (poll hands over
# what is gathered sooner): a wake-up of the loop (a write to its self-pipe) a message cost the
# relay's thread more than the message's encoding, and a loop woken per message sent frames of
# one or two messages (measured with bench/catchup.py --profile, docs/benchmarks.md)
_HANDOFF_EVERY = 256
# PublishError's response code for a publisher id the connection has not declared, or whose
# declaration the node dropped when the stream's leader changed (PROTOCOL.adoc, "Response
# codes": 0x12, publisher does not exist)
_PUBLISHER_DOES_NOT_EXIST = 18
# The Publish frame (PROTOCOL.adoc, "Publish", version 1), written here rather than by
# rstream's encoder (a dataclass a message, then its fields one by one): size (of what
# follows it), key 2, version 1, publisher id, message count; then per message its
# publishing id and its bytes with their length.
_PUBLISH_HEAD = struct.Struct(">IHHBi")
_PUBLISH_ENTRY = struct.Struct(">QI")
# The PublishConfirm frame, after its size (PROTOCOL.adoc, "PublishConfirm"): key 3, version 1,
# publisher id, then the array of publishing ids (its count, then 8 bytes an id).
_CONFIRM_HEAD = struct.Struct(">HHBI")
_CONFIRM_KEY_V1 = (3, 1)


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 of a key (org.apache.kafka.common.utils.Utils.murmur2, seed
    0x9747b28c), as the signed 32-bit int Java returns."""
    m, r = 0x5BD1E995, 24
    length = len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest, tail = length % 4, length - length % 4
    if rest == 3:
        h ^= key[tail + 2] << 16
    if rest >= 2:
        h ^= key[tail + 1] << 8
    if rest >= 1:
        h ^= key[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: bytes, count: int) -> int:
    """Kafka's default partition of a keyed record: Utils.toPositive(murmur2(key)) % count."""
    return (murmur2(key) & 0x7FFFFFFF) % count


def encode_message(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], timestamp_ms: int | None
) -> bytes:
    """One record as the AMQP 1.0 message the stream stores (docs/sinks.md's mapping)."""
    # A Kafka producer stamps a record without a timestamp with its create time: so does this.
    created = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    return amqp_message.encode_record(key, headers, value, created)


def publish_frame(publisher_id: int, batch: list[_Message]) -> bytes:
    """One Publish frame of `batch`'s messages, each under its publishing id."""
    parts = [b""]
    size = _PUBLISH_HEAD.size - 4
    pack = _PUBLISH_ENTRY.pack
    for m in batch:
        data = m.data
        parts += (pack(m.publishing_id, len(data)), data)
        size += 12 + len(data)
    parts[0] = _PUBLISH_HEAD.pack(size, 2, 1, publisher_id, len(batch))
    return b"".join(parts)


def read_confirms_fast(client: Any) -> None:
    """Make `client`'s connection decode PublishConfirm frames with one struct call a frame.

    rstream decodes every frame with its general decoder (rstream/encoding.py `decode_frame`:
    a call per field, so per publishing id); a confirmation carries up to a Publish frame's
    ids, and that decoding was the loop thread's largest cost after the socket writes
    (bench/catchup.py --profile). Every other frame keeps rstream's decoder. The frame made is
    rstream's own `schema.PublishConfirm`, so its handlers see what they saw before."""
    from rstream import schema
    from rstream.encoding import decode_frame

    conn = client._conn
    read_raw = conn._read_frame_raw
    confirm = schema.PublishConfirm
    head_size = _CONFIRM_HEAD.size

    async def read_frame() -> Any:
        data = await read_raw()
        if len(data) >= head_size:
            key, version, publisher_id, count = _CONFIRM_HEAD.unpack_from(data)
            if (key, version) == _CONFIRM_KEY_V1 and len(data) == head_size + 8 * count:
                return confirm(publisher_id, list(struct.unpack_from(f">{count}Q", data, head_size)))
        return decode_frame(data)

    conn.read_frame = read_frame


class _Message:
    """A message from `publish` to its callback. It is also the message a report of
    `publish_reported` gets (cdc.ports.ReportingPublisher): `partition()` and `offset()`, as
    confluent-kafka's Message has them."""

    __slots__ = (
        "_offset", "_partition", "data", "deadline", "failure", "key", "on_delivery", "publishing_id", "reported", "topic",
    )  # fmt: skip

    def __init__(
        self,
        topic: str,
        key: bytes | None,
        data: bytes,
        on_delivery: Callable[..., None],
        deadline: float,
        reported: bool,
    ):
        self.topic, self.key, self.data, self.on_delivery, self.deadline = topic, key, data, on_delivery, deadline
        self.reported = reported  # on_delivery is a Report (error, message), else a DeliveryCallback
        self._partition = -1
        self._offset = -1
        self.failure: DeliveryFailure | None = None
        self.publishing_id = 0

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int | None:
        return self._offset if self._offset >= 0 else None

    def deliver(self) -> None:
        """Its callback, called once (from poll)."""
        if self.reported:
            self.on_delivery(self.failure, self)
        else:
            self.on_delivery(Delivery(self.topic, self._partition, self._offset, self.failure))


@dataclass
class _Stream:
    """One stream this run publishes to, as one publisher of the connection."""

    name: str
    topic: str
    partition: int
    publisher_id: int
    highest: int  # the broker's highest id under the producer name when the run declared it
    end: int  # the stream's end then
    next_id: int
    client: Any = None  # the connection to the stream's leader (one a leader node) it is declared on
    unconfirmed: dict[int, _Message] = field(default_factory=dict)

    def offset(self, publishing_id: int) -> int:
        return self.end + publishing_id - self.highest - 1


class RabbitStreamPublisher:
    """cdc.ports.Publisher over stream-protocol connections, one to each stream leader's node
    (module docstring)."""

    def __init__(
        self,
        settings: StreamSettings,
        producer_name: str,
        publish_timeout_s: float = 60.0,
        max_in_flight: int = 20_000,
        create_streams: Callable[[str], bool] = lambda stream: False,
    ):
        rstream_module()
        self._settings = settings
        self._name = producer_name
        self._timeout = publish_timeout_s
        self._max_in_flight = max_in_flight
        self._create = create_streams  # topics whose missing stream is created on first use
        self._loop = LoopThread("rabbitmq-publisher")
        self._reading = Reading(settings, self._loop)
        # loop thread only
        self._clients: dict[tuple[str, int] | None, Any] = {}  # one a leader node (None: any node)
        self._up = False  # connected: every stream's publisher declared on its leader's connection
        self._streams: dict[str, _Stream] = {}
        self._counts: dict[str, int] = {}
        self._queue: collections.deque[_Message] = collections.deque()
        self._pumping = False
        self._pump_task: asyncio.Future[None] | None = None
        self._frames_out: collections.deque[tuple[_Stream, int]] = collections.deque()  # (stream, last id) sent
        self._confirmed = asyncio.Event()
        self._next_publisher = 0
        self._down_since: float | None = None
        self._last_attempt = 0.0
        self._broken: str | None = None  # a refusal that stops the relay
        # A stream's publisher the node dropped on a live connection (`_on_metadata_update`,
        # `_on_error`'s code 18): the connection is made again, which declares every publisher
        # again and sends the unconfirmed again, as after a broken connection.
        self._stale: str | None = None
        # shared with the relay's thread
        self._lock = threading.Condition()
        # relay's thread -> loop: batches of messages (a deque: thread-safe appends and pops)
        self._handoff: collections.deque[list[_Message]] = collections.deque()
        self._wake = False
        self._done: list[_Message] = []  # confirmed or failed, their callbacks not yet called
        self._pending = 0
        self._batch: list[_Message] = []  # the relay's thread only: published, not yet handed over
        self._last_error = ""  # why the last connection attempt failed, for a timed-out message
        self._ticker = asyncio.run_coroutine_threadsafe(self._tick(), self._loop.loop)
        try:
            self._loop.call(self._reconnect(), REQUEST_TIMEOUT_S)
        except Exception as exc:
            error = cannot(settings, "connect", exc)
            if not isinstance(error, BrokerUnreachable):  # a refusal: nothing to wait for
                self._loop.stop()
                raise error from exc
            # A node down at the start is waited out as one lost under a running relay: the
            # tick connects again while messages wait, and fails each after publish_timeout_s.
            log.warning("%s: connecting again while messages wait", error)
            self._last_error = str(error)
            self._down_since = time.monotonic()

    max_message_bytes = 1_048_576 - _FRAME_OVERHEAD - 4096  # the frame, less room for the headers

    # -- the relay's thread -------------------------------------------------------------

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        self._put(topic, key, value, headers, on_delivery, timestamp_ms, False)

    def publish_reported(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        report: Report,
        timestamp_ms: int | None = None,
    ) -> None:
        """cdc.ports.ReportingPublisher: `report(error, message)` from poll, `error` None or a
        DeliveryFailure, `message` this publisher's own (`partition()`, `offset()`). The
        hand-over then sends the reader process's events from their tuples, without an event
        object or a Delivery each (cdc/delivery/handover.py, the tuple way), as with Kafka."""
        self._put(topic, key, value, headers, report, timestamp_ms, True)

    def delivery(self, topic: str, error: DeliveryFailure | None, message: _Message) -> Delivery:
        """A report of `publish_reported`, as the port's Delivery."""
        if error is None:
            return Delivery(topic, message.partition(), message._offset)
        return Delivery(topic, message.partition() if message is not None else -1, -1, error)

    def _put(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        callback: Callable[..., None],
        timestamp_ms: int | None,
        reported: bool,
    ) -> None:
        data = encode_message(key, value, headers, timestamp_ms)
        self._pending += 1  # the relay's thread only (publish, poll, purge), as `_pending` is
        message = _Message(topic, key, data, callback, time.monotonic() + self._timeout, reported)
        if len(data) + _FRAME_OVERHEAD > 1_048_576:
            message.failure = DeliveryFailure(
                "MESSAGE_TOO_LARGE", f"the message is {len(data)} bytes; a stream frame holds 1048576", too_large=True
            )
            self._report(message)
            return
        while self._pending > self._max_in_flight:
            self.poll(0.05)  # wait for confirmations, never drop
        batch = self._batch
        batch.append(message)
        if len(batch) >= _HANDOFF_EVERY:
            self._hand_over()

    def _hand_over(self) -> None:
        """The relay's batch to the loop: one append and at most one wake-up of the loop a
        batch. The relay calls poll after each transaction (cdc/relay.py), which hands over
        what is left, so a message waits at most until its transaction is read whole, or
        `_HANDOFF_EVERY` messages of a longer one."""
        batch, self._batch = self._batch, []
        self._handoff.append(batch)
        if not self._wake:  # one wake-up of the loop per burst of batches
            self._wake = True
            self._loop.soon(self._take_handoff)

    def poll(self, timeout: float) -> None:
        if self._batch:
            self._hand_over()
        with self._lock:
            if not self._done and timeout > 0:
                self._lock.wait(timeout)
            done, self._done = self._done, []
            self._pending -= len(done)
        for message in done:
            message.deliver()

    def pending(self) -> int:
        return self._pending

    def flush(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            self.poll(max(0.0, min(0.1, deadline - time.monotonic())))
            left = self.pending()
            if left == 0 or time.monotonic() >= deadline:
                return left

    def purge(self) -> None:
        """Nothing more reaches the broker: the queue is dropped and the connection closed
        without waiting; the callbacks of what is dropped are not served."""
        self._batch = []
        fut = asyncio.run_coroutine_threadsafe(self._purge(), self._loop.loop)
        try:
            fut.result(10)
        except Exception:
            pass
        with self._lock:
            self._done, self._pending = [], 0

    def close(self) -> None:
        self.flush(5.0)
        self._ticker.cancel()
        try:
            self._loop.call(self._close(), 10)
        except Exception:
            pass
        self._reading.close()
        self._loop.stop()

    def _report(self, message: _Message) -> None:
        with self._lock:
            self._done.append(message)
            self._lock.notify_all()

    def _report_all(self, reports: list[_Message]) -> None:
        """`_report` of a confirmation's messages at once: one lock and one wake-up a frame."""
        with self._lock:
            self._done += reports
            self._lock.notify_all()

    # -- the loop's thread --------------------------------------------------------------

    def _take_handoff(self) -> None:
        self._wake = False  # first: a message handed over from now on wakes the loop again
        handoff, queue = self._handoff, self._queue
        while handoff:
            queue.extend(handoff.popleft())
        self._start_pump()

    def _start_pump(self) -> None:
        if not self._pumping:
            self._pumping = True
            self._pump_task = asyncio.ensure_future(self._pump())

    def _fail(self, message: _Message, failure: DeliveryFailure) -> None:
        message.failure = failure
        self._report(message)

    async def _pump(self) -> None:
        """Send what is queued, in order: consecutive messages to one stream in one frame."""
        try:
            while self._queue:
                if self._broken is not None or not self._connected():
                    await asyncio.sleep(_TICK_S)  # the tick reconnects or fails what waits
                    continue
                if self._frames_out_full():
                    # Frames wait for the node's confirmations, so the queue fills the next
                    # frame: a slow node gets fewer, fuller frames (its cost is per chunk).
                    self._confirmed.clear()
                    try:
                        await asyncio.wait_for(self._confirmed.wait(), _TICK_S)
                    except TimeoutError:
                        pass
                    continue
                batch: list[_Message] = []
                target: _Stream | None = None
                size = 0
                while self._queue and len(batch) < 1000:
                    message = self._queue[0]
                    stream = self._known_stream(message) or await self._stream_for(message)
                    if stream is None:
                        continue  # failed (no such stream) and left the queue
                    if target is not None and (stream is not target or size + len(message.data) > _BATCH_BYTES):
                        break
                    self._queue.popleft()
                    message._partition = stream.partition
                    message.publishing_id = stream.next_id
                    stream.next_id += 1
                    stream.unconfirmed[message.publishing_id] = message
                    batch.append(message)
                    size += len(message.data) + 12
                    target = stream
                if target is not None and self._connected():
                    await self._send(target.client, target, batch)
                    self._frames_out.append((target, batch[-1].publishing_id))
                # else: kept unconfirmed, sent again by the reconnection
        except Exception as exc:  # the connection broke mid-way (the tick takes over), or a new
            # stream's leader is being elected: asked again after a tick, not in a tight loop
            log.debug("publishing paused: %s", exc)
            await asyncio.sleep(_TICK_S)
        finally:
            self._pumping = False
            if self._queue and self._broken is None and self._connected():
                self._start_pump()

    def _frames_out_full(self) -> bool:
        frames = self._frames_out
        while frames and frames[0][1] not in frames[0][0].unconfirmed:  # confirmed (or failed)
            frames.popleft()
        return len(frames) >= _FRAMES_IN_FLIGHT

    async def _send(self, client: Any, stream: _Stream, batch: list[_Message]) -> None:
        frame = publish_frame(stream.publisher_id, batch)
        if not client.is_connection_alive():
            return  # kept unconfirmed: the reconnection sends it again
        try:
            # rstream's Connection writes (and drains) raw bytes; send_publish_frame would
            # encode its own Publish dataclass instead
            await client._conn._write_frame_raw(frame)
        except OSError as exc:
            # what this connection carried may be cut anywhere: a new one declares the
            # publishers and sends every unconfirmed message again (module docstring)
            self._mark_stale(f"writing to {self._settings.where()} failed: {exc}")

    def _known_stream(self, message: _Message) -> _Stream | None:
        """`_stream_for`'s answer when the topic's streams are counted and the stream is
        declared (all but a stream's first message), without a coroutine a message."""
        topic = message.topic
        count = self._counts.get(topic)
        if count is None:
            return None
        if count == 1:
            return self._streams.get(topic)
        partition = murmur2_partition(message.key, count) if message.key is not None else 0
        return self._streams.get(partition_stream(topic, partition))

    async def _stream_for(self, message: _Message) -> _Stream | None:
        """The stream `message` goes to, declared as a publisher of this connection; None
        (the message failed and left the queue) when the topic has no stream."""
        from rstream.exceptions import StreamDoesNotExist

        topic = message.topic
        count = self._counts.get(topic)
        if count is None:
            count = await stream_count(self._reading, topic)
            if count is None and self._create(topic):
                try:
                    await self._reading_client_create(topic)
                except Exception as exc:
                    log.warning("cannot create stream %s: %s", topic, exc)
                count = await stream_count(self._reading, topic)
            if count is None:
                self._queue.popleft()
                why = f"stream {topic!r} does not exist (nor {partition_stream(topic, 0)!r})"
                self._fail(message, DeliveryFailure("STREAM_DOES_NOT_EXIST", why, topic_missing=True))
                return None
            self._counts[topic] = count
        partition = murmur2_partition(message.key, count) if message.key is not None and count > 1 else 0
        name = stream_of(topic, partition, count)
        stream = self._streams.get(name)
        if stream is not None:
            return stream
        try:
            stream = await self._declare(name, topic, partition)
        except StreamDoesNotExist:
            self._counts.pop(topic, None)
            self._queue.popleft()
            self._fail(
                message, DeliveryFailure("STREAM_DOES_NOT_EXIST", f"stream {name!r} does not exist", topic_missing=True)
            )
            return None
        return stream

    async def _reading_client_create(self, topic: str) -> None:
        from rstream.exceptions import StreamAlreadyExists

        try:
            await (await self._reading.connection_to(None, "cdc-relay-reader")).create_stream(topic)
        except StreamAlreadyExists:
            pass

    async def _declare(self, name: str, topic: str, partition: int) -> _Stream:
        """A new publisher of `name` under the producer name: its ids continue from the
        broker's highest, and its offsets from the stream's end."""
        publisher_id = self._next_publisher
        if publisher_id > 255:
            raise DeliveryError("the relay publishes to more than 256 streams: one connection holds 256 publishers")
        client = await self._leader_connection(name)  # LeaderNotAvailable during an election: asked again
        await client.declare_publisher(stream=name, reference=self._name, publisher_id=publisher_id)
        self._next_publisher += 1  # only once declared: a failed attempt does not use up an id
        self._handle(client, publisher_id)
        highest = int(await client.query_publisher_sequence(stream=name, reference=self._name))
        _first, end = await self._reading.bounds(name)
        stream = _Stream(name, topic, partition, publisher_id, highest, end, highest + 1, client)
        self._streams[name] = stream
        return stream

    def _handle(self, client: Any, publisher_id: int) -> None:
        from rstream import schema

        client.add_handler(schema.PublishConfirm, self._on_confirm, name=str(publisher_id))
        client.add_handler(schema.PublishError, self._on_error, name=str(publisher_id))
        client.add_handler(schema.MetadataUpdate, self._on_metadata_update, name=str(publisher_id))

    def _by_publisher(self, publisher_id: int) -> _Stream | None:
        for stream in self._streams.values():
            if stream.publisher_id == publisher_id:
                return stream
        return None

    def _on_confirm(self, frame: Any) -> None:
        stream = self._by_publisher(frame.publisher_id)
        if stream is None:
            return
        pop = stream.unconfirmed.pop
        base = stream.end - stream.highest - 1  # stream.offset(id) = base + id
        reports = []
        for publishing_id in frame.publishing_ids:
            message = pop(publishing_id, None)
            if message is not None:
                message._offset = base + publishing_id
                reports.append(message)
        self._report_all(reports)
        self._confirmed.set()

    def _on_error(self, frame: Any) -> None:
        stream = self._by_publisher(frame.publisher_id)
        if stream is None:
            return
        for error in frame.errors:
            message = stream.unconfirmed.pop(error.publishing_id, None)
            if message is None:
                continue
            code = int(error.response_code)
            if code == _PUBLISHER_DOES_NOT_EXIST:
                # the node dropped this publisher (its stream's member restarted): the
                # message stays unconfirmed and is sent again after the publisher is declared
                stream.unconfirmed[error.publishing_id] = message
                self._mark_stale(f"the node no longer knows the publisher of stream {stream.name}")
                continue
            # response code 2: stream does not exist (PROTOCOL.adoc, "Response codes")
            missing = code == 2
            failure = DeliveryFailure(
                f"PUBLISH_ERROR_{code}",
                f"the node refused the message for stream {stream.name} (response code {code})",
                topic_missing=missing,
                fatal=not missing,
            )
            # The offsets of this run's later messages in the stream would run ahead
            # (module docstring): the relay stops at this failure.
            self._broken = self._broken or failure.message
            self._fail(message, failure)

    def _on_metadata_update(self, frame: Any) -> None:
        name = frame.metadata_info.stream
        if name in self._streams:
            self._mark_stale(f"stream {name} changed its leader or went away (a MetadataUpdate)")

    def _mark_stale(self, why: str) -> None:
        if self._stale is None:
            log.warning("%s: connecting again to declare its publishers again", why)
            self._stale = why

    def _connected(self) -> bool:
        return self._up and self._stale is None and all(c.is_connection_alive() for c in self._clients.values())

    async def _leader_connection(self, stream: str) -> Any:
        """The connection to `stream`'s leader (Metadata, asked of any configured node), one
        a node: publishing there writes to the leader's log without a hop between nodes. A
        publisher on another node works too in 3.10 (that node forwards to the leader,
        measured), but it loses its publisher when the leader changes, as this one does."""
        address = await self._reading.leader_address(stream)
        client = self._clients.get(address)
        if client is None or not client.is_connection_alive():
            client = await self._reading_connection(address)
            read_confirms_fast(client)
            client.add_stream("cdc-relay")  # rstream reports a closed connection only for clients with streams
            self._clients[address] = client
        return client

    async def _reading_connection(self, address: tuple[str, int] | None) -> Any:
        """A publishing connection of its own to `address` (the reader's are for reading);
        any configured node when the advertised address cannot be used (connect_leader)."""
        unreachable = self._reading._unreachable
        if address is not None and address not in unreachable:
            client = await connect_leader(self._settings, address, "cdc-relay", unreachable)
            if client is not None:
                return client
        return await connect(self._settings, "cdc-relay")

    async def _reconnect(self) -> None:
        """New connections to the streams' leaders, asked again (a leader that died is
        replaced within seconds; until then LeaderNotAvailable, and the tick asks again):
        every stream's publisher declared again, every unconfirmed message sent again with
        its own id, in order (module docstring). The producer name's de-duplication is the
        stream's, kept on every replica: the new leader confirms without storing what the
        old one had stored."""
        old, self._clients = list(self._clients.values()), {}
        self._up = False
        self._stale = None  # a MetadataUpdate on the new connections marks it again
        self._reading.forget_unreachable()
        for client in old:
            try:
                await asyncio.wait_for(client.close(), 2)
            except Exception:
                pass
        if not self._streams:  # nothing declared yet: a node answers (the start's check)
            client = await connect(self._settings, "cdc-relay")
            read_confirms_fast(client)
            client.add_stream("cdc-relay")
            self._clients[None] = client
        self._frames_out.clear()  # what is sent again below is not waited for
        for stream in sorted(self._streams.values(), key=lambda s: s.publisher_id):
            client = await self._leader_connection(stream.name)
            await client.declare_publisher(stream=stream.name, reference=self._name, publisher_id=stream.publisher_id)
            self._handle(client, stream.publisher_id)
            stream.client = client
        for stream in self._streams.values():
            again = [stream.unconfirmed[i] for i in sorted(stream.unconfirmed)]
            for start in range(0, len(again), 500):
                await stream.client._conn._write_frame_raw(
                    publish_frame(stream.publisher_id, again[start : start + 500])
                )
        self._up = True  # only now: new messages go after the ones sent again
        if self._down_since is not None:
            log.info("RabbitMQ is reachable again after %.1f s", time.monotonic() - self._down_since)
        self._down_since = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                await self._tick_once()
            except Exception as exc:
                log.debug("tick: %s", exc)

    async def _tick_once(self) -> None:
        now = time.monotonic()
        waiting = bool(self._queue) or any(s.unconfirmed for s in self._streams.values())
        down = (not self._connected() and bool(self._clients)) or self._down_since is not None
        if down and waiting:  # idle, the connection is made again when a message comes
            if self._down_since is None:
                self._down_since = now
                if self._stale is None:  # else said by _mark_stale
                    log.warning(
                        "lost a connection to a stream leader (%s); asking where the leaders are and connecting again",
                        self._settings.where(),
                    )
            if now - self._last_attempt >= _RECONNECT_EVERY_S:
                self._last_attempt = now
                try:
                    await asyncio.wait_for(self._reconnect(), 10)
                except Exception as exc:
                    self._up = False
                    self._down_since = self._down_since or now
                    self._last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    log.debug("reconnect failed: %s", exc)
            if self._connected() and self._queue:
                self._start_pump()
        # messages past their deadline fail: the relay stops (exit 1) and its checkpoint
        # stays before them
        expired: list[_Message] = []
        for stream in self._streams.values():
            late = [i for i, m in stream.unconfirmed.items() if m.deadline < now]
            expired += [stream.unconfirmed.pop(i) for i in late]
        if self._queue and self._queue[0].deadline < now:
            expired += [m for m in self._queue if m.deadline < now]
            self._queue = collections.deque(m for m in self._queue if m.deadline >= now)
        if expired:
            why = self._broken or (
                f"not confirmed by {self._settings.where()} within {self._timeout:g} s "
                f"(sink.rabbitmq_stream.publish_timeout_s)"
                + (f"; last: {self._last_error}" if self._down_since else "")
            )
            # Every later message fails with it, sent or not, and nothing more is sent: a
            # younger one stored first would put it after them when the next relay sends it
            # again (out of order per key). A deadline is the hand-over's time plus the timeout:
            # the hand-over's order.
            self._broken = why
            for stream in self._streams.values():
                expired += stream.unconfirmed.values()
                stream.unconfirmed.clear()
            expired += self._queue
            self._queue.clear()
            expired.sort(key=lambda m: m.deadline)
            for message in expired:
                self._fail(message, DeliveryFailure("TIMED_OUT", why))

    async def _purge(self) -> None:
        self._handoff.clear()
        self._queue.clear()
        for stream in self._streams.values():
            stream.unconfirmed.clear()
        await self._close()

    async def _close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        self._up = False
        for client in clients:
            try:
                await asyncio.wait_for(client.close(), 5)
            except Exception:
                pass


class RabbitStreamAdmin:
    """Creates a topic's streams (cdc.ports.TopicAdmin, `topics.missing = "create"`): one
    stream named as the topic, or `topics.partitions` streams `<topic>-0` ..; `[topics.configs]`
    are the streams' arguments (`max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`)."""

    def __init__(self, settings: StreamSettings, partitions: int = -1, configs: dict[str, Any] | None = None):
        rstream_module()
        self._settings = settings
        self._partitions = partitions
        self._configs = {str(k): v for k, v in (configs or {}).items()}

    def create_topic(self, topic: str) -> str | None:
        from rstream.exceptions import StreamAlreadyExists

        streams = [topic] if self._partitions <= 1 else [partition_stream(topic, n) for n in range(self._partitions)]

        async def create() -> None:
            client = await connect(self._settings, "cdc-relay-admin")
            try:
                for stream in streams:
                    try:
                        await client.create_stream(stream, self._configs or None)
                    except StreamAlreadyExists:
                        pass
            finally:
                await client.close()

        try:
            asyncio.run(asyncio.wait_for(create(), REQUEST_TIMEOUT_S))
        except Exception as exc:
            return (
                f"the node refused to create stream(s) {', '.join(streams)}: {type(exc).__name__}: {exc} (grant the "
                "relay's user the configure permission on the vhost, check [topics.configs], or create the stream)"
            )
        return None


def check_rabbitmq(cfg: Any) -> list[Any]:
    """`cdc check` for this sink: the node answers the stream protocol with these credentials,
    and which of the dead-letter and the tables' fixed topics have their stream(s)."""
    from connectors.mysql.preflight import CheckResult

    settings = StreamSettings.from_config(cfg.sink.rabbitmq_stream)
    topics = [cfg.kafka.dead_letter_topic] + [t.topic for t in cfg.tables if "{" not in t.topic]
    loop = LoopThread("rabbitmq-check")
    reading = Reading(settings, loop)
    members: dict[str, Any] = {}
    try:
        counts = {t: reading.call(f"look up the streams of {t}", stream_count(reading, t)) for t in topics}
        for topic, count in counts.items():
            for partition in range(count or 0):
                name = stream_of(topic, partition, count or 1)
                members[name] = _members_or_why(reading, name)
    except DeliveryError as exc:
        return [CheckResult("rabbitmq", False, str(exc))]
    finally:
        reading.close()
        loop.stop()
    results = [CheckResult("rabbitmq", True, f"{settings.where()} answers as {settings.user}")]
    for topic, count in counts.items():
        if count:
            results.append(CheckResult("rabbitmq_topic", True, f"{topic}: {count} stream(s)"))
        else:
            results.append(
                CheckResult("rabbitmq_topic", True, f"{topic}: no stream yet (topics.missing decides)", warn=True)
            )
    results += [_replica_line(settings, name, answer) for name, answer in members.items()]
    return results


def _members_or_why(reading: Reading, stream: str) -> Any:
    """The stream's (leader, replicas) from the Metadata answer, or why there is none."""
    from connectors.rabbitmq.stream_reader import stream_members

    async def ask() -> Any:
        return await stream_members(await reading.connection_to(None, "cdc-relay-check"), stream)

    try:
        return reading.call(f"ask the members of stream {stream}", ask())
    except BrokerUnreachable as exc:  # StreamNotAvailable: no member of it runs
        return str(exc)


def _replica_line(settings: StreamSettings, stream: str, answer: Any) -> Any:
    """`rabbitmq_replicas`: the stream's leader and replicas; a warning naming the stream and
    each configured node (host:port and `hosts`) it has no running member on. RabbitMQ
    3.10's Metadata answer leaves out a member whose node is down (measured), so a node the
    answer does not name is one the stream runs without: down, or never a member (a stream
    declared with a smaller x-initial-cluster-size); the configuration names the nodes."""
    from connectors.mysql.preflight import CheckResult

    if isinstance(answer, str):
        return CheckResult("rabbitmq_replicas", True, f"stream {stream!r} has no member running: {answer}", warn=True)
    leader, replicas = answer

    def at(address: tuple[str, int]) -> str:
        return f"{address[0]}:{address[1]}"

    if leader is None:
        return CheckResult("rabbitmq_replicas", True, f"stream {stream!r} has no leader (an election runs)", warn=True)
    running = {leader, *replicas}
    missing = [at(a) for a in settings.addresses() if a not in running] if settings.hosts else []
    said = f"stream {stream!r}: leader {at(leader)}, replicas {', '.join(at(r) for r in replicas) or 'none'}"
    if missing:
        return CheckResult(
            "rabbitmq_replicas",
            True,
            f"{said}; no running member on node {', '.join(missing)} (the node is down, or the stream has no "
            "replica there): the stream runs with fewer copies until the node is back",
            warn=True,
        )
    return CheckResult("rabbitmq_replicas", True, said)
