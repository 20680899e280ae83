"""What the following verifier's report shows of its problems and its latency: a duplicate's
example names the event (id and key, as the batch verifier's does), and the "max latency
per second of commit time" plot has points (it said "no data" in every following run)."""

from __future__ import annotations

from spark_jobs.follow import follow_summary
from spark_jobs.report import VerifyReport, render_html, summary_text
from tests.unit.test_follow_state import F1, ev, progress, rec, state


def test_a_duplicate_example_names_the_event_id_and_key() -> None:
    st = state()
    a = ev(100, agg="order-7")
    st.apply_batch(0, [a, progress(200)], [rec(a, 0), rec(a, 1)], now=0.0)
    (ex,) = follow_summary(st, 0.0, None)["examples"]["duplicate"]
    assert ex["event_id"] == a["event_id"] and ex["aggregate_id"] == "order-7"
    text = summary_text(VerifyReport(summary=follow_summary(st, 0.0, None), inputs={}, config={}))
    assert f"id={a['event_id']} key=order-7" in text


def test_the_latency_over_commit_time_plot_has_a_point_per_commit_second() -> None:
    st = state()
    a, b, c = ev(100, commit_ts_ms=1_000_000), ev(150, commit_ts_ms=1_000_000), ev(170, commit_ts_ms=1_002_000)
    recs = [rec(a, 0, timestamp_ms=1_000_300), rec(b, 1, timestamp_ms=1_000_700), rec(c, 2, timestamp_ms=1_002_100)]
    st.apply_batch(0, [a, b, c, progress(200)], recs, now=0.0)
    summary = follow_summary(st, 0.0, (F1, 1, 200))
    lag = summary["latency"]["lag_over_time"]
    assert lag["bucket_seconds"] == 1
    assert [(p["commit_second"], p["max_latency_ms"], p["events"]) for p in lag["points"]] == [
        (1000, 700, 2),
        (1002, 100, 1),
    ]
    html = render_html(VerifyReport(summary=summary, inputs={}, config={}))
    plot = html[html.index("max latency per 1 s of commit time") :]
    assert "no data" not in plot[: plot.index("</svg>")]
