"""Topic routing: a template such as `outbox.event.{aggregate_type}` rendered per event,
then checked against Kafka's rules and an optional allowlist.

Kafka's rules (kafka.common.internals.Topic): 1-249 characters from `[a-zA-Z0-9._-]`,
not `.` or `..`. A topic that breaks them is not an error of the relay but of the row:
the event goes to the dead-letter topic with the cause, and the stream goes on.
"""

from __future__ import annotations

import fnmatch
import re
import string
from dataclasses import dataclass

from cdc.errors import ConfigError

MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
PLACEHOLDERS = frozenset({"aggregate_type", "type", "schema", "table"})


def topic_problem(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic, or None when it is."""
    if not name:
        return "topic name is empty"
    if len(name) > MAX_TOPIC_LENGTH:
        return f"topic name is {len(name)} characters; Kafka allows at most {MAX_TOPIC_LENGTH}"
    if name in (".", ".."):
        return f"topic name {name!r} is reserved"
    if not _LEGAL.match(name):
        bad = sorted({c for c in name if not _LEGAL.match(c)})
        return f"topic name {name[:80]!r} has characters Kafka does not allow: {''.join(bad)!r}"
    return None


def check_template(template: str) -> None:
    """Refuse, at start, a template naming an unknown field, or one whose fixed text can
    never make a legal topic (characters Kafka does not allow, more than 249 fixed
    characters, a fixed topic that is empty, `.` or `..`). Only the fixed text is checked:
    a placeholder may become anything, and a value that makes an illegal topic is that
    row's problem (a dead letter), not the config's."""
    if not isinstance(template, str):
        raise ConfigError(f"topic template must be a string, got {template!r}")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"topic template {template!r} is malformed: {exc}") from exc
    fields = {f for _, f, _, _ in parts if f is not None}
    unknown = fields - PLACEHOLDERS
    if unknown:
        raise ConfigError(
            f"topic template {template!r} uses unknown field(s) {sorted(unknown)}; use only {sorted(PLACEHOLDERS)}"
        )
    fixed = "".join(literal for literal, _, _, _ in parts)
    bad = sorted({c for c in fixed if not _LEGAL.match(c)})
    if bad:
        raise ConfigError(
            f"topic template {template[:120]!r} has characters Kafka does not allow in its fixed text: "
            f"{''.join(bad)!r} (a topic name holds only a-z, A-Z, 0-9, '.', '_' and '-')"
        )
    if len(fixed) > MAX_TOPIC_LENGTH:
        raise ConfigError(
            f"topic template {template[:40]!r}... has {len(fixed)} fixed characters; Kafka allows at "
            f"most {MAX_TOPIC_LENGTH} in a topic name"
        )
    if not fields:
        problem = topic_problem(template)
        if problem:
            raise ConfigError(f"topic template {template!r}: {problem}")


@dataclass(frozen=True, slots=True)
class Route:
    topic: str
    problem: str | None  # None when the topic may be used
    cause: str | None  # dead-letter cause code when problem is set


class TopicRouter:
    """Renders and checks topic names; results are cached per field combination, since
    a service has few aggregate types and this runs for every event."""

    def __init__(self, allowlist: tuple[str, ...] = ()):
        self._allowlist = allowlist
        self._cache: dict[tuple, Route] = {}

    def route(self, template: str, aggregate_type: str, type: str, schema: str, table: str) -> Route:
        key = (template, aggregate_type, type, schema, table)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        topic = template.format(aggregate_type=aggregate_type, type=type, schema=schema, table=table)
        problem = topic_problem(topic)
        cause = "illegal_topic" if problem else None
        if (
            problem is None
            and self._allowlist
            and not any(fnmatch.fnmatchcase(topic, pattern) for pattern in self._allowlist)
        ):
            problem = f"topic {topic!r} is not in the allowlist"
            cause = "topic_not_allowed"
        route = Route(topic, problem, cause)
        if len(self._cache) < 10_000:
            self._cache[key] = route
        return route
