"""Delivery health over the fakes: the oldest unacknowledged message's age, readiness and
its reason, a new topic whose metadata Kafka does not answer for a while (the relay waits,
it does not die), dead-letter counters present from the start, checkpoint age 0 when the
relay is idle and up to date, and the Kafka reachability lines (one down, one up)."""

import logging

import pytest

from cdc.errors import DeliveryError
from cdc.events.outbox import DEAD_LETTER_CAUSES
from cdc.kafka_health import KafkaHealth
from cdc.metrics import RelayMetrics
from fakes import Binlog, RelayHarness, outbox_row


def _binlog(n, aggregate="order"):
    b = Binlog()
    for i in range(n):
        b.transaction([outbox_row(f"e{i}", aggregate, f"k{i}")])
    return b


def test_dead_letter_counters_exist_with_every_cause_at_zero():
    m = RelayMetrics()
    assert dict(m.dead_lettered) == {c: 0 for c in DEAD_LETTER_CAUSES} and m.dead_lettered_total == 0


def test_readiness_turns_false_with_the_reason_when_a_message_waits_too_long():
    m = RelayMetrics(ready=True, max_unacknowledged_age_s=5.0)
    assert m.readiness(100.0) == (True, [])
    m.unacknowledged_since = lambda: 94.0
    ok, reasons = m.readiness(100.0)
    assert not ok and "handed to Kafka 6 s ago (bound relay.max_unacknowledged_age_s = 5)" in reasons[0]
    m.kafka_reachable, m.kafka_unreachable_since = False, 80.0
    assert "Kafka unreachable for 20 s" in m.readiness(100.0)[1][0]
    m.ready, m.role = False, "standby"
    assert m.readiness(100.0) == (False, ["not streaming (standby)"])


def test_the_window_reports_its_oldest_unacknowledged_message():
    h = RelayHarness(_binlog(3), publisher={"hold_acks": True})
    h.run()
    since = h.relay.metrics.unacknowledged_since()
    assert since is not None and since > 0
    h.publisher.release()
    assert h.relay.metrics.unacknowledged_since() is None


def test_checkpoint_age_is_zero_when_the_relay_is_idle_and_up_to_date():
    h = RelayHarness(_binlog(3))
    calls = []

    def stop(h_):
        calls.append(1)
        return len(calls) > 50

    h.run(stop)
    assert h.relay.metrics.checkpoint_age(h.clock.now + 1000) == 0.0


class _SlowMetadata:
    """The delivered log of the fakes, but metadata questions fail the first `fail` times."""

    def __init__(self, inner, fail):
        self.inner, self.fail = inner, fail

    def partition_count(self, topic):
        if self.fail > 0:
            self.fail -= 1
            raise DeliveryError("cannot read Kafka metadata from k:9092 (kafka.bootstrap) within 10 s: down")
        return self.inner.partition_count(topic)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_new_topic_while_kafka_does_not_answer_makes_the_relay_wait_not_die(caplog):
    h = RelayHarness(_binlog(4))
    h.relay._delivered = _SlowMetadata(h.delivered, fail=3)
    with caplog.at_level(logging.INFO, logger="cdc.relay"):
        h.run()
    assert len(h.kafka.records("outbox.event.order")) == 4
    text = caplog.text
    assert "waiting for Kafka (up to 5 s, relay.reconnect_timeout_s)" in text and "Kafka answered" in text
    assert h.relay.metrics.kafka_waiting_since == 0.0


def test_kafka_that_never_answers_ends_the_run_after_the_reconnect_timeout():
    h = RelayHarness(_binlog(1))
    h.relay._delivered = _SlowMetadata(h.delivered, fail=10**9)
    with pytest.raises(DeliveryError, match=r"kafka.bootstrap"):
        h.run()


def test_kafka_health_logs_one_line_down_and_one_up(caplog):
    m = RelayMetrics()
    now = [100.0]
    health = KafkaHealth(m, "k1:9092,k2:9092", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="cdc.kafka_health"):
        health.unreachable("3/3 brokers are down", 12)
        health.unreachable("3/3 brokers are down", 40)
        now[0] = 130.5
        health.brokers_up(0)
        health.brokers_up(2)
        health.reachable()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "k1:9092,k2:9092 (kafka.bootstrap)" in lines[0] and "12 message(s) wait" in lines[0]
    assert "reachable again after 30.5 s" in lines[1]
    assert (m.kafka_reachable, m.kafka_outages, m.kafka_brokers_up) == (True, 1, 2)


def test_every_dead_letter_is_logged_with_its_cause_and_place_at_most_once_per_cause_every_10_s(caplog):
    b = Binlog()
    for i in range(20):
        b.transaction([outbox_row(f"d{i}", "order", None)])  # NULL aggregate id: null_column
    h = RelayHarness(b)
    with caplog.at_level(logging.WARNING, logger="cdc.relay"):
        h.run()
    lines = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert h.relay.metrics.dead_lettered["null_column"] == 20
    assert len(lines) == 1, lines
    assert "event d0 of" in lines[0] and "null_column" in lines[0] and "mysql-bin.000001:" in lines[0]


def test_log_limiter_lets_one_line_a_key_through_per_interval_and_counts_the_rest():
    from cdc.log_limit import LogLimiter

    now = [0.0]
    limit = LogLimiter(30.0, clock=lambda: now[0])
    assert limit.allow("a") == (True, 0)
    assert limit.allow("a") == (False, 0) and limit.allow("a") == (False, 0)
    assert limit.allow("b") == (True, 0)
    now[0] = 31.0
    assert limit.allow("a") == (True, 2)
