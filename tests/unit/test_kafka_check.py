"""`cdc check`'s Kafka look, the parts that need no broker (connectors/kafka/check.py)."""

from cdc.config import load_config
from connectors.kafka.check import _error_text, admin_settings, bootstrap_addresses, check_kafka


def test_the_checks_client_carries_kafka_client_and_no_producer_setting():
    cfg = _cfg(
        bootstrap="a:1,b:2",
        client={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "ssl.ca.location": "/etc/ca.pem",
            "socket.timeout.ms": 5000,
            "client.id": "relay",
        },
        producer={"linger.ms": 5, "acks": "all", "compression.type": "zstd"},
    )
    conf = admin_settings(cfg.kafka.clients(), "b:2")
    assert {k: v for k, v in conf.items() if k not in ("logger", "log.connection.close")} == {
        "bootstrap.servers": "b:2",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "ssl.ca.location": "/etc/ca.pem",
        "socket.timeout.ms": 5000,
        "client.id": "relay",
    }


def test_bootstrap_addresses_are_split_and_trimmed():
    assert bootstrap_addresses(" a:9092, b:9092 ,,c:1") == ["a:9092", "b:9092", "c:1"]
    assert bootstrap_addresses(" , ") == []


def test_librdkafkas_error_text_loses_its_decorations():
    assert (
        _error_text(
            "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)"
        )
        == "Connect to ipv4#127.0.0.1:9 failed: Connection refused"
    )
    assert _error_text("b:9092/2: SASL authentication error (after 3ms in state AUTH_REQ)") == (
        "SASL authentication error"
    )


def _cfg(**kafka):
    return load_config(
        {"source": {"name": "s"}, "outbox": {"tables": [{"schema": "d", "table": "outbox"}]}, "kafka": kafka}
    )


def test_an_empty_bootstrap_fails_naming_the_setting():
    [result] = check_kafka(_cfg(bootstrap=" "))
    assert not result.ok and result.message == "kafka.bootstrap is empty: set it to the brokers' host:port list"


def test_settings_the_client_refuses_fail_naming_kafka_client():
    [result] = check_kafka(_cfg(bootstrap="127.0.0.1:9", client={"ssl.no.such.thing": "x"}))
    assert not result.ok and result.name == "kafka"
    assert result.message.startswith("the Kafka client refuses the settings of kafka.client (")
    assert "ssl.no.such.thing" in result.message and result.message.endswith("): fix them")


def test_a_refused_setting_never_shows_a_secret():
    cfg = load_config(
        {
            "source": {"name": "s"},
            "outbox": {"tables": [{"schema": "d", "table": "outbox"}]},
            "kafka": {
                "bootstrap": "127.0.0.1:9",
                "client": {"sasl.password_env": "PW", "ssl.no.such.thing": "Zk9-distinctive-pw-7Qx"},
            },
        },
        {"PW": "Zk9-distinctive-pw-7Qx"},
    )
    [result] = check_kafka(cfg)
    assert not result.ok and "ssl.no.such.thing" in result.message
    assert "Zk9-distinctive-pw-7Qx" not in result.message


def test_event_topics_say_which_exist_and_what_happens_to_a_missing_ones_events():
    from types import SimpleNamespace as NS

    from connectors.kafka.check import _event_topics

    tables = [{"schema": "d", "table": "outbox"}, {"schema": "d", "table": "o2", "topic": "fixed.{table}"}]
    meta = NS(
        topics={
            "outbox.event.order": NS(error=None, partitions={0: 1}),
            "outbox.event.user": NS(error=None, partitions={0: 1}),
            "other": NS(error=None, partitions={}),
        }
    )
    for policy, warn in (("dead_letter", True), ("create", False), ("auto", True)):
        cfg = load_config({"source": {"name": "s"}, "outbox": {"tables": tables}, "topics": {"missing": policy}})
        template, fixed = _event_topics(cfg, meta)
        assert template.ok and not template.warn
        assert template.message.startswith(
            "2 existing topic(s) match 'outbox.event.{aggregate_type}' "
            "(outbox.tables[0].topic): outbox.event.order, outbox.event.user; "
        )
        assert fixed.ok and fixed.warn == warn
        assert fixed.message.startswith("topic 'fixed.o2' (outbox.tables[1].topic) does not exist: ")
        assert f'topics.missing = "{policy}"' in fixed.message
    assert (
        "kafka-topics.sh --create --topic fixed.o2"
        in _event_topics(load_config({"source": {"name": "s"}, "outbox": {"tables": tables}}), meta)[1].message
    )
