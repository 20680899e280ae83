"""Transactional delivery (`kafka.delivery = "transactional"`) against a broker with
transactions (noida-db, `noida_kafka` fixture; the stand-in cannot abort or fence).

* The relay is SIGKILLed >= 50 times, at random moments and at the crash points inside a
  Kafka transaction (`txn_before_commit`: produced, not committed; `txn_after_commit`:
  committed, not yet booked), while a writer commits transactions of 1-20 outbox rows.
  A read_committed consumer polls throughout and checks on every poll that no database
  transaction is visible in part: whenever a poll shows part of one, the rest must be
  committed already (a probe reads it at once); at the end each committed event is seen
  exactly once, per-key order intact, nothing rolled back (the independent checker,
  against the binlog).
* A zombie: relay A is SIGSTOPped mid-transaction, B takes over (the lease, then
  init_transactions), A is woken: the broker refuses it, A exits 1 with the one line.

Each test prints its figures.
"""

from __future__ import annotations

import io
import random
import signal
import threading
import time
import uuid

import fastavro
import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.schema_registry.avro_schemas import schema
from testbed.noida import CONSUMER_SETTINGS
from tests.integration.harness import OUTBOX_DDL, RelayProcess, env_for, relay_raw_config, wait_until
from tests.integration.independent_checker import TopicRecord, check, committed_outbox_events

pytestmark = [pytest.mark.integration]
AGGREGATES = ("order", "payment")


def _setup(db, broker, database: str, prefix: str, tmp_path, **over) -> tuple[dict, list[str]]:
    with db.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    topics = [f"{prefix}.{a}" for a in AGGREGATES]
    for topic in topics:
        broker.create_topic(topic, 3)
    broker.create_topic(f"{prefix}.dlq", 1)
    broker.create_topic(f"{prefix}.checkpoints", 1)
    options = {
        "kafka__delivery": "transactional",
        "kafka__transaction_max_ms": 100,
        "kafka__producer": {"message.timeout.ms": 3000},
        "lease__enabled": False,
    }
    options.update(over)
    raw = relay_raw_config(db, broker, database, prefix, tmp_path / "unused.json", **options)
    raw["checkpoint"] = {"store": "kafka", "topic": f"{prefix}.checkpoints", "interval_s": 0.2}
    return raw, topics + [f"{prefix}.dlq"]


class TxWriter(threading.Thread):
    """Commits database transactions of 1-20 outbox rows, all rows of one transaction on
    one key (so one partition), 5% rolled back. Records each transaction's ids before its
    COMMIT (the relay may publish it before COMMIT returns here)."""

    def __init__(self, connect, pause_s: float = 0.01, seed: int = 5):
        super().__init__(name="tx-writer", daemon=True)
        self._connect, self._pause, self._rng = connect, pause_s, random.Random(seed)
        self.group_of: dict[str, tuple[int, int]] = {}  # event id -> (transaction number, its size)
        self.committed_events = 0
        self.transactions = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        rng, conn = self._rng, self._connect()
        try:
            while not self.stop_flag.is_set():
                n = rng.randint(1, 20)
                key, agg = f"k{rng.randrange(40)}", rng.choice(AGGREGATES)
                rows = [(str(uuid.uuid4()), agg, key, "Happened", '{"i": %d}' % i) for i in range(n)]
                for r in rows:
                    self.group_of[r[0]] = (self.transactions, n)
                self.transactions += 1
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s,%s,%s,%s,%s)",
                        rows,
                    )
                if rng.random() < 0.05:
                    conn.rollback()
                else:
                    conn.commit()
                    self.committed_events += n
                time.sleep(self._pause)
        finally:
            conn.close()


class CommittedWatcher(threading.Thread):
    """A read_committed consumer polling the topics throughout. On every poll: a record
    seen twice is a violation; a database transaction seen in part must have the rest
    committed already (probed at once on its partition)."""

    def __init__(self, bootstrap: str, topics: list[str], writer: TxWriter):
        super().__init__(name="committed-watcher", daemon=True)
        self._servers, self._topics, self._writer = bootstrap, topics, writer
        self._parsed = fastavro.parse_schema(schema())
        self.records: list[TopicRecord] = []
        self.seen: dict[str, TopicRecord] = {}
        self.violations: list[str] = []
        self.polls = 0
        self.reconnects = 0
        self.partial_polls = 0  # polls that ended inside a database transaction (a fetch boundary)
        self.probes = 0  # still in part when the consumer had caught up: the rest was probed for at once
        self.stop_flag = threading.Event()
        self._seen_of_group: dict[int, int] = {}
        self._first_of_group: dict[int, TopicRecord] = {}

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._servers,
                "group.id": f"watch-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                **CONSUMER_SETTINGS,
            }
        )

    def _event_id(self, value: bytes) -> str:
        return fastavro.schemaless_reader(io.BytesIO(value[5:]), self._parsed, None)["id"]

    def run(self) -> None:
        meta = self._consumer()
        md = meta.list_topics(timeout=10)
        meta.close()
        positions = {(t, p): 0 for t in self._topics if t in md.topics for p in md.topics[t].partitions}
        pending: dict[int, float] = {}  # a database transaction seen in part -> since when
        open_in: dict[tuple[str, int], int] = {}  # partition -> the transaction seen in part there
        while not self.stop_flag.is_set():
            # A round: a new consumer from the start of each partition (what it read before
            # is skipped by offset), polled until it has caught up (or for 5 s). noida-db: a
            # read_committed fetch that starts after an aborted transaction's marker, or a
            # consumer that waited at a transaction that was then aborted, skips the same
            # producer's later committed records too (docs/limits.md: its limits).
            consumer = self._consumer()
            consumer.assign([TopicPartition(t, p, 0) for (t, p) in positions])
            self.reconnects += 1
            idle, ends = 0, time.monotonic() + 5.0
            try:
                while not self.stop_flag.is_set() and idle < 3 and time.monotonic() < ends:
                    batch = consumer.consume(500, timeout=0.1)
                    self.polls += 1
                    idle = 0 if batch else idle + 1
                    now = time.monotonic()
                    for msg in batch:
                        if not msg.error():
                            tp = (msg.topic(), msg.partition())
                            if msg.offset() < positions[tp]:
                                continue  # read in an earlier round
                            positions[tp] = msg.offset() + 1
                        self._check(msg, now, pending, open_in)
                    if pending:
                        self.partial_polls += 1
            finally:
                consumer.close()
            # Caught up and still seen in part: not a fetch boundary then. The rest must be
            # committed already: a read_committed read of its partition finds it now. (A
            # relay without transactions fails here after a crash.)
            now = time.monotonic()
            for g, since in list(pending.items()):
                if now - since > 0.2:
                    del pending[g]
                    self.probes += 1
                    self._probe(g, self._writer.group_of[self._first_of_group[g].event_id][1])

    def _check(self, msg, now: float, pending: dict[int, float], open_in: dict[tuple[str, int], int]) -> None:
        """The checks of one record, as the poll returned it."""
        if msg.error() or msg.value() is None or msg.value()[:1] != b"\x00":
            return
        rec = TopicRecord(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            self._event_id(msg.value()),
            msg.key().decode() if msg.key() else None,
        )
        self.records.append(rec)
        if rec.event_id in self.seen:
            self.violations.append(
                f"poll {self.polls}: {rec.event_id} seen twice ({self.seen[rec.event_id]} and {rec})"
            )
            return
        self.seen[rec.event_id] = rec
        group = self._writer.group_of.get(rec.event_id)
        if group is None:
            self.violations.append(f"poll {self.polls}: {rec.event_id} was never written")
            return
        g, size = group
        tp = (rec.topic, rec.partition)
        other = open_in.get(tp)
        if other is not None and other != g:
            self.violations.append(
                f"poll {self.polls}: {tp} went on to transaction {g} while transaction {other} was seen in part"
            )
        self._first_of_group.setdefault(g, rec)
        count = self._seen_of_group[g] = self._seen_of_group.get(g, 0) + 1
        if count < size:
            open_in[tp] = g
            pending.setdefault(g, now)
        else:
            open_in.pop(tp, None)
            pending.pop(g, None)

    def _probe(self, g: int, size: int) -> None:
        """This poll shows part of database transaction `g`: the rest must be committed
        already, so a read_committed read of its partition finds it now."""
        first = self._first_of_group[g]
        probe = self._consumer()
        try:
            probe.assign([TopicPartition(first.topic, first.partition, first.offset)])
            found, deadline = 0, time.monotonic() + 3.0
            while found < size and time.monotonic() < deadline:
                for msg in probe.consume(100, timeout=0.2):
                    if msg.error() or msg.value() is None or msg.value()[:1] != b"\x00":
                        continue
                    group = self._writer.group_of.get(self._event_id(msg.value()))
                    if group is not None and group[0] == g:
                        found += 1
            if found < size:
                self.violations.append(
                    f"poll {self.polls}: database transaction {g} visible in part: "
                    f"{self._seen_of_group[g]} seen, {found} of {size} committed"
                )
        finally:
            probe.close()


def _wait_all(watcher: CommittedWatcher, writer: TxWriter, relay: RelayProcess, timeout: float = 60) -> None:
    try:
        wait_until(
            lambda: len(watcher.seen) >= writer.committed_events or not relay.alive(),
            timeout,
            "the read_committed consumer to see every committed event",
        )
    except AssertionError as exc:
        counts = {}
        for iso in ("read_committed", "read_uncommitted"):
            c = Consumer(
                {
                    "bootstrap.servers": watcher._servers,
                    "group.id": f"d-{uuid.uuid4().hex[:6]}",
                    "isolation.level": iso,
                    "auto.offset.reset": "earliest",
                    **CONSUMER_SETTINGS,
                }
            )
            meta = c.list_topics(timeout=10)
            tps = [
                TopicPartition(t, p, 0) for t in watcher._topics if t in meta.topics for p in meta.topics[t].partitions
            ]
            c.assign(tps)
            n: dict = {}
            end = time.monotonic() + 5
            while time.monotonic() < end:
                for m in c.consume(1000, timeout=0.2):
                    if not m.error():
                        n[(m.topic(), m.partition())] = n.get((m.topic(), m.partition()), 0) + 1
            counts[iso] = (n, [c.get_watermark_offsets(tp, timeout=5) for tp in tps])
            c.close()
        raise AssertionError(
            f"{exc}: per partition {counts}; seen {len(watcher.seen)} of {writer.committed_events}, violations "
            f"{watcher.violations[:3]}, watcher alive {watcher.is_alive()}, relay log: "
            f"{relay.log_text()[-1500:]}"
        ) from None


def _final_run(raw, mariadb, tmp_path, writer: TxWriter, watcher: CommittedWatcher, timeout: float = 120):
    final = RelayProcess(raw, env_for(mariadb), tmp_path / "relay")
    try:
        # Every committed event may be on the topics already: the last relay must still
        # start, fence its predecessors and stop cleanly.
        wait_until(
            lambda: "transactional delivery as" in final.log_text() or not final.alive(),
            60,
            "the last relay to fence its predecessors",
        )
        _wait_all(watcher, writer, final, timeout)
        assert final.alive(), final.log_text()[-3000:]
        assert final.terminate() == 0, final.log_text()[-3000:]
    finally:
        if final.alive():
            final.kill()
    time.sleep(0.5)  # the watcher's last polls: anything more would be a duplicate
    watcher.stop_flag.set()
    watcher.join(10)
    return final


@pytest.mark.fault
@pytest.mark.parametrize("kills_wanted", [24, pytest.param(50, marks=pytest.mark.extended)])
def test_sigkills_inside_kafka_transactions_never_show_a_database_transaction_in_part(
    mariadb, noida_kafka, database, topic_prefix, tmp_path, kills_wanted
):
    """24 kills in the README's test command (8 at each crash point, 8 at random moments:
    the >= 5 a point below with a margin); the 50 of issue 20's figure with
    `./run.sh test -m extended`."""
    raw, topics = _setup(mariadb, noida_kafka, database, topic_prefix, tmp_path)
    start = raw["source"]["start"]
    writer = TxWriter(lambda: mariadb.connect(database), pause_s=0.03)
    watcher = CommittedWatcher(noida_kafka.bootstrap, topics, writer)
    writer.start()
    watcher.start()
    rng = random.Random(20)
    points = ["txn_before_commit", "txn_after_commit"]
    kills = {"random": 0, "txn_before_commit": 0, "txn_after_commit": 0}
    t0 = time.monotonic()
    try:
        i = 0
        while sum(kills.values()) < kills_wanted:
            point = points[i % 2] if i % 3 else None
            i += 1
            relay = RelayProcess(
                raw, env_for(mariadb), tmp_path / "relay", crash_at=f"{point}@{rng.randint(1, 6)}" if point else None
            )
            if point is None:
                time.sleep(rng.uniform(0.4, 1.5))  # the fault's timing, not a wait for a condition
                assert relay.alive(), relay.log_text()[-3000:]
                relay.kill()
                kills["random"] += 1
                continue
            try:
                code = relay.wait(30)
            except Exception:
                relay.kill()
                kills["random"] += 1
                continue
            assert code == -signal.SIGKILL, relay.log_text()[-3000:]
            kills[point] += 1
        writer.stop_flag.set()
        writer.join(30)
        _final_run(raw, mariadb, tmp_path, writer, watcher)
    finally:
        writer.stop_flag.set()
        watcher.stop_flag.set()
    file, pos = start.split(":")
    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=file, start_pos=int(pos))
    result = check(committed, watcher.records)
    print(
        f"\ntransactional, SIGKILL x{sum(kills.values())} ({kills}) in {time.monotonic() - t0:.0f} s, "
        f"{writer.transactions} database transactions of 1-20 rows: read_committed polls {watcher.polls}, "
        f"{watcher.partial_polls} ended inside a transaction ({watcher.probes} probed: rest committed), "
        f"violations {len(watcher.violations)}, consumer rounds {watcher.reconnects}; {result.summary()}"
    )
    assert not watcher.violations, watcher.violations[:5]
    assert result.committed > 0 and result.clean, result.summary()
    assert kills["txn_before_commit"] >= 5 and kills["txn_after_commit"] >= 5


@pytest.mark.fault
def test_a_zombie_relay_is_fenced_by_the_broker_and_exits_with_one_line(
    mariadb, noida_kafka, database, topic_prefix, tmp_path
):
    raw, topics = _setup(
        mariadb, noida_kafka, database, topic_prefix, tmp_path, lease={"enabled": True, "ttl_s": 3.0, "renew_s": 0.5}
    )
    start = raw["source"]["start"]
    writer = TxWriter(lambda: mariadb.connect(database))
    watcher = CommittedWatcher(noida_kafka.bootstrap, topics, writer)
    writer.start()
    watcher.start()
    a = RelayProcess(raw, env_for(mariadb), tmp_path / "a")
    b = None
    try:
        wait_until(lambda: "holding the lease" in a.log_text() and len(watcher.seen) > 50, 60, "relay A to publish")
        b = RelayProcess(raw, env_for(mariadb), tmp_path / "b")
        wait_until(lambda: "standby: the lease" in b.log_text(), 60, "relay B to wait as a standby")
        a.proc.send_signal(signal.SIGSTOP)  # mid-transaction: A commits every 100 ms under load
        frozen_at = time.monotonic()
        wait_until(lambda: "transactional delivery as" in b.log_text(), 60, "relay B to take over and fence")
        seen = len(watcher.seen)
        wait_until(lambda: len(watcher.seen) > seen + 20, 30, "relay B to publish")
        took_over = time.monotonic() - frozen_at
        a.proc.send_signal(signal.SIGCONT)
        code = a.wait(30)
        log = a.log_text()
        # The one line of why (docs/transactional-delivery.md, "The fence and the lease agree"): the broker's
        # fence, or - when the broker had already aborted A's open transaction while A was
        # frozen (transaction.timeout.ms), so nothing is left for it to refuse - A's lease.
        fenced = f"cdc: fenced by a newer instance of cdc-relay.src-{topic_prefix}; this instance stops"
        lost = "cdc: lost the lease: "
        assert code == 1 and "Traceback" not in log, log[-3000:]
        assert (fenced in log) != (lost in log), log[-3000:]  # one of the two, never both
        line = fenced if fenced in log else lost
        assert log.count("fenced by a newer instance") + log.count(lost) == 1, log[-3000:]  # the one line
        writer.stop_flag.set()
        writer.join(30)
        _wait_all(watcher, writer, b)
        assert b.alive(), b.log_text()[-3000:]
        assert b.terminate() == 0
        time.sleep(0.5)
    finally:
        writer.stop_flag.set()
        watcher.stop_flag.set()
        for r in (a, b):
            if r is not None and r.alive():
                if r is a:
                    r.proc.send_signal(signal.SIGCONT)
                r.kill()
    watcher.join(10)
    file, pos = start.split(":")
    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=file, start_pos=int(pos))
    result = check(committed, watcher.records)
    print(
        f"\ntransactional zombie: A frozen, B published {took_over:.1f} s later, A woken: exit {code} with "
        f"{line!r}; violations {len(watcher.violations)}, consumer rounds {watcher.reconnects}; "
        f"{result.summary()}"
    )
    assert not watcher.violations, watcher.violations[:5]
    assert result.clean, result.summary()


@pytest.mark.spark
def test_cdc_verify_on_transactional_topics_reports_no_problem_and_the_aborted_records(
    mariadb, noida_kafka, database, topic_prefix, tmp_path
):
    """Aborted transactions left records in the log (a relay killed after producing,
    before committing): `cdc verify` reads with read_committed, finds 0 problems, and says
    how many records sat in aborted transactions."""
    import subprocess
    import sys

    from tests.integration.harness import ROOT

    raw, topics = _setup(mariadb, noida_kafka, database, topic_prefix, tmp_path)
    writer = TxWriter(lambda: mariadb.connect(database), pause_s=0.005)
    watcher = CommittedWatcher(noida_kafka.bootstrap, topics, writer)
    writer.start()
    watcher.start()
    try:
        for nth in (2, 3):
            relay = RelayProcess(raw, env_for(mariadb), tmp_path / "relay", crash_at=f"txn_before_commit@{nth}")
            assert relay.wait(60) == -signal.SIGKILL, relay.log_text()[-3000:]
        writer.stop_flag.set()
        writer.join(30)
        final = _final_run(raw, mariadb, tmp_path, writer, watcher)
    finally:
        writer.stop_flag.set()
        watcher.stop_flag.set()
    start_file = raw["source"]["start"].split(":")[0]
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdc_cli.main",
            "verify",
            "--config",
            str(final.config_path),
            "--output-dir",
            str(tmp_path / "report"),
            "--master",
            "local[2]",
            "--start-file",
            start_file,
        ],
        cwd=ROOT,
        env={**__import__("os").environ, **env_for(mariadb)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    print(
        f"\ncdc verify on transactional topics ({writer.committed_events} events, "
        f"{time.monotonic() - t0:.0f} s):\n{out}"
    )
    assert proc.returncode == 0 and "cdc verify: OK" in out, out + proc.stderr[-3000:]
    [line] = [ln for ln in out.splitlines() if ln.startswith("records in aborted Kafka transactions:")]
    assert int(line.split(":")[1].split()[0]) > 0, line
