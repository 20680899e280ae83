"""Named places where a test can make the relay die on the spot (SIGKILL, no cleanup).

For tests only. Arm one with the environment variable `CDC_CRASH_AT=<name>[@<n>]`: the
process kills itself the n-th time (default 1st) it passes that point. Unarmed, each
point costs one comparison with None.

Points:
    after_produce              a message was handed to the producer, not yet acknowledged
    after_ack_before_checkpoint  acknowledgements arrived, the checkpoint not yet written
    checkpoint_write           inside the checkpoint store's write, before it is durable
    mid_transaction            rows of a transaction were read, its commit not yet
    recovery                   while reading back the topics at start
    xa_prepared                an XA transaction's prepare was read, its outcome not yet
    xa_outcome                 an XA COMMIT's events were handed to the producer, not yet acknowledged
    txn_before_commit          transactional delivery: messages produced in the open Kafka
                               transaction, its checkpoint and commit not yet
    txn_after_commit           transactional delivery: the Kafka transaction committed, the
                               relay's own bookkeeping of it (last checkpoint, counters) not yet

The relay's reader process (connectors/mysql/reader_process.py) names its parent in `relay_pids`,
so a point reached there kills the whole relay, as it would in one process.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_produce",
    "after_ack_before_checkpoint",
    "checkpoint_write",
    "mid_transaction",
    "recovery",
    "xa_prepared",
    "xa_outcome",
    "txn_before_commit",
    "txn_after_commit",
)

_armed: str | None = None
_remaining = 0
relay_pids: list[int] = []  # other processes of this relay, killed first


def arm(spec: str | None) -> None:
    global _armed, _remaining
    if not spec:
        _armed = None
        return
    name, _, count = spec.partition("@")
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
    _armed, _remaining = name, int(count or 1)


def armed(name: str) -> bool:
    """Whether `name` is the armed point: a loop that would pass a point once per row asks
    once per run of rows, and passes it only when armed (cdc/assembly/feed.py)."""
    return _armed == name


def hit(name: str) -> None:
    global _remaining
    if _armed is None or name != _armed:
        return
    _remaining -= 1
    if _remaining <= 0:
        for pid in relay_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get("CDC_CRASH_AT"))
