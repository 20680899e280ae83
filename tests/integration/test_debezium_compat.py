"""Debezium compatibility (issue 14), the Debezium side: what Debezium 3.6's MySQL
connector + Outbox EventRouter emits for a workload, serialised by Kafka Connect's own
converters (tests/integration/debezium_harness.py), and `compare_messages`, the message-by-
message comparison (key, value bytes, the configured headers, topic, timestamp) that the
relay's Debezium-style output formats are held to.

The relay-side half (the same binlog through the relay with Debezium-style settings, then
`compare_messages` == []) needs the payload-as-value formats (issue 14, first half); until
they are in, these tests pin down Debezium's side of the contract, observed here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from debezium_harness import (
    DebeziumProcess, DebeziumRecord, debezium_mariadb, debezium_properties, read_collected, seed_offsets,
)
from harness import OUTBOX_DDL, master_position, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# (aggregatetype, aggregateid, type, payload, created_at): text and JSON payloads, non-ASCII,
# spaces a JSON re-serialisation removes, a NULL payload (the tombstone case).
WORKLOAD = [
    ("order", "o-1", "created", '{"n": 0, "items": [1, 2]}', "2026-01-02 03:04:05.123456"),
    ("order", "o-2", "paid", '{"name": "Zoë ✓"}', "2026-01-02 03:04:06.000001"),
    ("customer", "c-1", "renamed", '{"a":{"b":[true,null,1.5]}}', "2026-01-03 00:00:00.5"),
    ("order", "o-1", "deleted", None, "2026-01-04 12:00:00"),
]


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
        for what, a, b in [("topic", d.topic, r.topic), ("key", d.key, r.key), ("value", d.value, r.value),
                           ("timestamp", d.timestamp_ms, r.timestamp_ms)]:
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
def written():
    """A Debezium-capable server (test device: --version=5.7.19-log) with the workload
    committed, one event per transaction; yields (db, database, start file, start pos, ids)."""
    with debezium_mariadb(server_id=31) as db:
        database = f"compat_{uuid.uuid4().hex[:6]}"
        db.create_database(database)
        with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(OUTBOX_DDL.format(name="outbox"))
        start = master_position(db)
        ids = []
        with db.connect(database) as conn, conn.cursor() as cur:
            for aggregate_type, aggregate_id, type_, payload, created in WORKLOAD:
                event_id = str(uuid.uuid4())
                ids.append(event_id)
                cur.execute("INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) "
                            "VALUES (%s,%s,%s,%s,%s,%s)", (event_id, aggregate_type, aggregate_id, type_, payload,
                                                           created))
                conn.commit()
        file, pos = start.split(":")
        yield db, database, file, int(pos), ids


def collect(written, tmp_path, converter: str, **router: str) -> list[DebeziumRecord]:
    db, database, file, pos, ids = written
    name = f"compat-{converter}-{uuid.uuid4().hex[:4]}"
    work = tmp_path / name
    work.mkdir()
    seed_offsets(work / "offsets.dat", name, "compat", file, pos)
    props = debezium_properties(db, database, name, "compat", "outbox.event.${routedByValue}", work,
                                **{f"transforms.outbox.{k.replace('_', '.')}": v for k, v in router.items()})
    dbz = DebeziumProcess(props, work, sink="file", value_converter=converter)
    try:
        wait_until(lambda: dbz.produced() >= len(WORKLOAD) or not dbz.alive(), 120, "Debezium's records")
        assert dbz.alive(), dbz.log_text()[-3000:]
    finally:
        dbz.kill()
    return read_collected(dbz.collected_path)


def _ms(created: str) -> int:
    return int(datetime.fromisoformat(created).replace(tzinfo=timezone.utc).timestamp() * 1000)


def test_debezium_json_payload_with_headers_timestamp_and_tombstone(written, tmp_path):
    """JsonConverter (schemas off) + table.expand.json.payload: the payload re-serialised
    compactly (or, when its schema cannot be inferred, as a JSON string); `id` and `eventType` headers; record time from created_at; NULL -> `null`."""
    records = collect(written, tmp_path, "json", table_expand_json_payload="true",
                      table_fields_additional_placement="type:header:eventType",
                      table_field_event_timestamp="created_at")
    ids = written[4]
    assert [r.topic for r in records] == ["outbox.event.order", "outbox.event.order", "outbox.event.customer",
                                          "outbox.event.order"]
    assert [r.key for r in records] == [w[1].encode() for w in WORKLOAD]
    # Observed: a payload whose schema Debezium cannot infer (an array of mixed types) is
    # not expanded: it is emitted as a JSON *string* holding the text unchanged.
    assert [r.value for r in records] == [b'{"n":0,"items":[1,2]}', '{"name":"Zoë ✓"}'.encode(),
                                          json.dumps('{"a":{"b":[true,null,1.5]}}').encode(), b"null"]
    assert [dict(r.headers)["id"] for r in records] == [i.encode() for i in ids]
    assert [dict(r.headers)["eventType"] for r in records] == [w[2].encode() for w in WORKLOAD]
    assert [r.timestamp_ms for r in records] == [_ms(w[4]) for w in WORKLOAD]
    # The comparison itself: equal to itself, and one changed byte, header or time is named.
    msgs = as_messages(records)
    assert compare_messages(msgs, msgs, ["id", "eventType"]) == []
    bad = [msgs[0], Message(msgs[1].topic, msgs[1].key, msgs[1].value + b" ", msgs[1].headers, msgs[1].timestamp_ms),
           Message(msgs[2].topic, msgs[2].key, msgs[2].value, (("id", b"x"),), msgs[2].timestamp_ms + 1), msgs[3]]
    problems = compare_messages(msgs, bad, ["id", "eventType"])
    assert len(problems) == 4 and "message 1: value" in problems[0] and "header 'id'" in problems[2]


def test_debezium_string_payload_unchanged_and_tombstone_on_empty_payload(written, tmp_path):
    """StringConverter: the stored text unchanged; route.tombstone.on.empty.payload: a NULL
    payload becomes a null value (a tombstone)."""
    records = collect(written, tmp_path, "string", route_tombstone_on_empty_payload="true")
    assert [r.value for r in records] == [w[3].encode() if w[3] is not None else None for w in WORKLOAD]
    assert [r.key for r in records] == [w[1].encode() for w in WORKLOAD]
    assert all(set(dict(r.headers)) == {"id"} for r in records)
    assert all(json.loads(r.value) is not None for r in records[:3])
