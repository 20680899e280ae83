"""The verifier's JetStream reading alone: `spark_jobs.nats.source.read_range` over one
subject of a stream on a throwaway nats-server, CPU per record and records/s, in a child
process per round (alternately with another checkout's, `--against`).

    ./run.sh bench nats_read [--events 100000] [--against <a checkout>] [--rounds 2]

Each message is what the relay publishes: its 13 headers (the identity, the event id,
type, table, key and timestamp) and a 300-byte payload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADERS = {
    "cdc.source": "shop", "cdc.server.id": "1", "cdc.binlog.file": "mysql-bin.000001", "cdc.binlog.pos": "123456",
    "cdc.commit.ts": "1732800000000", "cdc.gtid": "0-1-123", "cdc.binlog.row": "0",
    "id": "0f8fad5b-d9cb-469f-a165-70867728950e", "cdc.event.type": "Created", "cdc.table": "bench.outbox",
    "cdc.key": "k1", "cdc.timestamp": "1732800000000",
}  # fmt: skip

READ = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from spark_jobs.nats.source import read_range
settings, events = json.loads(sys.argv[2]), int(sys.argv[3])
cpu, wall = time.process_time(), time.time()
n = sum(1 for _ in read_range(settings, "bench.a", "BENCH", 1, events + 1))
cpu, wall = time.process_time() - cpu, time.time() - wall
assert n == events, n
print(f"{sys.argv[1]}: {cpu / n * 1e6:.1f} us CPU a record, {n / wall:,.0f} records/s")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--against", default=None, help="another checkout, read alternately")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import nats
    from nats.js.api import StreamConfig

    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:

        async def write() -> None:
            nc = await nats.connect(**server.connect_settings())
            try:
                js = nc.jetstream()
                await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"]))
                acks = []
                for i in range(args.events):
                    acks.append(
                        await js.publish_async("bench.a", b"x" * 300, headers={**HEADERS, "Nats-Msg-Id": str(i)})
                    )
                    if len(acks) >= 2000:
                        await asyncio.gather(*acks)
                        acks = []
                await asyncio.gather(*acks)
            finally:
                await nc.close()

        asyncio.run(write())
        settings = json.dumps(server.connect_settings())
        trees = [str(ROOT)] + ([str(Path(args.against).resolve())] if args.against else [])
        for _ in range(args.rounds):
            for tree in trees:
                subprocess.run([sys.executable, "-c", READ, tree, settings, str(args.events)], cwd=tree, check=True)


if __name__ == "__main__":
    main()
