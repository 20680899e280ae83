"""`pip install .` gives the relay without PySpark or PyArrow: in a fresh virtualenv (the
packages come from this machine's package mirror, as any install's would), `cdc --version`
answers, `cdc check` and `cdc run` work against the real MariaDB and the Kafka stand-in,
and `cdc verify` says in one line which extra it needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.harness import (
    OUTBOX_DDL,
    _to_toml,
    env_for,
    insert_events,
    read_topic,
    relay_raw_config,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def relay_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("relay-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Not editable, from a copy pip makes of the tree: the installed package is what runs.
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(ROOT)],
        cwd=venv,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def _cdc(venv: Path, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120):
    # cwd outside the source tree: `import cdc` must find the installed copy, not ./cdc
    return subprocess.run(
        [str(venv / "bin" / "cdc"), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_install_holds_no_spark_and_answers_its_version(relay_venv, tmp_path):
    py = relay_venv / "bin" / "python"
    probe = subprocess.run(
        [
            str(py),
            "-c",
            "import importlib.util as u, cdc_cli.app, cdc_cli.main, cdc; "
            "print(u.find_spec('pyspark'), u.find_spec('pyarrow'), cdc.__file__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    spark, arrow, where = probe.stdout.split()
    assert (spark, arrow) == ("None", "None")
    assert str(relay_venv) in where, where  # the installed package, not the source tree
    version = _cdc(relay_venv, ["--version"], {}, tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == "cdc 0.1.0", version


def test_cdc_check_and_cdc_run_without_spark(relay_venv, mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", lease__enabled=False)
    config = tmp_path / "relay.toml"
    config.write_text(_to_toml(raw))
    env = env_for(mariadb)

    check = _cdc(relay_venv, ["check", "--config", str(config)], env, tmp_path)
    assert "Traceback" not in check.stderr, check.stderr
    assert check.returncode == 0, check.stdout + check.stderr

    log = (tmp_path / "run.log").open("wb")
    relay = subprocess.Popen(
        [str(relay_venv / "bin" / "cdc"), "run", "--config", str(config)],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        ids = [str(uuid.uuid4()) for _ in range(5)]
        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(i, "order", "k1", "Created", '{"n": 1}') for i in ids])
            conn.commit()
        records = wait_until(
            lambda: (
                len(read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")) >= 5
                and read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")
            ),
            90,
            "the installed relay to publish 5 events",
        )
        assert [r.headers["id"] for r in records] == ids
    finally:
        relay.send_signal(signal.SIGTERM)
        code = relay.wait(60)
        log.close()
    assert code == 0, (tmp_path / "run.log").read_text()

    verify = _cdc(relay_venv, ["verify", "--config", str(config)], env, tmp_path)
    lines = verify.stderr.strip().splitlines()
    assert verify.returncode == 2 and len(lines) == 1 and "[verify]" in lines[0], verify.stderr
