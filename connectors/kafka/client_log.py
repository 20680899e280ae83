"""librdkafka's own log lines go through the relay's logging (logger `cdc.kafka`), at the
level `log.kafka_level` sets, each distinct line at most once per 30 s with the count of
its repeats: during an outage librdkafka writes a connection error per broker per retry
(hundreds a minute), which buried the relay's own lines."""

from __future__ import annotations

import logging
import re

from cdc.log_limit import LogLimiter

_CLIENT = re.compile(r"rdkafka#(producer|consumer)-\d+")
_AFTER = re.compile(r"\(after \d+ms[^)]*\)")


class _Dedup(logging.Filter):
    def __init__(self, interval_s: float):
        super().__init__()
        self._limit = LogLimiter(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = _AFTER.sub("", _CLIENT.sub(r"rdkafka#\1", text))
        ok, held = self._limit.allow(key)
        if ok and held:
            record.msg, record.args = f"{text} (and {held} more like it)", None
        return ok


_logger = logging.getLogger("cdc.kafka")
_filter = _Dedup(30.0)
_logger.addFilter(_filter)


def set_level(level: str) -> None:
    _logger.setLevel(level.upper())


def client_logging() -> dict:
    """Settings that route a librdkafka client's log lines to `cdc.kafka`."""
    return {"logger": _logger}
