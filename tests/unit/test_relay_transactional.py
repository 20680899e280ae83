"""Transactional delivery over the fakes: Kafka transactions of whole database
transactions with the checkpoint inside, restarts without a recovery scan, aborts that
re-read from the last committed checkpoint, and fencing by a newer instance."""

import random
from collections import Counter, defaultdict

import pytest

from cdc.config import load_config
from cdc.delivery.kafka_transaction import Fenced, transactional_id
from cdc.errors import ConfigError, DeliveryError
from fakes import (
    DEFAULT_TOPICS,
    Binlog,
    FakeKafka,
    FakeTxnPublisher,
    Killed,
    RelayHarness,
    expected_events,
    identity_of,
    outbox_row,
)


def TxnHarness(binlog, **kw):
    """A relay in transactional mode; commits only by size unless a test says otherwise
    (the periodic checkpoint would commit on every loop iteration here)."""
    kw.setdefault("checkpoint_interval_s", 1e9)
    return RelayHarness(binlog, transactional=True, **kw)


def writes(n_tx=40, seed=3, max_rows=6):
    """A binlog of `n_tx` transactions of 1..max_rows outbox rows on few keys, some rolled back,
    some holding no outbox row."""
    rng = random.Random(seed)
    b = Binlog()
    n = 0
    for i in range(n_tx):
        rows = []
        for _ in range(rng.randint(1, max_rows)):
            n += 1
            rows.append(outbox_row(f"e{n}", rng.choice(["order", "user"]), f"k{rng.randrange(5)}"))
        outcome = "rollback" if rng.random() < 0.1 else "commit"
        b.transaction(rows, outcome=outcome, other_rows=1 if i % 7 == 0 else 0)
        if i % 9 == 4:
            b.transaction([], other_rows=2)
        if i == n_tx // 2:
            b.rotate()
    return b


def committed_view(kafka):
    """(identity, id) of what a read_committed consumer sees, and the events per database transaction."""
    return [
        (*identity_of(r), r.header_text["id"])
        for r in kafka.records(committed=True)
        if "cdc.binlog.file" in r.header_text
    ]


def assert_exactly_once_committed(kafka, binlog):
    expected = expected_events(binlog)
    got = Counter(committed_view(kafka))
    assert not {k: v for k, v in got.items() if v > 1}, "duplicates visible to read_committed"
    assert set(got) == set(expected), f"missing {sorted(set(expected) - set(got))[:5]}"
    order = {e[3]: i for i, e in enumerate(expected)}
    for _topic, parts in kafka.logs.items():
        for part in parts:
            by_key = defaultdict(list)
            for r in part:
                if kafka.visible(r) and "id" in r.header_text:
                    by_key[r.key].append(order[r.header_text["id"]])
            for seq in by_key.values():
                assert seq == sorted(seq)


def assert_atomic(kafka, binlog):
    """Every committed database transaction is seen whole or not at all."""
    seen = Counter((f, p) for f, p, _row, _id in committed_view(kafka))
    for tx in binlog.committed():
        n = seen.get((tx.start.file, tx.start.pos), 0)
        assert n in (0, len(tx.outbox_rows)), f"transaction at {tx.start} seen partially: {n} of {len(tx.outbox_rows)}"


def test_each_kafka_transaction_holds_whole_database_transactions_and_the_checkpoint():
    b = writes()
    h = TxnHarness(b, transaction_max_messages=10, transaction_max_s=1e9)
    h.run()
    assert_exactly_once_committed(h.kafka, b)
    by_db_tx = defaultdict(set)
    for r in h.kafka.records():
        by_db_tx[(r.header_text["cdc.binlog.file"], r.header_text["cdc.binlog.pos"])].add(r.txn)
    assert all(len(txns) == 1 for txns in by_db_tx.values()), "a database transaction spans Kafka transactions"
    per_txn = Counter(r.txn for r in h.kafka.records())
    assert max(per_txn.values()) < 10 + 6, "the size bound is checked between database transactions"
    assert len(per_txn) > 5, "several Kafka transactions"
    cp = h.store.current
    assert cp.exact and cp.position == b.end
    assert all(c.exact for c in h.store.history)
    assert h.publisher.commits == len(h.store.history), "every commit carries a checkpoint"
    assert h.relay._txn.summary()["commits"] == h.publisher.commits


def test_the_transactional_id_is_derived_from_the_source_name():
    assert transactional_id("shop-db") == "cdc-relay.shop-db"


def test_a_restart_after_a_kill_inside_a_kafka_transaction_needs_no_scan_and_delivers_exactly_once():
    b = writes()
    kafka = FakeKafka(DEFAULT_TOPICS)
    first = TxnHarness(b, kafka=kafka, transaction_max_messages=15, transaction_max_s=1e9)
    assert first.run_until_killed(
        lambda h: h.publisher.commits >= 3 and h.publisher.current is not None, random.Random(1)
    )
    visible_before = len(kafka.records(committed=True))
    assert len(kafka.records()) > visible_before, "the open transaction's records reached the log"
    assert_atomic(kafka, b)
    second = TxnHarness(b, kafka=kafka, store=first.store)
    second.run()
    assert second.delivered.reads == [], "a committed exact checkpoint needs no scan of the topics"
    assert second.relay._recovery_stats is None
    assert_exactly_once_committed(kafka, b)
    assert_atomic(kafka, b)
    assert any(state == "aborted" for state in kafka.txn_state.values()), "init_transactions aborted the open one"


def test_a_kill_after_the_commit_before_the_bookkeeping_loses_and_repeats_nothing():
    b = writes()
    kafka = FakeKafka(DEFAULT_TOPICS)
    first = TxnHarness(b, kafka=kafka, transaction_max_messages=8, transaction_max_s=1e9)

    def after_commit():
        if first.publisher.commits == 4:
            first.publisher.dead = True
            raise Killed()

    first.publisher.after_commit = after_commit
    with pytest.raises(Killed):
        first.run()
    second = TxnHarness(b, kafka=kafka, store=first.store)
    second.run()
    assert_exactly_once_committed(kafka, b)


def test_random_kills_keep_every_database_transaction_atomic_and_exactly_once():
    rng = random.Random(7)
    for round_ in range(15):
        b = writes(n_tx=30, seed=round_)
        kafka = FakeKafka(DEFAULT_TOPICS)
        store = None
        for _ in range(rng.randint(1, 6)):
            h = TxnHarness(
                b, kafka=kafka, store=store, transaction_max_messages=rng.randint(1, 20), transaction_max_s=1e9
            )
            store = h.store
            stop_at = rng.randint(1, 120)
            if not h.run_until_killed(lambda h, stop_at=stop_at: h.iterations >= stop_at, rng):
                break
            assert_atomic(kafka, b)
        TxnHarness(b, kafka=kafka, store=store).run()
        assert_atomic(kafka, b)
        assert_exactly_once_committed(kafka, b)


def test_a_failed_commit_aborts_and_re_reads_from_the_last_committed_checkpoint():
    b = writes()
    h = TxnHarness(b, transaction_max_messages=10, transaction_max_s=1e9)
    h.publisher.fail_commits = 2
    h.run()
    assert h.publisher.aborts == 2
    assert h.relay._txn.aborts == 2
    assert len(h.factory.opened_at) == 3, "the binlog was re-read after each abort"
    assert_exactly_once_committed(h.kafka, b)
    assert any(h.kafka.txn_state[r.txn] == "aborted" for r in h.kafka.records()), "aborted records stay invisible"


def test_a_delivery_failure_aborts_the_transaction_and_it_is_retried():
    b = writes()
    failed = []

    def fail_once(msg):
        from fakes import FATAL, message_id

        if message_id(msg) == "e12" and not failed:
            failed.append(msg)
            return FATAL
        return None

    h = TxnHarness(b, publisher={"fail": fail_once}, transaction_max_messages=10, transaction_max_s=1e9)
    h.run()
    assert failed and h.publisher.aborts == 1
    assert_exactly_once_committed(h.kafka, b)


def test_aborts_in_a_row_stop_the_relay():
    b = writes()
    from fakes import FATAL

    h = TxnHarness(b, publisher={"fail": lambda m: FATAL})
    with pytest.raises(DeliveryError, match="aborted in a row"):
        h.run()
    assert h.kafka.records(committed=True) == []


def test_a_fenced_relay_stops_at_once_and_writes_nothing_more(caplog):
    b = writes(n_tx=60)
    kafka = FakeKafka(DEFAULT_TOPICS)
    a = TxnHarness(b, kafka=kafka, transaction_max_messages=5, transaction_max_s=1e9)
    successor = FakeTxnPublisher(kafka)

    def stop(h):
        if h.publisher.commits == 3 and successor.epoch < 0:
            successor.init_transactions(1.0)  # a newer instance starts
        return h.factory.exhausted

    with caplog.at_level("INFO"), pytest.raises(Fenced) as caught:
        a.run(stop)
    assert str(caught.value) == "fenced by a newer instance of cdc-relay.shop-db; this instance stops"
    repeats, errors = _fence_lines(caplog)  # the exception is the one line; the log says what was dropped
    assert repeats == [], repeats
    assert len(errors) == 1 and "the broker refused" in errors[0] and "not yet acknowledged" in errors[0], errors
    assert a.publisher.commits == 3
    assert len(a.store.history) == 3, "no checkpoint after the fence"
    records_after = len(kafka.records(committed=True))
    assert records_after == len([r for r in kafka.records() if kafka.visible(r)])
    assert_atomic(kafka, b)


def _fence_lines(caplog):
    """What the relay logged of its fence: the exception's own text is the CLI's one line
    (`cdc: fenced by a newer instance ...`), so no log record may repeat it."""
    repeats = [r.getMessage() for r in caplog.records if "fenced by a newer instance" in r.getMessage()]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.getMessage().startswith("fenced:")]
    return repeats, errors


def test_a_transactional_relay_whose_lease_ran_out_logs_why_once_and_stops_fenced(caplog):
    """The zombie test's usual order: the lease runs out first, the broker then refuses
    the zombie's abort. One ERROR line says why (the lease), the exception (Fenced) is
    the one line that names the fence."""
    from cdc.lease import LeaseClock, LeaseSettings

    b = writes(n_tx=60)
    kafka = FakeKafka(DEFAULT_TOPICS)
    a = TxnHarness(b, kafka=kafka, transaction_max_messages=5, transaction_max_s=1e9)
    now = [0.0]
    a.relay._monotonic = lambda: now[0]
    successor = FakeTxnPublisher(kafka)

    def stop():
        if a.publisher.commits == 3 and successor.epoch < 0:
            successor.init_transactions(1.0)  # a newer instance took over ...
            now[0] = 9.5  # ... because this one's lease ran out
        return a.factory.exhausted

    with caplog.at_level("INFO"), pytest.raises(Fenced):
        a.relay.run(stop, lease=LeaseClock(LeaseSettings(ttl_s=10.0, renew_s=1.0, margin_s=0.5), 0.0))
    repeats, errors = _fence_lines(caplog)
    assert repeats == [], repeats
    assert len(errors) == 1 and "lease" in errors[0] and "not yet acknowledged" in errors[0], errors
    assert_atomic(kafka, b)


def _raw(**kafka):
    return {
        "source": {"name": "shop"},
        "outbox": {"tables": [{"schema": "shop", "table": "outbox"}]},
        "kafka": kafka,
        "checkpoint": {"store": "file", "path": "/tmp/x.json"},
    }


def test_transactional_delivery_refuses_a_file_checkpoint_store_in_one_line():
    with pytest.raises(ConfigError) as caught:
        load_config(_raw(delivery="transactional"))
    text = str(caught.value)
    assert "\n" not in text and 'checkpoint.store = "kafka"' in text and "kafka.delivery" in text


def test_delivery_defaults_to_idempotent_and_rejects_unknown_modes():
    raw = _raw()
    assert load_config(raw).kafka.delivery == "idempotent"
    assert load_config(raw).relay_settings().delivery == "idempotent"
    with pytest.raises(ConfigError, match=r"kafka.delivery"):
        load_config(_raw(delivery="exactly"))
    raw = _raw(delivery="transactional", transaction_max_ms=250, transaction_max_messages=500)
    raw["checkpoint"] = {"store": "kafka"}
    settings = load_config(raw).relay_settings()
    assert (settings.delivery, settings.transaction_max_s, settings.transaction_max_messages) == (
        "transactional",
        0.25,
        500,
    )
    raw["kafka"]["producer"] = {"transactional.id": "mine"}
    with pytest.raises(ConfigError, match=r"derives it from source.name"):
        load_config(raw)


def test_idempotent_delivery_is_unchanged_and_writes_no_exact_checkpoint():
    b = writes()
    h = RelayHarness(b)
    h.run()
    assert not h.store.current.exact
    assert all(r.txn is None for r in h.kafka.records())
