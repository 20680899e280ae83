"""The configuration reference is complete: every key a section of the config file accepts
(each field of its settings dataclass) is documented in `cdc/config.py`'s docstring, in
the example under its `[section]` header or named as `section.key` in the text."""

from __future__ import annotations

import dataclasses
import re

import cdc.config as config
from cdc.events.outbox import OutboxTable


def _documented(doc: str) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    section = None
    for line in doc.splitlines():
        header = re.match(r"^\s*\[\[?([a-z_.]+)\]\]?", line)
        if header:
            section = header.group(1)
            continue
        key = re.match(r'^\s*"?([a-z_.]+)"?\s*=', line)
        if key and section:
            found.add((section, key.group(1)))
        elif not line.strip():
            section = None if not line.startswith(" ") else section
    for section_name, key in re.findall(r"\b([a-z_]+(?:\.tables)?)\.([a-z_]+)\b", doc):
        found.add((section_name, key))
    return found


def _expected() -> set[tuple[str, str]]:
    keys = set()
    for section, cls in config._SECTIONS.items():
        for f in dataclasses.fields(cls):
            if (section, f.name) in config._SECRETS:
                keys.add((section, f.name + "_env"))
            elif section == "relay" and f.name in ("on_change", "on_statement"):
                keys.add(("outbox", f.name))  # written in [outbox]
            else:
                keys.add((section, f.name))
    for f in dataclasses.fields(OutboxTable):
        keys.add(("outbox.tables", f.name))
    return keys


def test_every_config_key_is_documented_in_the_config_modules_docstring():
    missing = sorted(_expected() - _documented(config.__doc__ or ""))
    assert not missing, "undocumented keys (add them to cdc/config.py's docstring): " + ", ".join(
        f"{s}.{k}" for s, k in missing
    )


def test_the_check_sees_an_undocumented_key():
    assert ("kafka", "bootstrap") in _documented('[kafka]\nbootstrap = "x"\n')
    assert ("kafka", "bootstrap") not in _documented('[source]\nbootstrap = "x"\n')
    assert ("relay", "spill_rows") in _documented("see relay.spill_rows")
