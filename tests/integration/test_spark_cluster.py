"""The verifier on a real Spark standalone cluster: a master and two workers started from
the PySpark installation's own `spark-class` (stopped at the end), then the batch verifier
(`cdc verify --master spark://...` and `spark-submit --master spark://... spark_jobs/verify.py`)
and the following verifier (`cdc verify --follow --master spark://...`) beside a running
relay. Executors are separate JVMs with their own Python workers: the data sources are
pickled to them, and the project's modules come from the same virtualenv."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cdc.config import load_config
from testbed.spark_cluster import cluster_state, standalone_cluster
from tests.integration.harness import OUTBOX_DDL, ROOT, _to_toml, env_for, insert_events, relay_raw_config, wait_until
from tests.integration.test_follow import Relay, Writer, _free_port, _metrics

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`spark://127.0.0.1:<port>` of a master and two workers (1 core, 2 GiB each)."""
    with standalone_cluster(2, tmp_path_factory.mktemp("spark-cluster")) as (master, ui, _pids):
        yield {"master": master, "ui": ui}


@pytest.fixture
def published(mariadb, kafka, database, topic_prefix, tmp_path):
    """60 events published by the real relay; (raw config, config file, start file)."""
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    kafka.create_topic(f"{topic_prefix}.order", 3)
    kafka.create_topic(f"{topic_prefix}.dlq", 1)
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    cfg = load_config(raw, env_for(mariadb))
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    return raw, cfg, path


def _apps(ui: int) -> list[str]:
    state = cluster_state(ui)
    return [a["name"] for a in state.get("activeapps", []) + state.get("completedapps", [])]


def _publish_60(mariadb, database, cfg) -> None:
    """60 events written in 6 transactions and published by the real relay, stopped after."""
    relay = Relay(cfg)
    try:
        with mariadb.connect(database) as conn:
            for start in range(0, 60, 10):
                insert_events(
                    conn,
                    "outbox",
                    [(str(uuid.uuid4()), "order", f"k{n % 5}", "Created", "{}") for n in range(start, start + 10)],
                )
                conn.commit()
        wait_until(lambda: relay.handle.metrics.events_published >= 60, 60, "60 events published")
    finally:
        relay.stop()


def test_batch_verify_on_the_standalone_cluster(mariadb, database, published, cluster, tmp_path) -> None:
    raw, cfg, path = published
    _publish_60(mariadb, database, cfg)
    env = {**os.environ, **env_for(mariadb)}
    start_file = raw["source"]["start"].split(":")[0]
    apps_before = len(_apps(cluster["ui"]))
    proc = subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", "verify", "--config", str(path), "--master", cluster["master"],
         "--output-dir", str(tmp_path / "out"), "--start-file", start_file],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["ok"] and report["counts"]["delivered"] == 60
    assert report["config"]["spark_master"] == cluster["master"]
    assert len(_apps(cluster["ui"])) == apps_before + 1  # it ran as an application of the cluster


@pytest.mark.extended
def test_spark_submit_of_the_batch_verifier_to_the_standalone_cluster(
    mariadb, database, published, cluster, tmp_path
) -> None:
    """The job above through spark-submit to the existing cluster (its --master wins): a
    further variant of two kinds the default run proves, the batch verifier on the cluster
    (`cdc verify --master`, above) and `spark_jobs/verify.py` through spark-submit
    (`test_verifier.py::test_spark_submit_entry_point`, local); `./run.sh test -m extended`."""
    raw, cfg, _path = published
    _publish_60(mariadb, database, cfg)
    env = {**os.environ, **env_for(mariadb)}
    start_file = raw["source"]["start"].split(":")[0]
    apps_before = len(_apps(cluster["ui"]))
    s = mariadb.connection_settings()
    vconf = {
        "source": cfg.source.name, "dlq_topic": raw["kafka"]["dead_letter_topic"], "output_dir": str(tmp_path / "out2"),
        "mysql": {"host": s["host"], "port": s["port"], "user": s["user"], "password_env": "CDC_TEST_MYSQL_PASSWORD"},
        "kafka": {"bootstrap": raw["kafka"]["bootstrap"]}, "start_file": start_file,
        "outbox": {"tables": raw["outbox"]["tables"]},
    }  # fmt: skip
    (tmp_path / "verify.json").write_text(json.dumps(vconf))
    proc = subprocess.run(
        [str(BIN / "spark-submit"), "--master", cluster["master"], "--conf", "spark.ui.enabled=false",
         str(ROOT / "spark_jobs" / "verify.py"), "--config", str(tmp_path / "verify.json"), "--quiet"],
        cwd=str(tmp_path), env={**env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report2 = json.loads((tmp_path / "out2" / "report.json").read_text())
    assert report2["ok"] and report2["counts"]["delivered"] == 60
    assert len(_apps(cluster["ui"])) == apps_before + 1
    assert (mariadb.password or "\0") not in proc.stdout + proc.stderr


def test_following_verifier_on_the_standalone_cluster(mariadb, database, published, cluster, tmp_path) -> None:
    _raw, cfg, path = published
    env = {**os.environ, **env_for(mariadb)}
    port = _free_port()
    relay = Relay(cfg)
    log = open(tmp_path / "follow.log", "wb")  # the child process writes it until it is stopped
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_cli.main", "verify", "--config", str(path), "--follow", "--master", cluster["master"],
         "--output-dir", str(tmp_path / "out"), "--grace", "5", "--trigger", "1", "--metrics-port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    writer = None
    try:
        wait_until(lambda: _metrics(port), 120, "the follow job's metrics endpoint")
        writer = Writer(mariadb, database, interval=0.1)
        time.sleep(5)  # the workload's length: some 50 transactions for the cluster to follow
        writer.stop()
        total = len(writer.ids)
        wait_until(
            lambda: _metrics(port).get('cdc_verify_events{class="delivered"}', 0) >= total,
            120,
            f"{total} events verified",
        )
        wait_until(
            lambda: _metrics(port).get("cdc_verify_verified_through_lag_seconds", 99) < 5,
            60,
            "verified-through at the head",
        )
        m = _metrics(port)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
        if writer is not None:
            writer.stop()
        relay.stop()
    text = (tmp_path / "follow.log").read_text()
    assert code == 0, text[-3000:]
    assert m['cdc_verify_events{class="delivered"}'] == total
    assert m["cdc_verify_problems"] == 0
    assert "cdc-verify-follow" in _apps(cluster["ui"])
