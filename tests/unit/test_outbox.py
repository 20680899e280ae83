"""Outbox mapping: row -> OutboxEvent, or a DeadLetter with its cause."""

import datetime as dt
import json
import uuid

import pytest

from cdc.errors import ConfigError
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import DeadLetter, OutboxEvent, OutboxMapper, OutboxTable, text_of
from cdc.events.topics import TopicRouter
from cdc.position import BinlogPosition

IDENTITY = EventIdentity(TxIdentity("src", BinlogPosition("mysql-bin.000001", 4), None, 1, 1000), 0)


def row(**over):
    base = {"id": "e1", "aggregatetype": "order", "aggregateid": "42", "type": "created", "payload": '{"a":1}'}
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def mapper(allowlist=()):
    return OutboxMapper(TopicRouter(allowlist))


TABLE = OutboxTable("shop", "outbox")


def test_debezium_default_columns_and_topic():
    t = OutboxTable("shop", "outbox")
    assert (t.id_column, t.aggregate_type_column, t.aggregate_id_column, t.type_column, t.payload_column) == (
        "id",
        "aggregatetype",
        "aggregateid",
        "type",
        "payload",
    )
    assert t.topic == "outbox.event.{aggregate_type}"
    assert t.qualified_name == "shop.outbox"
    assert t.required_columns == ("id", "aggregatetype", "aggregateid", "type")
    assert t.expected_columns == ("id", "aggregatetype", "aggregateid", "type", "payload")
    assert OutboxTable("s", "t", timestamp_column="ts").expected_columns[-1] == "ts"


def test_table_with_unknown_template_field_is_refused_at_config_time():
    with pytest.raises(ConfigError):
        OutboxTable("shop", "outbox", topic="outbox.{tenant}")


def test_row_maps_to_event():
    ev = mapper().map(TABLE, row(), IDENTITY)
    assert isinstance(ev, OutboxEvent)
    assert (ev.event_id, ev.aggregate_type, ev.aggregate_id, ev.event_type) == ("e1", "order", "42", "created")
    assert ev.payload == '{"a":1}'
    assert ev.topic == "outbox.event.order"
    assert ev.table == "shop.outbox"
    assert ev.identity == IDENTITY
    assert ev.timestamp_us is None


def test_one_mapper_names_each_tables_events_after_their_table():
    # the mapper keeps each table's qualified name by the table's identity
    m, tables = mapper(), [OutboxTable("shop", "outbox"), OutboxTable("shop", "outbox2"), OutboxTable("b", "outbox")]
    for _ in range(2):
        assert [m.map(t, row(), IDENTITY).table for t in tables] == ["shop.outbox", "shop.outbox2", "b.outbox"]


def test_custom_columns_and_template():
    t = OutboxTable(
        "app",
        "events",
        id_column="event_id",
        aggregate_type_column="agg",
        aggregate_id_column="agg_id",
        type_column="kind",
        payload_column="body",
        topic="{schema}.{table}.{type}",
    )
    ev = mapper().map(t, {"event_id": 7, "agg": "a", "agg_id": 9, "kind": "made", "body": "b"}, IDENTITY)
    assert isinstance(ev, OutboxEvent)
    assert ev.topic == "app.events.made" and ev.event_id == "7" and ev.aggregate_id == "9" and ev.payload == "b"


@pytest.mark.parametrize("missing", ["id", "aggregatetype", "aggregateid", "type"])
def test_missing_required_column_is_a_missing_column_dead_letter(missing):
    r = row(**{missing: ...})
    dead = mapper().map(TABLE, r, IDENTITY)
    assert isinstance(dead, DeadLetter)
    assert dead.cause == "missing_column"
    assert repr(missing) in dead.error and "binlog_row_metadata=FULL" in dead.error
    assert dead.row == r and dead.table == "shop.outbox" and dead.identity == IDENTITY


def test_unknown_col_names_from_a_server_without_full_metadata_dead_letter():
    dead = mapper().map(TABLE, {"UNKNOWN_COL0": "e1", "UNKNOWN_COL1": "order"}, IDENTITY)
    assert isinstance(dead, DeadLetter) and dead.cause == "missing_column"


@pytest.mark.parametrize("column", ["id", "aggregatetype", "aggregateid", "type"])
def test_null_required_column_is_a_null_column_dead_letter(column):
    dead = mapper().map(TABLE, row(**{column: None}), IDENTITY)
    assert isinstance(dead, DeadLetter)
    assert dead.cause == "null_column" and repr(column) in dead.error


def test_dead_letter_keeps_the_aggregate_id_as_key():
    dead = mapper().map(TABLE, row(type=None, aggregateid=77), IDENTITY)
    assert dead.key == "77"
    assert mapper().map(TABLE, row(aggregateid=None), IDENTITY).key is None


def test_null_payload_is_allowed():
    ev = mapper().map(TABLE, row(payload=None), IDENTITY)
    assert isinstance(ev, OutboxEvent) and ev.payload is None
    ev = mapper().map(TABLE, row(payload=...), IDENTITY)
    assert isinstance(ev, OutboxEvent) and ev.payload is None


def test_illegal_topic_is_a_dead_letter_with_the_intended_topic():
    dead = mapper().map(TABLE, row(aggregatetype="bad type/x"), IDENTITY)
    assert isinstance(dead, DeadLetter)
    assert dead.cause == "illegal_topic"
    assert dead.intended_topic == "outbox.event.bad type/x"
    assert dead.key == "42"


def test_too_long_topic_is_an_illegal_topic_dead_letter():
    dead = mapper().map(TABLE, row(aggregatetype="a" * 300), IDENTITY)
    assert isinstance(dead, DeadLetter) and dead.cause == "illegal_topic" and "249" in dead.error


def test_allowlist_gives_topic_not_allowed():
    dead = mapper(allowlist=("outbox.event.user",)).map(TABLE, row(), IDENTITY)
    assert isinstance(dead, DeadLetter)
    assert dead.cause == "topic_not_allowed" and dead.intended_topic == "outbox.event.order"
    assert isinstance(mapper(allowlist=("outbox.event.*",)).map(TABLE, row(), IDENTITY), OutboxEvent)


def test_binary16_id_becomes_uuid_text():
    u = uuid.UUID("0b5d3c8e-8f0f-4f5e-9a4e-2f1b7c6d5e4f")
    ev = mapper().map(TABLE, row(id=u.bytes, aggregateid=u.bytes), IDENTITY)
    assert ev.event_id == "0b5d3c8e-8f0f-4f5e-9a4e-2f1b7c6d5e4f"
    assert ev.aggregate_id == str(u)
    assert text_of(b"abc") == "abc"
    assert text_of(12) == "12"


def test_dict_and_list_payload_become_json_text():
    ev = mapper().map(TABLE, row(payload={"b": [1, 2], "a": "x"}), IDENTITY)
    assert isinstance(ev.payload, str)
    assert json.loads(ev.payload) == {"b": [1, 2], "a": "x"}
    ev = mapper().map(TABLE, row(payload=[1, {"z": None}]), IDENTITY)
    assert json.loads(ev.payload) == [1, {"z": None}]


def test_bytes_payload_stays_bytes_even_when_16_bytes_long():
    ev = mapper().map(TABLE, row(payload=b"\x00\xffbinary"), IDENTITY)
    assert ev.payload == b"\x00\xffbinary"
    sixteen = bytes(range(16))
    assert mapper().map(TABLE, row(payload=sixteen), IDENTITY).payload == sixteen


def test_text_payload_stays_text():
    assert mapper().map(TABLE, row(payload="plain"), IDENTITY).payload == "plain"


def test_timestamp_column_to_microseconds():
    t = OutboxTable("shop", "outbox", timestamp_column="ts")
    when = dt.datetime(2024, 1, 2, 3, 4, 5, 678901)
    ev = mapper().map(t, row(ts=when), IDENTITY)
    assert ev.timestamp_us == int(when.replace(tzinfo=dt.UTC).timestamp() * 1_000_000)
    assert mapper().map(t, row(ts=None), IDENTITY).timestamp_us is None
