"""`cdc verify`, `cdc repair` and `cdc locate` on the RabbitMQ Streams sink, against a real
RabbitMQ 3.10 node: the verifier reads the streams with its own `cdc_rabbitmq` source (chosen
by the config's `sink.kind`). Clean on a clean run; a run seeded through the real relay (a
publisher wrapper: one event acknowledged and never sent, one sent twice, one with its key
altered, one phantom with the identity of no committed insert) is reported with exactly
those four problems; `cdc repair` re-publishes exactly the missing one and the next verify
no longer reports it; `cdc locate` goes from a stream offset to its binlog position and back."""

from __future__ import annotations

import threading
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_EVENT_ID, H_GTID, H_POS, H_REPAIR
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc_cli.app import build_relay
from cdc_cli.repair import load_missing, repair
from cdc_cli.verify_commands import sink_source_options, verify_config
from spark_jobs.verify import run_verify
from tests.integration.harness import OUTBOX_DDL, RelayThread, insert_events, wait_until
from tests.integration.rabbit_streams import create_topic, rabbit_env, rabbit_raw_config, stream_messages

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
    create_topic(rabbitmq, f"{topic_prefix}.order")
    raw = rabbit_raw_config(
        mariadb, rabbitmq, database, topic_prefix, tmp_path / "cp.json", topics__missing="dead_letter"
    )
    return raw, load_config(raw, rabbit_env(mariadb, rabbitmq))


def test_verify_chooses_the_rabbitmq_source_and_a_clean_run_is_clean(
    mariadb, rabbitmq, database, topic_prefix, tmp_path, spark
):
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
    # the report names the sink it read (kind, address, streams), not Kafka's inputs
    assert "kafka" not in report.inputs and "kafka_bootstrap" not in report.config
    sink = report.inputs["sink"]
    assert sink["kind"] == "rabbitmq_stream" and sink["address"] == f"127.0.0.1:{rabbitmq.stream_port}"
    assert sink["streams"] and rabbitmq.password not in str(report.inputs)

    # cdc locate: the stream offset of an event to its binlog position, and back
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
    mariadb, rabbitmq, database, topic_prefix, tmp_path, spark
):
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
    repaired = [m for m in stream_messages(rabbitmq, [f"{topic_prefix}.order"]) if H_REPAIR in dict(m.headers())]
    assert [dict(m.headers())[H_EVENT_ID].decode() for m in repaired] == [drop]

    report2 = run_verify(verify_config(cfg, str(tmp_path / "verify2"), start_file=start_file), spark=spark)
    assert report2.problems == {"duplicate": 1, "altered": 1, "phantom": 1}, report2.problems
    again = repair(cfg, missing)  # the same list once more: nothing is published twice
    assert (again.published, again.already_present) == (0, 1)
