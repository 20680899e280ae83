"""The optional native builds (cdc/json_kinds_native.py's json walk, compiled by mypyc;
connectors/sink_native.py's sink encoders, in C): a build is a module stamped with
the SHA-256 of the source it was built from (`BUILT_FROM`, written by tools/build_native.py)
and is used only while that source is unchanged, so an edit takes effect without a rebuild
(at Python speed until `./run.sh setup` builds again)."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType


def source_digest(source: Path) -> str:
    """The stamp a build must carry to be used: the SHA-256 of its source."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def current_build(name: str, source: Path) -> ModuleType | None:
    """Module `name` when it imports and was built from `source` as it is now, else None (not
    built, built for another interpreter, or built from another version of the source)."""
    try:
        module = importlib.import_module(name)
    except ImportError:  # not built, or built for another Python (its file name says which)
        return None
    try:
        current = getattr(module, "BUILT_FROM", None) == source_digest(source)
    except OSError:  # no source beside the build: nothing to prove it current
        return None
    return module if current else None
