"""The following verifier's incremental reconciliation (`cdc verify --follow`): pure Python,
no Spark, so that every rule is unit-tested (`tests/unit/test_follow_state.py`).

Each micro-batch hands over the NEW binlog rows (`cdc_binlog_stream`) and the NEW Kafka
records (`cdc_kafka_stream`); `FollowState.apply_batch` matches them with what earlier
batches left unmatched, and `FollowState.expire(now)` turns what waited longer than the
grace period into a verdict. The rules are the batch verifier's
(`spark_jobs/reconcile.py`), applied as the data arrives:

* An event with one delivery is `delivered`, `dead_lettered` (in the dead-letter topic),
  `altered` (content differs: `reconcile_rules.record_reasons`) or `reordered` (in its partition
  it comes after a record of the same key with a later binlog position) at once; a later
  second delivery makes it `duplicate` (alarm) whatever it was.
* An event with no delivery after `grace_s` (counted from when the verifier read it) is
  `missing` (alarm), unless it cannot be proven absent: its partition (murmur2 of the key)
  or the dead-letter topic lost records before the verifier read them, or its topic was
  first seen with a low watermark above 0 and its first retained record comes after the
  event (`partition_truncated`), or its topic is not read (`topic_not_read`): then
  `unverifiable`. A delivery arriving after that moves it to its class (logged as late).
* A statement-logged outbox insert is `unverifiable` (`statement_format`) with 0 or 1
  deliveries, `duplicate` with more. XA: the rows of a prepare group are held by xid;
  an XA COMMIT turns them into events at the commit's place with its identity, an XA
  ROLLBACK drops them; while undecided they hold verified-through before the prepare.
* A record of ours that matches no event: `unverifiable` (`before_binlog_range`) when its
  header position (or its XA prepare's) lies before where the follow job started;
  `phantom` (alarm) once the binlog has been read past its position and it waited
  `grace_s`; records waiting for the binlog to reach them are not counted yet. A record
  whose event was forgotten (matched longer ago than `dedupe_window_s`) is `unverifiable`
  (`beyond_dedupe_window`), never a phantom.
* `foreign` (another source) and `unidentified` (no identity headers) records are counted.

verified-through: the end of the last transaction such that it and every event before it
are proven (delivered, reordered, duplicate, dead_lettered); with nothing unproven, how far
the binlog has been read. Missing, altered and unverifiable events hold it (as in the
batch verifier) until they are repaired.

State is a plain object pickled to the checkpoint directory after each micro-batch
(`save` / `load`): Spark's checkpoint holds the offsets, these files what was matched.
The matched events kept for duplicate detection (`done`: up to `dedupe_window_s` of
them, 1.5M at 5k events/s) are not in that file: each save writes only what its batch
added or changed to `done/<batch>.chunk`, and a load rebuilds `done` from the chunks up
to its batch. A save's cost is the batch's, not the window's.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import pickle
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.events.formats import expected_timestamp_ms, payload_matches
from spark_jobs.common import identity_key, murmur2_partition
from spark_jobs.mysql.binlog_rows import (
    KIND_ANOMALY,
    KIND_EVENT,
    KIND_XA_COMMIT,
    KIND_XA_EVENT,
    KIND_XA_ROLLBACK,
    KIND_XA_ROW,
    STATEMENT_FORMAT,
)
from spark_jobs.reconcile_rules import ALL_CLASSES, PROVEN_CLASSES, record_reasons

KIND_PROGRESS = "progress"
ALARM_LOG = logging.getLogger("cdc.verify.follow")
MAX_EXAMPLES = 20
MAX_ANOMALIES = 200
LATENCY_SECONDS_KEPT = 3_600  # the latency-over-commit-time plot covers the last hour of commit time
STATE_VERSION = 2  # 2: matched events saved apart, batch by batch


def _h64(ikey: str) -> int:
    return int.from_bytes(hashlib.blake2b(ikey.encode(), digest_size=8).digest(), "little", signed=True)


def _ord(seq: Any, pos: Any, row: Any = 0) -> tuple[int, int, int]:
    return (int(seq), int(pos), int(row))


@dataclass
class FollowState:
    source: str
    dlq_topic: str
    grace_s: float = 60.0
    dedupe_window_s: float = 300.0
    partitioner: str = "murmur2"
    unread_topics: tuple[str, ...] = ()
    version: int = STATE_VERSION
    batch_id: int = -1
    batches: int = 0
    started_at: float = field(default_factory=time.time)
    start: tuple[str, int, int] | None = None  # (file, seq, pos) where following began
    read_through: tuple[str, int, int] | None = None  # (file, seq, pos) the binlog was read to
    counts: dict[str, int] = field(default_factory=lambda: {c: 0 for c in ALL_CLASSES})
    records: dict[str, int] = field(
        default_factory=lambda: {"foreign": 0, "unidentified": 0, "phantom": 0, "unverifiable": 0}
    )
    unverifiable_reasons: dict[str, int] = field(default_factory=dict)
    dlq_causes: dict[str, int] = field(default_factory=dict)
    altered_reasons: dict[str, int] = field(default_factory=dict)
    order_violations: int = 0
    alarms: dict[str, int] = field(default_factory=lambda: {"missing": 0, "duplicate": 0, "phantom": 0})
    late_deliveries: int = 0
    # events read, no delivery yet: ikey -> event dict (+ "seen", "tx")
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    # events that got a verdict and may still get a delivery: ikey -> event (missing / unverifiable)
    open_verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # events matched: h64(ikey) -> (class, deliveries, tx, matched at, order); forgotten
    # after dedupe_window_s. Saved apart, batch by batch (see the module's docstring).
    # Tuples of plain values, so that the garbage collector stops tracking them: a million
    # entries as lists made each of its full collections walk them all.
    done: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    done_buckets: collections.deque = field(default_factory=collections.deque)  # (time, max order, [h64])
    # what this batch added to or changed in `done` (h64s), for its chunk
    _journal: set[int] = field(default_factory=set, repr=False)
    forgotten_through: tuple[int, int, int] | None = None
    # records of ours waiting for the binlog: ikey -> record (+ "seen")
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)
    # XA: xid -> held rows of its prepare group; the prepare's transaction key
    xa_held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # transactions in binlog order that still hold unproven events: [seq, pos, file, end, n]
    txq: collections.deque = field(default_factory=collections.deque)
    txmap: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    verified_through: tuple[str, int, int] | None = None  # (file, seq, pos)
    # Kafka: (topic, partition) -> next offset read; partitions first seen above offset 0
    kafka_next: dict[tuple[str, int], int] = field(default_factory=dict)
    truncated: dict[tuple[str, int], Any] = field(default_factory=dict)  # -> order of first record of ours, or None
    partition_last: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    key_max: dict[tuple[str, int, str], tuple[tuple[int, int, int], float]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    latencies: collections.deque = field(default_factory=lambda: collections.deque(maxlen=100_000))
    latency_clocks: dict[str, int] = field(default_factory=dict)  # which clock each latency came from
    # commit second -> (max latency ms, deliveries), the newest LATENCY_SECONDS_KEPT seconds
    latency_by_second: dict[int, tuple[int, int]] = field(default_factory=dict)
    lag_history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4_000))
    heads: collections.deque = field(default_factory=collections.deque)  # ((seq, pos), first seen), ascending

    # ------------------------------------------------------------------ persistence

    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        for name in ("done", "done_buckets", "_journal"):
            del st[name]
        return st

    def __setstate__(self, st: dict[str, Any]) -> None:
        self.__dict__.update(st)
        self.__dict__.setdefault("latency_by_second", {})  # a state saved before the field existed
        self.done, self.done_buckets, self._journal = {}, collections.deque(), set()

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """The state after this batch: `<batch>.state`, and what the batch added to or
        changed in `done` as `done/<batch>.chunk` (written first: a state file is only
        ever read with the chunks up to its batch)."""
        d = Path(directory)
        chunk = [(h, self.done[h]) for h in self._journal if h in self.done]
        _write_atomically(d / "done", f"{self.batch_id}.chunk", chunk)
        path = _write_atomically(d, f"{self.batch_id}.state", self)
        for old in sorted(_state_files(d))[:-3]:  # keep the newest three
            try:
                (d / f"{old}.state").unlink()
            except OSError:
                pass
        # A chunk whose every match is older than the window (and a margin, for a load of an
        # older state) holds nothing a load keeps.
        horizon = time.time() - self.dedupe_window_s - CHUNK_MARGIN_S
        for p in (d / "done").glob("*.chunk"):
            chunk_id = _chunk_id(p)
            if chunk_id is not None and chunk_id < self.batch_id - 3 and p.stat().st_mtime < horizon:
                try:
                    p.unlink()
                except OSError:
                    pass
        return path

    @staticmethod
    def load(directory: str | os.PathLike[str], before: int) -> FollowState | None:
        """The state after the newest batch `< before` (None when there is none), with the
        matched events of its batch and every earlier one."""
        d = Path(directory)
        ids = [i for i in _state_files(d) if i < before] if d.is_dir() else []
        if not ids:
            return None
        with open(d / f"{max(ids)}.state", "rb") as f:
            state = pickle.load(f)
        if not isinstance(state, FollowState) or state.version != STATE_VERSION:
            raise RuntimeError(
                f"cdc verify --follow: {d} holds state of another version: start with a new checkpoint dir"
            )
        chunks = sorted(
            (i, p) for p in (d / "done").glob("*.chunk") if (i := _chunk_id(p)) is not None and i <= state.batch_id
        )
        for _i, p in chunks:
            with open(p, "rb") as f:
                for h, entry in pickle.load(f):
                    if h not in state.done:
                        state._bucket(h, entry[3], entry[4])
                    state.done[h] = entry
        return state

    # -------------------------------------------------------------------- counting

    def _example(self, cls: str, ex: dict[str, Any]) -> None:
        lst = self.examples.setdefault(cls, [])
        if len(lst) < MAX_EXAMPLES:
            lst.append(ex)

    def _count(self, cls: str, delta: int = 1, reason: str | None = None) -> None:
        self.counts[cls] = self.counts.get(cls, 0) + delta
        if cls == "unverifiable" and reason:
            k = f"event:{reason}"
            self.unverifiable_reasons[k] = self.unverifiable_reasons.get(k, 0) + delta

    def _alarm(self, cls: str, text: str) -> None:
        self.alarms[cls] = self.alarms.get(cls, 0) + 1
        ALARM_LOG.warning("ALARM %s: %s", cls, text)

    # ---------------------------------------------------------------- transactions

    def _tx_add(self, ev: Mapping[str, Any]) -> tuple[int, int]:
        return self._tx_at(int(ev["file_seq"]), int(ev["tx_pos"]), ev["file"], ev["tx_end"], ev.get("commit_ts_ms"))

    def _tx_at(self, seq: int, pos: int, file: str, end: Any, commit_ts_ms: Any, n: int = 1) -> tuple[int, int]:
        """One more unproven event in the transaction at (seq, pos)."""
        key = (seq, pos)
        entry = self.txmap.get(key)
        if entry is None:
            entry = [seq, pos, file, int(end), 0, commit_ts_ms]
            self.txmap[key] = entry
            if self.txq and (self.txq[-1][0], self.txq[-1][1]) > key:  # rare: insert in order
                items = sorted([*self.txq, entry], key=lambda e: (e[0], e[1]))
                self.txq = collections.deque(items)
            else:
                self.txq.append(entry)
        entry[4] += n
        return key

    def _tx_proven(self, key: tuple[int, int] | None) -> None:
        if key is None:
            return
        entry = self.txmap.get((key[0], key[1]))
        if entry is not None:
            entry[4] -= 1

    def _advance(self) -> None:
        while self.txq and self.txq[0][4] <= 0:
            e = self.txq.popleft()
            self.txmap.pop((e[0], e[1]), None)
            self.verified_through = (e[2], e[0], e[3])
        if not self.txq and self.read_through is not None:
            self.verified_through = self.read_through

    # ---------------------------------------------------------------------- batches

    def apply_batch(self, batch_id: int, binlog_rows: Iterable[Mapping[str, Any]], kafka_rows: Iterable[Mapping[str, Any]],
                    now: float | None = None, fast: bool = True) -> None:  # fmt: skip
        """Reconcile one micro-batch given as rows (dicts; a missing key is None)."""
        self._apply(batch_id, _row_columns(binlog_rows), _row_columns(kafka_rows), now, fast)

    def apply_tables(self, batch_id: int, binlog: Any, kafka: Any, now: float | None = None) -> None:
        """Reconcile one micro-batch given as Arrow tables (None: no rows): the follow job's
        path, column by column, no dict per row unless a row needs the general rules."""
        self._apply(batch_id, _table_columns(binlog), _table_columns(kafka), now, True)

    def _apply(self, batch_id: int, b: Columns, k: Columns, now: float | None, fast: bool) -> None:
        """The rules, row by row in binlog order and then in (topic, partition, offset) order.

        The common case - an ordinary event, and one record of ours for it outside the
        dead-letter topic whose content is equal - takes a short path that builds no dict
        (below); every other row takes the general rules (`_binlog_row`, `_record`)
        with the row as a dict. Both paths change the state exactly alike: with `fast` False
        every row takes the general rules (tests/unit/test_follow_state.py compares the two).
        """
        now = time.time() if now is None else now
        self.batch_id = batch_id
        self.batches += 1
        self._journal = set()
        bn, bc = b
        kn, kc = k

        def bcol(name: str) -> list[Any]:
            return bc.get(name) or [None] * bn

        def kcol(name: str) -> list[Any]:
            return kc.get(name) or [None] * kn

        fseq, tpos, rown, kind, ikeys, dlqc = (
            bcol(n) for n in ("file_seq", "tx_pos", "row", "kind", "ikey", "dlq_cause")
        )
        bkeys = [(a or 0, p or 0, r if r is not None else -1) for a, p, r in zip(fseq, tpos, rown, strict=True)]
        border = sorted(range(bn), key=bkeys.__getitem__)
        progress = [i for i in border if kind[i] == KIND_PROGRESS]
        if self.start is None and progress:  # normally set by the follow job before the first batch
            p = min(progress, key=lambda i: (fseq[i], tpos[i]))
            self.start = (bcol("file")[p], int(fseq[p]), int(tpos[p]))

        def brow(i: int) -> dict[str, Any]:
            return {name: column[i] for name, column in bc.items()}

        # events of this batch on the short path, not in `pending` yet: ikey -> (row, tx, h64)
        deferred: dict[str, tuple[int, tuple[int, int], int]] = {}
        pending, waiting, opened, done = self.pending, self.waiting, self.open_verdicts, self.done
        files, ends, commit_ts = bcol("file"), bcol("tx_end"), bcol("commit_ts_ms")

        def flush() -> None:
            """The deferred events into `pending`, in binlog order (before any event that
            takes the general rules: `pending` keeps reading order)."""
            for ikey, (i, tx, _h) in deferred.items():
                pending[ikey] = self._pending_event(brow(i), tx, now)
            deferred.clear()

        last_seq: Any = None
        last_pos: Any = None
        last_tx = (0, 0)
        for i in border:
            ikey = ikeys[i]
            if fast and ikey is not None and (kind[i] or KIND_EVENT) == KIND_EVENT and dlqc[i] is None:
                if ikey in deferred:
                    continue  # read twice (cannot happen with exact offsets; never counted twice)
                h = _h64(ikey)
                if h in done or ikey in pending or ikey in opened:
                    continue  # as `_new_event`
                if ikey not in waiting:
                    seq, pos = fseq[i], tpos[i]
                    if seq == last_seq and pos == last_pos:
                        self.txmap[last_tx][4] += 1  # the next row of the same transaction
                    else:
                        last_tx = self._tx_at(int(seq), int(pos), files[i], ends[i], commit_ts[i])
                        last_seq, last_pos = seq, pos
                    deferred[ikey] = (i, last_tx, h)
                    continue
            if deferred and (ikey is not None or kind[i] in (KIND_XA_COMMIT, KIND_XA_ROLLBACK)):
                flush()
            self._binlog_row(brow(i), now)

        topics, parts, offsets, markers = kcol("topic"), kcol("partition"), kcol("offset"), kcol("marker")
        kkeys = [(t, p, o if o is not None else -1) for t, p, o in zip(topics, parts, offsets, strict=True)]
        korder = sorted(range(kn), key=kkeys.__getitem__)

        def krow(i: int) -> dict[str, Any]:
            return {name: column[i] for name, column in kc.items()}

        for i in korder:
            if markers[i]:
                self._marker(krow(i))
        recs = list(zip(*(kcol(n) for n in _RECORD_FIELDS), strict=True)) if kn else []
        evs = list(zip(*(bcol(n) for n in _EVENT_FIELDS), strict=True)) if bn else []
        dlq, source = self.dlq_topic, self.source
        counts, key_max, partition_last, txmap = self.counts, self.key_max, self.partition_last, self.txmap
        journal = self._journal
        bucket = self.done_buckets[-1] if self.done_buckets else None
        for i in korder:
            (marker, ikey, rsource, topic, part, offset, repair, hs, hp, hr, key_text, h_commit, verr, v_id, v_type,
             fmt, h_id, h_type, v_atype, v_aid, v_payload, v_ts, stamp) = recs[i]  # fmt: skip
            if marker:
                continue
            if not (fast and ikey is not None and rsource == source):
                self._record(krow(i), now)
                continue
            if topic == dlq or repair or hs is None or hp is None or hr is None:
                if ikey in deferred:  # the general rules find its event in `pending`
                    i_b, tx, _h = deferred.pop(ikey)
                    pending[ikey] = self._pending_event(brow(i_b), tx, now)
                self._record(krow(i), now)
                continue
            hit = deferred.pop(ikey, None)
            if hit is not None:
                j, tx, h = hit
                ev = None
                (e_seq, e_pos, e_row, expected_topic, aggregate_id, event_id, event_type, aggregate_type, payload,
                 is_text, ts_us, cts, cus) = evs[j]  # fmt: skip
            else:
                ev = pending.pop(ikey, None)
                if ev is None:
                    self._record(krow(i), now)
                    continue
                j, tx, h = -1, ev["tx"], _h64(ikey)
                (e_seq, e_pos, e_row, expected_topic, aggregate_id, event_id, event_type, aggregate_type, payload,
                 is_text, ts_us, cts, cus) = (ev.get(n) for n in _EVENT_FIELDS)  # fmt: skip
            # `_record`: the first record of ours in a truncated partition, the partition's order
            tp = (topic, int(part))
            o = (int(hs), int(hp), int(hr))
            if tp in self.truncated and self.truncated[tp] is None:
                self.truncated[tp] = o
            last = partition_last.get(tp)
            if last is not None and o < last:
                self.order_violations += 1
            else:
                partition_last[tp] = o
            # `_classify_first` with one delivery outside the dead-letter topic
            equal = (
                verr is None
                and (expected_topic is None or topic == expected_topic)
                and key_text == aggregate_id
                and (h_commit is None or h_commit == cts)
                and v_id == event_id
                and v_type == event_type
            )
            if equal:
                if fmt is None:
                    equal = (
                        (h_id is None or h_id == event_id)
                        and (h_type is None or h_type == event_type)
                        and v_atype == aggregate_type
                        and v_aid == aggregate_id
                        and v_payload == payload
                        and v_ts == ts_us
                    )
                else:
                    expected_stamp = expected_timestamp_ms(ts_us, cts)
                    equal = stamp == expected_stamp and payload_matches(fmt, v_payload, payload, is_text)
            reasons: list[str] = []
            if not equal:
                if ev is None:
                    ev = self._pending_event(brow(j), tx, now)
                reasons = record_reasons(krow(i), ev, dlq)
            reordered = False
            if key_text is not None:
                kk = (topic, tp[1], key_text)
                prev = key_max.get(kk)
                if prev is not None and prev[0] > o:
                    reordered = True
                else:
                    key_max[kk] = (o, now)
            where = f"{topic}[{part}]@{offset}"
            if reasons:
                cls = "altered"
                for reason in reasons:
                    self.altered_reasons[reason] = self.altered_reasons.get(reason, 0) + 1
            else:
                cls = "reordered" if reordered else "delivered"
                entry = txmap.get(tx)
                if entry is not None:
                    entry[4] -= 1
            counts[cls] = counts.get(cls, 0) + 1
            if cls != "delivered":
                if ev is None:
                    ev = self._pending_event(brow(j), tx, now)
                ex = _event_example(ev, cls, None)
                ex["deliveries"] = [{"topic": topic, "partition": part, "offset": offset}]
                if reasons:
                    ex["reasons"] = reasons
                self._example(cls, ex)
            if stamp is not None:
                self._latency(int(stamp), cus, ts_us, cts)
            eo = (int(e_seq), int(e_pos), int(e_row))
            done[h] = (cls, (where,), tx, now, eo)
            journal.add(h)
            if bucket is None or now - bucket[0] >= 5.0:
                self._bucket(h, now, eo)
                bucket = self.done_buckets[-1]
            else:  # `_bucket`, inline
                bucket[2].append(h)
                if eo > bucket[1]:
                    bucket[1] = eo
        flush()
        self._advance()

    def _latency(self, stamp: int, commit_us: Any, timestamp_us: Any, commit_ts_ms: Any) -> None:
        """One delivery's latency from the best commit clock the event has: MySQL's commit
        time (microseconds, in the GTID event); else the outbox timestamp column when the
        table has one (microseconds, written at the INSERT: it includes the rest of the
        transaction); else the binlog commit header (1 s)."""
        if commit_us is not None:
            clock, latency = "mysql_immediate_commit_timestamp", stamp - int(commit_us) // 1000
        elif timestamp_us is not None:
            clock, latency = "outbox_timestamp_column", stamp - int(timestamp_us) // 1000
        elif commit_ts_ms is not None:
            clock, latency = "binlog_commit_header", stamp - int(commit_ts_ms)
        else:
            return
        self.latencies.append(latency)
        self.latency_clocks[clock] = self.latency_clocks.get(clock, 0) + 1
        if commit_ts_ms is not None:
            second = int(commit_ts_ms) // 1000
            worst = self.latency_by_second.get(second)
            if worst is None:
                self.latency_by_second[second] = (latency, 1)
                if len(self.latency_by_second) > LATENCY_SECONDS_KEPT:
                    del self.latency_by_second[min(self.latency_by_second)]
            else:
                self.latency_by_second[second] = (max(worst[0], latency), worst[1] + 1)

    def _pending_event(self, ev: dict[str, Any], tx: tuple[int, int], now: float) -> dict[str, Any]:
        ev["seen"] = now
        ev["tx"] = tx
        ev["deliveries"] = []
        return ev

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

    def _new_event(self, ev: dict[str, Any], now: float) -> None:
        ikey = ev["ikey"]
        if _h64(ikey) in self.done or ikey in self.pending or ikey in self.open_verdicts:
            return  # read twice (cannot happen with exact offsets; never counted twice)
        ev["seen"] = now
        ev["tx"] = self._tx_add(ev)
        ev["deliveries"] = []
        if ev.get("dlq_cause") == STATEMENT_FORMAT:
            self._count("unverifiable", reason=STATEMENT_FORMAT)
            self._example("unverifiable", _event_example(ev, "unverifiable", STATEMENT_FORMAT))
            ev["class"] = "unverifiable"
            ev["reason"] = STATEMENT_FORMAT
            self.open_verdicts[ikey] = ev
        else:
            self.pending[ikey] = ev
        w = self.waiting.pop(ikey, None)
        if w is not None:
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
            _ord(r["h_file_seq"], r["h_pos"], r["h_row"])
            if r.get("h_file_seq") is not None and r.get("h_pos") is not None and r.get("h_row") is not None
            else None
        )
        if tp in self.truncated and self.truncated[tp] is None and o is not None:
            self.truncated[tp] = o
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
            self.late_deliveries += 1
            ALARM_LOG.warning(
                "late delivery of %s event %s:%s row %s at %s", ev["class"], ev["file"], ev["tx_pos"], ev["row"], where
            )
            ev["deliveries"] = []
            self._classify_first(ikey, ev, rec, now)
            return
        h = _h64(ikey)
        d = self.done.get(h)
        if d is not None:
            self._journal.add(h)
            deliveries = (*d[1], where)
            if d[0] != "duplicate":
                self._count(d[0], -1)
                if d[0] not in PROVEN_CLASSES:
                    self._tx_proven(d[2])
                self._count("duplicate")
                # The matched event is kept as a bare tuple (no id, no key); the copy's identity
                # matched it, so its headers and key name the same event.
                self._example("duplicate", {"class": "duplicate", "binlog": {"file": rec.get("h_file"), "pos": rec.get("h_pos"),
                                            "row": rec.get("h_row"), "gtid": rec.get("h_gtid")},
                                            "event_id": rec.get("h_event_id") or rec.get("v_id"), "aggregate_id": rec.get("key_text"),
                                            "event_type": rec.get("h_event_type"), "deliveries": [_as_delivery(x) for x in deliveries]})  # fmt: skip
            self.done[h] = ("duplicate", deliveries, *d[2:])
            self._alarm("duplicate", f"event {rec.get('h_file')}:{rec.get('h_pos')} row {rec.get('h_row')} delivered again at {where} "
                                     f"(deliveries {', '.join(deliveries)})")  # fmt: skip
            return
        if ikey in self.waiting:
            self.waiting[ikey]["extra"] = self.waiting[ikey].get("extra", 0) + 1
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
            ex = _event_example(ev, cls, None)
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

    def _remember(
        self, ikey: str, cls: str, ev: Mapping[str, Any], now: float, deliveries: list[str] | None = None
    ) -> None:
        h = _h64(ikey)
        o = _ord(ev["file_seq"], ev["tx_pos"], ev["row"])
        self.done[h] = (cls, tuple(deliveries or ev.get("deliveries") or ()), ev.get("tx"), now, o)
        self._journal.add(h)
        self._bucket(h, now, o)

    def _bucket(self, h: int, now: float, o: tuple[int, int, int]) -> None:
        if self.done_buckets and now - self.done_buckets[-1][0] < 5.0:
            b = self.done_buckets[-1]
            b[2].append(h)
            if o > b[1]:
                b[1] = o
        else:
            self.done_buckets.append([now, o, [h]])

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
                self._example("unverifiable", _event_example(ev, "unverifiable", reason))
            else:
                ev["class"], ev["reason"] = "missing", None
                self._count("missing")
                self._example("missing", _event_example(ev, "missing", None))
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
            n = 1 + int(rec.get("extra", 0))
            self.records["phantom"] += n
            self.counts["phantom"] += n
            self._example("phantom", {"class": "phantom", "kafka": {"topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]},
                                      "headers": {"file": rec.get("h_file"), "pos": rec.get("h_pos"), "row": rec.get("h_row"), "gtid": rec.get("h_gtid"),
                                                  "id": rec.get("h_event_id")}})  # fmt: skip
            self._alarm("phantom", f"record {rec['topic']}[{rec['partition']}]@{rec['offset']} claims {rec.get('h_file')}:{rec.get('h_pos')} "
                                   f"row {rec.get('h_row')}, which the binlog (read through {_at(self.read_through)}) "
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
        o = _ord(ev["file_seq"], ev["tx_pos"], ev["row"])
        pred = self._predicted_partition(ev)
        for (topic, part), thr in self.truncated.items():
            if (topic == self.dlq_topic or (topic == loc and (pred is None or pred == part))) and (
                thr is None or o < thr
            ):
                return "partition_truncated"
        return None

    # ------------------------------------------------------------------ figures

    def observe_head(self, head: tuple[str, int, int], now: float | None = None) -> float:
        """Record the server's binlog end; the verified-through lag in seconds: how long
        the head has been beyond verified-through (0 when verified-through is the head),
        at least the age of the oldest unproven event's commit."""
        now = time.time() if now is None else now
        hk = (int(head[1]), int(head[2]))
        if not self.heads or self.heads[-1][0] < hk:
            self.heads.append((hk, now))
        vt = (self.verified_through[1], self.verified_through[2]) if self.verified_through else None
        while self.heads and vt is not None and self.heads[0][0] <= vt:
            self.heads.popleft()
        lag = now - self.heads[0][1] if self.heads else 0.0
        if self.txq and self.txq[0][5]:
            lag = max(lag, now - self.txq[0][5] / 1000.0)
        lag = max(0.0, lag)
        self.lag_history.append((now, round(lag, 3)))
        return lag

    def problems(self) -> dict[str, int]:
        out = {
            c: self.counts.get(c, 0)
            for c in ("missing", "duplicate", "phantom", "reordered", "altered")
            if self.counts.get(c, 0)
        }
        if self.unverifiable_reasons.get(f"event:{STATEMENT_FORMAT}"):
            out[STATEMENT_FORMAT] = self.unverifiable_reasons[f"event:{STATEMENT_FORMAT}"]
        return out


def _as_delivery(where: str) -> dict[str, Any]:
    """`topic[partition]@offset` as the report's delivery dict."""
    head, _, offset = where.rpartition("@")
    topic, _, part = head[:-1].rpartition("[")
    return {"topic": topic, "partition": int(part), "offset": int(offset)}


CHUNK_MARGIN_S = 600.0

# What an XA transaction's events take from its outcome (XA COMMIT) group
_XA_OUTCOME_FIELDS = ("file", "file_seq", "tx_pos", "tx_end", "gtid", "commit_ts_ms", "commit_us", "server_id")
# One side of a micro-batch: (rows, {column: values}); a column that is absent is all None.
Columns = tuple[int, dict[str, list[Any]]]
# The columns the short path of `FollowState._apply` reads, in this order
_RECORD_FIELDS = ("marker", "ikey", "source", "topic", "partition", "offset", "repair", "h_file_seq", "h_pos", "h_row",
                  "key_text", "h_commit_ts", "value_error", "v_id", "v_type", "v_format", "h_event_id", "h_event_type",
                  "v_aggregate_type", "v_aggregate_id", "v_payload", "v_timestamp_us", "timestamp_ms")  # fmt: skip
_EVENT_FIELDS = ("file_seq", "tx_pos", "row", "expected_topic", "aggregate_id", "event_id", "event_type", "aggregate_type",
                 "payload", "payload_is_text", "timestamp_us", "commit_ts_ms", "commit_us")  # fmt: skip


def _row_columns(rows: Iterable[Mapping[str, Any]]) -> Columns:
    rows = list(rows)
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r))
    return len(rows), {name: [r.get(name) for r in rows] for name in names}


def _table_columns(table: Any) -> Columns:
    if table is None:
        return 0, {}
    return table.num_rows, {name: table.column(name).to_pylist() for name in table.column_names}


def _write_atomically(d: Path, name: str, obj: Any) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path, tmp = d / name, d / f".{name}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _chunk_id(p: Path) -> int | None:
    try:
        return int(p.name.split(".")[0])
    except ValueError:
        return None


def _state_files(d: Path) -> list[int]:
    out = []
    for p in d.glob("*.state"):
        try:
            out.append(int(p.name.split(".")[0]))
        except ValueError:
            continue
    return out


def _at(point: tuple[str, int, int] | None) -> str:
    return f"{point[0]}:{point[2]}" if point is not None else "nothing yet"


def _event_example(ev: Mapping[str, Any], cls: str, reason: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "class": cls,
        "binlog": {"file": ev.get("file"), "pos": ev.get("tx_pos"), "row": ev.get("row"), "gtid": ev.get("gtid"),
                   "tx_end": ev.get("tx_end"), "commit_ts_ms": ev.get("commit_ts_ms")},
        "event_id": ev.get("event_id"), "aggregate_type": ev.get("aggregate_type"), "aggregate_id": ev.get("aggregate_id"),
        "event_type": ev.get("event_type"), "expected_topic": ev.get("expected_topic"), "expected_dlq_cause": ev.get("dlq_cause"),
        "deliveries": [],
    }  # fmt: skip
    if reason:
        out["unverifiable_reason"] = reason
    return out
