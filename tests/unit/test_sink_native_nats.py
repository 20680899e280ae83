"""The NATS sink's C maker of a message's own header lines (`nats_header_tail` of
connectors/sink_native.c): the same bytes as the Python way and the general way on generated
records, and None (the Python way) for what it does not take, without an error. Which build
is loaded: tests/unit/test_sink_native.py."""

import random

import pytest

from cdc.events.identity import (
    H_COMMIT_TS,
    H_EVENT_ID,
    H_FILE,
    H_GTID,
    H_POS,
    H_REPAIR,
    H_ROW,
    H_SERVER_ID,
    H_SOURCE,
    H_TABLE,
)
from connectors import sink_native
from connectors.nats import sink

native = pytest.mark.skipif(
    not sink_native.COMPILED, reason="no current build (tests/unit/test_sink_native.py says why)"
)


_ODD_NAMES = [H_GTID, "id", H_SOURCE, "cdc.key", "cdc.timestamp", H_REPAIR, H_ROW, " ", " z ", "é", ""]
_ODD_VALUES = [b"again", None, b"a\r\nb ", b"\xff\xfe", b"  padded  ", "é".encode(), b"", b"\x1cx", b"x\x0b", b"1"]
_ROWS = [b"0", b"7", b"007", b"1234567890123456789", b"+5", b"-1", b"1_0", b" 3", b"x", b""]
_TOPICS = ["shop.order", "", " lead", "é.t", "a\rb", "t|x"]


def _record(rng: random.Random) -> tuple:
    tx = [(H_SOURCE, b"shop"), (H_SERVER_ID, b"1"), (H_FILE, b"bin.000002"), (H_POS, b"4711"), (H_COMMIT_TS, b"17")]
    if rng.random() < 0.15:
        tx.insert(rng.randrange(len(tx) + 1), (rng.choice(_ODD_NAMES), rng.choice(_ODD_VALUES)))
    row = rng.choice(_ROWS) if rng.random() < 0.3 else b"%d" % rng.randrange(5000)
    own = [(H_ROW, row), (H_EVENT_ID, b"%032x" % rng.getrandbits(128)), ("cdc.event.type", b"Created")]
    own.append((H_TABLE, b"s.outbox"))
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        own[rng.randrange(4)] = (rng.choice(_ODD_NAMES), rng.choice(_ODD_VALUES))
    key = rng.choice([b"order-%d" % rng.randrange(100), None, b" k\n", "ключ".encode(), b"\xffk", b""])
    value = rng.choice([b"v", None, b""])
    ts = rng.choice([None, 1_700_000_000_123, 0, -1, 2**63 - 1, -(2**63), 2**64, True])
    topic = rng.choice(_TOPICS) if rng.random() < 0.2 else "shop.order"
    return topic, key, value, tx + own, ts


def _general(topic, key, value, headers, ts):
    try:
        return sink.header_block(sink.nats_headers(topic, key, value, headers, ts), end=False)
    except ValueError as exc:
        return ("ValueError", str(exc))


def _made(topic, key, value, headers, ts):
    try:
        return sink.message_header_block(topic, key, value, headers, ts)
    except ValueError as exc:
        return ("ValueError", str(exc))


def test_generated_records_make_the_general_ways_bytes_with_c_and_without(monkeypatch):
    rng = random.Random(20261130)
    records = [_record(rng) for _ in range(3000)]
    made = [_made(*r) for r in records]
    monkeypatch.setattr(sink, "_HEADER_TAIL", None)
    python_way = [_made(*r) for r in records]
    for r, a, b in zip(records, made, python_way):
        assert a == b == _general(*r), r


def _clean(raw: bytes) -> bool:
    """ASCII, no line break, nothing for str.strip() to take (it takes \\x1c-\\x1f, bytes.strip() does not)."""
    return raw.isascii() and raw.decode() == raw.decode().strip() and b"\r" not in raw and b"\n" not in raw


@native
def test_the_c_maker_takes_the_relays_records_and_leaves_the_rest_to_python():
    tail = sink_native.NATS_HEADER_TAIL
    assert tail is not None
    rng = random.Random(11)
    taken = 0
    for _ in range(3000):
        topic, key, value, headers, ts = _record(rng)
        if _made(topic, key, value, headers, ts) != _general(topic, key, value, headers, ts):
            pytest.fail(f"{headers}")
        prefix = sink._prefixes.get(tuple(headers[:-4]))
        if prefix is None or prefix.middle is None:
            continue
        out = tail(
            prefix.block, prefix.closed, prefix.middle, headers, len(headers) - 4, key, value, ts, topic,
            sink._names, sink._IDENTITY_NAMES, H_ROW, sink._KEY_PREFIX, sink._NULL_LINE, sink._TIMESTAMP_PREFIX,
            sink._MSG_ID_PREFIX,
        )  # fmt: skip
        if out is not None:
            taken += 1
            assert out == _general(topic, key, value, headers, ts), headers
        else:  # only what the C way does not take
            own = [(n, raw) for n, raw in headers[-4:] if raw is not None]
            usual = (
                all(_clean(raw) for _, raw in own)
                and (key is None or _clean(key))
                and len({n for n, _ in own}) == len(own)
                and not {n for n, _ in own} & prefix.closed
                and all(n in sink._names for n, _ in own)
                and not {n for n, _ in own} & (sink._IDENTITY_NAMES - {H_ROW})
                and ((type(ts) is int and -(2**63) <= ts < 2**63) or ts is None)
                and all(raw.isdigit() and len(raw) <= 18 for n, raw in own if n == H_ROW)
                and (
                    H_ROW not in {n for n, _ in own}
                    or (
                        all(t.isascii() and "\r" not in t and "\n" not in t for t in (topic, prefix.middle))
                        and topic == topic.lstrip()
                    )
                )
            )
            assert not usual, (topic, key, value, headers, ts, prefix.middle)
    assert taken > 400, taken  # about one in six: the generator mixes odd keys, rows, topics and times


@native
@pytest.mark.parametrize(
    "change",
    [
        {3: ("not", "a list")},
        {3: [(H_ROW, b"1", "three")]},
        {3: [(b"bytes name", b"1")]},
        {3: [(H_ROW, "text value")]},
        {4: 5},
        {4: -1},
        {5: "text key"},
        {7: 2**64},
        {7: "1"},
        {7: True},
        {8: b"bytes topic"},
        {2: None},  # no middle: the general identity
        {0: "block"},
        {9: {}},  # a name it has not checked
        {1: [H_ROW]},
    ],
)
def test_whatever_the_c_maker_does_not_take_is_none_and_no_error(change):
    tail = sink_native.NATS_HEADER_TAIL
    assert tail is not None
    sink.message_header_block(
        "t", b"k", b"v", [(H_SOURCE, b"s"), (H_ROW, b"1"), ("a", b"1"), ("b", b"2"), ("c", b"3")], 1
    )
    args = [b"NATS/1.0\r\n", frozenset(), "s|1|f|4", [(H_ROW, b"1")], 0, b"k", b"v", 1, "t", sink._names]
    args += [
        sink._IDENTITY_NAMES,
        H_ROW,
        sink._KEY_PREFIX,
        sink._NULL_LINE,
        sink._TIMESTAMP_PREFIX,
        sink._MSG_ID_PREFIX,
    ]
    assert tail(*args) is not None
    for i, v in change.items():
        args[i] = v
    assert tail(*args) is None
    with pytest.raises(TypeError):
        tail(*args[:5])
