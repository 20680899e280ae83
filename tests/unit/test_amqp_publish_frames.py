"""connectors/rabbitmq/amqp_publish_frames.py writes a `basic.publish` as aiormq's
`Channel.basic_publish` has pamqp write it: the same bytes for generated messages (header
names and values ASCII and not, empty and long, with and without a message id, bodies empty,
one frame, exactly a frame and several frames), and it declines what pamqp writes otherwise."""

from __future__ import annotations

import datetime
import random

from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from connectors.rabbitmq.amqp_publish_frames import (
    method_payload,
    pamqp_frames,
    properties,
    publish_frames,
)

MAX_CONTENT = 131072 - 8  # RabbitMQ's default frame_max, less a body frame's overhead


def _aiormq(channel: int, exchange: str, routing_key: str, props, body: bytes, max_content: int) -> bytes:
    """What aiormq's basic_publish hands its writer (aiormq/channel.py: the frames, `_split_body`)."""
    frames = [
        spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
        ContentHeader(properties=props, body_size=len(body)),
    ]
    if body:
        if len(body) < max_content:
            frames.append(ContentBody(body))
        else:
            frames += [ContentBody(body[at : at + max_content]) for at in range(0, len(body), max_content)]
    return ChannelFrame.marshall(channel_number=channel, frames=frames).payload


def _props(headers: dict[str, str], message_id: str, stamp: int):
    when = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
    return spec.Basic.Properties(delivery_mode=2, message_id=message_id, headers=dict(headers), timestamp=when)


def test_the_same_bytes_as_aiormq_and_pamqp():
    rng = random.Random(7)
    names = ["cdc.source", "cdc.binlog.pos", "cdc.key", "ä", "日本", "x" * 128, "a b", ""]
    values = ["", "1", "bench", "é" * 300, "日本語", "x" * 70000]
    bodies = [b"", b"v", b"x" * 185, b"y" * (MAX_CONTENT - 1), b"z" * MAX_CONTENT, b"q" * (2 * MAX_CONTENT + 5)]
    for _ in range(1500):
        headers = {f"{rng.choice(names)}{rng.randrange(3)}"[:128]: rng.choice(values) for _ in range(rng.randrange(14))}
        message_id = rng.choice(["", "0-1-123:5:7", "m" * 255, "ü"])
        stamp = rng.randrange(0, 253402300799)  # up to 9999-12-31, DATETIME's last second
        body = rng.choice(bodies)
        exchange, key = rng.choice(["cdc.outbox", "", "ex-1:a_b"]), rng.choice(["shop.order", "k" * 255, "ä.b"])
        channel, max_content = rng.choice([1, 2, 65535]), rng.choice([MAX_CONTENT, 4088])
        props = _props(headers, message_id, stamp)
        want = _aiormq(channel, exchange, key, props, body, max_content)
        fast = properties(headers, message_id, stamp)
        assert fast is not None
        assert publish_frames(channel, method_payload(exchange, key), fast, body, max_content) == want
        assert pamqp_frames(channel, exchange, key, props, body, max_content) == want


def test_declines_what_pamqp_writes_otherwise():
    assert properties({"n" * 129: "v"}, "id", 1) is None  # pamqp cuts the name to 128 bytes
    assert properties({"é" * 65: "v"}, "id", 1) is None  # 130 bytes of UTF-8
    assert properties({"n" * 128: "v"}, "id", 1) is not None
    assert properties({"n": "v"}, "m" * 256, 1) is None  # a shortstr: pamqp refuses it
    assert properties({"n": "v"}, "ü" * 128, 1) is None  # 256 bytes
