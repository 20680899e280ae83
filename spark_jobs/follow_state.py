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
to its batch. A save's cost is the batch's, not the window's. So with the records waiting
for their events (`waiting`: a job behind the broker reads the topics ahead of the binlog,
765k records in a 600 s run at 5k events/s): `waiting/<batch>.chunk` holds what the batch
added, changed or removed, and every WAITING_WHOLE_EVERY batches all of them.

Where: the state's fields and the bookkeeping every rule shares are `FollowLedger`
(`spark_jobs/follow_ledger.py`), the general rules row by row `FollowRules`
(`spark_jobs/follow_rules.py`); `FollowState` here adds the micro-batch (with its short path
for the common case) and the files.
"""

from __future__ import annotations

import collections
import os
import pickle
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cdc.events.formats import expected_timestamp_ms, payload_matches
from spark_jobs.follow_ledger import STATE_VERSION, event_example, ikey_hash
from spark_jobs.follow_rules import KIND_PROGRESS, FollowRules
from spark_jobs.mysql.binlog_rows import KIND_EVENT, KIND_XA_COMMIT, KIND_XA_ROLLBACK
from spark_jobs.reconcile_rules import record_reasons


class FollowState(FollowRules):
    """The following verifier's state (fields: `FollowLedger`, spark_jobs/follow_ledger.py),
    applied a micro-batch at a time, saved to and loaded from the checkpoint directory."""

    # ------------------------------------------------------------------ persistence

    def __getstate__(self) -> dict[str, Any]:
        st = dict(self.__dict__)
        for name in ("done", "done_buckets", "_journal", "waiting", "_waiting_changed", "_waiting_whole", "_repairing"):
            st.pop(name, None)
        return st

    def __setstate__(self, st: dict[str, Any]) -> None:
        # a state saved before `waiting` was saved apart carries it: the next save writes it whole
        self.__dict__["_waiting_whole"] = "waiting" in st
        self.__dict__.setdefault("waiting", {})
        self.__dict__.update(st)
        self.__dict__.setdefault("latency_by_second", {})  # a state saved before the field existed
        self.__dict__.setdefault("repair_asked", {})  # ... and before continuous compensation
        self.__dict__.setdefault(
            "repairs", {"requested": 0, "published": 0, "repaired": 0, "repaired_out_of_order": 0, "failed": 0}
        )
        self.__dict__.setdefault("repair_failures", {})
        self.__dict__.setdefault("routed_stream", "")  # ... and before the audit stream's truncation rule
        self.done, self.done_buckets, self._journal = {}, collections.deque(), set()
        self._waiting_changed = set()
        self._repairing = {}  # repairs in flight are not saved: a restarted job asks again

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """The state after this batch: `<batch>.state`, what the batch added to or changed
        in `done` as `done/<batch>.chunk`, and `waiting` as `waiting/<batch>.chunk`: what
        the batch added, changed or removed, or (every WAITING_WHOLE_EVERY batches) all of it
        (both written first: a state file is only ever read with the chunks up to its batch).
        A save rewritten under the same batch number (the clock thread's verdicts) rewrites
        its chunks with everything since the batch began."""
        d = Path(directory)
        chunk = [(h, self.done[h]) for h in self._journal if h in self.done]
        _write_atomically(d / "done", f"{self.batch_id}.chunk", chunk)
        whole = self.batch_id % WAITING_WHOLE_EVERY == 0 or self.__dict__.get("_waiting_whole", False)
        waiting = self.waiting
        w_chunk: tuple[str, Any] = (
            ("whole", waiting) if whole else ("changes", [(k, waiting.get(k)) for k in self._waiting_changed])
        )
        _write_atomically(d / "waiting", f"{self.batch_id}.chunk", w_chunk)
        path = _write_atomically(d, f"{self.batch_id}.state", self)
        self.__dict__["_waiting_whole"] = False
        for old in sorted(_state_files(d))[:-3]:  # keep the newest three
            try:
                (d / f"{old}.state").unlink()
            except OSError:
                pass
        # the waiting chunks before the newest whole one at or before the oldest state kept
        kept = _state_files(d)
        wholes = [i for i in _chunk_ids(d / "waiting") if i % WAITING_WHOLE_EVERY == 0 and i <= min(kept, default=-1)]
        if wholes:
            for i in _chunk_ids(d / "waiting"):
                if i < max(wholes):
                    try:
                        (d / "waiting" / f"{i}.chunk").unlink()
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
        if not state.__dict__.get("_waiting_whole", False):  # else its pickle carried `waiting`
            state.waiting = _load_waiting(d / "waiting", state.batch_id)
        return state

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
        self._waiting_changed = set()
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
                h = ikey_hash(ikey)
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
                j, tx, h = -1, ev["tx"], ikey_hash(ikey)
                (e_seq, e_pos, e_row, expected_topic, aggregate_id, event_id, event_type, aggregate_type, payload,
                 is_text, ts_us, cts, cus) = (ev.get(n) for n in _EVENT_FIELDS)  # fmt: skip
            # `_record`: the first record of ours in a truncated partition, the partition's order
            tp = (topic, int(part))
            o = (int(hs), int(hp), int(hr))
            if self.truncated:
                self._first_kept(tp, o)
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
                ex = event_example(ev, cls, None)
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


CHUNK_MARGIN_S = 600.0

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


# `waiting` is saved whole every this many batches (and changes in between): a load reads
# at most this many chunks, a save between writes only what its batch changed.
WAITING_WHOLE_EVERY = 20


def _chunk_ids(d: Path) -> list[int]:
    return sorted(i for p in d.glob("*.chunk") if (i := _chunk_id(p)) is not None) if d.is_dir() else []


def _load_waiting(d: Path, through: int) -> dict[str, dict[str, Any]]:
    """`waiting` after batch `through`: the newest whole chunk at or before it, then the
    changes of each later chunk up to it, in batch order."""
    changes: list[list[tuple[str, Any]]] = []
    waiting: dict[str, dict[str, Any]] = {}
    for i in reversed([i for i in _chunk_ids(d) if i <= through]):
        with open(d / f"{i}.chunk", "rb") as f:
            kind, body = pickle.load(f)
        if kind == "whole":
            waiting = body
            break
        changes.append(body)
    for body in reversed(changes):
        for ikey, rec in body:
            if rec is None:
                waiting.pop(ikey, None)
            else:
                waiting[ikey] = rec
    return waiting


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
