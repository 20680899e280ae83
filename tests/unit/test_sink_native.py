"""Which build of the sinks' C encoders (connectors/sink_native.c) the relay loads
(connectors/sink_native.py): the C one exactly when a build for this interpreter is there and
stamped with the source's digest, never a build of another version of the source, and the
Python ways when none is. What the encoders make: tests/unit/test_sink_native_amqp.py and
test_sink_native_nats.py; the build step: tests/unit/test_build_native.py."""

import sys
import sysconfig
import types

from connectors import sink_native
from connectors.nats import sink
from connectors.rabbitmq import amqp_message
from connectors.sink_native import COMPILED_NAME, SOURCE, compiled_module, source_digest

BUILT = list(SOURCE.parent.glob("_sink_native" + sysconfig.get_config_var("EXT_SUFFIX")))


def test_the_loaded_encoders_are_the_c_build_exactly_when_one_is_current():
    """`./run.sh setup` builds it where gcc is, for .venv's interpreter, and tools/unit_tiers.sh
    for 3.12 and 3.13: a current build for the test's interpreter must be loaded."""
    where = f"loaded {sink_native.AMQP_RECORD_TAIL}, {sink_native.NATS_HEADER_TAIL} (built: {[p.name for p in BUILT]})"
    assert amqp_message._ENCODE_TAIL is sink_native.AMQP_RECORD_TAIL, where
    assert sink._HEADER_TAIL is sink_native.NATS_HEADER_TAIL, where
    if BUILT and source_digest() == getattr(sys.modules.get(COMPILED_NAME), "BUILT_FROM", None):
        assert sink_native.COMPILED, where
    if sink_native.COMPILED:
        for function in (sink_native.AMQP_RECORD_TAIL, sink_native.NATS_HEADER_TAIL):
            assert type(function) is types.BuiltinFunctionType, where
    else:
        assert compiled_module() is None and sink_native.AMQP_RECORD_TAIL is sink_native.NATS_HEADER_TAIL is None


def test_a_build_of_another_version_of_the_source_is_not_used(tmp_path, monkeypatch):
    edited = tmp_path / "sink_native.c"
    edited.write_bytes(SOURCE.read_bytes() + b"\n/* edited after the build */\n")
    current = types.ModuleType(COMPILED_NAME)
    current.BUILT_FROM = source_digest()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, COMPILED_NAME, current)
    assert compiled_module(SOURCE) is current
    assert compiled_module(edited) is None


def test_a_missing_build_leaves_the_python_ways(monkeypatch):
    monkeypatch.setitem(sys.modules, COMPILED_NAME, None)  # import raises ImportError: not built
    assert compiled_module() is None
