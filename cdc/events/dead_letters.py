"""Dead letters: what cannot be published goes to the dead-letter topic whole, with its
cause and coordinates (docs/DESIGN.md, promise 6).

Where they come from: the feed (a row the outbox rules refuse, cdc/events/outbox.py), the
serializer (cdc.assembly.feed.prepare: a value the schema cannot hold, a message over
`relay.max_message_bytes`), a topic that does not exist (cdc/delivery/missing_topics.py), and
Kafka's answer to a message already handed over (too large for the broker, topic gone):
that one is *redirected*, re-sent here from the loop's thread, keeping the expectation
of the original message in the in-flight window. The hand-over (cdc/delivery/handover.py)
publishes them like any message; this module builds the record and says so in the log.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import logging
from typing import Any

from cdc.events.identity import H_DLQ_CAUSE, H_DLQ_ERROR, H_DLQ_TOPIC, H_EVENT_ID, H_TABLE
from cdc.events.outbox import DeadLetter
from cdc.log_limit import LogLimiter

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode()}
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, _dt.timedelta)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return repr(value)


def dead_letter_value(dead: DeadLetter) -> bytes:
    """The dead-lettered row, whole, as JSON (bytes as base64): nothing of it is lost."""
    return json.dumps({"table": dead.table, "row": dead.row}, default=_json_default, sort_keys=True).encode()


def dead_letter_headers(dead: DeadLetter) -> list[tuple[str, bytes | None]]:
    """The row's identity (so recovery and the verifier recognise it), its event id, and
    why it is here: cause, error, the topic it was meant for, its table."""
    headers: list[tuple[str, bytes | None]] = list(dead.identity.headers())
    event_id = dead.row.get("id")
    if event_id is not None:
        headers.append((H_EVENT_ID, str(event_id).encode()))
    headers += [
        (H_DLQ_CAUSE, dead.cause.encode()),
        (H_DLQ_ERROR, dead.error[:1000].encode()),
        (H_DLQ_TOPIC, (dead.intended_topic or "").encode()),
        (H_TABLE, dead.table.encode()),
    ]
    return headers


class DeadLetterLog:
    """One line per dead letter, at most one per cause every 10 s (with the count of
    those held back): the operator learns of them without reading the topic."""

    def __init__(self, topic: str, limiter: LogLimiter):
        self._topic = topic
        self._limiter = limiter

    def delivered(self, dead: DeadLetter) -> None:
        ok, held = self._limiter.allow(dead.cause)
        if ok:
            more = f" ({held} more dead letters of this cause since the last line)" if held else ""
            start = dead.identity.tx.start
            log.warning(
                "dead-lettered to %s: event %s of %s at %s row %s: %s: %s%s",
                self._topic,
                dead.row.get("id"),
                dead.table,
                start,
                dead.identity.row,
                dead.cause,
                dead.error[:300],
                more,
            )
