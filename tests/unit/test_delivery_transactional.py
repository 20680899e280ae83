"""The transactional delivery mode alone (cdc/delivery/transactional.py), call by call over
the fakes' transactional broker: one Kafka transaction per batch of whole database
transactions with the checkpoint inside, an exact checkpoint needs no scan, an abort
rewinds to the last committed checkpoint, a fenced instance writes nothing more."""

from types import SimpleNamespace

import pytest
from delivery_parts import START, ModeParts, committed

from cdc.delivery.kafka_transaction import MAX_ABORTS_IN_A_ROW, Fenced, TransactionAborted
from cdc.errors import DeliveryError
from cdc.lease import LeaseLost
from cdc.ports import Delivery, DeliveryFailure
from fakes import DEFAULT_TOPICS, FENCED, TOO_LARGE, Binlog, FakeKafka, outbox_row

ORDER = "outbox.event.order"


def _binlog(n):
    b = Binlog()
    for i in range(n):
        b.transaction([outbox_row(f"e{i}a", "order", f"k{i}"), outbox_row(f"e{i}b", "order", f"k{i}")])
    return b


def _started(**kw):
    p = ModeParts(transactional=True, transaction_max_s=1e9, **kw)
    p.mode.start()
    p.open(p.store.load())
    return p


def _visible_ids(kafka):
    return sorted(r.header_text["id"] for r in kafka.records(ORDER, committed=True))


def test_start_fences_an_older_instance_before_the_checkpoint_is_read():
    kafka = FakeKafka(DEFAULT_TOPICS)
    older = _started(kafka=kafka)
    older.hand_over(committed(_binlog(1))[0])  # its Kafka transaction is open
    newer = ModeParts(transactional=True, kafka=kafka)
    newer.mode.start()
    assert older.publisher.fenced, "init_transactions bumped the epoch of the transactional.id"
    assert set(kafka.txn_state.values()) == {"aborted"}, "what the older one left open is aborted"
    with pytest.raises(Fenced, match="fenced by a newer instance of cdc-relay.shop-db"):
        older.mode.checkpoint()


def test_a_kafka_transaction_holds_whole_database_transactions_and_commits_with_the_checkpoint_when_due():
    p = _started(transaction_max_messages=5)
    txs = committed(_binlog(4))
    p.hand_over(txs[0])
    p.hand_over(txs[1])
    assert p.mode.state.open and p.mode.state.messages == 4 and p.publisher.commits == 0
    p.mode.commit_due(p.clock())
    assert p.publisher.commits == 0, "4 messages: not due"
    p.hand_over(txs[2])  # the third database transaction goes whole into the open one
    p.mode.commit_due(p.clock())
    assert p.publisher.commits == 1 and not p.mode.state.open
    cp = p.store.current
    assert cp.exact and cp.position == txs[2].end, "the checkpoint record committed with the messages before it"
    assert p.ledger.last == cp
    assert {r.txn for r in p.kafka.records(ORDER)} == {1}, "one Kafka transaction"
    assert len(_visible_ids(p.kafka)) == 6
    p.hand_over(txs[3])
    assert _visible_ids(p.kafka) == ["e0a", "e0b", "e1a", "e1b", "e2a", "e2b"], "open: not visible yet"


def test_a_checkpoint_with_nothing_open_commits_a_transaction_of_its_own_only_when_it_moved_or_forced():
    p = _started()
    p.mode.checkpoint(force=True)
    assert p.publisher.commits == 1 and p.store.current.position == START
    p.mode.checkpoint()
    assert p.publisher.commits == 1, "nothing moved, nothing open: no transaction"
    p.mode.checkpoint(force=True)
    assert p.publisher.commits == 2


def test_an_exact_checkpoint_needs_no_scan_and_one_that_is_not_is_scanned():
    p = _started(transaction_max_messages=1)
    for tx in committed(_binlog(2)):
        p.hand_over(tx)
        p.mode.commit_due(p.clock())
    restarted = ModeParts(transactional=True, kafka=p.kafka, store=p.store)
    restarted.mode.start()
    restarted.open(restarted.store.load())
    assert restarted.delivered.reads == [] and restarted.ledger.recovery_stats is None

    cp = p.store.load()
    inexact = ModeParts(transactional=True, kafka=p.kafka, store=p.store)
    inexact.mode.recover(type(cp).from_dict({**cp.to_dict(), "exact": False}))
    assert inexact.delivered.reads, "a checkpoint not committed with its messages is scanned for"


def test_a_failure_aborts_and_rewinds_to_the_last_committed_checkpoint():
    p = _started(transaction_max_messages=3)
    txs = committed(_binlog(3))
    p.hand_over(txs[0])
    p.hand_over(txs[1])
    p.mode.commit_due(p.clock())
    committed_cp = p.store.current
    p.hand_over(txs[2])
    p.ledger.delivery_failed(Delivery(ORDER, 0, -1, DeliveryFailure("_MSG_TIMED_OUT", "timed out")))
    with pytest.raises(TransactionAborted, match="_MSG_TIMED_OUT"):
        p.mode.failed()
    assert p.mode.rewind("timed out") == committed_cp
    assert p.mode.state.aborts == 1 and not p.mode.state.open
    assert p.metrics.delivery_error_causes["transaction_aborted"] == 1
    assert "e2a" not in _visible_ids(p.kafka), "nothing of the aborted transaction is visible"


def test_aborts_in_a_row_stop_the_relay():
    p = _started()
    for _ in range(MAX_ABORTS_IN_A_ROW - 1):
        p.mode.rewind("commit failed")
    with pytest.raises(DeliveryError, match=f"{MAX_ABORTS_IN_A_ROW} Kafka transactions aborted in a row"):
        p.mode.rewind("commit failed")


def test_a_fenced_delivery_report_stops_at_once_instead_of_aborting():
    p = _started()
    p.ledger.delivery_failed(Delivery(ORDER, 0, -1, FENCED))
    with pytest.raises(Fenced):
        p.mode.failed()


def test_a_message_refused_as_too_large_inside_a_transaction_aborts_its_commit():
    p = _started(publisher={"fail": lambda m: TOO_LARGE if m.topic == ORDER else None})
    p.hand_over(committed(_binlog(1))[0])
    with pytest.raises(TransactionAborted, match="too large inside a transaction"):
        p.mode.checkpoint()
    assert not p.mode.readable_when_acknowledged, "a transaction's messages cannot be looked for before its commit"


def test_a_drain_commits_what_is_open_with_the_released_checkpoint_and_an_abort_leaves_it_to_the_next_start():
    from cdc.lease import LeaseClock, LeaseSettings

    p = _started(lease=LeaseClock(LeaseSettings(), 0.0))
    [tx] = committed(_binlog(1))
    p.hand_over(tx)
    p.mode.drain(p.handover.settle)
    assert p.store.current.position == tx.end and p.store.current.released
    assert _visible_ids(p.kafka) == ["e0a", "e0b"]

    q = _started()
    q.hand_over(committed(_binlog(1))[0])
    q.publisher.fail_commits = 1
    q.mode.drain(q.handover.settle)
    assert q.store.current is None and _visible_ids(q.kafka) == [], "aborted: the next start re-reads it"


def test_a_relay_whose_lease_ran_out_asks_the_broker_and_leaves_nothing_visible():
    kafka = FakeKafka(DEFAULT_TOPICS)
    p = _started(kafka=kafka)
    p.mode.checkpoint(force=True)
    p.hand_over(committed(_binlog(1))[0])
    p.mode.abandon(LeaseLost("lost the lease"))
    assert _visible_ids(kafka) == [] and p.store.current.position == START
    assert p.publisher.aborts == 2, "the open transaction, then the checkpoint's own"

    fenced = _started(kafka=FakeKafka(DEFAULT_TOPICS))
    fenced.hand_over(committed(_binlog(1))[0])
    fenced.mode.abandon(Fenced("cdc-relay.shop-db"))
    assert fenced.publisher.aborts == 0, "fenced: nothing more is written"


def test_a_relay_whose_lease_ran_out_with_a_failed_message_in_its_transaction_sends_no_abort():
    """A zombie's messages time out while it is frozen (the successor waits the delivery
    timeout out before it takes over). librdkafka aborts such a transaction by asking the
    coordinator for an epoch bump of this producer id (KIP-360): a take-over request, which
    a relay without its lease must not make. noida-db granted it and fenced the successor
    (test_transactional.py's zombie, 1 run in 40)."""
    timed_out = DeliveryFailure("_MSG_TIMED_OUT", "Local: Message timed out")
    p = _started(publisher={"fail": lambda m: timed_out})
    p.hand_over(committed(_binlog(1))[0])  # queued; its report is served by abandon's poll
    p.mode.abandon(LeaseLost("lost the lease"))
    assert p.publisher.aborts == 0, "no abort: it would ask the broker for a new epoch"
    assert _visible_ids(p.kafka) == [] and p.store.current is None

    fenced = _started(publisher={"fail": lambda m: FENCED})
    fenced.hand_over(committed(_binlog(1))[0])
    with pytest.raises(Fenced):  # a fenced report found there is the one line
        fenced.mode.abandon(LeaseLost("lost the lease"))
    assert fenced.publisher.aborts == 0


def test_handing_over_opens_one_kafka_transaction_and_counts_its_messages():
    p = _started()
    p.mode.handing_over(SimpleNamespace(size=3))
    p.mode.handing_over(SimpleNamespace(size=2))
    assert p.publisher.current == 1 and p.mode.state.messages == 5
