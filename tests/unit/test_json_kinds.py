"""The json format's proof walk (cdc/json_kinds.py) and its optional compiled build
(cdc/json_kinds_native.py, tools/build_native.py json_kinds): which build the relay loads, that a
build of another version of the source is never used, and that the build step without a C
compiler says so in one line. That both builds write the same bytes is held by
tests/unit/test_formats.py's fast-path tests, which run on each."""

import sys
import sysconfig
import types
from pathlib import Path

from cdc import json_kinds, json_kinds_native
from cdc.events import formats
from cdc.json_kinds_native import COMPILED_NAME, SOURCE, compiled_walk, source_digest

ROOT = Path(__file__).resolve().parents[2]


def test_the_loaded_walk_is_the_compiled_build_exactly_when_one_is_current():
    """`formats` runs the compiled walk when a build for this interpreter is beside the
    source and stamped with its digest (`./run.sh setup` builds it where gcc is), else the
    pure-Python module; the failure message says which one was loaded."""
    built = list(SOURCE.parent.glob("_json_kinds_compiled" + sysconfig.get_config_var("EXT_SUFFIX")))
    loaded = json_kinds_native.WALK
    where = f"loaded {loaded.__name__} from {loaded.__file__} (built here: {[p.name for p in built]})"
    assert formats._member_kinds is loaded.member_kinds, where
    if json_kinds_native.COMPILED:
        assert built and loaded.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX")), where
        assert source_digest() == loaded.BUILT_FROM, where
        assert type(loaded.member_kinds) is not types.FunctionType, where  # native code, not bytecode
    else:
        assert loaded is json_kinds, where
        assert compiled_walk() is None, where


def test_a_build_of_another_version_of_the_source_is_not_used(tmp_path, monkeypatch):
    """A compiled module stamped with another digest than the source beside it (json_kinds.py
    edited after the build) is ignored: the pure-Python walk runs the edited source."""
    edited = tmp_path / "json_kinds.py"
    edited.write_bytes(SOURCE.read_bytes() + b"\n# edited after the build\n")
    current = types.ModuleType(COMPILED_NAME)
    current.BUILT_FROM = source_digest()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, COMPILED_NAME, current)
    assert compiled_walk(SOURCE) is current
    assert compiled_walk(edited) is None
    if json_kinds_native.COMPILED:  # the real build, too
        monkeypatch.delitem(sys.modules, COMPILED_NAME)
        monkeypatch.setitem(sys.modules, COMPILED_NAME, json_kinds_native.WALK)
        assert compiled_walk(edited) is None
        assert compiled_walk(SOURCE) is json_kinds_native.WALK


def test_a_missing_build_leaves_the_pure_python_walk(monkeypatch):
    """No compiled module importable (not built, or built for another Python): None."""
    monkeypatch.setitem(sys.modules, COMPILED_NAME, None)  # import raises ImportError
    assert compiled_walk() is None
