"""The RabbitMQ Streams sink's pieces that need no server: Kafka's key hash (a key's stream
is the partition a Kafka producer would pick), the offsets reported for confirmations, and
`[sink.rabbitmq_stream]`'s validation. Against the real node: tests/integration/test_rabbitmq_sink.py."""

from __future__ import annotations

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from connectors.rabbitmq.stream_reader import StreamSettings
from connectors.rabbitmq.stream_sink import _replica_line, _Stream, murmur2, murmur2_partition

BASE = {
    "source": {"host": "db", "user": "u", "name": "src"},
    "outbox": {"tables": [{"schema": "app", "table": "outbox"}]},
    "sink": {"kind": "rabbitmq_stream"},
    "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
}


@pytest.mark.parametrize(
    ("key", "expected"),
    [  # Apache Kafka's UtilsTest.testMurmur2
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_is_kafkas(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def test_a_keys_partition_is_kafkas_and_always_the_same() -> None:
    assert murmur2_partition(b"21", 3) == (-973932308 & 0x7FFFFFFF) % 3
    assert {murmur2_partition(f"k{n}".encode(), 3) for n in range(50)} == {0, 1, 2}
    assert murmur2_partition(b"k7", 1) == 0


def test_a_confirmed_id_is_reported_at_the_streams_end_plus_its_place_in_the_run() -> None:
    # the broker held ids up to 40 and the stream ended at offset 1000 when the run declared it
    stream = _Stream("s", "t", 0, publisher_id=0, highest=40, end=1000, next_id=41)
    assert [stream.offset(i) for i in (41, 42, 50)] == [1000, 1001, 1009]


def _cfg(**sections):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for name, value in sections.items():
        raw[name] = {**raw.get(name, {}), **value}
    return load_config(raw, {"RABBIT": "secret"})


def test_a_rabbitmq_sink_loads_with_its_settings() -> None:
    cfg = _cfg(sink={"kind": "rabbitmq_stream", "rabbitmq_stream": {"port": 5551, "tls": True, "password_env": "RABBIT",
                                                                      "producer_name": "p", "publish_timeout_s": 5}})  # fmt: skip
    rabbit = cfg.sink.rabbitmq_stream
    assert (rabbit.port, rabbit.tls, rabbit.producer_name, rabbit.publish_timeout_s) == (5551, True, "p", 5)
    assert rabbit.password.reveal() == "secret" and "secret" not in repr(cfg)


def test_the_other_nodes_are_tried_after_host_in_their_order() -> None:
    cfg = _cfg(sink={"kind": "rabbitmq_stream", "rabbitmq_stream": {"host": "r1", "port": 5552, "password_env": "RABBIT",
                                                                      "hosts": ["r2:5552", "r3:6552", "r1:5552"]}})  # fmt: skip
    settings = StreamSettings.from_config(cfg.sink.rabbitmq_stream)
    assert settings.addresses() == [("r1", 5552), ("r2", 5552), ("r3", 6552)]
    assert settings.where() == "RabbitMQ stream r1:5552 (or r2:5552, r3:6552, r1:5552) vhost /"


def _settings(hosts: tuple[tuple[str, int], ...]) -> StreamSettings:
    return StreamSettings("n1", 1, "/", "u", "p", hosts=hosts)


def test_cdc_check_names_the_node_a_stream_runs_without() -> None:
    cluster = _settings((("n2", 2), ("n3", 3)))
    line = _replica_line(cluster, "events", (("n2", 2), [("n3", 3)]))
    assert line.warn and "'events'" in line.message and "node n1:1" in line.message and "\n" not in line.message
    whole = _replica_line(cluster, "events", (("n2", 2), [("n3", 3), ("n1", 1)]))
    assert not whole.warn and whole.message == "stream 'events': leader n2:2, replicas n3:3, n1:1"
    leaderless = _replica_line(cluster, "events", (None, [("n3", 3)]))
    assert leaderless.warn and "no leader" in leaderless.message
    # a single node (no `hosts`): nothing to compare with, no warning for a stream without replicas
    assert not _replica_line(_settings(()), "events", (("n1", 1), [])).warn


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"checkpoint": {"store": "kafka"}}, 'set checkpoint.store = "file"'),
        ({"kafka": {"delivery": "transactional"}}, "has no broker transactions"),
        ({"sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": {"publish_timeout_s": 0}}}, "must be positive"),
        ({"sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": {"cert_file": "c.pem"}}}, "cert_file and key_file"),
        ({"sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": {"hosts": ["rabbit2"]}}}, 'is not "host:port"'),
        ({"sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": {"hosts": ["rabbit2:0"]}}}, 'is not "host:port"'),
        ({"sink": {"kind": "rabbitmq_stream", "rabbitmq_stream": {"hosts": [":5552"]}}}, 'is not "host:port"'),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(sections, says) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(**sections)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"order-1", b"\x00\x01avro" * 3, [("cdc.source", b"shop"), ("id", "é-ü".encode()), ("cdc.binlog.pos", b"4")]),
        (None, None, [("cdc.dlq.cause", b"too_large"), ("empty", b"")]),  # null key, tombstone
        (b"k", b"v" * 70_000, [("h" * 300, b"x" * 300)]),  # lengths past one byte
    ],
)
def test_the_amqp_message_decodes_as_the_verifier_reads_it(key, value, headers) -> None:
    from rstream.amqp import amqp_decoder

    from cdc.events.sink_fields import message_properties
    from connectors.rabbitmq.stream_sink import encode_message
    from spark_jobs.rabbitmq.source import message_record

    data = encode_message(key, value, headers, 1_700_000_000_123)
    msg = amqp_decoder(data)
    assert msg.properties.creation_time == 1_700_000_000_123
    props = {k.decode() if isinstance(k, bytes) else k: v for k, v in msg.application_properties.items()}
    assert {k: v.decode() if isinstance(v, bytes) else v for k, v in props.items()} == message_properties(
        key, headers, value
    )
    record = message_record("t", 0, 5, 0, data)  # the verifier's own reading
    assert record.key() == key and record.value() == value and record.timestamp() == (1, 1_700_000_000_123)
    assert dict(record.headers()) == {n: v for n, v in headers}


_TX = [
    ("cdc.source", b"shop"),
    ("cdc.server_id", b"1"),
    ("cdc.binlog.file", b"mysql-bin.000002"),
    ("cdc.binlog.pos", b"4"),
]
_OWN = [("cdc.row", b"0"), ("cdc.event_id", b"e-1"), ("cdc.event_type", b"OrderCreated"), ("cdc.table", b"outbox")]


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"order-1", b"\x00\x01avro" * 3, [("cdc.source", b"shop"), ("id", "é-ü".encode()), ("cdc.binlog.pos", b"4")]),
        (None, None, [("cdc.dlq.cause", b"too_large"), ("empty", b""), ("gone", None)]),  # null key, tombstone
        (b"k", b"v" * 70_000, [("h" * 300, b"x" * 300), ("é", b"1")]),  # lengths past one byte, a UTF-8 name
        (b"\xffkey", b"", [("id", b"first"), ("bad", b"\xfe\xff"), ("id", b"last")]),  # not UTF-8, a repeated name
        # the relay's shape: a transaction's headers, then the row, event id, type and table
        (b"order-7", b"\x00avro", [*_TX, *_OWN]),
        (None, None, [*_TX, *_OWN]),
        (b"k", b"v", [*_TX, ("cdc.gtid", None), ("cdc.row", b"3"), ("cdc.event_id", None), *_OWN[2:]]),
        (b"k", b"v", [*_TX, ("cdc.row", "é".encode()), ("cdc.event_id", b"\xfe"), *_OWN[2:]]),
        (b"k", b"v", [*_TX, ("cdc.source", b"again"), *_OWN[1:]]),  # a leading name again at the end
        (b"k", b"v", [*_TX, ("cdc.row", b"1"), ("cdc.row", b"2"), *_OWN[2:]]),  # a name twice at the end
        (b"k", None, [*_TX, *_OWN[:3], ("cdc.key", b"mine")]),  # the key's own name among the headers
        (b"k", None, [("cdc.value.null", b"no"), *_TX, *_OWN]),
        (b"k", b"v", [*_TX, ("cdc.source", b"twice"), *_OWN]),  # a name twice among the leading ones
    ],
)
def test_the_publish_paths_encoder_makes_the_general_encoders_bytes(key, value, headers) -> None:
    from cdc.events.sink_fields import message_properties
    from connectors.rabbitmq import amqp_message

    for _ in range(2):  # the second time from its caches (of a transaction's headers, of entries)
        assert amqp_message.encode_record(key, headers, value, 1_700_000_000_123) == amqp_message.encode(
            message_properties(key, headers, value), value or b"", 1_700_000_000_123
        )


def test_a_publish_frame_reads_back_as_rstreams_publish() -> None:
    from rstream import schema
    from rstream.encoding import decode_frame

    from connectors.rabbitmq.stream_sink import _Message, publish_frame

    batch = [_Message("t", None, b"a" * n, print, 0.0, False) for n in (0, 1, 300, 70_000)]
    for i, m in enumerate(batch):
        m.publishing_id = 2**40 + i
    frame = publish_frame(7, batch)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    decoded = decode_frame(frame[4:])
    assert isinstance(decoded, schema.Publish) and decoded.publisher_id == 7
    assert [(m.publishing_id, m.data) for m in decoded.messages] == [(m.publishing_id, m.data) for m in batch]


def test_a_publish_confirm_reads_as_rstreams_decoder_reads_it_and_other_frames_go_to_it() -> None:
    """read_confirms_fast's struct decoding of PublishConfirm gives rstream's own frame;
    any other frame (here a PublishError) is left to rstream's decoder."""
    import asyncio

    from rstream import schema
    from rstream.encoding import decode_frame, encode_frame

    from connectors.rabbitmq.stream_sink import read_confirms_fast

    confirm = schema.PublishConfirm(publisher_id=9, publishing_ids=[0, 1, 2**40, 2**64 - 1])
    error = schema.PublishError(publisher_id=3, errors=[schema.PublishingError(publishing_id=5, response_code=18)])
    frames = [encode_frame(f)[4:] for f in (confirm, error, schema.PublishConfirm(publisher_id=1, publishing_ids=[]))]

    class Conn:
        async def _read_frame_raw(self) -> bytes:
            return frames.pop(0)

        async def read_frame(self) -> object:
            raise AssertionError("replaced")

    class Client:
        _conn = Conn()

    client = Client()
    read_confirms_fast(client)

    async def read_all() -> list[object]:
        return [await client._conn.read_frame() for _ in range(3)]

    got = asyncio.run(read_all())
    assert got[0] == confirm and type(got[0]) is schema.PublishConfirm
    assert got[1] == decode_frame(encode_frame(error)[4:]) and type(got[1]) is schema.PublishError
    assert got[2] == schema.PublishConfirm(publisher_id=1, publishing_ids=[])


def test_a_report_gets_the_message_with_its_partition_and_offset_and_a_failure_as_the_ports_delivery() -> None:
    """publish_reported's reports (cdc.ports.ReportingPublisher): the hand-over takes
    `message.partition()` / `message.offset()` on success, and `delivery()` of anything else."""
    from cdc.ports import Delivery, DeliveryFailure
    from connectors.rabbitmq.stream_sink import RabbitStreamPublisher, _Message

    assert hasattr(RabbitStreamPublisher, "publish_reported")  # what the hand-over looks for
    got: list[tuple[object, object]] = []
    ok = _Message("t", b"k", b"x", lambda err, msg: got.append((err, msg)), 0.0, True)
    ok._partition, ok._offset = 2, 41
    ok.deliver()
    assert got == [(None, ok)] and ok.partition() == 2 and ok.offset() == 41
    failure = DeliveryFailure("TIMED_OUT", "not confirmed")
    late = _Message("t", b"k", b"x", lambda err, msg: got.append((err, msg)), 0.0, True)
    late.failure = failure
    late.deliver()
    assert got[1] == (failure, late) and late.offset() is None
    publisher = RabbitStreamPublisher.__new__(RabbitStreamPublisher)  # delivery() reads no state
    assert publisher.delivery("t", None, ok) == Delivery("t", 2, 41)
    assert publisher.delivery("t", failure, late) == Delivery("t", -1, -1, failure)
    # the port's own callback still gets a Delivery
    deliveries: list[Delivery] = []
    plain = _Message("t", None, b"x", deliveries.append, 0.0, False)
    plain._partition, plain._offset = 0, 7
    plain.deliver()
    assert deliveries == [Delivery("t", 0, 7)]
