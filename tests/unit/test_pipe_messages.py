"""The relay's end of the reader process's data pipe (connectors/mysql/reader_process.py,
`PipeMessages`): the messages multiprocessing's Connection sends (`send_bytes` of a pickle,
as the child's `_ship` does) come back one by one and equal, whatever the sizes (a short
message and its header in one write, a long one after its header, one longer than a read)
and however the bytes arrive (a byte at a time, many messages in one read); the 8-byte
length Connection writes for 2 GiB and more; a timeout with nothing or half a message;
the end of the pipe as EOFError, and the feed's one line. Pipes only, no process."""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
from multiprocessing.connection import Connection

import pytest

from cdc.errors import SourceError
from connectors.mysql.reader_process import PipeMessages, ProcessFeed


@pytest.fixture
def pipe():
    """A pipe's two ends; a test that closes one sets it to None (else closed here)."""
    ends = list(os.pipe())
    yield ends
    for fd in ends:
        if fd is not None:
            os.close(fd)


def _messages() -> list[tuple]:
    return [
        ("ev", None, (0, 0, 0)),
        ("tx", "identity", "end", 3, [(2, "id", b"v" * 20_000)], False, (1, 2, 3), None),  # past 16 KiB
        ("items", [(2, str(i), b"x" * 600) for i in range(800)], True),  # past a read of 256 KiB
        ("error", "cdc.errors", "SourceError", "gone"),
    ]


def test_messages_come_back_one_by_one_as_sent(pipe) -> None:
    r, w = pipe
    sender = Connection(os.dup(w), readable=False)
    sent = _messages() * 3

    def send() -> None:
        for message in sent:
            sender.send_bytes(pickle.dumps(message))

    thread = threading.Thread(target=send)  # a pipe holds 64 KiB: the reader must read as it goes
    thread.start()
    got = PipeMessages(r)
    assert [got.recv(None) for _ in sent] == sent
    thread.join()


def test_bytes_a_few_at_a_time(pipe) -> None:
    r, w = pipe
    frames = b"".join(struct.pack("!i", len(p)) + p for p in (pickle.dumps(m) for m in _messages()))

    def trickle() -> None:
        os.write(w, frames[:1])
        time.sleep(0.02)
        for i in range(1, len(frames), 997):
            os.write(w, frames[i : i + 997])

    thread = threading.Thread(target=trickle)
    thread.start()
    got = PipeMessages(r)
    assert [got.recv(None) for _ in _messages()] == _messages()
    thread.join()


def test_half_a_message_then_the_rest(pipe) -> None:
    """As Connection.poll then recv: something came, so the rest of it is waited for."""
    r, w = pipe
    frame = struct.pack("!i", 5) + pickle.dumps(1)[:5]
    body = pickle.dumps(("ev", 2, (0, 0, 0)))
    os.write(w, struct.pack("!i", len(body)) + body[:3])
    threading.Timer(0.05, lambda: os.write(w, body[3:] + frame)).start()
    got = PipeMessages(r)
    assert got.recv(0.01) == ("ev", 2, (0, 0, 0))


def test_the_long_length_of_2_gib_and_more(pipe) -> None:
    """Connection writes -1 then an 8-byte length for a message of 2 GiB or more; a short
    message written that way reads the same (no test sends 2 GiB)."""
    r, w = pipe
    body = pickle.dumps(("items", [(2, "a")], False))
    os.write(
        w, struct.pack("!i", -1) + struct.pack("!Q", len(body)) + body + struct.pack("!i", 10) + pickle.dumps(1)[:2]
    )
    got = PipeMessages(r)
    assert got.recv(0.5) == ("items", [(2, "a")], False)
    assert got.recv(0.01) is None  # the next is cut short


def test_nothing_within_the_timeout(pipe) -> None:
    r, _ = pipe
    got = PipeMessages(r)
    t0 = time.monotonic()
    assert got.recv(0.05) is None
    assert time.monotonic() - t0 >= 0.04


def test_the_end_of_the_pipe(pipe) -> None:
    r, w = pipe
    sender = Connection(w, readable=False)
    pipe[1] = None  # the Connection's now
    sender.send_bytes(pickle.dumps(("ev", 1, (0, 0, 0))))
    sender.close()
    got = PipeMessages(r)
    assert got.recv(0.5) == ("ev", 1, (0, 0, 0))
    with pytest.raises(EOFError):
        got.recv(0.5)


def test_the_feed_says_the_reader_stopped_in_one_line(pipe) -> None:
    r, w = pipe
    os.close(w)
    pipe[1] = None

    class Stopped:
        exitcode = 3

        def join(self, timeout: float) -> None:
            pass

    feed = ProcessFeed(Connection(os.dup(r), writable=False), None, Stopped())
    with pytest.raises(SourceError, match=r"reader process stopped unexpectedly \(exit code 3\)"):
        feed.read(0.5)
