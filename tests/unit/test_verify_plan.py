"""The verify job's planning helpers (no Spark, no server)."""

from __future__ import annotations

import os

import pytest

from spark_jobs.verify import local_cores


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[2]", 2), ("local[4,3]", 4), ("local[*]", os.cpu_count() or 1),
    ("spark://host:7077", None), ("yarn", None), ("local[x]", None), ("", None),
])  # fmt: skip
def test_local_cores_from_the_master(master: str, cores: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert local_cores(master) == cores


def test_under_spark_submit_the_command_line_master_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    assert local_cores("local[2]") is None
