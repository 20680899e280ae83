"""Topics that do not exist (`topics.missing`, docs/production.md "Topics that do not exist").

Before the first message to a topic the hand-over asks here whether it exists (Kafka's
metadata). When it does not, the event is dead-lettered with cause `topic_missing` and
one log line names the topic to create ("dead_letter"), or the topic is created through
the `TopicAdmin` port first ("create"; a refused creation dead-letters as above); the
topic is asked about again after `topic_recheck_s`, and the other topics go on. A
message Kafka refuses for a missing topic anyway (deleted meanwhile; "auto" with brokers
that do not create topics) is dead-lettered the same way (`gone`), as a message too
large is. With "auto" nothing is asked: the brokers create topics on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdc.delivery.topic_metadata import TopicMetadata
from cdc.ports import TopicAdmin
from cdc.relay_settings import RelaySettings

# The relay's lines keep the relay's logger name: operators filter on it.
log = logging.getLogger("cdc.relay")


class MissingTopics:
    def __init__(
        self,
        settings: RelaySettings,
        metadata: TopicMetadata,
        admin: TopicAdmin | None,
        monotonic: Callable[[], float],
    ):
        self._settings = settings
        self._metadata = metadata
        self._admin = admin  # creates a missing topic (topics.missing = "create")
        self._monotonic = monotonic
        self.absent: dict[str, tuple[float, str]] = {}  # topic -> (ask again after (monotonic), why)

    def reason(self, topic: str) -> str | None:
        """None when `topic` exists (or may be created by the brokers: "auto"), else why
        not, for the dead letter. Asked of Kafka's metadata before the first message to
        a topic, and again `topic_recheck_s` after it was found missing."""
        settings = self._settings
        known = self.absent.get(topic)
        now = self._monotonic()
        if known is not None and now < known[0]:
            return known[1]  # found missing (or refused by Kafka) less than topic_recheck_s ago
        if settings.topic_missing == "auto" or (
            topic == settings.dead_letter_topic and settings.topic_missing != "create"
        ):
            self.absent.pop(topic, None)
            return None
        count = self._metadata.partition_count(topic)
        if count:
            if known is not None:
                log.info("topic %r exists now: its events are published again", topic)
                del self.absent[topic]
            return None
        if settings.topic_missing == "create" and self._admin is not None:
            refused = self._admin.create_topic(topic)
            if refused is None:
                log.info('created topic %r (topics.missing = "create")', topic)
                self.absent.pop(topic, None)
                return None
            why = f"topic {topic!r} does not exist and could not be created: {refused}"
        else:
            why = (
                f'topic {topic!r} does not exist (topics.missing = "dead_letter"): create it, e.g. '
                f'kafka-topics.sh --create --topic {topic}, or set topics.missing = "create"'
            )
        self.absent[topic] = (now + settings.topic_recheck_s, why)
        if known is None:
            log.warning(
                "%s; its events are dead-lettered to %s (cause topic_missing) until it exists, the other topics go on",
                why,
                settings.dead_letter_topic,
            )
        return why

    def gone(self, topic: str, error: str) -> str:
        """Kafka refused a message because `topic` does not exist: later events for it are
        dead-lettered at once until a metadata check finds it."""
        why = (
            f"topic {topic!r} does not exist ({error}): create it, e.g. kafka-topics.sh --create --topic {topic}, "
            'or set topics.missing = "create"'
        )
        if topic not in self.absent:
            log.warning(
                "%s; its events are dead-lettered to %s (cause topic_missing) until it exists",
                why,
                self._settings.dead_letter_topic,
            )
        self.absent[topic] = (self._monotonic() + self._settings.topic_recheck_s, why)
        return why
