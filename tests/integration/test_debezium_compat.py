"""Debezium compatibility (issue 14): Debezium 3.6's MySQL connector + Outbox EventRouter and
the relay read the SAME binlog with Debezium-style settings, and their messages are compared
message by message (`compare_messages`: topic, key, value bytes, every header Debezium's
router writes, record timestamp), for the JSON payload (JsonConverter,
`table.expand.json.payload`), the string converter and Confluent's AvroConverter, with
additional placement headers, the timestamp column and the tombstone option.

Debezium's side is serialised by Kafka Connect's own converters in a child process
(tests/integration/debezium_harness.py); the relay runs with the matching `[[outbox.tables]]`
settings into the Kafka stand-in, and its messages are read back with their raw bytes. For
Avro, both talk to one Confluent-compatible registry over HTTP (tests/integration/
registry_server.py), so the schema ids in the wire format can be compared too.

Record timestamps: without `table.field.event.timestamp` Debezium stamps a record with the
envelope's `ts_ms`, the moment its connector processed the event, which nothing else can
reproduce; every comparison here therefore sets the timestamp column (the relay's default,
the commit time, is what a Debezium user gets from `source.ts_ms`).

The corpus tests run a generated corpus (tests/integration/json_corpus.py: at least 2,000
payloads from a seed printed with the result, plus fixed cases per class of docs/output-formats.md's
"The json format's bytes") through both sides message by message for `json`, `string` and
`avro`, printing every difference with its payload and bytes. `CDC_COMPAT_SEED=<n>` replays
a seed.

The server runs with `--version=5.7.19-log`, a test device only (see debezium_harness.py).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from debezium_harness import (
    DebeziumProcess,
    DebeziumRecord,
    debezium_mariadb,
    debezium_properties,
    read_collected,
    seed_offsets,
)
from harness import OUTBOX_DDL, RelayThread, env_for, master_position, relay_raw_config, wait_until
from json_corpus import FIXED, CorpusGenerator
from registry_server import RegistryServer

from cdc.config import load_config
from cdc.events.identity import H_FILE, H_POS, H_ROW
from connectors.kafka.reader import KafkaTopicReader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# (aggregatetype, aggregateid, type, payload, created_at): text and JSON payloads, non-ASCII,
# spaces a JSON re-serialisation removes, a NULL payload and a blank one (the tombstone
# cases), doubles Java writes its own way, a long, null members, an array of objects with
# different members, nested arrays, escapes, plain text.
WORKLOAD = [
    ("order", "o-1", "created", '{"n": 0, "items": [1, 2]}', "2026-01-02 03:04:05.123456"),
    ("order", "o-2", "paid", '{"name": "Zoë ✓"}', "2026-01-02 03:04:06.000001"),
    ("customer", "c-1", "renamed", '{"a":{"b":[true,null,1.5]}}', "2026-01-03 00:00:00.5"),
    ("order", "o-1", "deleted", None, "2026-01-04 12:00:00"),
    (
        "order",
        "o-3",
        "priced",
        '{"price": 39.98, "big": 12345678901, "tiny": 0.0001, "e": 1e7, "gone": null, '
        '"lines": [{"sku": "a", "q": 1}, {"sku": "b"}], "ok": false}',
        "2026-01-05 01:02:03",
    ),
    ("order", "o-4", "noted", "plain text", "2026-01-05 01:02:04.999999"),
    ("customer", "c-2", "cleared", "", "2026-01-05 23:59:59.9995"),
    (
        "order",
        "o-5",
        "escaped",
        '{"s": "tab\\there\\u001f \\"q\\" /", "deep": {"x": [1, 2]}, "neg": -7.25E-5}',
        "2026-01-06 00:00:00",
    ),
]
# Additional placement, as a Debezium user writes it: both columns into headers.
PLACEMENT = "type:header:eventType,aggregatetype:header:aggType"


@dataclass(frozen=True)
class Message:
    """One Kafka message as a consumer sees it (either side of the comparison)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def compare_messages(debezium: list[Message], relay: list[Message], header_names: list[str]) -> list[str]:
    """Differences, message by message in order, between Debezium's output and the relay's:
    topic, key, value bytes, each header named in `header_names` (the relay adds its own
    identity headers, which Debezium lacks: those are not compared), record timestamp.
    Empty when they agree."""
    out = []
    if len(debezium) != len(relay):
        out.append(f"{len(debezium)} messages from Debezium, {len(relay)} from the relay")
    for n, (d, r) in enumerate(zip(debezium, relay)):
        for what, a, b in [
            ("topic", d.topic, r.topic),
            ("key", d.key, r.key),
            ("value", d.value, r.value),
            ("timestamp", d.timestamp_ms, r.timestamp_ms),
        ]:
            if a != b:
                out.append(f"message {n}: {what} differs: Debezium {a!r}, relay {b!r}")
        dh, rh = dict(d.headers), dict(r.headers)
        for name in header_names:
            if dh.get(name) != rh.get(name):
                out.append(f"message {n}: header {name!r} differs: Debezium {dh.get(name)!r}, relay {rh.get(name)!r}")
    return out


def as_messages(records: list[DebeziumRecord]) -> list[Message]:
    return [Message(r.topic, r.key, r.value, r.headers, r.timestamp_ms) for r in records]


@pytest.fixture(scope="module")
def dbz_server():
    """A Debezium-capable server (test device: --version=5.7.19-log)."""
    with debezium_mariadb(server_id=31) as db:
        yield db


def commit_outbox(db, rows: list[tuple], per_transaction: int) -> tuple:
    """`rows` (aggregatetype, aggregateid, type, payload, created_at) committed into a new
    database's outbox, `per_transaction` rows per transaction; (db, database, start file,
    start pos, ids)."""
    database = f"compat_{uuid.uuid4().hex[:6]}"
    db.create_database(database)
    with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    start = master_position(db)
    ids = [str(uuid.uuid4()) for _ in rows]
    with db.connect(database) as conn, conn.cursor() as cur:
        for n in range(0, len(rows), per_transaction):
            cur.executemany(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES (%s,%s,%s,%s,%s,%s)",
                [(i, *r) for i, r in zip(ids[n : n + per_transaction], rows[n : n + per_transaction])],
            )
            conn.commit()
    file, pos = start.split(":")
    return db, database, file, int(pos), ids


@pytest.fixture(scope="module")
def written(dbz_server):
    """The workload committed, one event per transaction; yields (db, database, start file,
    start pos, ids)."""
    return commit_outbox(dbz_server, WORKLOAD, 1)


CORPUS_SEED = int(os.environ.get("CDC_COMPAT_SEED") or random.SystemRandom().randrange(2**31))
CORPUS_GENERATED = 2000


@pytest.fixture(scope="module")
def corpus(dbz_server):
    """The fixed cases and CORPUS_GENERATED payloads from CORPUS_SEED, committed 100 per
    transaction; yields (written tuple, payloads)."""
    payloads = FIXED + CorpusGenerator(CORPUS_SEED).payloads(CORPUS_GENERATED)
    base = datetime(2026, 3, 1, tzinfo=UTC)
    rows = [
        (
            "corpus",
            f"k{n % 7}",
            "generated",
            p,
            (base + (n * 1013 + 7) * (datetime.resolution)).strftime("%Y-%m-%d %H:%M:%S.%f"),
        )
        for n, p in enumerate(payloads)
    ]
    print(
        f"\ncorpus: seed {CORPUS_SEED} (CDC_COMPAT_SEED={CORPUS_SEED} replays it), {len(FIXED)} fixed + "
        f"{CORPUS_GENERATED} generated payloads"
    )
    return commit_outbox(dbz_server, rows, 100), payloads


@pytest.fixture(scope="module")
def registry():
    with RegistryServer() as server:
        yield server


def collect(
    written,
    tmp_path,
    converter: str,
    prefix: str,
    registry_url: str | None = None,
    also: tuple[str, ...] = (),
    **router: str,
) -> list[DebeziumRecord]:
    """Debezium's records for the committed rows, routed to `<prefix>.outbox.event.<aggregatetype>`."""
    db, database, file, pos, ids = written
    name = f"compat-{converter}-{uuid.uuid4().hex[:4]}"
    work = tmp_path / name
    work.mkdir()
    seed_offsets(work / "offsets.dat", name, "compat", file, pos)
    props = debezium_properties(
        db,
        database,
        name,
        "compat",
        prefix + ".outbox.event.${routedByValue}",
        work,
        **{f"transforms.outbox.{k.replace('_', '.')}": v for k, v in router.items()},
    )
    dbz = DebeziumProcess(
        props, work, sink="file", value_converter=converter, registry_url=registry_url, also_converters=also
    )
    try:
        wait_until(lambda: dbz.produced() >= len(ids) or not dbz.alive(), 180, "Debezium's records")
        assert dbz.alive(), dbz.log_text()[-3000:]
    finally:
        dbz.kill()
    return read_collected(dbz.collected_path)


def relay_messages(
    written, kafka, tmp_path, prefix: str, registry_url: str | None = None, **table: object
) -> list[Message]:
    """The relay over the same binlog range with `table` settings, its messages read back
    from the stand-in (raw value and header bytes) in binlog order."""
    db, database, file, pos, ids = written
    topic = prefix + ".outbox.event.{aggregate_type}"
    raw = relay_raw_config(
        db,
        kafka,
        database,
        prefix,
        tmp_path / f"{prefix}-cp.json",
        source__start=f"{file}:{pos}",
        outbox={"tables": [{"schema": database, "table": "outbox", "topic": topic, **table}]},
    )
    if registry_url:
        raw["schema_registry"] = {"url": registry_url}
    relay = RelayThread(load_config(raw, env_for(db)), check=False)
    try:
        relay.wait_delivered(len(ids), timeout=120)
    finally:
        relay.stop()
    assert relay.metrics.dead_lettered_total == 0
    reader = KafkaTopicReader(kafka.bootstrap_servers)
    found = []
    try:
        for kind in sorted({w[0] for w in WORKLOAD} | {"corpus"}):
            name = f"{prefix}.outbox.event.{kind}"
            for partition in range(reader.partition_count(name) or 0):
                low, high = reader.watermarks(name, partition)
                for msg in reader.messages(name, partition, low, high):
                    headers = tuple((k, None if v is None else bytes(v)) for k, v in (msg.headers() or []))
                    h = dict(headers)
                    order = (h[H_FILE].decode(), int(h[H_POS]), int(h[H_ROW]))
                    found.append((order, Message(name, msg.key(), msg.value(), headers, msg.timestamp()[1])))
    finally:
        reader.close()
    return [m for _, m in sorted(found, key=lambda x: x[0])]


def header_names(records: list[DebeziumRecord]) -> list[str]:
    """Every header Debezium's router wrote (the engine's own `__debezium.context.*` are
    left out by the harness)."""
    return sorted({name for r in records for name, _ in r.headers})


def _ms(created: str) -> int:
    """created_at as Debezium's record time: epoch micros / 1000, truncated toward zero."""
    delta = datetime.fromisoformat(created).replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros // 1000 if micros >= 0 else -((-micros) // 1000)


def test_json_payload_with_headers_timestamp_and_tombstone(written, kafka, tmp_path):
    """JsonConverter (schemas off) + table.expand.json.payload: the payload re-serialised
    compactly (or, when its schema cannot be inferred, as a JSON string); `id`, `eventType`
    and `aggType` headers; record time from created_at; NULL -> `null`. Then the relay with
    format = "json" over the same binlog writes the same messages."""
    prefix = f"j{uuid.uuid4().hex[:6]}"
    records = collect(
        written,
        tmp_path,
        "json",
        prefix,
        table_expand_json_payload="true",
        table_fields_additional_placement=PLACEMENT,
        table_field_event_timestamp="created_at",
    )
    ids = written[4]
    assert [r.topic for r in records] == [f"{prefix}.outbox.event.{w[0]}" for w in WORKLOAD]
    assert [r.key for r in records] == [w[1].encode() for w in WORKLOAD]
    # Observed: a payload whose schema Debezium cannot infer (an array of mixed types) is
    # not expanded: it is emitted as a JSON *string* holding the text unchanged.
    assert [r.value for r in records[:4]] == [
        b'{"n":0,"items":[1,2]}',
        '{"name":"Zoë ✓"}'.encode(),
        json.dumps('{"a":{"b":[true,null,1.5]}}').encode(),
        b"null",
    ]
    assert [dict(r.headers)["id"] for r in records] == [i.encode() for i in ids]
    assert [dict(r.headers)["eventType"] for r in records] == [w[2].encode() for w in WORKLOAD]
    assert [r.timestamp_ms for r in records] == [_ms(w[4]) for w in WORKLOAD]
    # The comparison itself: equal to itself, and one changed byte, header or time is named.
    msgs = as_messages(records)
    assert compare_messages(msgs, msgs, ["id", "eventType"]) == []
    bad = [
        msgs[0],
        Message(msgs[1].topic, msgs[1].key, msgs[1].value + b" ", msgs[1].headers, msgs[1].timestamp_ms),
        Message(msgs[2].topic, msgs[2].key, msgs[2].value, (("id", b"x"),), msgs[2].timestamp_ms + 1),
    ] + msgs[3:]
    problems = compare_messages(msgs, bad, ["id", "eventType"])
    assert len(problems) == 4 and "message 1: value" in problems[0] and "header 'id'" in problems[2]

    # Observed: null members dropped, a missing member of an object in an array written as
    # null, doubles as Java's Double.toString, escapes as Jackson writes them.
    assert [r.value for r in records[4:]] == [
        b'{"price":39.98,"big":12345678901,"tiny":1.0E-4,"e":1.0E7,"lines":[{"sku":"a","q":1},{"sku":"b","q":null}],'
        b'"ok":false}',
        b'"plain text"',
        b'""',
        b'{"s":"tab\\there\\u001F \\"q\\" /","deep":{"x":[1,2]},"neg":-7.25E-5}',
    ]
    relay = relay_messages(
        written, kafka, tmp_path, prefix, format="json", additional_placement=PLACEMENT, timestamp_column="created_at"
    )
    assert header_names(records) == ["aggType", "eventType", "id"]
    assert compare_messages(msgs, relay, header_names(records)) == []


def test_string_payload_unchanged_and_tombstone_on_empty_payload(written, kafka, tmp_path):
    """StringConverter: the stored text unchanged; route.tombstone.on.empty.payload: a NULL
    or blank payload becomes a null value (a tombstone). The relay with format = "string"
    and tombstone_on_empty_payload writes the same messages."""
    prefix = f"s{uuid.uuid4().hex[:6]}"
    records = collect(
        written,
        tmp_path,
        "string",
        prefix,
        route_tombstone_on_empty_payload="true",
        table_fields_additional_placement=PLACEMENT,
        table_field_event_timestamp="created_at",
    )
    assert [r.value for r in records] == [w[3].encode() if w[3] else None for w in WORKLOAD]
    assert [r.key for r in records] == [w[1].encode() for w in WORKLOAD]
    assert all(set(dict(r.headers)) == {"id", "eventType", "aggType"} for r in records)
    assert all(json.loads(r.value) is not None for r in records[:3])

    relay = relay_messages(
        written,
        kafka,
        tmp_path,
        prefix,
        format="string",
        tombstone_on_empty_payload=True,
        additional_placement=PLACEMENT,
        timestamp_column="created_at",
    )
    assert compare_messages(as_messages(records), relay, header_names(records)) == []
    assert sum(m.value is None for m in relay) == 2  # the NULL and the blank payload


def test_avro_payload_through_one_registry(written, kafka, registry, tmp_path):
    """Confluent's AvroConverter: the payload as an Avro value in the wire format, its schema
    registered under `<topic>-value`; the relay with format = "avro", registering in the
    same registry, writes the same bytes (schema id included)."""
    prefix = f"a{uuid.uuid4().hex[:6]}"
    records = collect(
        written,
        tmp_path,
        "avro",
        prefix,
        registry_url=registry.url,
        table_fields_additional_placement=PLACEMENT,
        table_field_event_timestamp="created_at",
    )
    subjects = registry.subjects()
    assert set(subjects) == {f"{prefix}.outbox.event.{k}-value" for k in ("order", "customer")}, subjects
    assert all(r.value is None or r.value[:1] == b"\x00" for r in records)
    assert records[3].value is None  # a NULL payload: a null value

    relay = relay_messages(
        written,
        kafka,
        tmp_path,
        prefix,
        registry_url=registry.url,
        format="avro",
        additional_placement=PLACEMENT,
        timestamp_column="created_at",
    )
    assert compare_messages(as_messages(records), relay, header_names(records)) == []
    assert registry.subjects() == subjects  # the relay registered nothing Debezium had not


# ---------------------------------------------------------------- the generated corpus


def corpus_differences(debezium: list[Message], relay: list[Message], payloads: list, header: list[str]) -> list[str]:
    """`compare_messages`, each difference with the payload it came from."""
    out = []
    for line in compare_messages(debezium, relay, header):
        n = int(line.split(":")[0].split()[1]) if line.startswith("message ") else None
        out.append(line if n is None else f"{line} (payload {payloads[n]!r})")
    return out


def report(fmt: str, differences: list[str], count: int, started: float) -> None:
    print(
        f"corpus {fmt}: {count} messages, {len(differences)} differences, seed {CORPUS_SEED}, "
        f"{time.monotonic() - started:.1f} s"
    )
    for line in differences[:50]:
        print("  " + line)


def test_corpus_json_byte_for_byte(corpus, kafka, tmp_path):
    """The corpus through JsonConverter + table.expand.json.payload and through the relay
    with format = "json": every message's bytes equal (0 differences)."""
    started = time.monotonic()
    written, payloads = corpus
    prefix = f"cj{uuid.uuid4().hex[:6]}"
    records = collect(
        written, tmp_path, "json", prefix, table_expand_json_payload="true", table_field_event_timestamp="created_at"
    )
    failed = [f"payload {payloads[n]!r}: {r.failed}" for n, r in enumerate(records) if r.failed]
    assert not failed, f"Debezium's converter refused {len(failed)} corpus record(s): {failed[:5]}"
    relay = relay_messages(written, kafka, tmp_path, prefix, format="json", timestamp_column="created_at")
    differences = corpus_differences(as_messages(records), relay, payloads, header_names(records))
    report("json", differences, len(records), started)
    assert len(records) == len(payloads) and differences == []


def test_corpus_string_and_avro_byte_for_byte(corpus, kafka, registry, tmp_path):
    """The corpus through StringConverter and Confluent's AvroConverter (one Debezium run,
    both converters on each record) and through the relay with format = "string" and
    "avro": every message's bytes equal (0 differences)."""
    started = time.monotonic()
    written, payloads = corpus
    prefix = f"cs{uuid.uuid4().hex[:6]}"
    records = collect(
        written,
        tmp_path,
        "string",
        prefix,
        registry_url=registry.url,
        also=("avro",),
        table_field_event_timestamp="created_at",
    )
    assert len(records) == len(payloads)
    strings = as_messages(records)
    relay = relay_messages(written, kafka, tmp_path, prefix, format="string", timestamp_column="created_at")
    differences = corpus_differences(strings, relay, payloads, header_names(records))
    report("string", differences, len(records), started)
    assert differences == []

    # Avro: the same records' values through AvroConverter, the relay into other topics of
    # the same names' shape (its own prefix), registering in the same registry
    avro_prefix = f"ca{uuid.uuid4().hex[:6]}"
    avro = [
        Message(m.topic.replace(prefix, avro_prefix, 1), m.key, dict(r.also)["avro"], m.headers, m.timestamp_ms)
        for m, r in zip(strings, records)
    ]
    relay = relay_messages(
        written, kafka, tmp_path, avro_prefix, registry_url=registry.url, format="avro", timestamp_column="created_at"
    )
    differences = corpus_differences(avro, relay, payloads, header_names(records))
    report("avro", differences, len(records), started)
    assert differences == []
