"""TLS on a cluster: the two stream sinks against a 3-node RabbitMQ 3.10 cluster and a 3-node
JetStream cluster (testbed/rabbitmq_cluster.py, testbed/nats.py) whose nodes serve their
clients over TLS only with a certificate the test's CA signed (tests/integration/tls_certs.py),
and want a client certificate. The relay's settings name every node by its TLS port, with the
CA, verify-identity (the certificate holds 127.0.0.1) and the client certificate.

On each: the publisher (the relay's own, from the relay's settings) publishes without pause
while the node leading a stream is SIGKILLed and started again; every message is confirmed,
none fails; `cdc check`'s lines over TLS name the stream that runs without the dead node and
stop warning once it is back; the verifier's reader, from its data source's options over TLS,
reads each stream back from the cluster: every message once, in publish order. On RabbitMQ
the publisher's connection for each stream is its leader's TLS port (the Metadata answer of a
TLS connection names the nodes' `stream.advertised_tls_port`).

What a single machine cannot show stays in docs/sinks.md: nodes on other hosts, advertised
host names other than 127.0.0.1, a partition.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE
from testbed.lab_server import ServerTls
from testbed.process import HOST
from tests.integration.harness import wait_until
from tests.integration.tls_certs import TlsFiles, make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.fault]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _server_tls(files: TlsFiles) -> ServerTls:
    return ServerTls(files.server_cert, files.server_key, files.ca, True, files.client_cert, files.client_key)


def _client_files(files: TlsFiles) -> dict[str, str]:
    return {"ca_file": str(files.ca), "cert_file": str(files.client_cert), "key_file": str(files.client_key)}


class _Publishing:
    """A publisher fed without pause from a thread of its own (a server restarted from a
    thread dies with it, so the test's thread restarts nodes), to `topics` in turn, each
    message's `cdc.binlog.pos` its number on its topic; at most `window` unanswered."""

    def __init__(self, publisher: Any, topics: list[str], window: int = 4000) -> None:
        self.publisher, self.topics, self.window = publisher, topics, window
        self.reports: list[Any] = []
        self.sent = dict.fromkeys(topics, 0)
        self.left = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        publisher = self.publisher
        for n in itertools.count(1):
            if self._stop.is_set():
                break
            for topic in self.topics:
                self.sent[topic] = n
                headers = [(H_SOURCE, b"tls"), (H_FILE, b"bin.000001"), (H_POS, str(n).encode()), (H_ROW, b"0")]
                publisher.publish(topic, b"k", b"v%d" % n, headers, self.reports.append)
            publisher.poll(0 if publisher.pending() < self.window else 0.05)
            if n % 10 == 0:
                time.sleep(0.002)  # a few thousand a second: the read-back stays short
        self.left = publisher.flush(120)

    def __enter__(self) -> _Publishing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(180)
        self.publisher.close()

    def confirmed_after_now(self, more: int = 300) -> None:
        """Wait until, on every topic, `more` messages sent after now are answered too."""
        sent = dict(self.sent)

        def answered() -> bool:
            counts = collections.Counter(r.topic for r in list(self.reports))
            return all(counts[topic] >= n + more for topic, n in sent.items())

        wait_until(answered, 90, f"{more} more messages answered on every topic")

    def assert_all_confirmed(self) -> None:
        total = sum(self.sent.values())
        assert self.left == 0, f"{self.left} of {total} messages not confirmed"
        failed = [r.failure for r in self.reports if r.failure is not None]
        assert len(self.reports) == total and not failed, f"{len(self.reports)} reports of {total}: {failed[:3]}"


def _positions(records: Any) -> list[int]:
    return [int(dict(r.headers())[H_POS]) for r in records]


def _members(cluster: Any, stream: str) -> int:
    """The running members of a RabbitMQ stream (0: no answer, no leader)."""
    try:
        return 1 + len(cluster.leader_and_replicas(stream)[1])
    except Exception:
        return 0


def _kill_and_restart(
    run: _Publishing, node: Any, new_leader: Callable[[], bool], back: Callable[[], bool], warned: Callable[[], bool]
) -> None:
    node.kill()
    run.confirmed_after_now()
    wait_until(new_leader, 60, "a new leader of the stream")
    wait_until(warned, 60, "cdc check to name the stream running without the dead node")
    node.restart(graceful=False)
    wait_until(back, 180, "the restarted node's replica back")
    time.sleep(1.0)


# ---------------------------------------------------------------------------- RabbitMQ


@pytest.fixture(scope="module")
def rabbit_cluster_tls(tls_files):
    from testbed.rabbitmq_cluster import RabbitCluster

    with RabbitCluster.start(tls=_server_tls(tls_files)) as cluster:
        yield cluster


def _rabbit_config(cluster: Any, files: TlsFiles, dlq: str) -> Any:
    """What `cdc check` reads of a loaded configuration (cdc.config): the sink's section as
    `[sink.rabbitmq_stream]` with `host`/`port` the first node's TLS port, `hosts` the others'."""
    from cdc.config import RabbitStreamConfig, Secret

    first, *others = cluster.nodes
    section = RabbitStreamConfig(
        host=HOST, port=first.stream_tls_port, user=cluster.user, password=Secret(cluster.password), tls=True,
        hosts=tuple(f"{HOST}:{n.stream_tls_port}" for n in others), **_client_files(files),
    )  # fmt: skip
    return SimpleNamespace(
        sink=SimpleNamespace(rabbitmq_stream=section), kafka=SimpleNamespace(dead_letter_topic=dlq), tables=[]
    )


def test_rabbitmq_streams_cluster_over_tls(rabbit_cluster_tls, tls_files, topic_prefix):
    from connectors.rabbitmq.stream_reader import StreamSettings
    from connectors.rabbitmq.stream_sink import RabbitStreamPublisher, check_rabbitmq
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range, settings_from_options

    cluster = rabbit_cluster_tls
    first, second, third = cluster.nodes
    a, b = f"{topic_prefix}.a", f"{topic_prefix}.b"
    cluster.create_stream(a, leader=second)
    cluster.create_stream(b, leader=third)
    cfg = _rabbit_config(cluster, tls_files, a)
    settings = StreamSettings.from_config(cfg.sink.rabbitmq_stream)
    assert settings.tls and settings.port == first.stream_tls_port

    def replica_warnings() -> list[str]:
        return [r.message for r in check_rabbitmq(cfg) if r.name == "rabbitmq_replicas" and r.warn]

    assert [r.ok for r in check_rabbitmq(cfg)] == [True, True, True] and replica_warnings() == []

    def new_leader() -> bool:
        try:
            return cluster.stream_leader(a) is not second
        except Exception:  # no leader elected yet
            return False

    def back() -> bool:
        return _members(cluster, a) == 3

    dead = f"{HOST}:{second.stream_tls_port}"
    with _Publishing(RabbitStreamPublisher(settings, f"cdc-relay.{topic_prefix}"), [a, b]) as run:
        wait_until(lambda: len(run.reports) >= 200, 60, "the first confirms")
        publisher = run.publisher
        declared_on = {s.name: s.client for s in list(publisher._streams.values())}
        at = {id(c): address for address, c in list(publisher._clients.items())}
        assert {name: at[id(c)] for name, c in declared_on.items()} == {
            a: (HOST, second.stream_tls_port),
            b: (HOST, third.stream_tls_port),
        }  # each stream's leader, by its TLS port
        _kill_and_restart(
            run, second, new_leader, back, lambda: any(repr(a) in w and dead in w for w in replica_warnings())
        )
    run.assert_all_confirmed()
    assert replica_warnings() == []

    options = {
        "host": HOST, "port": str(first.stream_tls_port), "hosts": f"{HOST}:{third.stream_tls_port}",
        "user": cluster.user, "password": cluster.password, "tls": "true", **_client_files(tls_files),
    }  # fmt: skip
    reader = settings_from_options(options)
    for topic in (a, b):
        [part] = plan_rabbitmq(reader, [topic], empty_wait=2.0)["partitions"]
        stored = _positions(read_range(reader, topic, part["partition"], part["stream"], part["low"], part["high"]))
        assert stored == list(range(1, run.sent[topic] + 1)), f"{topic}: {run.sent[topic]} sent, {len(stored)} stored"
    print(f"\nRabbitMQ cluster over TLS: {run.sent} messages, the leader of {a} SIGKILLed once")


def test_rabbitmq_first_publish_to_a_stream_without_a_leader(rabbit_cluster_tls, tls_files, topic_prefix):
    """The run's first message to a stream that has no leader: two of its three members'
    nodes SIGKILLed (no majority, no election can end), then the publisher publishes to it.
    Nothing is confirmed and nothing fails while the stream has no leader; once one node is
    back a leader is elected and every message is confirmed, once, in order."""
    from connectors.rabbitmq.stream_reader import StreamSettings
    from connectors.rabbitmq.stream_sink import RabbitStreamPublisher
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range, settings_from_options

    cluster = rabbit_cluster_tls
    first, second, third = cluster.nodes
    c = f"{topic_prefix}.c"
    cluster.create_stream(c, leader=third)
    cfg = _rabbit_config(cluster, tls_files, c)
    third.kill()
    second.kill()
    try:
        publisher = RabbitStreamPublisher(StreamSettings.from_config(cfg.sink.rabbitmq_stream), "cdc-relay.first")
        reports: list[Any] = []
        try:
            for n in range(1, 101):
                publisher.publish(c, b"k", b"v%d" % n, [(H_POS, str(n).encode())], reports.append)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                publisher.poll(0.1)
            assert reports == [] and publisher.pending() == 100  # waiting for a leader, not failed
            second.restart(graceful=False)
            assert publisher.flush(90) == 0
        finally:
            publisher.close()
    finally:
        for node in (second, third):
            if not node.running:
                node.restart(graceful=False)
        # the module's next tests declare streams of three members: all three back first
        wait_until(lambda: _members(cluster, c) == 3, 180, "the stream's three members back")
    assert [(r.offset, r.failure) for r in reports] == [(n, None) for n in range(100)]
    options = {
        "host": HOST, "port": str(first.stream_tls_port), "user": cluster.user, "password": cluster.password,
        "tls": "true", **_client_files(tls_files),
    }  # fmt: skip
    reader = settings_from_options(options)
    [part] = plan_rabbitmq(reader, [c], empty_wait=2.0)["partitions"]
    assert _positions(read_range(reader, c, part["partition"], part["stream"], part["low"], part["high"])) == list(
        range(1, 101)
    )


def test_rabbitmq_exchange_sink_cluster_over_tls(rabbit_cluster_tls, tls_files, topic_prefix):
    """The exchange sink over AMQP 0-9-1 with TLS (`amqps`, each node's `listeners.ssl.default`)
    and its audit stream read over the stream protocol's TLS, `hosts` and `stream_hosts` the
    other nodes' TLS ports: the node the publisher's connection is on is SIGKILLed under
    publishing; the publisher goes on through the next node, sending again only what the audit
    stream lacks. Every message confirmed; the audit stream, read back by the verifier's reader
    over TLS, holds each once, in publish order per routing key."""
    from connectors.rabbitmq.exchange_sink import ExchangeSettings, RabbitExchangePublisher
    from spark_jobs.rabbitmq.source import plan_rabbitmq, read_range, settings_from_options
    from tests.integration.rabbit_exchange import names
    from tests.integration.test_rabbitmq_exchange_cluster import _declare

    cluster = rabbit_cluster_tls
    first, second, third = cluster.nodes
    _declare(cluster, topic_prefix)  # the exchange; the audit stream (leader: the second node) and a quorum queue
    n = names(topic_prefix)
    settings = ExchangeSettings(
        HOST, first.amqp_tls_port, first.stream_tls_port, "/", cluster.user, cluster.password, exchange=n.exchange,
        audit_stream=n.audit, tls=True, hosts=tuple((HOST, o.amqp_tls_port) for o in (second, third)),
        stream_hosts=tuple((HOST, o.stream_tls_port) for o in (second, third)), **_client_files(tls_files),
    )  # fmt: skip
    topics = [f"{topic_prefix}.a", f"{topic_prefix}.b"]
    with _Publishing(RabbitExchangePublisher(settings), topics, window=2000) as run:
        wait_until(lambda: len(run.reports) >= 200, 60, "the first confirms")
        first.kill()  # the publisher's connection is on `host`, the first node
        run.confirmed_after_now()  # through another node
        first.restart(graceful=False)
        time.sleep(1.0)
    run.assert_all_confirmed()

    options = {
        "host": HOST, "port": str(second.stream_tls_port), "user": cluster.user, "password": cluster.password,
        "tls": "true", "audit_stream": n.audit, **_client_files(tls_files),
    }  # fmt: skip
    reader = settings_from_options(options)
    [part] = plan_rabbitmq(reader, [], empty_wait=2.0)["partitions"]
    records = list(
        read_range(reader, part["topic"], part["partition"], part["stream"], part["low"], part["high"], routed=True)
    )
    for topic in topics:
        stored = _positions(r for r in records if r.topic() == topic)
        assert stored == list(range(1, run.sent[topic] + 1)), f"{topic}: {run.sent[topic]} sent, {len(stored)} stored"
    print(f"\nRabbitMQ exchange sink on the cluster over TLS: {run.sent}, the publisher's node SIGKILLed once")


# ---------------------------------------------------------------------------- NATS


@pytest.fixture(scope="module")
def nats_cluster_tls(tls_files):
    from testbed.nats import NatsCluster

    with NatsCluster.start(tls=_server_tls(tls_files)) as cluster:
        yield cluster


def test_nats_jetstream_cluster_over_tls(nats_cluster_tls, tls_files, topic_prefix):
    from cdc.config import NatsJetStreamConfig, Secret
    from connectors.nats.sink import NatsJetStreamPublisher, check_nats
    from spark_jobs.nats.source import plan_nats, read_range, settings_from_options
    from tests.integration.nats_harness import create_streams

    cluster = nats_cluster_tls
    subject, stream = f"{topic_prefix}.order", f"{topic_prefix}_events"
    dlq, dlq_stream = f"{topic_prefix}.dlq", f"{topic_prefix}_dlq"
    create_streams(cluster, {stream: [subject], dlq_stream: [dlq]}, num_replicas=3)
    urls = tuple(cluster.urls)
    assert all(url.startswith("nats://") for url in urls)  # TLS is asked for by the CA, as a user would
    cfg = NatsJetStreamConfig(
        servers=urls, user=cluster.nodes[0].user, password=Secret(cluster.nodes[0].password), ack_timeout_s=3.0,
        **_client_files(tls_files),
    )  # fmt: skip

    def warnings() -> list[str]:
        return [r.message for r in check_nats(cfg, dlq) if r.warn]

    results = check_nats(cfg, dlq)
    assert all(r.ok for r in results) and warnings() == [], [r.message for r in results]
    leader = cluster.stream_leader(stream)
    name = leader.cluster.name

    def new_leader() -> bool:
        try:
            return cluster.stream_leader(stream).cluster.name != name
        except Exception:  # no leader yet
            return False

    def back() -> bool:
        try:
            info = cluster.stream_cluster(stream)
        except Exception:
            return False
        return all(r.current and not r.offline for r in info.replicas or [])

    with _Publishing(NatsJetStreamPublisher(cfg), [subject]) as run:
        wait_until(lambda: len(run.reports) >= 200, 60, "the first acknowledgements")
        _kill_and_restart(run, leader, new_leader, back, lambda: any(stream in w and name in w for w in warnings()))
    run.assert_all_confirmed()
    wait_until(lambda: warnings() == [], 60, "cdc check to warn no more")

    options = {
        "servers": ",".join(urls),
        "user": cfg.user,
        "password": cfg.password.reveal(),
        **_client_files(tls_files),
    }
    reader = settings_from_options(options)
    assert reader["ca_file"] == str(tls_files.ca)  # the context is made at connect, from these
    [part] = plan_nats(reader, [subject])["partitions"]
    stored = _positions(read_range(reader, subject, part["stream"], part["low"], part["high"]))
    assert stored == list(range(1, run.sent[subject] + 1)), f"{run.sent[subject]} sent, {len(stored)} stored"
    print(f"\nNATS cluster over TLS: {run.sent[subject]} messages, the leader {name} SIGKILLed once")
