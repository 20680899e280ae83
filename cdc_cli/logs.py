"""Logging set-up: plain text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(fmt: str = "text", level: str = "INFO", kafka_level: str = "WARNING") -> None:
    """`kafka_level`: librdkafka's own lines (logger `cdc.kafka`, rate-limited)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # python-mysql-replication and confluent-kafka are chatty at INFO.
    logging.getLogger("pymysqlreplication").setLevel(logging.WARNING)
    logging.getLogger("cdc.kafka").setLevel(kafka_level.upper())
