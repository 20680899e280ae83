"""The verifier's HTML report: every plot names its axes and their units, and "what was
read" is tables, not a JSON dump."""

import re

from spark_jobs.report import VerifyReport, html_tables, render_html

COUNTS = {
    c: 0
    for c in ("delivered", "missing", "duplicate", "phantom", "reordered", "altered", "dead_lettered", "unverifiable")
}


def _report() -> VerifyReport:
    summary = {
        "counts": {**COUNTS, "delivered": 3},
        "examples": {},
        "latency": {
            "count": 3,
            "p50_ms": 5,
            "p95_ms": 9,
            "p99_ms": 9,
            "max_ms": 9,
            "note": "commit time: outbox created_at",
            "histogram": {"bin_width_ms": 2, "bins": [{"from_ms": 1, "count": 1}, {"from_ms": 5, "count": 2}]},
            "lag_over_time": {
                "bucket_seconds": 1,
                "points": [
                    {"commit_second": 1_764_000_000, "max_latency_ms": 3},
                    {"commit_second": 1_764_000_001, "max_latency_ms": 9},
                ],
            },
        },
        "follow": {
            "batches": 4,
            "lag_history": [{"t": 1_764_000_000, "lag_s": 2.5}, {"t": 1_764_000_002, "lag_s": 1.0}],
        },
    }
    inputs = {
        "binlog": {
            "server": "127.0.0.1:3306",
            "files": [{"file": "mysql-bin.000001", "start": 4, "end": 900, "events": 3}],
        },
        "kafka": {
            "bootstrap": "k:9092",
            "dlq_topic_present": True,
            "requested_topics_absent": [],
            "partitions": [{"topic": "shop.order", "partition": 0, "records_read": 3, "first_offset_read": None}],
        },
    }
    return VerifyReport(summary=summary, inputs=inputs, config={})


def test_every_plot_names_its_axes_with_units():
    page = render_html(_report())
    plots = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(plots) == 4  # classes, latency histogram, latency over time, verified-through lag

    def plot(title: str) -> str:
        (found,) = [p for p in plots if f'aria-label="{title}' in p]
        return found

    classes, histogram = plot("events and records by class"), plot("latency commit -&gt; broker")
    latency, lag = plot("max latency per"), plot("verified-through lag")
    assert "events or records" in classes
    assert "latency (ms)" in histogram and "deliveries" in histogram
    assert "commit time (UTC)" in latency and "max latency (ms)" in latency
    assert "wall-clock time (UTC)" in lag and "lag (s)" in lag


def test_what_was_read_is_tables():
    page = render_html(_report())
    section = page.split("<h2>What was read</h2>", 1)[1]
    assert "<pre>" not in section and "{" not in section.split("</body>")[0]
    assert "<th>file</th>" in section and "<td>mysql-bin.000001</td>" in section  # a list of files: one table
    assert "<th>records_read</th>" in section and "<td>shop.order</td>" in section
    assert "<th>dlq_topic_present</th><td>yes</td>" in section
    assert "<th>requested_topics_absent</th><td><em>none</em></td>" in section


def test_values_are_escaped():
    assert html_tables({"a<b": ["x&y", None]}) == "<table><tr><th>a&lt;b</th><td>x&amp;y, -</td></tr></table>"
