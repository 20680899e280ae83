"""The relay against a real nats-server with JetStream (`[sink] kind = "nats_jetstream"`):
every committed outbox event reaches its subject exactly once in commit order, read back
by the verifier's own reader (spark_jobs/nats/source.py), not by the relay's; dead
letters (too large, a subject no stream takes) carry their cause; a restart publishes
nothing twice, also with the duplicate window gone (the recovery scan, not Nats-Msg-Id)."""

from __future__ import annotations

import json
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_DLQ_CAUSE
from spark_jobs.nats.source import plan_nats, read_range
from tests.integration.harness import OUTBOX_DDL, RelayThread, insert_events, wait_until
from tests.integration.independent_checker import check, committed_outbox_events
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config, stream_records

pytestmark = [pytest.mark.integration]


def _events(n: int, aggregate: str, key_count: int = 5, payload: str = "{}") -> list[tuple]:
    return [(str(uuid.uuid4()), aggregate, f"k{i % key_count}", "Happened", payload) for i in range(n)]


def _write(db, database: str, transactions: list[list[tuple]]) -> None:
    with db.connect(database) as conn:
        for rows in transactions:
            insert_events(conn, "outbox", rows)
            conn.commit()


def _relay(mariadb, nats_server, database, prefix, tmp_path, **overrides):
    raw = nats_raw_config(mariadb, nats_server, database, prefix, tmp_path / "cp.json", **overrides)
    return raw, load_config(raw, nats_env(mariadb, nats_server))


def test_every_event_once_in_commit_order_and_dead_letters_with_their_cause(
    mariadb, nats_server, database, topic_prefix, tmp_path
):
    prefix = topic_prefix
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    # Two subjects in one stream (their sequences interleave), the dead letters in another;
    # `prefix.nostream` has no stream: its events are dead-lettered (topics.missing).
    create_streams(nats_server, {f"{prefix}_events": [f"{prefix}.order", f"{prefix}.payment"]})
    create_streams(nats_server, {f"{prefix}_dlq": [f"{prefix}.dlq"]})
    raw, cfg = _relay(mariadb, nats_server, database, prefix, tmp_path, relay__max_message_bytes=4000)
    start = raw["source"]["start"]
    too_large = _events(1, "order", payload=json.dumps({"pad": "x" * 5000}))
    no_stream = _events(2, "nostream")
    transactions = [_events(3, "order"), _events(2, "payment") + _events(2, "order"), too_large, no_stream]
    transactions += [_events(1 + i % 4, ("order", "payment")[i % 2]) for i in range(60)]
    _write(mariadb, database, transactions[:4])
    relay = RelayThread(cfg, check=False)
    total = sum(len(t) for t in transactions)
    try:
        relay.wait_delivered(sum(len(t) for t in transactions[:4]), timeout=120)
        _write(mariadb, database, transactions[4:])
        relay.wait_delivered(total, timeout=120)
    finally:
        relay.stop()
    # A second run from the checkpoint: nothing again.
    relay = RelayThread(cfg, check=False)
    _write(mariadb, database, [_events(2, "order")])
    try:
        relay.wait_delivered(2, timeout=120)
    finally:
        summary = relay.stop()

    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=start.split(":")[0],
                                        start_pos=int(start.split(":")[1]))  # fmt: skip
    subjects = [f"{prefix}.order", f"{prefix}.payment", f"{prefix}.dlq"]
    records = stream_records(nats_server, subjects)
    result = check(committed, records)
    assert result.committed == total + 2 and result.clean, result.summary()
    assert relay.metrics.events_published == 2, summary

    settings = nats_server.connect_settings()
    [dlq] = plan_nats(settings, [f"{prefix}.dlq"])["partitions"]
    causes = {}
    for rec in read_range(settings, dlq["topic"], dlq["stream"], dlq["low"], dlq["high"]):
        headers = {k: v.decode() for k, v in rec.headers()}
        causes[json.loads(rec.value())["row"]["id"]] = headers[H_DLQ_CAUSE]
    assert causes == {too_large[0][0]: "too_large", no_stream[0][0]: "topic_missing", no_stream[1][0]: "topic_missing"}


def test_topics_missing_create_makes_a_stream_for_the_subject(mariadb, nats_server, database, topic_prefix, tmp_path):
    prefix = topic_prefix
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    raw, cfg = _relay(mariadb, nats_server, database, prefix, tmp_path, topics__missing="create")
    start = raw["source"]["start"]
    _write(mariadb, database, [_events(3, "order"), _events(2, "payment")])
    relay = RelayThread(cfg, check=False)
    try:
        relay.wait_delivered(5, timeout=120)
    finally:
        relay.stop()
    committed = committed_outbox_events(mariadb.connection_settings(), database, start_file=start.split(":")[0],
                                        start_pos=int(start.split(":")[1]))  # fmt: skip
    result = check(committed, stream_records(nats_server, [f"{prefix}.order", f"{prefix}.payment"]))
    assert result.committed == 5 and result.clean, result.summary()


def test_check_names_the_server_and_a_dead_letter_subject_without_stream(nats_server, topic_prefix):
    from cdc.config import NatsJetStreamConfig, Secret
    from connectors.nats.sink import check_nats

    s = nats_server.connect_settings()
    cfg = NatsJetStreamConfig(servers=tuple(s["servers"]), user=s["user"], password=Secret(s["password"]))
    server, dlq = check_nats(cfg, f"{topic_prefix}.dlq")
    assert server.ok and not dlq.ok and f"{topic_prefix}.dlq" in dlq.message
    create_streams(nats_server, {f"{topic_prefix}_dlq": [f"{topic_prefix}.dlq"]})
    assert all(r.ok for r in check_nats(cfg, f"{topic_prefix}.dlq"))
    wrong = NatsJetStreamConfig(servers=tuple(s["servers"]), user=s["user"], password=Secret("wrong-secret"))
    [refused] = check_nats(wrong, f"{topic_prefix}.dlq")
    assert not refused.ok and "cannot reach NATS" in refused.message and "wrong-secret" not in refused.message


def test_the_publisher_keeps_order_and_stores_once_across_restarts_and_a_pause(topic_prefix):
    """The publisher alone, publishing without pause while its server is restarted, killed
    and cut off: the stream holds every message once, in publish order (the resend rule in
    connectors/nats/sink.py)."""
    import threading
    import time

    from cdc.config import NatsJetStreamConfig, Secret
    from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE
    from connectors.nats.sink import NatsJetStreamPublisher
    from testbed.nats import EmbeddedNats

    subject = f"{topic_prefix}.order"
    with EmbeddedNats.start() as server:
        create_streams(server, {f"{topic_prefix}_events": [subject]})
        s = server.connect_settings()
        cfg = NatsJetStreamConfig(
            servers=tuple(s["servers"]), user=s["user"], password=Secret(s["password"]), ack_timeout_s=1.0
        )
        publisher = NatsJetStreamPublisher(cfg)
        reports: list = []
        stop = threading.Event()
        published = [0]
        left = [-1]

        # Publishing in a thread of its own: the faults come from the test's thread, since a
        # server restarted from a thread dies with that thread (PR_SET_PDEATHSIG is per thread).
        def publish() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                headers = [(H_SOURCE, b"s"), (H_FILE, b"bin.000001"), (H_POS, str(n).encode()), (H_ROW, b"0")]
                publisher.publish(subject, b"k", b"v%d" % n, headers, reports.append)
                # Up to 8,000 waiting, all on the wire (max_in_flight is 8,192):
                # every fault finds messages in flight, without the 100,000 the publisher takes
                # before it waits, whose flush and read-back at the end took most of a minute.
                publisher.poll(0 if publisher.pending() < 8000 else 0.05)
            published[0] = n
            left[0] = publisher.flush(120)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        try:
            for fault in ("restart", "kill", "pause"):
                time.sleep(1.5)
                before = publisher.reconnects
                if fault == "pause":
                    server.pause()
                    time.sleep(2.5)  # longer than ack_timeout_s
                    server.resume()
                else:
                    server.restart(graceful=fault == "restart")
                # Each fault meets a publisher on a connection of its own: the next waits for
                # this one's reconnect (on a loaded machine the reconnect after a restart took
                # longer than the 1.5 s between faults, and one reconnect covered two: 2 of 3).
                wait_until(lambda before=before: publisher.reconnects > before, 60, f"a reconnect after the {fault}")
            time.sleep(1.5)
        finally:
            stop.set()
            thread.join(180)
            publisher.close()
        n = published[0]
        assert left[0] == 0, f"{left[0]} of {n} messages not acknowledged"
        # The restart and the kill each break the connection; the pause is silence on a live
        # connection, left after ack_timeout_s: each makes the publisher move to a new
        # connection and send the unanswered again (a SIGKILLed server recovering its streams
        # can add one more). Before the connection's wait was bounded, nats-py's 2 s pause
        # between refused attempts could span the next fault, and one reconnect covered two.
        assert publisher.reconnects >= 3 and len(reports) == n
        assert not [r for r in reports if r.failure is not None]
        [part] = plan_nats(s, [subject])["partitions"]
        stored = [
            int(dict(r.headers())[H_POS]) for r in read_range(s, subject, part["stream"], part["low"], part["high"])
        ]
        assert stored == list(range(1, n + 1)), f"{n} published; stored out of order or not once"


def _publish_burst(publisher, subject: str, n: int, source: bytes) -> tuple[list, int]:
    """`n` messages of one key as fast as the publisher takes them (no wait for answers below
    its window), then a flush: their reports, and how many were published when the first
    failure was reported (n: none was)."""
    from cdc.events.identity import H_FILE, H_POS, H_ROW, H_SOURCE

    reports: list = []
    failed_at = n
    for i in range(1, n + 1):
        headers = [(H_SOURCE, source), (H_FILE, b"bin.000001"), (H_POS, str(i).encode()), (H_ROW, b"0")]
        publisher.publish(subject, b"k", b"v" * 200, headers, reports.append)
        if i % 100 == 0:
            publisher.poll(0)
            if failed_at == n and any(r.failure is not None for r in reports[-200:]):
                failed_at = i
    publisher.flush(60)
    return reports, failed_at


def test_a_window_the_servers_stream_buffer_cannot_hold_stops_publishing_naming_the_fix(topic_prefix):
    """nats-server 2.11+ buffers at most `jetstream.max_buffered_msgs` messages a stream
    received and not yet stored, and drops a publish past it (429, JSStreamTooManyRequests):
    with a window above it a catch-up has messages dropped while later ones are stored. The
    first drop fails with every message still waiting and names the fix; nothing more is
    sent, so what the stream holds is in publish order, with gaps (the relay stops, and its
    restart sends the rest: docs/sinks.md). With a window below the buffer every message is
    stored once, in order (the relay's default window, 8,192, is below the server's default
    buffer, 10,000)."""
    from cdc.config import NatsJetStreamConfig, Secret
    from cdc.events.identity import H_POS, H_SOURCE
    from connectors.nats.sink import NatsJetStreamPublisher
    from testbed.nats import EmbeddedNats

    subject = f"{topic_prefix}.order"
    with EmbeddedNats.start(max_buffered_msgs=500) as server:
        create_streams(server, {f"{topic_prefix}_events": [subject]})
        s = server.connect_settings()

        def publisher(window: int) -> NatsJetStreamPublisher:
            return NatsJetStreamPublisher(
                NatsJetStreamConfig(
                    servers=tuple(s["servers"]), user=s["user"], password=Secret(s["password"]), max_in_flight=window
                )
            )

        def stored(source: str) -> list[int]:
            [part] = plan_nats(s, [subject])["partitions"]
            records = read_range(s, subject, part["stream"], part["low"], part["high"])
            return [int(h[H_POS]) for h in (dict(r.headers()) for r in records) if h[H_SOURCE] == source.encode()]

        wide = publisher(20_000)
        try:
            reports, failed_at = _publish_burst(wide, subject, 50_000, b"wide")
        finally:
            wide.close()
        failed = [r.failure for r in reports if r.failure is not None]
        assert len(reports) == 50_000 and failed, "no message dropped: the server's buffer held the window"
        assert (
            failed[0].code == "JS_10167"
            and "set max_in_flight below its jetstream.max_buffered_msgs" in failed[0].message
        )
        assert {f.code for f in failed} == {"JS_10167"}
        held = stored("wide")
        assert 0 < len(held) < 50_000 and held == sorted(set(held)), "a message stored twice or after a later one"
        assert held[-1] <= failed_at < 50_000, f"published after the failure was reported and stored: {held[-1]}"

        narrow = publisher(400)
        try:
            reports, _ = _publish_burst(narrow, subject, 20_000, b"narrow")
        finally:
            narrow.close()
        assert len(reports) == 20_000 and not [r for r in reports if r.failure is not None]
        assert stored("narrow") == list(range(1, 20_001))
