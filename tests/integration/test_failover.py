"""Identity across a failover: where GTIDs exist, a transaction is recognised by its GTID
(set membership), never by file/pos, so a relay that resumes on another server of the
same replication topology neither loses nor repeats an event (docs/recovery.md, "Positions").

Topology: a MariaDB primary (server_id 11) and a GTID replica of it (server_id 12), both
with --log-slave-updates and --gtid-strict-mode. The replica's binary log is rotated
before replication starts, so the primary's file/pos coordinates name nothing on the
replica: only a GTID resume is right there.

    primary <- writer, relay (SIGKILLed mid-stream)
    replica <- replicates everything; after the primary is killed, it is promoted, takes
               writes of its own, and the relay resumes on it from the same checkpoint.

The independent checker then compares the committed outbox inserts in the replica's
binlog (which, thanks to --log-slave-updates, holds the primary's transactions too) with
every record of the topics: 0 missing, 0 duplicates, 0 reordered.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from pathlib import Path

import pymysql
import pytest

from cdc.gtid import MariadbGtidPosition
from cdc.position import BinlogPosition
from connectors.mysql.client import binlog_end
from testbed.mariadb import EmbeddedMariaDB
from tests.integration.harness import OUTBOX_DDL, RelayProcess, env_for, relay_raw_config, wait_until
from tests.integration.independent_checker import check, committed_outbox_events, topic_records

pytestmark = [pytest.mark.integration, pytest.mark.fault]

AGGREGATES = ("order", "payment")
SERVER_ARGS = ["--log-slave-updates", "--gtid-strict-mode=ON", "--gtid-domain-id=0"]
DATABASE = "failover"


def _scalar(db, sql: str):
    with db.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        row = cur.fetchone()
        return row[0] if row else None


def _execute(db, *statements: str) -> None:
    with db.connect(autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def _server_end(db) -> BinlogPosition:
    with db.connect() as conn, conn.cursor() as cur:
        file, pos = binlog_end(cur)
    return BinlogPosition(file, pos)


def _binary_logs(db) -> dict[str, int]:
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return {str(r[0]): int(r[1]) for r in cur.fetchall()}


def _checkpoint(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


class Writer(threading.Thread):
    """Commits outbox transactions of 1-4 events (some rolled back) on one server and
    keeps the ledger of committed event ids, in commit order."""

    def __init__(self, db, total: int, seed: int, pause_s: float = 0.002):
        super().__init__(name=f"writer-{seed}", daemon=True)
        self._db, self.total, self._pause = db, total, pause_s
        self._rng = random.Random(seed)
        self.attempted = 0
        self.committed: list[str] = []
        self.rolled_back = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = self._rng
        try:
            with self._db.connect(DATABASE) as conn:
                while self.attempted < self.total:
                    rows = [
                        (
                            str(uuid.uuid4()),
                            rng.choice(AGGREGATES),
                            f"k{rng.randrange(20)}",
                            "Happened",
                            '{"n": %d}' % (self.attempted + n),
                        )
                        for n in range(rng.randint(1, 4))
                    ]
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                            "VALUES (%s,%s,%s,%s,%s)",
                            rows,
                        )
                    if rng.random() < 0.05:
                        conn.rollback()
                        self.rolled_back += len(rows)
                    else:
                        conn.commit()
                        self.committed.extend(r[0] for r in rows)
                    self.attempted += len(rows)
                    if self._pause:
                        time.sleep(self._pause)  # pacing of the workload, not a wait for a condition
        except BaseException as exc:  # surfaced by the test after join()
            self.error = exc

    def finish(self, timeout: float = 60.0) -> None:
        self.join(timeout)
        assert not self.is_alive(), "writer did not finish"
        if self.error:
            raise self.error


def _topology(stack: contextlib.ExitStack, kafka, topic_prefix: str, partitions: int = 2):
    """A primary (11) and its GTID replica (12) whose binlog coordinates differ from the
    primary's; the outbox table created on the primary (it replicates); the topics."""
    # Both servers from the main thread (PR_SET_PDEATHSIG follows the forking thread).
    primary = stack.enter_context(EmbeddedMariaDB.start(server_id=11, extra_args=SERVER_ARGS))
    replica = stack.enter_context(EmbeddedMariaDB.start(server_id=12, extra_args=SERVER_ARGS))
    # Rotations are not binlogged and create no GTID: the replica's coordinates now
    # differ from the primary's for every transaction it will replicate.
    _execute(replica, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
    _execute(
        replica,
        f"CHANGE MASTER TO MASTER_HOST='{primary.host}', MASTER_PORT={primary.port}, "
        f"MASTER_USER='{primary.user}', MASTER_PASSWORD='{primary.password}', "
        "MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
        "START SLAVE",
    )
    stack.callback(lambda: replica.running and _try_execute(replica, "STOP SLAVE"))

    primary.create_database(DATABASE)
    with primary.connect(DATABASE) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topics = [f"{topic_prefix}.{a}" for a in AGGREGATES]
    for topic in topics:
        kafka.create_topic(topic, partitions)  # the checker's reader waits ~5 s per partition
    kafka.create_topic(f"{topic_prefix}.dlq", 1)
    topics.append(f"{topic_prefix}.dlq")
    return primary, replica, topics


def _wait_replica_applied(primary, replica) -> None:
    primary_gtids = MariadbGtidPosition.parse(str(_scalar(primary, "SELECT @@gtid_binlog_pos")))
    wait_until(
        lambda: MariadbGtidPosition.parse(str(_scalar(replica, "SELECT @@gtid_current_pos") or "")).issuperset(
            primary_gtids
        ),
        30,
        f"the replica to apply the primary's {primary_gtids}",
    )


def _failover(primary, replica, raw_primary: dict, kafka, topic_prefix: str, cp_path: Path) -> dict:
    """Kill the primary, promote the replica; the relay config for the replica: same
    source name, same checkpoint, same replica_server_id."""
    primary.kill()
    _execute(replica, "STOP SLAVE", "RESET SLAVE ALL")
    raw = relay_raw_config(replica, kafka, DATABASE, topic_prefix, cp_path)
    raw["source"]["name"] = raw_primary["source"]["name"]
    raw["source"]["replica_server_id"] = raw_primary["source"]["replica_server_id"]
    return raw


def _reached(cp_path: Path, server_id: int, end: BinlogPosition) -> bool:
    cp = _checkpoint(cp_path)
    return bool(cp and cp["server_id"] == server_id and BinlogPosition(cp["file"], cp["pos"]) >= end)


def test_failover_to_replica_resumes_by_gtid(kafka, topic_prefix, tmp_path):
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    cp_path = tmp_path / "cp.json"
    with contextlib.ExitStack() as stack:
        # -- 1. topology: primary 11 -> replica 12, the replica's binlog shifted -----------------
        primary, replica, topics = _topology(stack, kafka, topic_prefix)
        timings["setup"] = time.monotonic() - t0

        # -- 2. the relay on the primary, SIGKILLed mid-stream ---------------------------------
        raw = relay_raw_config(primary, kafka, DATABASE, topic_prefix, cp_path)
        start = BinlogPosition.parse(raw["source"]["start"])
        first = Writer(primary, 200, seed=1)
        first.start()
        relay = RelayProcess(raw, env_for(primary), tmp_path / "relay-primary")
        stack.callback(lambda: relay.alive() and relay.kill())
        second = Writer(primary, 1100, seed=2, pause_s=0.004)
        try:
            first.finish()
            wait_until(
                lambda: not relay.alive() or ((_checkpoint(cp_path) or {}).get("events_delivered", 0) >= 100),
                60,
                "the relay on the primary to deliver its first 100 events",
            )
            assert relay.alive(), f"relay on the primary exited:\n{relay.log_text()[-3000:]}"
            second.start()
            wait_until(
                lambda: not relay.alive() or ((_checkpoint(cp_path) or {}).get("events_delivered", 0) >= 300),
                60,
                "the relay on the primary to deliver 300 events",
            )
            assert relay.alive(), f"relay on the primary exited:\n{relay.log_text()[-3000:]}"
            assert second.is_alive(), "the workload ended before the kill: the kill would not be mid-stream"
            relay.kill()  # SIGKILL: events delivered after its last checkpoint are in the topics only
            checkpointed_at_kill = (_checkpoint(cp_path) or {}).get("events_delivered", 0)
        finally:
            second.finish()
        before_failover = _checkpoint(cp_path)
        assert before_failover is not None and before_failover["server_id"] == 11, before_failover
        assert before_failover["gtids"], f"the checkpoint on the primary carries no GTID set: {before_failover}"
        timings["primary phase"] = time.monotonic() - t0 - timings["setup"]
        mark = time.monotonic()

        # The replica applies everything the primary committed.
        _wait_replica_applied(primary, replica)
        timings["replica apply"] = time.monotonic() - mark
        mark = time.monotonic()
        committed_on_primary = committed_outbox_events(
            primary.connection_settings(), DATABASE, start_file=start.file, start_pos=start.pos
        )
        assert [c.event_id for c in committed_on_primary] == first.committed + second.committed

        timings["read primary binlog"] = time.monotonic() - mark
        # File/pos mean nothing on the replica: the primary's checkpoint coordinates are not
        # a position there (the replica's file of that name ends long before it).
        cp_pos = BinlogPosition(before_failover["file"], before_failover["pos"])
        replica_logs = _binary_logs(replica)
        assert cp_pos.file not in replica_logs or replica_logs[cp_pos.file] < cp_pos.pos, (cp_pos, replica_logs)

        # -- 3. failover: the primary dies, the replica is promoted, the relay follows ---------
        raw_replica = _failover(primary, replica, raw, kafka, topic_prefix, cp_path)
        failover_at = time.monotonic()
        relay = RelayProcess(raw_replica, env_for(replica), tmp_path / "relay-replica")
        third = Writer(replica, 200, seed=3)  # the promoted replica takes writes of its own
        third.start()
        third.finish()
        end = _server_end(replica)
        replica_gtids = MariadbGtidPosition.parse(str(_scalar(replica, "SELECT @@gtid_binlog_pos")))

        wait_until(
            lambda: not relay.alive() or _reached(cp_path, 12, end), 60, f"the relay on the replica to reach {end}"
        )
        assert relay.alive(), f"relay on the replica exited:\n{relay.log_text()[-3000:]}"
        assert relay.terminate() == 0, relay.log_text()[-3000:]
        timings["replica phase"] = time.monotonic() - failover_at
        log_text = relay.log_text()

        mark = time.monotonic()
        # -- 4. verdict --------------------------------------------------------------------------
        after = _checkpoint(cp_path)
        assert after["server_id"] == 12, after
        assert MariadbGtidPosition.parse(after["gtids"]).issuperset(replica_gtids), (after["gtids"], replica_gtids)
        assert BinlogPosition(after["file"], after["pos"]) == end, (after, end)
        assert "server id changed 11 -> 12: resuming by GTID set" in log_text, log_text[-3000:]

        # Every committed outbox insert of the topology is in the replica's binlog (its own
        # and, with --log-slave-updates, the primary's), in commit order.
        first_replica_log = min(_binary_logs(replica), key=lambda f: BinlogPosition(f, 4))
        committed = committed_outbox_events(
            replica.connection_settings(), DATABASE, start_file=first_replica_log, start_pos=4
        )
        expected_ids = first.committed + second.committed + third.committed
        assert [c.event_id for c in committed] == expected_ids
        timings["read replica binlog"] = time.monotonic() - mark
        mark = time.monotonic()
        records = topic_records(kafka.bootstrap_servers, topics)
        result = check(committed, records)
        timings["read topics"] = time.monotonic() - mark
        recovered = [line for line in log_text.splitlines() if "recovering from checkpoint" in line]
        timings["total"] = time.monotonic() - t0
        print(
            f"\nfailover 11 -> 12: relay SIGKILLed on the primary at checkpoint {cp_pos} "
            f"({checkpointed_at_kill} events checkpointed, {before_failover['gtids']}); resumed on the replica by GTID; "
            f"{len(expected_ids)} committed ({first.rolled_back + second.rolled_back + third.rolled_back} "
            f"rolled back): {result.summary()}; {recovered[-1].split(': ', 1)[-1] if recovered else ''}; "
            f"timings " + ", ".join(f"{k}={v:.1f}s" for k, v in timings.items())
        )
        assert result.committed == len(expected_ids) > 1000
        assert result.records == len(expected_ids), result.summary()
        assert result.clean, result.summary()


def _try_execute(db, sql: str) -> None:
    with contextlib.suppress(pymysql.err.MySQLError):
        _execute(db, sql)


def test_failover_with_nothing_new_then_restart_on_replica(kafka, topic_prefix, tmp_path):
    """The relay had delivered everything when the primary died. On the promoted replica
    it is (a) checked the way `cdc run`/`cdc check` check a start position, (b) started
    and stopped before any new transaction arrives, then (c) started again after the
    replica took writes of its own. Each step must keep recognising the delivered
    transactions by GTID: the checkpoint's file/pos belong to the primary."""
    from cdc.config import load_config
    from cdc_cli.app import checkpoint_store, start_position
    from connectors.mysql.preflight import run_checks

    t0 = time.monotonic()
    cp_path = tmp_path / "cp.json"
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        primary, replica, topics = _topology(stack, kafka, topic_prefix, partitions=1)
        raw = relay_raw_config(primary, kafka, DATABASE, topic_prefix, cp_path)
        start = BinlogPosition.parse(raw["source"]["start"])
        first = Writer(primary, 300, seed=4, pause_s=0)
        first.start()
        first.finish()
        end = _server_end(primary)
        relay = RelayProcess(raw, env_for(primary), tmp_path / "relay-primary")
        stack.callback(lambda: relay.alive() and relay.kill())
        wait_until(
            lambda: not relay.alive() or _reached(cp_path, 11, end), 60, f"the relay on the primary to reach {end}"
        )
        assert relay.alive(), f"relay on the primary exited:\n{relay.log_text()[-3000:]}"
        assert relay.terminate() == 0, relay.log_text()[-3000:]
        on_primary = _checkpoint(cp_path)
        assert on_primary["gtids"] and on_primary["events_delivered"] == len(first.committed), on_primary
        _wait_replica_applied(primary, replica)
        raw_replica = _failover(primary, replica, raw, kafka, topic_prefix, cp_path)

        # (a) the start-position check `cdc run` (without --skip-check) and `cdc check` make
        cfg = load_config(raw_replica, env_for(replica))
        checked = [r for r in run_checks(cfg, start_position(cfg, checkpoint_store(cfg))) if r.name == "start_position"]
        if any(not r.ok for r in checked):
            problems.append(f"(a) preflight refuses the failover: {[r.message for r in checked]}")

        # (b) a run on the promoted replica while nothing new was committed
        relay = RelayProcess(raw_replica, env_for(replica), tmp_path / "relay-replica-idle")
        wait_until(
            lambda: not relay.alive() or "recovering from checkpoint" in relay.log_text(),
            30,
            "the relay on the replica to start",
        )
        assert relay.alive(), f"relay on the replica exited:\n{relay.log_text()[-3000:]}"
        assert "resuming by GTID set" in relay.log_text(), relay.log_text()[-3000:]
        assert relay.terminate() == 0, relay.log_text()[-3000:]
        idle = _checkpoint(cp_path)
        if idle["server_id"] == 12 and (idle["file"], idle["pos"]) == (on_primary["file"], on_primary["pos"]):
            problems.append(
                f"(b) the idle run wrote a checkpoint that labels the primary's coordinates "
                f"{idle['file']}:{idle['pos']} with the replica's server_id 12 (gtids {idle['gtids']}): "
                "the next start on the replica resumes by file/pos"
            )

        # (c) the replica takes writes; the relay starts again there
        second = Writer(replica, 100, seed=5, pause_s=0)
        second.start()
        second.finish()
        end = _server_end(replica)
        relay = RelayProcess(raw_replica, env_for(replica), tmp_path / "relay-replica")
        wait_until(
            lambda: not relay.alive() or _reached(cp_path, 12, end), 60, f"the relay on the replica to reach {end}"
        )
        if not relay.alive():
            problems.append(
                f"(c) the restarted relay on the replica exited {relay.wait(5)}: "
                + " | ".join(relay.log_text().strip().splitlines()[-3:])
            )
            pytest.fail("; ".join(problems))
        assert relay.terminate() == 0, relay.log_text()[-3000:]

        first_replica_log = min(_binary_logs(replica), key=lambda f: BinlogPosition(f, 4))
        committed = committed_outbox_events(
            replica.connection_settings(), DATABASE, start_file=first_replica_log, start_pos=4
        )
        assert [c.event_id for c in committed] == first.committed + second.committed
        result = check(committed, topic_records(kafka.bootstrap_servers, topics))
        print(
            f"\nidle failover 11 -> 12 then restart: {result.summary()} in {time.monotonic() - t0:.1f}s; "
            f"problems: {problems or 'none'}; primary's binlog started at {start}"
        )
        if not result.clean:
            problems.append(f"(c) {result.summary()}")
        assert not problems, "; ".join(problems)


@pytest.mark.parametrize("decoder", ["fast", "library"])
def test_every_stream_names_the_server_it_opened_on(mariadb, decoder):
    """A reconnect can land on another server behind the same address (a virtual IP moved
    at a failover): each opened stream must report the server it is on, never one
    remembered from an earlier connection, or the checkpoint would label positions of
    one server with another's id."""
    from cdc.source_events import ServerInfo
    from connectors.mysql.binlog_source import MySQLBinlogSourceFactory

    factory = MySQLBinlogSourceFactory(
        {"host": mariadb.host, "port": mariadb.port, "user": mariadb.user, "password": mariadb.password},
        7100 + (decoder == "library"),
        set(),
        decoder=decoder,
    )
    real, answers = factory._query, iter([111, 222])

    def query(sql: str) -> list[tuple]:  # the server's answer, with the id the moved address would give
        rows = real(sql)
        return [(rows[0][0], next(answers))] if sql.startswith("SELECT VERSION()") else rows

    start = factory.resolve("latest")  # (it asks the server's version too: before the address "moves")
    factory._query = query  # type: ignore[method-assign]
    for expected in (111, 222):
        source = factory.open(start)
        try:
            info = source.read(5.0)
        finally:
            source.close()
        assert isinstance(info, ServerInfo) and info.server_id == expected, info
