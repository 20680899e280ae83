"""One Kafka client configuration for every client the project creates.

Every Kafka client - the relay's producer, the recovery and topic-tail readers, the
Kafka checkpoint store, preflight's metadata client, `cdc repair`, `cdc locate`, the
verifier's Spark sources (on the executors too) and the demo - builds its librdkafka
settings with `client_conf`, and only there is `bootstrap.servers` written, so that one
`[kafka.client]` block (security.protocol, sasl.*, ssl.*, client.id ...) reaches them all::

    [kafka.client]                      # every client: producers, consumers, admin
    "security.protocol" = "SASL_SSL"
    "sasl.mechanism" = "SCRAM-SHA-512"
    "sasl.username" = "cdc-relay"
    "sasl.password_env" = "KAFKA_PASSWORD"      # or "sasl.password_file" = "/run/secrets/kafka"
    "ssl.ca.location" = "/etc/kafka/ca.pem"
    [kafka.producer]                    # producers only, on top of [kafka.client]
    "linger.ms" = 5
    [kafka.consumer]                    # readers only (recovery, checkpoint, verify, repair, locate)
    "fetch.max.bytes" = 1048576

Layers, later wins: a client's own defaults < `[kafka.client]` < `[kafka.producer]` or
`[kafka.consumer]` < what the client enforces (the relay's delivery guarantees).
Connection and security settings (`security.protocol`, `sasl.*`, `ssl.*`) belong to
`[kafka.client]` only: in a role block they would reach some clients and not others,
which is the failure this module exists to prevent (`role_block_problem`).

Secrets (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
`sasl.oauthbearer.client.secret`, `ssl.key.pem`, any key naming a password or secret)
are never written in the config file: `<key>_env` names an environment variable and
`<key>_file` a file (cdc/config.py). They are held as `cdc.config.Secret` and revealed
only in the dict handed to librdkafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("producer", "consumer", "admin")

# Settings that say how to reach and authenticate to the brokers: [kafka.client] only.
SECURITY_PREFIXES = ("security.protocol", "sasl.", "ssl.", "ssl_", "enable.ssl.", "enable.sasl.")


def is_secret_key(key: str) -> bool:
    """A librdkafka setting whose value is a secret (never in the file, never printed)."""
    k = key.lower()
    return "password" in k or "secret" in k or k in ("ssl.key.pem", "ssl_key", "sasl.oauthbearer.config")


def reveal(value: Any) -> Any:
    """A setting's value as librdkafka takes it (`Secret` revealed)."""
    return value.reveal() if hasattr(value, "reveal") else value


def role_block_problem(block: str, key: str) -> str | None:
    """Why `key` may not stand in `[kafka.<block>]` (producer / consumer), or None."""
    if key.startswith(SECURITY_PREFIXES):
        return (
            f"kafka.{block}.{key} is a connection or security setting: move it to [kafka.client], which every "
            "Kafka client of the relay uses (producers, recovery, checkpoint, check, verify, repair, locate)"
        )
    if key == "bootstrap.servers":
        return f"kafka.{block}.bootstrap.servers must not be set: use kafka.bootstrap"
    return None


@dataclass(frozen=True)
class KafkaClientConfig:
    """The brokers and the settings blocks every Kafka client is built from. Values may be
    `Secret`s; `repr` never shows a secret."""

    bootstrap: str
    client: Mapping[str, Any] = field(default_factory=dict)  # [kafka.client]: every client
    producer: Mapping[str, Any] = field(default_factory=dict)  # [kafka.producer]
    consumer: Mapping[str, Any] = field(default_factory=dict)  # [kafka.consumer]

    @classmethod
    def of(cls, target: KafkaClientConfig | str) -> KafkaClientConfig:
        """A plain bootstrap address list is a config without settings (tests, tools)."""
        return target if isinstance(target, KafkaClientConfig) else cls(str(target))

    def __repr__(self) -> str:
        def shown(block: Mapping[str, Any]) -> dict[str, Any]:
            return {k: ("***" if is_secret_key(k) else v) for k, v in block.items()}

        return (
            f"KafkaClientConfig(bootstrap={self.bootstrap!r}, client={shown(self.client)!r}, "
            f"producer={shown(self.producer)!r}, consumer={shown(self.consumer)!r})"
        )

    __str__ = __repr__

    def settings(self, role: str) -> dict[str, Any]:
        """`[kafka.client]` then the role's block, secrets revealed, without
        `bootstrap.servers`: what travels to a Spark executor (as a data source option)."""
        if role not in ROLES:
            raise ValueError(f"unknown Kafka client role {role!r}; one of {ROLES}")
        out = {k: reveal(v) for k, v in self.client.items()}
        block = self.producer if role == "producer" else self.consumer if role == "consumer" else {}
        out.update((k, reveal(v)) for k, v in block.items())
        return out

    def conf(
        self, role: str, defaults: Mapping[str, Any] | None = None, enforced: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return client_conf(self.bootstrap, self.settings(role), defaults, enforced)

    def secrets(self) -> list[str]:
        """The secret values of every block (to scrub from text that may quote them)."""
        out = []
        for block in (self.client, self.producer, self.consumer):
            for k, v in block.items():
                text = str(reveal(v))
                if is_secret_key(k) and text:
                    out.append(text)
        return out


def client_conf(
    bootstrap: str,
    settings: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    enforced: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The librdkafka configuration of one client: `defaults` < `settings` (the shared
    and role blocks, `KafkaClientConfig.settings`) < `enforced`, and `bootstrap.servers`.
    The one function every Kafka client of the project is configured with."""
    conf: dict[str, Any] = dict(defaults or {})
    conf.update((k, reveal(v)) for k, v in (settings or {}).items())
    conf.update(enforced or {})
    conf["bootstrap.servers"] = bootstrap
    return conf


def redact(text: str, conf: Mapping[str, Any] | KafkaClientConfig) -> str:
    """`text` (a librdkafka error may quote a refused value) with every secret of `conf`
    replaced by `***`."""
    values = (
        conf.secrets()
        if isinstance(conf, KafkaClientConfig)
        else [str(reveal(v)) for k, v in conf.items() if is_secret_key(k) and str(reveal(v))]
    )
    for value in values:
        text = text.replace(value, "***")
    return text
