"""The RabbitMQ exchange sink's rules that need no server: a topic exchange's binding-key
matching (what `cdc check` uses to say a binding leaves a table's routing keys out), the
message id of an event, the settings and their refusals, and the verifier's options."""

from __future__ import annotations

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from cdc_cli.verify_commands import sink_source_options
from connectors.rabbitmq.exchange_sink import ExchangeSettings, binding_matches, message_id

BASE = {
    "source": {"host": "db", "user": "u", "name": "src"},
    "outbox": {"tables": [{"schema": "app", "table": "outbox"}]},
    "sink": {"kind": "rabbitmq_exchange"},
    "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
}


def _cfg(**sections):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    for name, value in sections.items():
        raw[name] = {**raw.get(name, {}), **value}
    return load_config(raw, {"RABBIT": "secret"})


@pytest.mark.parametrize(
    ("binding", "key", "matches"),
    [
        ("#", "a.b", True),
        ("#", "a", True),
        ("a.#", "a", True),  # '#' matches zero words
        ("a.#", "a.b.c", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),  # '*' is exactly one word
        ("a.*", "a", False),
        ("a.b", "a.c", False),
        ("#.b", "a.b", True),
        ("*.*.c", "a.b.c", True),
        ("a.*", "a.{aggregate_type}", True),  # a placeholder is any one word: '*' covers it
        ("a.order", "a.{aggregate_type}", False),  # one value of it does not
        ("a.#.z", "a.x.y.z", True),
    ],
)
def test_binding_keys_match_as_a_topic_exchange_does(binding, key, matches) -> None:
    assert binding_matches(binding, key) is matches


def test_the_message_id_is_the_events_identity() -> None:
    with_gtid = {
        "cdc.source": "s",
        "cdc.gtid": "0-1-7",
        "cdc.binlog.row": "2",
        "cdc.binlog.file": "f",
        "cdc.binlog.pos": "4",
    }
    assert message_id(with_gtid) == "s|0-1-7|2"
    by_position = {
        "cdc.source": "s",
        "cdc.binlog.row": "0",
        "cdc.binlog.file": "mysql-bin.000003",
        "cdc.binlog.pos": "120",
    }
    assert message_id(by_position) == "s|mysql-bin.000003|120|0"
    assert message_id({"id": "x"}) is None  # not the relay's: no identity


def test_an_exchange_sink_loads_with_its_settings_and_keeps_the_password_out_of_sight() -> None:
    cfg = _cfg(sink={"kind": "rabbitmq_exchange", "rabbitmq_exchange": {
        "port": 5671, "stream_port": 5551, "password_env": "RABBIT", "exchange": "shop", "audit_stream": "shop.audit",
        "vhost": "prod/eu", "user": "c d"}})  # fmt: skip
    rabbit = cfg.sink.rabbitmq_exchange
    assert (rabbit.port, rabbit.stream_port, rabbit.exchange, rabbit.audit_stream) == (5671, 5551, "shop", "shop.audit")
    assert rabbit.password.reveal() == "secret" and "secret" not in repr(cfg)
    settings = ExchangeSettings.from_config(rabbit)
    assert "secret" not in repr(settings) and "secret" not in settings.where()
    assert settings.url().startswith("amqp://c%20d:secret@127.0.0.1:5671/prod%2Feu")  # vhost and user quoted
    assert settings.stream_settings().port == 5551
    options = sink_source_options(cfg)
    assert (options["format"], options["port"], options["audit_stream"]) == ("cdc_rabbitmq", "5551", "shop.audit")


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"checkpoint": {"store": "kafka"}}, 'set checkpoint.store = "file"'),
        ({"kafka": {"delivery": "transactional"}}, "has no broker transactions"),
        ({"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"publish_timeout_s": 0}}}, "must be positive"),
        ({"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"audit_stream": ""}}}, "must be named"),
        (
            {"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"cert_file": "c.pem"}}},
            "cert_file and key_file",
        ),
        ({"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"management_port": 70000}}}, "management_port"),
        (
            {"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"hosts": ["rabbit2"]}}},
            "sink.rabbitmq_exchange.hosts: 'rabbit2' is not \"host:port\"",
        ),
        (
            {"sink": {"kind": "rabbitmq_exchange", "rabbitmq_exchange": {"stream_hosts": ["r2:x"]}}},
            "sink.rabbitmq_exchange.stream_hosts: 'r2:x' is not \"host:port\" (a node's stream port)",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(sections, says) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(**sections)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_clusters_other_nodes_are_asked_after_host_amqp_and_stream_alike() -> None:
    cfg = _cfg(sink={"kind": "rabbitmq_exchange", "rabbitmq_exchange": {
        "host": "r1", "port": 5671, "stream_port": 5551, "hosts": ["r2:5671", "r3:5671"]}})  # fmt: skip
    settings = ExchangeSettings.from_config(cfg.sink.rabbitmq_exchange)
    assert settings.addresses() == [("r1", 5671), ("r2", 5671), ("r3", 5671)]
    assert settings.url(("r2", 5671)).startswith("amqp://guest:@r2:5671/")
    # the audit stream's nodes: hosts' hosts at stream_port, unless stream_hosts says otherwise
    assert settings.stream_settings().addresses() == [("r1", 5551), ("r2", 5551), ("r3", 5551)]
    assert sink_source_options(cfg)["hosts"] == "r2:5551,r3:5551"  # cdc verify asks them too
    assert "r2:5671" in settings.where()
    cfg = _cfg(sink={"kind": "rabbitmq_exchange", "rabbitmq_exchange": {
        "hosts": ["r2:5672"], "stream_hosts": ["r2:6000"]}})  # fmt: skip
    assert ExchangeSettings.from_config(cfg.sink.rabbitmq_exchange).stream_settings().hosts == (("r2", 6000),)


def test_a_node_that_does_not_answer_is_passed_over_and_a_refusal_is_not() -> None:
    import ssl

    from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError

    from connectors.rabbitmq.exchange_sink import _node_down

    def wrapped(exc: BaseException) -> AMQPConnectionError:  # as aiormq's TCP transport raises
        try:
            raise AMQPConnectionError(*exc.args) from exc
        except AMQPConnectionError as out:
            return out

    assert _node_down(wrapped(ConnectionRefusedError(111, "refused")))
    assert _node_down(TimeoutError())
    assert not _node_down(wrapped(ssl.SSLCertVerificationError(1, "certificate verify failed")))
    assert not _node_down(ProbableAuthenticationError("ACCESS_REFUSED"))
