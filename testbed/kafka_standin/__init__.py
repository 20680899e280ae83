"""The Kafka stand-in: librdkafka's mock cluster served from its own process
(`server.py`, run as `python -m testbed.kafka_standin`), and the client that starts and
drives it (`client.py`)."""

from testbed.kafka_standin.client import KafkaStandin
from testbed.kafka_standin.common import (
    API_KEYS,
    StandinError,
    port_in_use_message,
    resolve_api_key,
    resolve_error_code,
)

__all__ = ["API_KEYS", "KafkaStandin", "StandinError", "port_in_use_message", "resolve_api_key", "resolve_error_code"]
