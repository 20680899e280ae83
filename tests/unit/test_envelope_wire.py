"""The reader process's short way for the common envelope row (`CommittedTransaction.wire_items`,
`OutboxMapper.envelope_wire`, `ConfluentAvroSerializer.envelope_head` / `envelope_body`): each row's tuple is
the one the object path gives (`map`, then `cdc.assembly.feed.wire_of`: `prepare` and `to_wire`),
whatever the row holds, and the common row does not build an event on its way."""

from __future__ import annotations

import datetime as dt
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.assembly.feed import wire_of
from cdc.assembly.spill import SpillBuffer
from cdc.assembly.transaction import CommittedTransaction
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import OutboxMapper, OutboxTable, item_from_wire
from cdc.events.topics import TopicRouter
from cdc.position import BinlogPosition
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, envelope_payload, registry_client

_SERIALIZER = ConfluentAvroSerializer(registry_client("mock://test-envelope-wire"))
_TX = TxIdentity("s", BinlogPosition("mysql-bin.000001", 4), None, 1, 0)
_ENVELOPE = OutboxTable("db", "outbox")
_STAMPED = OutboxTable("db", "stamped", timestamp_column="created_at")
_JSON = OutboxTable("db", "json_outbox", format="json", additional_placement="type:header:eventType")
_TABLES = {(t.schema, t.table): t for t in (_ENVELOPE, _STAMPED, _JSON)}

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_FIELD = st.one_of(
    st.sampled_from(["order", "Order-1", "Created", "a b", "x" * 300]),  # a space, a topic too long: dead letters
    _TEXT,
    st.none(),
    st.binary(min_size=16, max_size=16),  # a BINARY(16) id: a UUID's text
    st.binary(max_size=8),
    st.integers(-5, 5),
)
_PAYLOAD = st.one_of(
    st.none(),
    _TEXT,
    st.binary(max_size=40),
    st.just("\ud800"),  # a lone surrogate cannot be UTF-8: an encoding_failed dead letter
    st.just("p" * 3000),  # larger than the small message limit below
    st.dictionaries(_TEXT, st.integers(), max_size=2),
    st.lists(st.binary(max_size=4), max_size=2),
    st.integers(),
)
_STAMP = st.one_of(
    st.none(),
    st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1)),
    st.integers(-(1 << 62), 1 << 62),
    st.just("not a time"),
)
_COLUMNS = ("id", "aggregatetype", "aggregateid", "type", "payload", "created_at")


@st.composite
def _rows(draw: Any) -> tuple[tuple[str, str], dict[str, Any] | str]:
    key = draw(st.sampled_from(sorted(_TABLES)))
    if draw(st.integers(0, 15)) == 0:
        return key, "INSERT INTO outbox VALUES (1)"  # a statement-logged write (on_statement = dead_letter)
    row = dict(zip(_COLUMNS, (draw(_FIELD), draw(_FIELD), draw(_FIELD), draw(_FIELD), draw(_PAYLOAD), draw(_STAMP))))
    common = {"id": "e-1", "aggregatetype": "order", "aggregateid": "o-1", "type": "Created"}
    for column in common:  # mostly the common shape, so that both paths are taken
        if draw(st.integers(0, 3)):
            row[column] = common[column]
    if draw(st.integers(0, 10)) == 0:
        del row[draw(st.sampled_from(_COLUMNS))]
    return key, row


def _transaction(rows: list, mapper: OutboxMapper) -> CommittedTransaction:
    held = SpillBuffer()
    for r in rows:
        held.append(r)
    return CommittedTransaction(_TX, BinlogPosition("mysql-bin.000001", 99), len(rows), held, mapper, _TABLES)


def _object_path(tx: CommittedTransaction, max_bytes: int) -> list[tuple]:
    return [wire_of(item, _SERIALIZER, max_bytes, True) for item in tx.items()]


def _short_way(tx: CommittedTransaction, max_bytes: int) -> list[tuple]:
    slow = lambda item: wire_of(item, _SERIALIZER, max_bytes, True)
    return list(tx.wire_items(_SERIALIZER, max_bytes, slow))


@settings(max_examples=300, deadline=None)
@given(st.lists(_rows(), min_size=1, max_size=12), st.sampled_from([1 << 20, 200]), st.booleans())
def test_each_rows_tuple_is_the_object_paths(rows, max_bytes, allowlisted):
    router = lambda: TopicRouter(("outbox.event.order*",) if allowlisted else ())
    tx_slow, tx_fast = _transaction(rows, OutboxMapper(router())), _transaction(rows, OutboxMapper(router()))
    slow, fast = _object_path(tx_slow, max_bytes), _short_way(tx_fast, max_bytes)
    assert fast == slow
    # and what crosses the pipe reads back the same on the relay's side
    assert pickle.loads(pickle.dumps(fast)) == slow
    back = [item_from_wire(wire, EventIdentity(_TX, row), envelope_payload) for row, wire in enumerate(fast)]
    assert back == [item_from_wire(wire, EventIdentity(_TX, row), envelope_payload) for row, wire in enumerate(slow)]


def test_the_common_row_builds_no_event(monkeypatch: pytest.MonkeyPatch):
    mapper = OutboxMapper(TopicRouter())
    stamp = dt.datetime(2026, 11, 27, 1, 2, 3, 456789)
    row = {"id": "e-1", "aggregatetype": "order", "aggregateid": "o-1", "type": "Created", "payload": "{}"}
    rows = [(("db", "outbox"), row), (("db", "stamped"), {**row, "created_at": stamp})]
    expected = _object_path(_transaction(rows, OutboxMapper(TopicRouter())), 1 << 20)

    def no_map(*_args: Any) -> Any:
        raise AssertionError("the common envelope row went through OutboxMapper.map")

    monkeypatch.setattr(mapper, "map", no_map)
    tx = _transaction(rows, mapper)
    got = list(tx.wire_items(_SERIALIZER, 1 << 20, no_map))
    assert got == expected
    assert [w[0] for w in got] == [2, 2] and got[1][6] is not None and got[0][6] is None


def test_without_an_envelope_encoder_every_row_takes_the_object_path():
    row = {"id": "e-1", "aggregatetype": "order", "aggregateid": "o-1", "type": "Created", "payload": "{}"}
    rows = [(("db", "outbox"), row)]
    seen: list[Any] = []

    def slow(item: Any) -> tuple:
        seen.append(item)
        return wire_of(item, _SERIALIZER, 1 << 20, False)

    got = list(_transaction(rows, OutboxMapper(TopicRouter())).wire_items(None, 1 << 20, slow))
    assert len(seen) == 1 and got[0][0] == 0 and got[0][5] == "{}"  # the payload crosses: no value holds it


def test_a_row_that_is_a_dead_letter_registers_no_schema():
    # the object path never encodes a dead letter's row, so never asks the registry for its
    # topic; the short way asks for a topic's header only once a row is on its way there
    asked: list[str] = []

    class Counting(ConfluentAvroSerializer):
        def envelope_head(self, topic: str) -> bytes:
            asked.append(topic)
            return super().envelope_head(topic)

    serializer = Counting(registry_client("mock://test-envelope-wire-dead"))
    row = {"id": None, "aggregatetype": "lonely", "aggregateid": "o-1", "type": "Created", "payload": "{}"}
    slow = lambda item: wire_of(item, serializer, 1 << 20, True)
    got = list(
        _transaction([(("db", "outbox"), row)], OutboxMapper(TopicRouter())).wire_items(serializer, 1 << 20, slow)
    )
    assert got[0][0] == 1 and got[0][1] == "null_column" and asked == []
