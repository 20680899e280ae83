"""`cdc adopt`: take over from a stopped Debezium MySQL connector (cdc/adoption.py).

    cdc adopt --config relay.toml --debezium-connector NAME
              (--debezium-offsets-file PATH | --debezium-offsets-topic TOPIC)
              [--debezium-server PREFIX] [--topic T ...] [--dry-run]

It reads the connector's stored offset, checks it against the server, finds the topics
Debezium wrote (every existing topic the relay's outbox routing can produce, plus
`--topic`), and writes the relay's first checkpoint: start at the offset's transaction,
and recognise Debezium's messages by their `id` header in those topics up to the
server's binlog head now. `cdc run` then goes on from there. Refused when the relay
already has a checkpoint (adoption is a first start, never a reset).
"""

from __future__ import annotations

import re
import string
import time

from cdc.adoption import AdoptedWindow, AdoptionError, DebeziumOffset
from cdc.checkpoint import Checkpoint
from cdc.config import Config
from cdc.errors import PositionError
from cdc.gtid import parse_gtid_set
from cdc_cli.app import checkpoint_store
from connectors.debezium.offsets import offset_from_file, offset_from_topic
from connectors.kafka.reader import KafkaTopicReader
from connectors.mysql.binlog_source import MySQLBinlogSourceFactory


def template_pattern(template: str) -> re.Pattern[str]:
    """A topic template (`outbox.event.{aggregate_type}`) as a pattern of the names it makes."""
    out = []
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if field is not None:
            out.append(".+")
    return re.compile("^" + "".join(out) + "$")


def adopted_topics(cfg: Config, existing: list[str], extra: list[str]) -> list[str]:
    patterns = [template_pattern(t.topic) for t in cfg.tables]
    own = {cfg.kafka.dead_letter_topic, cfg.checkpoint.topic}
    found = {t for t in existing if t not in own and not t.startswith("__") and any(p.match(t) for p in patterns)}
    missing = [t for t in extra if t not in existing]
    if missing:
        raise AdoptionError(f"--topic {missing[0]!r} does not exist in Kafka: name the topics Debezium's router wrote")
    return sorted(found | set(extra))


def read_offset(args) -> DebeziumOffset:
    if bool(args.debezium_offsets_file) == bool(args.debezium_offsets_topic):
        raise AdoptionError(
            "give one of --debezium-offsets-file (offset.storage.file.filename) or "
            "--debezium-offsets-topic (the Connect worker's offset.storage.topic)"
        )
    if args.debezium_offsets_file:
        return offset_from_file(args.debezium_offsets_file, args.debezium_connector, args.debezium_server)
    cfg = args.config_obj
    return offset_from_topic(
        cfg.kafka.clients(), args.debezium_offsets_topic, args.debezium_connector, args.debezium_server
    )


def adopt(
    cfg: Config, offset: DebeziumOffset, origin: str, extra_topics: list[str], dry_run: bool = False, out=print
) -> Checkpoint:
    store = checkpoint_store(cfg)
    existing_cp = store.load()
    if existing_cp is not None:
        raise AdoptionError(
            f"the relay already has a checkpoint at {existing_cp.position} (checkpoint.*): adoption "
            "is the relay's first start; to adopt again, point checkpoint.* at a new, empty store"
        )
    sources = MySQLBinlogSourceFactory(cfg.source.connection(), cfg.source.replica_server_id, set())
    server_id = sources.server_id()
    if offset.server_id and offset.server_id != server_id:
        raise AdoptionError(
            f"Debezium's offset was taken on server id {offset.server_id}, the relay reads server id "
            f"{server_id} (source.*): binlog positions name a place on one server only; adopt against "
            "the server Debezium read"
        )
    sources.check_available(offset.position)
    head = sources.resolve("latest")
    if head < offset.position:
        raise PositionError(
            f"Debezium's offset {offset.position} lies past the server's binlog head {head}: it "
            "belongs to another server or the binlog was reset"
        )
    gtids = None
    if offset.gtids:
        try:
            gtids = str(parse_gtid_set(offset.gtids))
        except PositionError as exc:
            raise AdoptionError(f"Debezium's offset has a GTID set this relay cannot read ({exc})") from exc
    reader = KafkaTopicReader(cfg.kafka.bootstrap)
    try:
        topics = adopted_topics(cfg, reader.topics(), extra_topics)
        partitions: dict[str, int] = {}
        offsets: dict[str, dict[int, int]] = {}
        for topic in topics:
            count = reader.partition_count(topic) or 0
            partitions[topic] = count
            offsets[topic] = {p: reader.watermarks(topic, p)[0] for p in range(count)}
    finally:
        reader.close()
    window = AdoptedWindow(until=head, offsets=offsets, origin=origin)
    cp = Checkpoint(
        source=cfg.source.name,
        position=offset.position,
        gtids=gtids,
        server_id=server_id,
        offsets={t: dict(ps) for t, ps in offsets.items()},
        partitions=partitions,
        written_at_ms=int(time.time() * 1000),
        adopted=window,
    )
    out(f"Debezium's offset: {offset} (connector {offset.connector!r}, topic.prefix {offset.server!r})")
    out(
        f"the relay starts at {offset.position} (the start of that transaction) and publishes every event whose id "
        f"no Debezium message carries, up to the binlog head {head}"
    )
    out(f"topics searched for Debezium's messages ({len(topics)}): {', '.join(topics) or 'none'}")
    if dry_run:
        out("dry run: no checkpoint written")
    else:
        store.save(cp)
        out("checkpoint written: start the relay with `cdc run` (Debezium must stay stopped)")
    return cp


def cmd_adopt(args) -> int:
    from cdc_cli.config_file import read_config

    cfg = read_config(args.config)
    args.config_obj = cfg
    offset = read_offset(args)
    where = args.debezium_offsets_file or f"offsets topic {args.debezium_offsets_topic}"
    adopt(cfg, offset, f"Debezium connector {offset.connector!r} ({where}) at {offset}", args.topic or [], args.dry_run)
    return 0
