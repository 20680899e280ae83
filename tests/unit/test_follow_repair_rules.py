"""Continuous compensation's pass (`spark_jobs/follow_repair.py`) over a real follow state
and fake ports (the relay's checkpoint, the repair path), without Spark: only events behind
the checkpoint are handed to the repair path, once; no checkpoint means no repair; a repair
path that fails or raises gives the event's `repair_failed` alarm with its cause."""

from __future__ import annotations

import logging
import threading

import pytest

from spark_jobs.follow_repair import Compensation, Compensator
from tests.unit.test_follow_state import F1, ev, progress, state

pytestmark = pytest.mark.verifier_deps


class _Job:
    def __init__(self, st, tmp_path):
        self.lock = threading.RLock()
        self.state = st
        self._dir = tmp_path

    def state_dir(self):
        return self._dir


def _missing(tmp_path, *positions):
    st = state()
    events = [ev(p) for p in positions]
    st.apply_batch(0, [*events, progress(400)], [], now=0.0)
    st.expire(now=11.0)
    assert st.counts["missing"] == len(events)
    return _Job(st, tmp_path), events


def test_only_events_behind_the_relays_checkpoint_are_repaired_and_each_once(tmp_path) -> None:
    job, (a, b) = _missing(tmp_path, 100, 300)
    asked = []
    where = [None]
    comp = Compensation(checkpoint=lambda: where[0], republish=lambda e: (asked.append(e["event_id"]) or True, None))
    c = Compensator(job, comp)
    assert c.run_pass() == 0 and asked == [] and c.held == 2  # no checkpoint yet: nothing is behind it
    where[0] = (F1, 200)  # the relay passed a's transaction, not b's
    assert c.run_pass() == 1 and asked == [a["event_id"]] and c.held == 1
    assert c.run_pass() == 0 and asked == [a["event_id"]]  # asked once
    assert job.state.repairs["requested"] == 1 and job.state.repairs["published"] == 1
    assert (tmp_path / "0.state").is_file()  # the outcome is saved with the state


@pytest.mark.parametrize(
    ("republish", "reason"),
    [
        (lambda e: (False, "not_in_binlog: its transaction is no longer in the binlog (purged?)"), "not_in_binlog"),
        (lambda e: (_ for _ in ()).throw(RuntimeError("broker refused: topic gone")), "RuntimeError"),
    ],
)
def test_a_repair_that_fails_is_the_events_alarm(tmp_path, caplog, republish, reason) -> None:
    job, (a,) = _missing(tmp_path, 100)
    c = Compensator(job, Compensation(checkpoint=lambda: (F1, 400), republish=republish))
    with caplog.at_level(logging.WARNING, "cdc.verify.follow"):
        assert c.run_pass() == 1
    assert job.state.repair_failures == {reason: 1} and job.state.counts["missing"] == 1
    assert any(m.startswith("ALARM repair_failed") and a["event_id"] in m for m in caplog.messages), caplog.messages
    assert c.run_pass() == 0  # not tried again: a person acts on the alarm


def test_a_pass_skips_an_event_delivered_meanwhile_and_stops_with_the_job(tmp_path) -> None:
    """A slow first micro-batch can call many events missing that the relay did send: while
    the pass repairs the first, the next batch delivers the second (it is not handed to the
    repair path); a job stopping during a repair ends the pass (the third waits for the next
    start), so a long list never keeps `stop` waiting."""
    from tests.unit.test_follow_state import rec

    job, (a, b, c3) = _missing(tmp_path, 100, 200, 300)
    asked: list[str] = []
    comp_ = None

    def republish(entry):
        asked.append(entry["event_id"])
        with job.lock:  # the next micro-batch, while this repair runs
            job.state.apply_batch(1, [], [rec(b, 7)], now=12.0)
        comp_._stop.set()  # and the job is told to stop
        return True, None

    comp_ = Compensator(job, Compensation(checkpoint=lambda: (F1, 400), republish=republish))
    assert comp_.run_pass() == 3  # three candidates...
    assert asked == [a["event_id"]]  # ...one handed to the repair path
    assert job.state.counts["missing"] == 2 and job.state.late_deliveries == 1  # b late; c3 still missing
    assert job.state.repairs["requested"] == 1


def test_a_copy_read_before_its_repair_returns_is_counted_repaired(tmp_path) -> None:
    """The repair path publishes, then waits for its broker's confirmation and returns; the
    follow job's next micro-batch may read the copy before that (a 1 s trigger, a repair of
    about a second on RabbitMQ). The copy is still the repair's: `repaired`, not a late
    delivery, and the repair's outcome is counted once it returns."""
    from tests.unit.test_follow_state import rec

    job, (a,) = _missing(tmp_path, 100)

    def republish(entry):
        with job.lock:  # the next micro-batch reads the copy before the repair returns
            job.state.apply_batch(1, [], [rec(a, 9, repair=True)], now=12.0)
        return True, None

    assert Compensator(job, Compensation(checkpoint=lambda: (F1, 400), republish=republish)).run_pass() == 1
    st = job.state
    assert st.counts["missing"] == 0 and st.counts["repaired"] == 1 and st.late_deliveries == 0, st.counts
    assert st.repairs["requested"] == 1 and st.repairs["published"] == 1 and st.repairs["repaired"] == 1
    assert not st.repair_asked  # nothing left awaited


def test_a_repair_in_flight_is_not_saved_as_asked(tmp_path) -> None:
    """A job killed while a repair is in flight starts again without it marked asked: the
    event is a candidate again (the repair path finds a copy that went out present and does
    not publish it twice)."""
    from spark_jobs.follow_state import FollowState

    job, (a,) = _missing(tmp_path, 100)
    saved = []

    def republish(entry):
        with job.lock:  # a micro-batch's save while the repair is in flight
            job.state.save(tmp_path)
            saved.append(FollowState.load(tmp_path, before=10**9))
        raise RuntimeError("killed")

    Compensator(job, Compensation(checkpoint=lambda: (F1, 400), republish=republish)).run_pass()
    again, _held = saved[0].repair_candidates(lambda o: True)
    assert [e["ikey"] for e in again] == [a["ikey"]]
