"""The verifier's data sources of the sinks beyond Kafka against their real servers:
messages written with each broker's client the way the sinks write them (identity headers
as application properties / NATS headers, `cdc.events.sink_fields`) read back through Spark
(`cdc_rabbitmq`, `cdc_nats`) into exactly the rows the Kafka source makes of the same
records (`kafka_source.message_row`), so the reconciliation reads every sink alike."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from cdc.events.sink_fields import H_TIMESTAMP, message_properties, partition_stream
from spark_jobs.records import fields_for, message_row
from tests.sink_samples import SampleRecord, sample_records

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _rows(df: Any) -> list[dict[str, Any]]:
    assert [f.name for f in df.schema.fields] == [n for n, _ in fields_for(True, True)]
    return sorted((r.asDict() for r in df.collect()), key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _expected(written: list[tuple[SampleRecord, int, int]], dlq: str) -> list[dict[str, Any]]:
    rows = [message_row(s.as_kafka(partition, offset), True, True, dlq) for s, partition, offset in written]
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


# ============================================================================ RabbitMQ


def test_rabbitmq_source_reads_what_the_kafka_source_reads(rabbitmq, spark) -> None:
    from rstream import AMQPMessage, Producer
    from rstream._pyamqp.message import Properties

    prefix = f"t{uuid.uuid4().hex[:8]}"
    topic, dlq, empty, missing = f"{prefix}.event.order", f"{prefix}.dlq", f"{prefix}.event.empty", f"{prefix}.none"
    samples = sample_records(topic, dlq)
    written: list[tuple[SampleRecord, int, int]] = []

    async def write() -> None:
        next_offset: dict[str, int] = {}
        async with Producer(**rabbitmq.stream_settings()) as producer:
            for stream in (partition_stream(topic, 0), partition_stream(topic, 1), dlq, empty):
                await producer.create_stream(stream)
            for i, s in enumerate(samples):
                partition = i % 2 if s.topic == topic else 0
                stream = partition_stream(topic, partition) if s.topic == topic else dlq
                message = AMQPMessage(
                    body=s.value or b"",
                    application_properties=message_properties(s.key, s.headers, s.value),
                    properties=Properties(creation_time=s.timestamp_ms),
                )
                message.publishing_id = i + 1
                await producer.send_wait(stream, message, publisher_name=f"relay-{stream}")
                offset = next_offset.get(stream, 0)
                next_offset[stream] = offset + 1
                written.append((s, partition, offset))

    asyncio.run(write())
    reader = (
        spark.read.format("cdc_rabbitmq")
        .option("host", rabbitmq.host)
        .option("port", str(rabbitmq.stream_port))
        .option("user", rabbitmq.user)
        .option("password", rabbitmq.password)
        .option("topics", ",".join((topic, dlq, empty, missing)))
        .option("dlq_topic", dlq)
        .option("empty_wait", "1")
    )
    want = _expected(written, dlq)
    assert {r["partition"] for r in want if r["topic"] == topic} == {0, 1}
    assert _rows(reader.load()) == want
    # two offsets per Spark partition: ranges that start inside a stream's chunk
    assert _rows(reader.option("chunk", "2").load()) == want

    from spark_jobs.rabbitmq.source import plan_rabbitmq

    settings = {**rabbitmq.stream_settings(), "vhost": "/"}
    plan = plan_rabbitmq(settings, [topic, empty, missing], empty_wait=1.0)
    assert plan["missing_topics"] == [missing]
    assert plan["partition_counts"] == {topic: 2, empty: 1}
    bounds = {(p["stream"], p["low"], p["high"]) for p in plan["partitions"]}
    assert bounds == {(partition_stream(topic, 0), 0, 4), (partition_stream(topic, 1), 0, 4), (empty, 0, 0)}


def test_rabbitmq_reading_gives_credit_back_a_few_chunks_at_a_time(rabbitmq, monkeypatch) -> None:
    """A stream of one-message chunks (what the exchange sink's audit stream holds at a
    trickle) is read whole and in order from any offset, with one Credit frame for several
    chunks: the broker, never owed fewer than a few, does not wait for the reader."""
    from rstream import AMQPMessage, Producer
    from rstream.client import Client

    from spark_jobs.rabbitmq import source

    stream, n = f"t{uuid.uuid4().hex[:8]}.chunks", 300

    async def write() -> None:
        async with Producer(**rabbitmq.stream_settings()) as producer:
            await producer.create_stream(stream)
            for i in range(n):  # one publish answered before the next: a chunk each
                await producer.send_wait(stream, AMQPMessage(body=b"%d" % i, application_properties={"i": str(i)}))

    asyncio.run(write())
    frames: list[int] = []
    credits: list[int] = []
    next_frame, credit = source._Session.next_frame, Client.credit

    def counted_next_frame(self: Any, queue: Any, timeout: float) -> Any:
        frame = next_frame(self, queue, timeout)
        if frame is not None:
            frames.append(frame.num_entries)
        return frame

    async def counted_credit(self: Any, subscription_id: int, count: int) -> None:
        credits.append(count)
        await credit(self, subscription_id, count)

    monkeypatch.setattr(source._Session, "next_frame", counted_next_frame)
    monkeypatch.setattr(Client, "credit", counted_credit)
    settings = {**rabbitmq.stream_settings(), "vhost": "/"}

    def read(low: int, high: int) -> list[int]:
        return [r.offset() for r in source.read_range(settings, stream, 0, stream, low, high)]

    assert read(0, n) == list(range(n))
    assert len(frames) >= n // 2, frames  # mostly one-message chunks (a slow start may join a few)
    assert credits and set(credits) == {source._CREDIT_BATCH}
    assert len(credits) == len(frames) // source._CREDIT_BATCH
    assert read(7, n - 7) == list(range(7, n - 7))
    assert read(150, 151) == [150]
    assert read(n - 1, n) == [n - 1]


# ============================================================================= NATS


def test_nats_source_reads_what_the_kafka_source_reads(nats_server, spark) -> None:
    import nats
    from nats.js.api import StreamConfig

    prefix = f"t{uuid.uuid4().hex[:8]}"
    topic, dlq, empty, missing = f"{prefix}.event.order", f"{prefix}.dlq", f"{prefix}.event.empty", f"x{prefix}.none"
    samples = sample_records(topic, dlq)
    written: list[tuple[SampleRecord, int, int]] = []

    async def write() -> None:
        nc = await nats.connect(**nats_server.connect_settings())
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=prefix.upper(), subjects=[f"{prefix}.>"]))
            for i, s in enumerate(samples):
                headers = {
                    **message_properties(s.key, s.headers, s.value),
                    H_TIMESTAMP: str(s.timestamp_ms),
                    "Nats-Msg-Id": f"{prefix}-{i}",
                }
                ack = await js.publish(s.topic, s.value or b"", headers=headers)
                written.append((s, 0, ack.seq))
        finally:
            await nc.close()

    asyncio.run(write())
    reader = (
        spark.read.format("cdc_nats")
        .option("servers", nats_server.url)
        .option("user", nats_server.user)
        .option("password", nats_server.password)
        .option("topics", ",".join((topic, dlq, empty, missing)))
        .option("dlq_topic", dlq)
    )
    want = _expected(written, dlq)
    assert _rows(reader.load()) == want
    assert _rows(reader.option("chunk", "3").load()) == want

    from spark_jobs.nats.source import plan_nats

    plan = plan_nats(nats_server.connect_settings(), [topic, empty, missing])
    assert plan["missing_topics"] == [missing]
    by_topic = {p["topic"]: (p["low"], p["high"]) for p in plan["partitions"]}
    assert by_topic[topic] == (1, len(samples) + 1) and by_topic[empty][0] == by_topic[empty][1]


def test_nats_raw_pulls_read_what_nats_pys_fetch_reads(nats_server) -> None:
    """`read_range` pulls without nats-py's `fetch` and parses what the consumer delivers
    itself (spark_jobs/nats/source.py `_Puller`, `pulled_record`): over several pulls
    (more than `FETCH` messages), a subject interleaved with another (gaps), a message
    deleted in the middle, headers with odd content, an empty payload, a message without
    headers and one without `cdc.timestamp` (the time stored), it gives exactly the records
    nats-py's Msg gives (`message_record`), and ends where the range or the subject ends."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

    from spark_jobs.nats.source import FETCH, message_record, read_range

    prefix = f"r{uuid.uuid4().hex[:8]}"
    topic, other, stream = f"{prefix}.a", f"{prefix}.b", prefix.upper()
    n = FETCH * 2 + 300
    settings = nats_server.connect_settings()

    def headers_of(i: int) -> dict[str, str] | None:
        if i % 97 == 5:
            return None
        h = {"id": f"e{i}", H_TIMESTAMP: str(1_700_000_000_000 + i), "cdc.key": f"k{i % 7}"}
        if i % 13 == 0:
            h.pop(H_TIMESTAMP)
        if i % 11 == 0:
            h["note"] = "Zo\u00eb: a:b  c"
        return h

    async def write_and_reference() -> list[Any]:
        nc = await nats.connect(**settings)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.>"]))
            for i in range(n):
                subject = other if i % 3 == 2 else topic
                await js.publish(subject, b"" if i % 17 == 0 else b"v%d" % i, headers=headers_of(i))
            await js.delete_msg(stream, 301)
            config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
            sub = await js.pull_subscribe(topic, stream=stream, config=config)
            out: list[Any] = []
            while True:
                try:
                    msgs = await sub.fetch(500, timeout=1.0)
                except TimeoutError:
                    return out
                out += [message_record(topic, m) for m in msgs]
        finally:
            await nc.close()

    reference = asyncio.run(write_and_reference())
    assert len(reference) > FETCH * 1.5 and 301 not in {r.offset() for r in reference}

    def fields(r: Any) -> tuple:
        return (r.topic(), r.partition(), r.offset(), r.timestamp(), r.key(), r.value(), sorted(r.headers()))

    got = list(read_range(settings, topic, stream, 1, n + 1))
    assert [fields(r) for r in got] == [fields(r) for r in reference]
    # a range ending inside the subject: up to it, not past it
    cut = reference[len(reference) // 2].offset()
    assert [r.offset() for r in read_range(settings, topic, stream, 200, cut)] == [
        r.offset() for r in reference if 200 <= r.offset() < cut
    ]
