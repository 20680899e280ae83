"""The `cdc` command as an operator meets it: bad config inputs, an unreachable server,
secrets kept out of every output, and the HTTP endpoint of a running relay."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import (
    OUTBOX_DDL,
    RelayProcess,
    _to_toml,
    env_for,
    insert_events,
    relay_raw_config,
    wait_until,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Zk9-distinctive-pw-7Qx"


def cdc(args: list[str], env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line(result: subprocess.CompletedProcess, code: int | None, *fragments: str) -> str:
    """Exactly one line in stderr, starting `cdc: `, holding every fragment; no traceback."""
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    if code is None:
        assert result.returncode != 0, text
    else:
        assert result.returncode == code, f"exit {result.returncode}: {text}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}: {result.stderr}"
    assert lines[0].startswith("cdc: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def valid_raw(mariadb, kafka, database, topic_prefix, tmp_path) -> dict:
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    return relay_raw_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json")


# -- bad config inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "check"])
def test_missing_config_file(command, tmp_path):
    path = tmp_path / "nowhere" / "relay.toml"
    result = cdc([command, "--config", str(path)])
    assert_one_line(result, 2, str(path), "not found", "--config")


def test_invalid_toml(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text('[source]\nname = "shop"\nhost = \n')
    result = cdc(["run", "--config", str(path)])
    assert_one_line(result, 2, str(path), "not valid TOML")


def test_unknown_section_is_refused(valid_raw, mariadb, tmp_path):
    raw = {**valid_raw, "sorce": {"name": "typo"}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(["run", "--config", str(path)], env_for(mariadb))
    assert_one_line(result, 2, "unknown section", "sorce", "source")


def test_unknown_key_is_refused_naming_the_known_ones(valid_raw, mariadb, tmp_path):
    raw = {**valid_raw, "source": {**valid_raw["source"], "hots": "127.0.0.1"}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    for command in ("run", "check"):
        result = cdc([command, "--config", str(path)], env_for(mariadb))
        assert_one_line(result, 2, "source.hots", "host")


def test_password_written_in_the_file_is_refused(valid_raw, mariadb, tmp_path):
    source = {k: v for k, v in valid_raw["source"].items() if k != "password_env"}
    raw = {**valid_raw, "source": {**source, "password": SECRET}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    for command in ("run", "check"):
        result = cdc([command, "--config", str(path)])
        assert_one_line(result, 2, "source.password", "source.password_env")
        assert SECRET not in result.stdout + result.stderr


def test_a_topic_template_that_can_never_be_legal_is_refused_naming_the_key(valid_raw, mariadb, tmp_path):
    table = {**valid_raw["outbox"]["tables"][0], "topic": "outbox events/{aggregate_type}"}
    raw = {**valid_raw, "outbox": {"tables": [table]}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    for command in ("run", "check"):
        result = cdc([command, "--config", str(path)], env_for(mariadb))
        line = assert_one_line(result, 2)
        assert line == (
            "cdc: outbox.tables[0].topic: topic template 'outbox events/{aggregate_type}' has characters "
            "Kafka does not allow in its fixed text: ' /' (a topic name holds only a-z, A-Z, 0-9, '.', "
            "'_' and '-')"
        ), line


# -- secrets and unreachable servers ----------------------------------------------------------


def _secret_env() -> dict[str, str]:
    return {"CDC_TEST_MYSQL_PASSWORD": SECRET}


def test_password_never_appears_in_any_output(valid_raw, mariadb, tmp_path):
    """Connections that fail (nobody on the port; the wrong password), with debug logging:
    the password is in none of `cdc check`'s or `cdc run`'s output."""
    outputs = []
    wrong_port = {**valid_raw["source"], "port": free_port()}
    wrong_password = dict(valid_raw["source"])  # the real server, SECRET is not its password
    for name, source in (("port", wrong_port), ("password", wrong_password)):
        raw = {**valid_raw, "source": source, "log": {"level": "DEBUG"}}
        path = tmp_path / f"relay-{name}.toml"
        path.write_text(_to_toml(raw))
        for args in (["check"], ["run"], ["run", "--skip-check"]):
            result = cdc([args[0], "--config", str(path), *args[1:]], _secret_env(), timeout=60)
            assert result.returncode != 0, (name, args, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr, result.stderr
            outputs.append(result.stdout + result.stderr)
    for text in outputs:
        assert SECRET not in text, text
    assert any("access denied" in t.lower() or "Access denied" in t for t in outputs), outputs


def test_run_against_an_unreachable_server_exits_with_one_line(valid_raw, mariadb, tmp_path):
    port = free_port()
    raw = {**valid_raw, "source": {**valid_raw["source"], "port": port}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    # With the preflight: the database may be starting, a restart cures it (exit 1); the
    # line names host:port and what to check. `cdc check` says FAIL (exit 2).
    result = cdc(["run", "--config", str(path)], env_for(mariadb), timeout=60)
    assert_one_line(result, 1, f"127.0.0.1:{port}", "source.host/source.port")
    result = cdc(["check", "--config", str(path)], env_for(mariadb), timeout=60)
    assert result.returncode == 2 and f"FAIL connect: cannot connect to 127.0.0.1:{port}" in result.stdout
    # Without it: the relay's own connection fails; retriable (exit 1), still one line.
    result = cdc(["run", "--config", str(path), "--skip-check"], env_for(mariadb), timeout=60)
    assert_one_line(result, 1, f"127.0.0.1:{port}")


# -- Kafka ------------------------------------------------------------------------------------------


def _check_lines(result: subprocess.CompletedProcess, status: str) -> dict[str, str]:
    """`cdc check`'s lines of one status (`FAIL`, `warn`, `ok  `) by check name."""
    return {
        line[5:].partition(": ")[0]: line[5:].partition(": ")[2]
        for line in result.stdout.splitlines()
        if line.startswith(status + " ")
    }


@pytest.mark.parametrize("store", ["file", "kafka"])
def test_check_with_kafka_unreachable_ends_in_one_line_naming_the_address(store, valid_raw, mariadb, tmp_path):
    """Nobody on the port: one FAIL line naming the address and kafka.bootstrap, exit 2,
    in under 15 s, no traceback and none of librdkafka's own log lines; with the
    checkpoint kept in Kafka, the checkpoint is not read (that would hang) and the start
    position is said to be unchecked."""
    port = free_port()
    raw = {
        **valid_raw,
        "kafka": {**valid_raw["kafka"], "bootstrap": f"127.0.0.1:{port}"},
        "checkpoint": {**valid_raw["checkpoint"], "store": store},
    }
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    began = time.monotonic()
    result = cdc(["check", "--config", str(path)], env_for(mariadb), timeout=60)
    took = time.monotonic() - began
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    assert took < 15, f"took {took:.1f} s"
    assert "Traceback" not in text and "%3|" not in text and "|FAIL|" not in text, text
    assert result.stderr.strip() == "1 check(s) failed", result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed == [result.stdout.splitlines()[-1]], result.stdout
    line = failed[0]
    assert line.startswith(f"FAIL kafka: cannot reach Kafka at 127.0.0.1:{port} within 10 s (kafka.bootstrap"), line
    assert line.endswith("): check the address and that the brokers run"), line
    if store == "kafka":
        assert _check_lines(result, "warn")["start_position"] == (
            "not checked: the checkpoint (checkpoint.topic 'cdc.checkpoints') cannot be read while Kafka does not "
            "answer"
        ), result.stdout


def test_check_names_a_bootstrap_address_that_does_not_answer_while_another_does(valid_raw, mariadb, kafka, tmp_path):
    port = free_port()
    raw = {**valid_raw, "kafka": {**valid_raw["kafka"], "bootstrap": f"{kafka.bootstrap_servers},127.0.0.1:{port}"}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(["check", "--config", str(path)], env_for(mariadb), timeout=60)
    text = result.stdout + result.stderr
    assert result.returncode == 0 and "%3|" not in text, text
    line = _check_lines(result, "warn")["kafka"]
    assert line.startswith(f"127.0.0.1:{port} did not answer within 10 s (kafka.bootstrap; "), line
    assert f"{kafka.bootstrap_servers.replace(',', ', ')} answered (cluster " in line, line
    assert line.endswith("fix or remove the address that does not answer"), line


def test_check_says_whether_the_dead_letter_and_checkpoint_topics_exist(
    valid_raw, mariadb, kafka, topic_prefix, tmp_path
):
    dlq = valid_raw["kafka"]["dead_letter_topic"]
    kafka.create_topic(dlq, 2)
    checkpoints = f"{topic_prefix}.checkpoints"
    raw = {**valid_raw, "checkpoint": {"store": "kafka", "topic": checkpoints}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(["check", "--config", str(path)], env_for(mariadb), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    ok = _check_lines(result, "ok  ")
    assert ok["kafka"].startswith(f"{kafka.bootstrap_servers.replace(',', ', ')} answered (cluster "), ok
    assert ok["kafka"].endswith(", 3 broker(s))"), ok
    assert ok["dead_letter_topic"] == f"topic '{dlq}' exists (2 partition(s))", ok
    assert _check_lines(result, "warn")["checkpoint_topic"] == (
        f"topic '{checkpoints}' (checkpoint.topic) does not exist: no checkpoint is read from it (the relay starts "
        f"from source.start) and the first checkpoint needs it; create it (kafka-topics.sh --create --topic "
        f"{checkpoints}) unless the brokers create topics on first use (auto.create.topics.enable)"
    ), result.stdout
    # The check created no topic (it lists every topic, never asks for one by name).
    from connectors.kafka.reader import KafkaTopicReader

    reader = KafkaTopicReader(kafka.bootstrap_servers)
    try:
        assert checkpoints not in reader.topics()
    finally:
        reader.close()


def test_check_talks_to_kafka_with_the_shared_client_settings(valid_raw, mariadb, kafka, tmp_path):
    """kafka.client's security.protocol reaches the check's client: TLS to the stand-in
    (which speaks plaintext) cannot get metadata, while the producer-only settings
    (acks, linger.ms) are not handed to it."""
    raw = {
        **valid_raw,
        "kafka": {
            **valid_raw["kafka"],
            "client": {"security.protocol": "ssl", "enable.ssl.certificate.verification": False},
            "producer": {"acks": "all", "linger.ms": 5},
        },
    }
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(["check", "--config", str(path)], env_for(mariadb), timeout=60)
    text = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in text and "%3|" not in text, text
    failed = _check_lines(result, "FAIL")
    assert list(failed) == ["kafka"], result.stdout
    assert failed["kafka"].startswith(
        f"cannot reach Kafka at {kafka.bootstrap_servers.replace(',', ', ')} within 10 s (kafka.bootstrap; "
    ), failed


# -- the HTTP endpoint --------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{name}(?:_total)?\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def test_metrics_healthz_readyz_served_while_the_relay_runs(
    valid_raw, mariadb, kafka, database, topic_prefix, tmp_path
):
    kafka.create_topic(f"{topic_prefix}.order", 2)
    port = free_port()
    raw = {**valid_raw, "http": {"port": port}}
    relay = RelayProcess(raw, env_for(mariadb), tmp_path / "relay")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: not relay.alive() or _get(base + "/readyz")[0] == 200, 60, "/readyz to answer 200")
        assert relay.alive(), relay.log_text()[-2000:]
        status, body = _get(base + "/healthz")
        assert status == 200 and body.strip() == "ok", (status, body)
        assert _get(base + "/nothing-here")[0] == 404

        with mariadb.connect(database) as conn:
            insert_events(conn, "outbox", [(f"m-{i}", "order", f"k{i % 5}", "created", "{}") for i in range(25)])
            conn.commit()
        wait_until(
            lambda: _metric(_get(base + "/metrics")[1], "cdc_events_published") == 25,
            60,
            "cdc_events_published to reach 25",
        )
        status, text = _get(base + "/metrics")
        assert status == 200
        assert f'source="src-{topic_prefix}"' in text
        assert _metric(text, "cdc_lag_seconds") is not None, text
        assert _metric(text, "cdc_lag_seconds") >= 0
        assert _metric(text, "cdc_ready") == 1
        assert _metric(text, "cdc_transactions") >= 1
        assert _metric(text, "cdc_outbox_changes_ignored") == 0 and _metric(text, "cdc_rows_discarded") == 0
        assert re.search(
            rf'^cdc_commit_to_acknowledgement_seconds_count\{{source="src-{topic_prefix}"\}} [1-9]', text, re.M
        ), text  # at least one transaction of the 25 events, acknowledged
        assert re.search(r"^process_resident_memory_bytes \S+$", text, re.M), text
        assert not re.search(r"\} -1(\.0)?$", text, re.M), text  # no sentinel values
        assert valid_raw["source"]["user"] and mariadb.password not in text
    finally:
        code = relay.terminate()
    assert code == 0, relay.log_text()[-2000:]
    assert _get(base + "/healthz")[0] == 0, "the endpoint should close with the relay"


def test_sigterm_while_the_relay_is_still_starting_is_a_clean_stop(
    valid_raw, mariadb, kafka, database, topic_prefix, tmp_path
):
    """An orchestrator may stop a relay it has just started (a rolling update rolled back):
    SIGTERM during start-up (imports, preflight, recovery) ends it like any other stop."""
    kafka.create_topic(f"{topic_prefix}.order", 2)
    relay = RelayProcess(valid_raw, env_for(mariadb), tmp_path / "relay")
    # terminate() signals as soon as the process catches SIGTERM: before the relay's heavy
    # imports, its preflight, lease and recovery - not after a sleep a loaded machine can outrun.
    code = relay.terminate()
    assert code == 0, relay.log_text()[-2000:]
    assert "signal SIGTERM" in relay.log_text() or "stopped at" in relay.log_text(), relay.log_text()[-2000:]


# -- the verifier -------------------------------------------------------------------------------


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_verify_with_a_user_who_may_not_stream_the_binlog_ends_in_one_line(valid_raw, mariadb, tmp_path):
    """A user error that only shows inside a Spark task (no REPLICATION SLAVE: planning
    works, streaming does not): `cdc verify` exits 2 with the source's own line last, and
    neither Python tracebacks nor Spark's Java stack traces reach the terminal."""
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'cli_nodump'@'%%' IDENTIFIED BY %s", (SECRET,))
        cur.execute("GRANT BINLOG MONITOR, SELECT ON *.* TO 'cli_nodump'@'%'")
    raw = {**valid_raw, "source": {**valid_raw["source"], "user": "cli_nodump"}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(
        ["verify", "--config", str(path), "--output-dir", str(tmp_path / "report"), "--master", "local[1]"],
        _secret_env(),
        timeout=240,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    assert "Traceback" not in text and "\tat org.apache" not in text and "ERROR" not in text, text
    last = last_line(result.stderr)
    assert last.startswith("cdc: cdc_binlog: reading") and "REPLICATION SLAVE" in last, last
    assert SECRET not in text


def test_verify_against_an_unreachable_server_exits_with_one_line(valid_raw, mariadb, tmp_path):
    port = free_port()
    raw = {**valid_raw, "source": {**valid_raw["source"], "port": port}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(
        ["verify", "--config", str(path), "--output-dir", str(tmp_path / "report")], env_for(mariadb), timeout=120
    )
    text = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in text, text
    last = last_line(result.stderr)
    assert last.startswith("cdc: cdc_binlog: cannot connect to") and f"127.0.0.1:{port}" in last, last


def test_verify_against_an_unreachable_kafka_exits_with_one_line(valid_raw, mariadb, tmp_path):
    port = free_port()
    raw = {**valid_raw, "kafka": {**valid_raw["kafka"], "bootstrap": f"127.0.0.1:{port}"}}
    path = tmp_path / "relay.toml"
    path.write_text(_to_toml(raw))
    result = cdc(
        ["verify", "--config", str(path), "--output-dir", str(tmp_path / "report")], env_for(mariadb), timeout=120
    )
    text = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in text and "%3|" not in text, text
    last = last_line(result.stderr)
    assert last.startswith(f"cdc: cdc_kafka: cannot list the topics of 127.0.0.1:{port}"), last
