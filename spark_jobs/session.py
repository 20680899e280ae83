"""The Spark session the verifier runs in: its settings, the verifier's data sources
registered with it, and the class-data-sharing archive that makes later JVMs start sooner.

Kept apart from `spark_jobs/common.py`, which the data sources import: registering them
here imports the data sources, never the other way round.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def ensure_pyspark_python() -> None:
    """Python workers must run the interpreter that has this project's dependencies."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register_sources(spark: Any) -> None:
    """Register the verifier's Python data sources (`cdc_binlog`, `cdc_kafka`,
    `cdc_outbox_table`, and the sinks beyond Kafka: `cdc_rabbitmq`, `cdc_nats`) with `spark`. Idempotent: a name already registered with the session is left as it is
    (registrations are per session: `spark.newSession()` starts without them)."""
    from spark_jobs.kafka.source import KafkaDataSource
    from spark_jobs.mysql.binlog_source import BinlogDataSource
    from spark_jobs.mysql.outbox_table_source import OutboxTableDataSource
    from spark_jobs.nats.source import NatsDataSource
    from spark_jobs.rabbitmq.source import RabbitMQDataSource

    for source in (BinlogDataSource, KafkaDataSource, OutboxTableDataSource, RabbitMQDataSource, NatsDataSource):
        try:
            spark.dataSource.register(source)
        except Exception as exc:  # only "already registered" is fine
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise


def class_archive_options(conf: Mapping[str, str]) -> str | None:
    """JVM options that keep a class-data-sharing archive of the classes Spark loads, in
    `~/.cache/cdc-verify/` (about 160 MB): the first run writes it when its JVM exits,
    later runs map it and start several seconds sooner (bench/verify_bench.py). The
    archive is keyed on the java binary and the PySpark install, so an upgrade makes a new
    one; a JVM that cannot use an archive simply starts without it. Off under
    spark-submit (the JVM is already running), when the caller sets
    spark.driver.extraJavaOptions, or with CDC_SPARK_CLASS_ARCHIVE=off."""
    if os.environ.get("PYSPARK_GATEWAY_PORT") or "spark.driver.extraJavaOptions" in conf:
        return None
    if os.environ.get("CDC_SPARK_CLASS_ARCHIVE", "").lower() in ("off", "0", "false", "no"):
        return None
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        import pyspark

        java = os.path.realpath(java)
        stamp = f"{java}:{os.stat(java).st_mtime_ns}:{pyspark.__version__}:{os.path.dirname(pyspark.__file__)}"
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdc-verify"
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    archive = cache / f"spark-classes-{key}.jsa"
    _prune_archives(cache, key)
    quiet = "-Xlog:cds*=off"
    if not archive.exists():
        # A finished archive of an earlier run: written under that run's pid by its JVM at
        # exit; finished once no process holds that pid and the file has stopped growing.
        for part in cache.glob(f"spark-classes-{key}.*.part"):
            pid = part.name.rsplit(".", 2)[-2]
            try:
                if pid.isdigit() and not _alive(int(pid)) and time.time() - part.stat().st_mtime > 5:
                    part.replace(archive)
                    break
            except OSError:
                continue
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} {quiet}"
    return f"-XX:ArchiveClassesAtExit={cache / f'spark-classes-{key}.{os.getpid()}.part'} {quiet}"


KEEP_OTHER_ARCHIVES = 2  # of other PySpark installs (each venv has its own key)
STALE_ARCHIVE_S = 86_400


def _prune_archives(cache: Path, key: str) -> None:
    """Archives and unfinished parts of other keys (other PySpark installs, e.g. a clone
    since deleted) are ~170 MB each: all but the newest two are removed once untouched
    for a day."""
    others = []
    for path in cache.glob("spark-classes-*"):
        if path.name.startswith(f"spark-classes-{key}.") or not path.name.endswith((".jsa", ".part")):
            continue
        try:
            others.append((path.stat().st_mtime, path))
        except OSError:
            continue
    others.sort(reverse=True)
    for mtime, path in others[KEEP_OTHER_ARCHIVES:]:
        if time.time() - mtime > STALE_ARCHIVE_S:
            try:
                path.unlink()
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_spark(
    master: str = "local[*]", app_name: str = "cdc-verify", conf: Mapping[str, str] | None = None, jvm_flags: str = ""
) -> Any:
    """A SparkSession with this project's data sources registered.

    `jvm_flags`: options for the driver's JVM (which runs the executors in local mode) and
    the executors' (on a cluster), after the class archive's; none when the caller sets
    spark.driver.extraJavaOptions / spark.executor.extraJavaOptions itself.

    Under `spark-submit` the master and configuration given there win (getOrCreate
    returns the submitted session)."""
    ensure_pyspark_python()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit the JVM is already up (PYSPARK_GATEWAY_PORT is set) and the
    # master given on its command line must win.
    if master and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = builder.master(master)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.driver.memory": "2g",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        # the verifier caches its two inputs and the joined table once each and scans them
        # a few times: building a compressed cache cost more than it saved (bench/verify_bench.py)
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # the stock worker daemon, without a traceback when the JVM closes a socket first
        "spark.python.daemon.module": "spark_jobs.worker_daemon",
    }
    settings = {**defaults, **dict(conf or {})}
    caller_driver_options = "spark.driver.extraJavaOptions" in settings
    java_options = " ".join(o for o in (class_archive_options(settings), jvm_flags) if o)
    if java_options and not caller_driver_options:
        settings["spark.driver.extraJavaOptions"] = java_options
    if jvm_flags:
        settings.setdefault("spark.executor.extraJavaOptions", jvm_flags)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # A failed task logs its stack traces at ERROR; run_verify raises the failure itself
    # (a data source's own one-line message: ReadFailed), so the terminal gets that line only.
    spark.sparkContext.setLogLevel("FATAL")
    register_sources(spark)
    return spark
