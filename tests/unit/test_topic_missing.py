"""Issue 13: an event for a topic that does not exist (brokers with
auto.create.topics.enable=false) never halts the relay and is never lost: it is
dead-lettered with cause `topic_missing` and one log line names the topic, or the topic
is created first (`topics.missing = "create"`, through the TopicAdmin port); the other
topics go on; a topic is named in a checkpoint before its first message either way."""

import logging
import random

from cdc.ports import DeliveryFailure
from connectors.kafka.topics import KafkaTopicAdmin, new_topic_request
from fakes import Binlog, FakeKafka, RelayHarness, outbox_row

DLQ = "outbox.dlq"
ORDER, INVOICE = "outbox.event.order", "outbox.event.invoice"


def _binlog() -> Binlog:
    b = Binlog()
    b.transaction([outbox_row("o1", "order", "k1"), outbox_row("i1", "invoice", "k9")])
    b.transaction([outbox_row("o2", "order", "k1")])
    b.transaction([outbox_row("i2", "invoice", "k9"), outbox_row("o3", "order", "k2")])
    return b


def _no_auto_create() -> FakeKafka:
    return FakeKafka({ORDER: 3, DLQ: 2}, auto_create_partitions=None)


def _ids(kafka, topic):
    return sorted(r.header_text["id"] for r in kafka.records(topic))


def test_a_missing_topic_dead_letters_its_events_and_the_other_topics_go_on(caplog):
    b = _binlog()
    h = RelayHarness(b, kafka=_no_auto_create())
    assert h.settings.topic_missing == "dead_letter"  # the default
    with caplog.at_level(logging.WARNING, logger="cdc.relay"):
        summary = h.run()
    assert summary.stopped_by == "request"
    assert _ids(h.kafka, ORDER) == ["o1", "o2", "o3"]
    dead = h.kafka.records(DLQ)
    assert [d.header_text["id"] for d in dead] == ["i1", "i2"]
    for d in dead:
        hd = d.header_text
        assert hd["cdc.dlq.cause"] == "topic_missing" and hd["cdc.dlq.topic"] == INVOICE
        assert f"topic {INVOICE!r} does not exist" in hd["cdc.dlq.error"]
    assert INVOICE not in h.kafka.logs  # nothing was produced to it
    assert h.relay.metrics.dead_lettered["topic_missing"] == 2
    assert h.store.current.position == b.txs[-1].end  # nothing held back
    # one line names the topic to create (not one per event)
    naming = [
        r.getMessage()
        for r in caplog.records
        if "create it" in r.getMessage() and "the other topics go on" in r.getMessage()
    ]
    assert len(naming) == 1 and f"kafka-topics.sh --create --topic {INVOICE}" in naming[0], naming


def test_a_topic_created_later_is_published_to_again():
    b = _binlog()
    kafka = _no_auto_create()
    h = RelayHarness(b, kafka=kafka, topic_recheck_s=0.0)
    publish = h.publisher.publish

    def create_after_first_dead_letter(topic, *args, **kw):
        if topic == DLQ and INVOICE not in kafka.logs:
            kafka.create_topic(INVOICE, 2)  # the operator reads the log line and creates it
        return publish(topic, *args, **kw)

    h.publisher.publish = create_after_first_dead_letter
    h.run()
    assert [d.header_text["id"] for d in kafka.records(DLQ)] == ["i1"]
    assert _ids(kafka, INVOICE) == ["i2"]
    assert INVOICE in h.store.current.partitions


class _CreatingAdmin:
    """The TopicAdmin port over the fake broker (unit tests only)."""

    def __init__(self, kafka: FakeKafka, refuse: str | None = None):
        self.kafka, self.refuse, self.asked = kafka, refuse, []

    def create_topic(self, topic: str) -> str | None:
        self.asked.append(topic)
        if self.refuse:
            return self.refuse
        self.kafka.create_topic(topic, 4)
        return None


def test_create_policy_creates_the_topic_before_the_first_message_and_names_it_in_a_checkpoint():
    b = _binlog()
    kafka = _no_auto_create()
    admin = _CreatingAdmin(kafka)
    h = RelayHarness(b, kafka=kafka, topics=admin, topic_missing="create")
    publish = h.publisher.publish
    unnamed = []

    def checked(topic, *args, **kw):
        cp = h.store.current
        if cp is None or topic not in cp.partitions:
            unnamed.append(topic)
        return publish(topic, *args, **kw)

    h.publisher.publish = checked
    h.run()
    assert admin.asked == [INVOICE]
    assert _ids(kafka, INVOICE) == ["i1", "i2"] and kafka.records(DLQ) == []
    assert not unnamed and h.store.current.partitions[INVOICE] == 4


def test_a_refused_creation_dead_letters_with_the_reason():
    b = _binlog()
    kafka = _no_auto_create()
    admin = _CreatingAdmin(kafka, refuse="CreateTopics refused: TOPIC_AUTHORIZATION_FAILED: not allowed")
    h = RelayHarness(b, kafka=kafka, topics=admin, topic_missing="create")
    h.run()
    dead = kafka.records(DLQ)
    assert [d.header_text["id"] for d in dead] == ["i1", "i2"]
    assert (
        "could not be created: CreateTopics refused: TOPIC_AUTHORIZATION_FAILED" in dead[0].header_text["cdc.dlq.error"]
    )
    assert admin.asked == [INVOICE]  # asked again only after topic_recheck_s (10 s)
    assert _ids(kafka, ORDER) == ["o1", "o2", "o3"]


def test_a_message_kafka_refuses_for_a_missing_topic_is_dead_lettered_not_a_stop():
    """topics.missing = "auto" (no check), and the brokers did not create it: librdkafka
    fails the message with UNKNOWN_TOPIC_OR_PART; the relay dead-letters it and goes on."""
    b = _binlog()
    failure = DeliveryFailure("UNKNOWN_TOPIC_OR_PART", "Broker: Unknown topic or partition", topic_missing=True)
    h = RelayHarness(
        b,
        kafka=FakeKafka({ORDER: 3, DLQ: 2}),
        publisher=dict(fail=lambda m: failure if m.topic == INVOICE else None),
        topic_missing="auto",
    )
    summary = h.run()
    assert summary.stopped_by == "request"
    dead = h.kafka.records(DLQ)
    assert [d.header_text["id"] for d in dead] == ["i1", "i2"]
    assert all(d.header_text["cdc.dlq.cause"] == "topic_missing" for d in dead)
    assert "UNKNOWN_TOPIC_OR_PART" in dead[0].header_text["cdc.dlq.error"]
    assert _ids(h.kafka, ORDER) == ["o1", "o2", "o3"]
    assert h.store.current.position == b.txs[-1].end
    # after the refusal the next event for it is dead-lettered at once, not sent to wait for the same refusal
    assert [m.topic for m in h.publisher.published].count(INVOICE) == 1


def test_killed_after_a_topic_missing_dead_letter_then_restarted_exactly_once():
    for seed in range(20):
        rng = random.Random(seed)
        b = _binlog()
        kafka = _no_auto_create()
        first = RelayHarness(b, kafka=kafka)
        first.run_until_killed(lambda h: len(kafka.records(DLQ)) >= 1 and rng.random() < 0.5, rng)
        second = RelayHarness(b, kafka=kafka, store=first.store)
        second.run()
        assert _ids(kafka, ORDER) == ["o1", "o2", "o3"], seed
        assert [d.header_text["id"] for d in kafka.records(DLQ)] == ["i1", "i2"], seed


def test_create_request_carries_partitions_replication_factor_and_configs():
    req = new_topic_request(
        INVOICE, 12, 3, {"min.insync.replicas": 2, "cleanup.policy": "delete", "unclean.leader.election.enable": False}
    )
    assert (req.topic, req.num_partitions, req.replication_factor) == (INVOICE, 12, 3)
    assert req.config == {
        "min.insync.replicas": "2",
        "cleanup.policy": "delete",
        "unclean.leader.election.enable": "false",
    }
    default = KafkaTopicAdmin(
        "127.0.0.1:9",
    ).request(INVOICE)  # builds the request only: no connection
    assert (default.num_partitions, default.replication_factor, default.config) == (-1, -1, {})


def test_create_policy_creates_a_missing_dead_letter_topic_too():
    b = Binlog()
    b.transaction([outbox_row("i1", "invoice", "k9")])
    kafka = FakeKafka({ORDER: 3}, auto_create_partitions=None)
    admin = _CreatingAdmin(kafka, refuse=None)
    original = admin.create_topic
    admin.create_topic = lambda topic: "refused: no CREATE on invoices" if topic == INVOICE else original(topic)
    h = RelayHarness(b, kafka=kafka, topics=admin, topic_missing="create")
    h.run()
    assert admin.asked == [DLQ]  # the invoice refusal was answered by the wrapper
    [dead] = kafka.records(DLQ)
    assert (
        dead.header_text["cdc.dlq.cause"] == "topic_missing"
        and "no CREATE on invoices" in dead.header_text["cdc.dlq.error"]
    )
