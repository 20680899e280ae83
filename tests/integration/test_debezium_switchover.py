"""Switch-over from Debezium (issue 14): Debezium 3.6 embedded publishes a running workload
to the Kafka stand-in and is SIGKILLed mid-stream; `cdc adopt` takes its stored offset,
`cdc run` goes on while the workload continues; the independent checker finds every
committed event exactly once across Debezium's records and the relay's, in commit order
per key. Five runs, each killed at another point of the stream (a random number of
records in, then a random moment later), each with its own database and topics; odd runs
adopt from a Kafka Connect offsets topic holding Debezium's records (`--debezium-offsets-topic`),
even runs from its file offset store (`--debezium-offsets-file`).

A kill can land inside Debezium's offset save: its FileOffsetBackingStore rewrites the file
in place and leaves it empty or cut short. Such an attempt checks that `cdc adopt` refuses
the file in one line (exit 2, no traceback) and the run starts again (new database and
topics) with a kill at another moment, so every run still ends in a proven switch-over.
One run's first attempt always meets that file (cut as a kill inside the save leaves it),
so the path is exercised every time, not only when the kill happens to land there.

The server runs with `--version=5.7.19-log`, a test device only (tests/integration/
debezium_harness.py): Debezium's MySQL connector refuses MariaDB 10.11's version string.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest
from debezium_harness import (
    DebeziumProcess,
    debezium_mariadb,
    debezium_properties,
    publish_offsets_topic,
    seed_offsets,
    stored_offset,
)
from harness import OUTBOX_DDL, ROOT, RelayProcess, _to_toml, env_for, master_position, relay_raw_config, wait_until
from independent_checker import check, committed_outbox_events, topic_records

from connectors.debezium.java_offset_file import OffsetFileCutShort, read_offset_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNS = 5
ATTEMPTS = 4  # per run: a kill inside the offset save (rare) makes the run start again


@pytest.fixture(scope="module")
def dbz_db():
    with debezium_mariadb(server_id=21) as db:
        yield db


class Writer:
    """Commits transactions of 1-3 outbox rows (two aggregate types, six keys) until stopped."""

    def __init__(self, db, database: str, rng: random.Random):
        self._db, self._database, self._rng = db, database, rng
        self._stop = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._db.connect(self._database) as conn, conn.cursor() as cur:
                n = 0
                while not self._stop.is_set():
                    rows = []
                    for _ in range(self._rng.randint(1, 3)):
                        rows.append(
                            (
                                str(uuid.uuid4()),
                                self._rng.choice(["order", "user"]),
                                f"k{self._rng.randint(0, 5)}",
                                "created",
                                json.dumps({"n": n}),
                            )
                        )
                        n += 1
                    cur.executemany(
                        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s,%s,%s,%s,%s)",
                        rows,
                    )
                    if self._rng.random() < 0.1:
                        conn.rollback()  # never a message, from either side
                    else:
                        conn.commit()
                        self.committed += 1
                    time.sleep(self._rng.uniform(0.001, 0.006))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error:
            raise self.error


def cdc_adopt(db, config_path, name: str, offset_source: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cdc_cli.main",
            "adopt",
            "--config",
            str(config_path),
            "--debezium-connector",
            name,
            *offset_source,
        ],
        cwd=ROOT,
        env={**__import__("os").environ, **env_for(db)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def cut_short(path) -> bool:
    """Whether Debezium's offset file is as a kill inside its save leaves it."""
    try:
        read_offset_file(path)
    except OffsetFileCutShort:
        return True
    return False


def test_switch_over_from_debezium_killed_mid_stream(dbz_db, kafka, tmp_path):
    rng = random.Random(1414)
    skipped_total = 0
    report = []
    targets = rng.sample(range(15, 400), RUNS)  # a different point of the stream in every run
    cut_run = rng.randrange(RUNS)  # its first attempt meets the file a kill inside the save leaves
    for run in range(RUNS):
        for attempt in range(ATTEMPTS):
            database, prefix = f"sw{run}_{uuid.uuid4().hex[:6]}", f"sw{run}{uuid.uuid4().hex[:6]}"
            work = tmp_path / f"run{run}-{attempt}"
            work.mkdir()
            dbz_db.create_database(database)
            with dbz_db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(OUTBOX_DDL.format(name="outbox"))
            for aggregate in ("order", "user"):
                kafka.create_topic(f"{prefix}.{aggregate}", partitions=3)
            start = master_position(dbz_db)
            file, pos = start.split(":")
            name = f"dbz-{prefix}"
            seed_offsets(work / "offsets.dat", name, prefix, file, int(pos))
            writer = Writer(dbz_db, database, rng)
            props = debezium_properties(dbz_db, database, name, prefix, prefix + ".${routedByValue}", work)
            debezium = DebeziumProcess(props, work, sink="kafka", bootstrap=kafka.bootstrap_servers)
            target = targets[run] if attempt == 0 else rng.randint(15, 400)
            try:
                wait_until(
                    lambda: debezium.produced() >= target or not debezium.alive(),
                    120,
                    f"Debezium publishing {target} records (log: {debezium.log_path})",
                )
                assert debezium.alive(), debezium.log_text()[-3000:]
                time.sleep(rng.uniform(0.0, 0.4))  # a random moment: inside a batch, before or after a flush
            finally:
                debezium.kill()
            by_debezium = debezium.produced()
            raw = relay_raw_config(
                dbz_db, kafka, database, prefix, work / "checkpoint.json", lease__ttl_s=5, lease__renew_s=0.5
            )
            config_path = work / "relay.toml"
            config_path.write_text(_to_toml(raw))
            offsets_file = work / "offsets.dat"
            if run == cut_run and attempt == 0:  # what save() leaves when killed after truncating the file
                data = offsets_file.read_bytes()
                offsets_file.write_bytes(data[: rng.choice([0, rng.randrange(1, len(data))])])
            if not cut_short(offsets_file):
                break
            writer.stop()
            refused = cdc_adopt(dbz_db, config_path, name, ["--debezium-offsets-file", str(offsets_file)])
            lines = refused.stderr.strip().splitlines()
            assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
            assert re.search(r"is (empty|truncated after \d+ bytes): Debezium was stopped while saving it", lines[0])
            assert "no position can be taken from it" in lines[0] and "--debezium-offsets-topic" in lines[0]
            assert not (work / "checkpoint.json").exists()
            report.append(
                f"run {run} attempt {attempt}: Debezium killed inside its offset save after {by_debezium} "
                f"records ({offsets_file.stat().st_size} bytes left): `cdc adopt` exit 2, "
                f"{lines[0].rsplit('offsets.dat', 1)[-1][:90]}...; again at another moment"
            )
        else:
            raise AssertionError(f"run {run}: every kill of {ATTEMPTS} landed inside the offset save: {report}")
        offset = stored_offset(offsets_file, name, prefix)
        assert offset is not None, "Debezium stored no offset before it was killed"

        # The relay adopts while the application keeps writing.
        if run % 2:
            offsets_topic = f"connect-offsets-{prefix}"
            kafka.create_topic(offsets_topic, partitions=5)
            publish_offsets_topic(kafka.bootstrap_servers, offsets_topic, offsets_file, name, prefix)
            offset_source = ["--debezium-offsets-topic", offsets_topic]
        else:
            offset_source = ["--debezium-offsets-file", str(offsets_file)]
        adopt = cdc_adopt(dbz_db, config_path, name, offset_source)
        assert adopt.returncode == 0, adopt.stderr + adopt.stdout
        assert f"{offset['file']}:{offset['pos']}" in adopt.stdout
        relay = RelayProcess(raw, env_for(dbz_db), work / "relay")
        try:
            time.sleep(rng.uniform(0.5, 1.5))
            writer.stop()
            head = master_position(dbz_db)
            cp_path = work / "checkpoint.json"

            def caught_up() -> bool:
                if not relay.alive():
                    raise AssertionError(f"the relay exited: {relay.log_text()[-3000:]}")
                try:
                    cp = json.loads(cp_path.read_text())
                except (OSError, ValueError):
                    return False
                return f"{cp['file']}:{cp['pos']}" == head and "adopted" not in cp

            wait_until(caught_up, 120, f"the relay reaching {head}")
            assert relay.terminate() == 0
        finally:
            if relay.alive():
                relay.kill()
        log_text = relay.log_text()
        m = re.search(r"(\d+) events Debezium had published after its offset were not sent again", log_text)
        assert m, log_text[-3000:]
        skipped_total += int(m.group(1))

        committed = committed_outbox_events(dbz_db.connection_settings(), database, start_file=file, start_pos=int(pos))
        truncated: list = []
        records = topic_records(kafka.bootstrap_servers, [f"{prefix}.order", f"{prefix}.user"], truncated)
        result = check(committed, records, truncated)
        report.append(
            f"run {run} ({offset_source[0][2:]}): Debezium killed after {by_debezium} records (offset {offset}); "
            f"relay skipped {m.group(1)} it had published past that offset; {result.summary()}"
        )
        assert by_debezium > 0 and len(records) > by_debezium, report[-1]
        assert result.clean, report[-1]
        assert not result.missing and not result.duplicates
    print("\n".join(report))
    assert skipped_total > 0, "in no run had Debezium published past its stored offset: the id matching went untested"
