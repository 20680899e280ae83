"""Which build of the json format's proof walk (`cdc/json_kinds.py`) the relay runs: the
mypyc-compiled one (`cdc/_json_kinds_compiled*.so`, built by `tools/build_native.py json_kinds`)
when it is there, loads on this interpreter and was built from the very source beside it,
else the pure-Python module. The compiled module carries the SHA-256 of the source it was
built from (`BUILT_FROM`); a build older than an edit of json_kinds.py is never used, so
an edit takes effect without a rebuild (at pure-Python speed until `./run.sh setup` or the
build script runs again). The build is optional: `pip install .` ships no compiler step."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from cdc import json_kinds, native_build

SOURCE = Path(__file__).with_name("json_kinds.py")
COMPILED_NAME = "cdc._json_kinds_compiled"


def source_digest(source: Path = SOURCE) -> str:
    """The stamp a compiled build must carry to be used: the SHA-256 of json_kinds.py."""
    return native_build.source_digest(source)


def compiled_walk(source: Path = SOURCE) -> ModuleType | None:
    """The compiled build when it is current for `source`, else None (not built, built for
    another interpreter, or built from another version of the source)."""
    return native_build.current_build(COMPILED_NAME, source)


_compiled = compiled_walk()
WALK: ModuleType = _compiled if _compiled is not None else json_kinds
COMPILED: bool = _compiled is not None
