"""What the Kafka stand-in's server and client share: the protocol's API keys and error
names, the control channel's constants, the error type."""

from __future__ import annotations

from typing import Final

#: Kafka protocol ApiKeys accepted by name in ``push_errors``/``clear_errors``
#: (numbers from the Kafka protocol guide; librdkafka's RD_KAFKAP_* constants).
API_KEYS: Final[dict[str, int]] = {
    "Produce": 0,
    "Fetch": 1,
    "ListOffsets": 2,
    "Metadata": 3,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "JoinGroup": 11,
    "Heartbeat": 12,
    "LeaveGroup": 13,
    "SyncGroup": 14,
    "ApiVersions": 18,
    "InitProducerId": 22,
    "AddPartitionsToTxn": 24,
    "AddOffsetsToTxn": 25,
    "EndTxn": 26,
    "TxnOffsetCommit": 28,
}

#: Kafka's current error names that librdkafka still spells the old way.
ERROR_ALIASES: Final[dict[str, str]] = {
    "NOT_LEADER_OR_FOLLOWER": "NOT_LEADER_FOR_PARTITION",
    "MESSAGE_TOO_LARGE": "MSG_SIZE_TOO_LARGE",
}

HOST: Final = "127.0.0.1"
PARENT_PID_ENV: Final = "KAFKA_STANDIN_PARENT_PID"
EXIT_PORT_IN_USE: Final = 2
EXIT_FAILURE: Final = 1
RD_KAFKA_PRODUCER: Final = 0  # rd_kafka_type_t RD_KAFKA_PRODUCER
PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>
STDERR_TAIL_LINES: Final = 20


class StandinError(Exception):
    """The Kafka stand-in could not be started, controlled or stopped.

    The message is meant for a person: it names the port, the command or the
    child's last stderr lines, whichever explains the failure.
    """


def port_in_use_message(port: int) -> str:
    """The one-line message for a requested port that is taken."""
    return f"Kafka stand-in: port {port} is already in use; pick another port or stop the program holding it"


def resolve_api_key(api_key: int | str) -> int:
    """Map an ApiKey given by number or by name ("Produce", "FindCoordinator")."""
    if isinstance(api_key, bool):
        raise StandinError(f"Kafka stand-in: invalid api_key {api_key!r}")
    if isinstance(api_key, int):
        if not 0 <= api_key < 32768:
            raise StandinError(f"Kafka stand-in: api_key {api_key} is out of range")
        return api_key
    if isinstance(api_key, str):
        wanted = api_key.strip().lower().removesuffix("request")
        if wanted.isdigit():
            return resolve_api_key(int(wanted))
        for name, number in API_KEYS.items():
            if name.lower() == wanted:
                return number
        known = ", ".join(f"{n}={k}" for n, k in API_KEYS.items())
        raise StandinError(f"Kafka stand-in: unknown api_key {api_key!r} (known: {known})")
    raise StandinError(f"Kafka stand-in: invalid api_key {api_key!r}")


def resolve_error_code(error: int | str) -> int:
    """Map an error given by number or by librdkafka name (``"NOT_LEADER_FOR_PARTITION"``).

    Names are looked up on :class:`confluent_kafka.KafkaError`, which mirrors
    ``rd_kafka_resp_err_t``; local errors keep their leading underscore
    (``"_TRANSPORT"`` makes the mock drop the connection, see
    ``rd_kafka_mock_push_request_errors``).
    """
    if isinstance(error, bool):
        raise StandinError(f"Kafka stand-in: invalid error code {error!r}")
    if isinstance(error, int):
        return error
    if isinstance(error, str):
        text = error.strip()
        try:
            return int(text)
        except ValueError:
            pass
        from confluent_kafka import KafkaError  # lazy: only names need it

        name = text.upper()
        name = ERROR_ALIASES.get(name, name)
        code = getattr(KafkaError, name, None)
        if isinstance(code, int):
            return code
        raise StandinError(f"Kafka stand-in: unknown error name {error!r}")
    raise StandinError(f"Kafka stand-in: invalid error code {error!r}")
