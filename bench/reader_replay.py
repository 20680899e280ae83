"""The reader process's pipeline replayed over a captured binlog stream: CPU seconds per
stage, without a server, a broker or neighbours' noise in the figure.

    ./run.sh bench reader_replay [--mixed] [--events 30000] [--per-tx 100] [--capture FILE]
                                 [--repeat 5] [--stage feed] [--against PATH]

Writes `bench/workloads.py`'s workload to a throwaway MariaDB once and records the socket
bytes of a non-blocking dump of its range (`--capture FILE`: kept, and reused when it
exists). Then replays those bytes, `--repeat` times, through the stage asked for, with the
relay's own classes and a socket that hands out the recorded reads:

  frame   BinlogConnection's framing alone (event_batches, or events() in older trees)
  decode  framing + BinlogDecoder (event_runs + decode_reads; older trees: decode_batch, or
          decode() per event)
  feed    + MySQLBinlogSource, LocalFeed and the transaction assembly, each transaction's
          items mapped (what the reader does before the Avro encoding and the pipe)
  ship    the whole reader: `connectors.mysql.reader_process._ship` over the feed, each event
          Avro-encoded and each pipe message pickled as the reader pickles it (not sent)

and prints the best CPU seconds. `--against PATH`: a checkout of another commit (e.g.
`git worktree add --detach /tmp/old 3eb7e5a`) replays the same capture too, alternating
with this tree, each in its own interpreter.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WATCHED = {("bench", "outbox")}


def capture(path: Path, events: int, mixed: bool, per_tx: int = 100) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.workloads import bench_server, create_schema, write
    from connectors.mysql.binlog_protocol import BinlogConnection

    with bench_server() as db:
        create_schema(db, "bench", mixed)
        with db.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
        write(db, "bench", events, per_tx=per_tx, mixed=mixed)
        s = db.connection_settings()
        bc = BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=904)
        bc.dump_file(file, pos, blocking=False)
        reads: list[bytes] = []
        recv = bc._recv

        def recording(*args):
            chunk = recv(*args)
            reads.append(chunk)
            return chunk

        bc._recv = recording  # type: ignore[method-assign]
        count = sum(1 for _ in bc.events())
        bc.close()
    path.write_bytes(pickle.dumps({"file": file, "pos": pos, "reads": reads}))
    print(f"captured {count} binlog events, {sum(map(len, reads)):,} bytes, into {path}")


def replay(path: Path, stage: str, repeat: int) -> float:
    """Best CPU seconds of `stage` over the capture, with the modules of the current directory."""
    sys.path.insert(0, os.getcwd())
    from cdc.assembly.feed import MORE, LocalFeed, assembler_for
    from cdc.assembly.transaction import CommittedTransaction
    from cdc.errors import SourceError
    from cdc.events.outbox import OutboxTable
    from cdc.position import BinlogPosition
    from cdc.relay_settings import RelaySettings
    from cdc.source_events import ServerInfo
    from connectors.mysql.binlog_decoder import BinlogDecoder
    from connectors.mysql.binlog_protocol import BinlogConnection
    from connectors.mysql.binlog_source import MySQLBinlogSource

    cap = pickle.loads(path.read_bytes())

    class Socket:
        def __init__(self, closed: threading.Event):
            self.reads, self.closed = iter(cap["reads"]), closed

        def recv(self, _n: int) -> bytes:
            for chunk in self.reads:
                return chunk
            self.closed.set()  # as after close(): the stream ends quietly
            return b""

    def connection():
        bc = object.__new__(BinlogConnection)
        bc._streaming = bc._live = True
        bc._closed = threading.Event()
        bc._sock = Socket(bc._closed)
        bc.read_timeout = 5
        return bc

    batched = hasattr(BinlogConnection, "event_batches")

    def source():
        bc, dec = connection(), BinlogDecoder(WATCHED, cap["file"], flavor="mariadb")
        if hasattr(bc, "event_runs"):  # as connectors/mysql/binlog_source.py reads
            items, convert = bc.event_runs(), dec.decode_reads
        elif batched:
            items, convert = bc.event_batches(), dec.decode_batch
        else:
            items, convert = bc.events(), dec.decode
        return MySQLBinlogSource(items, convert, lambda: None, ServerInfo(1, "mariadb"), 0, threaded=False)

    class Sources:
        opened = False

        def open(self, start):
            if self.opened:
                raise SourceError("the capture ended")
            self.opened = True
            return source()

    def ship(feed: Any) -> None:
        from multiprocessing.reduction import ForkingPickler

        from connectors.mysql.reader_process import _ship
        from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client

        class Pipe:  # the bytes go nowhere (older trees: Connection.send's pickling here)
            def send(self, obj: Any) -> None:
                ForkingPickler.dumps(obj)

            def send_bytes(self, data: bytes) -> None:  # _ship pickles itself (reader5)
                pass

            def poll(self, _timeout: float) -> bool:
                return False

        spec: Any = type("Spec", (), {"settings": settings})
        _ship(Pipe(), Pipe(), feed, ConfluentAvroSerializer(registry_client("mock://replay")), spec)

    settings = RelaySettings("bench", (OutboxTable("bench", "outbox"),))

    def run() -> None:
        if stage == "frame":
            for _ in connection().events():
                pass
        elif stage == "decode":
            src = source()
            try:
                while True:
                    src.read(1)
            except SourceError:
                pass
        else:
            start = BinlogPosition(cap["file"], cap["pos"])
            sources: Any = Sources()  # the factory's open() is all LocalFeed uses here
            feed = LocalFeed(sources, assembler_for(settings, 1), start, 0, time.time, time.sleep, time.sleep)
            try:
                if stage == "ship":
                    ship(feed)
                while True:
                    item = feed.read(1)
                    if item is MORE or item is None:
                        continue
                    if isinstance(item, CommittedTransaction):
                        for _ in item.items():
                            pass
                        item.release()
            except SourceError:
                pass

    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        run()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--mixed", action="store_true", help="10 other tables; outbox = 1/11 of the rows")
    ap.add_argument("--per-tx", type=int, default=100, help="outbox events per transaction (1: per-transaction costs)")
    ap.add_argument("--capture", default=None, help="the capture file (written when missing)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stage", choices=("frame", "decode", "feed", "ship"), default="feed")
    ap.add_argument("--against", default=None, help="another checkout replaying the same capture")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: alternating pairs")
    ap.add_argument("--replay", default=None, help=argparse.SUPPRESS)  # one tree's run (internal)
    args = ap.parse_args()
    if args.replay:
        print(f"{replay(Path(args.replay), args.stage, args.repeat):.4f}")
        return
    kind = "mixed" if args.mixed else "outbox"
    kind += "" if args.per_tx == 100 else f"-{args.per_tx}-per-tx"
    path = Path(args.capture or f"/tmp/cdc-reader-replay-{kind}-{args.events}.pkl")
    if not path.exists():
        import logging

        logging.disable(logging.WARNING)
        capture(path, args.events, args.mixed, args.per_tx)
    trees = [("now", ROOT)] + ([("against", Path(args.against).resolve())] if args.against else [])
    results: dict[str, list[float]] = {name: [] for name, _ in trees}
    for i in range(args.rounds if args.against else 1):
        for name, tree in trees if i % 2 == 0 else trees[::-1]:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--replay", str(path)]
            cmd += ["--stage", args.stage, "--repeat", str(args.repeat)]
            done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"bench reader_replay: the replay in {tree} failed:\n{done.stderr[-2000:]}")
            results[name].append(float(done.stdout.split()[-1]))
            print(
                f"round {i + 1} {name:>8} ({tree}): {args.stage} {results[name][-1]:.3f} s CPU (best of {args.repeat})"
            )
    best = {name: min(v) for name, v in results.items()}
    what = path.name if args.capture else f"{kind}, {args.events} events"
    line = f"{what}, stage {args.stage}: now {best['now']:.3f} s CPU"
    if args.against:
        line += f", against {best['against']:.3f} s: now / against {best['now'] / best['against']:.3f}"
    print(line)


if __name__ == "__main__":
    main()
