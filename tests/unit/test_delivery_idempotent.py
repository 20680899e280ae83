"""The idempotent delivery mode alone (cdc/delivery/idempotent.py), call by call over the
fakes: its checkpoint follows the acknowledgements, is forced before a topic's first
message, a restart scans the topics' tails, a failure stops the relay, and a drain
writes the released checkpoint of the proven prefix."""

import pytest
from delivery_parts import START, ModeParts, committed

from cdc.errors import DeliveryError
from cdc.lease import LeaseClock, LeaseSettings
from cdc.ports import Delivery, DeliveryFailure
from fakes import TOO_LARGE, Binlog, FakeKafka, outbox_row

ORDER = "outbox.event.order"


def _id(msg):
    return dict(msg.headers)["id"].decode()


def _binlog(n, aggregate="order"):
    b = Binlog()
    for i in range(n):
        b.transaction([outbox_row(f"e{i}a", aggregate, f"k{i}"), outbox_row(f"e{i}b", aggregate, f"k{i}")])
    return b


def test_the_checkpoint_passes_only_transactions_whose_every_message_was_acknowledged():
    b = _binlog(3)
    p = ModeParts(publisher={"hold_acks": True})
    p.open()
    txs = committed(b)
    for tx in txs:
        p.hand_over(tx)
    saved = len(p.store.history)  # the topic was named before its first message
    assert p.store.current.position == START
    p.publisher.release(where=lambda m: _id(m).startswith("e0"))  # both of the first
    p.publisher.release(where=lambda m: _id(m) == "e2a")  # half of the third
    p.ledger.window.advance()
    p.mode.checkpoint()
    assert p.store.current.position == txs[0].end, "the second is unacknowledged: the checkpoint stops before it"
    assert len(p.store.history) == saved + 1
    p.mode.checkpoint()
    assert len(p.store.history) == saved + 1, "nothing moved: nothing written"
    p.publisher.release()
    p.ledger.window.advance()
    p.mode.checkpoint()
    assert p.store.current.position == txs[-1].end
    assert not p.store.current.exact, "an idempotent checkpoint is never exact: a restart scans"


def test_a_topic_is_named_in_a_durable_checkpoint_before_its_first_message():
    kafka = FakeKafka({"outbox.event.order": 3, "outbox.dlq": 2})
    p = ModeParts(kafka=kafka)
    p.open()
    order = []
    p.store.on_save = lambda cp: order.append(("checkpoint", sorted(cp.partitions)))
    publish = p.publisher.publish

    def recording(topic, *args, **kw):
        order.append(("publish", topic))
        publish(topic, *args, **kw)

    p.publisher.publish = recording
    [tx] = committed(_binlog(1))
    p.hand_over(tx)
    assert order[0] == ("checkpoint", ["outbox.event.order"]), order
    assert order[1] == ("publish", "outbox.event.order")
    assert p.store.current.offsets == {"outbox.event.order": {0: 0, 1: 0, 2: 0}}


def test_a_restart_scans_the_topics_tails_and_skips_what_the_previous_run_delivered():
    b = _binlog(4)
    first = ModeParts()
    first.open()
    txs = committed(b)
    for tx in txs:
        first.hand_over(tx)  # delivered, but no checkpoint after the topic was named
    assert first.store.current.position == START

    second = ModeParts(kafka=first.kafka, store=first.store)
    second.open(second.store.load())
    assert second.ledger.recovery is not None and second.ledger.recovery_stats.found == 8
    for tx in committed(b):
        second.hand_over(tx)
    assert len(first.kafka.records("outbox.event.order")) == 8, "nothing published twice"
    assert second.metrics.events_skipped_recovery == 8
    second.ledger.window.advance()
    second.mode.checkpoint()
    assert second.store.current.position == txs[-1].end


def test_a_delivery_failure_stops_the_relay_naming_the_topic_and_the_cause():
    p = ModeParts()
    p.open()
    p.ledger.delivery_failed(
        Delivery("outbox.event.order", 1, -1, DeliveryFailure("TOPIC_AUTHORIZATION_FAILED", "not authorized"))
    )
    with pytest.raises(DeliveryError, match=r"outbox.event.order: TOPIC_AUTHORIZATION_FAILED: not authorized"):
        p.mode.failed()
    with pytest.raises(DeliveryError, match="why"):
        p.mode.rewind("why")  # never asked to: nothing in this mode reads again
    assert p.mode.readable_when_acknowledged, "an acknowledgement without an offset is looked for"


def test_a_drain_sends_the_redirected_dead_letters_then_writes_the_released_checkpoint():
    b = _binlog(2)
    lease = LeaseClock(LeaseSettings(), 0.0)
    p = ModeParts(lease=lease, publisher={"fail": lambda m: TOO_LARGE if (m.topic, _id(m)) == (ORDER, "e1b") else None})
    p.open()
    txs = committed(b)
    for tx in txs:
        p.handover.transaction(tx)  # acknowledgements not served yet
    p.mode.drain(p.handover.settle)
    cp = p.store.current
    assert cp.position == txs[-1].end and cp.released
    assert [r.header_text["id"] for r in p.kafka.records("outbox.dlq")] == ["e1b"]
    assert p.metrics.dead_lettered["too_large"] == 1


def test_a_drain_that_leaves_messages_unacknowledged_is_not_released():
    b = _binlog(2)
    p = ModeParts(lease=LeaseClock(LeaseSettings(), 0.0), publisher={"hold_acks": True}, drain_timeout_s=0.01)
    p.open()
    txs = committed(b)
    for tx in txs:
        p.hand_over(tx)
    p.publisher.release(where=lambda m: _id(m).startswith("e0"))
    p.mode.drain(p.handover.settle)
    cp = p.store.current
    assert cp.position == txs[0].end and not cp.released, "a successor must wait for this relay's producer"
