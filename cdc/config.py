"""Relay configuration: one frozen dataclass per concern, built once at start from a
TOML document (a dict here) plus environment overrides, and validated then.

Example `relay.toml`::

    [source]
    name = "shop"                       # stable: part of every event's identity
    host = "127.0.0.1"
    port = 3306
    user = "cdc"
    password_env = "CDC_MYSQL_PASSWORD" # or password_file = "/run/secrets/mysql"
    replica_server_id = 4242            # unique among the server's replicas
    start = "latest"                    # without a checkpoint: latest | earliest | file:pos | GTID set
    heartbeat_s = 1.0                   # the server sends a heartbeat after this many idle seconds
    decoder = "fast"                    # fast: the relay's own binlog decoder | library: python-mysql-replication
    reader = "process"                  # process: read, decode, map, encode in a second process | thread

    [source.tls]                        # TLS to MySQL, for every connection the project makes
    mode = "verify-identity"            # disabled | preferred (default) | required | verify-ca | verify-identity
    ca_file = "/etc/cdc/mysql-ca.pem"   # the CA that signed the server's certificate ("": the system's)
    cert_file = "/etc/cdc/client.pem"   # a client certificate, when the server asks for one (REQUIRE X509)
    key_file = "/etc/cdc/client.key"    # its key
    key_password_env = "CDC_MYSQL_KEY_PASSWORD"  # if the key is encrypted (or key_password_file)

    [outbox]
    on_change = "ignore"                # UPDATE/DELETE on an outbox table: ignore | warn | stop (below)
    on_statement = "stop"               # an outbox INSERT logged as a statement: stop | dead_letter (below)

    [[outbox.tables]]                   # one per outbox table
    schema = "shop"
    table = "outbox"
    topic = "outbox.event.{aggregate_type}"  # {aggregate_type} is the row's aggregate type
    id_column = "id"                    # the event id (header `id`)
    aggregate_type_column = "aggregatetype"  # routes: the topic template's {aggregate_type}
    aggregate_id_column = "aggregateid" # the message key
    type_column = "type"                # the event type
    payload_column = "payload"          # the event body
    timestamp_column = "created_at"     # optional: the envelope's `timestamp` (unset by default: null)
    format = "envelope"                 # or string | json | bytes | avro: the payload as the value,
                                        # as Debezium's EventRouter writes it (cdc/events/formats.py)
    additional_placement = "type:header:eventType"  # Debezium's table.fields.additional.placement
    tombstone_on_empty_payload = false  # a NULL/blank payload as a tombstone (payload formats)
    payload_nullable = true             # format = "avro": the payload schema is ["null","string"]
    traceparent_column = "traceparent"  # W3C trace context copied to the headers (and tracestate_column)
    tracestate_column = "tracestate"

    [kafka]
    bootstrap = "127.0.0.1:9092"
    dead_letter_topic = "outbox.dlq"
    topic_allowlist = []                # fnmatch patterns a topic must match (empty: any legal topic)
    delivery = "idempotent"             # idempotent | transactional (see below)
    transaction_max_ms = 100            # transactional: commit a Kafka transaction this old ...
    transaction_max_messages = 20000    # ... or this large (whole database transactions only)
    [kafka.client]                      # every Kafka client (cdc/kafka_client.py): security, client.id
    "security.protocol" = "SASL_SSL"
    "sasl.mechanism" = "SCRAM-SHA-512"
    "sasl.username" = "cdc-relay"
    "sasl.password_env" = "KAFKA_PASSWORD"  # secrets: "<key>_env" or "<key>_file", never the value
    [kafka.producer]                    # producers only, passed to librdkafka untouched
    "linger.ms" = 5
    [kafka.consumer]                    # readers only (recovery, checkpoint, verify, repair, locate)

    [topics]                            # an event for a topic that does not exist
    missing = "dead_letter"             # dead_letter | create | auto (see below)
    partitions = -1                     # create: -1 is the brokers' num.partitions
    replication_factor = -1             # create: -1 is the brokers' default.replication.factor
    [topics.configs]                    # create: topic configs, e.g. "min.insync.replicas" = "2"

    [schema_registry]
    url = "https://registry.example:8081"
    basic_auth_env = "REGISTRY_USER_INFO" # "user:password"; or a bearer token:
    bearer_token_env = "REGISTRY_TOKEN" # (or bearer_token_file) sent as Authorization: Bearer
    bearer_logical_cluster = "lsrc-abc" # Confluent Cloud: sent as target-sr-cluster
    bearer_identity_pool = "pool-1"     # Confluent Cloud: the identity pool
    ca_file = "/etc/registry/ca.pem"    # TLS: the CA that signed the registry's certificate
    cert_file = "/etc/registry/client.pem"  # TLS client certificate
    key_file = "/etc/registry/client.key"   # its key
    key_password_env = "REGISTRY_KEY_PASSWORD"  # if the key is encrypted (or key_password_file)

    [checkpoint]
    store = "kafka"                     # kafka | file
    topic = "cdc.checkpoints"           # with store = "kafka"
    path = "var/checkpoint.json"        # with store = "file"
    interval_s = 1.0                    # how often a moved checkpoint is written

    [http]                              # /metrics, /healthz, /readyz (docs/operating.md)
    host = "127.0.0.1"
    port = 0                            # 0: no HTTP endpoint

    [log]
    format = "text"                     # text | json
    level = "INFO"
    kafka_level = "WARNING"             # librdkafka's own lines (each at most once per 30 s)

    [relay]
    spill_rows = 10000                  # rows of one transaction held in memory before spilling to disk
    spill_dir = "/var/tmp"              # where (default: the system's temporary directory)
    max_message_bytes = 1000000         # an encoded event larger than this is dead-lettered (too_large)
    max_in_flight = 5000                # messages handed to Kafka and not acknowledged: publishing waits above
    reconnect_timeout_s = 300           # exit 1 after this long without a binlog connection
    drain_timeout_s = 30                # on stop: how long to wait for outstanding acknowledgements
    max_unacknowledged_age_s = 30       # /readyz says not ready while a message waited longer for Kafka

    [lease]                             # one active relay per source (cdc/lease.py)
    enabled = true                      # others with this source.name wait as standbys
    ttl_s = 10                          # a holder silent this long loses the lease
    renew_s = 1                         # the holder confirms, a standby polls, this often
    margin_s = 0.5                      # the holder stops this long before the server could release it

    [xa]                                # check-back of prepared, undecided XA transactions
    check_after_s = 60                  # immunity: not checked while younger than this
    check_interval_s = 30               # then checked with XA RECOVER this often
    max_checks = 15                     # after this many checks: an operator problem

    [sink]                              # the broker the relay publishes to (docs/sinks.md)
    kind = "kafka"                      # kafka (configured in [kafka]) | rabbitmq_stream | rabbitmq_exchange | nats_jetstream
    [sink.rabbitmq_stream]              # RabbitMQ's stream protocol (docs/sinks.md)
    host = "127.0.0.1"                  # a node of the cluster: the first asked where each stream's leader is
    port = 5552                         # the stream plugin's port (5551 with TLS)
    hosts = []                          # the cluster's other nodes, "host:port": asked when host is down
    vhost = "/"
    user = "cdc"
    password_env = "RABBITMQ_PASSWORD"  # or password_file
    tls = false                         # TLS to the stream port (a CA file or cert_file turns it on too)
    ca_file = ""                        # PEM CA bundle to check the node's certificate (empty: the system's)
    cert_file = ""                      # client certificate (PEM), with key_file
    key_file = ""
    key_password_env = "RABBITMQ_KEY_PASSWORD"  # if key_file is encrypted (or key_password_file)
    producer_name = ""                  # the publishing ids' producer name (empty: cdc-relay.<source.name>)
    publish_timeout_s = 60              # a message not confirmed this long stops the relay (exit 1)
    max_in_flight = 20000               # messages handed over and not confirmed; publish waits above it
    empty_wait_s = 2                    # the longest wait for a chunk a stream was seen to hold
    [sink.rabbitmq_exchange]            # an AMQP 0-9-1 topic exchange, proven by an audit stream (docs/sinks.md)
    host = "127.0.0.1"
    port = 5672                         # AMQP 0-9-1 (5671 with TLS)
    hosts = []                          # the cluster's other nodes, "host:port" (AMQP): asked when host is down
    stream_port = 5552                  # the stream plugin's port: the audit stream is read through it
    stream_hosts = []                   # the other nodes' stream ports, "host:port" (empty: hosts' at stream_port)
    management_port = 15672             # cdc check reads the audit stream's bindings here (0: not checked)
    vhost = "/"
    user = "cdc"
    password_env = "RABBITMQ_PASSWORD"  # or password_file
    tls = false                         # TLS to both ports (a CA file or cert_file turns it on too)
    ca_file = ""
    cert_file = ""
    key_file = ""
    key_password_env = "RABBITMQ_KEY_PASSWORD"  # if key_file is encrypted (or key_password_file)
    exchange = "cdc.outbox"             # the topic exchange; routing key = the event's topic
    audit_stream = "cdc.outbox.audit"   # a stream bound to the exchange for every routing key the relay uses
    publish_timeout_s = 60              # a message not confirmed this long stops the relay (exit 1)
    max_in_flight = 5000                # messages handed over and not confirmed; publish waits above it
    empty_wait_s = 2                    # an audit stream that delivers no chunk this long is taken as empty
    [sink.nats_jetstream]               # NATS JetStream
    servers = ["nats://127.0.0.1:4222"]
    user = "cdc"
    password_env = "NATS_PASSWORD"      # or password_file
    token_env = "NATS_TOKEN"            # or token_file (instead of user and password)
    creds_file = ""                     # a .creds file (JWT + NKey seed), instead of the above
    ca_file = ""                        # TLS: the CA that signed the servers' certificates
    cert_file = ""                      # TLS: a client certificate (with key_file)
    key_file = ""
    key_password_env = "NATS_KEY_PASSWORD"  # if key_file is encrypted (or key_password_file)
    ack_timeout_s = 5                   # no acknowledgement this long: send the unacknowledged again
    delivery_timeout_s = 60             # then fail (exit 1); keep it under every stream's duplicate_window
    max_in_flight = 8192                # messages sent and not yet acknowledged (below the server's max_buffered_msgs)
    duplicate_window_s = 120            # the duplicate_window of a stream topics.missing = "create" makes

`[outbox]` also takes `on_change` (UPDATE/DELETE on an outbox table: "ignore" (default),
"warn", "stop") and `on_statement` (an INSERT into an outbox table logged as a statement,
which has no row image: "stop" (default: exit 2 naming the position and the fix) or
"dead_letter" (cause `statement_format`, the SQL text in the dead letter; the relay goes
on)). An XA transaction prepared and undecided is never published while undecided: the
checkpoint holds at its prepare, and past `max_checks` the relay reports it (log line,
`cdc_xa_undecided_problems`, `/readyz`) until someone runs XA COMMIT or XA ROLLBACK.

`kafka.delivery`: "idempotent" (the default: an idempotent producer, acks=all; a restart
scans the topics' tails after the checkpoint; consumers may see a database transaction's
events one by one) or "transactional" (each Kafka transaction holds whole database
transactions, their dead letters and the checkpoint after them; `transactional.id` is
`cdc-relay.<source.name>` and fences older instances; consumers must read with
`isolation.level=read_committed`). Transactional delivery needs `checkpoint.store =
"kafka"`: the checkpoint is written inside the same Kafka transaction.

`[source.tls]` follows MySQL's `--ssl-mode`: "disabled" (never TLS; a server with
require_secure_transport refuses), "preferred" (TLS when the server offers it, the
certificate not checked: MySQL's default), "required" (TLS or no connection, the
certificate not checked), "verify-ca" (TLS, the certificate signed by `ca_file`),
"verify-identity" (also its name matches `source.host`: the production setting). The
same settings reach the relay's binlog connection, its control, lease and XA check-back
connections, `cdc check`, `cdc repair` and the verifier's connections (cdc/tls.py).

`topics.missing` (with `auto.create.topics.enable=false` on the brokers, the production
norm, a new aggregate type's topic does not exist): "dead_letter" (the default: the
first event for a topic is preceded by a metadata check; when the topic is missing the
event is dead-lettered with cause `topic_missing` and one log line names the topic to
create; the relay keeps publishing the other topics and checks again every 10 s),
"create" (AdminClient creates it with `partitions`, `replication_factor` and
`[topics.configs]`; a refused creation dead-letters as above, naming why) or "auto"
(no check: the brokers create topics on first use). In every mode a message Kafka
refuses because its topic does not exist is dead-lettered (`topic_missing`), never lost
and never a stop.

Environment overrides: `CDC_<SECTION>_<KEY>` for scalar keys, e.g. `CDC_SOURCE_HOST`,
`CDC_KAFKA_BOOTSTRAP`, `CDC_CHECKPOINT_PATH`, `CDC_SOURCE_TLS_MODE`. Secrets (`password`,
`basic_auth`, `source.tls.key_password`) come
from `*_env` (an environment variable's name) or `*_file` (a file's path), never from
the TOML itself, and are held in `Secret`, which never prints its value. The same rule
holds inside `[kafka.client]` (`"sasl.password_env" = ...`); `schema_registry` takes
`basic_auth`, `bearer_token` and `key_password` so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.assembly.transaction import ON_CHANGE_POLICIES, ON_STATEMENT_POLICIES
from cdc.errors import ConfigError
from cdc.events.outbox import OutboxTable
from cdc.events.topics import topic_problem
from cdc.kafka_client import KafkaClientConfig, is_secret_key, role_block_problem
from cdc.lease import LeaseSettings
from cdc.relay_settings import RelaySettings, RelayTuning, tuning_of
from cdc.secret import Secret
from cdc.tls import TlsConfig


@dataclass(frozen=True)
class SourceConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "cdc"
    password: Secret = field(default_factory=lambda: Secret(""))
    replica_server_id: int = 4242  # the id this relay registers with as a replica
    heartbeat_s: float = 1.0  # the server sends a heartbeat when idle this long
    start: str = "latest"
    decoder: str = "fast"  # fast: the relay's own binlog decoder; library: python-mysql-replication
    # process: read, decode, map and encode in a second process (uses a second core);
    # thread: all in the relay's process (a reader thread shares its interpreter lock)
    reader: str = "process"
    tls: TlsConfig = field(default_factory=TlsConfig)  # [source.tls]

    def connection(self) -> dict[str, Any]:
        """Host, port, user, password and the TLS settings (`tls_*` keys, plain strings so
        that the dict pickles and travels as Spark options); connectors/mysql/client.py
        turns it into a connection."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password.reveal(),
            **self.tls.settings(),
        }


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    dead_letter_topic: str = "outbox.dlq"
    topic_allowlist: tuple[str, ...] = ()
    producer: dict[str, Any] = field(default_factory=dict)  # librdkafka settings, producers only
    client: dict[str, Any] = field(default_factory=dict)  # librdkafka settings of every client (security)
    consumer: dict[str, Any] = field(default_factory=dict)  # librdkafka settings, readers only
    delivery: str = "idempotent"  # idempotent | transactional
    transaction_max_ms: float = 100.0  # transactional: commit once the open Kafka transaction is this old
    transaction_max_messages: int = 20_000  # ... or holds this many messages

    def clients(self) -> KafkaClientConfig:
        """What every Kafka client is built from (cdc/kafka_client.py)."""
        return KafkaClientConfig(self.bootstrap, self.client, self.producer, self.consumer)


TOPIC_MISSING_POLICIES = ("dead_letter", "create", "auto")


@dataclass(frozen=True)
class TopicsConfig:
    missing: str = "dead_letter"  # an event for a topic that does not exist: dead_letter | create | auto
    partitions: int = -1  # create: -1 = the brokers' num.partitions
    replication_factor: int = -1  # create: -1 = the brokers' default.replication.factor
    configs: dict[str, Any] = field(default_factory=dict)  # create: topic configs


@dataclass(frozen=True)
class RegistryConfig:
    url: str = "mock://cdc-relay"
    basic_auth: Secret = field(default_factory=lambda: Secret(""))  # "user:password"
    bearer_token: Secret = field(default_factory=lambda: Secret(""))  # Authorization: Bearer <token>
    bearer_logical_cluster: str = ""  # Confluent Cloud: the registry's logical cluster id (header target-sr-cluster)
    bearer_identity_pool: str = ""  # Confluent Cloud: identity pool id, when the token needs one
    ca_file: str = ""  # TLS: CA bundle that signed the registry's certificate (default: the system's)
    cert_file: str = ""  # TLS client certificate (PEM); may hold the key too
    key_file: str = ""  # TLS client key (PEM)
    key_password: Secret = field(default_factory=lambda: Secret(""))  # the client key's password


@dataclass(frozen=True)
class CheckpointConfig:
    store: str = "kafka"  # kafka | file
    topic: str = "cdc.checkpoints"
    path: str = "var/checkpoint.json"
    interval_s: float = 1.0


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: no HTTP endpoint


@dataclass(frozen=True)
class LogConfig:
    format: str = "text"  # text | json
    level: str = "INFO"
    kafka_level: str = "WARNING"  # librdkafka's own lines (rate-limited: each at most once per 30 s)


@dataclass(frozen=True)
class XaConfig:
    check_after_s: float = 60.0  # a prepared XA transaction younger than this is not checked
    check_interval_s: float = 30.0  # then XA RECOVER checks it this often
    max_checks: int = 15  # after the last check it is an operator problem (still held, never published)


@dataclass(frozen=True)
class RabbitStreamConfig:
    """`[sink.rabbitmq_stream]`: RabbitMQ's stream protocol (connectors/rabbitmq/stream_sink.py)."""

    host: str = "127.0.0.1"
    port: int = 5552  # the stream plugin's port (5551 with TLS)
    hosts: tuple[str, ...] = ()  # the cluster's other nodes, "host:port" (docs/sinks.md)
    vhost: str = "/"
    user: str = "guest"
    password: Secret = field(default_factory=lambda: Secret(""))
    tls: bool = False  # TLS to the stream port (also on when ca_file or cert_file is set)
    ca_file: str = ""  # PEM CA bundle for the node's certificate ("": the system's)
    cert_file: str = ""  # client certificate (PEM), with key_file
    key_file: str = ""
    key_password: Secret = field(default_factory=lambda: Secret(""))  # the client key's, if it is encrypted
    producer_name: str = ""  # "": cdc-relay.<source.name> (the broker de-duplicates by it)
    publish_timeout_s: float = 60.0  # unconfirmed this long: the relay stops (exit 1)
    max_in_flight: int = 20_000  # handed over, not confirmed: publish waits above it
    empty_wait_s: float = 2.0  # the longest wait for a chunk a stream was seen to hold (an empty one costs none)


@dataclass(frozen=True)
class RabbitExchangeConfig:
    """`[sink.rabbitmq_exchange]`: an AMQP 0-9-1 topic exchange and the audit stream bound to
    it (connectors/rabbitmq/exchange_sink.py)."""

    host: str = "127.0.0.1"
    port: int = 5672  # AMQP 0-9-1 (5671 with TLS)
    hosts: tuple[str, ...] = ()  # the cluster's other nodes, "host:port" of AMQP 0-9-1 (docs/sinks.md)
    stream_port: int = 5552  # the stream protocol: the audit stream is read through it
    stream_hosts: tuple[str, ...] = ()  # their stream ports, "host:port" (): each of `hosts` at stream_port
    management_port: int = 15672  # `cdc check` reads the bindings here (0: not checked)
    vhost: str = "/"
    user: str = "guest"
    password: Secret = field(default_factory=lambda: Secret(""))
    tls: bool = False  # TLS to both ports (also on when ca_file or cert_file is set)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    key_password: Secret = field(default_factory=lambda: Secret(""))  # the client key's, if it is encrypted
    exchange: str = "cdc.outbox"  # a topic exchange; the routing key is the event's topic
    audit_stream: str = "cdc.outbox.audit"  # a stream bound to `exchange` for every routing key used
    publish_timeout_s: float = 60.0  # unconfirmed this long: the relay stops (exit 1)
    max_in_flight: int = 5_000  # handed over, not confirmed: publish waits above it
    empty_wait_s: float = 2.0  # the audit stream delivers nothing this long: it is empty

    def stream_addresses(self) -> tuple[str, ...]:
        """The other nodes' stream ports ("host:port"), where the audit stream is asked for
        when `host` is down: `stream_hosts`, else each of `hosts` at `stream_port` (a
        cluster's nodes usually listen on the same ports)."""
        if self.stream_hosts:
            return tuple(self.stream_hosts)
        return tuple(f"{str(e).rpartition(':')[0]}:{self.stream_port}" for e in self.hosts)


@dataclass(frozen=True)
class NatsJetStreamConfig:
    """`[sink.nats_jetstream]`: NATS JetStream (connectors/nats/sink.py)."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    user: str = ""
    password: Secret = field(default_factory=lambda: Secret(""))
    token: Secret = field(default_factory=lambda: Secret(""))
    creds_file: str = ""  # a NATS credentials file (JWT and NKey seed): the user's identity
    ca_file: str = ""  # TLS: the CA of the servers' certificates ("": the system's)
    cert_file: str = ""  # TLS: a client certificate, with key_file
    key_file: str = ""
    key_password: Secret = field(default_factory=lambda: Secret(""))  # the client key's, if it is encrypted
    ack_timeout_s: float = 5.0  # unacknowledged this long: sent again, in order, under the same Nats-Msg-Id
    delivery_timeout_s: float = 60.0  # unacknowledged this long: the message fails (the relay exits 1)
    # A server short of CPU answers late: a window of 4,096 left the publisher waiting (docs/sinks.md).
    # Above the stream's buffer (nats-server 2.11+ `jetstream.max_buffered_msgs`, 10,000 by
    # default) a catch-up can have messages dropped (429): one stops the relay.
    max_in_flight: int = 8192  # messages sent and not yet acknowledged
    duplicate_window_s: float = 120.0  # for the streams the relay creates (topics.missing = "create")


SINK_KINDS = ("kafka", "rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream")


@dataclass(frozen=True)
class SinkConfig:
    """`[sink]`: which kind of broker the relay publishes to. `kafka` (the default) is
    configured in `[kafka]`; the others in `[sink.<kind>]`."""

    kind: str = "kafka"  # kafka | rabbitmq_stream | rabbitmq_exchange | nats_jetstream
    rabbitmq_stream: RabbitStreamConfig = field(default_factory=RabbitStreamConfig)  # [sink.rabbitmq_stream]
    rabbitmq_exchange: RabbitExchangeConfig = field(default_factory=RabbitExchangeConfig)  # [sink.rabbitmq_exchange]
    nats_jetstream: NatsJetStreamConfig = field(default_factory=NatsJetStreamConfig)  # [sink.nats_jetstream]


@dataclass(frozen=True)
class Config:
    source: SourceConfig
    tables: tuple[OutboxTable, ...]
    kafka: KafkaConfig = KafkaConfig()
    schema_registry: RegistryConfig = RegistryConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    http: HttpConfig = HttpConfig()
    log: LogConfig = LogConfig()
    relay: RelayTuning = RelayTuning()
    xa: XaConfig = XaConfig()
    lease: LeaseSettings = LeaseSettings()
    topics: TopicsConfig = TopicsConfig()
    sink: SinkConfig = SinkConfig()

    def relay_settings(self) -> RelaySettings:
        return RelaySettings(
            source_name=self.source.name,
            tables=self.tables,
            dead_letter_topic=self.kafka.dead_letter_topic,
            topic_allowlist=self.kafka.topic_allowlist,
            xa_check_after_s=self.xa.check_after_s,
            xa_check_interval_s=self.xa.check_interval_s,
            xa_max_checks=self.xa.max_checks,
            start=self.source.start,
            checkpoint_interval_s=self.checkpoint.interval_s,
            **tuning_of(self.relay),
            delivery=self.kafka.delivery,
            transaction_max_s=self.kafka.transaction_max_ms / 1000.0,
            transaction_max_messages=self.kafka.transaction_max_messages,
            topic_missing=self.topics.missing,
        )


_SECTIONS: dict[str, type] = {
    "source": SourceConfig,
    "kafka": KafkaConfig,
    "schema_registry": RegistryConfig,
    "checkpoint": CheckpointConfig,
    "http": HttpConfig,
    "log": LogConfig,
    "relay": RelayTuning,
    "xa": XaConfig,
    "lease": LeaseSettings,
    "source.tls": TlsConfig,
    "topics": TopicsConfig,
    "sink": SinkConfig,
    "sink.rabbitmq_stream": RabbitStreamConfig,
    "sink.rabbitmq_exchange": RabbitExchangeConfig,
    "sink.nats_jetstream": NatsJetStreamConfig,
}
# [source.tls], [sink.rabbitmq_stream] ... are read apart from the section that holds them
_SUBSECTIONS = {"source": ("tls",), "sink": ("rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream")}
_SECRETS = {
    ("source", "password"),
    ("schema_registry", "basic_auth"),
    ("schema_registry", "bearer_token"),
    ("schema_registry", "key_password"),
    ("source.tls", "key_password"),
    ("sink.rabbitmq_stream", "password"),
    ("sink.rabbitmq_stream", "key_password"),
    ("sink.rabbitmq_exchange", "password"),
    ("sink.rabbitmq_exchange", "key_password"),
    ("sink.nats_jetstream", "password"),
    ("sink.nats_jetstream", "key_password"),
    ("sink.nats_jetstream", "token"),
}
_KAFKA_BLOCKS = ("client", "producer", "consumer")


def _coerce(section: str, name: str, value: Any, target: Any) -> Any:
    where = f"{section}.{name}"
    text = str(target)
    if "tuple" in text:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(value)
    if "dict" in text:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table of settings")
        return dict(value)
    if text in ("bool",):
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if text in ("int",):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be an integer, got {value!r}") from None
    if text in ("float",):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


def _section(
    name: str,
    raw: Mapping[str, Any],
    env: Mapping[str, str],
    read_file: Callable[[str], str],
) -> dict[str, Any]:
    cls = _SECTIONS[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    allowed = (
        set(fields)
        | {f"{s}_env" for (sec, s) in _SECRETS if sec == name}
        | {f"{s}_file" for (sec, s) in _SECRETS if sec == name}
    )
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"unknown setting {name}.{key}; known: {', '.join(sorted(allowed))}")
        if (name, key) in _SECRETS:
            raise ConfigError(
                f"{name}.{key} must not be written in the config file; use {name}.{key}_env "
                f"(an environment variable's name) or {name}.{key}_file (a file's path)"
            )
    merged = dict(raw)
    for key in fields:
        if key in _SUBSECTIONS.get(name, ()):
            continue  # a section of its own
        env_value = env.get(f"CDC_{name.upper().replace('.', '_')}_{key.upper()}")
        if env_value is not None and (name, key) not in _SECRETS:
            merged[key] = env_value
    for key, f in fields.items():
        if key in _SUBSECTIONS.get(name, ()):
            continue
        if (name, key) in _SECRETS:
            values[key] = _secret(name, key, merged, env, read_file)
        elif key in merged:
            values[key] = _coerce(name, key, merged[key], f.type)
    return values


def _secret(
    section: str, key: str, raw: Mapping[str, Any], env: Mapping[str, str], read_file: Callable[[str], str]
) -> Secret:
    env_name = raw.get(f"{key}_env")
    path = raw.get(f"{key}_file")
    if env_name and path:
        raise ConfigError(f"set only one of {section}.{key}_env and {section}.{key}_file")
    if env_name:
        if env_name not in env:
            raise ConfigError(f"{section}.{key}_env names the environment variable {env_name}, which is not set")
        return Secret(env[env_name])
    if path:
        try:
            return Secret(read_file(path).rstrip("\n"))
        except OSError as exc:
            raise ConfigError(f"cannot read {section}.{key}_file {path}: {exc.strerror}") from exc
    return Secret("")


def _kafka_block(
    block: str, raw: Mapping[str, Any], env: Mapping[str, str], read_file: Callable[[str], str]
) -> dict[str, Any]:
    """`[kafka.<block>]` with its secrets read: `"<key>_env"` / `"<key>_file"` become
    `<key>` = Secret; a secret written as a value, or a connection setting outside
    `[kafka.client]`, is refused naming the fix."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        base, _, how = key.rpartition("_")
        if how in ("env", "file") and is_secret_key(base):
            out[base] = _secret(f"kafka.{block}", base, raw, env, read_file)
            continue
        if is_secret_key(key):
            raise ConfigError(
                f'kafka.{block}.{key} must not be written in the config file; use "{key}_env" '
                f"(an environment variable's name) or \"{key}_file\" (a file's path)"
            )
        if block != "client":
            problem = role_block_problem(block, key)
            if problem:
                raise ConfigError(problem)
        elif key == "bootstrap.servers":
            raise ConfigError("kafka.client.bootstrap.servers must not be set: use kafka.bootstrap")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"kafka.{block}.{key} must be a string, number or boolean")
        out[key] = value
    return out


def _table(raw: Mapping[str, Any], index: int) -> OutboxTable:
    fields = {f.name for f in dataclasses.fields(OutboxTable)}
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"unknown setting(s) {sorted(unknown)} in outbox.tables[{index}]; known: {sorted(fields)}")
    for required in ("schema", "table"):
        if not raw.get(required):
            raise ConfigError(f"outbox.tables[{index}].{required} is required")
    try:
        return OutboxTable(**{k: v for k, v in raw.items()})
    except ConfigError as exc:  # the topic template (cdc.events.topics.check_template) and the output format
        where = "topic: " if str(exc).startswith("topic template") else ""
        raise ConfigError(f"outbox.tables[{index}].{where}{exc}") from None


def load_config(
    raw: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str] | None = None,
) -> Config:
    env = env or {}
    read_file = read_file or (lambda p: Path(p).read_text())
    tops = {name for name in _SECTIONS if "." not in name}
    unknown = set(raw) - tops - {"outbox"}
    if unknown:
        raise ConfigError(f"unknown section(s) {sorted(unknown)}; known: {sorted(tops | {'outbox'})}")

    def raw_section(name: str) -> Mapping[str, Any]:
        top, _, sub = name.partition(".")
        data = raw.get(top, {}) or {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"[{top}] must be a table of settings")
        if sub:
            data = data.get(sub, {}) or {}
            if not isinstance(data, Mapping):
                raise ConfigError(f"[{name}] must be a table of settings")
        elif top in _SUBSECTIONS:
            data = {k: v for k, v in data.items() if k not in _SUBSECTIONS[top]}
        return data

    sections = {name: _section(name, raw_section(name), env, read_file) for name in _SECTIONS}
    try:
        sections["source"]["tls"] = TlsConfig(**sections.pop("source.tls"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sections["sink"]["rabbitmq_stream"] = RabbitStreamConfig(**sections.pop("sink.rabbitmq_stream"))
    sections["sink"]["rabbitmq_exchange"] = RabbitExchangeConfig(**sections.pop("sink.rabbitmq_exchange"))
    sections["sink"]["nats_jetstream"] = NatsJetStreamConfig(**sections.pop("sink.nats_jetstream"))
    for block in _KAFKA_BLOCKS:
        if block in sections["kafka"]:
            sections["kafka"][block] = _kafka_block(block, sections["kafka"][block], env, read_file)
    if not sections["source"].get("name"):
        raise ConfigError("source.name is required: a stable name for this database, part of every event's identity")
    outbox = dict(raw.get("outbox", {}) or {})
    tables_raw = outbox.pop("tables", [])
    for key in ("on_change", "on_statement"):
        if key in outbox:
            sections["relay"][key] = outbox.pop(key)
    if outbox:
        raise ConfigError(f"unknown setting(s) {sorted(outbox)} in [outbox]; known: tables, on_change, on_statement")
    if not tables_raw:
        raise ConfigError("no outbox table configured: add an [[outbox.tables]] entry with schema and table")
    tables = tuple(_table(t, i) for i, t in enumerate(tables_raw))
    cfg = Config(
        source=SourceConfig(**sections["source"]),
        tables=tables,
        kafka=KafkaConfig(**sections["kafka"]),
        schema_registry=RegistryConfig(**sections["schema_registry"]),
        checkpoint=CheckpointConfig(**sections["checkpoint"]),
        http=HttpConfig(**sections["http"]),
        log=LogConfig(**sections["log"]),
        relay=RelayTuning(**sections["relay"]),
        xa=XaConfig(**sections["xa"]),
        lease=LeaseSettings(**sections["lease"]),
        topics=TopicsConfig(**sections["topics"]),
        sink=SinkConfig(**sections["sink"]),
    )
    _validate(cfg)
    return cfg


def _validate_nats(cfg: Config) -> None:
    nats = cfg.sink.nats_jetstream
    if cfg.checkpoint.store != "file":
        raise ConfigError(
            'sink.kind = "nats_jetstream" keeps its checkpoint in a file: set checkpoint.store = "file" '
            f"(and checkpoint.path), got checkpoint.store = {cfg.checkpoint.store!r}"
        )
    if cfg.kafka.delivery != "idempotent":
        raise ConfigError(
            'kafka.delivery = "transactional" needs Kafka; sink.kind = "nats_jetstream" delivers with '
            "Nats-Msg-Id and the recovery scan: remove kafka.delivery"
        )
    if not nats.servers:
        raise ConfigError('sink.nats_jetstream.servers must name at least one server, e.g. ["nats://host:4222"]')
    if bool(nats.cert_file) != bool(nats.key_file):
        raise ConfigError("sink.nats_jetstream.cert_file and key_file go together: set both or neither")
    if nats.key_password and not nats.key_file:
        raise ConfigError("sink.nats_jetstream.key_password is the password of key_file: set cert_file and key_file")
    if not 0 < nats.ack_timeout_s < nats.delivery_timeout_s < nats.duplicate_window_s:
        raise ConfigError(
            "sink.nats_jetstream needs 0 < ack_timeout_s < delivery_timeout_s < duplicate_window_s (a message "
            "sent again must still be recognised by its Nats-Msg-Id), got "
            f"{nats.ack_timeout_s:g} / {nats.delivery_timeout_s:g} / {nats.duplicate_window_s:g}"
        )
    if nats.max_in_flight < 1:
        raise ConfigError(f"sink.nats_jetstream.max_in_flight must be at least 1, got {nats.max_in_flight}")


def _validate(cfg: Config) -> None:
    if cfg.sink.kind not in SINK_KINDS:
        raise ConfigError(f"sink.kind must be one of {SINK_KINDS}, got {cfg.sink.kind!r}")
    if cfg.sink.kind == "rabbitmq_stream":
        _validate_rabbitmq_stream(cfg)
    if cfg.sink.kind == "rabbitmq_exchange":
        _validate_rabbitmq_exchange(cfg)
    if cfg.sink.kind == "nats_jetstream":
        _validate_nats(cfg)
    if cfg.checkpoint.store not in ("kafka", "file"):
        raise ConfigError(f'checkpoint.store must be "kafka" or "file", got {cfg.checkpoint.store!r}')
    if cfg.checkpoint.store == "kafka" and topic_problem(cfg.checkpoint.topic):
        raise ConfigError(f"checkpoint.topic: {topic_problem(cfg.checkpoint.topic)}")
    if cfg.kafka.delivery not in ("idempotent", "transactional"):
        raise ConfigError(f'kafka.delivery must be "idempotent" or "transactional", got {cfg.kafka.delivery!r}')
    if cfg.kafka.delivery == "transactional" and cfg.checkpoint.store != "kafka":
        raise ConfigError(
            'kafka.delivery = "transactional" needs checkpoint.store = "kafka" (the checkpoint is '
            f"written inside each Kafka transaction), got checkpoint.store = {cfg.checkpoint.store!r}: "
            'set checkpoint.store = "kafka" or kafka.delivery = "idempotent"'
        )
    if "transactional.id" in cfg.kafka.producer:
        raise ConfigError(
            "kafka.producer.transactional.id must not be set: transactional delivery derives it from "
            "source.name (cdc-relay.<source.name>); remove the setting"
        )
    if cfg.topics.missing not in TOPIC_MISSING_POLICIES:
        raise ConfigError(f"topics.missing must be one of {TOPIC_MISSING_POLICIES}, got {cfg.topics.missing!r}")
    if cfg.topics.partitions == 0 or cfg.topics.partitions < -1:
        raise ConfigError(
            f"topics.partitions must be -1 (the brokers' default) or at least 1, got {cfg.topics.partitions}"
        )
    if cfg.topics.replication_factor == 0 or cfg.topics.replication_factor < -1:
        raise ConfigError(
            f"topics.replication_factor must be -1 (the brokers' default) or at least 1, got "
            f"{cfg.topics.replication_factor}"
        )
    reg = cfg.schema_registry
    if reg.basic_auth and reg.bearer_token:
        raise ConfigError("schema_registry: set basic_auth or bearer_token, not both")
    if reg.basic_auth and ":" not in reg.basic_auth.reveal():
        raise ConfigError("schema_registry.basic_auth must have the form user:password (the secret's value)")
    if (reg.key_file or reg.key_password) and not reg.cert_file:
        raise ConfigError(
            "schema_registry.key_file / key_password need schema_registry.cert_file (the client certificate)"
        )
    if cfg.relay.on_change not in ON_CHANGE_POLICIES:
        raise ConfigError(f"outbox.on_change must be one of {ON_CHANGE_POLICIES}, got {cfg.relay.on_change!r}")
    if cfg.relay.on_statement not in ON_STATEMENT_POLICIES:
        raise ConfigError(f"outbox.on_statement must be one of {ON_STATEMENT_POLICIES}, got {cfg.relay.on_statement!r}")
    if cfg.xa.check_after_s < 0 or cfg.xa.check_interval_s <= 0 or cfg.xa.max_checks < 1:
        raise ConfigError("xa.check_after_s must be >= 0, xa.check_interval_s > 0 and xa.max_checks >= 1")
    if cfg.source.decoder not in ("fast", "library"):
        raise ConfigError(f'source.decoder must be "fast" or "library", got {cfg.source.decoder!r}')
    if cfg.source.reader not in ("process", "thread"):
        raise ConfigError(f'source.reader must be "process" or "thread", got {cfg.source.reader!r}')
    if cfg.log.format not in ("text", "json"):
        raise ConfigError(f'log.format must be "text" or "json", got {cfg.log.format!r}')
    if not 1 <= cfg.source.replica_server_id < 2**32:
        raise ConfigError("source.replica_server_id must be between 1 and 4294967295")
    if not 0 <= cfg.http.port < 65536:
        raise ConfigError("http.port must be between 0 (off) and 65535")
    if cfg.checkpoint.interval_s <= 0:
        raise ConfigError("checkpoint.interval_s must be positive")
    cfg.relay_settings()  # RelaySettings checks the rest


def _validate_rabbitmq_stream(cfg: Config) -> None:
    rabbit = cfg.sink.rabbitmq_stream
    if cfg.checkpoint.store != "file":
        raise ConfigError(
            'sink.kind = "rabbitmq_stream" keeps its checkpoint in a file: set checkpoint.store = "file" '
            "(and checkpoint.path)"
        )
    if cfg.kafka.delivery != "idempotent":
        raise ConfigError(
            'kafka.delivery = "transactional" is for Kafka; sink.kind = "rabbitmq_stream" has no broker '
            'transactions: remove kafka.delivery (or set it to "idempotent")'
        )
    if rabbit.publish_timeout_s <= 0 or rabbit.max_in_flight < 1 or rabbit.empty_wait_s <= 0:
        raise ConfigError(
            "sink.rabbitmq_stream: publish_timeout_s and empty_wait_s must be positive, max_in_flight at least 1"
        )
    if bool(rabbit.cert_file) != bool(rabbit.key_file):
        raise ConfigError("sink.rabbitmq_stream: cert_file and key_file go together (the client certificate)")
    if rabbit.key_password and not rabbit.key_file:
        raise ConfigError("sink.rabbitmq_stream.key_password is the password of key_file: set cert_file and key_file")
    for entry in rabbit.hosts:
        host, _, port = str(entry).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f'sink.rabbitmq_stream.hosts: {entry!r} is not "host:port" (a node\'s stream port), e.g. "rabbit2:5552"'
            )


def _validate_rabbitmq_exchange(cfg: Config) -> None:
    rabbit = cfg.sink.rabbitmq_exchange
    if cfg.checkpoint.store != "file":
        raise ConfigError(
            'sink.kind = "rabbitmq_exchange" keeps its checkpoint in a file: set checkpoint.store = "file" '
            "(and checkpoint.path)"
        )
    if cfg.kafka.delivery != "idempotent":
        raise ConfigError(
            'kafka.delivery = "transactional" is for Kafka; sink.kind = "rabbitmq_exchange" has no broker '
            'transactions: remove kafka.delivery (or set it to "idempotent")'
        )
    if not rabbit.exchange or not rabbit.audit_stream:
        raise ConfigError(
            "sink.rabbitmq_exchange: exchange and audit_stream must be named (the audit stream is the record "
            "of what the exchange routed: docs/sinks.md)"
        )
    if rabbit.publish_timeout_s <= 0 or rabbit.max_in_flight < 1 or rabbit.empty_wait_s <= 0:
        raise ConfigError(
            "sink.rabbitmq_exchange: publish_timeout_s and empty_wait_s must be positive, max_in_flight at least 1"
        )
    if not 0 <= rabbit.management_port < 65536:
        raise ConfigError("sink.rabbitmq_exchange.management_port must be between 0 (not checked) and 65535")
    if bool(rabbit.cert_file) != bool(rabbit.key_file):
        raise ConfigError("sink.rabbitmq_exchange: cert_file and key_file go together (the client certificate)")
    if rabbit.key_password and not rabbit.key_file:
        raise ConfigError("sink.rabbitmq_exchange.key_password is the password of key_file: set cert_file and key_file")
    for name, example in (("hosts", "rabbit2:5672"), ("stream_hosts", "rabbit2:5552")):
        for entry in getattr(rabbit, name):
            host, _, port = str(entry).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                kind = "AMQP 0-9-1" if name == "hosts" else "stream"
                raise ConfigError(
                    f'sink.rabbitmq_exchange.{name}: {entry!r} is not "host:port" (a node\'s {kind} port), e.g. "{example}"'
                )
