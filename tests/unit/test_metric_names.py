"""What `/metrics` serves, read through the same registry without a server: Prometheus
naming (units last, counters `_total`), no sentinel value for "unknown" (the series is
absent instead), the feed's counters exported, the commit -> acknowledgement histogram,
and the process's own metrics."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from cdc.metrics import RelayMetrics
from connectors.http_endpoint import metrics_registry

UNITS = ("seconds", "bytes")


def _text(m: RelayMetrics) -> str:
    return generate_latest(metrics_registry(m, "shop")).decode()


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels] = float(value)
    return out


def test_units_come_last_and_no_series_says_unknown_with_minus_one():
    m = RelayMetrics()
    text = _text(m)
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE cdc_")}
    assert names, text
    for name in names:
        words = name.removesuffix("_total").split("_")
        for unit in UNITS:
            if unit in words:  # a unit is the last word (before _total / a histogram's suffixes)
                assert words[-1] == unit, name
    assert all(value != -1 for value in _samples(text).values()), text
    # unknown yet: absent, not -1
    for absent in ("cdc_binlog_behind_bytes", "cdc_kafka_brokers_up", "cdc_lease_confirmed_age_seconds"):
        assert not re.search(rf"^{absent}\{{", text, re.M), absent


def test_known_values_are_exported_under_their_names():
    m = RelayMetrics(
        server_end_bytes_behind=4096,
        kafka_brokers_up=3,
        outbox_changes_ignored=2,
        rows_discarded=7,
        bytes_published=100,
    )
    m.lease_held, m.lease_confirmed_at = True, 1.0
    samples = _samples(_text(m))
    assert samples['cdc_binlog_behind_bytes{source="shop"}'] == 4096
    assert samples['cdc_kafka_brokers_up{source="shop"}'] == 3
    assert samples['cdc_outbox_changes_ignored_total{source="shop"}'] == 2
    assert samples['cdc_rows_discarded_total{source="shop"}'] == 7
    assert samples['cdc_published_bytes_total{source="shop"}'] == 100
    assert 'cdc_lease_confirmed_age_seconds{source="shop"}' in samples


def test_commit_to_acknowledgement_histogram():
    m = RelayMetrics()
    for latency in (0.2, 0.7, 3.0, 1000.0):
        m.commit_to_ack.observe(latency)
    samples = _samples(_text(m))
    name = "cdc_commit_to_acknowledgement_seconds"
    assert samples[f'{name}_bucket{{le="0.5",source="shop"}}'] == 1
    assert samples[f'{name}_bucket{{le="1.0",source="shop"}}'] == 2
    assert samples[f'{name}_bucket{{le="5.0",source="shop"}}'] == 3
    assert samples[f'{name}_bucket{{le="+Inf",source="shop"}}'] == 4
    assert samples[f'{name}_count{{source="shop"}}'] == 4
    assert abs(samples[f'{name}_sum{{source="shop"}}'] - 1003.9) < 1e-9


def test_process_metrics_are_served():
    text = _text(RelayMetrics())
    assert re.search(r"^process_cpu_seconds_total \S+$", text, re.M), text
    assert re.search(r"^process_resident_memory_bytes \S+$", text, re.M), text
