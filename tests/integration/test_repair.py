"""`cdc repair` after a seeded drop: verify finds exactly the dropped event, repair
re-publishes it (marked `cdc.repair`), a second verify is clean, and a second repair
publishes nothing (idempotent).

The drop is seeded through the real relay: a publisher wrapper acknowledges one event
to the relay without sending it, as a broker that lost an acknowledged message would."""

from __future__ import annotations

import threading
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_EVENT_ID, H_REPAIR
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc_cli.app import build_relay
from cdc_cli.repair import load_missing, repair
from cdc_cli.verify_commands import verify_config
from spark_jobs.verify import run_verify
from tests.integration.harness import OUTBOX_DDL, env_for, insert_events, read_topic, relay_raw_config, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class _DroppingPublisher:
    def __init__(self, inner, drop_event_id: str):
        self._inner, self._drop = inner, drop_event_id
        self.dropped = 0

    def publish(self, topic, key, value, headers, on_delivery, timestamp_ms=None):
        if dict(headers).get(H_EVENT_ID, b"").decode() == self._drop:
            self.dropped += 1
            # "acknowledged" at an offset, never written (a broker that lost it; an acknowledgement
            # without an offset the relay would look for in the partition, and resend)
            on_delivery(Delivery(topic, 0, 0))
            return
        self._inner.publish(topic, key, value, headers, on_delivery, timestamp_ms)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_repair_after_a_seeded_drop_then_verify_is_clean(mariadb, kafka, database, topic_prefix, tmp_path, spark):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    kafka.create_topic(f"{topic_prefix}.order", 3)
    kafka.create_topic(f"{topic_prefix}.dlq", 1)
    raw = relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")
    cfg = load_config(raw, env_for(mariadb))
    events = [(str(uuid.uuid4()), "order", f"k{n % 5}", "Created", '{"n": %d}' % n) for n in range(60)]
    dropped_id = events[17][0]
    handle = build_relay(cfg, RelayMetrics())
    dropper = _DroppingPublisher(handle.relay._publisher, dropped_id)
    handle.relay._publisher = dropper
    stop = threading.Event()
    thread = threading.Thread(target=lambda: handle.relay.run(stop.is_set), daemon=True)
    thread.start()
    with mariadb.connect(database) as conn:
        for start in range(0, 60, 10):
            insert_events(conn, "outbox", events[start : start + 10])
            conn.commit()
    wait_until(lambda: handle.metrics.events_published >= 60, 60, "60 events acknowledged")
    stop.set()
    thread.join(60)
    handle.close()
    assert dropper.dropped == 1

    from spark_jobs.session import register_sources

    register_sources(spark)
    start_file = raw["source"]["start"].split(":")[0]
    out1 = tmp_path / "verify1"
    report = run_verify(verify_config(cfg, str(out1), start_file=start_file), spark=spark)
    assert not report.ok
    assert report.problems == {"missing": 1}, report.problems
    missing = load_missing(str(out1))
    assert [m["event_id"] for m in missing] == [dropped_id]

    result = repair(cfg, missing)
    assert (result.requested, result.published, result.already_present) == (1, 1, 0)
    records = read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")
    repaired = [r for r in records if H_REPAIR in r.headers]
    assert [r.headers[H_EVENT_ID] for r in repaired] == [dropped_id]
    assert repaired[0].value["id"] == dropped_id and repaired[0].key == events[17][2]

    report2 = run_verify(verify_config(cfg, str(tmp_path / "verify2"), start_file=start_file), spark=spark)
    assert report2.ok, report2.problems
    assert report2.counts["delivered"] == 60

    again = repair(cfg, missing)  # the same list once more: nothing is published twice
    assert (again.published, again.already_present) == (0, 1)
    assert len(read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")) == 60
