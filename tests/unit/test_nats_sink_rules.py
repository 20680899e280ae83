"""The NATS JetStream sink's rules that need no server: its settings' validation (one
line naming the fix) and what a message carries for the broker (`Nats-Msg-Id` from the
relay's identity, none for a repair; no line break inside a header)."""

from __future__ import annotations

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from cdc.events.identity import H_DLQ_ERROR, H_FILE, H_POS, H_REPAIR, H_ROW, H_SOURCE
from connectors.nats.sink import H_MSG_ID, nats_headers, stream_name

BASE = {
    "source": {"name": "shop"},
    "outbox": {"tables": [{"schema": "s", "table": "outbox"}]},
    "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
}


def _load(nats: dict | None = None, **sections):
    raw = {**BASE, "sink": {"kind": "nats_jetstream", "nats_jetstream": nats or {}}, **sections}
    return load_config(raw, {})


def test_the_defaults_hold_together():
    cfg = _load().sink.nats_jetstream
    assert cfg.ack_timeout_s < cfg.delivery_timeout_s < cfg.duplicate_window_s == 120


@pytest.mark.parametrize(
    ("nats", "sections", "message"),
    [
        ({}, {"checkpoint": {"store": "kafka"}}, 'set checkpoint.store = "file"'),
        ({}, {"kafka": {"delivery": "transactional"}}, "remove kafka.delivery"),
        ({"delivery_timeout_s": 150}, {}, "ack_timeout_s < delivery_timeout_s < duplicate_window_s"),
        ({"ack_timeout_s": 0}, {}, "ack_timeout_s < delivery_timeout_s"),
        ({"cert_file": "/c.pem"}, {}, "cert_file and key_file go together"),
        ({"max_in_flight": 0}, {}, "max_in_flight must be at least 1"),
        ({"servers": []}, {}, "must name at least one server"),
    ],
)
def test_a_wrong_setting_is_one_line_naming_the_fix(nats, sections, message):
    with pytest.raises(ConfigError, match=message):
        _load(nats, **sections)


IDENTITY = [(H_SOURCE, b"shop"), (H_FILE, b"bin.000002"), (H_POS, b"4711"), (H_ROW, b"3")]


def test_the_msg_id_is_the_subject_and_the_identity():
    headers = nats_headers("shop.order", b"k1", b"v", IDENTITY, 1700000000123)
    assert headers[H_MSG_ID] == "shop.order|shop|bin.000002|4711|3"
    assert headers["cdc.key"] == "k1" and headers["cdc.timestamp"] == "1700000000123"
    # the same event on another subject (a dead letter) is another message
    assert nats_headers("shop.dlq", b"k1", b"v", IDENTITY, None)[H_MSG_ID] != headers[H_MSG_ID]


def test_a_repair_and_a_message_without_identity_carry_no_msg_id():
    assert H_MSG_ID not in nats_headers("shop.order", None, b"v", [*IDENTITY, (H_REPAIR, b"1")], None)
    assert H_MSG_ID not in nats_headers("shop.order", None, b"v", [("id", b"e1")], None)


def test_a_line_break_in_a_header_value_is_sent_as_a_space():
    headers = nats_headers("shop.dlq", None, None, [(H_DLQ_ERROR, b"first\r\nsecond")], None)
    assert headers[H_DLQ_ERROR] == "first  second" and headers["cdc.value.null"] == "true"


def test_a_created_stream_is_named_after_its_subject():
    assert stream_name("shop.order.*") == "shop_order__"


def _nats_pys_hpub(subject: str, reply: str, payload: bytes, headers: dict[str, str]) -> bytes:
    """What nats-py's own publish hands its connection for this message (no connection: its
    buffer is read back)."""
    import asyncio

    import nats

    nc = nats.NATS()
    asyncio.run(nc._send_publish(subject, reply, payload, len(payload), headers))
    return b"".join(nc._pending)


@pytest.mark.parametrize(
    ("key", "value", "headers", "ts"),
    [
        (b"k1", b"\x00avro" * 50, IDENTITY, 1700000000123),
        (None, None, [(H_DLQ_ERROR, b"first\r\nsecond "), ("id", b" e1 ")], None),  # stripped as nats-py does
        (b"\xffk", b"", [*IDENTITY, (H_REPAIR, b"1"), ("id", "é".encode()), ("id", b"e2")], 5),
    ],
)
def test_the_publish_path_writes_the_bytes_nats_py_writes(key, value, headers, ts):
    from types import SimpleNamespace

    from connectors.nats.sink import NatsJetStreamPublisher, _Out, header_block

    named = nats_headers("shop.order", key, value, headers, ts)
    out = _Out(17, "shop.order", value or b"", header_block(named, end=False), print, 0)
    publisher = SimpleNamespace(_subjects={"shop.order": b"shop.order"}, _reply_bytes=b"_INBOX.abc.")
    written = NatsJetStreamPublisher._hpub(publisher, [out, out], 0.0)  # type: ignore[arg-type]
    assert written == _nats_pys_hpub("shop.order", "_INBOX.abc.17_1", value or b"", named) + _nats_pys_hpub(
        "shop.order", "_INBOX.abc.17_2", value or b"", named
    )
    # chained (connectors/nats/chain.py): the expectation is the block's last header
    out.expected = 41
    written = NatsJetStreamPublisher._hpub(publisher, [out], 0.0)  # type: ignore[arg-type]
    chained = {**named, "Nats-Expected-Last-Sequence": "41"}
    assert written == _nats_pys_hpub("shop.order", "_INBOX.abc.17_3", value or b"", chained)


def test_a_header_name_nats_refuses_is_said_at_publish():
    from connectors.nats.sink import header_block

    with pytest.raises(ValueError, match="not allowed in a NATS message"):
        header_block({"a name": "v"})


@pytest.mark.parametrize(
    ("data", "seq"),
    [
        (b'{"stream":"s_events","seq":42}', 42),
        (b'{"stream":"s_events","seq":42,"duplicate":true}', 42),
        (b'{"stream":"s_events","seq":42,"duplicate": true}', 42),  # as nats-server writes it
        (b'{"stream":"s","domain":"hub","seq":7}', 7),
        (b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"},"stream":"s","seq":0}', None),
        (b'{"stream":"s","seq":7,"batch":"x"}', None),  # a shape not known: json reads it
    ],
)
def test_a_puback_is_read_by_its_pattern_and_anything_else_by_json(data, seq):
    from connectors.nats.sink import _PUB_ACK

    matched = _PUB_ACK.fullmatch(data)
    assert (int(matched[1]) if matched else None) == seq


def test_a_header_value_is_stripped_and_its_line_breaks_are_spaces_as_nats_py_writes_it():
    from connectors.nats.sink import header_block

    headers = {"a": " x\r\ny ", "b": "\n", " c ": "é"}
    block = header_block(headers)
    assert _nats_pys_hpub("s", "r", b"", headers) == b"HPUB s r %d %d\r\n%s\r\n" % (len(block), len(block), block)


@pytest.mark.parametrize(
    ("data", "duplicate"),
    [
        (b'{"stream":"s","seq":42}', False),
        (b'{"stream":"s","seq":42,"duplicate": true}', True),
        (b'{"stream":"s","seq":42,"duplicate":true}', True),
    ],
)
def test_a_pubacks_duplicate_flag_is_read(data, duplicate):
    from connectors.nats.sink import _PUB_ACK

    matched = _PUB_ACK.fullmatch(data)
    assert matched is not None and (matched[2] is not None) == duplicate


def test_a_report_gets_the_message_with_its_sequence_and_a_failure_as_the_ports_delivery():
    """publish_reported's reports (cdc.ports.ReportingPublisher): the hand-over takes
    `message.partition()` / `message.offset()` on success and `delivery()` of anything else;
    `publish`'s callback still gets the port's Delivery; a purged message's report is not served."""
    import threading
    from collections import deque

    from cdc.ports import Delivery, DeliveryFailure
    from connectors.nats.sink import NatsJetStreamPublisher, _Out

    assert hasattr(NatsJetStreamPublisher, "publish_reported")  # what the hand-over looks for
    publisher = NatsJetStreamPublisher.__new__(NatsJetStreamPublisher)  # no server: the reports' side only
    publisher._done, publisher._ready, publisher._gen, publisher._pending = deque(), threading.Event(), 1, 4
    got: list[tuple[object, object]] = []
    deliveries: list[Delivery] = []
    ok = _Out(1, "t", b"x", b"", lambda err, msg: got.append((err, msg)), 1, True)
    failure = DeliveryFailure("TIMED_OUT", "no answer")
    late = _Out(2, "t", b"x", b"", lambda err, msg: got.append((err, msg)), 1, True)
    plain = _Out(3, "t", b"x", b"", deliveries.append, 1, False)
    purged = _Out(4, "t", b"x", b"", deliveries.append, 0, False)
    ok.seq, plain.seq = 41, 42
    for out, why in ((ok, None), (late, failure), (plain, None), (purged, None)):
        publisher._report(out, why)
    assert publisher._serve() == 3 and publisher._pending == 1
    assert got == [(None, ok), (failure, late)]
    assert (ok.partition(), ok.offset(), late.offset()) == (0, 41, None)
    assert deliveries == [Delivery("t", 0, 42)]
    assert publisher.delivery("t", None, ok) == Delivery("t", 0, 41)
    assert publisher.delivery("t", failure, late) == Delivery("t", 0, -1, failure)


def test_the_fast_header_block_is_the_general_ways_bytes():
    """message_header_block (the leading headers made once a transaction) writes what
    header_block(nats_headers(...)) writes, for the relay's headers and for everything it
    hands to the general way: a name twice, a null value, a name the tail writes, a repair,
    line breaks, a GTID, invalid UTF-8, a name that strips to nothing; and the same
    ValueError for a name NATS refuses."""
    import itertools
    import random

    from cdc.events.identity import H_COMMIT_TS, H_EVENT_ID, H_GTID, H_SERVER_ID, H_TABLE
    from connectors.nats.sink import _prefixes, header_block, message_header_block

    tx = [(H_SOURCE, b"shop"), (H_SERVER_ID, b"1"), (H_FILE, b"bin.000002"), (H_POS, b"4711"), (H_COMMIT_TS, b"17")]
    tail = [(H_EVENT_ID, b"e-1"), ("cdc.event.type", b"Created"), (H_TABLE, b"s.outbox")]
    odd = [
        (H_GTID, b"0-1-42"),
        ("id", b"again"),
        ("id", None),
        (H_SOURCE, b"other"),
        ("cdc.key", b"k2"),
        ("cdc.timestamp", b"9"),
        (H_REPAIR, b"1"),
        ("x", b"a\r\nb "),
        ("y", b"\xff\xfe"),
        (" ", b"v"),
        (" z ", b"  padded  "),
        (H_ROW, b"x"),
        (H_DLQ_ERROR, None),
    ]
    rng = random.Random(7)
    cases = [[*tx, (H_ROW, b"%d" % row), *tail] for row in range(3)]
    cases += [tx[:2], [], [(H_ROW, b"0")], tx, [*tx, (H_ROW, b"x"), *tail], [*tx, (H_GTID, b""), (H_ROW, b"1"), *tail]]
    cases += [[*tx[:3], (H_GTID, b"0-1-9"), (H_ROW, b"2"), *tail], [*tx, (H_ROW, b"1"), (H_GTID, b"0-1-9"), *tail[1:]]]
    for _ in range(400):
        headers = [*tx, (H_ROW, b"3"), *tail]
        for extra in rng.sample(odd, rng.randint(1, 3)):
            headers.insert(rng.randint(0, len(headers)), extra)
        cases.append(headers)
    for headers, (key, value, ts) in zip(
        cases, itertools.cycle([(b"k1", b"v", None), (None, None, 5), (b" k\n", b"", 1700000000123)])
    ):
        want = header_block(nats_headers("shop.order", key, value, headers, ts), end=False)
        assert message_header_block("shop.order", key, value, headers, ts) == want, headers
        # a second time: from the cache of leading headers
        assert message_header_block("shop.order", key, value, list(headers), ts) == want, headers
    # the relay's headers take the fast way: their leading ones are kept
    assert _prefixes.get(tuple(tx)) is not None
    for headers in ([("a name", b"v"), *tx, (H_ROW, b"1"), *tail], [*tx, (H_ROW, b"1"), *tail, ("a name", b"v")]):
        with pytest.raises(ValueError, match="not allowed in a NATS message"):
            message_header_block("shop.order", None, b"v", headers, None)


def test_a_run_of_pubacks_is_taken_whole_and_everything_else_goes_to_the_parser_in_order():
    """The fast way in (`_take_pub_acks`) over nats-py's own parser: PubAcks on the replies'
    subscription resolve their messages, with their sequences and duplicate flags, whether
    a read holds many of them, cuts one in two or mixes them with a PING, an error answer
    or another subscription's message, which nats-py's parser hands on as before."""
    import asyncio
    import threading
    from collections import deque
    from types import SimpleNamespace

    from nats.protocol.parser import Parser

    from connectors.nats.chain import Chains
    from connectors.nats.sink import NatsJetStreamPublisher, _Out

    publisher = NatsJetStreamPublisher.__new__(NatsJetStreamPublisher)  # no server: the answers' side only
    publisher._done, publisher._ready, publisher._gen, publisher._pending = deque(), threading.Event(), 1, 0
    publisher._unacked, publisher._unacked_bytes, publisher._window_full = {}, 0, False
    publisher._chains, publisher._last_answer, publisher._inbox = Chains(), 0.0, deque()
    for n in range(1, 7):
        out = _Out(n, "shop.order", b"x", b"", print, 1, True)
        out.sends = 1
        publisher._unacked[n] = out
        publisher._unacked_bytes += 1
    general: list[tuple[int, bytes, bytes]] = []
    pongs: list[bool] = []

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: object) -> None:
        general.append((sid, subject, data))

    async def process_ping() -> None:
        pongs.append(True)

    def msg(subject: bytes, sid: int, body: bytes) -> bytes:
        return b"MSG %s %d %d\r\n%s\r\n" % (subject, sid, len(body), body)

    ack = b'{"stream":"s_events","seq":%d}'
    error = b'{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"},"stream":"s","seq":0}'
    wire = b"".join((
        msg(b"_INBOX.abc.1_1", 5, ack % 41),
        msg(b"_INBOX.abc.2_1", 5, b'{"stream":"s_events","seq":42,"duplicate": true}'),
        msg(b"_INBOX.abc.3_1", 5, b'{"stream":"s_events","domain":"hub","seq":43}'),
        b"PING\r\n",
        msg(b"_INBOX.abc.4_1", 5, error),  # not a PubAck: json reads it (`_on_reply`)
        msg(b"_INBOX.other.9", 6, b"another subscription's"),
        msg(b"_INBOX.abc.5_1", 5, ack % 44),
        msg(b"_INBOX.abc.6_1", 5, ack % 45),
        msg(b"_INBOX.abc.99_1", 5, ack % 46),  # answered already: nothing to resolve, still taken
    ))  # fmt: skip

    slow: list[bytes] = []  # what nats-py's parser handed to `_pub_acked`
    by_pattern = publisher._pub_acked

    def pub_acked(subject: bytes, data: bytes, current: bool) -> bool:
        slow.append(subject)
        return by_pattern(subject, data, current)

    publisher._pub_acked = pub_acked  # type: ignore[method-assign]

    async def feed(cuts: list[int]) -> None:
        nc = SimpleNamespace(_process_msg=process_msg, _process_ping=process_ping)
        nc._ps = Parser(nc)
        publisher._nc = nc
        NatsJetStreamPublisher._answer_first(publisher, nc, 5, "_INBOX.abc.")
        for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            await nc._ps.parse(wire[start:end])

    # the first read cuts PubAck 2 in two (its body), the second the error's command line
    asyncio.run(feed([wire.index(b"duplicate"), wire.index(b"MSG _INBOX.abc.4_1") + 9]))
    resolved = {out.n: out.seq for out in publisher._done}
    assert resolved == {1: 41, 2: 42, 3: 43, 5: 44, 6: 45}
    assert [n for n in publisher._unacked] == [4]  # the error: left to `_on_reply`
    assert general == [(5, b"_INBOX.abc.4_1", error), (6, b"_INBOX.other.9", b"another subscription's")]
    assert pongs == [True] and publisher._last_answer > 0
    # the PubAck the first read cut is taken whole with the second read; the parser's way is
    # for the error and what follows it in its read
    assert slow == [b"_INBOX.abc.4_1", b"_INBOX.abc.5_1", b"_INBOX.abc.6_1", b"_INBOX.abc.99_1"]
