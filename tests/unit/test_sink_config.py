"""`[sink]`: the kind of broker and each kind's own section, with secrets by `_env` /
`_file` only. No broker."""

from __future__ import annotations

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError

# a sink other than Kafka keeps its checkpoint in a file (checkpoint.store = "kafka" is refused there)
BASE = {
    "source": {"name": "shop"},
    "outbox": {"tables": [{"schema": "s", "table": "outbox"}]},
    "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
}


def _load(sink: dict | None, env: dict | None = None, files: dict | None = None):
    raw = {**BASE, **({"sink": sink} if sink is not None else {})}
    return load_config(raw, env or {}, read_file=lambda p: (files or {})[p])


def test_kafka_is_the_default_and_the_other_sections_keep_their_defaults():
    cfg = _load(None)
    assert cfg.sink.kind == "kafka"
    assert cfg.sink.rabbitmq_stream.port == 5552 and cfg.sink.nats_jetstream.servers == ("nats://127.0.0.1:4222",)


def test_a_kind_and_its_section_with_secrets_from_the_environment_and_a_file():
    cfg = _load(
        {
            "kind": "rabbitmq_stream",
            "rabbitmq_stream": {"host": "mq", "port": 5551, "user": "cdc", "password_env": "MQ_PW"},
            "nats_jetstream": {"servers": "nats://a:4222, nats://b:4222", "token_file": "/run/nats"},
        },
        env={"MQ_PW": "mq-secret", "CDC_SINK_RABBITMQ_STREAM_VHOST": "shop"},
        files={"/run/nats": "nats-secret\n"},
    )
    mq, nats = cfg.sink.rabbitmq_stream, cfg.sink.nats_jetstream
    assert (cfg.sink.kind, mq.host, mq.port, mq.vhost, mq.password.reveal()) == (
        "rabbitmq_stream", "mq", 5551, "shop", "mq-secret",
    )  # fmt: skip
    assert nats.servers == ("nats://a:4222", "nats://b:4222") and nats.token.reveal() == "nats-secret"
    assert "mq-secret" not in repr(cfg) and "nats-secret" not in repr(cfg)


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ({"kind": "pulsar"}, "sink.kind must be one of"),
        ({"rabbitmq_stream": {"password": "x"}}, "sink.rabbitmq_stream.password must not be written"),
        ({"nats_jetstream": {"url": "nats://x"}}, "unknown setting sink.nats_jetstream.url"),
        ({"rabbitmq_stream": {"port": "five"}}, "sink.rabbitmq_stream.port must be an integer"),
    ],
)
def test_a_wrong_sink_setting_is_one_line_naming_it(sink, message):
    with pytest.raises(ConfigError, match=message):
        _load(sink)
