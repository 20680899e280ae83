"""The fault suite on the NATS JetStream sink: while mixed transactions are committed
(1-5 events, some rolled back, a tenth XA), `cdc run` publishing to a real nats-server
is SIGKILLed at random moments and at every crash point of cdc/crashpoints.py, and the
server is restarted (SIGTERM), killed (SIGKILL) and restarted, and cut off (SIGSTOP)
and back (SIGCONT) under a running relay, which must ride those out. Afterwards a clean
relay catches up and the independent checker compares the binlog's committed outbox
inserts with what the streams hold, read by the verifier's reader
(spark_jobs/nats/source.py): 0 missing, 0 duplicates, 0 per-key reorders.

Short by default (a few thousand events). The run of record, 50k events:

    CDC_NATS_FAULT_EVENTS=50000 ./run.sh test tests/integration/test_nats_sink_faults.py -s
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from cdc import crashpoints
from tests.integration.final_relay import catch_up_and_check
from tests.integration.harness import OUTBOX_DDL, RelayProcess, wait_until
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config, stream_records
from tests.integration.test_faults import AGGREGATES, Writer

pytestmark = [pytest.mark.integration, pytest.mark.fault]
EVENTS = int(os.environ.get("CDC_NATS_FAULT_EVENTS", "3000"))
LONG = EVENTS >= 20_000
POINTS = (
    "mid_transaction",
    "after_produce",
    "after_ack_before_checkpoint",
    "recovery",
    "checkpoint_write",
    "xa_prepared",
    "xa_outcome",
)


@pytest.fixture
def nats_own():
    """A server of this test's own: it is restarted, killed and paused."""
    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:
        yield server


def _delivers(relay: RelayProcess, checkpoint: Path) -> None:
    """Wait until the running relay has moved its checkpoint (it publishes again)."""
    before = checkpoint.read_text() if checkpoint.exists() else ""
    wait_until(
        lambda: not relay.alive() or (checkpoint.exists() and checkpoint.read_text() not in (before, "")),
        120,
        "the relay to deliver and checkpoint",
    )
    assert relay.alive(), f"the relay did not ride out the broker's faults:\n{relay.log_text()[-3000:]}"


def test_exactly_once_across_relay_kills_and_broker_faults(mariadb, nats_own, database, topic_prefix, tmp_path):
    assert set(POINTS) == set(crashpoints.POINTS) - {"txn_before_commit", "txn_after_commit"}
    prefix, server = topic_prefix, nats_own
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    subjects = [f"{prefix}.{a}" for a in AGGREGATES]
    create_streams(server, {f"{prefix}_events": subjects, f"{prefix}_dlq": [f"{prefix}.dlq"]})
    raw = nats_raw_config(mariadb, server, database, prefix, tmp_path / "cp.json")
    env = nats_env(mariadb, server)
    # Writes through every phase (a crash point needs new events to reach); the long run in
    # larger transactions (1-30 rows: 50k events in minutes, not an hour of commits).
    writer = Writer(lambda: mariadb.connect(database), 10**9, pause_s=0.002, max_rows=30 if LONG else 5)
    writer.start()
    rng = random.Random(29)
    t0 = time.monotonic()
    rounds = 0
    kills = broker_faults = 0
    reached = dict.fromkeys(POINTS, 0)
    try:
        # Rounds of every fault kind until EVENTS were written (one round in the short run).
        while rounds == 0 or (LONG and writer.attempted < EVENTS and writer.is_alive()):
            rounds += 1
            for _ in range(6 if LONG else 3):  # SIGKILL at a random moment
                relay = RelayProcess(raw, env, tmp_path)
                time.sleep(rng.uniform(1.0, 4.0))  # the fault's timing, not a wait for a condition
                relay.kill()
                kills += 1
            for point in POINTS:  # SIGKILL at a crash point (by the relay itself)
                nth = {"recovery": 1, "after_ack_before_checkpoint": 1}.get(point) or rng.randint(1, 3)
                if point in ("mid_transaction", "after_produce"):
                    nth = rng.randint(1, 400)
                relay = RelayProcess(raw, env, tmp_path, crash_at=f"{point}@{nth}")
                try:
                    relay.wait(90)
                    reached[point] += 1
                except Exception:  # not reached in time (no XA transaction came): killed from outside
                    relay.kill()
            # The broker's faults under one running relay, which must ride them out.
            relay = RelayProcess(raw, env, tmp_path)
            cp = Path(raw["checkpoint"]["path"])
            try:
                _delivers(relay, cp)
                server.restart()  # SIGTERM, start again on the same port and store
                _delivers(relay, cp)
                server.restart(graceful=False)  # SIGKILL
                _delivers(relay, cp)
                server.pause()  # cut off: the connection stays, nothing answers
                time.sleep(rng.uniform(4.0, 8.0))  # longer than ack_timeout_s: the relay sends again
                server.resume()
                _delivers(relay, cp)
                broker_faults += 3
                assert "sending" in relay.log_text(), "the relay never connected again"
            finally:
                relay.kill()
    finally:
        writer.stop_flag.set()
        writer.finish()
    result = catch_up_and_check(
        mariadb, database, raw, env, tmp_path, lambda: stream_records(server, [*subjects, f"{prefix}.dlq"]),
        600 if LONG else 240,
    )  # fmt: skip
    print(
        f"\nNATS faults: {kills} random SIGKILLs, crash points reached {reached}, "
        f"{broker_faults} broker faults (restart, kill, pause) over {writer.attempted} attempted events "
        f"({writer.xa_prepared} XA) in {time.monotonic() - t0:.0f}s: {result.summary()}"
    )
    assert result.committed > (EVENTS // 2)
    assert result.clean, result.summary()
    assert all(n == rounds for n in reached.values()), reached
