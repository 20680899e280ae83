"""The report's numbers from a `Reconciled` (`summarize`: counts, examples,
verified_through, latency and lag) and the machine-usable entry of a missing event for
`cdc repair` (`missing_entry`).
"""

from __future__ import annotations

from typing import Any

from spark_jobs.reconcile import Reconciled
from spark_jobs.reconcile_rules import ALL_CLASSES, PROVEN_CLASSES


def _event_example(r: Any) -> dict[str, Any]:
    d = r.asDict(recursive=True)
    out = {
        "class": d.get("class"),
        "binlog": {
            "file": d["file"], "pos": d["tx_pos"], "row": d["row"], "gtid": d["gtid"], "tx_end": d["tx_end"],
            "commit_ts_ms": d["commit_ts_ms"], "server_id": d["server_id"],
        },
        "table": d["table"],
        "event_id": d["event_id"],
        "aggregate_type": d["aggregate_type"],
        "aggregate_id": d["aggregate_id"],
        "event_type": d["event_type"],
        "expected_topic": d["expected_topic"],
        "expected_dlq_cause": d["dlq_cause"],
        "deliveries": [
            {k: v for k, v in x.items() if k in ("topic", "partition", "offset", "timestamp_ms", "repair", "dlq_cause", "reasons")}
            for x in (d.get("deliveries") or [])
        ],
    }  # fmt: skip
    if d.get("reasons"):
        out["reasons"] = d["reasons"]
    if d.get("unverifiable_reason"):
        out["unverifiable_reason"] = d["unverifiable_reason"]
    if d.get("xa_prepare"):
        out["binlog"]["xa_prepare"] = d["xa_prepare"]
    if d.get("reorder_at"):
        ra = d["reorder_at"]
        out["reordered_after"] = {
            "topic": ra["topic"], "partition": ra["partition"], "offset": ra["offset"],
            "later_position_seen": {"file_seq": ra["prev_max"]["file_seq"], "pos": ra["prev_max"]["tx_pos"], "row": ra["prev_max"]["row"]},
        }  # fmt: skip
    return out


def _record_example(r: Any) -> dict[str, Any]:
    d = r.asDict(recursive=True)
    return {
        "class": d["class"],
        "reason": d.get("reason"),
        "kafka": {"topic": d["topic"], "partition": d["partition"], "offset": d["offset"], "timestamp_ms": d["timestamp_ms"]},
        "key": d["key_text"],
        "headers": {
            "source": d["source"], "file": d["h_file"], "pos": d["h_pos"], "row": d["h_row"], "gtid": d["h_gtid"],
            "commit_ts": d["h_commit_ts"], "id": d["h_event_id"], "type": d["h_event_type"], "repair": d["repair"],
            "xa_prepare": d.get("h_xa_prepare"),
        },
    }  # fmt: skip


def missing_entry(r: Any) -> dict[str, Any]:
    """One missing event, machine-usable (for `cdc repair`)."""
    d = r.asDict(recursive=True) if hasattr(r, "asDict") else dict(r)
    return {
        "source": d["source"], "file": d["file"], "pos": d["tx_pos"], "row": d["row"], "gtid": d["gtid"],
        "tx_end": d["tx_end"], "server_id": d["server_id"], "commit_ts_ms": d["commit_ts_ms"], "table": d["table"],
        "event_id": d["event_id"], "aggregate_type": d["aggregate_type"], "aggregate_id": d["aggregate_id"],
        "event_type": d["event_type"], "expected_topic": d["expected_topic"], "dlq_cause": d["dlq_cause"],
    }  # fmt: skip


def summarize(rc: Reconciled, max_examples: int = 20, lag_buckets: int = 600, hist_bins: int = 40) -> dict[str, Any]:
    """Counts, examples, verified_through, latency and lag, from the persisted results.

    Few Spark actions: one for every count (events, records, order violations), one for
    the global figures (latency percentiles, first unproven event), one for the latency
    histogram and the lag series; the others only run when there is something to show."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    col = F.col
    ctx = rc.ctx
    ev = rc.events
    str_null = F.lit(None).cast("string")

    # ---- 1 action: every count
    facts = (
        ev.groupBy(
            F.lit("event").alias("side"),
            col("class"),
            col("unverifiable_reason").alias("reason"),
            F.when(col("class") == "dead_lettered", col("deliveries")[0]["dlq_cause"]).alias("cause"),
            F.when(col("class") == "altered", F.array_join(col("reasons"), ",")).alias("reasons"),
        )
        .count()
        .unionByName(
            rc.records.groupBy(
                F.lit("record").alias("side"),
                col("class"),
                col("reason"),
                str_null.alias("cause"),
                str_null.alias("reasons"),
            ).count()
        )
        .unionByName(
            rc.violations.groupBy(
                F.lit("violation").alias("side"),
                F.lit("order").alias("class"),
                str_null.alias("reason"),
                str_null.alias("cause"),
                str_null.alias("reasons"),
            ).count()
        )
        .collect()
    )
    counts = {c: 0 for c in ALL_CLASSES}
    rec_counts: dict[str, int] = {}
    rec_reasons: dict[str, int] = {}
    ev_unv: dict[str, int] = {}
    dlq_causes: dict[str, int] = {}
    altered_reasons: dict[str, int] = {}
    violations_count = 0
    for r in facts:
        n = r["count"]
        if r["side"] == "event":
            counts[r["class"]] += n
            if r["class"] == "unverifiable":
                ev_unv[r["reason"]] = ev_unv.get(r["reason"], 0) + n
            if r["class"] == "dead_lettered":
                dlq_causes[r["cause"]] = dlq_causes.get(r["cause"], 0) + n
            if r["class"] == "altered":
                for reason in (r["reasons"] or "").split(","):
                    if reason:
                        altered_reasons[reason] = altered_reasons.get(reason, 0) + n
        elif r["side"] == "record":
            rec_counts[r["class"]] = rec_counts.get(r["class"], 0) + n
            if r["class"] == "unverifiable":
                rec_reasons[r["reason"]] = rec_reasons.get(r["reason"], 0) + n
        else:
            violations_count += n
    events_total = sum(counts.values())
    counts["phantom"] += rec_counts.get("phantom", 0)
    counts["unverifiable"] += rec_counts.get("unverifiable", 0)

    # ---- 1 action: global figures (latency, first unproven event)
    lat_expr = col("latency_ms")
    g = ev.agg(
        F.count(lat_expr).alias("n"),
        F.min(lat_expr).alias("min"),
        F.max(lat_expr).alias("max"),
        F.avg(lat_expr).alias("mean"),
        F.percentile_approx(lat_expr, [0.5, 0.95, 0.99], 10000).alias("p"),
        F.count(F.when(lat_expr.isNotNull() & (col("commit_clock") == "m"), 1)).alias("n_mysql"),
        F.count(F.when(lat_expr.isNotNull() & (col("commit_clock") == "c"), 1)).alias("n_column"),
        F.min(F.when(lat_expr.isNotNull(), col("commit_ts_ms"))).alias("t0"),
        F.max(F.when(lat_expr.isNotNull(), col("commit_ts_ms"))).alias("t1"),
        F.min(F.when(~col("class").isin(*PROVEN_CLASSES), F.struct("file_seq", "tx_pos", "row", "file"))).alias(
            "first_bad"
        ),
    ).collect()[0]

    # ---- verified_through
    first_bad = g["first_bad"]
    if first_bad is None:
        verified = {"file": ctx.range_end[0], "pos": ctx.range_end[2], "complete": True}
        first_unproven = None
    else:
        prev = (
            ev.filter(
                (col("file_seq") < first_bad["file_seq"])
                | ((col("file_seq") == first_bad["file_seq"]) & (col("tx_pos") < first_bad["tx_pos"]))
            )
            .agg(F.max(F.struct("file_seq", "tx_pos", "row", "file", "tx_end")).alias("m"))
            .collect()[0]["m"]
        )
        if prev is None:
            verified = {"file": ctx.range_start[0], "pos": ctx.range_start[2], "complete": False}
        else:
            verified = {"file": prev["file"], "pos": prev["tx_end"], "complete": False}
        first_unproven = {"file": first_bad["file"], "pos": first_bad["tx_pos"], "row": first_bad["row"]}

    # ---- 1 action: latency histogram + lag over time
    clocks = {
        "mysql_immediate_commit_timestamp": g["n_mysql"],
        "outbox_timestamp_column": g["n_column"],
        "binlog_commit_header": g["n"] - g["n_mysql"] - g["n_column"],
    }
    latency: dict[str, Any] = {
        "count": g["n"],
        "clocks": {k: v for k, v in clocks.items() if v},
        "note": "latency = first broker timestamp - commit time; the commit time is MySQL's immediate_commit_timestamp "
        "(microseconds) where the server writes it, else the outbox timestamp column when configured (microseconds, "
        "set at the INSERT, read as UTC: includes the rest of the transaction), else the binlog commit event header "
        "(one-second resolution: a latency can be overstated by up to 1000 ms); `clocks` counts each",
    }
    if g["n"]:
        p = g["p"]
        latency.update(
            min_ms=g["min"], p50_ms=p[0], p95_ms=p[1], p99_ms=p[2], max_ms=g["max"], mean_ms=round(g["mean"], 1)
        )
        lo, hi = int(g["min"]), int(g["max"])
        width = max(1, -(-(hi - lo + 1) // hist_bins))
        t0 = int(g["t0"]) // 1000
        span_s = (int(g["t1"]) - int(g["t0"])) // 1000 + 1
        bucket_s = max(1, -(-span_s // lag_buckets))
        lat = ev.filter(lat_expr.isNotNull())
        rows = (
            lat.groupBy(F.lit("h").alias("kind"), F.floor((lat_expr - F.lit(lo)) / F.lit(width)).alias("b"))
            .agg(F.count(F.lit(1)).alias("n"), F.max(lat_expr).alias("mx"))
            .unionByName(
                lat.groupBy(
                    F.lit("l").alias("kind"),
                    F.floor((F.floor(col("commit_ts_ms") / 1000) - F.lit(t0)) / F.lit(bucket_s)).alias("b"),
                ).agg(F.count(F.lit(1)).alias("n"), F.max(lat_expr).alias("mx"))
            )
            .collect()
        )
        latency["histogram"] = {
            "bin_width_ms": width,
            "bins": sorted(
                ({"from_ms": lo + int(r["b"]) * width, "count": r["n"]} for r in rows if r["kind"] == "h"),
                key=lambda b: b["from_ms"],
            ),
        }
        latency["lag_over_time"] = {
            "bucket_seconds": bucket_s,
            "points": sorted(
                (
                    {"commit_second": t0 + int(r["b"]) * bucket_s, "max_latency_ms": r["mx"], "events": r["n"]}
                    for r in rows
                    if r["kind"] == "l"
                ),
                key=lambda x: x["commit_second"],
            ),
        }

    # ---- examples (only when there is something to show)
    examples: dict[str, list[dict[str, Any]]] = {c: [] for c in ALL_CLASSES}
    if events_total - counts["delivered"] > 0:
        w = Window.partitionBy("class").orderBy("file_seq", "tx_pos", "row")
        for r in (
            ev.filter(col("class") != "delivered")
            .withColumn("rn", F.row_number().over(w))
            .filter(col("rn") <= max_examples)
            .orderBy("class", "rn")
            .collect()
        ):
            examples[r["class"]].append(_event_example(r))
    if rec_counts.get("phantom", 0) + rec_counts.get("unverifiable", 0) > 0:
        wr = Window.partitionBy("class").orderBy("topic", "partition", "offset")
        for r in (
            rc.records.filter(col("class").isin("phantom", "unverifiable"))
            .withColumn("rn", F.row_number().over(wr))
            .filter(col("rn") <= max_examples)
            .orderBy("class", "rn")
            .collect()
        ):
            if len(examples[r["class"]]) < 2 * max_examples:
                examples[r["class"]].append(_record_example(r))
    violation_examples = []
    if violations_count:
        violation_examples = [
            {
                "topic": r["topic"],
                "partition": r["partition"],
                "offset": r["offset"],
                "key": r["key_text"],
                "position": {"file": r["h_file"], "pos": r["h_pos"], "row": r["h_row"], "gtid": r["h_gtid"]},
                "after_position": {
                    "file_seq": r["prev_max"]["h_file_seq"],
                    "pos": r["prev_max"]["h_pos"],
                    "row": r["prev_max"]["h_row"],
                },
            }
            for r in rc.violations.orderBy("topic", "partition", "offset").limit(max_examples).collect()
        ]
    unverifiable_ranges: list[dict[str, Any]] = []
    if rec_counts.get("unverifiable", 0):
        for r in rc.records.filter(col("class") == "unverifiable").groupBy("reason").agg(
            F.min(F.struct("h_file_seq", "h_pos", "h_file")).alias("lo"), F.max(F.struct("h_file_seq", "h_pos", "h_file")).alias("hi"),
            F.count(F.lit(1)).alias("n"),
        ).collect():  # fmt: skip
            unverifiable_ranges.append({"side": "kafka_records", "reason": r["reason"], "count": r["n"],
                                        "from": {"file": r["lo"]["h_file"], "pos": r["lo"]["h_pos"]},
                                        "to": {"file": r["hi"]["h_file"], "pos": r["hi"]["h_pos"]}})  # fmt: skip
    if ev_unv:
        for r in ev.filter(col("class") == "unverifiable").groupBy("unverifiable_reason").agg(
            F.min(F.struct("file_seq", "tx_pos", "file")).alias("lo"), F.max(F.struct("file_seq", "tx_pos", "file")).alias("hi"),
            F.count(F.lit(1)).alias("n"),
        ).collect():  # fmt: skip
            unverifiable_ranges.append({"side": "binlog_events", "reason": r["unverifiable_reason"], "count": r["n"],
                                        "from": {"file": r["lo"]["file"], "pos": r["lo"]["tx_pos"]},
                                        "to": {"file": r["hi"]["file"], "pos": r["hi"]["tx_pos"]}})  # fmt: skip
    del T
    return {
        "counts": counts,
        "events_total": events_total,
        "records": {
            "foreign": rec_counts.get("foreign", 0),
            "unidentified": rec_counts.get("unidentified", 0),
            "phantom": rec_counts.get("phantom", 0),
            "unverifiable": rec_counts.get("unverifiable", 0),
        },
        "unverifiable_reasons": {
            **{f"event:{k}": v for k, v in ev_unv.items()},
            **{f"record:{k}": v for k, v in rec_reasons.items()},
        },
        "dead_letter_causes": dlq_causes,
        "altered_reasons": altered_reasons,
        "examples": {k: v for k, v in examples.items() if v},
        "order_violations": {"count": violations_count, "examples": violation_examples},
        "verified_through": verified,
        "first_unproven": first_unproven,
        "latency": latency,
        "truncated_partitions": [{"topic": t, "partition": p, "low_watermark": low} for t, p, low in ctx.truncated()],
        "unverifiable_ranges": unverifiable_ranges,
    }
