"""The lab's RabbitMQ node and nats-server pick free ports and bind them later: a port taken
in between (two nodes started at once by two processes, two pytest workers) made the start
fail (`rabbitmq-server exited with code 1 during start-up ... eaddrinuse`). A start now tries
again on new ports when the server says its port was in use: proven here with the port
taken for sure (a listener of the test's own), and with two starts at once."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from testbed.process import HOST, free_port

pytestmark = pytest.mark.integration


@contextmanager
def _taken_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        yield listener.getsockname()[1]


def _picks(taken: int, at_call: int) -> Callable[[], int]:
    """free_port, except that its `at_call`-th call (from 1) returns `taken`."""
    calls = [0]

    def pick() -> int:
        calls[0] += 1
        return taken if calls[0] == at_call else free_port()

    return pick


def test_a_rabbitmq_stream_port_taken_before_the_node_binds_it(monkeypatch, caplog):
    import testbed.rabbitmq as rabbit

    with _taken_port() as taken:
        # EmbeddedRabbitMQ.__init__ picks the AMQP port, then the stream port (call 2)
        monkeypatch.setattr(rabbit, "free_port", _picks(taken, 2))
        with caplog.at_level(logging.WARNING, "testbed.rabbitmq"), rabbit.EmbeddedRabbitMQ.start() as node:
            assert node.stream_port != taken and node.running
    assert "a port was taken before the node bound it" in caplog.text and "eaddrinuse" in caplog.text


def test_a_nats_port_taken_before_the_server_binds_it(monkeypatch, caplog):
    import testbed.nats as nats

    with _taken_port() as taken:
        monkeypatch.setattr(nats, "free_port", _picks(taken, 1))
        with caplog.at_level(logging.WARNING, "testbed.nats"), nats.EmbeddedNats.start() as server:
            assert server.port != taken and server.running
    assert "its port was taken before it bound it" in caplog.text


@pytest.mark.parametrize("kind", ["rabbitmq", "nats"])
def test_two_started_at_once(kind):
    """Each from its own thread, kept alive until the end (a lab server dies with the
    thread that started it: PR_SET_PDEATHSIG)."""
    from testbed.nats import EmbeddedNats
    from testbed.rabbitmq import EmbeddedRabbitMQ

    cls = EmbeddedRabbitMQ if kind == "rabbitmq" else EmbeddedNats
    started: list = []
    errors: list[BaseException] = []
    done, go = threading.Event(), threading.Barrier(2)

    def start() -> None:
        try:
            go.wait()
            with cls.start() as server:
                started.append(server)
                done.wait(300)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        from tests.integration.harness import wait_until

        wait_until(lambda: len(started) + len(errors) == 2, 300, f"two {kind} servers started")
        assert errors == [], errors
        assert all(s.running for s in started)
    finally:
        done.set()
        for t in threads:
            t.join(120)
