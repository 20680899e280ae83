"""PySpark Python data source `cdc_nats`: the messages of NATS JetStream subjects, read with
nats-py through an ephemeral pull consumer per range (acknowledgements off: reading changes
nothing on the server, and the consumer goes away by itself).

    spark.read.format("cdc_nats")
        .option("servers", "nats://127.0.0.1:4222")
        .option("user", "...").option("password", "...")     # or .option("token", "...")
        .option("ca_file", "ca.pem")                          # TLS (also a tls:// server); cert_file, key_file
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
    """One JetStream message as a record (the mapping in the module docstring)."""
    meta = msg.metadata
    headers = msg.headers or {}
    stamp: tuple[int, int]
    try:
        stamp = (TIMESTAMP_CREATE_TIME, int(headers[H_TIMESTAMP]))
    except (KeyError, ValueError):
        stamp = (TIMESTAMP_LOG_APPEND_TIME, int(meta.timestamp.timestamp() * 1000))
    return from_properties(topic, 0, int(meta.sequence.stream), stamp, headers, msg.data)


def read_range(
    settings: Mapping[str, Any], topic: str, stream: str, low: int, high: int, stall_timeout: float = STALL_TIMEOUT
) -> Iterator[LogRecord]:
    """The messages of subject `topic` in `stream` at sequences [low, high), in order."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    if high <= low:
        return
    conn = _Connection(settings).open()
    try:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=low,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=stall_timeout,  # seconds: the server removes the consumer after that
        )
        sub = conn.run(conn.nc.jetstream().pull_subscribe(topic, stream=stream, config=config), 30)
        last_progress = time.monotonic()
        while True:
            try:
                msgs = conn.run(sub.fetch(FETCH, timeout=1.0), 30)
            except TimeoutError:
                if time.monotonic() - last_progress > stall_timeout:
                    raise RuntimeError(
                        f"cdc_nats: no progress reading {topic!r} in stream {stream!r} sequences [{low}, {high}) "
                        f"for {stall_timeout:.0f}s"
                    ) from None
                continue
            last_progress = time.monotonic()
            for msg in msgs:
                seq = int(msg.metadata.sequence.stream)
                if seq >= high:
                    return
                yield message_record(topic, msg)
                if seq >= high - 1 or msg.metadata.num_pending == 0:
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
