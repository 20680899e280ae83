"""What nats-server alone takes on this machine: the relay's own messages (the HPUB bytes its
publisher writes, `connectors.nats.sink.message_header_block`, one identity each so none is a
duplicate), built in memory first and written to a JetStream stream from one raw socket as
fast as the server reads them. No relay, no reader, no Python in the way but this harness's
socket writes and one thread counting the answers.

    ./run.sh bench nats_ceiling [--messages 100000] [--rounds 2]

Prints, for each round, the messages stored a second and the server's CPU a message, twice:
each message with a reply subject (what the relay sends: the server answers each with a
PubAck; at most 8,192 unanswered, the relay's window) and without one (the server stores it
and answers nothing: what publishing without an answer a message, as a batch publish would,
can save the server at most; written as fast as the server reads, so past its buffer of a
stream, `jetstream.max_buffered_msgs`, it drops messages: the run then stops and says so). Beside
`bench/catchup.py --sink nats_jetstream` this says which share of the sink's cost a
catch-up puts on the server, on the 2 cores the relay, its reader and the server share
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from connectors.nats.sink import message_header_block  # noqa: E402  # after the sys.path entry above
from testbed.nats import EmbeddedNats  # noqa: E402  # after the sys.path entry above

# About the catch-up benchmark's message: a 185-byte Avro value, its transaction's headers
# and its own (cdc/delivery/handover.py `_headers`), 100 events a transaction.
_VALUE = b"\x00\x00\x00\x00\x01" + b"x" * 180
_PER_TX = 100
_WINDOW = 8192  # messages unanswered at most, as the relay's default sink.nats_jetstream.max_in_flight


def _headers(i: int) -> list[tuple[str, bytes | None]]:
    return [
        ("cdc.source", b"bench"),
        ("cdc.server_id", b"1"),
        ("cdc.binlog.file", b"mysql-bin.000001"),
        ("cdc.binlog.pos", str(4 + 2100 * (i // _PER_TX)).encode()),
        ("cdc.commit_ts", b"1700000000000"),
        ("cdc.row", str(i % _PER_TX).encode()),
        ("cdc.event_id", f"3f2a9c1e-0000-4000-8000-{i:012d}".encode()),
        ("cdc.event_type", b"OrderCreated"),
        ("cdc.table", b"outbox"),
    ]


def _wire(subject: str, count: int, answered: bool) -> bytes:
    """`count` HPUB commands as the relay's publisher writes them (`_hpub`)."""
    parts = []
    for i in range(count):
        block = message_header_block(subject, b"order-%d" % (i % 5000), _VALUE, _headers(i), None) + b"\r\n"
        reply = b" _INBOX.bench.%d_1" % i if answered else b""
        parts.append(b"HPUB %s%s %d %d\r\n" % (subject.encode(), reply, len(block), len(block) + len(_VALUE)))
        parts += (block, _VALUE, b"\r\n")
    return b"".join(parts)


def _stored(server: EmbeddedNats, stream: str, create: bool, subject: str = "") -> int:
    import nats
    from nats.js.api import StreamConfig

    async def ask() -> int:
        nc = await nats.connect(**server.connect_settings())
        try:
            js = nc.jetstream()
            if create:
                await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
            return int((await js.stream_info(stream)).state.messages)
        finally:
            await nc.close()

    return asyncio.run(ask())


def run_once(server: EmbeddedNats, count: int, answered: bool, n: int) -> tuple[float, float]:
    """Messages stored a second and server CPU seconds a message."""
    stream, subject = f"ceiling_{n}", f"ceiling.{n}"
    _stored(server, stream, True, subject)
    wire = _wire(subject, count, answered)
    host, port = server.url.removeprefix("nats://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.recv(65536)  # INFO
    hello = {"verbose": False, "pedantic": False, "headers": True, "user": server.user, "pass": server.password}
    sock.sendall(b"CONNECT %s\r\nSUB _INBOX.bench.* 1\r\nPING\r\n" % json.dumps(hello).encode())
    got = b""
    while b"PONG\r\n" not in got:
        got += sock.recv(65536)
    answers = 0
    done = threading.Event()

    def count_answers() -> None:  # each PubAck is one MSG to the inbox
        nonlocal answers
        tail = b""
        while answers < count:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data = tail + chunk
            answers += data.count(b"MSG _INBOX.bench.")
            tail = data[-24:]
            answers -= tail.count(b"MSG _INBOX.bench.")
        done.set()

    nats_server = psutil.Process(server.pid)
    cpu = sum(nats_server.cpu_times()[:2])
    start = time.perf_counter()
    if answered:
        threading.Thread(target=count_answers, daemon=True).start()
    view = memoryview(wire)
    step = len(wire) // count * _WINDOW // 4  # about a quarter of the window a write
    for at in range(0, len(wire), step):
        if answered:  # at most _WINDOW messages unanswered, as the relay's window
            while at // (len(wire) // count) - answers > _WINDOW - _WINDOW // 4 and not done.is_set():
                time.sleep(0.0005)
        sock.sendall(view[at : at + step])
    if answered:
        done.wait(300)
    else:  # nothing answers: until the stream holds them all, or stops growing (dropped: 429)
        held, since = -1, time.perf_counter()
        while held < count and time.perf_counter() - since < 2.0:
            now = _stored(server, stream, False)
            if now != held:
                held, since = now, time.perf_counter()
            time.sleep(0.01)
    elapsed = time.perf_counter() - start
    cpu = sum(nats_server.cpu_times()[:2]) - cpu
    sock.close()
    held = _stored(server, stream, False)
    if held != count:
        raise SystemExit(
            f"the stream holds {held} messages of {count}: the server dropped the rest (its buffer of a "
            "stream, jetstream.max_buffered_msgs); use fewer --messages"
        )
    return count / elapsed, cpu / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with EmbeddedNats.start() as server:
        n = 0
        for i in range(args.rounds):
            for answered in (True, False):
                n += 1
                rate, cpu = run_once(server, args.messages, answered, n)
                what = "with a PubAck each " if answered else "without an answer"
                print(
                    f"round {i + 1}, {what}: {rate:,.0f} messages/s stored, "
                    f"server CPU {cpu * 1e6:.1f} us a message ({rate * cpu:.2f} cores)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
