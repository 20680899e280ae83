"""No file of the repository refers to a path outside it (a user's clone has only the
repository): design notes live in docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\.\./shared/|/work/shared|/work/main|/tmp/prompts")


def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt", ".cfg", "") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [
            f"{name}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE.search(line) and path.name != Path(__file__).name
        ]
    assert not found, "paths outside the repository: " + ", ".join(found)
