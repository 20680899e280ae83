"""Issue 13: one Kafka client configuration for every Kafka client the project builds.

Each client is built for real through the project's own code paths (the relay, its
checkpoint store, recovery reader, `cdc check`, `cdc repair`, `cdc locate`, the
verifier's batch and streaming Spark sources, topic creation), with confluent-kafka's
client classes replaced by recorders that keep the configuration they were given
(no socket is opened): every one must carry `[kafka.client]`'s SASL_SSL settings and
secret, producers `[kafka.producer]`, readers `[kafka.consumer]`. A source scan checks
that no product module writes `bootstrap.servers` itself (so no client can be built
around the shared function)."""

import json
import pathlib
import re

import confluent_kafka
import pytest

from cdc.config import Secret, load_config
from cdc.errors import ConfigError
from cdc.kafka_client import KafkaClientConfig, client_conf, redact
from cdc.secret import scrub_secrets

PASSWORD = "Kf-s3cret-Pw-91z"
ROOT = pathlib.Path(__file__).resolve().parents[2]

SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "cdc-relay",
    "sasl.password": PASSWORD,
    "ssl.ca.location": "/etc/kafka/ca.pem",
    "client.id": "cdc-relay-shop",
}


def _raw(**kafka):
    return {
        "source": {"name": "shop", "reader": "thread"},
        "outbox": {"tables": [{"schema": "shop", "table": "outbox"}]},
        "checkpoint": {"store": "kafka", "topic": "cdc.cp"},
        "kafka": {"bootstrap": "b1:9093,b2:9093", "dead_letter_topic": "outbox.dlq", **kafka},
    }


def _cfg(**extra):
    client = {k: v for k, v in SECURITY.items() if k != "sasl.password"} | {"sasl.password_env": "KAFKA_PW"}
    return load_config(
        _raw(
            client=client,
            producer={"linger.ms": 7, "batch.num.messages": 777},
            consumer={"fetch.max.bytes": 1048576},
            **extra,
        ),
        {"KAFKA_PW": PASSWORD},
    )


class _Metadata:
    cluster_id = "c1"
    brokers = {1: object()}
    topics: dict = {}


class _Recorder:
    def __init__(self, kind, calls, conf):
        self.kind, self.conf = kind, dict(conf)
        calls.append((kind, self.conf))

    def __len__(self):
        return 0

    def list_topics(self, *a, **kw):
        return _Metadata()

    def get_watermark_offsets(self, *a, **kw):
        return 0, 0

    def poll(self, *a):
        return None

    def flush(self, *a):
        return 0

    def close(self):
        pass


@pytest.fixture
def built(monkeypatch):
    """The configuration of every Kafka client constructed while the test runs."""
    calls = []

    def recorder(kind):
        return lambda conf, *a, **kw: _Recorder(kind, calls, conf)

    import connectors.checkpoint_stores as checkpoint_stores
    import connectors.kafka.check as kafka_check
    import connectors.kafka.reader as kafka_reader
    import connectors.kafka.sink as kafka_sink
    import connectors.kafka.topics as kafka_topics

    monkeypatch.setattr(kafka_sink, "Producer", recorder("producer"))
    monkeypatch.setattr(checkpoint_stores, "Producer", recorder("producer"))
    monkeypatch.setattr(kafka_reader, "Consumer", recorder("consumer"))
    monkeypatch.setattr(kafka_reader, "AdminClient", recorder("admin"))
    monkeypatch.setattr(kafka_check, "AdminClient", recorder("admin"))
    monkeypatch.setattr(kafka_topics, "AdminClient", recorder("admin"))
    monkeypatch.setattr(confluent_kafka, "Consumer", recorder("consumer"))  # spark_jobs import it when they run
    return calls


def _assert_carries_security(calls, what):
    assert calls, f"{what}: no Kafka client was built"
    for kind, conf in calls:
        for key, value in SECURITY.items():
            assert conf.get(key) == value, f"{what}: the {kind} client has {key}={conf.get(key)!r}"
        assert conf["bootstrap.servers"] == "b1:9093,b2:9093", what
        assert (conf.get("batch.num.messages") == 777) == (kind == "producer"), f"{what}: {kind}, [kafka.producer]"
        assert (conf.get("fetch.max.bytes") == 1048576) == (kind == "consumer"), f"{what}: {kind}, [kafka.consumer]"


def test_the_relay_its_producer_recovery_reader_and_kafka_checkpoint_store(built):
    from cdc_cli.app import build_relay

    handle = build_relay(_cfg())
    handle.store.load()  # the checkpoint store's reader
    handle.reader.partition_count("t")
    handle.reader.watermarks("t", 0)  # the recovery reader's consumer (built on first use)
    kinds = sorted(kind for kind, _ in built)
    assert kinds.count("producer") == 2 and "consumer" in kinds and "admin" in kinds, kinds
    _assert_carries_security(built, "cdc run")
    relay_producer = next(c for k, c in built if k == "producer" and c.get("compression.type") == "lz4")
    assert relay_producer["enable.idempotence"] is True and relay_producer["acks"] == "all"
    readers = [c for k, c in built if k == "consumer"]
    assert all(c["isolation.level"] == "read_committed" and c["fetch.max.bytes"] == 1048576 for c in readers)


def test_transactional_delivery_its_producer_and_checkpoint_store(built):
    from cdc_cli.app import build_relay

    build_relay(_cfg(delivery="transactional"))
    _assert_carries_security(built, "cdc run (transactional)")
    assert any(c.get("transactional.id") == "cdc-relay.shop" for k, c in built if k == "producer")


def test_cdc_check(built):
    from connectors.kafka.check import check_kafka

    results = check_kafka(_cfg())
    assert results[0].ok, results
    assert len(built) == 2  # one metadata client per bootstrap address
    for _kind, conf in built:
        assert conf["bootstrap.servers"] in ("b1:9093", "b2:9093")
        assert all(conf[k] == v for k, v in SECURITY.items())


def test_cdc_repair(built, monkeypatch):
    import cdc_cli.repair as repair

    monkeypatch.setattr(repair, "_read_transaction", lambda *a: None)  # no binlog here: Kafka's side only
    missing = [{"source": "shop", "file": "mysql-bin.000001", "pos": 4, "row": 0, "expected_topic": "outbox.event.a"}]
    result = repair.repair(_cfg(), missing)
    assert result.not_found_in_binlog == 1
    assert sorted(k for k, _ in built) == ["admin", "producer"] or "consumer" in [k for k, _ in built]
    _assert_carries_security(built, "cdc repair")


def test_cdc_locate_both_ways(built):
    import argparse

    from cdc_cli.verify_commands import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    cfg = _cfg()
    import cdc_cli.config_file as config_file

    original = config_file.read_config
    config_file.read_config = lambda path: cfg
    try:
        for argv in (
            ["locate", "--config", "x", "--topic", "t", "--partition", "0", "--offset", "3"],
            ["locate", "--config", "x", "--position", "mysql-bin.000001:4"],
        ):
            args = parser.parse_args(argv)
            assert args.func(args) == 3  # nothing found in the recorder's empty topics
    finally:
        config_file.read_config = original
    assert len(built) >= 2
    _assert_carries_security(built, "cdc locate")


def test_cdc_adopt_reads_debeziums_offsets_topic_with_them(built):
    """`cdc adopt --debezium-offsets-topic`: the Connect worker's offsets topic lives on the
    same secured cluster, so its reader carries [kafka.client] too."""
    import argparse

    from cdc.errors import ConfigError
    from cdc_cli.adopt import read_offset

    args = argparse.Namespace(
        debezium_offsets_file=None,
        debezium_offsets_topic="connect-offsets",
        debezium_connector="shop-outbox",
        debezium_server=None,
        config_obj=_cfg(),
    )
    with pytest.raises(ConfigError, match="does not exist"):  # the recorder's cluster has no topics
        read_offset(args)
    assert {kind for kind, _ in built} == {"admin"}
    _assert_carries_security(built, "cdc adopt")


def test_the_verifiers_batch_and_streaming_sources_carry_them_to_the_executors(built):
    from cdc_cli.verify_commands import verify_config
    from spark_jobs.kafka.source import KafkaReader
    from spark_jobs.kafka.stream import KafkaStreamReader

    vcfg = verify_config(_cfg(), "/tmp/unused")
    # As verify.py and follow.py pass it: a JSON option, read back on an executor.
    option = json.dumps(dict(vcfg.consumer_conf))
    KafkaReader({"bootstrap": vcfg.kafka_bootstrap, "topics": "a", "consumer_conf": option}).partitions()
    KafkaStreamReader({"bootstrap": vcfg.kafka_bootstrap, "topics": "a", "consumer_conf": option}).latestOffset()
    assert len(built) == 2
    _assert_carries_security(built, "cdc verify")
    for _kind, conf in built:
        assert conf["enable.auto.commit"] is False and conf["isolation.level"] == "read_committed"
    assert PASSWORD not in repr(vcfg) and PASSWORD not in json.dumps(vcfg.public())


def test_follow_and_batch_verify_hand_the_consumer_conf_option_to_their_sources():
    """The Spark sources read `consumer_conf`: both verify jobs must set it."""
    for path in ("spark_jobs/verify.py", "spark_jobs/follow.py"):
        text = (ROOT / path).read_text()
        assert re.search(r'\.option\("consumer_conf", json\.dumps\(dict\(\w+\.consumer_conf\)\)\)', text), path


def test_topic_creation(built):
    from connectors.kafka.topics import KafkaTopicAdmin

    cfg = _cfg()
    admin = KafkaTopicAdmin.from_config(cfg.kafka.clients(), cfg.topics)
    admin._admin_()
    _assert_carries_security(built, "topic creation")


def test_no_product_module_writes_bootstrap_servers_itself():
    """Every client's settings come from cdc.kafka_client.client_conf, the only writer of
    `bootstrap.servers` (the lab servers in testbed/ - the stand-in and noida-db - are not
    the product's clients)."""
    offenders = []
    for folder in ("cdc", "connectors", "cdc_cli", "spark_jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name in ("kafka_client.py", "config.py"):
                continue
            if '"bootstrap.servers"' in path.read_text():
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


# -- the configuration itself ----------------------------------------------------------------


def test_a_secret_written_in_the_file_is_refused_naming_the_fix():
    with pytest.raises(
        ConfigError,
        match=r"kafka.client.sasl.password must not be written in the config file; use "
        r'"sasl.password_env"',
    ):
        load_config(_raw(client={"sasl.password": "x"}))
    with pytest.raises(ConfigError, match="kafka.producer.ssl.key.password must not be written"):
        load_config(_raw(producer={"ssl.key.password": "x"}))
    with pytest.raises(ConfigError, match="KAFKA_NOPE, which is not set"):
        load_config(_raw(client={"sasl.oauthbearer.client.secret_env": "KAFKA_NOPE"}))


def test_secrets_come_from_a_file_or_the_environment(tmp_path):
    secret = tmp_path / "kafka.pw"
    secret.write_text(PASSWORD + "\n")
    cfg = load_config(
        _raw(client={"sasl.password_file": str(secret), "ssl.key.password_env": "KEY_PW"}), {"KEY_PW": "key-pw-77"}
    )
    assert isinstance(cfg.kafka.client["sasl.password"], Secret)
    conf = cfg.kafka.clients().conf("consumer")
    assert conf["sasl.password"] == PASSWORD and conf["ssl.key.password"] == "key-pw-77"
    assert PASSWORD not in repr(cfg) and PASSWORD not in repr(cfg.kafka.clients())
    with pytest.raises(ConfigError, match="cannot read kafka.client.sasl.password_file"):
        load_config(_raw(client={"sasl.password_file": str(tmp_path / "none")}))


def test_security_settings_belong_to_kafka_client_only():
    for block, key in (
        ("producer", "security.protocol"),
        ("consumer", "sasl.mechanism"),
        ("producer", "ssl.ca.location"),
    ):
        with pytest.raises(
            ConfigError,
            match=rf"kafka.{block}.{re.escape(key)} is a connection or security setting: "
            r"move it to \[kafka.client\]",
        ):
            load_config(_raw(**{block: {key: "x"}}))


def test_layers_later_wins_and_enforced_last():
    clients = KafkaClientConfig("b:1", {"client.id": "a", "linger.ms": 1}, {"linger.ms": 2}, {"client.id": "c"})
    assert clients.conf("producer", {"linger.ms": 0, "acks": "1"}, {"acks": "all"}) == {
        "client.id": "a",
        "linger.ms": 2,
        "acks": "all",
        "bootstrap.servers": "b:1",
    }
    assert clients.conf("consumer")["client.id"] == "c"
    assert clients.conf("admin") == {"client.id": "a", "linger.ms": 1, "bootstrap.servers": "b:1"}
    assert client_conf("x:1", {"bootstrap.servers": "evil"})["bootstrap.servers"] == "x:1"


def test_secrets_are_scrubbed_from_text():
    cfg = _cfg()
    text = f'Invalid value "{PASSWORD}" for sasl.password'
    assert PASSWORD not in redact(text, cfg.kafka.clients())
    assert scrub_secrets(text) == 'Invalid value "***" for sasl.password'


def test_the_producers_guarantees_cannot_be_overridden_from_kafka_client():
    from connectors.kafka.sink import producer_settings

    with pytest.raises(ConfigError, match="would break delivery guarantees"):
        producer_settings(KafkaClientConfig("b:1", {"acks": "1"}))
    assert producer_settings(KafkaClientConfig("b:1", {"client.id": "x"}))["acks"] == "all"
