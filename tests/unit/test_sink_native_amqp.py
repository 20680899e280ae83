"""The RabbitMQ Streams sink's C encoder of a message's own part (`amqp_record_tail` of
connectors/sink_native.c): the same bytes as the Python way and the general encoder on
generated records, and None (the Python way) for what it does not take, without an error.
Which build is loaded: tests/unit/test_sink_native.py."""

import random

import pytest

from cdc.events.sink_fields import H_KEY, H_NULL_VALUE, message_properties
from connectors import sink_native
from connectors.rabbitmq import amqp_message

native = pytest.mark.skipif(
    not sink_native.COMPILED, reason="no current build (tests/unit/test_sink_native.py says why)"
)


_NAMES = ["cdc.source", "cdc.row", "cdc.event_id", "cdc.table", "id", "é", "h" * 300, H_KEY, H_NULL_VALUE, ""]
_VALUES = [b"", b"4", b"shop", b"x" * 300, "é-ü".encode(), b"\xfe\xff", None, b"e-" * 20]


def _record(rng: random.Random) -> tuple:
    tx = [("cdc.source", b"shop"), ("cdc.server_id", b"1"), ("cdc.binlog.file", b"mysql-bin.000002")]
    if rng.random() < 0.2:
        tx.append((rng.choice(_NAMES), rng.choice(_VALUES)))
    own = [("cdc.row", str(rng.randrange(2000)).encode()), ("cdc.event_id", b"%032x" % rng.getrandbits(128))]
    own += [("cdc.event_type", b"OrderCreated"), ("cdc.table", b"outbox")]
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # an unusual name or value among a message's own
        own[rng.randrange(4)] = (rng.choice(_NAMES), rng.choice(_VALUES))
    key = rng.choice([b"order-%d" % rng.randrange(100), None, "ключ".encode(), b"\xffk", b""])
    value = rng.choice([b"\x00avro" * rng.randrange(5), None, b"v" * 70_000, b""])
    ts = rng.choice([1_700_000_000_123, 0, -1, 2**63 - 1, -(2**63), rng.getrandbits(40)])
    return key, tx + own, value, ts


def test_generated_records_encode_as_the_general_encoder_and_the_python_way_make_them(monkeypatch):
    rng = random.Random(20261130)
    records = [_record(rng) for _ in range(3000)]
    made = [amqp_message.encode_record(k, h, v, ts) for k, h, v, ts in records]
    monkeypatch.setattr(amqp_message, "_ENCODE_TAIL", None)
    python_way = [amqp_message.encode_record(k, h, v, ts) for k, h, v, ts in records]
    for (k, h, v, ts), a, b in zip(records, made, python_way):
        assert a == b == amqp_message.encode(message_properties(k, h, v), v or b"", ts), (k, h, v, ts)


@native
def test_the_c_encoder_takes_the_relays_records_and_leaves_the_rest_to_python():
    encode = sink_native.AMQP_RECORD_TAIL
    assert encode is not None
    rng = random.Random(7)
    taken = 0
    for _ in range(3000):
        key, headers, value, ts = _record(rng)
        amqp_message.encode_record(key, headers, value, ts)  # the caches: prefix and names
        prefix = amqp_message._prefixes.get(tuple(headers[:-4]))
        if prefix is None:
            continue
        args = (prefix.block, prefix.count, prefix.closed, headers, len(headers) - 4, key, value, ts)
        out = encode(*args, amqp_message._names, amqp_message._KEY_NAME, amqp_message._NULL_NAME)
        plain = all(x is None or x.isascii() for x in (key, *(raw for _, raw in headers[-4:])))
        names = [n for n, raw in headers[-4:] if raw is not None]
        usual = plain and len(set(names)) == len(names) and not set(names) & prefix.closed
        assert (out is not None) == usual, (key, headers)
        if out is not None:
            taken += 1
            assert out == amqp_message.encode(message_properties(key, headers, value), value or b"", ts)
    assert taken > 1000, taken  # a third and more: 2 keys in 5 and some headers are not ASCII


@native
@pytest.mark.parametrize(
    "change",
    [
        {3: ("not", "a list")},
        {3: [("cdc.row", b"1", "three")]},
        {3: [(b"bytes name", b"1")]},
        {3: [("cdc.row", "text value")]},
        {3: [["cdc.row", b"1"]]},
        {4: 5},  # cut past the end
        {4: -1},
        {5: "text key"},
        {6: bytearray(b"v")},
        {7: 2**63},  # past a signed 64-bit integer: struct raises that, the Python way
        {7: "1"},
        {0: "block"},
        {8: {}},  # a name it has not made
        {2: ["cdc.row"]},
    ],
)
def test_whatever_the_c_encoder_does_not_take_is_none_and_no_error(change):
    encode = sink_native.AMQP_RECORD_TAIL
    assert encode is not None
    amqp_message.encode_record(b"k", [("a", b"1"), ("cdc.row", b"1"), ("b", b"2"), ("c", b"3"), ("d", b"4")], b"v", 1)
    args = [b"", 0, frozenset(), [("cdc.row", b"1")], 0, b"k", b"v", 1, amqp_message._names]
    args += [amqp_message._KEY_NAME, amqp_message._NULL_NAME]
    assert encode(*args) is not None
    for i, v in change.items():
        args[i] = v
    assert encode(*args) is None
    with pytest.raises(TypeError):
        encode(*args[:5])
