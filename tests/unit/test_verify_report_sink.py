"""`cdc verify`'s report names what it read: for a RabbitMQ or NATS run the sink (kind,
addresses, streams), never Kafka's inputs (bootstrap, isolation), and no secret."""

from __future__ import annotations

import pytest

from cdc.events.outbox import OutboxTable

pytestmark = pytest.mark.verifier_deps  # spark_jobs.verify imports PySpark's modules


def _config(sink: dict[str, str]):
    from spark_jobs.verify import VerifyConfig

    table = OutboxTable("shop", "outbox", "t.{aggregate_type}")
    return VerifyConfig({"host": "db", "password": "db-secret"}, "src", (table,), "unused:9", sink=sink)


PLAN = {
    "at_ms": 1,
    "missing_topics": [],
    "partitions": [
        {"topic": "t.order", "partition": 0, "stream": "t.order-0", "low": 0, "high": 3},
        {"topic": "t.order", "partition": 1, "stream": "t.order-1", "low": 0, "high": 0},
    ],
}


def test_a_rabbitmq_run_names_the_node_and_its_streams():
    from spark_jobs.verify import read_inputs

    config = _config({"format": "cdc_rabbitmq", "host": "mq", "port": "5552", "vhost": "/", "user": "relay",
                      "password": "mq-secret", "empty_wait": "2"})  # fmt: skip
    inputs = read_inputs(config, PLAN, {("t.order", 0): (3, 0, 2)}, {"t.order"}, [])
    assert "kafka" not in inputs
    sink = inputs["sink"]
    assert sink["kind"] == "rabbitmq_stream" and sink["address"] == "mq:5552" and sink["vhost"] == "/"
    assert sink["streams"] == ["t.order-0", "t.order-1"]
    assert sink["partitions"][0]["records_read"] == 3
    public = config.public()
    assert "kafka_bootstrap" not in public and public["sink_read"]["kind"] == "rabbitmq_stream"
    assert "mq-secret" not in str(inputs) + str(public) and "isolation" not in str(inputs)


def test_a_nats_run_names_the_servers_without_their_credentials():
    from spark_jobs.verify import read_inputs

    config = _config({"format": "cdc_nats", "servers": "nats://relay:nats-secret@n1:4222,nats://n2:4222",
                      "user": "relay", "password": "pw-secret"})  # fmt: skip
    inputs = read_inputs(config, {**PLAN, "partitions": PLAN["partitions"][:1]}, {}, {"t.order"}, [])
    assert inputs["sink"]["kind"] == "nats_jetstream"
    assert inputs["sink"]["servers"] == ["nats://n1:4222", "nats://n2:4222"]
    assert "secret" not in str(inputs) + str(config.public())


def test_a_kafka_run_keeps_its_inputs():
    from spark_jobs.verify import read_inputs

    inputs = read_inputs(_config({}), {**PLAN, "partitions": []}, {}, set(), [])
    assert inputs["kafka"]["bootstrap"] == "unused:9" and inputs["kafka"]["isolation"] == "read_committed"
