"""Code health the import contracts do not cover: no module imports another module's private
names. (Layers, the sinks' independence and the absence of import cycles are import-linter's
contracts in pyproject.toml, checked by tools/lint.sh.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc", "connectors", "spark_jobs", "cdc_cli")


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it
    says it is shared by importing a public name."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                    found += [
                        f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
    assert not found, "private names imported across modules: " + ", ".join(found)
