"""How the relay behaves: its settings, with the defaults a new deployment should start
with. Built from the config file by `cdc/config.py`; read by the relay loop
(`cdc/relay.py`) and by the feed on either side of the reader process (`cdc/assembly/feed.py`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cdc.errors import ConfigError
from cdc.events.outbox import OutboxTable
from cdc.events.topics import topic_problem


@dataclass(frozen=True, kw_only=True)
class RelayTuning:
    """The `[relay]` section of the config file (and `[outbox]`'s `on_change` /
    `on_statement`): each default is written here once, and `RelaySettings` carries them on."""

    on_change: str = "ignore"  # UPDATE/DELETE on an outbox table: ignore | warn | stop
    on_statement: str = "stop"  # an outbox INSERT logged as a statement: stop | dead_letter
    spill_rows: int = 10_000  # rows of one transaction held in memory before spilling
    spill_dir: str | None = None  # where spill files go (default: the system's temporary directory)
    max_message_bytes: int = 1_000_000  # larger encoded events are dead-lettered
    max_in_flight: int = 5_000  # handed to the producer and not yet acknowledged: publishing waits above it
    reconnect_timeout_s: float = 300.0  # give up (exit non-zero) after this long without a connection
    drain_timeout_s: float = 30.0  # on stop: how long to wait for outstanding acknowledgements
    # /readyz says not ready (with the reason) while a message has waited this long for
    # Kafka's acknowledgement: Kafka unreachable, or too slow for the load
    max_unacknowledged_age_s: float = 30.0


@dataclass(frozen=True)
class RelaySettings(RelayTuning):
    """How the relay behaves. Defaults are what a new deployment should start with.
    The tuning fields (RelayTuning's) are keyword-only."""

    source_name: str  # stable name of this source; part of every event's identity
    tables: tuple[OutboxTable, ...]
    dead_letter_topic: str = "outbox.dlq"
    topic_allowlist: tuple[str, ...] = ()  # fnmatch patterns; empty = any legal topic
    xa_check_after_s: float = 60.0  # undecided XA: first XA RECOVER check after this age
    xa_check_interval_s: float = 30.0  # then every this often
    xa_max_checks: int = 15  # then an operator problem
    start: str = "latest"  # without a checkpoint: latest | earliest | <file>:<pos> | <GTID set>
    checkpoint_interval_s: float = 1.0
    checkpoint_in_background: bool = True  # periodic checkpoints do not block the loop
    read_timeout_s: float = 0.05
    # kafka.delivery: "idempotent" (idempotent producer + recovery scan) or "transactional"
    # (Kafka transactions of whole database transactions with the checkpoint inside, cdc/delivery/kafka_transaction.py)
    delivery: str = "idempotent"
    transaction_max_s: float = 0.1  # transactional: commit the open Kafka transaction once it is this old
    transaction_max_messages: int = 20_000  # ... or holds this many messages (checked between database transactions)
    # An event for a topic that does not exist (topics.missing): "dead_letter" (cause
    # topic_missing, one log line naming the topic), "create" (through the TopicAdmin port),
    # "auto" (no check: the brokers create topics on first use)
    topic_missing: str = "dead_letter"
    topic_recheck_s: float = 10.0  # a topic found missing is asked about again after this long

    def __post_init__(self) -> None:
        if not self.source_name:
            raise ConfigError("source.name must be set: it names this source in every event's identity")
        if not self.tables:
            raise ConfigError("no outbox table configured: add at least one [[outbox.tables]] entry")
        if self.delivery not in ("idempotent", "transactional"):
            raise ConfigError(f'kafka.delivery must be "idempotent" or "transactional", got {self.delivery!r}')
        if self.transaction_max_s <= 0 or self.transaction_max_messages < 1:
            raise ConfigError("kafka.transaction_max_ms must be positive and kafka.transaction_max_messages at least 1")
        if self.topic_missing not in ("dead_letter", "create", "auto"):
            raise ConfigError(f'topics.missing must be "dead_letter", "create" or "auto", got {self.topic_missing!r}')
        problem = topic_problem(self.dead_letter_topic)
        if problem:
            raise ConfigError(f"kafka.dead_letter_topic: {problem}")


def tuning_of(tuning: RelayTuning) -> dict[str, Any]:
    """RelayTuning's fields of `tuning`, as keyword arguments for RelaySettings."""
    return {f.name: getattr(tuning, f.name) for f in fields(RelayTuning)}
