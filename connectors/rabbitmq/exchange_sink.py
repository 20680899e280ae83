"""The RabbitMQ exchange sink (`[sink] kind = "rabbitmq_exchange"`, docs/sinks.md): every
event published over AMQP 0-9-1 to a topic exchange, the event's topic as routing key, and
proven by the **audit stream**, a stream queue bound to the same exchange for every routing
key the relay uses: it receives every message the exchange routes and can be read from any
offset without consuming anyone's queue.

The client is aiormq (asyncio; chosen by measurement, bench/amqp_clients.py and
docs/benchmarks.md). As in the streams sink, one event loop runs in a daemon thread; the
relay's thread hands messages over and takes the confirmations back in `poll` / `flush`,
where the callbacks run (the Publisher port's contract).

Per message (AMQP 0-9-1, "basic.publish" and the content header's properties):
`delivery_mode` 2 (persistent), `message_id` the event's identity (`message_id`), the
identity headers, the format's headers and the key (`cdc.key`) as AMQP headers (long strings),
`timestamp` the record's timestamp in seconds, `mandatory` set. The channel is in confirm
mode (RabbitMQ's `confirm.select` extension): a message counts as delivered only at its
basic.ack. A message no queue took comes back as basic.return before its ack: it is reported
`unroutable` and the relay dead-letters it (cdc/delivery/handover.py), never dropped.

Offsets. A confirm carries no offset. The offset reported is the audit stream's end when
the connection was made, plus the number of messages this connection published before it,
less those returned so far: exact while the relay is the only writer whose messages reach
the audit stream, and never above the true offset otherwise (another writer only pushes the
relay's messages further). A checkpoint's offsets are where a recovery scan starts, so a low
one costs a longer scan, never a missed message.

The fence. A relay killed (or a connection lost) leaves on the node what it had sent and the
node had not yet read: a node frozen or loaded reads a dead connection's socket, and routes what
it finds there, after the dead process is gone. A recovery scan that read the audit stream
before that would send those messages again. So the relay's publishing connection declares an
exclusive queue named after its source (`fence`, "cdc-relay.<source.name>.fence"), which
RabbitMQ lets one connection hold at a time and deletes when that connection ends. A node ends a
connection only after its channels have handled what they were given (`rabbit_reader`
`terminate_channels` shuts each down and waits for it); what it had not read from the socket
by then is dropped, not routed. So once the fence is free, nothing of the old connection is
still to come. The relay takes it before its first look at the audit stream or its first message, whichever
comes first (`hold_fence`: after the lease, which a standby waits for with its publisher made),
and until it holds it, it neither scans nor publishes; it waits up to `publish_timeout_s`, saying so
once and then naming the fence if it must stop.

A lost connection inside a run (the node restarted or was cut off): the unconfirmed messages
may or may not have been routed. AMQP 0-9-1 has no de-duplication, so sending them all again
would put copies in every queue, the audit stream too. Instead, once connected again, the
audit stream is read from the oldest unconfirmed message's offset to its end: a message whose
routing key and `message_id` it holds was routed (reported delivered at that offset), the
others are sent again, in order; the new connection takes the fence first (the old one may be
alive on a node that was cut off). What this means for the other queues bound to the exchange when the *node*
crashed is in docs/sinks.md ("What your queues get").

`topics.missing`: "dead_letter" requires the exchange and the audit stream (the publisher
refuses to start without them); "create" and "auto" declare both (`declare`), "auto" binding
the audit stream with `#`, "create" with each routing key before the key's first message
(`RabbitExchangePublisher(bind_keys=True)`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from cdc.errors import CdcError, ConfigError, DeliveryError
from cdc.events.identity import identity_key_from_headers
from cdc.events.sink_fields import message_properties
from cdc.ports import Delivery, DeliveryCallback, DeliveryFailure
from connectors.broker_wait import never
from connectors.loop_thread import LoopThread
from connectors.rabbitmq import amqp_publish_frames
from connectors.rabbitmq.stream_reader import RabbitStreamReader, StreamSettings, tls_fix

log = logging.getLogger("cdc.rabbitmq")
_SECTION = "sink.rabbitmq_exchange"  # what an error's fix names

_REQUEST_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 10.0  # one node's connection and AMQP handshake; then the next node is tried
_RECONNECT_EVERY_S = 1.0
_EXPIRY_EVERY_S = 0.5
_FENCE_EVERY_S = 0.2  # how often a start asks for the fence a previous connection holds
_SETTLE_S = 0.5  # on a cluster, a reconnect's scan waits for the audit stream's end to hold this long
# RabbitMQ 3.10's max_message_size is 128 MiB; a stream keeps a message in one chunk, and
# the relay's envelopes are far smaller: a bound that keeps the audit stream's chunks sane
MAX_MESSAGE_BYTES = 16 * 1_048_576
# AMQP 0-9-1 shortstr: a routing key is at most 255 bytes (the spec's "shortstr" domain)
MAX_ROUTING_KEY_BYTES = 255
_ANNOTATION_ROUTING_KEY = b"x-routing-key"  # RabbitMQ stores an AMQP 0-9-1 message's routing key here


def _aiormq() -> Any:
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)  # every failure reaches us as an exception
    try:
        import aiormq
    except ImportError:
        raise ConfigError(
            "sink.kind = \"rabbitmq_exchange\" needs the aiormq package: pip install 'cdc-outbox-relay[rabbitmq]'"
        ) from None
    return aiormq


def message_id(headers: dict[str, str]) -> str | None:
    """The event's identity as the AMQP message_id: `source|gtid|row` or
    `source|file|pos|row` (cdc.events.identity.identity_key_from_headers); None without one."""
    key = identity_key_from_headers(headers)
    return None if key is None else "|".join(str(part) for part in key)


def fence_queue(source_name: str) -> str:
    """The exclusive queue a relay's publishing connection holds (module docstring, "The fence")."""
    return f"cdc-relay.{source_name}.fence"


@dataclass(frozen=True)
class ExchangeSettings:
    """Where and how to connect (from `[sink.rabbitmq_exchange]`, cdc.config.RabbitExchangeConfig)."""

    host: str
    port: int
    stream_port: int
    vhost: str
    user: str
    password: str = field(repr=False)
    exchange: str = "cdc.outbox"
    audit_stream: str = "cdc.outbox.audit"
    management_port: int = 0
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    empty_wait_s: float = 2.0
    hosts: tuple[tuple[str, int], ...] = ()  # the cluster's other nodes' AMQP 0-9-1 ports (`hosts`)
    stream_hosts: tuple[tuple[str, int], ...] = ()  # ... and their stream ports (`stream_addresses()`)
    key_password: str = field(default="", repr=False)  # an encrypted key_file's

    @classmethod
    def from_config(cls, rabbit: Any) -> ExchangeSettings:
        def addresses(entries: Any) -> tuple[tuple[str, int], ...]:
            return tuple((h, int(p)) for h, _, p in (str(e).rpartition(":") for e in entries))

        return cls(
            rabbit.host, int(rabbit.port), int(rabbit.stream_port), rabbit.vhost, rabbit.user,
            rabbit.password.reveal(), rabbit.exchange, rabbit.audit_stream, int(rabbit.management_port),
            bool(rabbit.tls or rabbit.ca_file or rabbit.cert_file), rabbit.ca_file, rabbit.cert_file,
            rabbit.key_file, float(rabbit.empty_wait_s), addresses(getattr(rabbit, "hosts", ())),
            addresses(rabbit.stream_addresses() if hasattr(rabbit, "stream_addresses") else ()),
            key_password=rabbit.key_password.reveal(),
        )  # fmt: skip

    def addresses(self) -> list[tuple[str, int]]:
        """The nodes an AMQP 0-9-1 connection is made to, `host:port` first, then `hosts`: the
        first that answers (any node routes to every queue of the cluster)."""
        out = [(self.host, self.port)]
        return out + [a for a in self.hosts if a not in out]

    def stream_settings(self) -> StreamSettings:
        """The audit stream's reader: any configured node answers where its leader is, and
        it is read on the leader (connectors/rabbitmq/stream_reader.py `Reading`)."""
        return StreamSettings(
            self.host, self.stream_port, self.vhost, self.user, self.password, self.tls, self.ca_file,
            self.cert_file, self.key_file, self.empty_wait_s, self.stream_hosts, section=_SECTION,
            key_password=self.key_password,
        )  # fmt: skip

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.stream_settings().ssl_context()

    def url(self, address: tuple[str, int] | None = None) -> str:
        host, port = address or (self.host, self.port)
        quote = urllib.parse.quote
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{host}:{port}/{quote(self.vhost, safe='')}?heartbeat=20"

    def where(self) -> str:
        others = f" (or {', '.join(f'{h}:{p}' for h, p in self.hosts)})" if self.hosts else ""
        return f"RabbitMQ exchange {self.exchange!r} on {self.host}:{self.port}{others} vhost {self.vhost}"


def _cannot(settings: ExchangeSettings, what: str, exc: BaseException) -> DeliveryError:
    if isinstance(exc, ConfigError):  # the settings' own fix (a client key that cannot be used)
        return DeliveryError(str(exc))
    fix = tls_fix(exc, _SECTION) or f"(check {_SECTION} host, port, hosts, user and password)"
    others = f" (or {', '.join(f'{h}:{p}' for h, p in settings.hosts)})" if settings.hosts else ""
    return DeliveryError(
        f"cannot {what} on {settings.host}:{settings.port}{others} vhost {settings.vhost} as {settings.user}: "
        f"{type(exc).__name__}: {exc or 'no answer'} {fix}"
    )


def _node_down(exc: BaseException) -> bool:
    """A node that is down, restarting or frozen (refused, reset, closed, no answer in time),
    not a refusal of the relay (a certificate, the login, the vhost), which every node of the
    cluster would say alike. aiormq wraps the socket's OSError in AMQPConnectionError."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(exc, ssl.SSLError) or isinstance(cause, ssl.SSLError):
        return False
    if type(exc).__name__ in ("ProbableAuthenticationError", "AuthenticationError"):
        return False
    return isinstance(exc, (OSError, TimeoutError)) or isinstance(cause, (OSError, TimeoutError))


async def _connect(settings: ExchangeSettings) -> tuple[Any, Any]:
    """A connection and a confirm-mode channel to the first configured node that answers
    (`ExchangeSettings.addresses`); the first node's failure is raised when none does."""
    aiormq = _aiormq()
    first: BaseException | None = None
    for address in settings.addresses():
        try:
            connect = (
                aiormq.connect(settings.url(address), context=settings.ssl_context())
                if settings.tls
                else aiormq.connect(settings.url(address))
            )
            connection = await asyncio.wait_for(connect, _CONNECT_TIMEOUT_S)  # a frozen node: the next one
        except Exception as exc:
            if not _node_down(exc):
                raise
            first = first or exc
            continue
        if address != (settings.host, settings.port):  # the publisher's own lines name the node it uses
            log.debug("connected to %s:%d (%s:%d does not answer)", *address, settings.host, settings.port)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=False)
        return connection, channel
    assert first is not None
    raise first


async def _exists(settings: ExchangeSettings, what: str, name: str) -> bool:
    """Does the exchange / queue `name` exist? A passive declare (AMQP 0-9-1: a missing one
    closes the channel with 404 NOT_FOUND), on a connection of its own."""
    aiormq = _aiormq()
    connection, channel = await _connect(settings)
    try:
        if what == "exchange":
            await channel.exchange_declare(name, passive=True)
        else:
            await channel.queue_declare(name, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        await connection.close()


async def _declare(settings: ExchangeSettings, bind_all: bool) -> None:
    """The exchange (topic, durable) and the audit stream (a durable stream queue), and when
    `bind_all` the audit stream bound with `#` (every routing key)."""
    connection, channel = await _connect(settings)
    try:
        await channel.exchange_declare(settings.exchange, exchange_type="topic", durable=True)
        await channel.queue_declare(settings.audit_stream, durable=True, arguments={"x-queue-type": "stream"})
        if bind_all:
            await channel.queue_bind(settings.audit_stream, settings.exchange, routing_key="#")
    finally:
        await connection.close()


async def _bind(settings: ExchangeSettings, routing_key: str) -> None:
    connection, channel = await _connect(settings)
    try:
        await channel.queue_bind(settings.audit_stream, settings.exchange, routing_key=routing_key)
    finally:
        await connection.close()


# -- the audit stream: what the relay's recovery and `cdc repair` read ------------------------


class AuditLog:
    """What the exchange routed, read from the audit stream (cdc.ports.DeliveredLog): every
    topic is one partition, the audit stream's messages with that routing key, at the audit
    stream's offsets. A range read once is kept, so a recovery that scans each topic from
    the checkpoint reads the stream once (`_cached`).

    `floor`: the highest offset a checkpoint records for any topic. The relay publishes on one
    channel in binlog order and a channel's messages reach a queue in that order, so every
    message of a transaction after the checkpoint sits after every message of one before it,
    whatever its topic: a topic's scan starts there at the earliest, not at its own older
    offset (a quiet topic's last message may be far back in the shared stream)."""

    def __init__(
        self,
        settings: ExchangeSettings,
        floor: int = 0,
        before_read: Callable[[], None] | None = None,
        wait_s: float = 0.0,
        should_stop: Callable[[], bool] = never,
    ):
        """`before_read`: called before every look at the stream (the relay's: the publisher's
        `hold_fence`, so that nothing is read before the fence is held). `wait_s`: how long a
        look waits for a node that is down or restarting (the relay's: `publish_timeout_s`,
        as publishing does; connectors/broker_wait.py)."""
        self._settings = settings
        self._floor = floor
        self._before_read = before_read
        self._streams = RabbitStreamReader(settings.stream_settings(), wait_s=wait_s, should_stop=should_stop)
        self._cached: tuple[int, int, list[tuple[int, str, dict[str, str]]]] | None = None
        self._topics: set[str] = set()

    def partition_count(self, topic: str) -> int | None:
        self._topics.add(topic)
        return 1 if self._streams.partition_count(self._settings.audit_stream) == 1 else None

    def watermarks(self, topic: str, partition: int = 0) -> tuple[int, int]:
        if self._before_read is not None:
            self._before_read()
        return self._streams.watermarks(self._settings.audit_stream, 0)

    def routed(self, start: int, end: int) -> list[tuple[int, str, dict[str, str]]]:
        """(offset, routing key, headers as text) of each message in [start, end)."""
        if self._before_read is not None:
            self._before_read()
        cached = self._cached
        if cached is not None and cached[0] <= start and end <= cached[1]:
            return [m for m in cached[2] if start <= m[0] < end]
        out = []
        for offset, message in self._streams.messages(self._settings.audit_stream, 0, start, end):
            annotations = message.message_annotations or {}
            key = annotations.get(_ANNOTATION_ROUTING_KEY, b"")
            key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            headers = _text(message.application_properties)
            if message.properties is not None and message.properties.message_id is not None:
                headers.setdefault("message_id", _text({b"m": message.properties.message_id})["m"])
            out.append((offset, key, headers))
        self._cached = (start, end, out)
        return out

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        for offset, key, headers in self.routed(min(max(start, self._floor), end), end):
            if key == topic:
                yield offset, headers

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def close(self) -> None:
        self._streams.close()


def _text(properties: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (properties or {}).items():
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        if value is not None:
            out[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return out


# -- the publisher ----------------------------------------------------------------------------


@dataclass
class _Message:
    topic: str
    body: bytes
    # the content header's properties: their bytes (amqp_publish_frames.properties), or a
    # pamqp Basic.Properties where those decline
    properties: bytes | Any
    message_id: str | None
    on_delivery: DeliveryCallback
    deadline: float
    wire_id: str = ""  # the message-id sent: message_id, or a random one (aiormq's, for basic.return)
    slot: int = -1  # the audit offset this connection's count gives it when sent (module docstring)
    returned_before: int = 0  # the connection's returned messages when it was sent


class RabbitExchangePublisher:
    """cdc.ports.Publisher over one AMQP 0-9-1 channel in confirm mode (module docstring)."""

    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(
        self,
        settings: ExchangeSettings,
        publish_timeout_s: float = 60.0,
        max_in_flight: int = 5_000,
        bind_keys: bool = False,
        fence: str | None = None,
        should_stop: Callable[[], bool] = never,
    ):
        """`fence`: the exclusive queue the publishing connection holds (module docstring;
        the relay's, never `cdc repair`'s); `should_stop`: a stop asked for while the start
        waits for it."""
        _aiormq()
        self._settings = settings
        self._fence = fence
        self._should_stop = should_stop
        # topics.missing = "create": the audit stream is bound with each routing key before
        # the key's first message (queue.bind is idempotent; the binding is durable)
        self._bind_keys = bind_keys
        self._bound: set[str] = set()
        self._methods: dict[str, bytes] = {}  # a routing key's basic.publish (amqp_publish_frames.method_payload)
        self._timeout = publish_timeout_s
        self._max_in_flight = max_in_flight
        self._loop = LoopThread("rabbitmq-exchange")
        self._audit = AuditLog(settings)
        # loop thread, or the relay's thread while the loop sends nothing (`_recover`)
        self._connection: Any = None
        self._channel: Any = None
        self._base = 0  # the audit stream's end when this connection was made
        self._sent = 0  # messages this connection published
        self._returned = 0  # ... and got back as unroutable
        self._unconfirmed: dict[int, _Message] = {}  # by id(message), in publishing order
        self._down_since: float | None = None
        self._last_attempt = 0.0
        self._last_expiry = 0.0
        self._broken: str | None = None  # a refusal that stops the relay
        self._timed_out: str | None = None  # a message timed out: this and every later one fail (`_expire`)
        self.skipped_after_reconnect = 0  # unconfirmed messages the audit stream held: not sent again
        self._fence_waited = False  # a reconnect found the fence held: said once
        self._fence_on: Any = None  # the connection that holds the fence
        self._released = False
        # shared with the relay's thread
        self._lock = threading.Condition()
        self._handoff: collections.deque[_Message] = collections.deque()
        self._wake = False
        self._done: list[tuple[DeliveryCallback, Delivery]] = []
        self._pending = 0
        self._lost = threading.Event()  # the connection broke: `poll` reconnects
        try:
            self._loop.call(self._open(), _REQUEST_TIMEOUT_S + _CONNECT_TIMEOUT_S * len(settings.addresses()))
        except Exception as exc:
            self._loop.stop()
            self._audit.close()
            raise _cannot(settings, "connect", exc) from exc

    # -- the relay's thread ---------------------------------------------------------------

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        if self._fence_on is None and self._fence is not None:
            self.hold_fence()  # before the first message, whether or not a scan came first
        with self._lock:
            self._pending += 1
        if self._timed_out is not None:  # after a message that timed out: none is sent (`_expire`)
            self._report(on_delivery, Delivery(topic, 0, -1, DeliveryFailure("TIMED_OUT", self._timed_out)))
            return
        body = value or b""
        if len(body) > MAX_MESSAGE_BYTES:
            failure = DeliveryFailure(
                "MESSAGE_TOO_LARGE", f"the message is {len(body)} bytes; the limit is {MAX_MESSAGE_BYTES}",
                too_large=True,
            )  # fmt: skip
            self._report(on_delivery, Delivery(topic, -1, -1, failure))
            return
        if len(topic.encode()) > MAX_ROUTING_KEY_BYTES:
            failure = DeliveryFailure(
                "ROUTING_KEY_TOO_LONG", f"routing key {topic[:40]!r}... is over 255 bytes (AMQP shortstr)",
                topic_missing=True,
            )  # fmt: skip
            self._report(on_delivery, Delivery(topic, -1, -1, failure))
            return
        text = message_properties(key, headers, value)
        mid = message_id(text)
        # a returned message (basic.return) is matched to its delivery tag by its message-id
        # (aiormq's Channel._on_return_frame): one without an identity gets a random one, as
        # aiormq's basic_publish gives it. Two messages of one identity in flight at once would
        # make a return ambiguous; the relay's events each have their own (cdc.events.identity)
        wire_id = mid or uuid.uuid4().hex
        stamp = int((timestamp_ms if timestamp_ms is not None else time.time() * 1000) // 1000)
        properties: bytes | Any = amqp_publish_frames.properties(text, wire_id, stamp)
        if properties is None:
            from pamqp import commands as spec

            properties = spec.Basic.Properties(
                delivery_mode=2, message_id=wire_id, headers=dict(text), timestamp=_datetime(stamp)
            )
        if self._bind_keys and topic not in self._bound:
            refused = self._bind(topic)
            if refused is not None:
                self._report(on_delivery, Delivery(topic, -1, -1, DeliveryFailure("BIND_FAILED", refused, fatal=True)))
                return
        while self.pending() > self._max_in_flight:
            self.poll(0.05)  # wait for confirmations, never drop
        self._handoff.append(
            _Message(topic, body, properties, mid, on_delivery, time.monotonic() + self._timeout, wire_id)
        )
        if not self._wake:  # one wake-up of the loop per burst
            self._wake = True
            self._loop.soon(self._take_handoff)

    def poll(self, timeout: float) -> None:
        if self._lost.is_set():
            self._recover()
        self._expire()
        with self._lock:
            if not self._done and timeout > 0:
                self._lock.wait(timeout)
            done, self._done = self._done, []
            self._pending -= len(done)
        for callback, delivery in done:
            callback(delivery)

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def flush(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            self.poll(max(0.0, min(0.1, deadline - time.monotonic())))
            left = self.pending()
            if left == 0 or time.monotonic() >= deadline:
                return left

    def purge(self) -> None:
        """Nothing more reaches the broker: the hand-over is dropped and the connection
        closed without waiting; the callbacks of what is dropped are not served."""
        self._handoff.clear()
        try:
            self._loop.call(self._close(), 10)
        except Exception:
            pass
        with self._lock:
            self._unconfirmed.clear()
            self._done, self._pending = [], 0

    def hold_fence(self) -> None:
        """Take the fence on the publishing connection, waiting up to `publish_timeout_s`
        while a previous connection holds it (module docstring): at the first look at the
        audit stream (the relay's AuditLog calls it) or the first message, whichever comes
        first, so after the lease, which a standby waits for with its publisher made. A
        connection made again inside the run takes it itself (`_recover`); a DeliveryError
        when it cannot be had."""
        if not self._fence:
            return
        deadline = time.monotonic() + self._timeout
        while True:
            connection = self._connection
            if connection is not None and connection is self._fence_on:
                return
            if connection is not None and not self._lost.is_set() and not getattr(connection, "is_closed", False):
                try:
                    self._loop.call(self._wait_fence(connection), self._timeout + _REQUEST_TIMEOUT_S)
                except CdcError:
                    raise  # refused (ConfigError: exit 2), or held past publish_timeout_s
                except Exception as exc:  # the connection broke meanwhile: connected again below
                    log.debug("fence: %s", exc)
                else:
                    self._fence_on = connection
                    return
            # the connection is gone (the node restarted while this relay was a standby): a new
            # one, which takes the fence before it is used (`_recover`)
            self._lost.set()
            self._recover()
            if self._connection is not None and self._connection is self._fence_on:
                return
            if time.monotonic() >= deadline:
                raise DeliveryError(
                    f"cannot take the fence {self._fence!r}: no connection to {self._settings.where()} held it within "
                    f"{self._timeout:g} s (sink.rabbitmq_exchange.publish_timeout_s)"
                )
            time.sleep(_FENCE_EVERY_S)

    def close(self) -> None:
        self.flush(5.0)
        self.release()

    def release(self) -> None:
        """Close the connection at once, and with it the fence, which a successor in the same
        process waits for (cdc_cli/app.py RelayHandle.close, after the run)."""
        if self._released:
            return
        self._released = True
        try:
            self._loop.call(self._close(), 10)
        except Exception:
            pass
        self._audit.close()
        self._loop.stop()

    def _report(self, callback: DeliveryCallback, delivery: Delivery) -> None:
        with self._lock:
            self._done.append((callback, delivery))
            self._lock.notify_all()

    def _bind(self, topic: str) -> str | None:
        """Bind the audit stream with `topic` before its first message is handed over (so it
        is routed after the binding exists), on a connection of its own; why not, or None."""
        try:
            self._loop.call(_bind(self._settings, topic), _REQUEST_TIMEOUT_S)
        except Exception as exc:
            return (
                f"cannot bind audit stream {self._settings.audit_stream!r} to {self._settings.exchange!r} for routing "
                f"key {topic!r}: {type(exc).__name__}: {exc} (grant the relay's user the configure permission on the "
                'queue and read on the exchange, or bind it yourself and set topics.missing = "dead_letter")'
            )
        self._bound.add(topic)
        return None

    def _expire(self) -> None:
        """A message past its deadline fails, and with it every message after it, sent or
        not, and every one handed over later: none may reach the audit stream before it (the
        next relay's recovery would send it after them, out of order per key). Nothing more is
        sent; the relay stops (exit 1), its checkpoint before them."""
        now = time.monotonic()
        if now - self._last_expiry < _EXPIRY_EVERY_S and self._timed_out is None:
            return  # a look at every unconfirmed message: not on every poll
        self._last_expiry = now
        if self._timed_out is None:
            with self._lock:
                late = any(m.deadline < now for m in self._unconfirmed.values())
            if not late and not (self._handoff and self._handoff[0].deadline < now and self._channel is None):
                return
            self._timed_out = self._broken or (
                f"not confirmed within {self._timeout:g} s (sink.rabbitmq_exchange.publish_timeout_s)"
            )
        with self._lock:  # in publishing order (a dict keeps it)
            expired = list(self._unconfirmed.values())
            self._unconfirmed.clear()
        while self._handoff:
            expired.append(self._handoff.popleft())
        for message in expired:
            failure = DeliveryFailure("TIMED_OUT", self._timed_out)
            self._report(message.on_delivery, Delivery(message.topic, 0, -1, failure))

    def _recover(self) -> None:
        """Connect again; what the audit stream holds of the unconfirmed is reported delivered
        at its offset, the rest is sent again in order (module docstring). The loop sends
        nothing meanwhile: `_channel` is None."""
        now = time.monotonic()
        if now - self._last_attempt < _RECONNECT_EVERY_S:
            return
        self._last_attempt = now
        if self._down_since is None:
            self._down_since = now
            log.warning("lost the connection to %s; connecting again", self._settings.where())
        try:
            self._loop.call(self._close(), 5)
        except Exception:
            pass
        with self._lock:  # taken whole: a late confirm of the old channel finds nothing to report
            waiting = list(self._unconfirmed.values())
            self._unconfirmed.clear()
        connection = None
        connect_s = _CONNECT_TIMEOUT_S * len(self._settings.addresses()) + 5
        try:
            # the next node that answers, when the one connected to is down (`hosts`): any
            # node routes to every queue of the cluster, and the audit stream is read on its
            # leader wherever that is, so the scan below sees what the old node routed
            connection, channel = self._loop.call(_connect(self._settings), connect_s)
            if not self._loop.call(_exists(self._settings, "exchange", self._settings.exchange), connect_s):
                self._broken = f"exchange {self._settings.exchange!r} no longer exists"
            if self._fence and not self._loop.call(self._take_fence(connection), connect_s):
                # the lost connection still lives on the node (cut off, not restarted): what it
                # sent may yet be routed; asked again at the next attempt
                raise _FenceHeld(self._fence)
            fence_on = connection
            end = self._settled_end() if waiting else self._audit.watermarks("", 0)[1]
            start = min((m.slot for m in waiting), default=end)
            # a message is the one sent when its routing key and its identity both match: the
            # identity alone would take another key's message of the same identity for it
            routed = self._audit.routed(start, end) if waiting else []
            held = {(key, h.get("message_id")): offset for offset, key, h in routed}
        except Exception as exc:
            if isinstance(exc, _FenceHeld):
                (log.debug if self._fence_waited else log.info)("%s", exc)  # said once per outage
                self._fence_waited = True
            else:
                log.debug("reconnect failed: %s", exc)
            if connection is not None:
                self._loop.call(_close_quietly(connection), 10)
            with self._lock:
                self._unconfirmed = {id(m): m for m in waiting} | self._unconfirmed
            return
        if self._broken is not None:
            failure = DeliveryFailure("EXCHANGE_GONE", self._broken, fatal=True)
            for message in waiting:
                self._report(message.on_delivery, Delivery(message.topic, 0, -1, failure))
            self._loop.call(_close_quietly(connection), 10)
            return
        again: list[_Message] = []
        for message in waiting:
            offset = held.get((message.topic, message.message_id)) if message.message_id is not None else None
            if offset is not None:
                self.skipped_after_reconnect += 1
                self._report(message.on_delivery, Delivery(message.topic, 0, offset))
            else:
                again.append(message)
        if self._timed_out is not None:  # after a timeout nothing is sent again: it fails with it (`_expire`)
            for message in again:
                failure = DeliveryFailure("TIMED_OUT", self._timed_out)
                self._report(message.on_delivery, Delivery(message.topic, 0, -1, failure))
            again = []
        log.info(
            "RabbitMQ is reachable again after %.1f s, publishing through %s: %d unconfirmed message(s) were routed "
            "(the audit stream holds them), %d are sent again",
            time.monotonic() - self._down_since, _peer(connection), len(waiting) - len(again), len(again),
        )  # fmt: skip
        self._down_since = None
        self._fence_waited = False
        self._fence_on = fence_on if self._fence else None
        self._lost.clear()
        self._loop.call(self._resume(connection, channel, end, again), _REQUEST_TIMEOUT_S)

    def _settled_end(self) -> int:
        """The audit stream's end once it stops moving. On a cluster a reader sees a write
        only once the stream's replicas have it; after a node's death, what the old leader
        wrote is committed by the new one a moment later, and a scan before that would take
        a routed message for a lost one and send it again (a copy: 4 in one run of
        tests/integration/test_rabbitmq_exchange_cluster.py). The publisher sends nothing
        meanwhile, so an end that holds for `_SETTLE_S` has taken in what was in flight."""
        end = self._audit.watermarks("", 0)[1]
        if not (self._settings.hosts or self._settings.stream_hosts):
            return end  # one node: a write is readable once written
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            time.sleep(_SETTLE_S)
            now_end = self._audit.watermarks("", 0)[1]
            if now_end == end:
                break
            end = now_end
        return end

    # -- the loop's thread ----------------------------------------------------------------

    async def _open(self) -> None:
        connection, channel = await _connect(self._settings)
        settings = self._settings
        if not await _exists(settings, "exchange", settings.exchange):
            await connection.close()
            raise DeliveryError(
                f"exchange {settings.exchange!r} does not exist on vhost {settings.vhost}: declare it (a topic "
                'exchange) or set topics.missing = "create"'
            )
        if not await _exists(settings, "queue", settings.audit_stream):
            await connection.close()
            raise DeliveryError(
                f"audit stream {settings.audit_stream!r} does not exist on vhost {settings.vhost}: declare it "
                '(x-queue-type "stream") bound to the exchange for every routing key, or set topics.missing = "create"'
            )
        end = await self._audit_end()
        log.info("publishing to %s through %s", settings.where(), _peer(connection))
        await self._resume(connection, channel, end, [])

    async def _wait_fence(self, connection: Any) -> None:
        """Hold the fence before the recovery scan: wait (up to `publish_timeout_s`) while a
        previous connection holds it (module docstring)."""
        assert self._fence is not None
        deadline = time.monotonic() + self._timeout
        t0, said = time.monotonic(), False
        while not await self._take_fence(connection):
            if time.monotonic() >= deadline or self._should_stop():
                why = "a stop was asked for" if self._should_stop() else f"{self._timeout:g} s passed"
                raise DeliveryError(
                    f"another connection to {self._settings.host}:{self._settings.port} still holds the relay's fence "
                    f"queue {self._fence!r} ({why}): a previous relay of this source whose connection the node has not "
                    "closed yet, or a second relay; stop it, or close its connection (rabbitmqctl close_connection), "
                    "or raise sink.rabbitmq_exchange.publish_timeout_s"
                )
            if not said:
                log.info("%s", _FenceHeld(self._fence))
                said = True
            await asyncio.sleep(_FENCE_EVERY_S)
        if said:
            log.info("holding the fence %r after %.1f s", self._fence, time.monotonic() - t0)

    async def _take_fence(self, connection: Any) -> bool:
        assert self._fence is not None
        return await take_fence(self._settings, connection, self._fence)

    async def _audit_end(self) -> int:
        # the stream reader runs on its own loop: called from a worker thread, not this loop
        return (await asyncio.get_running_loop().run_in_executor(None, self._audit.watermarks, "", 0))[1]

    async def _resume(self, connection: Any, channel: Any, end: int, again: list[_Message]) -> None:
        self._connection, self._channel = connection, channel
        self._base, self._sent, self._returned = end, 0, 0
        self._send(again)
        self._take_handoff()

    def _take_handoff(self) -> None:
        self._wake = False  # first: a message handed over from now on wakes the loop again
        if self._channel is None:
            return  # sent after `_recover`
        handoff, batch = self._handoff, []
        while handoff and self._timed_out is None:
            batch.append(handoff.popleft())
        self._send(batch)

    def _send(self, messages: list[_Message]) -> None:
        """`messages`, in order, written to the channel in one piece by one task (`_publish`)."""
        if not messages:
            return
        for message in messages:
            message.slot = self._base + self._sent - self._returned
            message.returned_before = self._returned
            self._sent += 1
        with self._lock:
            for message in messages:
                self._unconfirmed[id(message)] = message
        channel = self._channel
        task = asyncio.ensure_future(self._publish(channel, messages))  # tasks take the channel's lock in order
        task.add_done_callback(partial(self._published, channel))

    async def _publish(self, channel: Any, messages: list[_Message]) -> None:
        """What aiormq's `Channel.basic_publish` does for a message, for all of `messages` under
        one hold of the channel's lock: each its next delivery tag and a confirmation future
        in the channel's tables (`confirmations`, and `message_id_delivery_tag` for a
        basic.return), the frames made here (connectors/rabbitmq/amqp_publish_frames.py), and
        all of them handed to the connection's writer as one piece. The channel answers the
        futures as it answers its own (basic.ack / nack / return; rejected when it closes)."""
        from aiormq.abc import ChannelFrame

        exchange, methods = self._settings.exchange, self._methods
        async with channel.lock:
            if channel.is_closed:  # nothing written: the messages stay unconfirmed (`_published`)
                raise ConnectionError("the channel is closed")
            number, max_content = channel.number, channel.max_content_size
            confirmations, by_id = channel.confirmations, channel.message_id_delivery_tag
            parts: list[bytes] = []
            for message in messages:
                channel.delivery_tag += 1
                tag = channel.delivery_tag
                confirmation = channel.create_future()  # rejected at once if the channel is closed
                confirmations[tag] = confirmation
                by_id[message.wire_id] = tag
                confirmation.add_done_callback(partial(self._confirmed, message, channel, tag))
                props = message.properties
                if isinstance(props, bytes):
                    method = methods.get(message.topic)
                    if method is None:
                        method = methods[message.topic] = amqp_publish_frames.method_payload(exchange, message.topic)
                    parts.append(amqp_publish_frames.publish_frames(number, method, props, message.body, max_content))
                else:
                    parts.append(
                        amqp_publish_frames.pamqp_frames(
                            number, exchange, message.topic, props, message.body, max_content
                        )
                    )
            await channel.write_queue.put(ChannelFrame(payload=b"".join(parts), should_close=False))

    def _published(self, channel: Any, task: asyncio.Future[Any]) -> None:
        """A batch's task ended: raised (cancelled, the channel gone while it waited for the
        lock or the writer), the connection is lost, its messages stay unconfirmed (`_recover`
        decides)."""
        if (task.cancelled() or task.exception() is not None) and channel is self._channel:
            self._channel = None
            self._lost.set()

    def _confirmed(self, message: _Message, channel: Any, tag: int, confirmation: asyncio.Future[Any]) -> None:
        by_id = channel.message_id_delivery_tag
        if by_id.get(message.wire_id) == tag:  # as basic_publish's forget_message_id
            del by_id[message.wire_id]
        self._on_confirm(confirmation, message, channel)

    def _on_confirm(self, confirmation: asyncio.Future[Any], message: _Message, channel: Any) -> None:
        from pamqp import commands as spec

        exc = confirmation.exception() if not confirmation.cancelled() else asyncio.CancelledError()
        if exc is not None:
            if channel is self._channel:
                self._channel = None
                self._lost.set()  # stays unconfirmed: `_recover` decides
            return
        with self._lock:
            if self._unconfirmed.pop(id(message), None) is None:
                return  # already decided (purged, expired or recovered)
        result = confirmation.result()
        if isinstance(result, spec.Basic.Ack):
            # messages sent before it and returned since were not routed: one offset less each
            offset = message.slot - (self._returned - message.returned_before)
            self._report(message.on_delivery, Delivery(message.topic, 0, offset))
        elif isinstance(result, spec.Basic.Nack):
            self._broken = self._broken or "the node refused a message (basic.nack: an internal error)"
            failure = DeliveryFailure("NACK", self._broken, fatal=True)
            self._report(message.on_delivery, Delivery(message.topic, 0, -1, failure))
        else:  # a DeliveredMessage: basic.return, no queue took it
            self._returned += 1
            frame = getattr(result, "delivery", None)
            why = f"exchange {self._settings.exchange!r} routed {message.topic!r} to no queue"
            if frame is not None:
                why += f" ({getattr(frame, 'reply_code', '')} {getattr(frame, 'reply_text', '')})"
            failure = DeliveryFailure("UNROUTABLE", why, unroutable=True)
            self._report(message.on_delivery, Delivery(message.topic, 0, -1, failure))

    async def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                await asyncio.wait_for(connection.close(), 3)
            except Exception:
                pass


async def take_fence(settings: ExchangeSettings, connection: Any, fence: str) -> bool:
    """Declare the fence queue exclusive to `connection`, on a channel of its own (a refusal
    closes the channel): True once declared, False while another connection holds it; a
    refused permission is a ConfigError naming it (the relay stops, exit 2)."""
    aiormq = _aiormq()
    channel = await connection.channel()
    try:
        # classic, whatever the vhost's default: an exclusive queue cannot be a quorum queue
        await channel.queue_declare(fence, exclusive=True, arguments={"x-queue-type": "classic"})
    except aiormq.exceptions.ChannelLockedResource:
        return False
    except aiormq.exceptions.ChannelAccessRefused as exc:
        raise ConfigError(
            f"cannot declare the relay's fence queue {fence!r} on vhost {settings.vhost} as {settings.user}: {exc} "
            "(grant the relay's user the configure permission on it: docs/sinks.md, \"The relay's fence queue\")"
        ) from None
    await channel.close()
    return True


class _FenceHeld(Exception):
    """Another connection holds the relay's fence (module docstring)."""

    def __init__(self, fence: str):
        super().__init__(
            f"waiting for the node to close the previous connection, which holds the fence {fence!r}: the audit "
            "stream is read once nothing it sent can still be routed"
        )


def _peer(connection: Any) -> str:
    """The node an aiormq connection is made to, "host:port" (its URL, without the credentials)."""
    url = getattr(connection, "url", None)
    return f"{getattr(url, 'host', '?')}:{getattr(url, 'port', '?')}"


async def _close_quietly(connection: Any) -> None:
    try:
        await asyncio.wait_for(connection.close(), 3)
    except Exception:
        pass


def _datetime(seconds: int) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def declare(settings: ExchangeSettings, bind_all: bool) -> None:
    """Declare the exchange and the audit stream (topics.missing "create" / "auto"); the
    publisher binds each routing key under "create" (`bind_keys`), `#` is bound here under "auto"."""
    try:
        asyncio.run(asyncio.wait_for(_declare(settings, bind_all), _REQUEST_TIMEOUT_S))
    except Exception as exc:
        raise DeliveryError(
            f"cannot declare exchange {settings.exchange!r} and audit stream {settings.audit_stream!r} on "
            f"{settings.host}:{settings.port} vhost {settings.vhost}: {type(exc).__name__}: {exc} (grant the "
            "relay's user the configure permission, or declare them yourself)"
        ) from exc


# -- cdc check --------------------------------------------------------------------------------


def binding_matches(binding: str, routing_key: str) -> bool:
    """Does a topic exchange's binding key match `routing_key`? Words are split at `.`; `*`
    matches one word, `#` zero or more (AMQP 0-9-1, "topic exchange"). A word with `{` (a
    topic template's placeholder) stands for any one word: only `*` or `#` match it."""
    return _match(binding.split("."), routing_key.split("."))


def _match(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    word = words[0]
    if head == "*" or ("{" not in word and head == word):
        return _match(rest, words[1:])
    return False


def _management_bindings(settings: ExchangeSettings) -> list[str]:
    """The routing keys the audit stream is bound with on the exchange, from the management
    plugin's HTTP API (`GET /api/bindings/{vhost}/e/{exchange}/q/{queue}`): AMQP 0-9-1 has
    no command that lists bindings."""
    import base64
    import json

    quote = urllib.parse.quote
    scheme = "https" if settings.tls else "http"
    url = (
        f"{scheme}://{settings.host}:{settings.management_port}/api/bindings/{quote(settings.vhost, safe='')}"
        f"/e/{quote(settings.exchange, safe='')}/q/{quote(settings.audit_stream, safe='')}"
    )
    request = urllib.request.Request(url)
    token = base64.b64encode(f"{settings.user}:{settings.password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10, context=settings.ssl_context()) as response:  # our own URL
        return [str(b.get("routing_key", "")) for b in json.loads(response.read())]


def check_rabbitmq_exchange(cfg: Any) -> list[Any]:
    """`cdc check` for this sink: the node answers AMQP 0-9-1 with these credentials, the
    exchange and the audit stream exist (or topics.missing creates them), and the audit
    stream's bindings cover every table's routing keys and the dead-letter topic."""
    from connectors.mysql.preflight import CheckResult

    settings = ExchangeSettings.from_config(cfg.sink.rabbitmq_exchange)
    creates = cfg.topics.missing in ("create", "auto")

    fence = fence_queue(cfg.source.name)

    async def look() -> tuple[str, str, bool, bool]:
        connection, _channel = await _connect(settings)
        peer = _peer(connection)  # with `hosts`, the first node that answered
        try:
            held = "free" if await take_fence(settings, connection, fence) else "held"
        except ConfigError as exc:
            held = str(exc)
        await connection.close()  # the fence goes with it
        return (
            peer,
            held,
            await _exists(settings, "exchange", settings.exchange),
            await _exists(settings, "queue", settings.audit_stream),
        )

    try:
        timeout = _REQUEST_TIMEOUT_S + _CONNECT_TIMEOUT_S * len(settings.addresses())
        peer, held, exchange, audit = asyncio.run(asyncio.wait_for(look(), timeout))
    except Exception as exc:
        return [CheckResult("rabbitmq", False, str(_cannot(settings, "connect", exc)))]
    results = [CheckResult("rabbitmq", True, f"{peer} answers AMQP 0-9-1 as {settings.user}")]
    if held == "free":
        results.append(
            CheckResult("rabbitmq_fence", True, f"fence queue {fence!r} can be declared (no relay holds it)")
        )
    elif held == "held":
        results.append(
            CheckResult("rabbitmq_fence", True, f"fence queue {fence!r} is held by a connection (a relay runs)")
        )
    else:
        results.append(CheckResult("rabbitmq_fence", False, held))
    for what, name, there in (
        ("exchange", settings.exchange, exchange),
        ("audit stream", settings.audit_stream, audit),
    ):
        if there:
            results.append(CheckResult("rabbitmq_exchange", True, f"{what} {name!r} exists"))
        elif creates:
            results.append(
                CheckResult(
                    "rabbitmq_exchange", True, f"{what} {name!r} does not exist yet (the relay declares it)", warn=True
                )
            )
        else:
            results.append(
                CheckResult(
                    "rabbitmq_exchange",
                    False,
                    f"{what} {name!r} does not exist on vhost {settings.vhost}: declare it (docs/sinks.md) or set "
                    'topics.missing = "create"',
                )
            )
    if not (exchange and audit):
        return results
    keys = [cfg.kafka.dead_letter_topic] + [t.topic for t in cfg.tables]
    if settings.management_port <= 0:
        results.append(
            CheckResult("rabbitmq_binding", True, "audit stream bindings not checked (management_port = 0)", warn=True)
        )
        return results
    try:
        bindings = _management_bindings(settings)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        results.append(
            CheckResult(
                "rabbitmq_binding",
                True,
                f"audit stream bindings not checked: the management API on port {settings.management_port} did not "
                f"answer ({type(exc).__name__}: {exc}); enable rabbitmq_management or set management_port = 0",
                warn=True,
            )
        )
        return results
    for key in dict.fromkeys(keys):
        if any(binding_matches(b, key) for b in bindings):
            results.append(CheckResult("rabbitmq_binding", True, f"routing key {key!r} reaches the audit stream"))
        elif creates:
            results.append(
                CheckResult(
                    "rabbitmq_binding", True, f"routing key {key!r}: not bound yet (the relay binds it)", warn=True
                )
            )
        else:
            results.append(
                CheckResult(
                    "rabbitmq_binding",
                    False,
                    f"the audit stream {settings.audit_stream!r} is not bound to {settings.exchange!r} for routing key "
                    f"{key!r} (its bindings: {', '.join(bindings) or 'none'}): bind it, e.g. with '#', or its events "
                    "cannot be proven",
                )
            )
    return results
