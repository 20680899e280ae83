"""`cdc locate`: from a Kafka offset to the binlog event it carries, and from a binlog
position or GTID to the Kafka records that carry it (a header scan; no Spark needed).
The same on a sink other than Kafka (`sink=`, the options of its verifier source,
cdc_cli.verify_commands.sink_source_options), read with the verifier's own readers
(spark_jobs/rabbitmq/source.py, spark_jobs/nats/source.py): on NATS JetStream a subject is
the topic and the stream sequence the offset.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cdc.events import identity as hdr
from cdc.gtid import looks_like_mysql_gtid, mysql_gtid_text
from cdc.position import BinlogPosition
from spark_jobs.kafka.source import consume_range, kafka_consumer, plan_kafka, scan_partitions

_MARIADB_GTID = re.compile(r"^\d+-\d+-\d+$")


def _identity_of(msg: Any) -> dict[str, Any]:
    headers = hdr.header_dict(msg.headers())
    ts_type, ts = msg.timestamp()
    ident = hdr.identity_from_headers(headers)
    out: dict[str, Any] = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp_ms": ts if ts_type else None,
        "key": None if msg.key() is None else msg.key().decode("utf-8", "replace"),
        "headers": headers,
        "identity_key": hdr.identity_key_from_headers(headers),
        "source": headers.get(hdr.H_SOURCE),
        "position": None,
        "row": None,
        "gtid": headers.get(hdr.H_GTID),
        "commit_ts_ms": None,
        "event_id": headers.get(hdr.H_EVENT_ID),
        "repair": hdr.H_REPAIR in headers,
        "dlq_cause": headers.get(hdr.H_DLQ_CAUSE),
    }
    if ident is not None:
        out.update(
            position=str(ident.tx.start),
            file=ident.tx.start.file,
            pos=ident.tx.start.pos,
            row=ident.row,
            commit_ts_ms=ident.tx.commit_ts_ms,
        )
    return out


def locate_offset(
    kafka_bootstrap: str,
    topic: str,
    partition: int,
    offset: int,
    timeout: float = 30.0,
    consumer_conf: dict[str, Any] | None = None,
    sink: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The identity and binlog position of the record at `topic[partition]@offset`: a dict
    with `identity_key`, `source`, `position` ("file:pos" of the transaction start),
    `file`, `pos`, `row`, `gtid`, `commit_ts_ms`, `event_id`, `headers`, ... - or None when
    no record has that offset (a transaction marker, a compacted or deleted record, or
    beyond the end). `sink`: a sink other than Kafka (its verifier source's options,
    cdc_cli.verify_commands.sink_source_options)."""
    if sink:
        for msg in _sink_records(sink, [topic], only=(partition, offset, offset + 1)):
            if msg.offset() == offset:  # a JetStream subject's sequences have gaps
                return _identity_of(msg)
        return None
    from confluent_kafka import TopicPartition

    consumer = kafka_consumer(kafka_bootstrap, consumer_conf)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    finally:
        consumer.close()
    if offset < low or offset >= high:
        return None
    for msg in consume_range(
        kafka_bootstrap, topic, partition, offset, offset + 1, consumer_conf, stall_timeout=timeout
    ):
        if msg.offset() == offset:
            return _identity_of(msg)
    return None


def _matcher(source: str, where: str | BinlogPosition, row: int | None) -> Any:
    text = str(where).strip()
    mysql = isinstance(where, str) and looks_like_mysql_gtid(text)
    if isinstance(where, str) and (_MARIADB_GTID.match(text) or mysql):
        # a MySQL GTID (`uuid:n`, tagged `uuid:tag:n`) in the headers' form, or refused
        gtid = mysql_gtid_text(text) if mysql else text

        def by_gtid(h: dict[str, str]) -> bool:
            return (
                h.get(hdr.H_SOURCE) == source
                and (h.get(hdr.H_GTID) or "").lower() == gtid
                and (row is None or h.get(hdr.H_ROW) == str(row))
            )

        return by_gtid
    position = where if isinstance(where, BinlogPosition) else BinlogPosition.parse(text)

    def by_position(h: dict[str, str]) -> bool:
        return (
            h.get(hdr.H_SOURCE) == source
            and h.get(hdr.H_FILE) == position.file
            and h.get(hdr.H_POS) == str(position.pos)
            and (row is None or h.get(hdr.H_ROW) == str(row))
        )

    return by_position


def locate_position(
    kafka_bootstrap: str,
    topics: Sequence[str] | str,
    source: str,
    where: str | BinlogPosition,
    row: int | None = None,
    topic_pattern: str | None = None,
    consumer_conf: dict[str, Any] | None = None,
    sink: dict[str, str] | None = None,
) -> list[tuple[str, int, int]]:
    """Every (topic, partition, offset) whose headers name the transaction `where` of
    `source` - a binlog position `file:pos` (the transaction's start, as in the
    `cdc.binlog.file`/`cdc.binlog.pos` headers) or a GTID (`d-s-n` / `uuid:n` / a
    tagged `uuid:tag:n`) - and,
    when given, its row index. Scans the headers of every record of the topics.
    `consumer_conf`: the shared Kafka client settings (`KafkaClientConfig.settings("consumer")`)."""
    if isinstance(topics, str):
        topics = [t.strip() for t in topics.split(",") if t.strip()]
    match = _matcher(source, where, row)
    found: list[tuple[str, int, int]] = []
    if sink:
        # the named topics, and on JetStream the subjects matching the pattern (RabbitMQ
        # 3.10 cannot list streams)
        messages: Any = _sink_records(sink, list(topics), pattern=topic_pattern)
    else:
        plan = plan_kafka(kafka_bootstrap, list(topics), topic_pattern, consumer_conf)
        messages = scan_partitions(kafka_bootstrap, plan["partitions"], consumer_conf)
    for msg in messages:
        if match(hdr.header_dict(msg.headers())):
            found.append((msg.topic(), msg.partition(), msg.offset()))
    return sorted(found)


def _sink_records(
    sink: dict[str, str], topics: list[str], only: tuple[int, int, int] | None = None, pattern: str | None = None
) -> Any:
    """The records of a sink other than Kafka: every one of `topics` (and of the topics
    matching `pattern` where the sink can list them), or of `only` (partition, start, end)
    of the one topic."""
    from spark_jobs.sink_read import sink_plan

    fmt = sink["format"]
    options = {k: v for k, v in sink.items() if k != "format"}
    if fmt == "cdc_rabbitmq":
        from spark_jobs.rabbitmq import source as rabbitmq_source

        settings = rabbitmq_source.settings_from_options(options)

        def read(part: dict[str, Any], low: int, high: int) -> Any:
            return rabbitmq_source.read_range(
                settings, part["topic"], part["partition"], part["stream"], low, high, routed=bool(part.get("routed"))
            )
    elif fmt == "cdc_nats":
        from spark_jobs.nats import source as nats_source

        settings = nats_source.settings_from_options(options)

        def read(part: dict[str, Any], low: int, high: int) -> Any:
            return nats_source.read_range(settings, part["topic"], part["stream"], low, high)
    else:
        raise ValueError(f"cdc locate: no sink reader {fmt!r}")
    for part in sink_plan(fmt, options, topics, pattern)["partitions"]:
        low, high = part["low"], part["high"]
        if only is not None:
            if part["partition"] != only[0]:
                continue
            low, high = max(low, only[1]), min(high, only[2])
        yield from read(part, low, high)
