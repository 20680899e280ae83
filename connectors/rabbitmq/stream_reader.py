"""The RabbitMQ Streams sink's connection settings and its reader of what the streams hold
(cdc.ports.DeliveredLog: the recovery scan's records, a stream's bounds), over rstream's
stream-protocol client (RabbitMQ 3.10's stream plugin); the exchange sink reads its audit
stream with it too. The publisher and the creator of missing streams are stream_sink.py.

The end of a stream: 3.10 has no StreamStats (3.11), so a subscription at `last` gives the
last chunk (its first offset and count); a stream that has delivered no chunk by the time a
request sent after the subscription is answered is empty (`Reading.bounds`): a start does
not wait on empty streams.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cdc.errors import BrokerUnreachable, ConfigError, DeliveryError
from cdc.events.sink_fields import partition_stream
from connectors.broker_wait import never, wait_for_broker
from connectors.loop_thread import LoopThread
from connectors.rabbitmq.rstream_client import load_rstream
from connectors.tls_files import KeyPasswordMissing, client_cert_error, load_client_cert

T = TypeVar("T")
log = logging.getLogger("cdc.rabbitmq")
REQUEST_TIMEOUT_S = 30.0  # a stream-protocol request answered within this, or the node is taken as down


def rstream_module() -> Any:
    return load_rstream(lambda fix: ConfigError(f'sink.kind = "rabbitmq_stream" needs the rstream package: {fix}'))


@dataclass(frozen=True)
class StreamSettings:
    """Where and how to connect (from `[sink.rabbitmq_stream]`, cdc.config.RabbitStreamConfig)."""

    host: str
    port: int
    vhost: str
    user: str
    password: str = field(repr=False)
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    empty_wait_s: float = 2.0
    hosts: tuple[tuple[str, int], ...] = ()  # the cluster's other nodes (`hosts`), after host:port
    key_password: str = field(default="", repr=False)  # an encrypted key_file's
    # the config section a fix names: the exchange sink reads its audit stream with these
    # settings too, and its user sets `sink.rabbitmq_exchange.*`
    section: str = "sink.rabbitmq_stream"

    @classmethod
    def from_config(cls, rabbit: Any) -> StreamSettings:
        hosts = tuple((h, int(p)) for h, _, p in (str(e).rpartition(":") for e in getattr(rabbit, "hosts", ())))
        return cls(
            rabbit.host, int(rabbit.port), rabbit.vhost, rabbit.user, rabbit.password.reveal(),
            bool(rabbit.tls or rabbit.ca_file or rabbit.cert_file), rabbit.ca_file, rabbit.cert_file,
            rabbit.key_file, float(rabbit.empty_wait_s), hosts, key_password=rabbit.key_password.reveal(),
        )  # fmt: skip

    def addresses(self) -> list[tuple[str, int]]:
        """The configured nodes, `host:port` first: where a connection that any node can
        serve (the streams' metadata, a stream's creation) is made, first that answers."""
        out = [(self.host, self.port)]
        return out + [a for a in self.hosts if a not in out]

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            try:
                load_client_cert(context, self.cert_file, self.key_file, self.key_password)
            except (KeyPasswordMissing, OSError, ssl.SSLError) as exc:
                raise ConfigError(client_cert_error(exc, self.section, self.cert_file, self.key_file)) from None
        return context

    def where(self) -> str:
        others = f" (or {', '.join(f'{h}:{p}' for h, p in self.hosts)})" if self.hosts else ""
        return f"RabbitMQ stream {self.host}:{self.port}{others} vhost {self.vhost}"


async def stream_members(client: Any, stream: str) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
    """The stream protocol's Metadata answer for `stream` (PROTOCOL.adoc, "Metadata"): its
    leader's and its replicas' advertised (host, port); the leader is None while none is
    elected (leader reference 0xFFFF). RabbitMQ 3.10 names only the members whose node
    runs (measured, tests/integration/test_rabbitmq_cluster_faults.py): a member on a dead
    node is missing from the answer, not marked. A stream that does not exist, or has no
    member running, raises (StreamDoesNotExist, StreamNotAvailable)."""
    from rstream import schema

    answer = await client.sync_request(
        schema.Metadata(client._corr_id_seq.next(), streams=[stream]), resp_schema=schema.MetadataResponse
    )
    meta = answer.metadata[0]
    brokers = {b.reference: (str(b.host), int(b.port)) for b in answer.brokers}
    leader = brokers.get(meta.leader_ref) if meta.leader_ref != 0xFFFF else None
    return leader, [brokers[r] for r in meta.replicas_refs if r in brokers]


async def connect(settings: StreamSettings, name: str) -> Any:
    """A connection to the first configured node that answers (`StreamSettings.addresses`);
    the first node's failure is raised when none does."""
    first: BaseException | None = None
    for host, port in settings.addresses():
        try:
            return await connect_to(settings, host, port, name)
        except Exception as exc:
            if not _node_down(exc):
                raise  # a refusal (login, TLS) says the same on every node
            first = first or exc
    assert first is not None
    raise first


async def connect_to(settings: StreamSettings, host: str, port: int, name: str) -> Any:
    """A connection to one node (a stream's leader, at the address its Metadata answer gives)."""
    from rstream.client import ClientPool

    pool = ClientPool(host, port, ssl_context=settings.ssl_context(), vhost=settings.vhost,
                      username=settings.user, password=settings.password, frame_max=1_048_576, heartbeat=20,
                      load_balancer_mode=False, max_retries=1)  # fmt: skip
    try:
        client = await pool.new(connection_name=name, addr=pool.addr)
    except BaseException:
        await pool.close()
        raise
    return client


async def connect_leader(
    settings: StreamSettings, address: tuple[str, int], name: str, unreachable: set[tuple[str, int]]
) -> Any:
    """A connection to a stream leader's advertised `address`; None (and `address` added to
    `unreachable`, with a warning) when that address is not one of the configured nodes
    and cannot be reached: the caller goes through a configured node instead. A configured
    node that is down raises, as the caller's own connect would."""
    try:
        return await connect_to(settings, address[0], address[1], name)
    except Exception as exc:
        if address in settings.addresses() and not isinstance(exc, ssl.SSLError):
            raise
        log.warning(
            "cannot connect to the stream leader's advertised address %s:%d (%s: %s); going through %s "
            "instead (set the stream plugin's advertised_host/port, or list the node in %s.hosts)",
            *address, type(exc).__name__, exc, settings.where(), settings.section,
        )  # fmt: skip
        unreachable.add(address)
        return None


def _node_down(exc: BaseException) -> bool:
    """A failure of a node that is down or restarting (connection refused, reset or closed,
    no answer, a stream not available yet: response code 6), not a refusal of the relay."""
    from rstream.connection import ConnectionClosed
    from rstream.exceptions import LeaderNotAvailable, StreamNotAvailable

    if isinstance(exc, ssl.SSLError):  # a certificate or protocol mismatch: a setting to fix
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionClosed, StreamNotAvailable, LeaderNotAvailable))


def cannot(settings: StreamSettings, what: str, exc: BaseException) -> DeliveryError:
    if isinstance(exc, ConfigError):  # the settings' own fix (a client key that cannot be used)
        return DeliveryError(str(exc))
    said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if _node_down(exc):
        return BrokerUnreachable(
            f"cannot {what} on {settings.where()}: {said} (the node is down or restarting; "
            f"check that it runs with the stream plugin and {settings.section} host and port)"
        )
    return DeliveryError(
        f"cannot {what} on {settings.where()} as {settings.user}: {said or 'no answer'} "
        + (
            tls_fix(exc, settings.section)
            or f"(check {settings.section} host, port, user, password and that the node runs with the stream plugin)"
        )
    )


def tls_fix(exc: BaseException, section: str) -> str:
    """The fix for a failed TLS connection ("" for another failure); `section` names the
    settings (`sink.rabbitmq_stream`, `sink.rabbitmq_exchange`). A client library may wrap
    the ssl error (aiormq: AMQPConnectionError from it): the cause is looked at too."""
    cause = exc.__cause__ if not isinstance(exc, ssl.SSLError) and exc.__cause__ is not None else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"(the node's certificate was refused: set {section}.ca_file to its CA and host to a name or "
            "address the certificate holds)"
        )
    if isinstance(cause, ssl.SSLError):
        return f"(the TLS handshake failed: check {section}.cert_file / key_file and that port serves TLS)"
    return ""


class Reading:
    """Subscriptions on one connection of the sink's loop: the bounds and the messages of a
    stream, read from an offset without storing anything on the broker."""

    def __init__(self, settings: StreamSettings, loop: LoopThread):
        self._settings = settings
        self._loop = loop
        self._client: Any = None  # to any configured node: metadata, existence
        self._leaders: dict[tuple[str, int], Any] = {}  # to the nodes that lead the streams read
        self._unreachable: set[tuple[str, int]] = set()  # advertised addresses this client cannot use
        self._subs: dict[int, Any] = {}  # subscription id -> its connection
        self._next_sub = 0

    async def _client_(self) -> Any:
        if self._client is None or not self._client.is_connection_alive():
            self._client = await connect(self._settings, "cdc-relay-reader")
        return self._client

    async def leader_address(self, stream: str) -> tuple[str, int] | None:
        """Where `stream`'s leader is, as its node advertises it; None: the connection to
        any node will do (a node whose advertised address this client cannot reach, e.g. a
        host name only the cluster resolves, or a certificate made for another name: such a
        node still serves a stream it does not lead, through the leader, measured on 3.10).
        Raises LeaderNotAvailable while the stream has no leader."""
        from rstream.exceptions import LeaderNotAvailable

        leader, _replicas = await stream_members(await self._client_(), stream)
        if leader is None:
            raise LeaderNotAvailable(f"stream {stream} has no leader yet")
        return None if leader in self._unreachable else leader

    async def connection_to(self, address: tuple[str, int] | None, name: str) -> Any:
        """A live connection to `address` (None: to any node), made once and kept."""
        if address is None:
            return await self._client_()
        client = self._leaders.get(address)
        if client is not None and client.is_connection_alive():
            return client
        client = await connect_leader(self._settings, address, name, self._unreachable)
        if client is None:
            return await self._client_()
        self._leaders[address] = client
        return client

    def forget_unreachable(self) -> None:
        """Try the advertised addresses again (a leader that was down may be back)."""
        self._unreachable.clear()

    async def _leader_client(self, stream: str) -> Any:
        """The connection a stream is read on: to its leader. A replica may lag the leader
        (osiris replicates chunks after the leader commits them), and the recovery scan
        must see everything the leader confirmed."""
        return await self.connection_to(await self.leader_address(stream), "cdc-relay-reader")

    def call(self, what: str, coro: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        try:
            return self._loop.call(coro, timeout)
        except Exception as exc:
            self._client, self._leaders = None, {}  # a leader may have died: asked again next time
            raise cannot(self._settings, what, exc) from exc

    async def exists(self, stream: str) -> bool:
        return bool(await (await self._client_()).stream_exists(stream))

    async def subscribe(self, stream: str, offset_type: Any, offset: int | None) -> tuple[int, asyncio.Queue[Any]]:
        from rstream import schema

        client = await self._leader_client(stream)
        self._next_sub = (self._next_sub + 1) % 250
        sub_id = self._next_sub
        self._subs[sub_id] = client
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def on_deliver(frame: Any) -> None:
            if frame.subscription_id == sub_id:
                queue.put_nowait(frame)

        client.add_handler(schema.Deliver, on_deliver, name=str(sub_id))
        await client.run_queue_listener_task(sub_id, on_deliver)
        await client.subscribe(stream, sub_id, schema.OffsetSpec.from_params(offset_type, offset), initial_credit=4)
        return sub_id, queue

    async def unsubscribe(self, sub_id: int) -> None:
        from rstream import schema

        client = self._subs.pop(sub_id, None)
        if client is None or not client.is_connection_alive():
            return
        await client.unsubscribe(sub_id)
        await client.stop_queue_listener_task(sub_id)
        client.remove_handler(schema.Deliver, name=str(sub_id))

    async def bounds(self, stream: str) -> tuple[int, int]:
        """(first offset, next offset) of `stream` now; (0, 0) when it is empty.

        3.10's stream protocol has no StreamStats (3.11): a subscription at `first` and one at
        `last` give the first and the last chunk. An empty stream delivers nothing, so
        emptiness is read without a timeout: the node's connection process answers a
        Subscribe, then sends the chunks the new subscription can read, before it handles
        the connection's next frame (rabbit_stream_reader 3.10 `handle_frame_post_auth`:
        `osiris:init_reader`, the response, then `send_chunks`, in one step), and rstream's
        listener queues a Deliver before it resolves a later response. So once a request
        sent after the Subscribe is answered, a stream that holds a chunk has delivered it.
        `empty_wait_s` only bounds the wait for a chunk a stream was seen to hold."""
        from rstream.constants import OffsetType

        frames = []
        for offset_type in (OffsetType.FIRST, OffsetType.LAST):
            sub_id, queue = await self.subscribe(stream, offset_type, None)
            client = self._subs[sub_id]  # the barrier below goes on the subscription's connection
            try:
                # the barrier: any request-response after the Subscribe on this connection
                await client.query_publisher_sequence(stream=stream, reference="cdc-relay-bounds")
                # rstream 1.1's listener queues a Deliver per subscription (`_frames`) for a task
                # that hands it to `queue`; without that attribute, wait as for a slow node
                listened: Any = getattr(client, "_frames", None)
                if queue.empty() and listened is not None and listened[sub_id].empty():
                    return 0, 0
                try:
                    frames.append(await asyncio.wait_for(queue.get(), self._settings.empty_wait_s))
                except TimeoutError:
                    return 0, 0
            finally:
                await self.unsubscribe(sub_id)
        first, last = frames
        return int(first.chunk_first_offset), int(last.chunk_first_offset + last.num_entries)

    async def credit(self, sub_id: int) -> None:
        client = self._subs.get(sub_id)
        if client is None:
            raise ConnectionError(f"subscription {sub_id} has no connection")
        await client.credit(sub_id, 1)

    def close(self) -> None:
        clients = [self._client, *self._leaders.values()]
        self._client, self._leaders = None, {}
        for client in clients:
            if client is not None:
                try:
                    self._loop.call(client.close(), 5)
                except Exception:
                    pass


async def stream_count(reading: Reading, topic: str) -> int | None:
    """1 for the stream named `topic`, n for `<topic>-0` .. `<topic>-(n-1)`, None for none."""
    if await reading.exists(topic):
        return 1
    count = 0
    while await reading.exists(partition_stream(topic, count)):
        count += 1
    return count or None


def stream_of(topic: str, partition: int, count: int) -> str:
    return topic if count == 1 else partition_stream(topic, partition)


class RabbitStreamReader:
    """What the streams hold (cdc.ports.DeliveredLog): a topic's partitions are its streams."""

    def __init__(
        self,
        settings: StreamSettings,
        loop: LoopThread | None = None,
        wait_s: float = 0.0,
        should_stop: Callable[[], bool] = never,
    ):
        """`wait_s`: how long a look at the streams waits for a node that is down or
        restarting (connectors/broker_wait.py; the relay's start: `publish_timeout_s`)."""
        rstream_module()
        self._settings = settings
        self._own_loop = loop is None
        self._loop = loop or LoopThread("rabbitmq-reader")
        self._reading = Reading(settings, self._loop)
        self._counts: dict[str, int] = {}
        self._wait_s = wait_s
        self._should_stop = should_stop

    def _waiting(self, what: str, coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return wait_for_broker(
            lambda: self._reading.call(what, coro_fn()),
            self._settings.where(),
            self._wait_s,
            f"{self._settings.section}.publish_timeout_s",
            self._should_stop,
        )

    def partition_count(self, topic: str) -> int | None:
        count = self._waiting(f"look up the streams of {topic}", lambda: stream_count(self._reading, topic))
        if count is not None:
            self._counts[topic] = count
        return count

    def _stream(self, topic: str, partition: int) -> str:
        count = self._counts.get(topic) or self.partition_count(topic) or 1
        return stream_of(topic, partition, count)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        stream = self._stream(topic, partition)
        return self._waiting(f"read the bounds of stream {stream}", lambda: self._reading.bounds(stream))

    def messages(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, Any]]:
        """(offset, AMQP message) of each message held in [start, end), in offset order."""
        from rstream.amqp import amqp_decoder
        from rstream.constants import OffsetType

        if end <= start:
            return
        stream = self._stream(topic, partition)
        reading = self._reading
        sub_id, queue = reading.call(f"read stream {stream}", reading.subscribe(stream, OffsetType.OFFSET, start))
        try:
            while True:
                frame = reading.call(f"read stream {stream} from offset {start}", queue.get(), REQUEST_TIMEOUT_S)
                reading.call(f"read stream {stream}", reading.credit(sub_id))
                offset = frame.chunk_first_offset - 1
                for data in frame.get_messages():
                    offset += 1
                    if offset < start:
                        continue  # a subscription starts at the chunk that holds `start`
                    if offset >= end:
                        return
                    yield offset, amqp_decoder(data)
                if offset >= end - 1:
                    return
        finally:
            try:
                reading.call(f"stop reading stream {stream}", reading.unsubscribe(sub_id), 10)
            except DeliveryError:
                pass

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        for offset, message in self.messages(topic, partition, start, end):
            yield offset, _text_properties(message.application_properties)

    def topics(self) -> list[str]:
        return sorted(self._counts)

    def close(self) -> None:
        self._reading.close()
        if self._own_loop:
            self._loop.stop()


def _text_properties(properties: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (properties or {}).items():
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        if value is not None:
            out[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return out
