"""The bytes of one AMQP 0-9-1 `basic.publish` as the exchange sink sends it, written
directly: what aiormq's `Channel.basic_publish` has pamqp marshal for each message (a
method frame, a content header frame, the body's frames), at a fraction of the cost. The
exchange sink's connection, channel, confirms and returns stay aiormq's
(connectors/rabbitmq/exchange_sink.py); only the frames of its messages are made here.

Layouts (AMQP 0-9-1, https://www.rabbitmq.com/resources/specs/amqp0-9-1.pdf and
amqp0-9-1.xml; RabbitMQ's field types, https://www.rabbitmq.com/amqp-0-9-1-errata.html):

- a frame (4.2.3): type octet (1 method, 2 content header, 3 body), channel short, payload
  size long, the payload, 0xCE;
- `basic.publish` (class 60, method 40): reserved-1 short, exchange shortstr, routing-key
  shortstr, then the bits mandatory (bit 0) and immediate (bit 1) in one octet;
- the content header (4.2.6.1): class-id short (60), weight short (0), body size longlong,
  the property flags short (bit 15 the first property; bit 0 would say more flags follow),
  then the properties present, in the class's order. Basic's order: content-type (15),
  content-encoding (14), headers (13), delivery-mode (12), priority (11), correlation-id
  (10), reply-to (9), expiration (8), message-id (7), timestamp (6), type (5), user-id (4),
  app-id (3), cluster-id (2);
- headers, a field table: its size long, then per field a name shortstr and a value, here
  each a long string: 'S' and its size long and UTF-8 bytes. pamqp writes the names sorted
  (`encode.field_table`), and so does this, so the two give the same bytes;
- shortstr: size octet (at most 255) and bytes; timestamp: seconds, a longlong;
- the body: frames of at most frame-max - 8 bytes of content each; none for an empty body.

`properties` declines (None) what pamqp would not write the same way, and the sink then has
pamqp make that message (`pamqp_frames`): a header name over 128 bytes (pamqp cuts it to 128
with a warning), a message id over 255 bytes (pamqp refuses it). tests/unit/test_amqp_publish_frames.py
holds the two to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Any

FRAME_METHOD, FRAME_HEADER, FRAME_BODY = 1, 2, 3
FRAME_END = b"\xce"
_BASIC_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # class, method, reserved-1
_HEADER_START = struct.pack(">HH", 60, 0)  # class, weight
_FLAGS = (1 << 13) | (1 << 12) | (1 << 7) | (1 << 6)  # headers, delivery-mode, message-id, timestamp
_FLAGS_NO_ID = (1 << 13) | (1 << 12) | (1 << 6)
_PERSISTENT = b"\x02"  # delivery-mode 2
_MANDATORY = b"\x01"
_FRAME = struct.Struct(">BHI")
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_LONGLONG = struct.Struct(">Q")
_MAX_NAME = 128  # pamqp cuts a longer field name


def method_payload(exchange: str, routing_key: str) -> bytes:
    """`basic.publish` to `exchange` with `routing_key`, mandatory (both at most 255 bytes:
    the sink refuses a longer routing key before it gets here)."""
    ex, rk = exchange.encode(), routing_key.encode()
    return _BASIC_PUBLISH + bytes((len(ex),)) + ex + bytes((len(rk),)) + rk + _MANDATORY


def properties(headers: dict[str, str], message_id: str | None, timestamp_s: int) -> bytes | None:
    """The content header's property flags and list of a persistent message: `headers`
    (text), `message_id` (None or "": none), `timestamp` in seconds. None: pamqp would write
    it otherwise (module docstring)."""
    parts: list[bytes] = []
    for name in sorted(headers):
        raw_name = name.encode()
        if len(raw_name) > _MAX_NAME:
            return None
        raw = headers[name].encode()
        parts += (bytes((len(raw_name),)), raw_name, b"S", _LONG.pack(len(raw)), raw)
    table = b"".join(parts)
    mid = message_id.encode() if message_id else b""
    if len(mid) > 255:  # a shortstr
        return None
    flags, mid_field = (_FLAGS, bytes((len(mid),)) + mid) if mid else (_FLAGS_NO_ID, b"")
    return b"".join(
        (_SHORT.pack(flags), _LONG.pack(len(table)), table, _PERSISTENT, mid_field, _LONGLONG.pack(timestamp_s))
    )


def publish_frames(channel: int, method: bytes, props: bytes, body: bytes, max_content: int) -> bytes:
    """One message's frames on `channel`: `method` (`method_payload`), its content header with
    `props` (`properties`), and `body` in frames of at most `max_content` bytes (aiormq's
    `Channel.max_content_size`: frame-max - 8)."""
    size = len(body)
    header = _HEADER_START + _LONGLONG.pack(size) + props
    parts = [
        _FRAME.pack(FRAME_METHOD, channel, len(method)), method, FRAME_END,
        _FRAME.pack(FRAME_HEADER, channel, len(header)), header, FRAME_END,
    ]  # fmt: skip
    if size and size < max_content:
        parts += (_FRAME.pack(FRAME_BODY, channel, size), body, FRAME_END)
    elif size:
        for at in range(0, size, max_content):
            chunk = body[at : at + max_content]
            parts += (_FRAME.pack(FRAME_BODY, channel, len(chunk)), chunk, FRAME_END)
    return b"".join(parts)


def pamqp_frames(channel: int, exchange: str, routing_key: str, props: Any, body: bytes, max_content: int) -> bytes:
    """The same message's frames made by pamqp, as aiormq's `basic_publish` makes them
    (`props`: a pamqp `Basic.Properties`): for what `properties` declines."""
    from pamqp import commands as spec
    from pamqp.body import ContentBody
    from pamqp.frame import marshal
    from pamqp.header import ContentHeader

    frames: list[Any] = [
        spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
        ContentHeader(properties=props, body_size=len(body)),
    ]
    if body:
        step = len(body) if len(body) < max_content else max_content
        frames += [ContentBody(body[at : at + step]) for at in range(0, len(body), step)]
    return b"".join(marshal(frame, channel) for frame in frames)
