"""PySpark Python data source `cdc_rabbitmq`: the messages of RabbitMQ streams, read with
rstream's stream-protocol client (a subscription from an offset, with credit; nothing is
stored on the broker: no consumer name, no offset tracking).

    spark.read.format("cdc_rabbitmq")
        .option("host", "127.0.0.1").option("port", "5552")
        .option("hosts", "rabbit2:5552,rabbit3:5552")   # a cluster's other nodes, asked when host is down
        .option("user", "...").option("password", "...").option("vhost", "/")
        .option("tls", "true")                     # TLS (also on with ca_file or cert_file)
        .option("ca_file", "ca.pem").option("cert_file", "...").option("key_file", "...")  # key_password: an encrypted key's
        .option("topics", "outbox.event.order,outbox.dlq")
        .option("dlq_topic", "outbox.dlq")
        .option("chunk", "100000")                 # offsets per Spark partition
        .option("plan", json.dumps(plan_rabbitmq(...)))   # optional: a fixed snapshot
        .option("include_raw", "true").option("decode", "true")
        .load()

The columns are `records.fields_for(include_raw, decode)`, exactly the Kafka source's:
each message becomes a `log_record.LogRecord` and goes through `records.RecordColumns`.
What maps to what (docs/sinks.md): a topic is the stream of its name, or, partitioned by
key, the streams `<topic>-0`, `<topic>-1`, ... (RabbitMQ 3.10 has no super streams:
`cdc.events.sink_fields.partition_stream`); the partition is that number (0 for a single stream);
the offset is the stream offset; the timestamp is the AMQP properties' creation-time
(type 1, create time) or else the chunk's broker timestamp (type 2, log-append time); the
application properties are the headers, but `cdc.key` (the key) and `cdc.value.null` (a
null value); the value is the body (its data sections).

The audit stream of the exchange sink (`audit_stream` option, `[sink] kind =
"rabbitmq_exchange"`): one stream holds every topic's messages, as the exchange routed them;
it is planned as one range marked `routed`, and each of its messages is the record of the
topic named by its routing key (the `x-routing-key` message annotation RabbitMQ stores with
an AMQP 0-9-1 message), partition 0, at its audit-stream offset.

Partitions: `(topic, partition, stream, [low, high))` offset ranges between the first and
the next offset of each stream when planned, at most `chunk` offsets per Spark partition
(`records.chunks`). RabbitMQ 3.10's stream protocol has no StreamStats command (3.11),
so the plan subscribes at `first` and at `last`: the first chunk delivered starts at `low`,
the last chunk ends at `high - 1`. An empty stream delivers nothing: a stream that has sent
no chunk by the time a request sent after the Subscribe is answered is planned empty, at
once (`_Session.delivered_nothing` says why that is a barrier; the relay's
connectors/rabbitmq/stream_reader.py reads it the same way, written apart here: the
verifier's readers are its own). `empty_wait` (default 3 s) only bounds the wait for a
first chunk when the barrier cannot be read. Offsets that hold no message (a chunk of
another kind) are simply absent.

On a cluster every stream is read on its leader, bounds and records alike: a replica may
lag it (osiris replicates a chunk after the leader has written it), so a replica could plan
and read less than the relay had confirmed. A connection to a configured node (`host:port`,
then the `hosts` list, first that answers) asks the stream protocol's Metadata for the
stream's leader (PROTOCOL.adoc, "Metadata": the advertised host and port of each member);
the stream is then read on a connection to that address. When the advertised address cannot
be reached (a node advertising a name only its cluster resolves), the stream is read through
the configured node, with a warning, as the relay does (connectors/rabbitmq/stream_reader.py;
written apart here, as above).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.events.sink_fields import partition_stream
from connectors.rabbitmq.rstream_client import load_rstream
from spark_jobs.common import SINK_TLS_OPTIONS, sink_tls_context, tls_hint
from spark_jobs.log_record import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, LogRecord, from_properties
from spark_jobs.log_source import RangeDataSource, RangeReader, topics_option

DEFAULT_EMPTY_WAIT = 3.0
STALL_TIMEOUT = 60.0
LEADER_WAIT = 30.0  # a stream's leader election takes seconds (0.2-4.1 s measured, docs/sinks.md)
_CREDIT = 10  # chunks the broker may send ahead of the reader
# Chunks read before their credit is given back, in one Credit frame: a frame a chunk, each
# sent through a turn of the session's event loop, cost more than decoding the chunk's
# messages where chunks are small (the exchange sink's audit stream: docs/sinks.md). The
# broker is still owed at least _CREDIT - _CREDIT_BATCH + 1 chunks once the reader has
# taken every chunk sent, so it never waits for the reader's credit.
_CREDIT_BATCH = 5
_NO_LEADER = 0xFFFF  # a Metadata answer's leader reference while none is elected

log = logging.getLogger(__name__)


def _client_module() -> Any:
    return load_rstream(lambda fix: RuntimeError(f"cdc_rabbitmq: the rstream package is not installed: {fix}"))


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """The `hosts` option: comma-separated "host:port" (a node's stream port)."""
    out: list[tuple[str, int]] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise RuntimeError(
                f'cdc_rabbitmq: option hosts: {entry!r} is not "host:port" (a node\'s stream port), e.g. "rabbit2:5552"'
            )
        out.append((host, int(port)))
    return out


def settings_from_options(options: Mapping[str, str]) -> dict[str, Any]:
    """rstream connection settings from the data source's options."""
    return {
        "host": options.get("host") or "127.0.0.1",
        "port": int(options.get("port") or 5552),
        "hosts": parse_hosts(str(options.get("hosts") or "")),
        "vhost": options.get("vhost") or "/",
        "username": options.get("user") or "guest",
        "password": options.get("password") or "guest",
        "audit_stream": options.get("audit_stream") or "",
        "tls": str(options.get("tls") or "").lower() == "true",
        **{name: str(options.get(name) or "") for name in SINK_TLS_OPTIONS},
    }


def addresses(settings: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The configured nodes, `host:port` first, then `hosts`."""
    out = [(str(settings["host"]), int(settings["port"]))]
    return out + [(str(h), int(p)) for h, p in settings.get("hosts") or () if (h, p) not in out]


def _node_down(exc: BaseException) -> bool:
    """A node that is down or not reachable (refused, reset, timed out): the next one is
    asked. A refusal by a running node (login, vhost, TLS) would be the same on every node."""
    return isinstance(exc, (ConnectionError, TimeoutError, OSError)) and not isinstance(exc, ssl.SSLError)


def _cannot_connect(settings: Mapping[str, Any], address: tuple[str, int], exc: BaseException) -> RuntimeError:
    return RuntimeError(
        f"cdc_rabbitmq: cannot connect to {address[0]}:{address[1]} as {settings['username']}: "
        f"{type(exc).__name__}: {exc} (check host, port, user and password){tls_hint(exc)}"
    )


class _Session:
    """One stream-protocol connection driven from synchronous code: a private event loop
    that runs only while we wait on it (Spark's reader and planner are synchronous).
    `address`: the node it connects to (default `host:port`)."""

    def __init__(self, settings: Mapping[str, Any], address: tuple[str, int] | None = None):
        self.settings = dict(settings)
        self.address = address or (str(settings["host"]), int(settings["port"]))
        self.loop = asyncio.new_event_loop()
        self.client: Any = None
        self.pool: Any = None
        self.queues: dict[int, asyncio.Queue[Any]] = {}
        self.owed: dict[int, int] = {}  # chunks read and not yet credited back, by subscription

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def connect(self) -> _Session:
        """Connected to `address`, or the connection's own exception (the session closed)."""
        _client_module()
        from rstream.client import ClientPool
        from rstream.constants import MAX_ITEM_ALLOWED

        s = self.settings
        context = sink_tls_context("cdc_rabbitmq", s, bool(s.get("tls")))
        self.pool = ClientPool(self.address[0], self.address[1], vhost=s["vhost"], username=s["username"],
                               password=s["password"], frame_max=1_048_576, heartbeat=60, ssl_context=context,
                               load_balancer_mode=False, max_retries=5)  # fmt: skip
        try:
            self.client = self.run(
                self.pool.get(connection_name="cdc-verify", max_clients_by_connections=MAX_ITEM_ALLOWED), 30
            )
        except BaseException:
            self.close()
            raise
        return self

    def open(self) -> _Session:
        try:
            return self.connect()
        except Exception as exc:
            raise _cannot_connect(self.settings, self.address, exc) from None

    def leaders(self, streams: Sequence[str]) -> dict[str, tuple[str, int] | None]:
        """Each stream's leader as its node advertises it, in one request (the stream
        protocol's Metadata, PROTOCOL.adoc); None while none is elected (leader reference
        0xFFFF) or when the answer does not name it. RabbitMQ 3.10 leaves the members on dead
        nodes out of the answer (docs/sinks.md), so rstream's `query_leader_and_replicas`,
        which looks every replica up, is not used. A stream that does not exist, or has no
        member running, raises (StreamDoesNotExist, StreamNotAvailable)."""
        from rstream import schema

        client = self.client
        answer = self.run(
            client.sync_request(
                schema.Metadata(client._corr_id_seq.next(), streams=list(streams)), resp_schema=schema.MetadataResponse
            ),
            30,
        )
        brokers = {b.reference: (str(b.host), int(b.port)) for b in answer.brokers}
        return {
            meta.name: brokers.get(meta.leader_ref) if meta.leader_ref != _NO_LEADER else None
            for meta in answer.metadata
        }

    def leader(self, stream: str) -> tuple[str, int] | None:
        return self.leaders([stream]).get(stream)

    def exists(self, stream: str) -> bool:
        return bool(self.run(self.client.stream_exists(stream), 30))

    def subscribe(self, sub_id: int, stream: str, offset_type: Any, offset: int | None = None) -> asyncio.Queue[Any]:
        from rstream import schema

        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.queues[sub_id] = queue
        self.owed[sub_id] = 0  # a new subscription starts with its own initial credit

        def on_deliver(frame: Any) -> None:
            if frame.subscription_id == sub_id:
                queue.put_nowait(frame)

        self.client.add_handler(schema.Deliver, on_deliver, name=str(sub_id))
        self.run(self.client.run_queue_listener_task(sub_id, on_deliver), 10)
        spec = schema.OffsetSpec.from_params(offset_type, offset)
        self.run(self.client.subscribe(stream, sub_id, spec, initial_credit=_CREDIT), 30)
        return queue

    def next_frame(self, queue: asyncio.Queue[Any], timeout: float) -> Any | None:
        if not queue.empty():
            return queue.get_nowait()  # delivered while the loop last ran: no turn of it needed
        try:
            return self.run(queue.get(), timeout)
        except TimeoutError:
            return None

    def credit(self, sub_id: int) -> None:
        """One chunk of subscription `sub_id` read: its credit, given back `_CREDIT_BATCH`
        chunks at a time."""
        owed = self.owed[sub_id] + 1
        if owed >= _CREDIT_BATCH:
            self.run(self.client.credit(sub_id, owed), 10)
            owed = 0
        self.owed[sub_id] = owed

    def close(self) -> None:
        try:
            if self.pool is not None:
                self.run(self.pool.close(), 10)
        except Exception:
            pass
        finally:
            self.loop.close()

    def delivered_nothing(self, sub_id: int, queue: asyncio.Queue[Any], stream: str) -> bool:
        """True when subscription `sub_id` (the connection's only one) has been sent no chunk
        by the time a request sent after its Subscribe is answered: its stream is empty.

        The node's connection process answers a Subscribe, then sends the chunks the new
        subscription can read, before it handles the connection's next frame (RabbitMQ
        3.10's rabbit_stream_reader `handle_frame_post_auth`: `osiris:init_reader`, the
        response, then `send_chunks`, in one step); rstream's listener reads frames in
        order and queues a Deliver (`Client._frames[sub_id]`, for the task that hands it to
        `queue`) before it resolves a later response. So the answer to any request-response
        after the Subscribe is a barrier. Without rstream 1.1's `_frames` it cannot be
        read: False, and the caller waits `empty_wait` as before."""
        self.run(self.client.query_publisher_sequence(stream=stream, reference="cdc-verify-bounds"), 30)
        listened: Any = getattr(self.client, "_frames", None)
        return queue.empty() and listened is not None and listened[sub_id].empty()


def open_any(settings: Mapping[str, Any]) -> _Session:
    """A session on the first configured node that answers (`addresses`): what any node can
    serve (a stream's existence, its leader). A node that refuses (login, TLS) is said at once."""
    tried = addresses(settings)
    first: BaseException | None = None
    for address in tried:
        try:
            return _Session(settings, address).connect()
        except Exception as exc:
            if not _node_down(exc):
                raise _cannot_connect(settings, address, exc) from None
            first = first or exc
    assert first is not None
    where = ", ".join(f"{h}:{p}" for h, p in tried)
    raise RuntimeError(
        f"cdc_rabbitmq: cannot connect to {where} as {settings['username']}: {type(first).__name__}: {first} "
        "(check host, port and hosts: no node answers)"
    )


def _leader_now(session: _Session, stream: str) -> tuple[str, int] | None:
    """`_Session.leader`; None also while no member of the stream runs (StreamNotAvailable:
    a node restarting), a stream that does not exist one line."""
    from rstream.exceptions import StreamDoesNotExist, StreamNotAvailable

    try:
        return session.leader(stream)
    except StreamNotAvailable:
        return None
    except StreamDoesNotExist:
        raise RuntimeError(f"cdc_rabbitmq: stream {stream!r} does not exist (deleted since it was planned?)") from None


def stream_session(
    settings: Mapping[str, Any], stream: str, leader: tuple[str, int] | None = None, leader_wait: float = LEADER_WAIT
) -> _Session:
    """A session to read `stream` on: one on its leader (a replica may lag it; module
    docstring), else, when the leader's advertised address cannot be reached, one on a
    configured node, with a warning. `leader`: where the planner just found it (else it is
    asked of a configured node)."""
    session: _Session | None = None
    if leader is None:
        session = open_any(settings)
        try:
            deadline = time.monotonic() + leader_wait
            while (leader := _leader_now(session, stream)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cdc_rabbitmq: stream {stream!r} has no leader after {leader_wait:.0f}s "
                        "(an election that does not end: are most of its members' nodes down?)"
                    )
                time.sleep(0.5)
        except BaseException:
            session.close()
            raise
        if leader == session.address:
            return session
    try:
        on_leader = _Session(settings, leader).connect()
    except Exception as exc:
        fallback = session or open_any(settings)
        log.warning(
            "cdc_rabbitmq: cannot connect to stream %r's leader at its advertised address %s:%d (%s: %s); "
            "reading it through %s:%d, which may lag the leader (set the stream plugin's advertised_host/port "
            "to an address this host reaches)",
            stream, *leader, type(exc).__name__, exc, *fallback.address,
        )  # fmt: skip
        return fallback
    if session is not None:
        session.close()
    return on_leader


def _known_leaders(session: _Session, streams: Sequence[str]) -> dict[str, tuple[str, int] | None]:
    """The streams' leaders in one request, for the planner; {} when some stream has no
    member running (each is then asked again, and waited for, on its own)."""
    from rstream.exceptions import StreamNotAvailable

    try:
        return session.leaders(streams)
    except StreamNotAvailable:
        return {}


def stream_bounds(session: _Session, stream: str, empty_wait: float) -> tuple[int, int]:
    """(first offset, next offset) of `stream` now; (0, 0) when it is empty: read at once
    (`_Session.delivered_nothing`), `empty_wait` only bounds the wait for the first chunk
    of a stream that was not seen empty (an rstream without the barrier's queue)."""
    from rstream.constants import OffsetType

    queue = session.subscribe(1, stream, OffsetType.FIRST)
    if session.delivered_nothing(1, queue, stream):
        return 0, 0
    first = session.next_frame(queue, empty_wait)
    if first is None:
        return 0, 0
    last = session.next_frame(session.subscribe(2, stream, OffsetType.LAST), STALL_TIMEOUT)
    if last is None:
        raise RuntimeError(f"cdc_rabbitmq: stream {stream!r} delivered its first chunk but not its last")
    return int(first.chunk_first_offset), int(last.chunk_first_offset + last.num_entries)


def topic_streams(session: _Session, topic: str) -> list[str]:
    """The streams of `topic`: the stream of its name, else `<topic>-0`, `<topic>-1`, ...
    while they exist; [] when it has none."""
    if session.exists(topic):
        return [topic]
    streams: list[str] = []
    while session.exists(partition_stream(topic, len(streams))):
        streams.append(partition_stream(topic, len(streams)))
    return streams


def plan_audit(
    settings: Mapping[str, Any], audit_stream: str, topics: Sequence[str], empty_wait: float
) -> dict[str, Any]:
    """The exchange sink's snapshot: the audit stream's bounds now, as one `routed` range;
    every topic is one partition of it."""
    session = open_any(settings)
    try:
        if not session.exists(audit_stream):
            return {"partitions": [], "partition_counts": {}, "missing_topics": sorted(set(topics)),
                    "at_ms": int(time.time() * 1000)}  # fmt: skip
    finally:
        session.close()
    session = stream_session(settings, audit_stream)
    try:
        low, high = stream_bounds(session, audit_stream, empty_wait)
    finally:
        session.close()
    part = {"topic": audit_stream, "partition": 0, "stream": audit_stream, "low": low, "high": high, "routed": True}
    return {
        "partitions": [part],
        "partition_counts": dict.fromkeys(sorted(set(topics)), 1),
        "missing_topics": [],
        "at_ms": int(time.time() * 1000),
    }


def plan_rabbitmq(
    settings: Mapping[str, Any], topics: Sequence[str], empty_wait: float = DEFAULT_EMPTY_WAIT
) -> dict[str, Any]:
    """A snapshot of what to read: every stream of the topics with its offset bounds now."""
    _client_module()
    if settings.get("audit_stream"):
        return plan_audit(settings, settings["audit_stream"], topics, empty_wait)
    parts: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    missing: list[str] = []
    for topic in sorted(set(topics)):
        session = open_any(settings)  # a connection per topic: subscription ids 1 and 2 stay free
        try:
            streams = topic_streams(session, topic)
            if not streams:
                missing.append(topic)
                continue
            counts[topic] = len(streams)
            leaders = _known_leaders(session, streams)  # one request, not one connection per stream
        finally:
            session.close()
        for partition, stream in enumerate(streams):
            session = stream_session(settings, stream, leaders.get(stream))
            try:
                low, high = stream_bounds(session, stream, empty_wait)
            finally:
                session.close()
            parts.append({"topic": topic, "partition": partition, "stream": stream, "low": low, "high": high})
    return {
        "partitions": parts,
        "partition_counts": counts,
        "missing_topics": missing,
        "at_ms": int(time.time() * 1000),
    }


def message_record(
    topic: str, partition: int, offset: int, chunk_ts: int, data: bytes, routed: bool = False
) -> LogRecord:
    """One AMQP 1.0 message of a stream as a record (the mapping in the module docstring);
    `routed`: of the topic its routing key names (the audit stream)."""
    from rstream.amqp import amqp_decoder

    msg = amqp_decoder(data)
    if routed:
        key = (msg.message_annotations or {}).get(b"x-routing-key", b"")
        topic = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    created = msg.properties.creation_time if msg.properties is not None else None
    stamp = (TIMESTAMP_CREATE_TIME, int(created)) if created is not None else (TIMESTAMP_LOG_APPEND_TIME, chunk_ts)
    body = msg.body
    if isinstance(body, list):  # several data sections: their concatenation
        body = b"".join(body)
    return from_properties(topic, partition, offset, stamp, msg.application_properties, body)


def read_range(
    settings: Mapping[str, Any], topic: str, partition: int, stream: str, low: int, high: int,
    stall_timeout: float = STALL_TIMEOUT, routed: bool = False,
) -> Iterator[LogRecord]:  # fmt: skip
    """The messages of `stream` at offsets [low, high), in offset order."""
    from rstream.constants import OffsetType

    if high <= low:
        return
    session = stream_session(settings, stream)
    try:
        queue = session.subscribe(1, stream, OffsetType.OFFSET, low)
        while True:
            frame = session.next_frame(queue, stall_timeout)
            if frame is None:
                raise RuntimeError(
                    f"cdc_rabbitmq: no progress reading stream {stream!r} offsets [{low}, {high}) for {stall_timeout:.0f}s"
                )
            session.credit(1)
            if frame.num_records != frame.num_entries:
                # sub-entry batching (several messages, maybe compressed, in one entry): the
                # sinks do not write it, and its messages share an offset the rows cannot hold
                raise RuntimeError(
                    f"cdc_rabbitmq: stream {stream!r} holds sub-entry batches at offset {frame.chunk_first_offset}: "
                    "publish without sub-entry batching (send, not send_sub_entry)"
                )
            offset = frame.chunk_first_offset - 1
            for data in frame.get_messages():
                offset += 1
                if offset < low:
                    continue  # a subscription starts at the chunk that holds `low`
                if offset >= high:
                    return
                yield message_record(topic, partition, offset, frame.timestamp, data, routed)
            if offset >= high - 1:
                return
    finally:
        session.close()


class RabbitMQReader(RangeReader):
    def plan(self) -> dict[str, Any]:
        topics = topics_option(self.options, "cdc_rabbitmq", "topic names")
        wait = float(self.options.get("empty_wait") or DEFAULT_EMPTY_WAIT)
        return plan_rabbitmq(settings_from_options(self.options), topics, wait)

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        stream = r.get("stream") or r["topic"]
        return read_range(
            settings_from_options(self.options), r["topic"], r["partition"], stream, r["low"], r["high"],
            routed=bool(r.get("routed")),
        )  # fmt: skip


class RabbitMQDataSource(RangeDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_rabbitmq"

    def reader(self, schema: Any) -> RabbitMQReader:
        return RabbitMQReader(self.options)
