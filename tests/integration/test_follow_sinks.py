"""`cdc verify --follow --repair` on every sink (Kafka, RabbitMQ Streams, the RabbitMQ
exchange sink's audit stream, NATS JetStream), as an operator runs it (`python -m
cdc_cli.main verify --follow --repair`, a process of its own) beside a relay on mariadbd and
the sink's real server (the Kafka stand-in, a RabbitMQ 3.10 node, a nats-server): an event
the relay acknowledged and never published, a second copy of a delivered one and a record
claiming a transaction the binlog never had are named by their alarms and counted exactly
once each (0 other problems, 0 false alarms); the job is SIGKILLed mid-stream and resumes
from its checkpoint with exact counts. The missing event is behind the relay's checkpoint
(the relay took the acknowledgement and moved on): after its missing alarm it is
re-published through the repair path (`cdc repair`), comes back once (one copy in the
broker, with `cdc.repair`) and is counted `repaired`."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_EVENT_ID, H_GTID, H_POS, H_REPAIR
from cdc.events.sink_fields import H_KEY
from cdc.metrics import RelayMetrics
from cdc.ports import Delivery
from cdc_cli.app import build_relay
from tests.integration.harness import (
    OUTBOX_DDL,
    ROOT,
    _to_toml,
    env_for,
    insert_events,
    read_topic,
    relay_raw_config,
    wait_until,
)  # fmt: skip
from tests.integration.test_follow import _free_port, _metrics

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _phantom_headers(headers):
    """A record claiming a transaction the binlog does not hold: inside the real one's
    bytes (after the follow job's start, so it is judged, not unverifiable), another GTID."""
    pos = int(dict(headers)[H_POS]) + 1
    fake = {H_POS: str(pos).encode(), H_GTID: b"0-1-999999", H_EVENT_ID: str(uuid.uuid4()).encode()}
    return [(n, fake.get(n, v)) for n, v in headers]


class _SeedingPublisher:
    """Acknowledges `drop` without sending it; on Kafka and RabbitMQ also sends `twice`
    twice and a phantom beside `phantom` (on JetStream the relay's `Nats-Msg-Id` would
    de-duplicate a second copy: the test publishes those itself)."""

    def __init__(self, inner, drop: str, twice: str | None = None, phantom: str | None = None):
        self._inner, self._drop, self._twice, self._phantom = inner, drop, twice, phantom

    def publish(self, topic, key, value, headers, on_delivery, timestamp_ms=None):
        event_id = dict(headers).get(H_EVENT_ID, b"").decode()
        if event_id == self._drop:
            on_delivery(Delivery(topic, 0, 0))
            return
        if event_id == self._twice:
            self._inner.publish(topic, key, value, headers, lambda _d: None, timestamp_ms)
        if event_id == self._phantom:
            self._inner.publish(topic, key, value, _phantom_headers(headers), lambda _d: None, timestamp_ms)
        self._inner.publish(topic, key, value, headers, on_delivery, timestamp_ms)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Relay:
    def __init__(self, cfg, publisher_wrapper):
        self.handle = build_relay(cfg, RelayMetrics())
        self.handle.relay._publisher = publisher_wrapper(self.handle.relay._publisher)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=lambda: self.handle.relay.run(self._stop.is_set), daemon=True)
        self.thread.start()

    def stop(self):
        self._stop.set()
        self.thread.join(60)
        self.handle.close()


def _events(n: int) -> list[tuple]:
    return [(str(uuid.uuid4()), "order", f"k{i % 5}", "Created", '{"n": %d}' % i) for i in range(n)]


def _write(mariadb, database, events) -> None:
    with mariadb.connect(database) as conn:
        for start in range(0, len(events), 5):
            insert_events(conn, "outbox", events[start : start + 5])
            conn.commit()


def _rabbit_world(mariadb, rabbitmq, database, prefix, tmp_path):
    from tests.integration.rabbit_streams import create_topic, rabbit_env, rabbit_raw_config

    create_topic(rabbitmq, f"{prefix}.order")
    create_topic(rabbitmq, f"{prefix}.dlq")
    raw = rabbit_raw_config(mariadb, rabbitmq, database, prefix, tmp_path / "cp.json", topics__missing="dead_letter")
    return raw, rabbit_env(mariadb, rabbitmq)


def _kafka_world(mariadb, kafka, database, prefix, tmp_path):
    kafka.create_topic(f"{prefix}.order", 3)
    kafka.create_topic(f"{prefix}.dlq", 1)
    return relay_raw_config(mariadb, kafka, database, prefix, tmp_path / "cp.json"), env_for(mariadb)


def _noida_world(mariadb, noida, database, prefix, tmp_path):
    """Kafka on noida-db (a broker with transactions and Kafka's own topic creation), read
    by the verifier within noida-db's fetch limit (testbed/noida.py)."""
    from testbed.noida import CONSUMER_SETTINGS

    raw, env = _kafka_world(mariadb, noida, database, prefix, tmp_path)
    raw["kafka"]["consumer"] = dict(CONSUMER_SETTINGS)
    return raw, env


def _exchange_world(mariadb, rabbitmq, database, prefix, tmp_path):
    """The exchange, its audit stream bound with `#` (what `cdc verify` reads) and a
    consumer's queue beside it."""
    from tests.integration.rabbit_exchange import declare, exchange_raw_config
    from tests.integration.rabbit_streams import rabbit_env

    declare(rabbitmq, prefix, audit_keys=["#"], queue_keys=["#"])
    raw = exchange_raw_config(mariadb, rabbitmq, database, prefix, tmp_path / "cp.json")
    return raw, rabbit_env(mariadb, rabbitmq)


def _held_headers(sink: str, server, prefix: str) -> list[dict]:
    """The headers (as text) of every record `<prefix>.order` holds, read back by the
    verifier's own batch readers (the Kafka test reader on Kafka)."""
    topic = f"{prefix}.order"
    if sink.startswith("kafka"):
        return [dict(r.headers) for r in read_topic(server.bootstrap_servers, topic)]
    if sink == "rabbitmq_stream":
        from tests.integration.rabbit_streams import stream_messages

        records = stream_messages(server, [topic])
    elif sink == "rabbitmq_exchange":
        from tests.integration.rabbit_exchange import audit_messages

        records = [r for r in audit_messages(server, prefix) if r.topic() == topic]
    else:
        from spark_jobs.nats.source import plan_nats, read_range

        settings = server.connect_settings()
        [part] = plan_nats(settings, [topic])["partitions"]
        records = list(read_range(settings, topic, part["stream"], part["low"], part["high"]))
    return [{n: (v.decode() if isinstance(v, bytes) else v) for n, v in rec.headers()} for rec in records]


def _copies(sink: str, server, prefix: str, event_id: str) -> list[dict]:
    """The headers of every record of `event_id` the sink holds."""
    return [h for h in _held_headers(sink, server, prefix) if h.get(H_EVENT_ID) == event_id]


def _nats_world(mariadb, nats_server, database, prefix, tmp_path):
    from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config

    create_streams(nats_server, {f"{prefix}_events": [f"{prefix}.order"], f"{prefix}_dlq": [f"{prefix}.dlq"]})
    raw = nats_raw_config(mariadb, nats_server, database, prefix, tmp_path / "cp.json")
    return raw, nats_env(mariadb, nats_server)


def _nats_copies(nats_server, subject: str, twice: str, phantom: str) -> None:
    """A second copy of `twice` and a phantom beside `phantom`, published as they are read
    (headers and key; no `Nats-Msg-Id`, so JetStream stores them)."""
    import nats

    from spark_jobs.nats.source import plan_nats, read_range

    settings = nats_server.connect_settings()
    [part] = plan_nats(settings, [subject])["partitions"]
    recs = {dict(r.headers())[H_EVENT_ID].decode(): r for r in read_range(settings, subject, part["stream"],
                                                                           part["low"], part["high"])}  # fmt: skip

    def copy(rec, headers):
        out = {k: v.decode() for k, v in headers}
        return {**out, H_KEY: rec.key().decode()} if rec.key() is not None else out

    async def run() -> None:
        nc = await nats.connect(**settings)
        try:
            js = nc.jetstream()
            await js.publish(subject, recs[twice].value(), headers=copy(recs[twice], recs[twice].headers()))
            rec = recs[phantom]
            await js.publish(subject, rec.value(), headers=copy(rec, _phantom_headers(rec.headers())))
        finally:
            await nc.close()

    asyncio.run(run())


@pytest.mark.parametrize("sink", ["kafka", "kafka_noida", "rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream"])
def test_follow_names_seeded_problems_repairs_and_resumes_after_sigkill(sink, request, mariadb, database,
                                                                       topic_prefix, tmp_path):  # fmt: skip
    prefix = topic_prefix
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    worlds = {"kafka": ("kafka", _kafka_world), "kafka_noida": ("noida_kafka", _noida_world),
              "rabbitmq_stream": ("rabbitmq", _rabbit_world), "rabbitmq_exchange": ("rabbitmq", _exchange_world),
              "nats_jetstream": ("nats_server", _nats_world)}  # fmt: skip
    fixture, make_world = worlds[sink]
    server = request.getfixturevalue(fixture)
    raw, env_extra = make_world(mariadb, server, database, prefix, tmp_path)
    cfg = load_config(raw, env_extra)
    config_path = tmp_path / "relay.toml"
    config_path.write_text(_to_toml(raw))
    env = {**os.environ, **env_extra}
    out, port = tmp_path / "out", _free_port()
    first, second = _events(30), _events(30)
    drop, twice, phantom = first[7][0], first[12][0], first[20][0]
    on_nats = sink == "nats_jetstream"
    relay = _Relay(cfg, lambda inner: _SeedingPublisher(inner, drop, None if on_nats else twice,
                                                        None if on_nats else phantom))  # fmt: skip

    def start(log):
        # --repair through the command line: the dropped event is behind the relay's
        # checkpoint, so after its missing alarm it is re-published (`cdc repair`'s path)
        return subprocess.Popen(
            [sys.executable, "-m", "cdc_cli.main", "verify", "--config", str(config_path), "--follow", "--master",
             "local[2]", "--output-dir", str(out), "--grace", "5", "--trigger", "1", "--metrics-port", str(port),
             "--report-every", "2", "--repair", "--repair-every", "1"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    logs = [open(tmp_path / "follow1.log", "wb"), open(tmp_path / "follow2.log", "wb")]
    proc = start(logs[0])
    delivered = 'cdc_verify_events{class="delivered"}'
    try:
        wait_until(lambda: _metrics(port), 120, "the follow job's metrics endpoint (it has taken its start)")
        _write(mariadb, database, first)
        wait_until(lambda: relay.handle.metrics.events_published >= 30, 60, "the first 30 events acknowledged")
        if on_nats:
            _nats_copies(server, f"{prefix}.order", twice, phantom)
        wait_until(lambda: _metrics(port).get(delivered, 0) >= 10, 120, "the first verified events")
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Python workers, mid-stream
        proc.wait(30)
        proc = start(logs[1])
        _write(mariadb, database, second)
        # classes are exclusive: the duplicated event counts as duplicate, not delivered
        wait_until(lambda: _metrics(port).get(delivered, 0) >= 58, 180, "58 events verified after the restart")
        repaired = 'cdc_verify_events{class="repaired"}'
        wait_until(lambda: _metrics(port).get(repaired, 0) >= 1, 60, "the missing one repaired")
        import time

        time.sleep(7)  # past the grace period: nothing else may turn up
        m = _metrics(port)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for f in logs:
            f.close()
        relay.stop()
    text = (tmp_path / "follow1.log").read_text() + (tmp_path / "follow2.log").read_text()
    assert code == 3, text[-3000:]  # problems found
    assert "Traceback" not in text, text[-3000:]
    assert "resuming from checkpoint" in text
    counts = {c: m[f'cdc_verify_events{{class="{c}"}}'] for c in ("delivered", "missing", "repaired", "duplicate",
                                                                   "phantom", "unverifiable", "altered", "reordered")}  # fmt: skip
    assert counts == {"delivered": 58, "missing": 0, "repaired": 1, "duplicate": 1, "phantom": 1,
                      "unverifiable": 0, "altered": 0, "reordered": 0}, (counts, text[-3000:])  # fmt: skip
    alarms = [ln for ln in text.splitlines() if "ALARM" in ln]
    # each injected problem named once, nothing else (an alarm line of a micro-batch re-run
    # after the SIGKILL may be logged again: counted by the event it names)
    assert {m.group(1) for m in map(re.compile(r"ALARM (\w+)").search, alarms) if m} == {
        "missing", "duplicate", "phantom"}, alarms  # fmt: skip
    assert any(drop in ln for ln in alarms if "ALARM missing" in ln), alarms  # named first, then repaired
    assert not any("ALARM missing" in ln and drop not in ln for ln in alarms), alarms
    assert any("ALARM duplicate" in ln for ln in alarms), alarms
    assert any("ALARM phantom" in ln and f"{prefix}.order[" in ln for ln in alarms), alarms
    assert m["cdc_verify_repaired_total"] == 1 and m["cdc_verify_repair_failed_total"] == 0, m
    assert any("REPAIRED" in ln for ln in text.splitlines()), text[-3000:]
    # it came back once: the one copy the broker holds is the repair's
    copies = _copies(sink, server, prefix, drop)
    assert len(copies) == 1 and copies[0].get(H_REPAIR) == "1", copies
    password = getattr(server, "password", None) or "\0"
    assert password not in text + (out / "report.json").read_text()
    assert (mariadb.password or "\0") not in text
