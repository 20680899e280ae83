"""Issue 14, output formats against the real servers: one relay over five outbox tables,
one per format (string, json, bytes, avro, and the default envelope), into the Kafka
stand-in. Each message's key, value bytes, headers and timestamp are what Debezium's
EventRouter writes (expected bytes written out here from its observed output, not from our
encoder); the identity headers are on every message; `cdc verify` is clean over all five, and a copy of the topics with one payload altered in
each format is caught, each as `altered` (payload)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from confluent_kafka import Producer

from cdc.config import load_config
from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE
from cdc_cli.verify_commands import verify_config
from tests.integration.harness import RelayThread, env_for, read_topic, relay_raw_config

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

DDL = """CREATE TABLE {name} (
    id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
    type VARCHAR(255) NOT NULL, payload LONGTEXT, tenant VARCHAR(64), traceparent VARCHAR(64),
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CREATED = dt.datetime(2024, 5, 3, 10, 11, 12, 345678)
CREATED_MS = 1714731072345  # 2024-05-03T10:11:12.345678Z in ms, truncated

PAYLOADS = [
    '{"n": 0}',
    '{"name": "Zo\u00eb", "tags": ["a", "b"], "price": 39.98, "gone": null}',
    None,
    "",
    "plain text",
]
# What Debezium 3.6.3's EventRouter + converter write for each payload above.
EXPECTED = {
    # StringConverter: the text unchanged; NULL -> null value; with route.tombstone.on.empty.payload, "" -> null
    "string": [b'{"n": 0}', PAYLOADS[1].encode(), None, None, b"plain text"],
    # JsonConverter (schemas.enable=false) after table.expand.json.payload=true
    "json": [
        b'{"n":0}',
        '{"name":"Zo\u00eb","tags":["a","b"],"price":39.98}'.encode(),
        b"null",
        b'""',
        b'"plain text"',
    ],
    "bytes": [b'{"n": 0}', PAYLOADS[1].encode(), None, b"", b"plain text"],
}
TABLES = {
    "outbox_s": {
        "format": "string",
        "tombstone_on_empty_payload": True,
        "timestamp_column": "created_at",
        "additional_placement": "type:header:eventType,tenant:header",
        "traceparent_column": "traceparent",
    },
    "outbox_j": {"format": "json", "timestamp_column": "created_at", "additional_placement": "type:header:eventType"},
    "outbox_b": {"format": "bytes"},
    "outbox_a": {"format": "avro", "additional_placement": "type:header:eventType"},
    "outbox_e": {},
}


def _insert(db, database: str) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    with db.connect(database=database) as conn, conn.cursor() as cur:
        for table in TABLES:
            cur.execute(DDL.format(name=table))
        conn.commit()
        for table in TABLES:
            ids[table] = []
            for i, payload in enumerate(PAYLOADS):
                event_id = str(uuid.uuid4())
                ids[table].append(event_id)
                cur.execute(
                    f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload, tenant, traceparent,"
                    " created_at) VALUES (%s, 'order', %s, 'OrderCreated', %s, 'acme', %s, %s)",
                    (event_id, f"k{i % 2}", payload, TRACEPARENT, CREATED),
                )
            conn.commit()
    return ids


def _copy(bootstrap: str, records, prefix: str, new_prefix: str, alter: set[str]) -> None:
    """The records into topics named with `new_prefix`, same partition, key, headers and
    timestamp; the value of each record whose id header is in `alter` changed."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for r in records:
        value = None if r.value_was_null else r.raw_value
        if r.headers.get("id") in alter:
            value = _altered(r)
        producer.produce(
            new_prefix + r.topic[len(prefix) :],
            value,
            r.key.encode() if r.key else None,
            partition=r.partition,
            headers=list(r.headers.items()),
            timestamp=r.timestamp_ms,
        )
    assert producer.flush(30) == 0


def test_each_format_writes_debeziums_bytes_and_verifies(mariadb, kafka, database, topic_prefix, tmp_path, spark):
    from spark_jobs.verify import run_verify

    tables = [
        {"schema": database, "table": t, "topic": topic_prefix + ".{table}.{aggregate_type}", **extra}
        for t, extra in TABLES.items()
    ]
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", outbox={"tables": tables})
    cfg = load_config(raw, env_for(mariadb))
    ids = _insert(mariadb, database)
    total = len(TABLES) * len(PAYLOADS)
    relay = RelayThread(cfg, check=False)
    relay.wait_delivered(total, timeout=90)
    relay.stop()

    by_id = {}
    for table in TABLES:
        for r in read_topic(kafka.bootstrap_servers, f"{topic_prefix}.{table}.order"):
            by_id[r.headers["id"]] = r
    assert len(by_id) == total
    for table, settings in TABLES.items():
        fmt = settings.get("format", "envelope")
        for i, event_id in enumerate(ids[table]):
            r = by_id[event_id]
            assert r.key == f"k{i % 2}", (table, i)
            # the identity headers, on every message in every format
            assert {H_SOURCE, H_FILE, H_POS, H_ROW} <= set(r.headers), (table, r.headers)
            if fmt == "envelope":
                assert "cdc.format" not in r.headers and r.value["payload"] == PAYLOADS[i]
                continue
            assert r.headers["cdc.format"] == fmt
            if fmt == "avro":
                # ["null","string"]: branch 1 (0x02), zig-zag length, the UTF-8 text; NULL -> null value
                want = (
                    None
                    if PAYLOADS[i] is None
                    else (b"\x02" + _zigzag(len(PAYLOADS[i].encode())) + PAYLOADS[i].encode())
                )
                assert (None if r.value_was_null else r.raw_value[5:]) == want, (table, i)
                assert r.value_was_null or r.raw_value[0] == 0
            else:
                assert (None if r.value_was_null else r.raw_value) == EXPECTED[fmt][i], (table, i)
            if "type:header:eventType" in settings.get("additional_placement", ""):
                assert r.headers["eventType"] == "OrderCreated"
            if table == "outbox_s":
                assert r.headers["tenant"] == "acme" and r.headers["traceparent"] == TRACEPARENT
            if settings.get("timestamp_column"):
                assert r.timestamp_ms == CREATED_MS, (table, i)
            else:  # the commit time (header cdc.commit.ts)
                assert r.timestamp_ms == int(r.headers["cdc.commit.ts"]), (table, i)

    vcfg = verify_config(cfg, str(tmp_path / "verify"), "local[2]", None, None)
    rep = run_verify(vcfg, spark=spark)
    assert rep.ok, rep.summary_text()
    assert rep.counts["delivered"] == total and rep.counts["altered"] == 0, rep.summary_text()

    # The same records copied with one payload altered per format: each is caught.
    altered = {ids[t][1] for t in TABLES}
    copy_prefix = topic_prefix + "x"
    for table in TABLES:
        kafka.create_topic(f"{copy_prefix}.{table}.order", _partitions(kafka, f"{topic_prefix}.{table}.order"))
    _copy(kafka.bootstrap_servers, list(by_id.values()), topic_prefix, copy_prefix, altered)
    tables2 = [{**t, "topic": copy_prefix + ".{table}.{aggregate_type}"} for t in tables]
    raw2 = relay_raw_config(mariadb, kafka, database, copy_prefix, tmp_path / "cp2.json", outbox={"tables": tables2})
    raw2["source"]["name"] = raw["source"]["name"]
    raw2["kafka"]["dead_letter_topic"] = raw["kafka"]["dead_letter_topic"]
    cfg2 = load_config(raw2, env_for(mariadb))
    rep = run_verify(verify_config(cfg2, str(tmp_path / "verify2"), "local[2]", None, None), spark=spark)
    assert not rep.ok
    assert rep.counts["altered"] == len(TABLES) and rep.counts["delivered"] == total - len(TABLES), rep.summary_text()
    assert rep.summary["altered_reasons"] == {"payload": len(TABLES)}, rep.summary


def _altered(r) -> bytes:
    """The record's value, still well-formed in its format, with a payload that is not the
    one written (one more space)."""
    fmt = r.headers.get("cdc.format")
    if fmt is None:  # the envelope: the Avro record with another payload
        import io

        import fastavro

        from connectors.schema_registry.avro_schemas import schema

        record = dict(r.value, payload=(r.value["payload"] or "") + " ")
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema()), record)
        return r.raw_value[:5] + out.getvalue()
    if fmt == "avro":  # ["null","string"]: branch 1, then the longer text
        n = r.raw_value[6] >> 1  # short payloads: a one-byte length
        text = r.raw_value[7 : 7 + n] + b" "
        return r.raw_value[:5] + b"\x02" + _zigzag(len(text)) + text
    return r.raw_value + b" "


def _zigzag(n: int) -> bytes:
    n <<= 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _partitions(kafka, topic: str) -> int:
    from connectors.kafka.reader import KafkaTopicReader

    reader = KafkaTopicReader(kafka.bootstrap_servers)
    try:
        return reader.partition_count(topic) or 1
    finally:
        reader.close()


def test_an_event_time_at_the_epochs_first_millisecond_is_the_commit_time(
    mariadb, kafka, database, topic_prefix, tmp_path, spark
):
    """A `timestamp_column` whose epoch milliseconds are 0 (1970-01-01 00:00:00.000xxx UTC,
    or the last millisecond before it, truncated toward zero) cannot be a Kafka record's
    timestamp through librdkafka, which reads 0 as "stamp it now" (the produce time, a
    value the row never held). The relay takes it as no event time, as for NULL: the record
    timestamp is the commit time; the payload keeps the value; `cdc verify` expects the same."""
    from spark_jobs.verify import run_verify

    table = {"schema": database, "table": "outbox_t", "topic": topic_prefix + ".{aggregate_type}", "format": "json",
             "timestamp_column": "created_at"}  # fmt: skip
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", outbox={"tables": [table]})
    cfg = load_config(raw, env_for(mariadb))
    stamps = [
        (dt.datetime(1970, 1, 1), None),
        (dt.datetime(1970, 1, 1, 0, 0, 0, 999), None),
        (dt.datetime(1969, 12, 31, 23, 59, 59, 999_500), None),  # -500 us: 0 ms, toward zero
        (dt.datetime(1970, 1, 1, 0, 0, 0, 1000), 1),
        (CREATED, CREATED_MS),
    ]
    with mariadb.connect(database=database) as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(DDL.format(name="outbox_t"))
        for stamp, _ms in stamps:
            cur.execute(
                "INSERT INTO outbox_t (id, aggregatetype, aggregateid, type, payload, created_at)"
                " VALUES (%s, 'order', 'k', 'OrderCreated', '{}', %s)",
                (str(uuid.uuid4()), stamp),
            )
        conn.commit()
    relay = RelayThread(cfg, check=False)
    relay.wait_delivered(len(stamps), timeout=90)
    relay.stop()
    records = read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")
    assert [r.timestamp_ms for r in records] == [
        int(r.headers["cdc.commit.ts"]) if ms is None else ms for r, (_s, ms) in zip(records, stamps, strict=True)
    ]
    rep = run_verify(verify_config(cfg, str(tmp_path / "verify"), "local[2]", None, None), spark=spark)
    assert rep.ok and rep.counts["delivered"] == len(stamps), rep.summary_text()
