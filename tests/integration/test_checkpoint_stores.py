"""The Kafka checkpoint store against the stand-in: a save returns once acknowledged, a
load finds the source's own record, and a checkpoint of an older lease epoch appended
after a newer one (a relay that lost its lease) never wins."""

from __future__ import annotations

import pytest

from cdc.checkpoint import Checkpoint
from cdc.position import BinlogPosition
from connectors.checkpoint_stores import KafkaCheckpointStore

pytestmark = pytest.mark.integration


def _cp(source: str, pos: int, epoch: int) -> Checkpoint:
    return Checkpoint(source, BinlogPosition("mysql-bin.000001", pos), epoch=epoch, holder=f"h{epoch}")


def test_the_newest_epoch_wins_whatever_order_the_records_arrive_in(kafka, topic_prefix):
    topic = f"{topic_prefix}.checkpoints"
    kafka.create_topic(topic, 1)
    store = KafkaCheckpointStore(kafka.bootstrap_servers, topic, "shop")
    other = KafkaCheckpointStore(kafka.bootstrap_servers, topic, "other")
    assert store.load() is None
    store.save(_cp("shop", 100, 1))
    store.save(_cp("shop", 200, 2))  # a successor took over
    store.save(_cp("shop", 150, 1))  # the fenced relay's late write
    other.save(_cp("other", 999, 7))
    got = store.load()
    assert (got.position.pos, got.epoch, got.holder) == (200, 2, "h2")
    store.save(_cp("shop", 300, 2))
    assert store.load().position.pos == 300
    assert other.load().position.pos == 999
