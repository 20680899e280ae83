"""Reconciliation: every committed outbox event of the binlog against every record of the
topics, joined on the identity key, and each side classified.

Inputs: the rows of `cdc_binlog` (one per committed outbox insert, plus XA prepare rows
and outcome markers) and the decoded records of `cdc_kafka` (`decode=true`), plus a
`ReconcileContext` (source name, the verified binlog range, the watermarks of every
partition read; `spark_jobs/reconcile_rules.py`, with the classes and the rules the
implementations share).

XA first (`resolve_xa`, Spark; `resolve_xa_rows`, the reference in
`spark_jobs/reconcile_reference.py`): the binlog is read in
byte ranges in parallel, so the rows of a prepare group and the XA COMMIT / XA ROLLBACK
that decides them are usually read by different tasks, maybe from different files. The
readers only tag (rows with their xid, one marker per outcome); the pairing is done here,
over the whole read, before anything is joined: per xid, in binlog order, a prepare's
outcome is the next row of that xid (an xid is busy from prepare to outcome). Committed:
each row becomes an event at the COMMIT's place, with the commit group's identity
(file/pos/GTID/commit time; `row` stays its index in the prepare group), exactly as the
relay's headers carry it - so binlog order, the key-order check and verified_through all
use the commit position. Rolled back: nothing. No outcome in the range: `xa_undecided`
(below). Joining in Spark rather than carrying prepared rows from task to task keeps the
partitions independent and is correct whatever the cut points.

The rules (the same in the Spark implementation `reconcile()` and in the pure-python
reference `reconcile_reference()` (`spark_jobs/reconcile_reference.py`), which the unit
tests hold against each other):

Records: a record "of ours" carries identity headers (`cdc.source`, `cdc.binlog.row` and
a GTID or file+pos) with our source name; every other record is `foreign` (another
source) or `unidentified` (no identity headers) and is only counted. A record of ours
whose identity key is an event of the binlog is a *delivery* of that event (records with
`cdc.repair` and dead-letter records included). A record of ours that matches no event is
    - `unverifiable` when its header position lies before the verified binlog range
      (reason `before_binlog_range`: the binlog there is purged or was not asked for) -
      also when it is an XA event (`cdc.xa.prepare`) whose prepare group does - or
      at/after its end (`after_verified_range`: committed after the snapshot);
    - `phantom` otherwise: the binlog does not hold it as a committed outbox insert.

Events: an XA transaction prepared in the range and undecided at its end is
`unverifiable` (`xa_undecided`): never missing (the relay never publishes it while
undecided), never matched (its key is one no record carries); its place is its prepare
group's, so verified_through stops before it. A statement-logged outbox insert
(`dlq_cause = statement_format`) is `unverifiable` (`statement_format`) with 0 or 1
deliveries - its dead letter is its delivery, not a phantom - and `duplicate` with more;
the report fails while one exists (report.py). Otherwise, with n deliveries,
    - n == 0: `missing`, unless it cannot be proven absent: its expected topic was not
      read (`topic_not_read`), or the partition it belongs to (murmur2 of the key when the
      partitioner is known, else any partition of the topic), or any partition of the
      dead-letter topic, has a low watermark above 0 and its first retained record comes
      after the event in binlog order (`partition_truncated`) - then `unverifiable`.
    - n >= 2: `duplicate` (all offsets listed).
    - n == 1 in the dead-letter topic: `dead_lettered` (with its cause).
    - n == 1 whose content differs from the binlog row: `altered` (reasons among topic,
      key, id, aggregate_type, aggregate_id, type, payload, timestamp, commit_ts, value).
    - n == 1 that comes, in its partition, after a record of the same key with a later
      binlog position: `reordered` (only the first copy of each event in a partition and
      no repair or dead-letter record take part in the order check).
    - else `delivered`.
Partition order: in each partition, the header positions (file, pos, row) of our
non-repair records never go backwards as offsets grow; every record that does is listed
in `order_violations` (a warning: a late duplicate or a reorder across keys).

`verified_through`: the end position of the last transaction such that it and every
event before it are proven delivered or dead-lettered (classes delivered, reordered,
duplicate, dead_lettered); when nothing is unproven, the end of the verified range
(`summarize` in `spark_jobs/reconcile_summary.py`, with the report's other numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc.events.formats import payload_matches
from spark_jobs.common import KEY_SEP, murmur2_partition
from spark_jobs.mysql.binlog_rows import (
    KIND_EVENT,
    KIND_XA_COMMIT,
    KIND_XA_EVENT,
    KIND_XA_ROLLBACK,
    KIND_XA_ROW,
    KIND_XA_UNDECIDED,
    STATEMENT_FORMAT,
)  # fmt: skip
from spark_jobs.reconcile_rules import XA_UNDECIDED, ReconcileContext

EVENT_COLUMNS = (
    "ikey", "source", "server_id", "file", "file_seq", "tx_pos", "tx_end", "row", "gtid", "commit_ts_ms", "table",
    "event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "payload_is_text", "timestamp_us",
    "expected_topic", "dlq_cause", "dlq_error", "kind", "xa_prepare", "commit_us",
)  # fmt: skip


def commit_ms(col: Any) -> Any:
    """The commit time a latency is measured from (ms): MySQL's immediate_commit_timestamp,
    else the outbox timestamp column, else the commit event header."""
    from pyspark.sql import functions as F

    return F.coalesce(F.floor(col("commit_us") / 1000), F.floor(col("timestamp_us") / 1000), col("commit_ts_ms"))


def resolve_xa(rows: Any) -> Any:
    """The events of the cdc_binlog rows (Spark; the rule of `resolve_xa_rows`).

    The binlog is read in byte ranges in parallel, so an XA transaction's prepare group
    (its rows) and its outcome group (XA COMMIT / XA ROLLBACK, maybe files later) are
    often read by different tasks. Each task therefore only tags: the rows of a prepare
    group come out as `xa_row` (xid, prepare position), each outcome as one marker row.
    Here, per xid, the prepares and outcomes are put in binlog order with one window
    (a small set: only XA groups), each prepare takes the row after it (`lead`): its
    outcome when that is a marker, else it is undecided in the range; the held rows are
    joined to that and become events at the commit's place (`xa_event`, the commit
    group's identity), disappear (rollback), or are `xa_undecided` (a key no record
    carries; their place is the prepare's, so verified_through stops before it)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col = F.col
    kind = F.coalesce(col("kind"), F.lit(KIND_EVENT))
    columns = rows.columns
    plain = rows.filter(kind == KIND_EVENT)
    held = rows.filter(kind == KIND_XA_ROW)
    outcome_cols = ("file", "file_seq", "tx_pos", "tx_end", "gtid", "commit_ts_ms", "commit_us", "server_id")
    prepares = held.select("xa_xid", "file_seq", "tx_pos").distinct().withColumn("_k", F.lit("p"))
    outcomes = rows.filter(kind.isin(KIND_XA_COMMIT, KIND_XA_ROLLBACK)).select(
        "xa_xid", "file_seq", "tx_pos", col("kind").alias("_k"), F.struct(*outcome_cols).alias("_o")
    )
    by_xid = Window.partitionBy("xa_xid").orderBy("file_seq", "tx_pos")
    paired = (
        prepares.unionByName(outcomes, allowMissingColumns=True)
        .withColumn("_n_k", F.lead("_k").over(by_xid))
        .withColumn("_n_o", F.lead("_o").over(by_xid))
        .filter(col("_k") == "p")
        .select(
            col("xa_xid").alias("_p_xid"),
            col("file_seq").alias("_p_seq"),
            col("tx_pos").alias("_p_pos"),
            "_n_k",
            "_n_o",
        )
    )
    j = held.join(
        paired,
        (col("xa_xid") == col("_p_xid")) & (col("file_seq") == col("_p_seq")) & (col("tx_pos") == col("_p_pos")),
        "left",
    )
    row_text = col("row").cast("string")
    committed = j.filter(col("_n_k") == KIND_XA_COMMIT)
    for c in outcome_cols:
        committed = committed.withColumn(c, col("_n_o")[c])
    committed = committed.withColumn("kind", F.lit(KIND_XA_EVENT)).withColumn(
        "ikey",
        F.when(
            col("gtid").isNotNull() & (col("gtid") != ""),
            F.concat_ws(KEY_SEP, F.lit("g"), col("source"), col("gtid"), row_text),
        ).otherwise(
            F.concat_ws(KEY_SEP, F.lit("p"), col("source"), col("file"), col("tx_pos").cast("string"), row_text)
        ),
    )
    undecided = (
        j.filter(col("_n_k").isNull() | (col("_n_k") == "p"))
        .withColumn("kind", F.lit(KIND_XA_UNDECIDED))
        .withColumn(
            "ikey", F.concat_ws(KEY_SEP, F.lit("x"), col("source"), col("file"), col("tx_pos").cast("string"), row_text)
        )
    )
    return plain.unionByName(committed.select(*columns)).unionByName(undecided.select(*columns))


@dataclass
class Reconciled:
    """The classified sides (computed from persisted intermediates): `events` (one row per binlog event: class,
    reasons, deliveries, latency_ms ...), `records` (records of ours that match no event,
    and foreign / unidentified records: class, reason), `violations` (partition order)."""

    events: Any
    records: Any
    violations: Any
    ctx: ReconcileContext
    joined: Any = None
    side: tuple = ()  # further persisted intermediates

    def unpersist(self) -> None:
        for df in (self.events, self.records, self.violations, self.joined, *self.side):
            if df is None:
                continue
            try:
                df.unpersist()
            except Exception:
                pass


def _spark_thresholds(records: Any, ctx: ReconcileContext) -> dict[tuple[str, int], tuple | None]:
    from pyspark.sql import functions as F

    trunc = ctx.truncated()
    if not trunc:
        return {}
    out: dict[tuple[str, int], tuple | None] = {(t, p): None for t, p, _ in trunc}
    cond: Any = None
    for t, p, _ in trunc:
        c = (F.col("topic") == t) & (F.col("partition") == p)
        cond = c if cond is None else (cond | c)
    ours = (
        records.filter(
            (F.col("source") == ctx.source)
            & F.col("h_file_seq").isNotNull()
            & F.col("h_pos").isNotNull()
            & F.col("h_row").isNotNull()
        )
    )  # fmt: skip
    if (ctx.routed_stream, 0) in out:
        # the audit stream: every record is one of its own, at its offset (reconcile_rules.truncation_thresholds)
        ours = ours.withColumn("topic", F.lit(ctx.routed_stream)).withColumn("partition", F.lit(0))
    rows = (
        ours.filter(cond)
        .groupBy("topic", "partition")
        .agg(F.min_by(F.struct("h_file_seq", "h_pos", "h_row"), F.col("offset")).alias("first"))
        .collect()
    )
    for r in rows:
        out[(r["topic"], r["partition"])] = (r["first"]["h_file_seq"], r["first"]["h_pos"], r["first"]["h_row"])
    return out


def _lt(a_seq: Any, a_pos: Any, a_row: Any, b: tuple) -> Any:
    """Column expression: (a_seq, a_pos, a_row) < b (a python tuple)."""
    from pyspark.sql import functions as F

    b_seq, b_pos, b_row = (F.lit(x) for x in b)
    return (a_seq < b_seq) | ((a_seq == b_seq) & ((a_pos < b_pos) | ((a_pos == b_pos) & (a_row < b_row))))


def reconcile(events: Any, records: Any, ctx: ReconcileContext, storage: Any = None) -> Reconciled:
    """Classify with Spark DataFrames (joins, window functions). `events`: cdc_binlog rows;
    `records`: cdc_kafka rows with decode=true. The results are computed from persisted
    intermediates (`unpersist()` frees them).

    Plan (two big shuffles, no per-key list building in the common case):
      1. the records of ours are hash-partitioned by identity key and numbered within
         their key by (topic, partition, offset) with one window (count, rank, first
         broker time);
      2. the events are full-outer-joined to them on the key (a sort-merge join that
         reuses step 1's partitioning): one row per (event, record) pair, an event
         without records, or a record without an event. This is persisted;
      3. an event's row is its first record's row (rank 1): its class and its content
         check are row-local expressions; only events with two or more records get
         their delivery list from a (small) aggregation;
      4. one shuffle by (topic, partition), sorted by offset, serves both order checks:
         the partition order of header positions, and (after a sort by key) the key
         order of binlog positions; what they flag is small and joined back by broadcast.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    storage = storage or StorageLevel.MEMORY_AND_DISK
    dlq = ctx.dlq_topic
    col = F.col

    rec = records.withColumn("is_dlq", col("topic") == F.lit(dlq)).withColumn(
        "repair", F.coalesce(col("repair"), F.lit(False))
    )
    ours = rec.filter(col("ikey").isNotNull() & (col("source") == F.lit(ctx.source)))
    if ctx.has_xa:
        events = resolve_xa(events)
    else:
        events = events.filter(F.coalesce(col("kind"), F.lit(KIND_EVENT)) == KIND_EVENT)
    ev = (
        events.filter(col("ikey").isNotNull()).select(*EVENT_COLUMNS).withColumn("ord", F.struct("file_seq", "tx_pos", "row"))
        .withColumn("commit_clock_ms", commit_ms(col))
        .withColumn("commit_clock", F.when(col("commit_us").isNotNull(), F.lit("m"))
                    .when(col("timestamp_us").isNotNull(), F.lit("c")).otherwise(F.lit("h")))
    )  # fmt: skip

    # ---- 1. records of ours by identity key: how many, rank by (topic, partition, offset)
    by_ikey = Window.partitionBy("r_ikey").orderBy("r_topic", "r_partition", "r_offset")
    whole = by_ikey.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    r_cols = ("ikey",) + tuple(c for c in DELIVERY_FIELDS)
    ours_w = (
        ours.select(*[col(c).alias(f"r_{c}") for c in r_cols])
        .withColumn("n", F.count(F.lit(1)).over(whole))
        .withColumn("rn", F.row_number().over(by_ikey))
        .withColumn("first_ts", F.min(F.when(~col("r_repair"), col("r_timestamp_ms"))).over(whole))
    )

    # ---- 2. events joined to them; the content check is row-local, so it is done here and
    # only the narrow result is persisted (building Spark's cache costs by the byte, and
    # the payloads are most of the bytes)
    def r(name: str) -> Any:
        return col(f"r_{name}")

    formatted = r("v_format").isNotNull()  # a payload format: the value is the payload (cdc/events/formats.py)
    decoded = r("value_error").isNull()
    enveloped = decoded & ~formatted
    not_dlq = ~r("is_dlq")

    def ne(a: Any, b: str) -> Any:
        return ~a.eqNullSafe(col(b))

    if ctx.payload_formats:
        matches = F.udf(payload_matches, T.BooleanType())
        payload_differs = F.when(
            formatted, ~matches(r("v_format"), r("v_payload"), col("payload"), col("payload_is_text"))
        ).otherwise(ne(r("v_payload"), "payload"))
        # cdc.events.formats.expected_timestamp_ms: toward zero; 0 ms is no event time
        event_ms = (
            F.when(col("timestamp_us") >= 0, F.floor(col("timestamp_us") / 1000))
            .otherwise(-F.floor(-col("timestamp_us") / 1000))
            .cast("bigint")
        )
        expected_ms = F.when(col("timestamp_us").isNull() | (event_ms == 0), col("commit_ts_ms")).otherwise(event_ms)
        stamp_differs = F.when(formatted, ~r("timestamp_ms").eqNullSafe(expected_ms)).otherwise(
            ne(r("v_timestamp_us"), "timestamp_us")
        )
    else:
        payload_differs, stamp_differs = ne(r("v_payload"), "payload"), ne(r("v_timestamp_us"), "timestamp_us")
    reason_list = F.array(
        F.when(not_dlq & col("expected_topic").isNotNull() & (r("topic") != col("expected_topic")), F.lit("topic")),
        F.when(not_dlq & ne(r("key_text"), "aggregate_id"), F.lit("key")),
        F.when(
            not_dlq
            & decoded
            & (ne(r("v_id"), "event_id") | (r("h_event_id").isNotNull() & (r("h_event_id") != col("event_id")))),
            F.lit("id"),
        ),
        F.when(not_dlq & enveloped & ne(r("v_aggregate_type"), "aggregate_type"), F.lit("aggregate_type")),
        F.when(not_dlq & enveloped & ne(r("v_aggregate_id"), "aggregate_id"), F.lit("aggregate_id")),
        F.when(
            not_dlq
            & decoded
            & (
                ne(r("v_type"), "event_type")
                | (r("h_event_type").isNotNull() & (r("h_event_type") != col("event_type")))
            ),
            F.lit("type"),
        ),
        F.when(not_dlq & decoded & payload_differs, F.lit("payload")),
        F.when(not_dlq & decoded & stamp_differs, F.lit("timestamp")),
        F.when(r("h_commit_ts").isNotNull() & (r("h_commit_ts") != col("commit_ts_ms")), F.lit("commit_ts")),
        F.when(r("value_error").isNotNull(), F.lit("value")),
    )
    joined = (
        ev.join(ours_w, ev["ikey"] == ours_w["r_ikey"], "full_outer")
        .withColumn(
            "match_reasons", F.when(col("file").isNotNull() & r("ikey").isNotNull(), F.array_compact(reason_list))
        )
        .select(
            *JOINED_EVENT_COLUMNS,
            "ord",
            "match_reasons",
            *[f"r_{c}" for c in JOINED_RECORD_FIELDS],
            "n",
            "rn",
            "first_ts",
        )
        .persist(storage)
    )

    # ---- 3. events: the row of the first record (or of none)
    empty_reasons = F.array().cast(T.ArrayType(T.StringType()))
    delivery = F.struct(*[r(c).alias(c) for c in LISTED_DELIVERY_FIELDS])
    multi = (
        joined.filter(col("file").isNotNull() & (col("n") >= 2))
        .groupBy("ikey")
        .agg(F.sort_array(F.collect_list(delivery)).alias("_deliveries"))
    )
    multi, n_multi = _small(multi, storage)
    evs = (
        joined.filter(col("file").isNotNull() & (col("rn").isNull() | (col("rn") == 1)))
        .withColumn("n", F.coalesce(col("n"), F.lit(0)))
        .withColumn("reasons", F.when(col("n") == 1, col("match_reasons")).otherwise(empty_reasons))
        .withColumn("latency_ms", col("first_ts") - col("commit_clock_ms"))
        .withColumn("_one", F.when(col("n") == 1, F.array(delivery)))
        .withColumn("_first_is_dlq", r("is_dlq"))
    )
    evs = _join_small(evs, multi, n_multi).withColumn("deliveries", F.coalesce(col("_deliveries"), col("_one")))

    # ---- 4. order checks, one shuffle: partition order (header positions, every record
    # of ours but repairs) and key order (binlog positions of the events delivered, no
    # dead-letter records). A later copy of an event can only flag that event itself,
    # which is a duplicate anyway.
    h_ord = F.when(
        r("h_file_seq").isNotNull() & r("h_pos").isNotNull() & r("h_row").isNotNull(),
        F.struct(r("h_file_seq").alias("h_file_seq"), r("h_pos").alias("h_pos"), r("h_row").alias("h_row")),
    )
    keyed = col("file").isNotNull() & ~r("is_dlq")
    by_part = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    by_key = (
        Window.partitionBy("topic", "partition", "key_text")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    flagged = (
        joined.filter(r("ikey").isNotNull() & ~r("repair"))
        .select(
            r("topic").alias("topic"),
            r("partition").alias("partition"),
            r("offset").alias("offset"),
            r("key_text").alias("key_text"),
            r("h_file").alias("h_file"),
            r("h_pos").alias("h_pos"),
            r("h_row").alias("h_row"),
            r("h_gtid").alias("h_gtid"),
            h_ord.alias("h_ord"),
            "ikey",
            F.when(keyed, col("ord")).alias("k_ord"),
        )
        .withColumn("h_prev_max", F.max("h_ord").over(by_part))
        .withColumn("k_prev_max", F.max("k_ord").over(by_key))
        .withColumn(
            "violation", col("h_ord").isNotNull() & col("h_prev_max").isNotNull() & (col("h_ord") < col("h_prev_max"))
        )
        .withColumn(
            "reorder", col("k_ord").isNotNull() & col("k_prev_max").isNotNull() & (col("k_ord") < col("k_prev_max"))
        )
        .filter(col("violation") | col("reorder"))
        .persist(storage)
    )
    violations = flagged.filter(col("violation")).select(
        "topic",
        "partition",
        "offset",
        "key_text",
        "h_file",
        "h_pos",
        "h_row",
        "h_gtid",
        "h_ord",
        col("h_prev_max").alias("prev_max"),
    )
    order = (
        flagged.filter(col("reorder"))
        .groupBy("ikey")
        .agg(
            F.lit(True).alias("reordered"),
            F.min_by(
                F.struct("topic", "partition", "offset", col("k_prev_max").alias("prev_max")), col("offset")
            ).alias("reorder_at"),
        )
    )
    order, n_order = _small(order, storage)
    classified = (
        _join_small(evs, order, n_order)
        .withColumn("reordered", F.coalesce(col("reordered"), F.lit(False)))
        .withColumn("_stmt", F.coalesce(col("dlq_cause") == F.lit(STATEMENT_FORMAT), F.lit(False)) & (col("n") < 2))
        .withColumn("_undecided", F.coalesce(col("kind") == F.lit(KIND_XA_UNDECIDED), F.lit(False)))
        .withColumn(
            "class",
            F.when(col("_undecided") | col("_stmt"), F.lit("unverifiable"))
            .when(col("n") == 0, F.lit("missing"))
            .when(col("n") >= 2, F.lit("duplicate"))
            .when(col("_first_is_dlq"), F.lit("dead_lettered"))
            .when(F.size(col("reasons")) > 0, F.lit("altered"))
            .when(col("reordered"), F.lit("reordered"))
            .otherwise(F.lit("delivered")),
        )
        .withColumn(
            "unverifiable_reason",
            F.when(col("_undecided"), F.lit(XA_UNDECIDED))
            .when(col("_stmt"), F.lit(STATEMENT_FORMAT))
            .otherwise(F.lit(None).cast("string")),
        )
        .select(
            *JOINED_EVENT_COLUMNS,
            "ord",
            "n",
            "deliveries",
            "first_ts",
            "reasons",
            "latency_ms",
            "reordered",
            "reorder_at",
            "class",
            "unverifiable_reason",
        )
    )

    # ---- events without a delivery that cannot be proven absent
    thresholds = _spark_thresholds(rec, ctx)
    if thresholds or ctx.unread_topics:
        counts = dict(ctx.partition_counts)
        partitioner = ctx.partitioner

        @F.udf("int")
        def predicted(loc, key):
            n = counts.get(loc or "")
            if partitioner != "murmur2" or not n:
                return None
            return murmur2_partition(key, n)

        loc = F.when(col("dlq_cause").isNotNull(), F.lit(dlq)).otherwise(col("expected_topic"))
        missing = classified.filter(col("class") == "missing").withColumn("_loc", loc)
        missing = missing.withColumn("_pred", predicted(col("_loc"), col("aggregate_id")))
        trunc_cond = F.lit(False)
        for (topic, part), thr in thresholds.items():
            applies = (
                F.lit(True)
                if topic in (dlq, ctx.routed_stream)
                else ((col("_loc") == F.lit(topic)) & (col("_pred").isNull() | (col("_pred") == F.lit(part))))
            )
            before = F.lit(True) if thr is None else _lt(col("file_seq"), col("tx_pos"), col("row"), thr)
            trunc_cond = trunc_cond | (applies & before)
        unread = col("_loc").isin(list(ctx.unread_topics)) if ctx.unread_topics else F.lit(False)
        why = F.when(unread, F.lit("topic_not_read")).when(trunc_cond, F.lit("partition_truncated"))
        missing = (
            missing.withColumn("unverifiable_reason", why)
            .withColumn(
                "class", F.when(col("unverifiable_reason").isNotNull(), F.lit("unverifiable")).otherwise(col("class"))
            )
            .drop("_loc", "_pred")
        )
        classified = classified.filter(col("class") != "missing").unionByName(missing)

    # ---- records of ours that match no event, and other people's records
    _s_file, s_seq, s_pos = ctx.range_start
    _e_file, e_seq, e_pos = ctx.range_end
    hs, hp = col("h_file_seq"), col("h_pos")
    xs, xp = col("h_xa_file_seq"), col("h_xa_pos")
    before = (
        (hs < s_seq)
        | ((hs == s_seq) & (hp < s_pos))
        | F.coalesce((xs < s_seq) | ((xs == s_seq) & (xp < s_pos)), F.lit(False))
    )
    after = (hs > e_seq) | ((hs == e_seq) & (hp >= e_pos))
    unmatched = (
        joined.filter(col("file").isNull())
        .select(*[r(c).alias(c) for c in RECORD_COLUMNS])
        .withColumn(
            "reason",
            F.when(hs.isNull() | hp.isNull(), F.lit(None))
            .when(before, F.lit("before_binlog_range"))
            .when(after, F.lit("after_verified_range")),
        )
        .withColumn("class", F.when(col("reason").isNull(), F.lit("phantom")).otherwise(F.lit("unverifiable")))
    )
    others = (
        rec.filter(col("ikey").isNull() | col("source").isNull() | (col("source") != F.lit(ctx.source)))
        .withColumn("class", F.when(col("ikey").isNull(), F.lit("unidentified")).otherwise(F.lit("foreign")))
        .withColumn("reason", F.lit(None).cast("string"))
        .select(*RECORD_COLUMNS, "reason", "class")
    )
    record_classes = unmatched.unionByName(others)

    # `joined` (and the small side tables) are persisted; the three results are cheap,
    # column-pruned projections of them, so they are not cached a second time.
    return Reconciled(classified, record_classes, violations, ctx, joined, (flagged, multi, order))


SMALL_ROWS = 200_000  # a side table up to this many rows is broadcast to the join


def _small(df: Any, storage: Any) -> tuple[Any, int]:
    """`df` persisted and its row count (one action): the side tables of reconcile
    (events delivered twice or more, events out of key order) are usually empty."""
    df = df.persist(storage)
    return df, df.count()


def _join_small(big: Any, small: Any, n: int) -> Any:
    from pyspark.sql import functions as F

    if n == 0:  # nothing to join: the side's columns, all NULL
        return big.select(
            "*", *[F.lit(None).cast(f.dataType).alias(f.name) for f in small.schema.fields if f.name != "ikey"]
        )
    return big.join(F.broadcast(small) if n <= SMALL_ROWS else small, "ikey", "left")


# the record fields an event's row carries (prefixed r_); LISTED_DELIVERY_FIELDS go into
# its `deliveries` list (sorted by topic, partition, offset)
LISTED_DELIVERY_FIELDS = ("topic", "partition", "offset", "timestamp_ms", "repair", "is_dlq", "dlq_cause")
DELIVERY_FIELDS = (
    "topic", "partition", "offset", "timestamp_ms", "repair", "is_dlq", "dlq_cause", "key_text", "v_id",
    "v_aggregate_type", "v_aggregate_id", "v_type", "v_payload", "v_timestamp_us", "h_event_id", "h_event_type",
    "h_commit_ts", "value_error", "source", "h_file", "h_file_seq", "h_pos", "h_row", "h_gtid", "h_xa_prepare",
    "h_xa_file_seq", "h_xa_pos", "v_format",
)  # fmt: skip
# what the joined table keeps once the content has been compared: no payloads, no decoded values
EVENT_CONTENT_COLUMNS = ("payload", "payload_is_text", "timestamp_us")
JOINED_EVENT_COLUMNS = tuple(c for c in EVENT_COLUMNS if c not in EVENT_CONTENT_COLUMNS) + (
    "commit_clock_ms",
    "commit_clock",
)
JOINED_RECORD_FIELDS = ("ikey",) + tuple(c for c in DELIVERY_FIELDS if not c.startswith("v_"))
RECORD_COLUMNS = (
    "topic", "partition", "offset", "timestamp_ms", "key_text", "source", "h_file", "h_file_seq", "h_pos", "h_row",
    "h_gtid", "h_commit_ts", "h_event_id", "h_event_type", "repair", "is_dlq", "dlq_cause", "value_error",
    "h_xa_prepare", "h_xa_file_seq", "h_xa_pos",
)  # fmt: skip
