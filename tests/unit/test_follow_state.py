"""The following verifier's incremental rules (`spark_jobs/follow_state.py`), batch by
batch, without Spark: each class, the grace period, late deliveries, XA, verified-through,
and the state's round trip through its file."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from spark_jobs.common import identity_key, murmur2_partition
from spark_jobs.follow_state import FollowState

SRC, DLQ, F1 = "shop", "p.dlq", "mysql-bin.000001"


def state(**kw) -> FollowState:
    st = FollowState(source=SRC, dlq_topic=DLQ, grace_s=10.0, **kw)
    st.start = (F1, 1, 100)
    st.read_through = st.start
    st.verified_through = st.start
    st.kafka_next = {("p.order", 0): 0, ("p.order", 1): 0, ("p.dlq", 0): 0}
    return st


def ev(pos: int, row: int = 0, agg: str = "k1", end: int | None = None, **kw) -> dict:
    e = {"ikey": identity_key(SRC, f"0-1-{pos}", F1, pos, row), "source": SRC, "server_id": 1, "file": F1, "file_seq": 1,
         "tx_pos": pos, "tx_end": end or pos + 50, "row": row, "gtid": f"0-1-{pos}", "commit_ts_ms": 1_000_000,
         "table": "d.outbox", "event_id": f"id{pos}-{row}", "aggregate_type": "order", "aggregate_id": agg,
         "event_type": "Created", "payload": b"{}", "payload_is_text": True, "timestamp_us": None,
         "expected_topic": "p.order", "dlq_cause": None, "dlq_error": None, "kind": "event", "xa_xid": None, "xa_prepare": None}  # fmt: skip
    e.update(kw)
    return e


def progress(end: int, start: int = 100) -> dict:
    return {"kind": "progress", "file": F1, "file_seq": 1, "tx_pos": start, "tx_end": end, "row": -1, "ikey": None}


def rec(e: dict, offset: int, partition: int = 0, topic: str = "p.order", **kw) -> dict:
    r = {"topic": topic, "partition": partition, "offset": offset, "timestamp_ms": 1_000_500, "key_text": e["aggregate_id"],
         "ikey": e["ikey"], "source": SRC, "h_file": e["file"], "h_file_seq": 1, "h_pos": e["tx_pos"], "h_row": e["row"],
         "h_gtid": e["gtid"], "h_commit_ts": e["commit_ts_ms"], "h_event_id": e["event_id"], "h_event_type": e["event_type"],
         "repair": False, "dlq_cause": None, "v_id": e["event_id"], "v_aggregate_type": e["aggregate_type"],
         "v_aggregate_id": e["aggregate_id"], "v_type": e["event_type"], "v_payload": e["payload"], "v_timestamp_us": None,
         "value_error": None, "h_xa_prepare": None, "h_xa_file_seq": None, "h_xa_pos": None, "marker": False}  # fmt: skip
    r.update(kw)
    return r


def test_delivered_at_once_and_verified_through_follows(caplog) -> None:
    st = state()
    a, b = ev(100), ev(150)
    st.apply_batch(0, [a, b, progress(200)], [rec(a, 0), rec(b, 1)], now=0.0)
    assert st.counts["delivered"] == 2 and not st.problems()
    assert st.verified_through == (F1, 1, 200)
    assert st.observe_head((F1, 1, 200), now=1.0) == 0.0


def test_missing_only_after_the_grace_period_with_an_alarm_then_a_late_delivery_moves_it(caplog) -> None:
    st = state()
    a, b = ev(100), ev(150)
    st.apply_batch(0, [a, b, progress(200)], [rec(b, 0)], now=0.0)
    st.expire(now=9.0)
    assert st.counts["missing"] == 0 and len(st.pending) == 1
    assert st.verified_through == (F1, 1, 100)  # held before the unproven event
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        st.expire(now=11.0)
    assert st.counts["missing"] == 1 and st.alarms["missing"] == 1
    assert any("ALARM missing" in m and "mysql-bin.000001:100 row 0" in m for m in caplog.messages)
    assert st.verified_through == (F1, 1, 100)
    st.apply_batch(1, [], [rec(a, 1, repair=True)], now=20.0)  # cdc repair
    assert st.counts["missing"] == 0 and st.counts["delivered"] == 2 and st.late_deliveries == 1
    assert st.verified_through == (F1, 1, 200)


def test_a_later_second_delivery_is_a_duplicate_with_its_offsets(caplog) -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [rec(a, 0)], now=0.0)
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        st.apply_batch(1, [], [rec(a, 7)], now=1.0)
    assert st.counts["duplicate"] == 1 and st.counts["delivered"] == 0
    assert any("ALARM duplicate" in m and "p.order[0]@7" in m and "p.order[0]@0" in m for m in caplog.messages)
    st.apply_batch(2, [], [rec(a, 8)], now=2.0)  # a third copy: still one duplicate event
    assert st.counts["duplicate"] == 1 and st.alarms["duplicate"] == 2


def test_two_deliveries_in_one_batch_are_one_duplicate() -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [rec(a, 0), rec(a, 1)], now=0.0)
    assert st.counts == {**st.counts, "duplicate": 1, "delivered": 0}


def test_a_record_before_its_event_waits_and_matches() -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [progress(100, 100)], [rec(a, 0)], now=0.0)
    st.expire(now=50.0)  # the binlog was not read past it: it waits, no phantom
    assert st.counts["phantom"] == 0 and len(st.waiting) == 1
    st.apply_batch(1, [a, progress(200)], [], now=51.0)
    assert st.counts["delivered"] == 1 and not st.waiting


def test_phantom_once_the_binlog_is_read_past_it_and_grace_passed(caplog) -> None:
    st = state()
    ghost = ev(120)
    st.apply_batch(0, [progress(200)], [rec(ghost, 3)], now=0.0)
    st.expire(now=5.0)
    assert st.counts["phantom"] == 0
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        st.expire(now=11.0)
    assert st.counts["phantom"] == 1 and st.records["phantom"] == 1
    assert any("ALARM phantom" in m and "p.order[0]@3" in m for m in caplog.messages)


def test_records_before_the_start_are_unverifiable_not_phantom() -> None:
    st = state()
    old = ev(40)
    xa_old = ev(150, xa_prepare=f"{F1}:60")
    st.apply_batch(0, [progress(200)], [rec(old, 0), rec(xa_old, 1, h_xa_file_seq=1, h_xa_pos=60)], now=0.0)
    st.expire(now=100.0)
    assert st.records["unverifiable"] == 2 and st.counts["phantom"] == 0
    assert st.unverifiable_reasons == {"record:before_binlog_range": 2}


def test_altered_reordered_and_dead_lettered() -> None:
    st = state()
    a, b, c, d = ev(100, agg="k"), ev(150, agg="k"), ev(200, agg="z"), ev(250, agg="y", dlq_cause="illegal_topic")
    # b's record comes before a's in the same partition: a is reordered
    st.apply_batch(0, [a, b, c, d, progress(300)], [
        rec(b, 0), rec(a, 1), rec(c, 2, v_payload=b"{\"x\":1}"), rec(d, 0, topic=DLQ, dlq_cause="illegal_topic"),
    ], now=0.0)  # fmt: skip
    assert st.counts["reordered"] == 1 and st.counts["delivered"] == 1
    assert st.counts["altered"] == 1 and st.altered_reasons == {"payload": 1}
    assert st.counts["dead_lettered"] == 1 and st.dlq_causes == {"illegal_topic": 1}
    assert st.verified_through == (F1, 1, 200)  # the altered event (at 200) holds it


def test_statement_format_is_unverifiable_then_duplicate_with_a_second_delivery() -> None:
    st = state()
    s = ev(100, dlq_cause="statement_format", expected_topic=None)
    st.apply_batch(0, [s, progress(200)], [], now=0.0)
    assert st.unverifiable_reasons == {"event:statement_format": 1} and st.problems() == {"statement_format": 1}
    st.apply_batch(1, [], [rec(s, 0, topic=DLQ, dlq_cause="statement_format")], now=1.0)
    assert st.counts["unverifiable"] == 1
    st.apply_batch(2, [], [rec(s, 1, topic=DLQ, dlq_cause="statement_format")], now=2.0)
    assert st.counts["unverifiable"] == 0 and st.counts["duplicate"] == 1


def test_xa_commit_makes_events_at_the_commit_and_rollback_drops_them() -> None:
    st = state()
    prep = ev(100, kind="xa_row", xa_xid="X1", ikey=None)
    prep2 = ev(120, kind="xa_row", xa_xid="X2", ikey=None)
    st.apply_batch(0, [prep, prep2, progress(150)], [], now=0.0)
    assert st.verified_through == (F1, 1, 100) and len(st.xa_held) == 2
    commit = {**ev(160), "kind": "xa_commit", "xa_xid": "X1", "ikey": None, "row": -1}
    rollback = {**ev(180), "kind": "xa_rollback", "xa_xid": "X2", "ikey": None, "row": -1}
    st.apply_batch(1, [commit, rollback, progress(200, 150)], [], now=1.0)
    key = identity_key(SRC, commit["gtid"], F1, 160, 0)
    assert list(st.pending) == [key]
    st.apply_batch(
        2,
        [],
        [rec({**prep, "ikey": key, "tx_pos": 160, "gtid": commit["gtid"], "commit_ts_ms": commit["commit_ts_ms"]}, 0)],
        now=2.0,
    )
    assert st.counts["delivered"] == 1 and st.verified_through == (F1, 1, 200)


def test_truncated_audit_stream_makes_early_events_of_every_topic_unverifiable() -> None:
    # The exchange sink: the markers name the audit stream, its records their own topics.
    st = state(routed_stream="audit")
    st.kafka_next = {}
    old, old_other = ev(100), ev(120, expected_topic="p.invoice")
    kept, lost = ev(150), ev(180, expected_topic="p.invoice")
    marker = {"topic": "audit", "partition": 0, "offset": 5, "marker": True, "range_start": 0, "range_end": 6}
    st.apply_batch(0, [old, old_other, kept, lost, progress(200)], [marker, rec(kept, 5)], now=0.0)
    st.expire(now=11.0)
    assert st.counts["delivered"] == 1 and st.counts["missing"] == 1, st.counts
    assert st.unverifiable_reasons == {"event:partition_truncated": 2}
    # without the audit stream named, the same run calls them missing
    st = state()
    st.kafka_next = {}
    st.apply_batch(0, [old, old_other, kept, lost, progress(200)], [marker, rec(kept, 5)], now=0.0)
    st.expire(now=11.0)
    assert st.counts["missing"] == 3


def test_partition_truncated_before_the_verifier_read_it_is_unverifiable() -> None:
    st = state()
    key = next(k for k in (f"k{i}" for i in range(100)) if murmur2_partition(k, 2) == 0)
    a, b = ev(100, agg=key), ev(150, agg=key)
    marker = {"topic": "p.order", "partition": 0, "offset": 5, "marker": True, "range_start": 0, "range_end": 9}
    st.kafka_next = {("p.dlq", 0): 0}
    st.apply_batch(0, [a, b, progress(200)], [marker, {**marker, "partition": 1, "offset": None, "range_end": 0},
                                               {**marker, "topic": DLQ, "offset": None, "range_end": 0}, rec(b, 5)], now=0.0)  # fmt: skip
    st.expire(now=11.0)
    assert st.counts["missing"] == 0, st.counts
    assert st.unverifiable_reasons == {"event:partition_truncated": 1} and st.counts["delivered"] == 1


def test_forgotten_after_the_dedupe_window_a_copy_is_unverifiable_not_phantom() -> None:
    st = state(dedupe_window_s=30.0)
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [rec(a, 0)], now=0.0)
    st.expire(now=40.0)
    assert not st.done
    st.apply_batch(1, [], [rec(a, 1)], now=41.0)
    st.expire(now=60.0)
    assert st.counts["phantom"] == 0 and st.unverifiable_reasons == {"record:beyond_dedupe_window": 1}


def test_state_round_trips_through_its_file_and_load_takes_the_newest_before(tmp_path) -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [], now=0.0)
    st.save(tmp_path)
    st.apply_batch(1, [], [rec(a, 0)], now=1.0)
    st.save(tmp_path)
    again = FollowState.load(tmp_path, before=1)
    assert again.batch_id == 0 and list(again.pending) == [a["ikey"]]
    newest = FollowState.load(tmp_path, before=99)
    assert newest.batch_id == 1 and newest.counts["delivered"] == 1
    assert FollowState.load(tmp_path, before=0) is None


@pytest.mark.parametrize("head,lag", [((F1, 1, 200), 0.0), ((F1, 1, 300), 5.0)])
def test_lag_is_how_long_the_head_has_been_ahead(head, lag) -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [rec(a, 0)], now=0.0)
    st.observe_head(head, now=10.0)
    assert st.observe_head(head, now=15.0) == lag


def test_the_report_of_a_following_run_shows_where_it_stands_and_the_lag_over_time() -> None:
    from spark_jobs.follow import follow_summary
    from spark_jobs.report import VerifyReport, render_html

    st = state()
    a, b = ev(100), ev(150)
    st.apply_batch(0, [a, b, progress(200)], [rec(a, 0)], now=0.0)
    st.expire(now=11.0)
    for t in range(5):
        st.observe_head((F1, 1, 300), now=20.0 + t)
    summary = follow_summary(st, 4.0, (F1, 1, 300))
    rep = VerifyReport(summary=summary, inputs={}, config={})
    assert rep.problems == {"missing": 1} and summary["counts"]["delivered"] == 1
    assert summary["verified_through"] == {"file": F1, "pos": 150, "complete": False}
    html = render_html(rep)
    assert "Following" in html and "verified-through lag behind the binlog head" in html and " s</text>" in html
    assert len(summary["follow"]["lag_history"]) == 5


def test_latency_uses_the_outbox_timestamp_column_when_there_is_one() -> None:
    from spark_jobs.follow import follow_summary

    st = state()
    a, b = ev(100), ev(150, timestamp_us=1_000_200_000)  # the INSERT at 1_000_200 ms; broker at 1_000_500
    st.apply_batch(0, [a, b, progress(200)], [rec(a, 0), rec(b, 1, v_timestamp_us=1_000_200_000)], now=0.0)
    assert sorted(st.latencies) == [300, 500] and st.latency_clocks == {
        "outbox_timestamp_column": 1,
        "binlog_commit_header": 1,
    }
    assert "outbox timestamp column" in follow_summary(st, 0.0, None)["latency"]["clock"]


def test_a_save_writes_what_the_batch_matched_not_everything_matched_so_far(tmp_path) -> None:
    """At 5k events/s the de-duplication window holds 1.5M matched events: pickling them all
    after every micro-batch took longer than the batch. Each save writes the state without
    them plus the batch's own matches; a load rebuilds them from those files."""
    st = state(dedupe_window_s=1000.0)
    sizes = []
    for batch in range(6):
        events = [ev(1000 + 100 * (batch * 500 + i), end=1000 + 100 * (batch * 500 + i) + 50) for i in range(500)]
        st.apply_batch(
            batch,
            events + [progress(1000 + 100 * (batch + 1) * 500, start=100)],
            [rec(e, batch * 500 + i) for i, e in enumerate(events)],
            now=float(batch),
        )
        st.save(tmp_path)
        sizes.append(
            sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and p.name.startswith(f"{batch}."))
        )
    assert st.counts["delivered"] == 3000 and len(st.done) == 3000
    assert sizes[-1] < 1.5 * sizes[1], sizes  # what one batch writes does not grow with what was matched before

    again = FollowState.load(tmp_path, before=99)
    assert again.batch_id == 5 and len(again.done) == 3000 and again.counts["delivered"] == 3000
    first = ev(1000)
    again.apply_batch(6, [], [rec(first, 9999)], now=10.0)  # a second delivery of an event matched in batch 0
    assert again.counts["duplicate"] == 1 and again.counts["delivered"] == 2999
    again.save(tmp_path)
    third = FollowState.load(tmp_path, before=99)
    third.apply_batch(7, [], [rec(first, 10_000)], now=11.0)  # the duplicate's change was saved too
    assert third.counts["duplicate"] == 1 and third.alarms["duplicate"] == 2

    third.save(tmp_path)
    older = FollowState.load(tmp_path, before=7)  # batch 7, had Spark not committed it, is read again from here
    assert older.batch_id == 6 and len(older.done) == 3000
    older.apply_batch(7, [], [rec(first, 10_000)], now=11.0)  # not counted twice: 7's own chunk was not loaded
    assert older.counts["duplicate"] == 1 and older.alarms["duplicate"] == 2


def test_matched_events_are_forgotten_after_the_window_also_after_a_load(tmp_path) -> None:
    st = state(dedupe_window_s=30.0)
    a, b = ev(100), ev(300, end=350)
    st.apply_batch(0, [a, progress(200)], [rec(a, 0)], now=0.0)
    st.save(tmp_path)
    st.apply_batch(1, [b, progress(400, start=200)], [rec(b, 1)], now=20.0)
    st.save(tmp_path)
    again = FollowState.load(tmp_path, before=99)
    again.expire(now=40.0)
    assert len(again.done) == 1  # a's match is older than the window, b's is not
    again.apply_batch(2, [], [rec(a, 2), rec(b, 3)], now=41.0)
    assert again.counts["duplicate"] == 1 and again.unverifiable_reasons == {"record:beyond_dedupe_window": 1}


# -- the short path changes the state exactly as the general rules do ------------------------


def _snapshot(st: FollowState) -> dict:
    """Everything the state holds, in its order (dict and deque order included)."""
    out = {k: v for k, v in st.__dict__.items() if k not in ("_journal", "started_at", "done_buckets")}
    out["pending"] = list(st.pending.items())
    out["open_verdicts"] = list(st.open_verdicts.items())
    out["waiting"] = list(st.waiting.items())
    out["done"] = sorted(st.done.items())
    out["txq"] = list(st.txq)
    out["latencies"] = list(st.latencies)
    out["buckets"] = [(t, o, sorted(hs)) for t, o, hs in st.done_buckets]
    return out


@st_.composite
def _batches(draw) -> list[tuple[list[dict], list[dict], float]]:
    """Events of a few transactions over several batches and, for each, what happened to
    its record: delivered in the same batch, later, earlier, twice, never, altered,
    dead-lettered, repaired, of another source, without header position, out of order;
    now and then a statement-logged insert and an XA prepare with its outcome."""
    n_tx = draw(st_.integers(1, 8))
    events, pos = [], 100
    for _ in range(n_tx):
        for row in range(draw(st_.integers(1, 3))):
            fmt = draw(st_.sampled_from([None, None, None, "string", "json"]))
            e = ev(pos, row, agg=draw(st_.sampled_from(["k1", "k2", "k3"])), end=pos + 40,
                   timestamp_us=draw(st_.sampled_from([None, 1_000_100_000])),
                   commit_us=draw(st_.sampled_from([None, None, 1_000_000_123])))  # fmt: skip
            e["_fmt"] = fmt
            events.append(e)
        pos += 50
    n_batches = draw(st_.integers(1, 4))
    binlog: list[list[dict]] = [[] for _ in range(n_batches)]
    kafka: list[list[dict]] = [[] for _ in range(n_batches + 2)]
    read_at = sorted(draw(st_.lists(st_.integers(0, n_batches - 1), min_size=len(events), max_size=len(events))))
    offset = {0: 0, 1: 0, 2: 0}
    for e, b in zip(events, read_at, strict=True):
        fmt = e.pop("_fmt")
        kind = draw(st_.sampled_from(["same"] * 6 + ["later", "earlier", "twice", "never", "altered", "dlq", "repair",
                                      "foreign", "nopos", "stmt", "value_error", "commit_ts", "topic"]))  # fmt: skip
        if kind == "stmt":
            e.update(dlq_cause="statement_format", expected_topic=None)
        binlog[b].append(e)
        copies = {"never": 0, "twice": 2}.get(kind, 1)
        for c in range(copies):
            at = {"later": b + 1, "earlier": max(0, b - 1)}.get(kind, b) + (c if kind == "twice" else 0)
            part = draw(st_.integers(0, 1))
            extra: dict = {}
            if fmt is not None:
                extra = {"v_format": fmt, "v_payload": e["payload"] if fmt == "string" else b"{}",
                         "timestamp_ms": (e["timestamp_us"] // 1000) if e["timestamp_us"] else e["commit_ts_ms"]}  # fmt: skip
            if kind == "altered":
                extra["v_payload"] = b"other"
            elif kind in ("dlq", "stmt"):
                extra.update(topic=DLQ, dlq_cause=e["dlq_cause"] or "too_large")
                part = 2
            elif kind == "repair":
                extra["repair"] = True
            elif kind == "foreign":
                extra["source"] = "elsewhere"
            elif kind == "nopos":
                extra["h_row"] = None
            elif kind == "value_error":
                extra["value_error"] = "broken"
            elif kind == "commit_ts":
                extra["h_commit_ts"] = 5
            elif kind == "topic":
                extra["topic"] = "p.other"
            r = rec(e, offset[part], partition=part % 2, **extra)
            if part == 2:
                r["partition"] = 0
            offset[part] += 1
            kafka[min(at, len(kafka) - 1)].append(r)
    for i in range(1, n_batches + 2):  # now and then a record of one partition swaps with the one before it
        if len(kafka[i]) >= 2 and draw(st_.booleans()):
            a, b = kafka[i][-1], kafka[i][-2]
            if (a["topic"], a["partition"]) == (b["topic"], b["partition"]):
                a["offset"], b["offset"] = b["offset"], a["offset"]
    if draw(st_.booleans()):  # an XA prepare, decided in a later batch
        prep = ev(pos, kind="xa_row", xa_xid="X9", ikey=None)
        outcome = {**ev(pos + 50), "kind": draw(st_.sampled_from(["xa_commit", "xa_rollback"])), "xa_xid": "X9",
                   "ikey": None, "row": -1}  # fmt: skip
        binlog[0].append(prep)
        binlog[-1].append(outcome)
        pos += 100
    out = []
    for i in range(n_batches + 2):
        rows = binlog[i] if i < n_batches else []
        if i < n_batches:
            rows = [*rows, progress(100 + 50 * n_tx + 100, 100)]
        out.append((rows, kafka[i], float(i * draw(st_.sampled_from([1, 6, 20])))))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches())
def test_the_short_path_changes_the_state_exactly_as_the_general_rules(batches) -> None:
    fast, general = state(), state()
    for n, (brows, krows, now) in enumerate(batches):
        fast.apply_batch(n, [dict(r) for r in brows], [dict(r) for r in krows], now=now)
        general.apply_batch(n, [dict(r) for r in brows], [dict(r) for r in krows], now=now, fast=False)
        fast.expire(now=now + 5)
        general.expire(now=now + 5)
        assert _snapshot(fast) == _snapshot(general)
    fast.expire(now=1000.0)
    general.expire(now=1000.0)
    assert _snapshot(fast) == _snapshot(general)


@pytest.mark.verifier_deps  # PyArrow
def test_apply_tables_is_apply_batch() -> None:
    """The follow job's Arrow path gives the state the rows would."""
    import pyarrow as pa

    a, b = ev(100), ev(150, agg="k2")
    brows, krows = [a, b, progress(200)], [rec(b, 0), rec(a, 1, v_payload=b"x")]
    by_rows, by_tables = state(), state()
    by_rows.apply_batch(0, brows, krows, now=0.0)
    by_tables.apply_tables(0, pa.Table.from_pylist(brows), pa.Table.from_pylist(krows), now=0.0)
    assert _snapshot(by_rows) == _snapshot(by_tables)
    assert by_tables.counts["altered"] == 1 and by_tables.counts["delivered"] == 1


def test_a_repaired_copy_of_a_missing_event_is_repaired_once_and_says_when_it_is_out_of_key_order(caplog) -> None:
    st = state()
    a, b, c = ev(100, agg="k1"), ev(150, agg="k1"), ev(170, agg="k2")
    st.apply_batch(0, [a, b, c, progress(200)], [rec(b, 0), rec(c, 1)], now=0.0)  # a never came; b has a's key
    st.expire(now=11.0)
    assert st.counts["missing"] == 1 and st.verified_through == (F1, 1, 100)
    # the relay's checkpoint: only what lies before it is ready; the rest waits for the relay
    ready, held = st.repair_candidates(lambda o: o < (1, 120))
    assert [e["ikey"] for e in ready] == [a["ikey"]] and held == 0
    assert st.repair_candidates(lambda o: o < (1, 100)) == ([], 1)
    st.repair_outcome(a["ikey"], True, None, now=12.0)
    assert st.repair_candidates(lambda o: True) == ([], 0)  # asked once, never twice
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        st.apply_batch(1, [], [rec(a, 2, repair=True)], now=13.0)
    assert st.counts["missing"] == 0 and st.counts["repaired"] == 1 and st.counts["delivered"] == 2
    assert st.repairs["repaired"] == 1 and st.repairs["repaired_out_of_order"] == 1 and st.late_deliveries == 0
    assert not st.problems() and st.verified_through == (F1, 1, 200)
    assert any(m.startswith("REPAIRED out of order") and "key k1" in m for m in caplog.messages)
    st.apply_batch(2, [], [rec(a, 3, repair=True)], now=14.0)  # a second copy: a duplicate, proven once
    assert st.counts["repaired"] == 0 and st.counts["duplicate"] == 1 and st.verified_through == (F1, 1, 200)


def test_a_repair_that_fails_raises_its_alarm_and_the_event_stays_missing(caplog) -> None:
    st = state()
    a = ev(100)
    st.apply_batch(0, [a, progress(200)], [], now=0.0)
    st.expire(now=11.0)
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        st.repair_outcome(a["ikey"], False, "not_in_binlog: its transaction is no longer in the binlog", now=12.0)
    assert st.counts["missing"] == 1 and st.problems() == {"missing": 1}
    assert st.repairs["failed"] == 1 and st.repair_failures == {"not_in_binlog": 1} and st.alarms["repair_failed"] == 1
    assert any("ALARM repair_failed" in m and "id id100-0" in m for m in caplog.messages)
    assert st.repair_candidates(lambda o: True) == ([], 0)  # a person acts on it: not tried again


def test_the_report_lists_repaired_events_and_failed_repairs() -> None:
    from spark_jobs.follow import follow_summary
    from spark_jobs.report import VerifyReport, render_html

    st = state()
    a, b, c = ev(100), ev(150, agg="k2"), ev(170, agg="k3")
    st.apply_batch(0, [a, b, c, progress(200)], [], now=0.0)
    st.expire(now=11.0)
    st.repair_outcome(a["ikey"], True, None, now=12.0)
    st.repair_outcome(b["ikey"], False, "not_in_binlog: its transaction is no longer in the binlog", now=12.0)
    st.apply_batch(1, [], [rec(a, 0, repair=True)], now=13.0)
    summary = follow_summary(st, 0.0, (F1, 1, 200))
    assert summary["counts"]["repaired"] == 1 and summary["events_total"] == 3
    assert summary["follow"]["repairs"] == {"requested": 2, "published": 1, "repaired": 1, "repaired_out_of_order": 0,
                                            "failed": 1, "failures": {"not_in_binlog": 1}}  # fmt: skip
    assert [e["event_id"] for e in summary["examples"]["repaired"]] == [a["event_id"]]
    rep = VerifyReport(summary=summary, inputs={}, config={})
    assert rep.problems == {"missing": 2}
    assert "<tr><td>repaired</td><td>1</td></tr>" in render_html(rep)


def test_records_waiting_for_their_events_are_saved_by_what_each_batch_changed(tmp_path) -> None:
    """A job behind the broker reads records long before their events (765k waited in a
    600 s run): pickling them all after every batch took seconds a batch. Each save writes
    what its batch added to or removed from `waiting` (all of it every WAITING_WHOLE_EVERY
    batches); every state kept loads with exactly its batch's waiting records."""
    from spark_jobs.follow_state import WAITING_WHOLE_EVERY

    st = state()
    events = [ev(1000 + 100 * i, end=1000 + 100 * i + 50) for i in range(400)]
    expected: dict[int, set[str]] = {}
    sizes: dict[int, int] = {}
    n = WAITING_WHOLE_EVERY + 5
    for batch in range(n):
        # 10 records a batch ahead of their events; the events of the records of two batches ago
        ahead = [rec(e, 10 * batch + i) for i, e in enumerate(events[10 * batch : 10 * batch + 10])]
        caught = events[10 * (batch - 2) : 10 * (batch - 2) + 10] if batch >= 2 else []
        end = caught[-1]["tx_end"] if caught else 1000
        st.apply_batch(batch, [*caught, progress(end, start=100)], ahead, now=float(batch))
        st.save(tmp_path)
        expected[batch] = set(st.waiting)
        chunk = tmp_path / "waiting" / f"{batch}.chunk"
        sizes[batch] = chunk.stat().st_size
    assert st.counts["delivered"] == 10 * (n - 2) and len(st.waiting) == 20
    assert sizes[WAITING_WHOLE_EVERY + 3] < sizes[WAITING_WHOLE_EVERY], sizes  # changes only, between wholes
    kept = sorted(int(p.name.split(".")[0]) for p in tmp_path.glob("*.state"))
    assert kept == [n - 3, n - 2, n - 1]
    assert min(int(p.name.split(".")[0]) for p in (tmp_path / "waiting").glob("*.chunk")) == WAITING_WHOLE_EVERY
    for batch in kept:
        again = FollowState.load(tmp_path, before=batch + 1)
        assert again.batch_id == batch and set(again.waiting) == expected[batch]
    # a loaded state goes on: the events of the waiting records are matched, nothing is lost
    again = FollowState.load(tmp_path, before=n)
    rest = events[10 * (n - 2) : 10 * n]
    again.apply_batch(n, [*rest, progress(rest[-1]["tx_end"], start=100)], [], now=float(n))
    assert again.counts["delivered"] == 10 * n and not again.waiting


def test_a_state_saved_with_its_waiting_records_inside_loads_them_and_the_next_save_keeps_them(
    tmp_path, monkeypatch
) -> None:
    """A checkpoint written before `waiting` was saved apart (its records in the state file)."""
    st = state()
    a, b = ev(1000), ev(2000)
    st.apply_batch(3, [progress(900, start=100)], [rec(a, 0), rec(b, 1)], now=0.0)

    def older_layout(self: FollowState) -> dict:
        d = dict(self.__dict__)
        for name in ("done", "done_buckets", "_journal", "_waiting_changed", "_waiting_whole"):
            d.pop(name, None)
        return d

    monkeypatch.setattr(FollowState, "__getstate__", older_layout)
    st.save(tmp_path)
    monkeypatch.undo()
    for p in (tmp_path / "waiting").glob("*.chunk"):  # the older layout wrote none
        p.unlink()
    again = FollowState.load(tmp_path, before=99)
    assert set(again.waiting) == {a["ikey"], b["ikey"]}
    again.apply_batch(4, [a, progress(1050, start=900)], [], now=1.0)
    again.save(tmp_path)
    third = FollowState.load(tmp_path, before=99)
    assert third.batch_id == 4 and set(third.waiting) == {b["ikey"]} and third.counts["delivered"] == 1
