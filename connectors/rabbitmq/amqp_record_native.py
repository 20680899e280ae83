"""Which encoder of a message's own part the RabbitMQ Streams sink runs
(`amqp_message.encode_record`): the C one (`connectors/rabbitmq/amqp_record.c`, built by
`tools/build_native.py amqp_record` into `_amqp_record*.so`) when it is there, loads on this
interpreter and was built from the very source beside it, else None and the Python way.
The build carries the SHA-256 of the C source it was built from (`BUILT_FROM`): a build
older than an edit of amqp_record.c is never used. Optional, as the json walk's build
(cdc/json_kinds_native.py): `pip install .` ships no compiler step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cdc import native_build

SOURCE = Path(__file__).with_name("amqp_record.c")
COMPILED_NAME = "connectors.rabbitmq._amqp_record"


def source_digest(source: Path = SOURCE) -> str:
    """The stamp a build must carry to be used: the SHA-256 of amqp_record.c."""
    return native_build.source_digest(source)


def compiled_encoder(source: Path = SOURCE) -> Callable[..., bytes | None] | None:
    """The build's `encode_tail` when the build is current for `source`, else None (not
    built, built for another interpreter, or built from another version of the source)."""
    module = native_build.current_build(COMPILED_NAME, source)
    return None if module is None else module.encode_tail  # type: ignore[no-any-return]  # a C function


ENCODE_TAIL = compiled_encoder()
COMPILED: bool = ENCODE_TAIL is not None
