"""The following verifier's rules, row by row (the general path: every row that is not the
common case of `FollowState._apply`'s short path, and every row when `fast` is off): a binlog
row (events, XA prepare rows and outcomes, progress, anomalies), a Kafka range marker, a
record; the verdict of an event without a delivery and of a record without an event once the
grace period has passed (`expire`). The rules themselves are stated in
`spark_jobs/follow_state.py`'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from spark_jobs.common import identity_key, murmur2_partition
from spark_jobs.follow_ledger import (
    ALARM_LOG,
    FollowLedger,
    delivery_of,
    event_example,
    ikey_hash,
    order_of,
    position_text,
)
from spark_jobs.mysql.binlog_rows import (
    KIND_ANOMALY,
    KIND_EVENT,
    KIND_XA_COMMIT,
    KIND_XA_EVENT,
    KIND_XA_ROLLBACK,
    KIND_XA_ROW,
    STATEMENT_FORMAT,
)  # fmt: skip
from spark_jobs.reconcile_rules import PROVEN_CLASSES, record_reasons

FOLLOW_PROVEN = (*PROVEN_CLASSES, "repaired")

KIND_PROGRESS = "progress"
MAX_ANOMALIES = 200
# What an XA transaction's events take from its outcome (XA COMMIT) group
_XA_OUTCOME_FIELDS = ("file", "file_seq", "tx_pos", "tx_end", "gtid", "commit_ts_ms", "commit_us", "server_id")


class FollowRules(FollowLedger):
    """The general rules of `FollowState` (its short path must change the state alike)."""

    def _binlog_row(self, r: dict[str, Any], now: float) -> None:
        """One binlog row by the general rules."""
        kind = r.get("kind") or KIND_EVENT
        if kind == KIND_PROGRESS:
            rt = (r["file"], int(r["file_seq"]), int(r["tx_end"]))
            if self.read_through is None or rt[1:] > self.read_through[1:]:
                self.read_through = rt
        elif kind == KIND_ANOMALY:
            if len(self.anomalies) < MAX_ANOMALIES:
                self.anomalies.append(f"{r.get('file')}: {r.get('dlq_error')}")
        elif kind == KIND_XA_ROW:
            xid = r["xa_xid"]
            held = self.xa_held.setdefault(xid, [])
            if not held:
                self._tx_add(r)  # the undecided prepare holds verified-through before it
            held.append(r)
        elif kind in (KIND_XA_COMMIT, KIND_XA_ROLLBACK):
            held = self.xa_held.pop(r["xa_xid"], [])
            if held:
                self._tx_proven((int(held[0]["file_seq"]), int(held[0]["tx_pos"])))
                if kind == KIND_XA_COMMIT:
                    for h in held:
                        e = dict(h)
                        for c in _XA_OUTCOME_FIELDS:
                            e[c] = r.get(c)
                        e["kind"] = KIND_XA_EVENT
                        e["ikey"] = identity_key(h["source"], r["gtid"], r["file"], r["tx_pos"], h["row"])
                        self._new_event(e, now)
        elif r.get("ikey") is not None:
            self._new_event(r, now)

    def _marker(self, r: Mapping[str, Any]) -> None:
        tp = (r["topic"], int(r["partition"]))
        start, end, first = int(r["range_start"]), int(r["range_end"]), r.get("offset")
        seen_before = tp in self.kafka_next
        gap = (first is not None and int(first) > start) or (first is None and end > start)
        if (not seen_before and start > 0) or gap:
            self.truncated.setdefault(tp, None)  # set to the first record of ours read from it below
        self.kafka_next[tp] = max(end, self.kafka_next.get(tp, 0))

    def _first_kept(self, tp: tuple[str, int], o: tuple[int, int, int]) -> None:
        """A record of ours at binlog order `o` read from `tp`: the first one read from a
        truncated partition is its threshold (the audit stream's, whatever topic it names)."""
        truncated = self.truncated
        if self.routed_stream:
            tp = (self.routed_stream, 0)
        if tp in truncated and truncated[tp] is None:
            truncated[tp] = o

    def _new_event(self, ev: dict[str, Any], now: float) -> None:
        ikey = ev["ikey"]
        if ikey_hash(ikey) in self.done or ikey in self.pending or ikey in self.open_verdicts:
            return  # read twice (cannot happen with exact offsets; never counted twice)
        ev["seen"] = now
        ev["tx"] = self._tx_add(ev)
        ev["deliveries"] = []
        if ev.get("dlq_cause") == STATEMENT_FORMAT:
            self._count("unverifiable", reason=STATEMENT_FORMAT)
            self._example("unverifiable", event_example(ev, "unverifiable", STATEMENT_FORMAT))
            ev["class"] = "unverifiable"
            ev["reason"] = STATEMENT_FORMAT
            self.open_verdicts[ikey] = ev
        else:
            self.pending[ikey] = ev
        w = self.waiting.pop(ikey, None)
        if w is not None:
            self._waiting_changed.add(ikey)
            self._deliver(ikey, w, now)

    def _record(self, r: Mapping[str, Any], now: float) -> None:
        ikey = r.get("ikey")
        if ikey is None:
            self.records["unidentified"] += 1
            return
        if r.get("source") != self.source:
            self.records["foreign"] += 1
            return
        tp = (r["topic"], int(r["partition"]))
        o = (
            order_of(r["h_file_seq"], r["h_pos"], r["h_row"])
            if r.get("h_file_seq") is not None and r.get("h_pos") is not None and r.get("h_row") is not None
            else None
        )
        if o is not None and self.truncated:
            self._first_kept(tp, o)
        rec = dict(r)
        rec["o"] = o
        if not r.get("repair") and o is not None:
            last = self.partition_last.get(tp)
            if last is not None and o < last:
                self.order_violations += 1
            else:
                self.partition_last[tp] = o
        self._deliver(ikey, rec, now)

    def _deliver(self, ikey: str, rec: dict[str, Any], now: float) -> None:
        where = f"{rec['topic']}[{rec['partition']}]@{rec['offset']}"
        ev = self.pending.pop(ikey, None)
        if ev is not None:
            self._classify_first(ikey, ev, rec, now)
            return
        ev = self.open_verdicts.get(ikey)
        if ev is not None:
            ev["deliveries"].append(where)
            if ev["class"] == "unverifiable" and ev.get("reason") == STATEMENT_FORMAT:
                if len(ev["deliveries"]) >= 2:
                    self._count("unverifiable", -1, STATEMENT_FORMAT)
                    self._count("duplicate")
                    self.open_verdicts.pop(ikey)
                    self._tx_proven(ev.get("tx"))
                    self._remember(ikey, "duplicate", ev, now)
                    self._alarm(
                        "duplicate",
                        f"event {ev['file']}:{ev['tx_pos']} row {ev['row']} delivered at {', '.join(ev['deliveries'])}",
                    )
                return
            # a missing / unverifiable event delivered after its verdict (e.g. by cdc repair)
            self.open_verdicts.pop(ikey)
            self._count(ev["class"], -1, ev.get("reason"))
            if (
                ev["class"] == "missing"
                and rec.get("repair")
                and (ikey in self.repair_asked or ikey in self._repairing)
            ):
                # asked, or asked and not yet answered: the copy can be read before the repair
                # path returns (it waits for the broker's confirmation)
                self._repaired(ikey, ev, rec, now)
                return
            self.repair_asked.pop(ikey, None)  # found present by the repair, or late from the relay
            self.late_deliveries += 1
            ALARM_LOG.warning(
                "late delivery of %s event %s:%s row %s at %s", ev["class"], ev["file"], ev["tx_pos"], ev["row"], where
            )
            ev["deliveries"] = []
            self._classify_first(ikey, ev, rec, now)
            return
        h = ikey_hash(ikey)
        d = self.done.get(h)
        if d is not None:
            self._journal.add(h)
            deliveries = (*d[1], where)
            if d[0] != "duplicate":
                self._count(d[0], -1)
                if d[0] not in FOLLOW_PROVEN:
                    self._tx_proven(d[2])
                self._count("duplicate")
                # The matched event is kept as a bare tuple (no id, no key); the copy's identity
                # matched it, so its headers and key name the same event.
                self._example("duplicate", {"class": "duplicate", "binlog": {"file": rec.get("h_file"), "pos": rec.get("h_pos"),
                                            "row": rec.get("h_row"), "gtid": rec.get("h_gtid")},
                                            "event_id": rec.get("h_event_id") or rec.get("v_id"), "aggregate_id": rec.get("key_text"),
                                            "event_type": rec.get("h_event_type"), "deliveries": [delivery_of(x) for x in deliveries]})  # fmt: skip
            self.done[h] = ("duplicate", deliveries, *d[2:])
            self._alarm("duplicate", f"event {rec.get('h_file')}:{rec.get('h_pos')} row {rec.get('h_row')} delivered again at {where} "
                                     f"(deliveries {', '.join(deliveries)})")  # fmt: skip
            return
        if ikey in self.waiting:
            self.waiting[ikey]["extra"] = self.waiting[ikey].get("extra", 0) + 1
            self._waiting_changed.add(ikey)
            return
        # no event (yet)
        if self._before_start(rec):
            self.records["unverifiable"] += 1
            self.unverifiable_reasons["record:before_binlog_range"] = (
                self.unverifiable_reasons.get("record:before_binlog_range", 0) + 1
            )
            return
        if self.forgotten_through is not None and rec["o"] is not None and rec["o"] <= self.forgotten_through:
            self.records["unverifiable"] += 1
            self.unverifiable_reasons["record:beyond_dedupe_window"] = (
                self.unverifiable_reasons.get("record:beyond_dedupe_window", 0) + 1
            )
            return
        rec["seen"] = now
        self.waiting[ikey] = rec
        self._waiting_changed.add(ikey)

    def _before_start(self, rec: Mapping[str, Any]) -> bool:
        if self.start is None:
            return False
        s = (self.start[1], self.start[2])
        if (
            rec.get("h_file_seq") is not None
            and rec.get("h_pos") is not None
            and (int(rec["h_file_seq"]), int(rec["h_pos"])) < s
        ):
            return True
        return (
            rec.get("h_xa_file_seq") is not None
            and rec.get("h_xa_pos") is not None
            and (int(rec["h_xa_file_seq"]), int(rec["h_xa_pos"])) < s
        )

    def _classify_first(self, ikey: str, ev: dict[str, Any], rec: Mapping[str, Any], now: float) -> None:
        where = f"{rec['topic']}[{rec['partition']}]@{rec['offset']}"
        n = 1 + int(rec.get("extra", 0))
        is_dlq = rec["topic"] == self.dlq_topic
        reasons = record_reasons(rec, ev, self.dlq_topic)
        reordered = False
        if not is_dlq and not rec.get("repair") and rec.get("o") is not None and rec.get("key_text") is not None:
            k = (rec["topic"], int(rec["partition"]), rec["key_text"])
            prev = self.key_max.get(k)
            if prev is not None and prev[0] > rec["o"]:
                reordered = True
            else:
                self.key_max[k] = (rec["o"], now)
        if n >= 2:
            cls = "duplicate"
            self._alarm(
                "duplicate", f"event {ev['file']}:{ev['tx_pos']} row {ev['row']} delivered {n} times (first at {where})"
            )
        elif is_dlq:
            cls = "dead_lettered"
            cause = rec.get("dlq_cause") or ""
            self.dlq_causes[cause] = self.dlq_causes.get(cause, 0) + 1
        elif reasons:
            cls = "altered"
            for reason in reasons:
                self.altered_reasons[reason] = self.altered_reasons.get(reason, 0) + 1
        elif reordered:
            cls = "reordered"
        else:
            cls = "delivered"
        self._count(cls)
        if cls != "delivered":
            ex = event_example(ev, cls, None)
            ex["deliveries"] = [{"topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]}]
            if reasons:
                ex["reasons"] = reasons
            self._example(cls, ex)
        if cls in PROVEN_CLASSES:
            self._tx_proven(ev.get("tx"))
        if rec.get("timestamp_ms") is not None and not rec.get("repair"):
            self._latency(int(rec["timestamp_ms"]), ev.get("commit_us"), ev.get("timestamp_us"), ev.get("commit_ts_ms"))
        if cls == "altered":
            ev["class"] = cls
            ev["deliveries"] = [where]
        self._remember(ikey, cls, ev, now, [where])

    def _repaired(self, ikey: str, ev: dict[str, Any], rec: Mapping[str, Any], now: float) -> None:
        """The copy continuous compensation re-published of a missing event: `repaired`
        (proven delivered). Per-key order (docs/verifier.md, "Continuous compensation"): the
        copy comes after every later event of its key already in the partition; it is
        counted `repaired_out_of_order` then, and said in one line, not called reordered."""
        where = f"{rec['topic']}[{rec['partition']}]@{rec['offset']}"
        self.repair_asked.pop(ikey, None)
        if ikey in self._repairing:
            self._repairing[ikey] = True
        self._count("repaired")
        self.repairs["repaired"] += 1
        ex = event_example(ev, "repaired", None)
        ex["deliveries"] = [{"topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]}]
        key_text = rec.get("key_text")
        prev = self.key_max.get((rec["topic"], int(rec["partition"]), key_text)) if key_text is not None else None
        if prev is not None and rec.get("o") is not None and prev[0] > rec["o"]:
            self.repairs["repaired_out_of_order"] += 1
            ex["out_of_order"] = True
            ALARM_LOG.warning("REPAIRED out of order: event %s:%s row %s (key %s) re-published at %s, after a later event "
                              "of its key in that partition", ev["file"], ev["tx_pos"], ev["row"], key_text, where)  # fmt: skip
        else:
            ALARM_LOG.warning(
                "REPAIRED: event %s:%s row %s re-published at %s", ev["file"], ev["tx_pos"], ev["row"], where
            )
        self._example("repaired", ex)
        self._tx_proven(ev.get("tx"))
        self._remember(ikey, "repaired", ev, now, [where])

    def repair_candidates(self, behind: Any) -> tuple[list[dict[str, Any]], int]:
        """(missing events not yet asked for whose transaction `behind((file_seq, tx_pos))`
        says the relay has checkpointed past, how many others wait for the relay)."""
        ready, held = [], 0
        for ikey, ev in self.open_verdicts.items():
            if ev.get("class") != "missing" or ikey in self.repair_asked:
                continue
            if behind((int(ev["file_seq"]), int(ev["tx_pos"]))):
                ready.append(ev)
            else:
                held += 1
        return ready, held

    def repair_started(self, ikey: str) -> None:
        """`ikey` is handed to the repair path: a copy read before it answers is its copy."""
        self._repairing[ikey] = False

    def repair_answered(self, ikey: str) -> bool:
        """The repair path answered for `ikey`: whether its copy was read meanwhile (then the
        event is `repaired` already, and the outcome is still counted)."""
        return self._repairing.pop(ikey, False)

    def repair_outcome(self, ikey: str, published: bool, failure: str | None, now: float) -> None:
        """What one repair did: asked (the copy is awaited) or failed with its reason (alarm)."""
        self.repairs["requested"] += 1
        if failure is None:
            if ikey in self.open_verdicts:  # else its copy was read already (`repair_answered`)
                self.repair_asked[ikey] = now
            self.repairs["published"] += int(published)
            return
        self.repair_asked[ikey] = now  # not asked again: a person must act (the alarm says why)
        self.repairs["failed"] += 1
        reason = failure.split(":", 1)[0]
        self.repair_failures[reason] = self.repair_failures.get(reason, 0) + 1
        ev = self.open_verdicts.get(ikey) or {}
        self._alarm("repair_failed", f"event {ev.get('file')}:{ev.get('tx_pos')} row {ev.get('row')} id {ev.get('event_id')} "
                                     f"cannot be repaired: {failure}")  # fmt: skip

    # ----------------------------------------------------------------------- time

    def expire(self, now: float | None = None) -> None:
        """Verdicts for what waited longer than the grace period; forget matched events
        older than the de-duplication window."""
        now = time.time() if now is None else now
        limit = now - self.grace_s
        expired = []
        for ikey, ev in self.pending.items():
            if ev["seen"] > limit:
                break  # insertion order is reading order: the rest is younger
            expired.append(ikey)
        for ikey in expired:
            ev = self.pending.pop(ikey)
            reason = self._unverifiable_reason(ev)
            if reason:
                ev["class"], ev["reason"] = "unverifiable", reason
                self._count("unverifiable", reason=reason)
                self._example("unverifiable", event_example(ev, "unverifiable", reason))
            else:
                ev["class"], ev["reason"] = "missing", None
                self._count("missing")
                self._example("missing", event_example(ev, "missing", None))
                part = self._predicted_partition(ev)
                self._alarm("missing", f"event {ev['file']}:{ev['tx_pos']} row {ev['row']}"
                                       f"{' gtid ' + ev['gtid'] if ev.get('gtid') else ''} id {ev.get('event_id')} "
                                       f"expected in {ev.get('expected_topic') if not ev.get('dlq_cause') else self.dlq_topic}"
                                       f"{f'[{part}]' if part is not None else ''}, none within {self.grace_s:g}s")  # fmt: skip
            self.open_verdicts[ikey] = ev
        rt = (self.read_through[1], self.read_through[2]) if self.read_through else None
        gone = []
        for ikey, rec in self.waiting.items():
            if rec["seen"] > limit or rt is None or rec["o"] is None or (rec["o"][0], rec["o"][1]) >= rt:
                continue
            gone.append(ikey)
        for ikey in gone:
            rec = self.waiting.pop(ikey)
            self._waiting_changed.add(ikey)
            n = 1 + int(rec.get("extra", 0))
            self.records["phantom"] += n
            self.counts["phantom"] += n
            self._example("phantom", {"class": "phantom", "kafka": {"topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]},
                                      "headers": {"file": rec.get("h_file"), "pos": rec.get("h_pos"), "row": rec.get("h_row"), "gtid": rec.get("h_gtid"),
                                                  "id": rec.get("h_event_id")}})  # fmt: skip
            self._alarm("phantom", f"record {rec['topic']}[{rec['partition']}]@{rec['offset']} claims {rec.get('h_file')}:{rec.get('h_pos')} "
                                   f"row {rec.get('h_row')}, which the binlog (read through {position_text(self.read_through)}) "
                                   f"does not hold as a committed outbox insert")  # fmt: skip
        window = now - self.dedupe_window_s
        while self.done_buckets and self.done_buckets[0][0] < window:
            _t, o, hashes = self.done_buckets.popleft()
            for h in hashes:
                self.done.pop(h, None)
            if self.forgotten_through is None or o > self.forgotten_through:
                self.forgotten_through = o
        if len(self.key_max) > 200_000:
            self.key_max = {k: v for k, v in self.key_max.items() if v[1] >= window}
        self._advance()

    def _predicted_partition(self, ev: Mapping[str, Any]) -> int | None:
        topic = self.dlq_topic if ev.get("dlq_cause") else ev.get("expected_topic")
        count = 1 + max((p for (t, p) in self.kafka_next if t == topic), default=-1)
        if self.partitioner != "murmur2" or not count:
            return None
        return murmur2_partition(ev.get("aggregate_id"), count)

    def _unverifiable_reason(self, ev: Mapping[str, Any]) -> str | None:
        loc = self.dlq_topic if ev.get("dlq_cause") else ev.get("expected_topic")
        if loc in self.unread_topics:
            return "topic_not_read"
        o = order_of(ev["file_seq"], ev["tx_pos"], ev["row"])
        pred = self._predicted_partition(ev)
        for (topic, part), thr in self.truncated.items():
            if (
                topic in (self.dlq_topic, self.routed_stream) or (topic == loc and (pred is None or pred == part))
            ) and (thr is None or o < thr):
                return "partition_truncated"
        return None
