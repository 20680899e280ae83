"""`cdc verify`, `cdc repair` and `cdc locate` on the RabbitMQ exchange sink, against a real
RabbitMQ 3.10 node: the verifier reads the audit stream (the record of what the exchange
routed) with its own `cdc_rabbitmq` source, each message as a record of the topic its routing
key names. Clean on a clean run; a run seeded through the real relay (a
publisher wrapper: one event acknowledged and never sent, one sent twice, one with its key
altered, one phantom with the identity of no committed insert) is reported with exactly
those four problems; `cdc repair` re-publishes exactly the missing one and the next verify
no longer reports it; `cdc locate` goes from a audit-stream offset to its binlog position and back.
After the audit stream's retention removed its start, the events whose messages went with it
are `unverifiable` (`partition_truncated`), whichever topic their routing key named, never
`missing` (which `cdc repair` would publish a second time): the audit stream is one stream
of every topic, so its truncation covers them all up to the first message of ours it still
holds (docs/verifier.md)."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_EVENT_ID, H_GTID, H_POS, H_REPAIR
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc_cli.app import build_relay
from cdc_cli.repair import load_missing, repair
from cdc_cli.verify_commands import sink_source_options, verify_config
from spark_jobs.rabbitmq.source import plan_rabbitmq, settings_from_options
from spark_jobs.verify import run_verify
from tests.integration.harness import OUTBOX_DDL, RelayThread, insert_events, wait_until
from tests.integration.rabbit_exchange import audit_messages, declare, exchange_raw_config
from tests.integration.rabbit_streams import rabbit_env

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class _SeedingPublisher:
    """Drops one event (acknowledged, never sent), sends one twice, alters one's key, and
    adds a phantom beside one."""

    def __init__(self, inner, drop: str, twice: str, alter: str, phantom_beside: str):
        self._inner = inner
        self._drop, self._twice, self._alter, self._phantom = drop, twice, alter, phantom_beside

    def publish(self, topic, key, value, headers, on_delivery, timestamp_ms=None):
        event_id = dict(headers).get(H_EVENT_ID, b"").decode()
        if event_id == self._drop:
            on_delivery(Delivery(topic, 0, 0))
            return
        if event_id == self._twice:
            self._inner.publish(topic, key, value, headers, lambda _d: None, timestamp_ms)
        if event_id == self._alter:
            key = b"tampered"
        if event_id == self._phantom:
            fake = {H_POS: b"4", H_GTID: b"0-1-999999", H_EVENT_ID: str(uuid.uuid4()).encode()}  # no such insert
            ghost = [(n, fake.get(n, v)) for n, v in headers]
            self._inner.publish(topic, key, value, ghost, lambda _d: None, timestamp_ms)
        self._inner.publish(topic, key, value, headers, on_delivery, timestamp_ms)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _events(n: int, prefix: str = "") -> list[tuple]:
    return [(str(uuid.uuid4()), "order", f"k{i % 5}", "Created", '{"n": %d}' % i) for i in range(n)]


def _write(mariadb, database, events) -> None:
    with mariadb.connect(database) as conn:
        for start in range(0, len(events), 10):
            insert_events(conn, "outbox", events[start : start + 10])
            conn.commit()


def _setup(mariadb, rabbitmq, database, topic_prefix, tmp_path):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    declare(rabbitmq, topic_prefix, audit_keys=["#"], queue_keys=["#"])
    raw = exchange_raw_config(mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json")
    return raw, load_config(raw, rabbit_env(mariadb, rabbitmq))


def test_verify_reads_the_audit_stream_and_a_clean_run_is_clean(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path, spark
):
    rabbitmq = rabbitmq_managed
    raw, cfg = _setup(mariadb, rabbitmq, database, topic_prefix, tmp_path)
    assert sink_source_options(cfg)["format"] == "cdc_rabbitmq"
    relay = RelayThread(cfg)
    _write(mariadb, database, _events(50))
    relay.wait_delivered(50, timeout=120)
    relay.stop()
    start_file = raw["source"]["start"].split(":")[0]
    report = run_verify(verify_config(cfg, str(tmp_path / "verify"), start_file=start_file), spark=spark)
    assert report.ok, report.problems
    assert report.counts["delivered"] == 50
    assert report.config["sink"] == "cdc_rabbitmq" and rabbitmq.password not in str(report.config)

    assert sink_source_options(cfg)["audit_stream"] == f"{topic_prefix}.audit"
    # cdc locate: the audit stream's offset of an event to its binlog position, and back
    from spark_jobs.locate import locate_offset, locate_position

    options = sink_source_options(cfg)
    found = locate_offset("", f"{topic_prefix}.order", 0, 7, sink=options)
    assert found is not None and found["offset"] == 7 and found["source"] == cfg.source.name
    hits = locate_position(
        "", [f"{topic_prefix}.order"], cfg.source.name, found["position"], found["row"], sink=options
    )
    assert hits == [(f"{topic_prefix}.order", 0, 7)]
    assert locate_offset("", f"{topic_prefix}.order", 0, 500, sink=options) is None


def test_seeded_problems_are_named_and_repair_republishes_exactly_the_missing(
    mariadb, rabbitmq_managed, database, topic_prefix, tmp_path, spark
):
    rabbitmq = rabbitmq_managed
    raw, cfg = _setup(mariadb, rabbitmq, database, topic_prefix, tmp_path)
    events = _events(60)
    drop, twice, alter, ghost = events[17][0], events[23][0], events[31][0], events[40][0]
    handle = build_relay(cfg, RelayMetrics())
    handle.relay._publisher = _SeedingPublisher(handle.relay._publisher, drop, twice, alter, ghost)
    stop = threading.Event()
    thread = threading.Thread(target=lambda: handle.relay.run(stop.is_set), daemon=True)
    thread.start()
    _write(mariadb, database, events)
    wait_until(lambda: handle.metrics.events_published >= 60, 120, "60 events acknowledged")
    stop.set()
    thread.join(60)
    handle.close()

    start_file = raw["source"]["start"].split(":")[0]
    out1 = tmp_path / "verify1"
    report = run_verify(verify_config(cfg, str(out1), start_file=start_file), spark=spark)
    assert report.problems == {"missing": 1, "duplicate": 1, "altered": 1, "phantom": 1}, report.problems
    missing = load_missing(str(out1))
    assert [m["event_id"] for m in missing] == [drop]

    result = repair(cfg, missing)
    assert (result.requested, result.published, result.already_present) == (1, 1, 0)
    repaired = [m for m in audit_messages(rabbitmq, topic_prefix) if H_REPAIR in dict(m.headers())]
    assert [dict(m.headers())[H_EVENT_ID].decode() for m in repaired] == [drop]

    report2 = run_verify(verify_config(cfg, str(tmp_path / "verify2"), start_file=start_file), spark=spark)
    assert report2.problems == {"duplicate": 1, "altered": 1, "phantom": 1}, report2.problems
    again = repair(cfg, missing)  # the same list once more: nothing is published twice
    assert (again.published, again.already_present) == (0, 1)


# Retention (https://www.rabbitmq.com/streams.html#retention): whole segments go, the oldest
# first, when a new one starts and the stream is over its limit. Small segments make it
# happen within a few hundred events.
SEGMENT_BYTES, MAX_BYTES = 20_000, 60_000


def _audit_low(cfg) -> int:
    """The first offset the audit stream still holds (the verifier's own planner)."""
    [part] = plan_rabbitmq(settings_from_options(sink_source_options(cfg)), [], 1.0)["partitions"]
    return int(part["low"])


def test_events_the_audit_streams_retention_removed_are_unverifiable_not_missing(
    mariadb, rabbitmq, database, topic_prefix, tmp_path, spark
):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    declare(rabbitmq, topic_prefix, audit_keys=["#"], queue_keys=["#"],
            audit_arguments={"x-max-length-bytes": MAX_BYTES, "x-stream-max-segment-size-bytes": SEGMENT_BYTES})  # fmt: skip
    raw = exchange_raw_config(mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json")
    cfg = load_config(raw, rabbit_env(mariadb, rabbitmq))
    relay = RelayThread(cfg)
    rng = random.Random(11)
    events = [(str(uuid.uuid4()), rng.choice(("order", "payment")), f"k{rng.randrange(20)}", "Happened",
               '{"n": %d, "pad": "%s"}' % (i, "x" * 200)) for i in range(600)]  # fmt: skip
    # A stream applies its retention when a segment rolls over, and a segment rolls over only
    # when a chunk is written after it is full; a chunk is whatever the node's writer has
    # received at once. Written all at once (the relay starting after the writes, catching
    # up in one hand-over), the 600 messages can land in one or two chunks: one segment, no
    # roll-over, nothing removed however long one waits (seen twice under the suite's load).
    # So the events go out in rounds of 50 (about 35 KB, more than a segment), each
    # delivered before the next is written: a dozen segments, whatever the timing.
    try:
        with mariadb.connect(database) as conn:
            for start in range(0, len(events), 5):
                insert_events(conn, "outbox", events[start : start + 5])
                conn.commit()
                if (start + 5) % 50 == 0:
                    relay.wait_delivered(start + 5, timeout=120)
        relay.wait_delivered(len(events), timeout=120)
    finally:
        relay.stop()
    # the retention runs in the node's own process, after the roll-over: a moment later
    deadline = time.monotonic() + 60
    while (low := _audit_low(cfg)) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert low > 0, "the audit stream's retention removed nothing: the test shows nothing"

    start_file = raw["source"]["start"].split(":")[0]
    rep = run_verify(verify_config(cfg, str(tmp_path / "v"), start_file=start_file), spark=spark)
    c = rep.counts
    assert c["missing"] == 0, (c, rep.summary.get("examples", {}).get("missing"))
    # the messages the retention removed (one event each, in binlog order) are the first
    # events: unverifiable; the rest delivered once
    assert c["unverifiable"] > 0 and c["delivered"] > 0 and c["unverifiable"] + c["delivered"] == len(events), c
    assert rep.summary["unverifiable_reasons"] == {"event:partition_truncated": c["unverifiable"]}
    assert c["duplicate"] == c["phantom"] == c["altered"] == 0 and rep.ok, rep.problems
