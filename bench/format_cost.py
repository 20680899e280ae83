"""What an output format costs per event on the reader process's side, in one process and
without servers: CPU seconds of OutboxMapper.map (row -> event: headers, record timestamp),
prepare (the value's encoding), and to_wire + pickling in 100-event chunks (what the pipe to
the relay carries), then the relay's side of the pipe (unpickling + from_wire). The rows are
`bench catchup`'s (bench/workloads.py payloads; the formats' settings as `catchup --format`
sets them: eventType header, created_at as the record timestamp).

    ./run.sh bench format_cost [--formats envelope,json] [--events 10000] [--rounds 5]
    ./run.sh bench format_cost --commit 3eb7e5a      # an older commit's figures, alternating
    ./run.sh bench format_cost --equal-settings      # the envelope with created_at as its timestamp too

CPU is far steadier than a catch-up's events/s on a shared machine: each figure is the
minimum over the rounds. `--equal-settings` gives the envelope's table `timestamp_column =
"created_at"` too (its Avro `timestamp` field), so the payload formats no longer pay alone for
converting the DATETIME; `additional_placement` has no envelope counterpart (the relay refuses
it there). With `--commit` the older commit is checked out into a temporary
directory and this script runs there too (its `cdc` first on the path), alternating.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("map", "prepare", "wire", "unpickle")


class _Registry:
    """A schema registry that gives every subject id 1 (the encoder's only use of it)."""

    def register_schema(self, subject: str, schema: Any) -> int:
        return 1


def measure(fmt: str, events: int, rounds: int, equal_settings: bool = False) -> dict[str, float]:
    """Microseconds per event of each phase (the minimum over `rounds`)."""
    from multiprocessing.reduction import ForkingPickler

    from cdc.assembly.feed import prepare
    from cdc.events.identity import EventIdentity, TxIdentity
    from cdc.events.outbox import OutboxEvent, OutboxMapper, OutboxTable
    from cdc.events.topics import TopicRouter
    from cdc.position import BinlogPosition
    from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer

    sys.path.append(str(ROOT))  # bench.workloads, after the checkout's own modules
    from bench.workloads import _payload

    if fmt == "envelope":
        table = OutboxTable("bench", "outbox", timestamp_column="created_at" if equal_settings else None)
    else:
        table = OutboxTable(
            "bench", "outbox", format=fmt, additional_placement="type:header:eventType", timestamp_column="created_at"
        )
    serializer = ConfluentAvroSerializer(_Registry())  # type: ignore[arg-type]  # only register_schema is called
    mapper = OutboxMapper(TopicRouter(()))
    rng = random.Random(1)
    start = dt.datetime(2026, 11, 26, 15, 0, 0)
    rows = [
        {
            "id": f"{i:032x}",
            "aggregatetype": "order",
            "aggregateid": f"k{i % 1000}",
            "type": "OrderCreated",
            "payload": _payload(rng, i),
            "created_at": start + dt.timedelta(microseconds=137 * i),
        }
        for i in range(events)
    ]
    tx = TxIdentity("bench", BinlogPosition("mysql-bin.000001", 4), None, 1, 1_795_705_988_645)
    identities = [EventIdentity(tx, i) for i in range(events)]
    best = dict.fromkeys(PHASES, float("inf"))
    for _ in range(rounds):
        t0 = time.process_time()
        mapped = [mapper.map(table, row, identity) for row, identity in zip(rows, identities, strict=True)]
        t1 = time.process_time()
        prepared = [prepare(e, serializer, 1_000_000) for e in mapped]  # type: ignore[arg-type]  # no dead letters here
        t2 = time.process_time()
        chunks = [
            bytes(ForkingPickler.dumps([e.to_wire() for e in prepared[i : i + 100]])) for i in range(0, events, 100)
        ]
        t3 = time.process_time()
        for chunk in chunks:
            for wire in pickle.loads(chunk):
                OutboxEvent.from_wire(wire, identities[0])
        t4 = time.process_time()
        for phase, took in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            best[phase] = min(best[phase], took / events * 1e6)
    return best


def line(label: str, fmt: str, cost: dict[str, float]) -> str:
    phases = ", ".join(f"{p} {cost[p]:.2f}" for p in PHASES)
    return f"{label}{fmt}: {sum(cost.values()):.2f} us/event ({phases})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="envelope,json", help="comma separated (envelope, string, json, bytes)")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commit", default=None, help="an older commit to measure too, alternating")
    ap.add_argument("--equal-settings", action="store_true", help="the envelope with timestamp_column too")
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.commit is None:
        for fmt in formats:
            print(line(args.label, fmt, measure(fmt, args.events, args.rounds, args.equal_settings)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="format-cost-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.commit], cwd=ROOT, check=True)
        try:
            sides = [(f"{args.commit} ", old), ("now ", ROOT)]
            for i in range(2):
                for label, checkout in sides if i % 2 == 0 else sides[::-1]:
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--formats", args.formats]
                    cmd += ["--events", str(args.events), "--rounds", str(args.rounds), "--label", label]
                    cmd += ["--equal-settings"] if args.equal_settings else []
                    subprocess.run(cmd, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, check=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
