"""The relay process's work per event, this tree against another commit, in one process:
both trees' modules are loaded side by side (each under its own copy of the packages) and
alternated every `--chunk` transactions, so the host's speed swings (CPU per event moves
by half between identical runs on this machine) hit both alike.

    ./run.sh bench relay_handover --commit d0d8df7 [--events 60000] [--rounds 5] [--chunk 10]
    ./run.sh bench relay_handover --against PATH        # a checkout of the other tree

What runs, for each tree: the reader process's "tx" pipe messages (pickled, 100 envelope
events each, the payload inside the value) -> `ShippedTransaction` -> `Handover` ->
`KafkaPublisher` against the Kafka stand-in (24 partitions), `poll(0)` after each
transaction as the relay loop does, the window advanced every 10 transactions. Figures:
main-thread CPU per event (thread_time), per round and the median of the per-chunk ratios;
the CPU of each tree's own librdkafka threads (its producer's broker and main threads,
found as the threads its producer started, read from /proc/self/task/TID/schedstat over
the round: they run beside both trees' chunks, so only per round) and main + those per
event, the figure the relay pays; the collector's time apart. An A/A run (a tree against
itself) shows the noise: per-round ratios within about 3% on this machine.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cdc", "connectors", "testbed", "bench")
_CLASSES = (
    ("cdc.delivery.ledger", "Ledger"),
    ("cdc.delivery.handover", "Handover"),
    ("cdc.events.identity", "TxIdentity"),
    ("cdc.delivery.lease_guard", "LeaseGuard"),
    ("cdc.log_limit", "LogLimiter"),
    ("cdc.metrics", "RelayMetrics"),
    ("cdc.delivery.missing_topics", "MissingTopics"),
    ("cdc.events.outbox", "OutboxTable"),
    ("cdc.position", "BinlogPosition"),
    ("cdc.relay_settings", "RelaySettings"),
    ("cdc.delivery.unlocated", "UnlocatedConfirmation"),
    ("connectors.kafka.sink", "KafkaPublisher"),
    ("connectors.mysql.reader_process", "ShippedTransaction"),
)
_collector: dict[str, Any] = {"tree": None, "t0": 0.0, "spent": {}}


def _collector_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _collector["t0"] = time.thread_time()
    elif _collector["tree"] is not None:
        spent = _collector["spent"]
        spent[_collector["tree"]] = spent.get(_collector["tree"], 0.0) + time.thread_time() - _collector["t0"]


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _thread_cpu(tids: set[str]) -> float:
    """CPU seconds of these threads of this process (schedstat's first field: ns on a CPU)."""
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # a thread librdkafka ended (a broker thread decommissioned)
            pass
    return total / 1e9


def load(tree: Path) -> dict[str, Any]:
    """The classes the hand-over needs, from `tree`'s own modules (the packages dropped
    from sys.modules first, so each tree gets its own copies)."""
    for name in list(sys.modules):
        if name.split(".")[0] in PACKAGES:
            del sys.modules[name]
    sys.path.insert(0, str(tree))
    try:
        space = {name: getattr(importlib.import_module(module), name) for module, name in _CLASSES}
    finally:
        sys.path.remove(str(tree))
    # pickle finds a class by its module's name: each tree's modules are put back before it runs
    space["modules"] = {k: v for k, v in sys.modules.items() if k.split(".")[0] in PACKAGES}
    return space


class _Mode:
    """The delivery mode's part in the hand-over: nothing to do between transactions."""

    readable_when_acknowledged = True

    def handing_over(self, tx: Any) -> None:
        pass

    def topic_named(self) -> None:
        pass


class Run:
    """One tree's hand-over of `transactions` pipe messages to its own producer."""

    def __init__(self, space: dict[str, Any], bootstrap: str, topic: str, transactions: int):
        self.space = space
        sys.modules.update(space["modules"])
        settings = space["RelaySettings"](
            source_name="bench", tables=(space["OutboxTable"]("bench", "outbox"),), dead_letter_topic="bench.dlq"
        )
        self.metrics = metrics = space["RelayMetrics"]()
        before = _threads()
        self.publisher = publisher = space["KafkaPublisher"](bootstrap)
        self.ledger = ledger = space["Ledger"]("bench", "bench.dlq", None, None, metrics, time.time)
        ledger.partitions[topic] = 24  # named: the hand-over asks no metadata
        self.handover = space["Handover"](
            settings,
            publisher,
            None,
            ledger,
            _Mode(),
            space["MissingTopics"](settings, None, None, time.monotonic),
            space["UnlocatedConfirmation"](None, metrics),
            space["LogLimiter"](10.0, time.monotonic),
            space["LeaseGuard"](None, time.monotonic, publisher),
            metrics,
            time.time,
        )
        self.messages = _messages(space, topic, transactions + 1)  # the first warms up
        self.cpu, self.events, self.next = 0.0, 0, 0
        self._one(self.messages[0])
        publisher.flush(10)
        ledger.window.advance()
        self.next = 1
        # The producer's threads, its broker threads too (started once metadata named
        # the broker): those that appeared since it was made, its first message delivered.
        self.threads = _threads() - before
        self.threads_cpu = _thread_cpu(self.threads)

    def _one(self, message: bytes) -> None:
        _, identity, end, size, items, more, _counters, xa = pickle.loads(message)
        self.handover.transaction(self.space["ShippedTransaction"](None, identity, end, size, items, more, xa))

    def chunk(self, count: int) -> float:
        """Main-thread CPU seconds per event of the next `count` transactions."""
        sys.modules.update(self.space["modules"])
        poll, window, one, messages = self.publisher.poll, self.ledger.window, self._one, self.messages
        t0 = time.thread_time()
        for i in range(self.next, self.next + count):
            one(messages[i])
            poll(0)
            if i % 10 == 0:
                window.advance()
        spent = time.thread_time() - t0
        self.next += count
        self.cpu += spent
        self.events += count * 100
        return spent / (count * 100)

    def finish(self) -> tuple[float, float]:
        """Serve the last acknowledgements; CPU seconds per event over the run, of the
        main thread and of this tree's librdkafka threads."""
        t0 = time.thread_time()
        while self.publisher.pending():
            self.publisher.poll(0.05)
        self.ledger.window.advance()
        self.cpu += time.thread_time() - t0
        handed = len(self.messages) * 100
        window = self.ledger.window
        if self.metrics.events_published != handed or window.events_delivered != handed or len(window):
            raise SystemExit(f"{self.metrics.events_published} of {handed} events acknowledged")
        self.publisher.close()
        # The warm-up's events are not in self.events: their threads' CPU was read after it.
        return self.cpu / self.events, (_thread_cpu(self.threads) - self.threads_cpu) / self.events


def _messages(space: dict[str, Any], topic: str, count: int) -> list[bytes]:
    """`count` "tx" pipe messages as the reader sends them (connectors/mysql/reader_process.py):
    100 envelope events each, tag 2 (the payload inside the ~450-byte value), 1000 keys."""
    rng = random.Random(1)
    aggregate_type, event_type, table = (sys.intern(s) for s in ("order", "OrderCreated", "bench.outbox"))
    tx_identity, position = space["TxIdentity"], space["BinlogPosition"]
    out = []
    for n in range(count):
        identity = tx_identity(
            "bench", position("mysql-bin.000001", 4 + n * 50_000), f"0-1-{n + 1}", 1, 1_764 * 10**9 + n
        )
        items = [
            (2, "%08x-0000-4000-8000-%012x" % (1, n * 100 + i), aggregate_type, f"order-{rng.randrange(1000)}",
             event_type, None, None, topic, table, b"\0\0\0\0\1" + rng.randbytes(440), None)
            for i in range(100)
        ]  # fmt: skip
        end = position("mysql-bin.000001", 4 + (n + 1) * 50_000)
        out.append(pickle.dumps(("tx", identity, end, 100, items, False, (0, 0, 0), None)))
    return out


def compare(trees: list[Path], names: list[str], events: int, rounds: int, chunk: int) -> None:
    sys.path.insert(0, str(ROOT))
    from testbed.kafka_standin import KafkaStandin

    sys.path.remove(str(ROOT))
    spaces = [load(t) for t in trees]
    gc.set_threshold(10_000, *gc.get_threshold()[1:])  # as Relay.run does
    gc.callbacks.append(_collector_timer)
    per_tree: list[list[float]] = [[], []]
    totals: list[list[float]] = [[], []]
    transactions = events // 100
    with KafkaStandin.start(brokers=1) as kafka:
        for r in range(rounds):
            runs = []
            for i, space in enumerate(spaces):
                topic = f"handover{r}t{i}.order"
                kafka.create_topic(topic, 24)
                runs.append(Run(space, kafka.bootstrap_servers, topic, transactions))
            gc.collect()
            ratios = []
            for c in range(transactions // chunk):
                figures = [0.0, 0.0]
                for i in (0, 1) if c % 2 == 0 else (1, 0):
                    _collector["tree"] = i
                    figures[i] = runs[i].chunk(chunk)
                    _collector["tree"] = None
                ratios.append(figures[0] / figures[1])
            finished = [run.finish() for run in runs]
            us = [main * 1e6 for main, _ in finished]
            rdk = [threads * 1e6 for _, threads in finished]
            collector = [_collector["spent"].get(i, 0.0) / runs[i].events * 1e6 for i in (0, 1)]
            _collector["spent"] = {}
            for i in (0, 1):
                per_tree[i].append(us[i])
                totals[i].append(us[i] + rdk[i])
            print(
                f"round {r}: {names[0]} {us[0]:.2f} us an event, {names[1]} {us[1]:.2f} ({us[0] / us[1]:.3f}); "
                f"median chunk ratio {statistics.median(ratios):.3f}; collector {collector[0]:.2f} / {collector[1]:.2f} us; "
                f"librdkafka's threads {rdk[0]:.2f} / {rdk[1]:.2f} us, main + those {totals[0][-1]:.2f} / "
                f"{totals[1][-1]:.2f} ({totals[0][-1] / totals[1][-1]:.3f})",
                flush=True,
            )
    a, b = statistics.median(per_tree[0]), statistics.median(per_tree[1])
    print(
        f"medians of {rounds} rounds: {names[0]} {a:.2f} us an event, {names[1]} {b:.2f} ({a / b:.3f}, {a - b:+.2f} us)"
    )
    ta, tb = statistics.median(totals[0]), statistics.median(totals[1])
    ratio = statistics.median(x / y for x, y in zip(totals[0], totals[1], strict=True))
    print(
        f"main thread + librdkafka's threads, medians: {names[0]} {ta:.2f} us an event, {names[1]} {tb:.2f} "
        f"(median of the rounds' ratios {ratio:.3f}, {ta - tb:+.2f} us)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    other = ap.add_mutually_exclusive_group(required=True)
    other.add_argument("--commit", help="the other tree: this commit, exported with git archive")
    other.add_argument("--against", type=Path, help="the other tree: a checkout")
    ap.add_argument("--events", type=int, default=60_000, help="per tree and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=10, help="transactions between switches")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-handover-") as tmp:
        if args.commit:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.commit], capture_output=True, check=False)
            if archive.returncode:
                raise SystemExit(f"git archive {args.commit}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            other_tree, other_name = Path(tmp), args.commit
        else:
            other_tree, other_name = args.against.resolve(), str(args.against)
        compare([ROOT, other_tree], ["this tree", other_name], args.events, args.rounds, args.chunk)


if __name__ == "__main__":
    main()
