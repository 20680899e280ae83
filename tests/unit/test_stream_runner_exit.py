"""PySpark's streaming source runner, driven as the JVM drives it, then left by the JVM: the
runner must end quietly (spark_jobs/common.py `stream_reader_stopped`). The JVM's side of the
protocol is written here from pyspark/sql/streaming/python_streaming_source_runner.py `main`
and pyspark/worker_util.py: the worker connects to PYTHON_WORKER_FACTORY_SOCK_PATH (a Unix
socket, no secret) and writes its pid; the JVM sends the Python version, the Spark files
directory and the includes, the pickled data source, the output schema as JSON and the Arrow
batch size; the worker answers 0 once its reader is made, then waits for the JVM's calls."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.verifier_deps  # PySpark's runner and data sources


def _utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!i", len(data)) + data


def _runner_left_by_the_jvm(tmp_path: Path, source: object) -> tuple[int, str]:
    from pyspark import cloudpickle
    from pyspark.sql.types import StringType, StructField, StructType

    path = str(tmp_path / "w.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    env = {**os.environ, "PYTHON_WORKER_FACTORY_SOCK_PATH": path, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark.sql.streaming.python_streaming_source_runner"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        server.settimeout(60)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            conn.recv(4)  # the worker's pid
            pickled = cloudpickle.dumps(source)
            schema = StructType([StructField("x", StringType())]).json()
            conn.sendall(
                _utf("%d.%d" % sys.version_info[:2]) + _utf(str(tmp_path)) + struct.pack("!i", 0)
                + struct.pack("!i", len(pickled)) + pickled + _utf(schema) + struct.pack("!i", 10_000)
            )  # fmt: skip
            assert struct.unpack("!i", conn.recv(4))[0] == 0, "the reader was not made"
        # the socket closed, as when the query stops: the runner reads EOF in its loop
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.parametrize("kind", ["kafka", "binlog", "rabbitmq", "nats"])
def test_a_streaming_reader_left_by_the_jvm_ends_quietly(tmp_path, kind):
    if kind == "kafka":
        from spark_jobs.kafka.stream import KafkaStreamDataSource as Source
    elif kind == "binlog":
        from spark_jobs.mysql.binlog_stream import BinlogStreamDataSource as Source
    elif kind == "rabbitmq":
        from spark_jobs.rabbitmq.stream import RabbitMQStreamDataSource as Source
    else:
        from spark_jobs.nats.stream import NatsStreamDataSource as Source
    code, out = _runner_left_by_the_jvm(tmp_path, Source({}))
    assert (code, out) == (0, ""), out
