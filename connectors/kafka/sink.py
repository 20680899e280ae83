"""The Kafka publisher over confluent-kafka (implements cdc.ports.ReportingPublisher).

Settings the relay's guarantees rest on, not left to the user's dict:
* `enable.idempotence=true` (implies acks=all, retries, and max 5 in flight): the
  broker keeps each partition in produce order even across retries;
* `acks=all`: a message counts as delivered only once every in-sync replica has it;
* `partitioner=murmur2_random`: the Java client's key -> partition mapping, so Java and
  Python producers of the same keys agree.
Everything else - `[kafka.client]` (security, shared by every client) then
`[kafka.producer]` - is passed to librdkafka untouched (cdc/kafka_client.py).

Every produce carries a delivery callback; a full local queue makes `publish` wait
(serving callbacks) instead of dropping the message.

Health: librdkafka's "all brokers down" error and its statistics (every 2 s: how many
brokers are up) reach `cdc.kafka_health.KafkaHealth`, which says in the relay's own log
when Kafka became unreachable and when it came back; librdkafka's log lines go through
`connectors/kafka/client_log.py` (rate-limited), never straight to stderr.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from cdc.delivery.kafka_transaction import FENCED_CODES, Fenced, TransactionAborted
from cdc.errors import ConfigError, DeliveryError
from cdc.kafka_client import KafkaClientConfig, redact
from cdc.kafka_health import KafkaHealth
from cdc.ports import Delivery, DeliveryCallback, DeliveryFailure, Report
from connectors.kafka.client_log import client_logging

ENFORCED = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}
# message.timeout.ms: how long a message may wait for Kafka before it fails (and the relay
# exits 1); also the longest a message can stay queued in a frozen relay's producer, which
# a successor that takes the lease over waits out (cdc/lease.py). librdkafka's own is 300 s.
DEFAULTS = {"linger.ms": 5, "compression.type": "lz4", "message.max.bytes": 1_000_000, "message.timeout.ms": 60_000}
_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}
if hasattr(KafkaError, "_MSG_SIZE_TOO_LARGE"):
    _TOO_LARGE.add(KafkaError._MSG_SIZE_TOO_LARGE)
# The topic does not exist: the broker's answer, or librdkafka's once metadata said so
# (after topic.metadata.propagation.max.ms): the relay dead-letters such a message.
_NO_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}
# Producer.produce's arguments by position, as confluent-kafka's Producer.c parses them
# ("s|z#z#iOOLO": topic, value, key, partition, callback, on_delivery (callback's alias),
# timestamp, headers): partition RD_KAFKA_PARTITION_UA (-1: the partitioner picks) and
# timestamp 0 (librdkafka stamps the current time) are its own defaults, so the message
# is the one the keyword form makes.
_ANY_PARTITION = -1


def producer_settings(clients: KafkaClientConfig | str, txn_id: str | None = None) -> dict[str, Any]:
    """The relay producer's librdkafka configuration: DEFAULTS < [kafka.client] <
    [kafka.producer] < ENFORCED (a setting that contradicts ENFORCED is refused)."""
    clients = KafkaClientConfig.of(clients)
    for key, value in clients.settings("producer").items():
        if key in ENFORCED and str(value).lower() != str(ENFORCED[key]).lower():
            raise ConfigError(
                f"kafka.producer.{key} = {value!r} would break delivery guarantees; the relay requires "
                f"{key} = {ENFORCED[key]!r} (remove the setting)"
            )
    enforced = dict(ENFORCED) if txn_id is None else {**ENFORCED, "transactional.id": txn_id}
    return clients.conf("producer", DEFAULTS, enforced)


def delivery_timeout_s(clients: KafkaClientConfig | str) -> float:
    """The producer's delivery timeout (message.timeout.ms, alias delivery.timeout.ms)."""
    conf = producer_settings(clients)
    value = conf.get("delivery.timeout.ms", conf.get("message.timeout.ms"))
    try:
        return float(value) / 1000.0  # type: ignore[arg-type]  # None and junk end in the except below
    except (TypeError, ValueError):
        raise ConfigError(
            f"kafka.producer.message.timeout.ms must be a number of milliseconds, got {value!r}"
        ) from None


def _failure(err: KafkaError) -> DeliveryFailure:
    code = err.code()
    return DeliveryFailure(
        code=err.name(),
        message=err.str(),
        too_large=code in _TOO_LARGE,
        fatal=err.fatal(),
        topic_missing=code in _NO_TOPIC,
    )


class KafkaPublisher:
    def __init__(self, clients: KafkaClientConfig | str, health: KafkaHealth | None = None, txn_id: str | None = None):
        self._conf = producer_settings(clients, txn_id)
        self._health = health
        conf: dict[str, Any] = {**self._conf, **client_logging()}
        if health is not None:
            conf.update(
                {
                    "error_cb": self._on_error,
                    "stats_cb": self._on_stats,
                    "statistics.interval.ms": conf.get("statistics.interval.ms", 2000),
                }
            )
        try:
            self._producer = Producer(conf)
        except KafkaException as exc:
            raise ConfigError(
                f"invalid Kafka producer settings (kafka.client / kafka.producer): "
                f"{redact(exc.args[0].str(), self._conf)}"
            ) from exc

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN and self._health is not None:
            self._health.unreachable(err.str(), len(self._producer))

    def _on_stats(self, text: str) -> None:
        try:
            brokers = json.loads(text).get("brokers", {})
        except ValueError:
            return
        up = sum(1 for b in brokers.values() if b.get("state") == "UP" and b.get("nodeid", -1) >= 0)
        if self._health is not None:
            self._health.brokers_up(up)

    @property
    def max_message_bytes(self) -> int:
        return int(self._conf.get("message.max.bytes", 1_000_000))

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        # A partial of a method, not a closure: a closure's cells would make every local
        # here a cell as well.
        self.publish_reported(topic, key, value, headers, partial(self._report, topic, on_delivery), timestamp_ms)

    def publish_reported(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        report: Report,
        timestamp_ms: int | None = None,
    ) -> None:
        """cdc.ports.ReportingPublisher: `report` is librdkafka's delivery report itself."""
        health = self._health
        if health is not None and health.down:
            # While Kafka is unreachable, an acknowledgement says it is back (the
            # statistics say it too, within statistics.interval.ms).
            report = partial(self._reachable_first, report)
        try:
            # Every argument by position (see _ANY_PARTITION): on_delivery=/headers= by keyword
            # cost 0.6-0.8 us more a message (a keyword dict, matched by name in C).
            self._producer.produce(topic, value, key, _ANY_PARTITION, report, None, timestamp_ms or 0, headers)  # type: ignore[arg-type]  # list invariance: bytes values are what it takes
        except BufferError:
            self._producer.poll(0.05)  # queue full: wait for acknowledgements, never drop
            self._produce_waiting(topic, key, value, headers, report, timestamp_ms)
        except KafkaException as exc:
            self._refused(topic, report, exc)

    def _produce_waiting(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        report: Report,
        timestamp_ms: int | None,
    ) -> None:
        """`publish_reported` once the queue was full: try again, waiting while it stays full."""
        produce, poll = self._producer.produce, self._producer.poll
        while True:
            try:
                produce(topic, value, key, _ANY_PARTITION, report, None, timestamp_ms or 0, headers)  # type: ignore[arg-type]  # as in publish_reported
                return
            except BufferError:
                poll(0.05)  # queue full: wait for acknowledgements, never drop
            except KafkaException as exc:
                self._refused(topic, report, exc)
                return

    def _refused(self, topic: str, report: Report, exc: KafkaException) -> None:
        """librdkafka refused to queue the message: too large or no such topic is the
        message's delivery failure (reported at once); anything else stops the relay."""
        err = exc.args[0]
        if err.code() in _TOO_LARGE or err.code() in _NO_TOPIC:
            report(err, None)
            return
        self._raise_if_fenced(err)
        raise DeliveryError(f"Kafka refused a message for {topic}: {err.name()}: {err.str()}") from exc

    def _reachable_first(self, report: Report, err: KafkaError | None, msg: Any) -> None:
        if err is None and self._health is not None:
            self._health.reachable()
        report(err, msg)

    def _report(self, topic: str, on_delivery: DeliveryCallback, err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery report of one message, to a port's callback."""
        on_delivery(self.delivery(topic, err, msg))

    def delivery(self, topic: str, error: KafkaError | None, message: Any) -> Delivery:
        """librdkafka's delivery report of one message to `topic`, as the port's Delivery."""
        if error is None:
            offset = message.offset()  # None: acknowledged without an offset (a retried batch already written)
            return Delivery(topic, message.partition(), -1 if offset is None else offset)
        return Delivery(topic, message.partition() if message is not None else -1, -1, _failure(error))

    def poll(self, timeout: float) -> None:
        self._producer.poll(timeout)

    def pending(self) -> int:
        return len(self._producer)

    def flush(self, timeout: float) -> int:
        return self._producer.flush(timeout)

    def purge(self) -> None:
        # A request already on the wire may still be appended by the broker; what is
        # queued is never sent. The delivery reports (_PURGE_QUEUE) are not served.
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)

    def close(self) -> None:
        self._producer.flush(5.0)

    def _raise_if_fenced(self, err: KafkaError) -> None:
        pass


class _NotTheFence(logging.Filter):
    """librdkafka's own lines about this producer being fenced (TXNERR, FATAL, ADDPARTS):
    the relay says it in its one line (`fenced by a newer instance of ...`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return "fenced by a newer instance" not in text and "old epoch" not in text


class TransactionalKafkaPublisher(KafkaPublisher):
    """The publisher of `kafka.delivery = "transactional"`: a transactional producer
    (`transactional.id` = cdc.delivery.kafka_transaction.transactional_id(source name)). Its calls
    raise Fenced when a newer instance took the transactional.id over,
    TransactionAborted when the open transaction can only be aborted, DeliveryError
    when Kafka does not answer in time. `produce_record` writes one record (the
    checkpoint) in the open transaction without a delivery callback of the relay's."""

    def __init__(self, clients: KafkaClientConfig | str, txn_id: str, health: KafkaHealth | None = None):
        super().__init__(clients, health, txn_id=txn_id)
        self.txn_id = txn_id
        fence_lines = logging.getLogger("cdc.kafka")
        if not any(isinstance(f, _NotTheFence) for f in fence_lines.filters):
            fence_lines.addFilter(_NotTheFence())

    def _raise_if_fenced(self, err: KafkaError) -> None:
        if err.name() in FENCED_CODES or err.code() == KafkaError._FENCED:
            raise Fenced(self.txn_id)

    def _call(self, what: str, call: Any, *args: Any) -> None:
        for attempt in range(5):
            try:
                call(*args)
                return
            except KafkaException as exc:
                err = exc.args[0]
                self._raise_if_fenced(err)
                if err.txn_requires_abort():
                    raise TransactionAborted(f"{what}: {err.name()}: {err.str()}") from exc
                if err.retriable() and attempt < 4:
                    continue  # librdkafka: the same call may be retried
                if err.fatal():
                    raise DeliveryError(
                        f"Kafka producer {self.txn_id} failed ({what}): {err.name()}: {err.str()}; restart the relay"
                    ) from exc
                raise TransactionAborted(f"{what}: {err.name()}: {err.str()}") from exc

    def init_transactions(self, timeout: float) -> None:
        try:
            self._producer.init_transactions(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            self._raise_if_fenced(err)
            raise DeliveryError(
                f"Kafka did not start transactions for {self.txn_id} within {timeout:g} s: "
                f"{err.name()}: {err.str()}; check kafka.bootstrap and that the brokers run "
                "(transactional delivery needs a broker with transactions)"
            ) from exc

    def begin_transaction(self) -> None:
        self._call("begin the transaction", self._producer.begin_transaction)

    def commit_transaction(self, timeout: float) -> None:
        self._call("commit the transaction", self._producer.commit_transaction, timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort the transaction", self._producer.abort_transaction, timeout)

    def poll(self, timeout: float) -> None:
        try:
            self._producer.poll(timeout)
        except (KafkaException, SystemError) as exc:  # a transactional producer's fatal state
            self._fatal(exc)

    def flush(self, timeout: float) -> int:
        try:
            return self._producer.flush(timeout)
        except (KafkaException, SystemError) as exc:
            self._fatal(exc)

    def _fatal(self, exc: KafkaException | SystemError) -> NoReturn:
        """poll / flush met the producer's fatal error. confluent-kafka raises it as a
        KafkaException; when the same call then serves a delivery report (the purged
        messages'), the report's first call into the library fails with a SystemError
        ("returned a result with an exception set") whose cause is that KafkaException."""
        kafka_exc = exc if isinstance(exc, KafkaException) else exc.__cause__
        if not isinstance(kafka_exc, KafkaException):
            raise exc
        err = kafka_exc.args[0]
        self._raise_if_fenced(err)
        raise TransactionAborted(f"{err.name()}: {err.str()}") from exc

    def produce_record(self, topic: str, key: bytes, value: bytes) -> None:
        """One record in the open transaction; a failure shows at the commit."""
        while True:
            try:
                self._producer.produce(topic, value, key)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                self._raise_if_fenced(exc.args[0])
                raise TransactionAborted(f"the checkpoint record for {topic} was refused: {exc.args[0].str()}") from exc

    def purge(self) -> None:
        try:
            super().purge()
        except KafkaException:  # a fenced (fatal) producer: nothing of it goes out anyway
            pass
