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


@pytest.mark.verifier_deps
def test_class_archive_written_once_then_used(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from spark_jobs.session import class_archive_options

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("CDC_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = class_archive_options({})
    if first is None:
        pytest.fail("no java found: the verifier needs one")
    assert "-XX:ArchiveClassesAtExit=" in first and "-Xlog:cds*=off" in first
    part = first.split("ArchiveClassesAtExit=")[1].split()[0]
    # the part of a process that is gone, written a while ago, becomes the archive
    gone = part.rsplit(".", 2)[0] + ".999999999.part"
    with open(gone, "wb") as f:
        f.write(b"archive")
    old = time.time() - 60
    os.utime(gone, (old, old))
    second = class_archive_options({})
    assert second is not None and "-XX:SharedArchiveFile=" in second
    assert not os.path.exists(gone)
    # the caller's own JVM options win; an opt-out
    assert class_archive_options({"spark.driver.extraJavaOptions": "-Xss4m"}) is None
    monkeypatch.setenv("CDC_SPARK_CLASS_ARCHIVE", "off")
    assert class_archive_options({}) is None


@pytest.mark.verifier_deps
def test_class_archives_of_other_installs_do_not_pile_up(tmp_path, monkeypatch) -> None:
    """Every PySpark install (each fresh clone's venv) has its own archive key, and an
    archive is ~170 MB: of the archives and unfinished parts of other keys, the newest two
    are kept and the others removed once untouched for a day (a run may still be writing
    a recent part)."""
    import time

    from spark_jobs.session import class_archive_options

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("CDC_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "cdc-verify"
    cache.mkdir()
    day = 86_400
    files = {
        "spark-classes-aaaaaaaaaaaaaaaa.jsa": 5 * day,
        "spark-classes-bbbbbbbbbbbbbbbb.123.part": 4 * day,
        "spark-classes-cccccccccccccccc.jsa": 3 * day,
        "spark-classes-dddddddddddddddd.456.part": 2 * day,
        "spark-classes-eeeeeeeeeeeeeeee.789.part": 600,  # being written
        "notes.txt": 9 * day,  # not ours
    }
    now = time.time()
    for name, age in files.items():
        (cache / name).write_bytes(b"x")
        os.utime(cache / name, (now - age, now - age))
    if class_archive_options({}) is None:
        pytest.fail("no java found: the verifier needs one")
    left = {p.name for p in cache.iterdir()}
    assert left == {"spark-classes-dddddddddddddddd.456.part", "spark-classes-eeeeeeeeeeeeeeee.789.part", "notes.txt"}
