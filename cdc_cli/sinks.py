"""The sink's adapters, by `sink.kind`: what the relay publishes with, reads back with
(recovery, `cdc locate`), creates missing destinations with, stores its checkpoint in,
and the delivery mode that proves a message delivered. Kafka's are the default; each
other kind brings its own module in `connectors/` and, where its guarantees differ, its
own delivery mode in `cdc/delivery/`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.config import Config
from cdc.delivery.kafka import kafka_delivery
from cdc.delivery.kafka_transaction import transactional_id
from cdc.delivery.mode_factory import DeliveryModeFactory
from cdc.kafka_health import KafkaHealth
from cdc.metrics import RelayMetrics
from connectors.checkpoint_stores import FileCheckpointStore, KafkaCheckpointStore, TransactionalCheckpointStore
from connectors.kafka.reader import KafkaTopicReader
from connectors.kafka.sink import KafkaPublisher, TransactionalKafkaPublisher, delivery_timeout_s


@dataclass
class SinkAdapters:
    publisher: Any  # cdc.ports.Publisher, with `max_message_bytes`
    reader: Any  # cdc.ports.DeliveredLog, with `close()`
    store: Any  # cdc.ports.CheckpointStore
    topics: Any  # cdc.ports.TopicAdmin | None (`topics.missing = "create"`)
    delivery_mode: DeliveryModeFactory
    describe: str  # where the relay publishes, for its start line (no secrets)
    queued_for_s: float  # how long a message a previous holder queued may still reach the broker


def checkpoint_store(cfg: Config):
    if cfg.checkpoint.store == "file":
        return FileCheckpointStore(cfg.checkpoint.path)
    return KafkaCheckpointStore(cfg.kafka.clients(), cfg.checkpoint.topic, cfg.source.name)


def kafka_adapters(cfg: Config, metrics: RelayMetrics) -> SinkAdapters:
    health = KafkaHealth(metrics, cfg.kafka.bootstrap)
    clients = cfg.kafka.clients()
    publisher: KafkaPublisher
    if cfg.kafka.delivery == "transactional":
        publisher = TransactionalKafkaPublisher(clients, transactional_id(cfg.source.name), health)
        store: Any = TransactionalCheckpointStore(clients, cfg.checkpoint.topic, cfg.source.name, publisher)
    else:
        publisher = KafkaPublisher(clients, health)
        store = checkpoint_store(cfg)
    topics = None
    if cfg.topics.missing == "create":
        from connectors.kafka.topics import KafkaTopicAdmin

        topics = KafkaTopicAdmin.from_config(clients, cfg.topics)
    # Transactional delivery: init_transactions aborts whatever an older instance left
    # open, and the broker refuses its later writes: no delivery timeout to wait out.
    queued_for = 0.0 if cfg.kafka.delivery == "transactional" else delivery_timeout_s(clients)
    return SinkAdapters(
        publisher, KafkaTopicReader(clients), store, topics, kafka_delivery, f"Kafka {cfg.kafka.bootstrap}", queued_for
    )


def _never() -> bool:
    return False


def rabbitmq_stream_adapters(cfg: Config, should_stop: Callable[[], bool] = _never) -> SinkAdapters:
    """RabbitMQ streams (connectors/rabbitmq/stream_sink.py): exactly once by the checkpoint and the
    recovery scan (cdc/delivery/idempotent.py); the publishing ids keep a broker restart
    inside a run from losing or repeating a message (docs/sink-delivery.md, "RabbitMQ Streams")."""
    from cdc.delivery.idempotent import idempotent_delivery
    from connectors.rabbitmq.stream_reader import RabbitStreamReader, StreamSettings
    from connectors.rabbitmq.stream_sink import RabbitStreamAdmin, RabbitStreamPublisher

    rabbit = cfg.sink.rabbitmq_stream
    settings = StreamSettings.from_config(rabbit)
    dlq, auto = cfg.kafka.dead_letter_topic, cfg.topics.missing == "auto"
    publisher = RabbitStreamPublisher(
        settings,
        rabbit.producer_name or f"cdc-relay.{cfg.source.name}",
        rabbit.publish_timeout_s,
        rabbit.max_in_flight,
        create_streams=lambda topic: auto or topic == dlq,  # "auto": the relay creates what is missing
    )
    admin = (
        RabbitStreamAdmin(settings, cfg.topics.partitions, cfg.topics.configs)
        if cfg.topics.missing == "create"
        else None
    )
    store = FileCheckpointStore(cfg.checkpoint.path)
    # a message of a frozen holder is dropped (failed) once publish_timeout_s has passed
    return SinkAdapters(
        publisher,
        # the start's look at the streams waits out a node that is down, as publishing does
        RabbitStreamReader(settings, wait_s=rabbit.publish_timeout_s, should_stop=should_stop),
        store,
        admin,
        idempotent_delivery,
        settings.where(),
        rabbit.publish_timeout_s,
    )


def rabbitmq_exchange_adapters(cfg: Config, should_stop: Callable[[], bool] = _never) -> SinkAdapters:
    """A RabbitMQ topic exchange (connectors/rabbitmq/exchange_sink.py): exactly once into the
    audit stream by the checkpoint and the recovery scan of that stream (cdc/delivery/idempotent.py);
    the users' queues bound beside it get every event at least once (docs/sinks.md)."""
    from cdc.delivery.idempotent import idempotent_delivery
    from connectors.rabbitmq.exchange_sink import (
        AuditLog,
        ExchangeSettings,
        RabbitExchangePublisher,
        declare,
        fence_queue,
    )

    rabbit = cfg.sink.rabbitmq_exchange
    settings = ExchangeSettings.from_config(rabbit)
    if cfg.topics.missing in ("create", "auto"):
        # "auto": the audit stream bound with '#'; "create": bound per routing key as the relay meets it
        declare(settings, bind_all=cfg.topics.missing == "auto")
    # "create": the publisher binds the audit stream with each routing key before its first message
    bind_keys = cfg.topics.missing == "create"
    # the fence: the audit stream is read (the recovery scan) only once the previous relay's
    # connection has ended, connectors/rabbitmq/exchange_sink.py; taken at that first read, so
    # after the lease (a standby makes its publisher and waits)
    publisher = RabbitExchangePublisher(
        settings, rabbit.publish_timeout_s, rabbit.max_in_flight, bind_keys, fence_queue(cfg.source.name), should_stop
    )
    store = FileCheckpointStore(cfg.checkpoint.path)
    checkpoint = store.load()
    # every topic's recovery scan starts at the checkpoint's highest offset (AuditLog's `floor`)
    floor = max((o for ps in checkpoint.offsets.values() for o in ps.values()), default=0) if checkpoint else 0
    return SinkAdapters(
        publisher, AuditLog(settings, floor, publisher.hold_fence, rabbit.publish_timeout_s, should_stop), store, None,
        idempotent_delivery,
        settings.where(), rabbit.publish_timeout_s,
    )  # fmt: skip


def nats_adapters(cfg: Config, should_stop: Callable[[], bool] = _never) -> SinkAdapters:
    from cdc.delivery.idempotent import idempotent_delivery
    from connectors.nats.sink import NatsJetStreamPublisher, NatsStreamAdmin, NatsStreamReader

    nats = cfg.sink.nats_jetstream
    # the start waits out a server that is down, as publishing does (connectors/broker_wait.py)
    reader = NatsStreamReader(nats, wait_s=nats.delivery_timeout_s, should_stop=should_stop)
    topics = NatsStreamAdmin(nats, reader) if cfg.topics.missing == "create" else None
    # Idempotent delivery over JetStream: Nats-Msg-Id within the stream's duplicate window,
    # the recovery scan after it (docs/sink-delivery.md "NATS JetStream"). A previous holder's
    # message can reach the server until its delivery timeout.
    return SinkAdapters(
        NatsJetStreamPublisher(nats, cfg.source.name, should_stop), reader, checkpoint_store(cfg), topics, idempotent_delivery,
        f"NATS JetStream {','.join(nats.servers)}", nats.delivery_timeout_s,
    )  # fmt: skip


def sink_adapters(cfg: Config, metrics: RelayMetrics, should_stop: Callable[[], bool] = _never) -> SinkAdapters:
    """`should_stop`: a stop asked for while the start waits on a broker that is down ends
    the wait (cdc.errors.StopRequested)."""
    if cfg.sink.kind == "kafka":
        return kafka_adapters(cfg, metrics)
    if cfg.sink.kind == "rabbitmq_stream":
        return rabbitmq_stream_adapters(cfg, should_stop)
    if cfg.sink.kind == "rabbitmq_exchange":
        return rabbitmq_exchange_adapters(cfg, should_stop)
    if cfg.sink.kind == "nats_jetstream":
        return nats_adapters(cfg, should_stop)
    raise NotImplementedError(f"sink.kind = {cfg.sink.kind!r} is not wired yet")


def repair_reader(cfg: Config) -> Any:
    """What `cdc repair` reads the sink with (cdc.ports.DeliveredLog, with `close()`)."""
    if cfg.sink.kind == "rabbitmq_stream":
        from connectors.rabbitmq.stream_reader import RabbitStreamReader, StreamSettings

        return RabbitStreamReader(StreamSettings.from_config(cfg.sink.rabbitmq_stream))
    if cfg.sink.kind == "rabbitmq_exchange":
        from connectors.rabbitmq.exchange_sink import AuditLog, ExchangeSettings

        return AuditLog(ExchangeSettings.from_config(cfg.sink.rabbitmq_exchange))
    if cfg.sink.kind == "nats_jetstream":
        from connectors.nats.sink import NatsStreamReader

        return NatsStreamReader(cfg.sink.nats_jetstream)
    return KafkaTopicReader(cfg.kafka.clients())


def repair_publisher(cfg: Config) -> Any:
    """What `cdc repair` re-publishes with (cdc.ports.Publisher)."""
    if cfg.sink.kind == "rabbitmq_stream":
        from connectors.rabbitmq.stream_reader import StreamSettings
        from connectors.rabbitmq.stream_sink import RabbitStreamPublisher

        # Not the relay's producer name: ids of its own, never above or below the relay's
        # (a running relay's next ids would be dropped as duplicates of the repair's).
        return RabbitStreamPublisher(
            StreamSettings.from_config(cfg.sink.rabbitmq_stream), f"cdc-repair.{cfg.source.name}"
        )
    if cfg.sink.kind == "rabbitmq_exchange":
        from connectors.rabbitmq.exchange_sink import ExchangeSettings, RabbitExchangePublisher

        return RabbitExchangePublisher(ExchangeSettings.from_config(cfg.sink.rabbitmq_exchange))
    if cfg.sink.kind == "nats_jetstream":
        from connectors.nats.sink import NatsJetStreamPublisher

        return NatsJetStreamPublisher(cfg.sink.nats_jetstream, "repair")
    return KafkaPublisher(cfg.kafka.clients())


def sink_check(cfg: Config) -> list:
    """`cdc check`'s lines about the sink (Kafka's: connectors/kafka/check.py)."""
    if cfg.sink.kind == "rabbitmq_stream":
        from connectors.rabbitmq.stream_sink import check_rabbitmq

        return check_rabbitmq(cfg)
    if cfg.sink.kind == "rabbitmq_exchange":
        from connectors.rabbitmq.exchange_sink import check_rabbitmq_exchange

        return check_rabbitmq_exchange(cfg)
    if cfg.sink.kind == "nats_jetstream":
        from connectors.nats.sink import check_nats

        return check_nats(cfg.sink.nats_jetstream, cfg.kafka.dead_letter_topic)
    from connectors.kafka.check import check_kafka

    return check_kafka(cfg)
