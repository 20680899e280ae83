"""One error root for the product.

    CdcError                    everything the product raises on purpose
    ├── NeedsOperator           a restart will not help: a person must change something
    │   ├── ConfigError         the configuration is wrong (names the key and the fix)
    │   ├── PreflightError      the server is not set up for CDC (binlog, grants, tables)
    │   ├── PositionError       a malformed position, or one the server no longer has
    │   │   └── PositionPurgedError   the binlog holding it was purged: refuse, never skip
    │   ├── RecoveryError       the topics disagree with the checkpoint (repartitioned,
    │   │                       truncated, recreated)
    │   ├── UndecodableEventError   a binlog event cannot be decoded exactly (a corrupt
    │   │                       compressed event, an unknown compression algorithm)
    │   └── ServerError         an embedded server cannot start (missing binary, port)
    ├── Transient               a restart from the checkpoint cures it
    │   ├── SourceError         the binlog connection dropped or timed out
    │   ├── DeliveryError       Kafka did not acknowledge a message (after its retries)
    │   │   └── BrokerUnreachable   the broker (RabbitMQ, NATS) is down or restarting:
    │   │                       connection refused, reset, no answer; a start waits it out
    │   └── RegistryError       the schema registry did not answer or refused a schema
    └── StopRequested           a stop (SIGTERM) came while the start waited on the broker:
                                not a failure, `cdc run` exits 0

Library exceptions are wrapped where they are caught (`raise ... from exc`), so callers
only ever handle this tree. Messages are written for the operator: they say what is
wrong and what to change, and never carry a secret.
"""

from __future__ import annotations


class CdcError(Exception):
    """Root of every error the product raises on purpose."""

    retriable: bool = False


class NeedsOperator(CdcError):
    """A restart will not cure this; a person has to change something."""


class ConfigError(NeedsOperator):
    """The configuration is invalid."""


class PreflightError(NeedsOperator):
    """The database server is not set up the way the relay needs.

    `problems` holds one line per failed check, each naming its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class PositionError(NeedsOperator):
    """A binlog position or GTID set that cannot be parsed or used."""


class PositionPurgedError(PositionError):
    """The binlog holding the start position is gone: starting later would lose events."""


class RecoveryError(NeedsOperator):
    """What the topics hold contradicts the checkpoint."""


class UndecodableEventError(NeedsOperator):
    """A binlog event that cannot be decoded exactly: reading on would lose its rows, and
    reading it again gives the same bytes, so a reconnect cannot help."""


class ServerError(NeedsOperator):
    """An embedded server (MariaDB, Kafka stand-in, registry) could not start."""


class Transient(CdcError):
    """A restart from the checkpoint cures this."""

    retriable = True


class SourceError(Transient):
    """The binlog connection failed; reconnect from the relay's own position."""


class DeliveryError(Transient):
    """Kafka refused or timed out a message after the producer's own retries."""


class BrokerUnreachable(DeliveryError):
    """The broker could not be reached: down, restarting, or not answering. Not a refusal
    (a wrong password, a missing permission): those are plain DeliveryErrors."""


class StopRequested(CdcError):
    """A stop was asked for while the relay's start waited on its broker."""


class RegistryError(Transient):
    """The schema registry could not register or return a schema."""
