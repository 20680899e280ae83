"""Continuous compensation (`cdc verify --follow --repair`): a missing event the relay will
never send again is re-published through the repair path, and the following verifier then
counts it `repaired` (docs/verifier.md, "Continuous compensation").

An event is repaired only when both hold: it is missing (no record within the grace
period), and its transaction lies before the relay's checkpoint (the first position not
yet proven delivered; `cdc/checkpoint.py`). The relay only moves its checkpoint past
transactions whose every message the broker acknowledged, and a restarted relay starts
from it: an event behind it is one the relay believes delivered and will not send again.
An event at or after it may still come from the relay (a slow or stopped relay): it is
never repaired, so a repair cannot race the relay into a duplicate.

The verifier does not read the relay's store or publish itself: the command line hands it
a `Compensation` (the checkpoint's position, and `cdc repair` for one event), so the layers
stay as they are (the CLI over the verifier).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.position import file_sequence
from spark_jobs.reconcile_summary import missing_entry

LOG = logging.getLogger("cdc.verify.follow")


@dataclass(frozen=True)
class Compensation:
    """What continuous compensation needs from outside the verifier.

    checkpoint: the relay's checkpointed position `(file, pos)` now (None: no checkpoint
        yet, nothing is behind it); read from the relay's own store.
    republish: one missing event (a `missing.jsonl` entry) -> (published, failure): the
        repair path (`cdc repair`: identity headers and `cdc.repair`); failure is one line
        `reason: what`, None when it went out or was already present.
    every_s: seconds between passes.
    """

    checkpoint: Callable[[], tuple[str, int] | None]
    republish: Callable[[dict[str, Any]], tuple[bool, str | None]]
    every_s: float = 5.0


class Compensator:
    """A thread of the follow job that repairs, pass by pass, under the job's lock for the
    state (never across a broker or binlog call)."""

    def __init__(self, job: Any, compensation: Compensation):
        self.job, self.comp = job, compensation
        self.held = 0  # missing events the relay has not checkpointed past (never repaired)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="follow-repair", daemon=True)

    def start(self) -> Compensator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def _loop(self) -> None:
        while not self._stop.wait(self.comp.every_s):
            try:
                self.run_pass()
            except Exception as exc:  # a pass that failed is tried again at the next: say why
                LOG.warning("follow: repair pass failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:300])

    def run_pass(self) -> int:
        """One pass; the number of events handed to the repair path."""
        job = self.job
        with job.lock:
            st = job.state
            if st is None or not any(
                ev.get("class") == "missing" and k not in st.repair_asked for k, ev in st.open_verdicts.items()
            ):
                self.held = 0
                return 0
        where = self.comp.checkpoint()  # the relay's store: outside the lock
        mark = (file_sequence(where[0])[1], int(where[1])) if where else None
        with job.lock:
            st = job.state
            if st is None:
                return 0
            ready, self.held = st.repair_candidates(lambda o: mark is not None and o < mark)
            todo = [(ev["ikey"], missing_entry(ev)) for ev in ready]
        for ikey, entry in todo:
            if self._stop.is_set():
                break  # the job is stopping: the rest are candidates again at its next start
            with job.lock:
                st = job.state
                still = st is not None and (st.open_verdicts.get(ikey) or {}).get("class") == "missing"
                if still:
                    st.repair_started(ikey)
            if not still:
                # delivered late while earlier ones of this pass were repaired (a repair reads
                # the sink and the binlog: about a second each on RabbitMQ here): nothing to do
                continue
            try:
                published, failure = self.comp.republish(entry)
            except Exception as exc:
                published, failure = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            with job.lock:
                st = job.state
                copy_read = st is not None and st.repair_answered(ikey)
                if copy_read:  # its copy was read (and counted repaired) before the answer: it went out
                    published, failure = True, None
                if st is not None and (ikey in st.open_verdicts or copy_read):
                    st.repair_outcome(ikey, published, failure, time.time())
                    st.save(job.state_dir())
        return len(todo)
