"""Loading rstream, the RabbitMQ stream protocol's client, for the relay's sink
(connectors/rabbitmq/stream_sink.py) and the verifier's source (spark_jobs/rabbitmq/source.py):
quiet, and failing with the caller's own line when the `rabbitmq` extra is not installed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

INSTALL_HINT = "pip install 'cdc-outbox-relay[rabbitmq]'"


def load_rstream(missing: Callable[[str], Exception]) -> Any:
    """The rstream module; `missing(INSTALL_HINT)` is raised when it is not installed."""
    # rstream logs a traceback for every connection it sees closed (a refused login too);
    # every failure that matters reaches the caller as an exception, said in one line
    logging.getLogger("rstream").setLevel(logging.CRITICAL)
    try:
        import rstream
    except ImportError:
        raise missing(INSTALL_HINT) from None
    return rstream
