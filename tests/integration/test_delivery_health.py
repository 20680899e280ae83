"""Issue 17: a Kafka outage is visible. The stand-in's brokers go down for 30 s while
events are written: `/readyz` turns not ready with the reason within the configured
bound, the metrics show the backlog, the relay logs exactly one "unreachable" and one
"reachable again" line of its own, librdkafka's lines are rate-limited, and every event
is delivered once after the brokers return (the independent checker)."""

from __future__ import annotations

import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import RelayProcess, env_for, relay_raw_config, wait_until
from tests.integration.independent_checker import check, committed_outbox_events, topic_records
from tests.integration.test_faults import Writer, _checkpoint_reached, _server_end, _setup

pytestmark = [pytest.mark.integration, pytest.mark.fault]

BOUND = 5.0  # relay.max_unacknowledged_age_s
OUTAGE = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""  # not serving yet


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_a_kafka_outage_is_visible_logged_once_and_loses_nothing(mariadb, database, topic_prefix, tmp_path):
    from testbed.kafka_standin import KafkaStandin

    port = _free_port()
    with KafkaStandin.start(brokers=3, group_initial_rebalance_delay_ms=0) as kafka:
        topics = _setup(mariadb, kafka, database, topic_prefix, partitions=3)
        raw = relay_raw_config(
            mariadb,
            kafka,
            database,
            topic_prefix,
            tmp_path / "cp.json",
            http={"port": port},
            relay={"max_unacknowledged_age_s": BOUND},
        )
        start = raw["source"]["start"]
        base = f"http://127.0.0.1:{port}"
        writer = Writer(lambda: mariadb.connect(database), 3000, pause_s=0.02, xa=0.0)
        relay = RelayProcess(raw, env_for(mariadb), tmp_path / "relay")
        try:
            writer.start()
            wait_until(
                lambda: (
                    "role: active" in _get(base + "/readyz")[1]
                    and _metric(_get(base + "/metrics")[1], "cdc_events_published_total") > 0
                ),
                60,
                "the relay to publish",
            )
            assert _get(base + "/readyz")[0] == 200
            assert _metric(_get(base + "/metrics")[1], "cdc_kafka_reachable") == 1
            for broker in (1, 2, 3):
                kafka.broker_down(broker)
            down_at = time.monotonic()
            _status, body = wait_until(
                lambda: (lambda r: r if r[0] == 503 else None)(_get(base + "/readyz")),
                BOUND + 15,
                "/readyz to turn not ready",
            )
            noticed = time.monotonic() - down_at
            assert "reason: the oldest unacknowledged message was handed to Kafka" in body, body
            assert "relay.max_unacknowledged_age_s = 5" in body, body
            metrics = _get(base + "/metrics")[1]
            assert _metric(metrics, "cdc_unacknowledged_age_seconds") > BOUND
            assert _metric(metrics, "cdc_ready") == 0
            wait_until(
                lambda: _metric(_get(base + "/metrics")[1], "cdc_kafka_reachable") == 0,
                OUTAGE,
                "cdc_kafka_reachable to say 0",
            )
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - down_at)))  # the fault's duration
            for broker in (1, 2, 3):
                kafka.broker_up(broker)
            up_at = time.monotonic()
            wait_until(lambda: _get(base + "/readyz")[0] == 200, 60, "/readyz to be ready again")
            recovered = time.monotonic() - up_at
            writer.finish()
            end = _server_end(mariadb)
            wait_until(
                lambda: _checkpoint_reached(Path(raw["checkpoint"]["path"]), end),
                120,
                "the relay to deliver everything",
            )
            assert _metric(_get(base + "/metrics")[1], "cdc_kafka_outages_total") == 1
            assert relay.terminate() == 0
        finally:
            writer.stop_flag.set()
            if relay.alive():
                relay.kill()
        log = relay.log_text()
        own_down = [line for line in log.splitlines() if "Kafka unreachable: no broker of" in line]
        own_up = [line for line in log.splitlines() if "Kafka reachable again after" in line]
        librdkafka = [line for line in log.splitlines() if " cdc.kafka: " in line]
        assert len(own_down) == 1 and len(own_up) == 1, log[-5000:]
        assert kafka.bootstrap_servers in own_down[0] and "kafka.bootstrap" in own_down[0]
        assert not [line for line in log.splitlines() if line.startswith("%")], "librdkafka printed to stderr itself"
        assert len(librdkafka) <= 40, f"{len(librdkafka)} librdkafka lines: not rate-limited"
        file, pos = start.split(":")
        committed = committed_outbox_events(
            mariadb.connection_settings(), database, start_file=file, start_pos=int(pos)
        )
        result = check(committed, topic_records(kafka.bootstrap_servers, topics), [])
    print(
        f"\nKafka down {OUTAGE:.0f} s: /readyz not ready after {noticed:.1f} s (bound {BOUND:g} s), ready again "
        f"{recovered:.1f} s after the brokers returned; relay lines: 1 unreachable, 1 reachable again; librdkafka "
        f"lines after rate-limiting: {len(librdkafka)}; {result.summary()}"
    )
    assert result.committed > 0 and result.clean, result.summary()
