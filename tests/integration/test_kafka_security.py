"""Issue 13 against the Kafka stand-in: the shared Kafka client settings, secrets that
never show, and topics that do not exist.

The stand-in (librdkafka's mock cluster) speaks PLAINTEXT only: it refuses SASL
("SASL Handshake not supported by broker", measured) and has no TLS. So:
* with `[kafka.client] security.protocol = "SASL_PLAINTEXT"` every client of `cdc run`
  and `cdc check` fails on exactly that refusal - each carried the setting - and the
  SASL password never appears in what they print;
* with PLAINTEXT plus a SASL password, a registry secret and a MySQL password in the
  config, `cdc run`, `cdc check`, `cdc locate`, `cdc verify` and `cdc repair` work, and
  none of the secrets appears in their logs, errors, /metrics or the verify report.
The relay runs with the default `topics.missing = "dead_letter"`: an aggregate type
whose topic does not exist is dead-lettered (`topic_missing`, one log line naming the
topic), the other topics go on, the topic once created is published to, and `cdc verify`
accounts for the dead letters. `topics.missing = "create"` is run against noida-db, whose
AdminClient creates topics (the stand-in's cannot)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.integration.harness import (
    OUTBOX_DDL,
    ROOT,
    RelayProcess,
    _to_toml,
    env_for,
    insert_events,
    read_topic,
    relay_raw_config,
    wait_until,
)

pytestmark = [pytest.mark.integration]

KAFKA_PW = "Kafka-s3cret-7Hq2"
REGISTRY_AUTH = "registry-user:Reg-s3cret-4Vw9"
SECRETS = (KAFKA_PW, REGISTRY_AUTH.split(":")[1])


def _cdc(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _secured_raw(mariadb, kafka, database, prefix, tmp_path, protocol: str, **overrides) -> dict:
    raw = relay_raw_config(mariadb, kafka, database, prefix, tmp_path / "cp.json", **overrides)
    raw.pop("topics")  # the default: topics.missing = "dead_letter"
    raw["kafka"]["client"] = {
        "security.protocol": protocol,
        "sasl.mechanism": "PLAIN",
        "sasl.username": "cdc",
        "sasl.password_env": "CDC_TEST_KAFKA_PW",
        "client.id": f"cdc-{prefix}",
    }
    raw["schema_registry"]["basic_auth_env"] = "CDC_TEST_REGISTRY_AUTH"
    return raw


def _env(mariadb) -> dict[str, str]:
    return {**env_for(mariadb), "CDC_TEST_KAFKA_PW": KAFKA_PW, "CDC_TEST_REGISTRY_AUTH": REGISTRY_AUTH}


def _assert_no_secret(text: str, what: str, mysql_password: str | None) -> None:
    for secret in SECRETS + ((mysql_password,) if mysql_password else ()):
        assert secret not in text, f"a secret appears in {what}"


def _outbox(mariadb, database) -> None:
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))


def test_every_client_of_run_and_check_carries_kafka_client(mariadb, kafka, database, topic_prefix, tmp_path):
    """SASL_PLAINTEXT in [kafka.client]: the stand-in refuses SASL, so a client that
    carries the setting fails with that refusal; one that did not would connect."""
    _outbox(mariadb, database)
    raw = _secured_raw(
        mariadb, kafka, database, topic_prefix, tmp_path, "SASL_PLAINTEXT", relay__reconnect_timeout_s=3.0
    )
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    env = _env(mariadb)
    check = _cdc(["check", "--config", str(path)], env, timeout=90)
    text = check.stdout + check.stderr
    assert check.returncode == 2 and "Traceback" not in text, text
    kafka_line = next(line for line in check.stdout.splitlines() if line.startswith("FAIL kafka:"))
    assert "SASL" in kafka_line, kafka_line  # the check's metadata client spoke SASL
    _assert_no_secret(text, "cdc check's output", mariadb.password)

    relay = RelayProcess(raw, env, tmp_path / "relay")
    with mariadb.connect(database) as conn:
        insert_events(conn, "outbox", [(str(uuid.uuid4()), "order", "k1", "Created", "{}")])
        conn.commit()
    code = relay.wait(120)
    log = relay.log_text()
    assert code == 1, log
    assert "SASL Handshake not supported by broker" in log, log  # the relay's own clients spoke SASL
    last = [line for line in log.splitlines() if line.startswith("cdc: ")]
    assert len(last) == 1 and "Kafka" in last[0] and "Traceback" not in log, log
    _assert_no_secret(log, "the relay's log", mariadb.password)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _metric(text: str, name: str, label: str) -> float | None:
    match = re.search(rf"^{name}\{{[^}}]*{label}[^}}]*\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


@pytest.mark.spark
@pytest.mark.slow
def test_a_missing_topic_is_dead_lettered_the_relay_goes_on_and_no_secret_shows_anywhere(
    mariadb, kafka, database, topic_prefix, tmp_path
):
    _outbox(mariadb, database)
    order, invoice, dlq = f"{topic_prefix}.order", f"{topic_prefix}.invoice", f"{topic_prefix}.dlq"
    kafka.create_topic(order, 3)
    kafka.create_topic(dlq, 1)  # no invoice topic: auto-create off, as in production
    port = _free_port()
    raw = _secured_raw(mariadb, kafka, database, topic_prefix, tmp_path, "PLAINTEXT", http__port=port)
    env = _env(mariadb)
    relay = RelayProcess(raw, env, tmp_path / "relay")
    orders = [str(uuid.uuid4()) for _ in range(30)]
    invoices = [str(uuid.uuid4()) for _ in range(5)]
    try:
        with mariadb.connect(database) as conn:
            for n, event_id in enumerate(orders):
                rows = [(event_id, "order", f"k{n % 4}", "Created", json.dumps({"n": n}))]
                if n % 6 == 0:
                    rows.append((invoices[n // 6], "invoice", f"i{n}", "Issued", "{}"))
                insert_events(conn, "outbox", rows)
                conn.commit()
        wait_until(
            lambda: (
                not relay.alive()
                or (
                    len(read_topic(kafka.bootstrap_servers, order)) >= 30
                    and len(read_topic(kafka.bootstrap_servers, dlq)) >= 5
                )
            ),
            90,
            "30 orders published and 5 invoices dead-lettered",
        )
        assert relay.alive(), relay.log_text()
        dead = read_topic(kafka.bootstrap_servers, dlq)
        assert sorted(d.headers["id"] for d in dead) == sorted(invoices)
        assert {d.headers["cdc.dlq.cause"] for d in dead} == {"topic_missing"}
        assert {d.headers["cdc.dlq.topic"] for d in dead} == {invoice}
        # each keeps its row whole, payload included: the reader process sent the relay the
        # event's Avro value without the payload beside it, and the relay read it back
        assert [json.loads(d.raw_value)["row"]["payload"] for d in dead] == ["{}"] * 5
        assert sorted(r.headers["id"] for r in read_topic(kafka.bootstrap_servers, order)) == sorted(orders)
        metrics = _metrics(port)
        assert _metric(metrics, "cdc_events_dead_lettered_total", 'cause="topic_missing"') == 5.0, metrics
        _assert_no_secret(metrics, "/metrics", mariadb.password)
        # The operator creates the topic: the relay publishes to it again (it asks again
        # 10 s after it found the topic missing; until then its events are still dead letters).
        kafka.create_topic(invoice, 2)
        late: list[str] = []

        def one_more_published() -> bool:
            event_id = str(uuid.uuid4())
            with mariadb.connect(database) as conn:
                insert_events(conn, "outbox", [(event_id, "invoice", "i-late", "Issued", "{}")])
                conn.commit()
            late.append(event_id)
            wait_until(
                lambda: (
                    not relay.alive()
                    or any(
                        r.headers.get("id") == event_id
                        for r in read_topic(kafka.bootstrap_servers, invoice) + read_topic(kafka.bootstrap_servers, dlq)
                    )
                ),
                30,
                "the late one",
            )
            return any(r.headers.get("id") == event_id for r in read_topic(kafka.bootstrap_servers, invoice))

        wait_until(lambda: not relay.alive() or one_more_published(), 60, "an invoice published", interval=1.0)
        assert relay.alive(), relay.log_text()
        records = read_topic(kafka.bootstrap_servers, invoice) + read_topic(kafka.bootstrap_servers, dlq)
        for event_id in late:  # each exactly once, in the topic or dead-lettered
            assert [r.headers.get("id") for r in records].count(event_id) == 1, event_id
        assert len(late) <= 12, late  # published again within the recheck time (10 s) and then some
        assert relay.terminate() == 0
    finally:
        if relay.alive():
            relay.kill()
    log = relay.log_text()
    naming = [
        line
        for line in log.splitlines()
        if f"topic '{invoice}' does not exist" in line and "the other topics go on" in line
    ]
    assert len(naming) == 1 and f"kafka-topics.sh --create --topic {invoice}" in naming[0], log
    assert "Traceback" not in log, log
    _assert_no_secret(log, "the relay's log", mariadb.password)

    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    outputs = []
    check = _cdc(["check", "--config", str(path)], env, timeout=90)
    outputs.append(("cdc check", check))
    assert "ok   kafka:" in check.stdout, check.stdout + check.stderr
    located = _cdc(["locate", "--config", str(path), "--topic", order, "--partition", "0", "--offset", "0"], env)
    outputs.append(("cdc locate", located))
    assert located.returncode == 0 and json.loads(located.stdout)["source"] == raw["source"]["name"], located
    report_dir = tmp_path / "report"
    verify = _cdc(
        ["verify", "--config", str(path), "--output-dir", str(report_dir), "--master", "local[2]"], env, timeout=400
    )
    outputs.append(("cdc verify", verify))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    summary = verify.stdout.splitlines()[0]
    assert "missing=0" in summary and "dead_lettered=" in summary, summary
    assert int(re.search(r"dead_lettered=(\d+)", summary).group(1)) >= 5, summary
    repaired = _cdc(["repair", "--config", str(path), "--report", str(report_dir)], env)
    outputs.append(("cdc repair", repaired))
    assert repaired.returncode == 0 and "0 missing" in repaired.stdout, repaired
    for what, result in outputs:
        assert "Traceback" not in result.stderr, (what, result.stderr)
        _assert_no_secret(result.stdout + result.stderr, what, mariadb.password)
    for file in Path(report_dir).rglob("*"):
        if file.is_file() and file.suffix in (".json", ".html", ".jsonl"):
            _assert_no_secret(file.read_text(errors="replace"), str(file), mariadb.password)


def test_topics_missing_create_creates_the_topic_with_its_settings(
    noida_kafka, mariadb, database, topic_prefix, tmp_path
):
    """noida-db's AdminClient creates topics: the create path for real."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    _outbox(mariadb, database)
    dlq, topic = f"{topic_prefix}.dlq", f"{topic_prefix}.invoice"
    noida_kafka.create_topic(dlq, 1)
    raw = relay_raw_config(
        mariadb,
        noida_kafka,
        database,
        topic_prefix,
        tmp_path / "cp.json",
        topics={"missing": "create", "partitions": 3, "replication_factor": 1, "configs": {"retention.ms": 86400000}},
    )
    relay = RelayProcess(raw, env_for(mariadb), tmp_path / "relay")
    event_id = str(uuid.uuid4())
    try:
        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(event_id, "invoice", "k1", "Issued", "{}")])
            conn.commit()
        wait_until(
            lambda: (
                not relay.alive()
                or any(r.headers.get("id") == event_id for r in read_topic(noida_kafka.bootstrap, topic))
            ),
            90,
            "published",
        )
        assert relay.alive(), relay.log_text()
        assert relay.terminate() == 0
    finally:
        if relay.alive():
            relay.kill()
    assert read_topic(noida_kafka.bootstrap, dlq) == []
    admin = AdminClient({"bootstrap.servers": noida_kafka.bootstrap})
    meta = admin.list_topics(topic=topic, timeout=10).topics[topic]
    assert len(meta.partitions) == 3
    log = relay.log_text()
    assert f"created topic '{topic}'" in log, log
    try:
        [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
        configs = future.result(10)
    except Exception:  # noida-db may not describe configs: the partition count proved the request
        configs = None
    if configs is not None and "retention.ms" in configs:
        assert configs["retention.ms"].value == "86400000"
