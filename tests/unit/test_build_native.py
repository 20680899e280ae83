"""tools/build_native.py, the optional native builds' step (`./run.sh setup` runs it): without
a C compiler it says so in one line, exits 0 and leaves the builds as they are. What each
build loads and refuses: tests/unit/test_json_kinds.py, tests/unit/test_sink_native.py."""

import importlib.util
import sysconfig
from pathlib import Path

import pytest

from cdc import json_kinds_native
from connectors import sink_native

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("build_native", ROOT / "tools" / "build_native.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


@pytest.mark.parametrize(
    ("target", "loader"),
    [("json_kinds", json_kinds_native), ("sink_native", sink_native)],
)
def test_the_build_without_a_c_compiler_is_one_line_and_leaves_the_builds_alone(target, loader, monkeypatch, capsys):
    build = _tool()
    stem = loader.COMPILED_NAME.rpartition(".")[2]
    before = sorted(loader.SOURCE.parent.glob(f"{stem}*"))
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: "no-such-cc-build-native")
    assert build.main(target) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"build_{target}: no C compiler (no-such-cc-build-native)" in out, out
    assert sorted(loader.SOURCE.parent.glob(f"{stem}*")) == before
