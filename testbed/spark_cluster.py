"""A Spark standalone cluster on this machine: a master and workers (1 core, 2 GiB each)
started from the PySpark installation's own `spark-class` (`org.apache.spark.deploy.master.
Master`, `...worker.Worker spark://127.0.0.1:<port>`), stopped at the end. The suite's cluster
tests (tests/integration/test_spark_cluster.py) and `bench/verify_follow.py --cluster` start
it; the master's web UI answers its state as JSON at `/json/`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.process import free_port


def cluster_state(ui_port: int) -> dict[str, Any]:
    """The master's state (`aliveworkers`, `activeapps`, ...); {} while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):  # ValueError: a master just started can answer its HTML page
        return {}


@contextmanager
def standalone_cluster(workers: int, work: Path, timeout_s: float = 90) -> Iterator[tuple[str, int, list[int]]]:
    """(master URL, the master's web UI port, the workers' pids); logs in `work`."""
    bin_dir = Path(sys.executable).parent
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(work / "spark-work"),
           "SPARK_LOG_DIR": str(work / "spark-logs"), "PYSPARK_PYTHON": sys.executable}  # fmt: skip
    procs: list[subprocess.Popen] = []
    logs = []

    def spawn(name: str, *cmd: str) -> subprocess.Popen:
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115  # the child writes it until it is stopped
        logs.append(log)
        proc = subprocess.Popen([str(bin_dir / "spark-class"), *cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    def wait(what: str, ok: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark cluster: no {what} after {timeout_s:g} s: see the logs in {work}")
            time.sleep(0.5)

    master = f"spark://127.0.0.1:{port}"
    try:
        spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))  # fmt: skip
        wait("master", lambda: bool(cluster_state(ui)))
        pids = [
            spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "2g", "--webui-port", str(free_port()), "--work-dir", str(work / f"work{i}")).pid
            for i in range(1, workers + 1)
        ]  # fmt: skip
        wait(f"{workers} alive workers", lambda: cluster_state(ui).get("aliveworkers") == workers)
        yield master, ui, pids
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for log in logs:
            log.close()
