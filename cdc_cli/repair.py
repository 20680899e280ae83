"""`cdc repair`: re-publish exactly the events a verification found missing.

Input: the verifier's list of missing events (`missing.jsonl` next to its report), each
with its binlog coordinates (transaction start file/pos, row index, GTID). For each
transaction, the binlog is read again from its start to its commit, the listed rows are
mapped and encoded as the relay would, and published with the identity headers plus
`cdc.repair: 1`. Idempotent: first the target topics are read for those identities, and
an event found there (a previous repair, or a late delivery) is not published again. A
second `cdc verify` is then clean.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.assembly.transaction import TransactionAssembler
from cdc.config import Config
from cdc.errors import ConfigError, DeliveryError, SourceError
from cdc.events.dead_letters import dead_letter_value
from cdc.events.formats import H_FORMAT
from cdc.events.identity import H_EVENT_ID, H_EVENT_TYPE, H_REPAIR, H_TABLE, identity_key_from_headers
from cdc.events.outbox import DeadLetter, OutboxEvent, OutboxMapper
from cdc.events.topics import TopicRouter
from cdc.position import BinlogPosition
from cdc.source_events import ServerInfo
from cdc_cli.sinks import repair_publisher, repair_reader
from connectors.mysql.binlog_source import MySQLBinlogSourceFactory
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client


@dataclass
class RepairResult:
    requested: int
    published: int
    already_present: int
    not_found_in_binlog: int


def load_missing(report_dir: str) -> list[dict[str, Any]]:
    path = Path(report_dir) / "missing.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run `cdc verify` first and pass its output directory with --report")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _present(reader: Any, topics: set[str], wanted: set[tuple]) -> set[tuple]:
    found: set[tuple] = set()
    for topic in topics:
        for partition in range(reader.partition_count(topic) or 0):
            low, high = reader.watermarks(topic, partition)
            for _offset, headers in reader.records(topic, partition, low, high):
                key = identity_key_from_headers(headers)
                if key in wanted:
                    found.add(key)
    return found


def repair(
    cfg: Config,
    missing: list[dict[str, Any]],
    progress: Callable[[str], None] = lambda _m: None,
    replica_server_id: int | None = None,
) -> RepairResult:
    if not missing:
        return RepairResult(0, 0, 0, 0)
    if any(m["source"] != cfg.source.name for m in missing):
        raise ConfigError("the missing list names another source than this config's source.name")

    def key_of(m: dict[str, Any]) -> tuple:
        if m.get("gtid"):
            return (m["source"], m["gtid"], int(m["row"]))
        return (m["source"], m["file"], int(m["pos"]), int(m["row"]))

    wanted = {key_of(m) for m in missing}
    topics = {m.get("expected_topic") or cfg.kafka.dead_letter_topic for m in missing} | {cfg.kafka.dead_letter_topic}
    reader = repair_reader(cfg)
    try:
        present = _present(reader, topics, wanted)
    finally:
        reader.close()
    progress(f"{len(missing)} missing events; {len(present)} already in the topics")
    by_tx: dict[tuple[str, int], set[int]] = defaultdict(set)
    for m in missing:
        if key_of(m) not in present:
            by_tx[(m["file"], int(m["pos"]))].add(int(m["row"]))
    sources = MySQLBinlogSourceFactory(
        cfg.source.connection(),
        replica_server_id or cfg.source.replica_server_id + 1,
        {(t.schema, t.table) for t in cfg.tables},
    )
    publisher = repair_publisher(cfg)
    serializer = ConfluentAvroSerializer(registry_client(cfg.schema_registry))
    mapper = OutboxMapper(TopicRouter(cfg.kafka.topic_allowlist))
    published = not_found = 0
    failures: list[str] = []

    def on_delivery(delivery) -> None:
        nonlocal published
        if delivery.failure is None:
            published += 1
        else:
            failures.append(f"{delivery.topic}: {delivery.failure.code}")

    for (file, pos), rows in sorted(by_tx.items(), key=lambda kv: BinlogPosition(*kv[0])):
        tx = _read_transaction(sources, cfg, mapper, BinlogPosition(file, pos))
        if tx is None:
            not_found += len(rows)
            continue
        for item in tx.items():
            if item.identity.row not in rows:
                continue
            headers = item.identity.headers() + [(H_REPAIR, b"1"), (H_TABLE, item.table.encode())]
            if isinstance(item, OutboxEvent):
                headers += [(H_EVENT_ID, item.event_id.encode()), (H_EVENT_TYPE, item.event_type.encode())]
                extras, stamp = item.extras, None
                if extras is not None:  # a payload format: its headers and record timestamp, as the relay's
                    headers += [(H_FORMAT, extras.format.encode()), *extras.headers]
                    stamp = extras.timestamp_ms if extras.timestamp_ms is not None else item.identity.tx.commit_ts_ms
                publisher.publish(
                    item.topic,
                    item.aggregate_id.encode(),
                    serializer.encode(item, item.topic),
                    headers,
                    on_delivery,
                    stamp,
                )
            elif isinstance(item, DeadLetter):
                publisher.publish(
                    cfg.kafka.dead_letter_topic,
                    item.key.encode() if item.key else None,
                    dead_letter_value(item),
                    headers,
                    on_delivery,
                )
        tx.release()
    unacknowledged = publisher.flush(60)
    if cfg.sink.kind != "kafka":
        publisher.close()
    if unacknowledged or failures:
        raise DeliveryError(f"repair: {len(failures)} messages were not acknowledged ({'; '.join(failures[:3])})")
    return RepairResult(len(missing), published, len(present), not_found)


def _read_transaction(sources: MySQLBinlogSourceFactory, cfg: Config, mapper: OutboxMapper, start: BinlogPosition):
    assembler = TransactionAssembler(list(cfg.tables), mapper, cfg.source.name, 0, spill_dir=cfg.relay.spill_dir)
    source = sources.open(start)
    try:
        while True:
            event = source.read(10.0)
            if event is None:
                raise SourceError(f"no transaction could be read at {start} within 10 s")
            if isinstance(event, ServerInfo):
                assembler.server_id = event.server_id
                continue
            tx = assembler.feed(event)
            if tx is not None:
                return tx if tx.identity.start == start else None
    finally:
        source.close()
