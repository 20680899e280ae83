"""Check-back of XA transactions that stay prepared and undecided.

RocketMQ's transactional messages ask the producer about a half message that has waited
too long ("check-back"). Here the database is the one to ask: an XA transaction whose
prepare the relay has read, and whose outcome it has not, is held (never published, the
checkpoint held at its prepare, cdc/delivery/inflight.py) and, once older than an immunity time,
checked with `XA RECOVER` every interval, up to a number of checks. Each check is logged
with the xid, its age and the position it holds back. After the last check the relay
keeps holding it, but reports it as an operator problem: a metric, a `/readyz` detail and
one log line naming the fix (`XA COMMIT` or `XA ROLLBACK` the xid on the server).

The age is measured from the prepare event's own timestamp, so it survives a restart of
the relay (which reads the prepare again).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cdc.delivery.inflight import HeldPrepare

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Checks:
    done: int = 0
    last_at: float = 0.0
    reported: bool = False


class XaCheckBack:
    """`run(held, now)` on the relay's checkpoint timer. `sources.prepared_xids()` answers
    which xids the server lists as prepared (None when the relay may not ask)."""

    def __init__(self, settings: Any, sources: Any, metrics: Any):
        self._after = settings.xa_check_after_s
        self._interval = settings.xa_check_interval_s
        self._max = settings.xa_max_checks
        self._sources = sources
        self._metrics = metrics
        self._checks: dict[str, _Checks] = {}

    def run(self, held: dict[str, HeldPrepare], now: float) -> None:
        m = self._metrics
        m.xa_undecided = len(held)
        if not held:
            if self._checks:
                self._checks.clear()
            m.xa_oldest_undecided_age_s = 0.0
            m.xa_problems = []
            return
        for xid in [x for x in self._checks if x not in held]:
            del self._checks[xid]
        m.xa_oldest_undecided_age_s = max(0.0, now - min(h.prepared_ts for h in held.values()))
        listed: set[str] | None = None
        asked = False
        problems = []
        for xid, h in held.items():
            age = now - h.prepared_ts
            state = self._checks.setdefault(xid, _Checks())
            if state.done >= self._max:
                problems.append(self._problem(h, age))
                continue
            if age < self._after or now - state.last_at < self._interval:
                continue
            if not asked:
                listed, asked = self._listed(), True
            state.done += 1
            state.last_at = now
            where = (
                f"prepared at {h.prepared_at} {age:.0f} s ago; its events are held and the checkpoint "
                f"stays at {h.resume.position}"
            )
            if listed is None:
                log.warning(
                    "XA transaction %s is undecided (check %d of %d, XA RECOVER not permitted): %s",
                    xid,
                    state.done,
                    self._max,
                    where,
                )
            elif xid in listed:
                log.warning(
                    "XA transaction %s is undecided: XA RECOVER lists it as prepared (check %d of %d); %s",
                    xid,
                    state.done,
                    self._max,
                    where,
                )
            else:
                log.info(
                    "XA transaction %s: XA RECOVER no longer lists it: decided, its outcome is not read yet "
                    "(check %d of %d); %s",
                    xid,
                    state.done,
                    self._max,
                    where,
                )
            if state.done >= self._max:
                problems.append(self._problem(h, age))
                if not state.reported:
                    state.reported = True
                    log.error(
                        "XA transaction %s prepared at %s is still undecided after %d checks (%.0f s): its "
                        "events are held and the checkpoint stays at %s; decide it on the server: XA COMMIT %s "
                        "or XA ROLLBACK %s",
                        xid,
                        h.prepared_at,
                        state.done,
                        age,
                        h.resume.position,
                        xid,
                        xid,
                    )
        m.xa_problems = problems

    @staticmethod
    def _problem(h: HeldPrepare, age: float) -> str:
        return (
            f"XA transaction {h.xid} prepared at {h.prepared_at} undecided for {age:.0f} s: XA COMMIT or XA ROLLBACK it"
        )

    def _listed(self) -> set[str] | None:
        ask = getattr(self._sources, "prepared_xids", None)
        if ask is None:
            return None
        try:
            return ask()
        except Exception as exc:
            log.warning("XA RECOVER failed (%s); the check-back goes on without it", exc)
            return None
