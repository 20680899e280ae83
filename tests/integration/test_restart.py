"""Issue 21: a relay restarted at once after a clean stop (SIGTERM) or a crash (SIGKILL)
starts, with its preflight on, and publishes; a relay of another source with the same
replica server id is still refused in one line naming its session (a second relay of the
same source is a standby: tests/integration/test_lease.py).

`cdc run` runs here *with* its preflight (harness.RelayProcess passes --skip-check)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from connectors.kafka.reader import KafkaTopicReader
from tests.integration.harness import (
    OUTBOX_DDL,
    _to_toml,
    env_for,
    insert_events,
    read_topic,
    relay_raw_config,
    wait_until,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RESTARTS = 20


class CdcRun:
    """`cdc run --config ...` as a real process, preflight included."""

    def __init__(self, raw: dict, env: dict[str, str], workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "relay.toml"
        self.config_path.write_text(_to_toml(raw))
        self.log_path = workdir / f"relay-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # the child process writes it until it is stopped
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdc_cli.main", "run", "--config", str(self.config_path)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def running_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for `condition` while the process runs; it must still run then (its log otherwise)."""
        wait_until(lambda: not self.alive() or condition(), timeout, what)
        assert self.alive(), f"exited {self.proc.returncode} before {what}: {self.log_text()[-3000:]}"

    def stop(self, sig: int, timeout: float = 60.0) -> int:
        if self.alive():
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class Published:
    """How many records a topic holds (sum of its partitions' high watermarks)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self._reader, self._topic, self._partitions = KafkaTopicReader(bootstrap), topic, partitions

    def __call__(self) -> int:
        return sum(self._reader.watermarks(self._topic, p)[1] for p in range(self._partitions))

    def close(self) -> None:
        self._reader.close()


def sessions_with(db, server_id: int) -> list[tuple]:
    with db.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SHOW SLAVE HOSTS")
        return [row for row in cur.fetchall() if int(row[0]) == server_id]


def dump_connections(db) -> list[tuple]:
    with db.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE COMMAND = 'Binlog Dump'")
        return list(cur.fetchall())


@pytest.fixture
def setup(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topic = f"{topic_prefix}.order"
    kafka.create_topic(topic, 2)
    published = Published(kafka.bootstrap_servers, topic, 2)
    yield topic, published
    published.close()


def insert_one(db, database: str, event_id: str) -> None:
    with db.connect(database) as conn:
        insert_events(conn, "outbox", [(event_id, "order", "k", "created", "{}")])
        conn.commit()


@pytest.mark.fault
@pytest.mark.parametrize(
    "reader, decoder, restarts",
    [
        ("process", "fast", 8),
        # issue 21's 20 in a row (about 3 s a clean stop and start): `./run.sh test -m extended`
        pytest.param("process", "fast", RESTARTS, marks=pytest.mark.extended),
        ("thread", "fast", 3),
        ("process", "library", 3),
    ],
)
def test_restart_at_once_after_sigterm(
    reader, decoder, restarts, mariadb, kafka, database, topic_prefix, tmp_path, setup
):
    """A clean stop ends the binlog session on the server before the relay exits: with
    a 2 s heartbeat the server would otherwise keep it for 2-4 s. 8 times with the
    default reader process in the README's test command, the 20 of issue 21 with
    `./run.sh test -m extended`; a few times with the reader thread and the library decoder.
    (After SIGKILL the next test restarts 20 times in the README's test command.)"""
    topic, published = setup
    raw = relay_raw_config(
        mariadb,
        kafka,
        database,
        topic_prefix,
        tmp_path / "cp.json",
        source__heartbeat_s=2.0,
        source__reader=reader,
        source__decoder=decoder,
    )
    raw_rid = raw["source"]["replica_server_id"]
    for i in range(restarts):
        insert_one(mariadb, database, f"e-{i}")
        before = {r[0] for r in dump_connections(mariadb)}
        relay = CdcRun(raw, env_for(mariadb), tmp_path / f"run-{i}")
        try:
            relay.running_until(lambda i=i: published() >= i + 1, 60, f"event e-{i} published by start {i}")
            # (python-mysql-replication registers no report host: not in SHOW SLAVE HOSTS)
            assert decoder == "library" or sessions_with(mariadb, raw_rid), "the relay should be listed"
            mine = {r[0] for r in dump_connections(mariadb)} - before
            assert mine, "the running relay should have a Binlog Dump connection"
        finally:
            code = relay.stop(signal.SIGTERM)
        stopped = time.monotonic()
        log = relay.log_text()
        assert code == 0, f"start {i}: exit {code}: {log[-3000:]}"
        assert "stopped at" in log and "Traceback" not in log, log[-3000:]
        assert "another replica" not in log and "previous session" not in log, log[-3000:]
        wait_until(
            lambda mine=mine: (
                not sessions_with(mariadb, raw_rid) and not mine & {r[0] for r in dump_connections(mariadb)}
            ),
            1.0,
            f"the session of start {i} to end at its stop",
        )
        assert time.monotonic() - stopped < 1.0
    records = read_topic(kafka.bootstrap_servers, topic)
    assert sorted(r.value["id"] for r in records) == sorted(f"e-{i}" for i in range(restarts))


@pytest.mark.fault
def test_restart_at_once_after_sigkill_20_times_and_its_start_up_time(
    mariadb, kafka, database, topic_prefix, tmp_path, setup
):
    """SIGKILL leaves the dump thread on the server; the next start ends it (KILL) and
    publishes. Start-up (process start to its event published) median of 10 restarts
    after a SIGKILL < heartbeat + 2 s, with the default heartbeat (1 s)."""
    heartbeat = 1.0
    topic, published = setup
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", source__heartbeat_s=heartbeat)
    rid = raw["source"]["replica_server_id"]
    times, ended = [], 0
    for i in range(RESTARTS):
        insert_one(mariadb, database, f"e-{i}")
        relay = CdcRun(raw, env_for(mariadb), tmp_path / f"run-{i}")
        try:
            relay.running_until(lambda i=i: published() >= i + 1, 60, f"event e-{i} published by start {i}")
            took = time.monotonic() - relay.started
            assert sessions_with(mariadb, rid), "the running relay should be listed with its server id"
        finally:
            relay.stop(signal.SIGKILL)
        log = relay.log_text()
        assert "another replica" not in log and "Traceback" not in log, log[-3000:]
        if i > 0:
            times.append(took)
            ended += "ended this relay's previous session" in log
    # Whether a start still finds the killed relay's session depends on the server: its dump
    # thread ends the session itself once a write to the dead socket fails (the next event or
    # heartbeat, one or two heartbeat periods). A start quicker than that ends it; a slower one
    # (a loaded machine: 2 of 19 under a suite on two workers at load 17) finds it gone. The
    # count is printed; that a start ends the session it finds is
    # test_a_start_ends_its_killed_predecessors_session_the_server_still_holds's.
    median = statistics.median(times[:10])
    print(
        f"\nstart-up after SIGKILL (process start -> event published), heartbeat {heartbeat} s: median of 10 "
        f"{median:.2f} s, all {len(times)}: min {min(times):.2f} median {statistics.median(times):.2f} "
        f"max {max(times):.2f}; {ended} of {len(times)} starts ended the previous session"
    )
    assert median < heartbeat + 2.0, times
    records = read_topic(kafka.bootstrap_servers, topic)
    assert sorted(r.value["id"] for r in records) == sorted(f"e-{i}" for i in range(RESTARTS))


@pytest.mark.fault
def test_a_start_ends_its_killed_predecessors_session_the_server_still_holds(
    mariadb, kafka, database, topic_prefix, tmp_path, setup
):
    """A relay SIGKILLed while the server is quiet leaves its binlog session on the server
    (no event and, with a 30 s heartbeat, no heartbeat writes to the dead socket for the dump
    thread to fail on); the next start of the same relay proves the session its own and dead,
    ends it and publishes."""
    topic, published = setup
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", source__heartbeat_s=30.0)
    rid = raw["source"]["replica_server_id"]
    insert_one(mariadb, database, "e-0")
    first = CdcRun(raw, env_for(mariadb), tmp_path / "first")
    try:
        first.running_until(lambda: published() >= 1, 60, "the first start to publish")
    finally:
        first.stop(signal.SIGKILL)
    assert sessions_with(mariadb, rid), "the killed relay's session should still be on the server"
    second = CdcRun(raw, env_for(mariadb), tmp_path / "second")
    try:
        second.running_until(
            lambda: "ended this relay's previous session" in second.log_text(),
            60,
            "the second start to end the killed relay's session",
        )
        insert_one(mariadb, database, "e-1")
        second.running_until(lambda: published() >= 2, 60, "the second start to publish")
    finally:
        code = second.stop(signal.SIGTERM)
    log = second.log_text()
    assert code == 0 and "another replica" not in log and "Traceback" not in log, log[-3000:]
    records = read_topic(kafka.bootstrap_servers, topic)
    assert sorted(r.value["id"] for r in records) == ["e-0", "e-1"]


def test_a_second_relay_with_the_same_server_id_is_refused_naming_its_session(
    mariadb, kafka, database, topic_prefix, tmp_path, setup
):
    _topic, published = setup
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    rid = raw["source"]["replica_server_id"]
    insert_one(mariadb, database, "first")
    first = CdcRun(raw, env_for(mariadb), tmp_path / "first")
    try:
        first.running_until(lambda: published() >= 1, 60, "the first relay to publish")
        [(_, tag, *_)] = sessions_with(mariadb, rid)
        [(conn_id, host)] = [r for r in dump_connections(mariadb) if tag.startswith(f"cdc;c={r[0]};")]
        # Another source (a relay of the same config would be a standby: test_lease.py)
        # registering with the same replica server id.
        second_raw = {
            **raw,
            "source": {**raw["source"], "name": raw["source"]["name"] + "-other"},
            "checkpoint": {**raw["checkpoint"], "path": str(tmp_path / "cp2.json")},
        }
        path = tmp_path / "second.toml"
        path.write_text(_to_toml(second_raw))
        for args in (["run", "--config", str(path)], ["check", "--config", str(path)]):
            began = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", "cdc_cli.main", *args],
                cwd=ROOT,
                env={**os.environ, **env_for(mariadb)},
                capture_output=True,
                text=True,
                timeout=90,
            )
            text = result.stdout + result.stderr
            assert result.returncode == 2, text
            assert "Traceback" not in text and (not mariadb.password or mariadb.password not in text), text
            if args[0] == "run":
                lines = [line for line in result.stderr.splitlines() if line.startswith("cdc: ")]
            else:
                lines = [line for line in result.stdout.splitlines() if line.startswith("FAIL replica_server_id")]
            assert len(lines) == 1, text
            for fragment in (
                f"another replica is connected with server id {rid}",
                f"connection {conn_id}",
                f"from {host}",
                "source.replica_server_id",
            ):
                assert fragment in lines[0], (fragment, lines[0])
            assert time.monotonic() - began < 30
        # the first relay was not disturbed: still running, still publishing
        assert first.alive(), first.log_text()[-3000:]
        assert conn_id in [r[0] for r in dump_connections(mariadb)], "the first relay's session was ended"
        insert_one(mariadb, database, "second")
        wait_until(lambda: published() >= 2, 30, "the first relay to publish on")
    finally:
        code = first.stop(signal.SIGTERM)
    assert code == 0, first.log_text()[-3000:]
