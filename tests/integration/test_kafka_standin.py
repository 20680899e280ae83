"""Integration tests for the embedded Kafka stand-in (testbed.kafka_standin).

Every test talks to a real stand-in process through confluent_kafka clients,
so what passes here is what the relay and the demo will see.  Tests that
break the cluster (broker down, pushed errors, stop) get their own process;
start-up costs about 0.05 s, so isolation is cheap.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from testbed.kafka_standin import KafkaStandin, StandinError
from tests.integration.harness import wait_until

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]
FAST_CLIENT: dict[str, Any] = {
    # Default reconnect backoff grows to 10 s; keep recovery within test deadlines.
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def process_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def deliver(producer: Producer, topic: str, timeout: float, **kwargs: Any) -> tuple[KafkaError | None, Message]:
    """Produce one message and return its delivery report, bounded by ``timeout``."""
    reports: list[tuple[KafkaError | None, Message]] = []
    producer.produce(topic, on_delivery=lambda err, msg: reports.append((err, msg)), **kwargs)
    deadline = time.monotonic() + timeout
    while not reports and time.monotonic() < deadline:
        producer.poll(0.05)
    assert reports, f"no delivery report for {topic} within {timeout}s"
    return reports[0]


def consume(bootstrap: str, topic: str, count: int, timeout: float) -> list[Message]:
    """Read ``count`` messages through a consumer group, bounded by ``timeout``.

    The pattern that works against the mock: a fresh group.id,
    auto.offset.reset=earliest, subscribe(), poll().  The mock's group
    coordinator honours group.initial.rebalance.delay.ms (3 s by default),
    which the fixtures set to 0.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        while len(messages) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            messages.append(msg)
        return messages
    finally:
        consumer.close()


def watermarks(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5.0)
        return low, high
    finally:
        consumer.close()


def free_port_run(count: int) -> int:
    """Find ``count`` consecutive free ports on 127.0.0.1 (best effort, retried)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError(f"no run of {count} free ports found")


def connect_refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return False
    except ConnectionRefusedError:
        return True


def start_cli(*args: str) -> subprocess.Popen[bytes]:
    """Run the server entry point directly, as the demo or a person would."""
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.kafka_standin", *args],
        cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="module")
def standin() -> Iterator[KafkaStandin]:
    """A shared single-broker stand-in for tests that do not disturb it."""
    with KafkaStandin.start(brokers=1, group_initial_rebalance_delay_ms=0) as handle:
        yield handle


@pytest.fixture
def own_standin() -> Iterator[Callable[..., KafkaStandin]]:
    """Factory for private stand-ins, all stopped at teardown.

    The mock's error stack is cluster-wide and broker state is shared, so a
    test that pushes errors or takes brokers down gets its own process.
    """
    started: list[KafkaStandin] = []

    def factory(**kwargs: Any) -> KafkaStandin:
        kwargs.setdefault("group_initial_rebalance_delay_ms", 0)
        handle = KafkaStandin.start(**kwargs)
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        handle.stop()


# --- (1) round trip ---------------------------------------------------------


def test_idempotent_message_round_trips_key_headers_and_timestamp(standin: KafkaStandin) -> None:
    topic = unique("roundtrip")
    standin.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": standin.bootstrap_servers, "enable.idempotence": True, "acks": "all"})
    timestamp_ms = 1_700_000_000_123
    headers = [("event-type", b"OrderCreated"), ("trace", b"\x00\x01binary")]

    err, msg = deliver(
        producer,
        topic,
        10.0,
        key=b"order-42",
        value=b'{"id": 42}',
        headers=headers,
        timestamp=timestamp_ms,
    )
    assert err is None
    assert (msg.partition(), msg.offset()) == (0, 0)

    [got] = consume(standin.bootstrap_servers, topic, 1, timeout=10.0)
    assert got.key() == b"order-42"
    assert got.value() == b'{"id": 42}'
    assert got.headers() == headers
    assert got.timestamp() == (1, timestamp_ms)  # TIMESTAMP_CREATE_TIME


# --- (2) topic creation ---------------------------------------------------------


def test_topic_created_with_six_partitions_reports_six(standin: KafkaStandin) -> None:
    topic = unique("six")
    standin.create_topic(topic, partitions=6)

    admin = AdminClient({"bootstrap.servers": standin.bootstrap_servers})
    metadata = admin.list_topics(topic=topic, timeout=10.0)
    assert metadata.topics[topic].error is None
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2, 3, 4, 5]

    consumer = Consumer({"bootstrap.servers": standin.bootstrap_servers, "group.id": unique("md")})
    try:
        assert len(consumer.list_topics(topic, timeout=10.0).topics[topic].partitions) == 6
    finally:
        consumer.close()

    with pytest.raises(StandinError, match="TOPIC_ALREADY_EXISTS"):
        standin.create_topic(topic, partitions=6)


# --- (3) broker down / up -------------------------------------------------------


def test_broker_down_is_seen_by_clients_and_recovers_when_up(
    own_standin: Callable[..., KafkaStandin],
) -> None:
    handle = own_standin(brokers=2)
    topic = unique("downup")
    handle.create_topic(topic, partitions=1)
    handle.set_leader(topic, 0, 2)
    broker2_port = int(handle.bootstrap_servers.split(",")[1].rpartition(":")[2])

    producer = Producer({"bootstrap.servers": handle.bootstrap_servers, "message.timeout.ms": 1500, **FAST_CLIENT})
    err, _ = deliver(producer, topic, 10.0, value=b"before")
    assert err is None

    handle.broker_down(2)
    assert connect_refused(broker2_port)
    admin = AdminClient({"bootstrap.servers": handle.bootstrap_servers})
    assert sorted(admin.list_topics(timeout=10.0).brokers) == [1]  # Metadata drops it
    err, _ = deliver(producer, topic, 10.0, value=b"while-down")
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT

    handle.broker_up(2)
    assert sorted(admin.list_topics(timeout=10.0).brokers) == [1, 2]
    err, msg = deliver(producer, topic, 15.0, value=b"after")
    assert err is None, err
    assert msg.offset() == 1  # the timed-out message never reached the log
    assert watermarks(handle.bootstrap_servers, topic) == (0, 2)


# --- (4) stop ---------------------------------------------------------------------


def test_stop_ends_the_process(own_standin: Callable[..., KafkaStandin]) -> None:
    handle = own_standin(brokers=3)
    pid = handle.pid
    assert psutil.pid_exists(pid)

    started = time.monotonic()
    handle.stop()
    assert time.monotonic() - started < 5.0
    assert not psutil.pid_exists(pid)
    assert handle.exit_code == 0  # clean shutdown, not the kill fallback
    assert not handle.log_path.exists()
    handle.stop()  # idempotent
    with pytest.raises(StandinError, match="stopped"):
        handle.create_topic(unique("late"))


# --- (5) ports ----------------------------------------------------------------------


def test_requested_port_in_use_raises_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]

        with pytest.raises(StandinError) as excinfo:
            KafkaStandin.start(port=port)
        assert str(excinfo.value) == (
            f"Kafka stand-in: port {port} is already in use; pick another port or stop the program holding it"
        )

        # The server detects it too (for direct `python -m` use, and for races
        # between the parent's check and the child's bind).
        proc = start_cli("--port", str(port))
        out, _ = proc.communicate(timeout=20.0)
        assert proc.returncode == 2
        assert json.loads(out) == {"error": str(excinfo.value)}


def test_second_broker_port_in_use_is_named(own_standin: Callable[..., KafkaStandin]) -> None:
    first = free_port_run(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first + 1))
        holder.listen(1)
        with pytest.raises(StandinError, match=f"port {first + 1} is already in use"):
            own_standin(brokers=2, port=first)


def test_fixed_ports_serve_clients_and_follow_broker_state(
    own_standin: Callable[..., KafkaStandin],
) -> None:
    first = free_port_run(2)
    handle = own_standin(brokers=2, port=first)
    assert handle.bootstrap_servers == f"127.0.0.1:{first},127.0.0.1:{first + 1}"

    admin = AdminClient({"bootstrap.servers": handle.bootstrap_servers})
    advertised = {b.id: b.port for b in admin.list_topics(timeout=10.0).brokers.values()}
    assert advertised == {1: first, 2: first + 1}

    topic = unique("fixed")
    handle.create_topic(topic, partitions=2, replication_factor=2)
    producer = Producer({"bootstrap.servers": handle.bootstrap_servers, "enable.idempotence": True})
    for partition in (0, 1):
        err, _ = deliver(producer, topic, 10.0, value=b"v%d" % partition, partition=partition)
        assert err is None
    assert len(consume(handle.bootstrap_servers, topic, 2, timeout=10.0)) == 2

    handle.broker_down(1)
    assert connect_refused(first)
    handle.broker_up(1)
    with socket.create_connection(("127.0.0.1", first), timeout=2.0):
        pass


# --- start-up failures -------------------------------------------------------------


def fake_interpreter(tmp_path: Path, body: str) -> str:
    """A stand-in for sys.executable that misbehaves the way a broken child would."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def test_failed_start_shows_the_childs_last_stderr_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_interpreter(tmp_path, 'echo "first line" >&2\necho "librdkafka: something broke" >&2\nexit 3')
    monkeypatch.setattr(sys, "executable", fake)
    with pytest.raises(StandinError) as excinfo:
        KafkaStandin.start(startup_timeout=10.0)
    message = str(excinfo.value)
    assert "exited with status 3 during start-up" in message
    assert message.endswith("first line\nlibrdkafka: something broke")


def test_start_gives_up_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_interpreter(tmp_path, 'echo "stuck" >&2\nexec sleep 30')
    monkeypatch.setattr(sys, "executable", fake)
    started = time.monotonic()
    with pytest.raises(StandinError, match=r"within 0.5s; last stderr lines:\nstuck"):
        KafkaStandin.start(startup_timeout=0.5)
    assert time.monotonic() - started < 5.0


def test_invalid_librdkafka_setting_is_reported() -> None:
    expected = 'Invalid value "bogus" for configuration property "debug"'
    with pytest.raises(StandinError, match=expected):
        KafkaStandin.start(debug="bogus")


# --- (6) pushed errors -----------------------------------------------------------------


def test_pushed_retriable_errors_are_retried_and_delivered_exactly_once(
    own_standin: Callable[..., KafkaStandin],
) -> None:
    handle = own_standin()
    topic = unique("retriable")
    handle.create_topic(topic)
    stats: list[dict[str, Any]] = []
    producer = Producer(
        {
            "bootstrap.servers": handle.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "statistics.interval.ms": 100,
            "stats_cb": lambda raw: stats.append(json.loads(raw)),
        }
    )
    err, _ = deliver(producer, topic, 10.0, value=b"warm-up")
    assert err is None

    # NOT_LEADER_OR_FOLLOWER (6), twice: the next two Produce requests fail.
    handle.push_errors("Produce", [6, "NOT_LEADER_OR_FOLLOWER"])
    err, msg = deliver(producer, topic, 10.0, value=b"exactly-once")
    assert err is None
    assert msg.offset() == 1

    values = [m.value() for m in consume(handle.bootstrap_servers, topic, 2, timeout=10.0)]
    assert values == [b"warm-up", b"exactly-once"]
    assert watermarks(handle.bootstrap_servers, topic) == (0, 2)  # no duplicate appended

    # The errors were really served: 1 warm-up + 2 failed + 1 successful request.
    def produce_requests() -> int:
        producer.poll(0.05)
        if not stats:
            return 0
        return sum(b["req"].get("Produce", 0) for b in stats[-1]["brokers"].values())

    wait_until(lambda: produce_requests() >= 4, 5.0, "statistics showing the retried requests")


def test_pushed_non_retriable_error_reaches_the_delivery_callback(
    own_standin: Callable[..., KafkaStandin],
) -> None:
    handle = own_standin()
    topic = unique("fatal")
    handle.create_topic(topic)
    producer = Producer({"bootstrap.servers": handle.bootstrap_servers, "acks": "all"})
    err, _ = deliver(producer, topic, 10.0, value=b"warm-up")
    assert err is None

    # ApiKey by number, error by KafkaError name.  (TOPIC_AUTHORIZATION_FAILED
    # would do too, but librdkafka then marks the topic unusable for this producer.)
    handle.push_errors(0, ["MSG_SIZE_TOO_LARGE"])
    err, _ = deliver(producer, topic, 10.0, value=b"rejected")
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE

    err, msg = deliver(producer, topic, 10.0, value=b"accepted")  # the stack is used up
    assert err is None and msg.offset() == 1


def test_control_channel_rejects_bad_requests(standin: KafkaStandin) -> None:
    with pytest.raises(StandinError, match="no broker 7"):
        standin.broker_down(7)
    with pytest.raises(StandinError, match="unknown api_key 'Bogus'"):
        standin.push_errors("Bogus", [6])
    with pytest.raises(StandinError, match="replication_factor"):
        standin.create_topic(unique("rf"), partitions=1, replication_factor=2)
    with pytest.raises(StandinError, match="unknown cmd"):
        standin.request("no_such_command")
    assert standin.ping()["pid"] == standin.pid  # still healthy afterwards

    # The wire protocol itself: one JSON object per line, one reply per line.
    with socket.create_connection(standin.control_address, timeout=5.0) as raw:
        raw.sendall(b'{"cmd": "ping"}\nnot json\n{"cmd": "push_errors", "api_key": "Fetch"}\n')
        reader = raw.makefile("rb")
        replies = [json.loads(reader.readline()) for _ in range(3)]
    assert replies[0] == {"ok": True, "pid": standin.pid, "brokers": 1}
    assert replies[1]["ok"] is False and "not JSON" in replies[1]["error"]
    assert replies[2]["ok"] is False and "'errors'" in replies[2]["error"]


# --- (7) orphan protection -----------------------------------------------------------


def test_server_exits_when_its_stdin_closes() -> None:
    proc = start_cli("--brokers", "2")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        info = json.loads(proc.stdout.readline())
        assert info["pid"] == proc.pid
        assert len(info["bootstrap"].split(",")) == 2
        proc.stdin.close()
        assert proc.wait(timeout=5.0) == 0
        assert proc.stderr is not None
        assert b"stopped (stdin closed)" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5.0)


def test_server_dies_with_a_killed_parent(tmp_path: Path) -> None:
    parent_script = textwrap.dedent(
        """
        import sys, time
        from testbed.kafka_standin import KafkaStandin
        handle = KafkaStandin.start()
        print(handle.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_script],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        # The killed parent cannot remove the stand-in's log file; keep it in tmp_path.
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "TMPDIR": str(tmp_path)},
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not process_gone(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=5.0)
        wait_until(lambda: process_gone(child_pid), 5.0, f"stand-in {child_pid} to die")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=5.0)
        if child_pid and not process_gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_started_by_hand_in_the_background_it_outlives_its_shell(tmp_path: Path) -> None:
    """`python -m testbed.kafka_standin --ignore-stdin &` from a shell that then exits:
    the stand-in keeps serving (it died with its parent shell before)."""
    out = tmp_path / "standin.json"
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f"{sys.executable} -m testbed.kafka_standin --ignore-stdin > {out} 2>/dev/null < /dev/null & echo $!",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    pid = int(shell.stdout.strip())
    try:
        wait_until(lambda: out.exists() and out.read_text().strip(), 30.0, "the stand-in's first line")
        info = json.loads(out.read_text().splitlines()[0])
        time.sleep(1.0)  # the shell is gone by now; a parent-death signal would have come
        assert not process_gone(pid)
        host, port = info["bootstrap"].split(",")[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2.0):
            pass
    finally:
        if not process_gone(pid):
            os.kill(pid, signal.SIGTERM)
            wait_until(lambda: process_gone(pid), 10.0, "the stand-in to stop")
