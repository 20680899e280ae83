"""PySpark Python data source `cdc_nats`: the messages of NATS JetStream subjects, read with
nats-py through an ephemeral pull consumer per range, pulled without nats-py's `fetch`
(`_Puller`; acknowledgements off: reading changes nothing on the server, and the consumer
goes away by itself).

    spark.read.format("cdc_nats")
        .option("servers", "nats://127.0.0.1:4222")
        .option("user", "...").option("password", "...")     # or .option("token", "...")
        .option("ca_file", "ca.pem")                          # TLS (also a tls:// server); cert_file, key_file, key_password
        .option("topics", "outbox.event.order,outbox.dlq")   # subjects
        .option("dlq_topic", "outbox.dlq")
        .option("chunk", "100000")                            # sequences per Spark partition
        .option("plan", json.dumps(plan_nats(...)))            # optional: a fixed snapshot
        .option("include_raw", "true").option("decode", "true")
        .load()

The columns are `records.fields_for(include_raw, decode)`, exactly the Kafka source's:
each message becomes a `log_record.LogRecord` and goes through `records.RecordColumns`.
What maps to what (docs/sinks.md): a topic is a subject (JetStream gives each subject to at
most one stream, so the subject names its stream too); the partition is 0; the offset is the
stream sequence (shared by the stream's subjects: a subject's offsets have gaps, as a Kafka
partition's do after compaction); the timestamp is the header `cdc.timestamp` (type 1,
create time) or else the time the server stored it (type 2, log-append time); the NATS
headers are the headers, but `cdc.key` (the key), `cdc.value.null` (a null value),
`cdc.timestamp` and JetStream's own `Nats-*`; the value is the payload.

Partitions: `(topic, 0, stream, [low, high))` sequence ranges from the stream's first
sequence to its last + 1 when planned, at most `chunk` sequences per Spark partition
(`records.chunks`). A reader stops at `high`, or when the server says no message of
the subject is left after the one it read (`num_pending` 0: deleted messages at the end).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.events.sink_fields import H_TIMESTAMP
from spark_jobs.common import SINK_TLS_OPTIONS, sink_tls_context, tls_hint
from spark_jobs.log_record import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, LogRecord, from_properties
from spark_jobs.log_source import RangeDataSource, RangeReader, topics_option

STALL_TIMEOUT = 60.0
FETCH = 1_000  # messages per pull request


def _client_module() -> Any:
    try:
        import nats
    except ImportError:
        raise RuntimeError(
            "cdc_nats: the nats-py package is not installed: pip install 'cdc-outbox-relay[nats]'"
        ) from None
    return nats


def settings_from_options(options: Mapping[str, str]) -> dict[str, Any]:
    """`nats.connect` keyword arguments from the data source's options."""
    servers = [s.strip() for s in (options.get("servers") or "nats://127.0.0.1:4222").split(",") if s.strip()]
    out: dict[str, Any] = {"servers": servers}
    if options.get("user"):
        out["user"] = options["user"]
        out["password"] = options.get("password") or ""
    elif options.get("token"):
        out["token"] = options["token"]
    # plain strings here (settings travel to executors); the context is made at connect
    out.update({name: str(options.get(name) or "") for name in SINK_TLS_OPTIONS})
    return out


class _Connection:
    """One NATS connection driven from synchronous code through a private event loop."""

    def __init__(self, settings: Mapping[str, Any]):
        self.settings = dict(settings)
        self.loop = asyncio.new_event_loop()
        self.nc: Any = None

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def open(self) -> _Connection:
        nats = _client_module()

        async def quiet(_exc: Exception) -> None:  # failures reach us as exceptions; nats-py would print each
            pass

        settings = {k: v for k, v in self.settings.items() if k not in SINK_TLS_OPTIONS}
        tls_on = any(s.startswith("tls://") for s in settings["servers"])
        context = sink_tls_context("cdc_nats", self.settings, tls_on)
        if context is not None:
            settings["tls"] = context
        try:
            self.nc = self.run(nats.connect(**settings, allow_reconnect=False, connect_timeout=10, error_cb=quiet), 30)
        except Exception as exc:
            self.loop.close()
            raise RuntimeError(
                f"cdc_nats: cannot connect to {','.join(self.settings['servers'])}: {type(exc).__name__}: {exc} "
                f"(check servers, user and password){tls_hint(exc)}"
            ) from None
        return self

    def close(self) -> None:
        try:
            if self.nc is not None:
                self.run(self.nc.close(), 10)
        except Exception:
            pass
        finally:
            self.loop.close()


def plan_nats(settings: Mapping[str, Any], topics: Sequence[str]) -> dict[str, Any]:
    """A snapshot of what to read: for every subject, its stream's sequence bounds now."""
    from nats.js.errors import NotFoundError

    conn = _Connection(settings).open()
    parts: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    missing: list[str] = []
    try:
        js = conn.nc.jetstream()
        for topic in sorted(set(topics)):
            try:
                stream = conn.run(js.find_stream_name_by_subject(topic), 30)
            except NotFoundError:
                missing.append(topic)
                continue
            state = conn.run(js.stream_info(stream, subjects_filter=topic), 30).state
            low = int(state.first_seq)
            # a subject of a stream that holds none of its messages: nothing to read (a pull
            # consumer would wait for the first one)
            held = (state.subjects or {}).get(topic, 0)
            high = int(state.last_seq) + 1 if held else low
            parts.append({"topic": topic, "partition": 0, "stream": stream, "low": low, "high": high})
            counts[topic] = 1
    finally:
        conn.close()
    return {
        "partitions": parts,
        "partition_counts": counts,
        "missing_topics": missing,
        "at_ms": int(time.time() * 1000),
    }


def first_sequence(settings: Mapping[str, Any], stream: str) -> int:
    """The first sequence `stream` still holds (0 when it is empty and never held one)."""
    conn = _Connection(settings).open()
    try:
        return int(conn.run(conn.nc.jetstream().stream_info(stream), 30).state.first_seq)
    finally:
        conn.close()


def plan_nats_matching(settings: Mapping[str, Any], topics: Sequence[str], pattern: str | None) -> dict[str, Any]:
    """`plan_nats` of `topics` and of every subject a stream holds messages of that
    matches `pattern` (a Python regex, fullmatch): what `cdc verify` reads."""
    import re

    subjects = set(topics)
    if pattern:
        conn = _Connection(settings).open()
        try:
            js = conn.nc.jetstream()
            for stream in conn.run(js.streams_info(), 30):
                info = conn.run(js.stream_info(stream.config.name, subjects_filter=">"), 30)
                subjects.update(s for s in (info.state.subjects or {}) if re.fullmatch(pattern, s))
        finally:
            conn.close()
    return plan_nats(settings, sorted(subjects))


def message_record(topic: str, msg: Any) -> LogRecord:
    """One JetStream message (nats-py's Msg) as a record (the mapping in the module docstring)."""
    meta = msg.metadata
    headers = msg.headers or {}
    stamp: tuple[int, int]
    try:
        stamp = (TIMESTAMP_CREATE_TIME, int(headers[H_TIMESTAMP]))
    except (KeyError, ValueError):
        stamp = (TIMESTAMP_LOG_APPEND_TIME, int(meta.timestamp.timestamp() * 1000))
    return from_properties(topic, 0, int(meta.sequence.stream), stamp, headers, msg.data)


# A pulled message's reply subject: `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
# <consumer seq>.<time ns>.<pending>` (9 tokens), or with the domain and the account's hash
# after `$JS.ACK` (12 tokens; ADR-15, nats-py's `Msg.Metadata._from_reply`): the stream
# sequence, the time stored and the messages pending after it, by position.
_V1_FIELDS = (5, 7, 8)
_V2_FIELDS = (7, 9, 10)
_HEADER_LINE = b"NATS/1.0"
_END_OF_PULL = (b"404", b"408")  # no messages (no_wait), the request expired: this pull is over
# No responders: the consumer has no leader now (a replicated stream's servers restarted or
# electing): nothing this pull, asked again after a pause; `read_range`'s stall timeout bounds it
_NO_LEADER_NOW = b"503"
_NO_LEADER_PAUSE_S = 0.25


def _pulled_fields(reply: bytes) -> tuple[int, int, int]:
    """(stream sequence, stored at in ns, pending) of a pulled message's reply subject."""
    tokens = reply.split(b".")
    if len(tokens) < 9 or tokens[0] != b"$JS" or tokens[1] != b"ACK":
        raise RuntimeError(f"cdc_nats: a pulled message without JetStream's reply subject: {reply[:200]!r}")
    seq, ts, pending = _V1_FIELDS if len(tokens) == 9 else _V2_FIELDS
    return int(tokens[seq]), int(tokens[ts]), int(tokens[pending])


def pulled_record(topic: str, reply: bytes, data: bytes, raw_headers: bytes | None) -> tuple[LogRecord, int]:
    """A message as the consumer delivered it (its reply subject, payload and header block,
    unparsed) as a record, and the messages pending after it: what `message_record` makes
    of nats-py's Msg, with nats-py's own parsing of the header lines (`Client.
    _parse_header_lines`, what it uses to build Msg.headers) and without the Msg."""
    seq, stored_ns, pending = _pulled_fields(reply)
    headers: dict[Any, Any] = {}
    if raw_headers and len(raw_headers) > len(_HEADER_LINE) + 2:
        headers = _parse_header_lines(raw_headers[len(_HEADER_LINE) + 2 :])
    stamp: tuple[int, int]
    try:
        stamp = (TIMESTAMP_CREATE_TIME, int(headers[H_TIMESTAMP]))
    except (KeyError, ValueError):
        # as Msg.metadata.timestamp (a datetime of ns / 1e9, which rounds to the microsecond)
        # then `.timestamp() * 1000`: the float alone can be a millisecond lower
        stored = datetime.datetime.fromtimestamp(stored_ns / 1_000_000_000.0, datetime.UTC)
        stamp = (TIMESTAMP_LOG_APPEND_TIME, int(stored.timestamp() * 1000))
    return from_properties(topic, 0, seq, stamp, headers, data), pending


def _parse_header_lines(raw: bytes) -> dict[str, str]:
    from nats.aio.client import Client

    return Client._parse_header_lines(raw)


class _Puller:
    """An ephemeral pull consumer of one subject, read without nats-py's `fetch`, which
    spends a future, a task and a timeout on every message (`PullSubscription._fetch_n`):
    each pull is one `$JS.API.CONSUMER.MSG.NEXT` request (ADR-13) to a reply subject of its
    own under one subscription's inbox. The consumer's messages (each under its own subject,
    JetStream's reply subject carrying its sequences) and the pull's status come on that
    subscription and are taken from nats-py's reader as they arrive (`Client._process_msg
    (sid, subject, reply, data, headers)` is handed every message), unparsed, into a list. A
    pull ends with its `batch` messages, or with a status to its own reply subject: 404 / 408
    (nothing more now, the request expired), 503 (no leader now: nothing, asked again after a
    pause); another status is an error."""

    def __init__(self, nc: Any, topic: str, stream: str) -> None:
        self.nc, self.topic, self.stream = nc, topic, stream
        self.name = ""
        self.inbox = b""
        self.sid = -1
        self.pulls = 0
        self.got: list[tuple[bytes, bytes, bytes | None]] = []
        self.wanted = 0
        self.status: bytes | None = None
        self.done = asyncio.Event()

    async def open(self, low: int, stall_timeout: float) -> _Puller:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(
            filter_subject=self.topic,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=low,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=stall_timeout,  # seconds: the server removes the consumer after that
        )
        info = await self.nc.jetstream().add_consumer(self.stream, config=config)
        self.name = info.name
        prefix = self.nc.new_inbox()
        self.inbox = prefix.encode() + b"."
        sub = await self.nc.subscribe(prefix + ".*")
        self.sid = sub._id
        general = self.nc._process_msg

        async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
            if sid != self.sid:
                await general(sid, subject, reply, data, headers)
            else:
                self._take(subject, reply, data, headers)

        self.nc._process_msg = process_msg
        return self

    def _take(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        if headers and headers.startswith(_HEADER_LINE + b" "):  # a status: "NATS/1.0 408 Request Timeout"
            if subject == self.inbox + str(self.pulls).encode():  # else an earlier pull's, ended already
                self.status = headers[len(_HEADER_LINE) + 1 :].split(b"\r\n", 1)[0].strip()
                self.done.set()
            return
        # A message (its subject is its own, its reply JetStream's): whichever pull asked for
        # it, it is the next one the consumer delivers, in stream order (acknowledgements off).
        self.got.append((reply, data, headers))
        if len(self.got) >= self.wanted:
            self.done.set()

    async def pull(self, batch: int, expires_s: float) -> list[tuple[bytes, bytes, bytes | None]]:
        """The next messages, at most `batch`: those the consumer has now (`no_wait`: the
        server ends the pull with 404 when it has fewer), else, when it has none, what
        comes within `expires_s` (as nats-py's `fetch` asks: a pull with `expires` waits
        for its whole batch)."""
        got = await self._request({"batch": batch, "no_wait": True}, 5.0)
        if not got and self.status is not None:
            got = await self._request({"batch": batch, "expires": int(expires_s * 1_000_000_000)}, expires_s + 5)
        return got

    async def _request(self, request: dict[str, Any], wait_s: float) -> list[tuple[bytes, bytes, bytes | None]]:
        self.pulls += 1
        self.got, self.wanted, self.status = [], int(request["batch"]), None
        self.done.clear()
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.name}"
        reply = (self.inbox + str(self.pulls).encode()).decode()
        await self.nc.publish(subject, json.dumps(request).encode(), reply=reply)
        try:
            await asyncio.wait_for(self.done.wait(), wait_s)
        except TimeoutError:
            pass  # neither the batch nor a status in time: what came is taken, the caller pulls again
        status = self.status
        if status is not None and status[:3] == _NO_LEADER_NOW:
            await asyncio.sleep(_NO_LEADER_PAUSE_S)
            got, self.got = self.got, []
            return got
        if status is not None and status[:3] not in _END_OF_PULL:
            raise RuntimeError(
                f"cdc_nats: reading {self.topic!r} in stream {self.stream!r}: the server said {status.decode(errors='replace')}"
            )
        got, self.got = self.got, []
        return got


def read_range(
    settings: Mapping[str, Any], topic: str, stream: str, low: int, high: int, stall_timeout: float = STALL_TIMEOUT
) -> Iterator[LogRecord]:
    """The messages of subject `topic` in `stream` at sequences [low, high), in order."""
    if high <= low:
        return
    conn = _Connection(settings).open()
    try:
        puller = conn.run(_Puller(conn.nc, topic, stream).open(low, stall_timeout), 30)
        last_progress = time.monotonic()
        while True:
            msgs = conn.run(puller.pull(FETCH, 1.0), 30)
            if not msgs:
                if time.monotonic() - last_progress > stall_timeout:
                    raise RuntimeError(
                        f"cdc_nats: no progress reading {topic!r} in stream {stream!r} sequences [{low}, {high}) "
                        f"for {stall_timeout:.0f}s"
                    )
                continue
            last_progress = time.monotonic()
            for reply, data, raw_headers in msgs:
                record, pending = pulled_record(topic, reply, data, raw_headers)
                if record.offset() >= high:
                    return
                yield record
                if record.offset() >= high - 1 or pending == 0:
                    return
    finally:
        conn.close()


class NatsReader(RangeReader):
    def plan(self) -> dict[str, Any]:
        return plan_nats(settings_from_options(self.options), topics_option(self.options, "cdc_nats", "subjects"))

    def records(self, r: Mapping[str, Any]) -> Iterator[LogRecord]:
        return read_range(settings_from_options(self.options), r["topic"], r["stream"], r["low"], r["high"])


class NatsDataSource(RangeDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_nats"

    def reader(self, schema: Any) -> NatsReader:
        return NatsReader(self.options)
