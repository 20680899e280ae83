"""Creating a topic the relay is about to write (implements cdc.ports.TopicAdmin), for
`topics.missing = "create"`: AdminClient CreateTopics with `topics.partitions`,
`topics.replication_factor` (-1: the brokers' defaults, Kafka 2.4+) and `[topics.configs]`,
through the shared Kafka client settings ([kafka.client], cdc/kafka_client.py).

A topic someone else created meanwhile counts as created. Any other refusal
(authorization, a replication factor above the brokers', a bad config) is returned as
one line for the dead letter and the log, never raised: the relay dead-letters the
event (cause `topic_missing`) and goes on with the other topics.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from cdc.kafka_client import KafkaClientConfig, redact
from connectors.kafka.client_log import client_logging


def new_topic_request(
    topic: str, partitions: int = -1, replication_factor: int = -1, configs: dict[str, Any] | None = None
) -> NewTopic:
    """The CreateTopics request for `topic` (topic configs are strings on the wire)."""
    return NewTopic(
        topic,
        num_partitions=int(partitions),
        replication_factor=int(replication_factor),
        config={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in (configs or {}).items()},
    )


class KafkaTopicAdmin:
    def __init__(
        self,
        clients: KafkaClientConfig | str,
        partitions: int = -1,
        replication_factor: int = -1,
        configs: dict[str, Any] | None = None,
        timeout_s: float = 30.0,
    ):
        self._clients = KafkaClientConfig.of(clients)
        self._partitions, self._rf, self._configs = partitions, replication_factor, dict(configs or {})
        self._timeout = timeout_s
        self._admin: AdminClient | None = None

    @classmethod
    def from_config(cls, clients: KafkaClientConfig, topics: Any) -> KafkaTopicAdmin:
        """From `[topics]` (cdc.config.TopicsConfig)."""
        return cls(clients, topics.partitions, topics.replication_factor, topics.configs)

    def request(self, topic: str) -> NewTopic:
        return new_topic_request(topic, self._partitions, self._rf, self._configs)

    def _admin_(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({**self._clients.conf("admin"), **client_logging()})
        return self._admin

    def create_topic(self, topic: str) -> str | None:
        admin = self._admin_()
        try:
            futures = admin.create_topics([self.request(topic)], request_timeout=self._timeout)
            futures[topic].result(self._timeout + 5)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                return (
                    f"CreateTopics refused: {err.name()}: {redact(err.str(), self._clients)} (grant the relay's "
                    "principal CREATE on it, check topics.partitions / replication_factor / configs, or create "
                    "the topic)"
                )
        except Exception as exc:  # a future that times out raises concurrent.futures.TimeoutError
            return f"CreateTopics got no answer within {self._timeout:g} s ({type(exc).__name__}): create the topic"
        # Created: wait (briefly) until the metadata the relay reads lists it.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                info = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
            except KafkaException:
                info = None
            if info is not None and info.error is None and info.partitions:
                break
            time.sleep(0.2)
        return None
