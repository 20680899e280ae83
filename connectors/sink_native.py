"""Which encoders of a message's own part the sinks run: the C ones (`connectors/sink_native.c`:
`amqp_record_tail` for RabbitMQ Streams' `amqp_message.encode_record`, `nats_header_tail` for
the NATS sink's `message_header_block`), built by `tools/build_native.py sink_native` into
`connectors/_sink_native*.so`, when that build is there, loads on this interpreter and was built
from the very source beside it (cdc/native_build.py: its `BUILT_FROM` is the SHA-256 of
sink_native.c); else None for each, and the Python ways run. Optional: `pip install .` ships no
compiler step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from cdc import native_build

SOURCE = Path(__file__).with_name("sink_native.c")
COMPILED_NAME = "connectors._sink_native"


def source_digest(source: Path = SOURCE) -> str:
    """The stamp a build must carry to be used: the SHA-256 of sink_native.c."""
    return native_build.source_digest(source)


def compiled_module(source: Path = SOURCE) -> ModuleType | None:
    """The build when it is current for `source`, else None (not built, built for another
    interpreter, or built from another version of the source)."""
    return native_build.current_build(COMPILED_NAME, source)


_module = compiled_module()
AMQP_RECORD_TAIL: Callable[..., bytes | None] | None = None if _module is None else _module.amqp_record_tail
NATS_HEADER_TAIL: Callable[..., bytes | None] | None = None if _module is None else _module.nats_header_tail
COMPILED: bool = _module is not None
