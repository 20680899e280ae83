"""Loads the `.avsc` schemas kept as data in `avro/`.

From a source checkout (and an editable install) they are read from the repository's
`avro/` folder; a wheel ships the same files as the resource package `cdc_avro`."""

from __future__ import annotations

import importlib.resources
import json
from functools import cache
from pathlib import Path
from typing import Any

_REPO_AVRO = Path(__file__).resolve().parents[2] / "avro"
OUTBOX_EVENT = "outbox_event.avsc"


@cache
def schema_text(name: str = OUTBOX_EVENT) -> str:
    path = _REPO_AVRO / name
    if path.is_file():
        return path.read_text()
    return importlib.resources.files("cdc_avro").joinpath(name).read_text()


def schema(name: str = OUTBOX_EVENT) -> dict[str, Any]:
    return json.loads(schema_text(name))
