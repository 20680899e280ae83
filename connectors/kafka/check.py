"""`cdc check`'s look at Kafka: does every address of `kafka.bootstrap` answer with
metadata within a deadline (all of them at once, so the whole look takes at most
`TIMEOUT_S` however many are down), do they belong to one cluster, and do the topics
the relay writes besides its events exist (the dead-letter topic; the checkpoint topic
with `checkpoint.store = "kafka"`), and which event topics exist (`event_topics`: a
table's fixed topic, or the existing topics a template matches) with what the relay
does with an event for a missing one (`topics.missing`).

A missing topic is a warning, not a failure: brokers may create topics on first use
(`auto.create.topics.enable`), which a client cannot ask the broker about everywhere.

librdkafka logs every failed connection attempt to stderr by default
(`%3|...|FAIL|...`); the clients here log into a logger without handlers, and their
errors are read back (poll) and summed up in the check's one line.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from cdc.config import Config
from cdc.kafka_client import KafkaClientConfig, redact
from connectors.mysql.preflight import CheckResult

TIMEOUT_S = 10.0

_QUIET = logging.Logger("cdc.kafka_check.librdkafka")  # not in the logging tree: no handler, no lastResort
_QUIET.addHandler(logging.NullHandler())


def admin_settings(clients: KafkaClientConfig, address: str) -> dict[str, Any]:
    """The metadata client's configuration for one address: [kafka.client] (security,
    client.id ...), like every other Kafka client of the relay; no producer settings."""
    quiet = {"logger": _QUIET, "log.connection.close": False}
    return KafkaClientConfig(address, clients.client).conf("admin", enforced=quiet)


def bootstrap_addresses(bootstrap: str) -> list[str]:
    return [a.strip() for a in bootstrap.split(",") if a.strip()]


@dataclass(frozen=True)
class _Answer:
    address: str
    metadata: Any  # ClusterMetadata, or None when the address did not answer
    error: str  # why not, when it did not
    refused: bool = False  # the client refused the settings (kafka.producer)


def _error_text(error: Any) -> str:
    """librdkafka's text without its decorations: `127.0.0.1:9/bootstrap: Connect to
    ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)` ->
    `Connect to ipv4#127.0.0.1:9 failed: Connection refused`."""
    text = error.str() if isinstance(error, KafkaError) else str(error)
    text = re.sub(r"^\S+/(?:bootstrap|\d+): ", "", text)
    return re.sub(r" \(after \d+ms in state \w+\)$", "", text)


def _ask(address: str, clients: KafkaClientConfig, deadline: float) -> _Answer:
    errors: list[Any] = []
    try:
        conf: dict[str, Any] = {**admin_settings(clients, address), "error_cb": errors.append}
        admin = AdminClient(conf)
    except (KafkaException, ValueError, TypeError) as exc:
        # librdkafka may quote a refused value: never a secret
        return _Answer(address, None, redact(_error_text(exc.args[0] if exc.args else exc), clients), refused=True)
    try:
        return _Answer(address, admin.list_topics(timeout=max(0.1, deadline - time.monotonic())), "")
    except KafkaException as exc:
        admin.poll(0)  # delivers the errors librdkafka met while trying (error_cb)
        reason = _error_text(errors[-1]) if errors else _error_text(exc.args[0] if exc.args else exc)
        return _Answer(address, None, redact(reason, clients))


def _topic_state(metadata: Any, topic: str) -> tuple[str, str]:
    """("exists", "<n> partition(s)") | ("missing", "") | ("error", text)."""
    info = metadata.topics.get(topic)
    if info is None:
        return "missing", ""
    if info.error is not None:
        if info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return "missing", ""
        return "error", _error_text(info.error)
    return "exists", f"{len(info.partitions)} partition(s)"


def check_kafka(cfg: Config, timeout_s: float = TIMEOUT_S) -> list[CheckResult]:
    """Results named `kafka`, `dead_letter_topic` and (store "kafka") `checkpoint_topic`.
    `kafka` fails only when no address answers or the addresses name two clusters; an
    address that does not answer while another does is a warning (the relay works)."""
    results: list[CheckResult] = []
    addresses = bootstrap_addresses(cfg.kafka.bootstrap)
    if not addresses:
        return [CheckResult("kafka", False, "kafka.bootstrap is empty: set it to the brokers' host:port list")]
    clients = cfg.kafka.clients()
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(max_workers=min(len(addresses), 16)) as pool:
        answers = list(pool.map(lambda a: _ask(a, clients, deadline), addresses))
    refused = [a for a in answers if a.refused]
    if refused:
        return [
            CheckResult(
                "kafka", False, f"the Kafka client refuses the settings of kafka.client ({refused[0].error}): fix them"
            )
        ]
    answered = [a for a in answers if a.metadata is not None]
    silent = [a for a in answers if a.metadata is None]
    wait = f"{timeout_s:.0f} s"
    if not answered:
        reasons = "; ".join(dict.fromkeys(a.error for a in silent if a.error))
        results.append(
            CheckResult(
                "kafka",
                False,
                f"cannot reach Kafka at {', '.join(a.address for a in silent)} "
                f"within {wait} (kafka.bootstrap{'; ' + reasons if reasons else ''}): check the "
                "address and that the brokers run",
            )
        )
        return results
    clusters = {a.address: a.metadata.cluster_id for a in answered}
    if len(set(clusters.values())) > 1:
        named = ", ".join(f"{address} is cluster {cid}" for address, cid in clusters.items())
        results.append(
            CheckResult(
                "kafka",
                False,
                f"kafka.bootstrap names more than one Kafka cluster ({named}): list the brokers of one cluster",
            )
        )
        return results
    metadata = answered[0].metadata
    about = f"cluster {metadata.cluster_id}, {len(metadata.brokers)} broker(s)"
    if silent:
        results.append(
            CheckResult(
                "kafka",
                True,
                f"{', '.join(a.address for a in silent)} did not answer within "
                f"{wait} (kafka.bootstrap; {'; '.join(dict.fromkeys(a.error for a in silent))}); "
                f"{', '.join(a.address for a in answered)} answered ({about}): fix or remove the "
                "address that does not answer",
                warn=True,
            )
        )
    else:
        results.append(CheckResult("kafka", True, f"{', '.join(a.address for a in answered)} answered ({about})"))

    topics = [
        (
            "dead_letter_topic",
            "kafka.dead_letter_topic",
            cfg.kafka.dead_letter_topic,
            "the relay writes a row it cannot publish there",
        )
    ]
    if cfg.checkpoint.store == "kafka":
        topics.append(
            (
                "checkpoint_topic",
                "checkpoint.topic",
                cfg.checkpoint.topic,
                "no checkpoint is read from it (the relay starts from source.start) and the first checkpoint needs it",
            )
        )
    results += _event_topics(cfg, metadata)
    for name, key, topic, why in topics:
        state, detail = _topic_state(metadata, topic)
        if state == "exists":
            results.append(CheckResult(name, True, f"topic {topic!r} exists ({detail})"))
        elif state == "missing":
            results.append(
                CheckResult(
                    name,
                    True,
                    f"topic {topic!r} ({key}) does not exist: {why}; create it "
                    f"(kafka-topics.sh --create --topic {topic}) unless the brokers create topics "
                    "on first use (auto.create.topics.enable)",
                    warn=True,
                )
            )
        else:
            results.append(
                CheckResult(
                    name,
                    True,
                    f"cannot see topic {topic!r} ({key}): {detail}: allow the relay's client to describe and write it",
                    warn=True,
                )
            )
    return results


_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_WHAT_HAPPENS = {
    "dead_letter": 'their events are dead-lettered (cause topic_missing, topics.missing = "dead_letter") until '
    "it exists: create it (kafka-topics.sh --create --topic {topic}) or set topics.missing = "
    '"create"',
    "create": 'the relay creates it before its first event (topics.missing = "create"; its principal needs '
    "CREATE on it)",
    "auto": 'the brokers must create it on first use (topics.missing = "auto"), else its events are '
    "dead-lettered (cause topic_missing)",
}


def _event_topics(cfg: Config, metadata: Any) -> list[CheckResult]:
    """Per outbox table: its topic (fixed once schema and table are filled in) exists, or
    what happens to its events; for a template, the existing topics it matches."""
    policy = cfg.topics.missing
    out = []
    for index, table in enumerate(cfg.tables):
        template = table.topic.replace("{schema}", table.schema).replace("{table}", table.table)
        key = f"outbox.tables[{index}].topic"
        if not _PLACEHOLDER.search(template):
            state, detail = _topic_state(metadata, template)
            if state == "exists":
                out.append(CheckResult("event_topics", True, f"topic {template!r} ({key}) exists ({detail})"))
            else:
                why = _WHAT_HAPPENS[policy].format(topic=template)
                out.append(
                    CheckResult(
                        "event_topics",
                        True,
                        f"topic {template!r} ({key}) does not exist: {why}",
                        warn=policy != "create",
                    )
                )
            continue
        pattern = re.compile(
            "".join(
                "[a-zA-Z0-9._-]+" if i % 2 else re.escape(part) for i, part in enumerate(_PLACEHOLDER.split(template))
            )
        )
        found = sorted(t for t in metadata.topics if pattern.fullmatch(t))
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        why = _WHAT_HAPPENS[policy].format(topic="<topic>")
        out.append(
            CheckResult(
                "event_topics",
                True,
                f"{len(found)} existing topic(s) match {table.topic!r} ({key})"
                f"{': ' + shown if found else ''}; for an aggregate type whose topic does not exist, "
                f"{why}",
            )
        )
    return out
