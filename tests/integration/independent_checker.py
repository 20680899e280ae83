"""An independent delivery checker for the fault suite.

It shares nothing with the relay's recovery path (no cdc.assembly.transaction, cdc.recovery,
cdc.delivery.inflight, no connectors.mysql.binlog_source): it reads the committed outbox inserts
straight from the binlog with python-mysql-replication and its own few lines of
transaction assembly (XA included: rows prepared at XA PREPARE count at their XA COMMIT,
and not at all after XA ROLLBACK), reads every record of the topics with a plain
consumer, and compares by the outbox row's own id (the application's identity of the
event, not the relay's headers; for a record Debezium's outbox router wrote, which has no
envelope, its `id` header).

Reported: missing (committed, in no topic), duplicate (more than one record with one
event id), reordered (a key's events in another order than committed), phantom (a
record whose event id no committed insert has).
"""

from __future__ import annotations

import io
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import fastavro
from confluent_kafka import Consumer, TopicPartition
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import QueryEvent, RotateEvent, XAPrepareEvent, XidEvent
from pymysqlreplication.row_event import WriteRowsEvent

from connectors.schema_registry.avro_schemas import schema
from spark_jobs.mysql.binlog_compressed import ExpandingConnection


@dataclass(frozen=True)
class Committed:
    event_id: str
    key: str
    seq: int  # commit order across the whole binlog


def committed_outbox_events(
    conn_settings: dict, database: str, table: str = "outbox", start_file: str | None = None, start_pos: int = 4
) -> list[Committed]:
    """Every outbox row inserted by a committed transaction, in commit order."""
    settings = {
        "host": conn_settings["host"],
        "port": conn_settings["port"],
        "user": conn_settings["user"],
        "password": conn_settings.get("password") or conn_settings.get("passwd") or "",
    }
    # compressed binlogs (log_bin_compress, Transaction_payload) reach the library as plain
    # events through the verifier's expanding connection (its own decompression, not the relay's)
    kwargs = dict(
        connection_settings=settings,
        server_id=9_000_000 + uuid.uuid4().int % 100_000,
        blocking=False,
        only_events=[WriteRowsEvent, XidEvent, QueryEvent, RotateEvent, XAPrepareEvent],
        pymysql_wrapper=ExpandingConnection,
    )
    if start_file:
        kwargs.update(resume_stream=True, log_file=start_file, log_pos=start_pos)
    stream = BinLogStreamReader(**kwargs)
    out: list[Committed] = []
    held: list[tuple[str, str]] = []
    savepoints: dict[str, int] = {}
    prepared: dict[str, list[tuple[str, str]]] = {}  # xid text -> rows, until XA COMMIT / XA ROLLBACK
    try:
        for ev in stream:
            if isinstance(ev, XAPrepareEvent):
                xid = f"X'{ev.xid_gtrid.hex()}',X'{ev.xid_bqual.hex()}',{ev.xid_format_id}"
                if ev.one_phase:
                    _release(out, held)
                else:
                    prepared[xid] = held
                held, savepoints = [], {}
                continue
            if isinstance(ev, WriteRowsEvent):
                if ev.schema == database and ev.table == table:
                    for row in ev.rows:
                        v = row["values"]
                        held.append((str(v["id"]), str(v["aggregateid"])))
            elif isinstance(ev, XidEvent):
                _release(out, held)
                held, savepoints = [], {}
            elif isinstance(ev, QueryEvent):
                q = (ev.query if isinstance(ev.query, str) else ev.query.decode()).strip().upper()
                if q == "COMMIT":
                    _release(out, held)
                    held, savepoints = [], {}
                elif q.startswith("XA COMMIT"):
                    xid = q[len("XA COMMIT") :].strip()
                    if xid.endswith("ONE PHASE"):
                        _release(out, held)
                    else:
                        _release(out, prepared.pop(xid.lower().replace("x'", "X'"), []))
                    held, savepoints = [], {}
                elif q.startswith("XA ROLLBACK"):
                    prepared.pop(q[len("XA ROLLBACK") :].strip().lower().replace("x'", "X'"), None)
                    held, savepoints = [], {}
                elif q in ("ROLLBACK", "BEGIN"):
                    held, savepoints = [], {}
                elif q.startswith("SAVEPOINT"):
                    savepoints[q.split()[-1].strip("`")] = len(held)
                elif q.startswith("ROLLBACK TO"):
                    held = held[: savepoints.get(q.split()[-1].strip("`"), len(held))]
    finally:
        stream.close()
    return out


def _release(out: list[Committed], held: list[tuple[str, str]]) -> None:
    base = len(out)
    out.extend(Committed(event_id, key, base + n) for n, (event_id, key) in enumerate(held))


@dataclass(frozen=True)
class TopicRecord:
    topic: str
    partition: int
    offset: int
    event_id: str
    key: str | None


def topic_records(
    bootstrap: str, topics: list[str], truncated: list[tuple[str, int, int]] | None = None
) -> list[TopicRecord]:
    """Every record of `topics` (offset order per partition), event id from the Avro value
    (or, on the dead-letter topic, from the JSON row). Partitions whose low watermark rose
    above 0 (the stand-in's fixed retention dropped their oldest batches) are appended to
    `truncated` as (topic, partition, low watermark)."""
    import json

    parsed = fastavro.parse_schema(schema())
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"checker-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[TopicRecord] = []
    try:
        meta = consumer.list_topics(timeout=10)
        for topic in topics:
            if topic not in meta.topics:
                continue
            for partition in meta.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                if low > 0 and truncated is not None:
                    truncated.append((topic, partition, low))
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, partition, low)])
                done, next_offset, idle = False, low, 0.0
                while not done:
                    # Ask for no more than the partition has left: consume() waits out its
                    # whole timeout when fewer messages than asked for arrive. Fewer do
                    # arrive on a topic written in Kafka transactions: each commit or abort
                    # marker takes an offset no consumer receives (and read_committed drops
                    # aborted records), so the last record is seldom at high - 1.
                    batch = consumer.consume(max(1, min(1000, high - next_offset)), timeout=0.5)
                    if not batch:
                        # Done once the consumer's position reached the high watermark (it
                        # moves past markers); otherwise up to 5 s without a record, as before.
                        if consumer.position([TopicPartition(topic, partition)])[0].offset >= high:
                            break
                        idle += 0.5
                        if idle >= 5:
                            break
                        continue
                    idle = 0.0
                    for msg in batch:
                        if msg.error():
                            continue
                        value = msg.value() or b""
                        names = {name: v for name, v in (msg.headers() or [])}
                        if "cdc.source" not in names and "id" in names:
                            # written by Debezium's outbox router (a switch-over): the value is
                            # the payload itself; the event id is its `id` header
                            event_id = names["id"].decode()
                        elif value[:1] == b"\x00":
                            event_id = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, None)["id"]
                        else:
                            event_id = str(json.loads(value)["row"]["id"])
                        key = msg.key().decode() if msg.key() is not None else None
                        out.append(TopicRecord(topic, partition, msg.offset(), event_id, key))
                        next_offset = msg.offset() + 1
                        if msg.offset() + 1 >= high:
                            done = True
    finally:
        consumer.close()
    return out


@dataclass
class CheckResult:
    committed: int
    records: int
    missing: list[str] = field(default_factory=list)
    duplicates: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    reordered_keys: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    truncated: list[tuple[str, int, int]] = field(default_factory=list)  # retention dropped records

    @property
    def clean(self) -> bool:
        return not (self.missing or self.duplicates or self.reordered_keys or self.phantoms or self.truncated)

    def summary(self) -> str:
        text = (
            f"committed={self.committed} records={self.records} missing={len(self.missing)} "
            f"duplicates={len(self.duplicates)} reordered_keys={len(self.reordered_keys)} "
            f"phantoms={len(self.phantoms)}"
        )
        if self.truncated:
            text += (
                f"; NOT VERIFIABLE: the stand-in's retention dropped the oldest records of "
                f"{len(self.truncated)} partition(s) (e.g. {self.truncated[0]}): 'missing' here may be the "
                "broker's doing, not the relay's; use fewer events or more partitions"
            )
        return text


def check(
    committed: list[Committed], records: list[TopicRecord], truncated: list[tuple[str, int, int]] | None = None
) -> CheckResult:
    result = CheckResult(len(committed), len(records), truncated=list(truncated or []))
    by_id: dict[str, list[TopicRecord]] = defaultdict(list)
    for rec in records:
        by_id[rec.event_id].append(rec)
    committed_ids = {c.event_id for c in committed}
    for c in committed:
        if c.event_id not in by_id:
            result.missing.append(c.event_id)
    for event_id, recs in by_id.items():
        if len(recs) > 1:
            result.duplicates[event_id] = [(r.topic, r.partition, r.offset) for r in recs]
        if event_id not in committed_ids:
            result.phantoms.append(event_id)
    # Per key: the first copy of each event, in (partition, offset) order, must follow commit order.
    seq = {c.event_id: c.seq for c in committed}
    by_key: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    seen: set[str] = set()
    for rec in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        if rec.event_id in seen or rec.event_id not in seq or rec.key is None:
            continue
        seen.add(rec.event_id)
        by_key[(rec.topic, rec.key)].append((rec.partition, rec.offset, seq[rec.event_id]))
    for key, items in by_key.items():
        partitions = {p for p, _, _ in items}
        seqs = [s for _, _, s in sorted(items)]
        if len(partitions) > 1 or seqs != sorted(seqs):
            result.reordered_keys.append(str(key))
    return result
