"""The RabbitMQ Streams sink's optional C encoder of a message's own part
(connectors/rabbitmq/amqp_record.c, amqp_record_native.py, tools/build_native.py amqp_record): the
same bytes as the Python way on generated records, None (the Python way) for what it does not
take, which build is loaded, that a build of another version of the source is never used,
and the build step without a C compiler in one line."""

import random
import sys
import sysconfig
import types
from pathlib import Path

import pytest

from cdc.events.sink_fields import H_KEY, H_NULL_VALUE, message_properties
from connectors.rabbitmq import amqp_message, amqp_record_native
from connectors.rabbitmq.amqp_record_native import COMPILED_NAME, SOURCE, compiled_encoder, source_digest

ROOT = Path(__file__).resolve().parents[2]
BUILT = list(SOURCE.parent.glob("_amqp_record" + sysconfig.get_config_var("EXT_SUFFIX")))
native = pytest.mark.skipif(
    not amqp_record_native.COMPILED, reason="no current build for this interpreter (the test above says why)"
)


def test_the_loaded_encoder_is_the_c_build_exactly_when_one_is_current():
    """`./run.sh setup` builds it where gcc is, for .venv's interpreter, and tools/unit_tiers.sh
    for 3.12 and 3.13: a current build for the test's interpreter must be loaded."""
    where = f"loaded {amqp_record_native.ENCODE_TAIL} (built here: {[p.name for p in BUILT]})"
    assert amqp_message._ENCODE_TAIL is amqp_record_native.ENCODE_TAIL, where
    if BUILT and source_digest() == getattr(sys.modules.get(COMPILED_NAME), "BUILT_FROM", None):
        assert amqp_record_native.COMPILED, where
    if amqp_record_native.COMPILED:
        assert type(amqp_record_native.ENCODE_TAIL) is types.BuiltinFunctionType, where
    else:
        assert compiled_encoder() is None, where


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
    encode = amqp_record_native.ENCODE_TAIL
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
    encode = amqp_record_native.ENCODE_TAIL
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


def test_a_build_of_another_version_of_the_source_is_not_used(tmp_path, monkeypatch):
    edited = tmp_path / "amqp_record.c"
    edited.write_bytes(SOURCE.read_bytes() + b"\n/* edited after the build */\n")
    current = types.ModuleType(COMPILED_NAME)
    current.BUILT_FROM = source_digest()  # type: ignore[attr-defined]
    current.encode_tail = print  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, COMPILED_NAME, current)
    assert compiled_encoder(SOURCE) is print
    assert compiled_encoder(edited) is None


def test_a_missing_build_leaves_the_python_way(monkeypatch):
    monkeypatch.setitem(sys.modules, COMPILED_NAME, None)  # import raises ImportError
    assert compiled_encoder() is None
