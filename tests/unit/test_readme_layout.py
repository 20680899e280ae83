"""The README's Layout section is the folder map: every folder it names exists, and every
package folder of the code (a folder with an `__init__.py`) and every top-level folder is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = (
    "cdc",
    "connectors",
    "spark_jobs",
    "cdc_cli",
    "avro",
    "testbed",
    "bench",
    "tests",
    "compose",
    "tools",
    "docs",
)


def _named() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    parent: list[str] = []
    for line in section.splitlines():
        m = re.match(r"^    ( *)((?:[a-z_]+/ *)+)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        folders = m.group(2).split()
        parent = parent[:depth]
        for folder in folders:
            named.add("/".join(parent + [folder.rstrip("/")]))
        parent.append(folders[0].rstrip("/"))
    return named


def test_every_folder_the_layout_names_exists():
    missing = sorted(f for f in _named() if not (ROOT / f).is_dir())
    assert not missing, f"README Layout names folders that do not exist: {missing}"


def test_every_package_folder_is_in_the_layout():
    named = _named()
    packages = {
        str(p.parent.relative_to(ROOT))
        for top in ("cdc", "connectors", "spark_jobs", "cdc_cli", "testbed")
        for p in (ROOT / top).rglob("__init__.py")
    }
    absent = sorted((packages | set(TOP_LEVEL)) - named)
    assert not absent, f"folders missing from the README's Layout section: {absent}"
