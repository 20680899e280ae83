"""A binlog connection that goes silent (a network that drops packets without a reset)
is noticed through the missing heartbeats, and the relay reconnects from its own
position: nothing lost, nothing repeated."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from tests.integration.harness import (
    OUTBOX_DDL, RelayThread, insert_events, read_topic, relay_config, wait_until,
)

pytestmark = pytest.mark.integration


class FreezableProxy:
    """A TCP proxy to the database; `freeze()` stops forwarding on every connection open
    now (they stay open, silent), while new connections are forwarded normally."""

    def __init__(self, target_port: int):
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._frozen: set[int] = set()
        self._live: list[int] = []
        self._generation = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._generation += 1
                gen = self._generation
                self._live.append(gen)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b, gen), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gen: int) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if gen in self._frozen:
                    continue  # swallowed: the peer hears nothing, and no reset either
                dst.sendall(data)
        except OSError:
            pass

    def freeze(self) -> None:
        with self._lock:
            self._frozen.update(self._live)

    def close(self) -> None:
        self._listener.close()


def test_a_silent_connection_is_noticed_and_the_relay_reconnects(mariadb, kafka, database, topic_prefix, tmp_path):
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    kafka.create_topic(f"{topic_prefix}.order", 2)
    proxy = FreezableProxy(mariadb.port)
    try:
        cfg = relay_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json",
                           source__port=proxy.port, source__heartbeat_s=0.5)
        relay = RelayThread(cfg)
        ids = [str(uuid.uuid4()) for _ in range(40)]
        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(i, "order", "k", "T", "{}") for i in ids[:20]])
            conn.commit()
            relay.wait_delivered(20)
            proxy.freeze()  # the relay's binlog stream now hears nothing at all
            insert_events(conn, "outbox", [(i, "order", "k", "T", "{}") for i in ids[20:]])
            conn.commit()
        wait_until(lambda: relay.metrics.reconnects >= 1 or relay.error, 30, "the relay to notice the silence")
        relay.wait_delivered(40, timeout=30)
        relay.stop()
        got = [r.value["id"] for r in read_topic(kafka.bootstrap_servers, f"{topic_prefix}.order")]
        assert sorted(got) == sorted(ids) and len(got) == 40
        assert relay.metrics.reconnects >= 1
    finally:
        proxy.close()
