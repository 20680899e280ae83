"""TLS to the sinks beyond Kafka: a nats-server and a RabbitMQ 3.10 node (its stream
plugin's TLS listener) serving a certificate of the test's CA for 127.0.0.1 and
localhost, each wanting a client certificate of that CA (`verify`), one of each for the
module (tests/integration/tls_certs.py makes the files).

- verified TLS, the server's name checked (the relay's `ca_file`, `cert_file`, an encrypted
  `key_file` and its `key_password_env`): `cdc run` publishes, `cdc check` passes, `cdc
  verify` reads the sink with the same settings (the verifier's `cdc_nats` / `cdc_rabbitmq`
  options, `key_password` among them) and is clean, `cdc repair` reads the sink (the event is
  there: nothing published), `cdc locate` finds a message; no password in any output;
- a CA that did not sign the server's certificate, and the server reached as 127.0.0.2
  (loopback too, through a TCP proxy, but not a name the certificate holds): each of those
  commands fails in one line naming the certificate, exit non-zero, no traceback; an
  encrypted key without its password: one line naming key_password_env, never a prompt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cdc.events.identity import H_EVENT_ID, H_FILE, H_GTID, H_POS, H_ROW, H_SOURCE
from testbed.lab_server import ServerTls
from tests.integration import nats_harness, rabbit_streams
from tests.integration.harness import OUTBOX_DDL, ROOT, RelayProcess, TcpProxy, _to_toml, insert_events, wait_until
from tests.integration.tls_certs import TlsFiles, make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVENTS = 30
WRONG_HOST = "127.0.0.2"  # loopback, not in the certificate's names (127.0.0.1, localhost)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _server_tls(files: TlsFiles) -> ServerTls:
    return ServerTls(files.server_cert, files.server_key, files.ca, True, files.client_cert, files.client_key)


@pytest.fixture(scope="module")
def nats_tls(tls_files):
    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start(tls=_server_tls(tls_files)) as server:
        yield server


@pytest.fixture(scope="module")
def rabbit_tls(tls_files):
    from testbed.rabbitmq import EmbeddedRabbitMQ

    with EmbeddedRabbitMQ.start(tls=_server_tls(tls_files)) as node:
        yield node


KEY_PASSWORD_ENV = "CDC_TEST_SINK_KEY_PASSWORD"


def _client_files(files: TlsFiles, ca: Path | None = None, key: str = "plain") -> dict[str, str]:
    """The relay's TLS settings: the test CA (or `ca`) and the client certificate, its key plain,
    `encrypted` with its password from KEY_PASSWORD_ENV, or `encrypted_no_password`."""
    out = {"ca_file": str(ca or files.ca), "cert_file": str(files.client_cert), "key_file": str(files.client_key)}
    if key != "plain":
        out["key_file"] = str(files.client_key_encrypted)
    if key == "encrypted":
        out["key_password_env"] = KEY_PASSWORD_ENV
    return out


class NatsSide:
    label, check_name, section = "nats", "nats", "sink.nats_jetstream"

    def __init__(self, server, files: TlsFiles):
        self.server, self.files = server, files
        self.password = server.password

    def prepare(self, prefix: str) -> None:
        nats_harness.create_streams(
            self.server, {f"{prefix}_events": [f"{prefix}.order"], f"{prefix}_dlq": [f"{prefix}.dlq"]}
        )

    def raw(self, db, database: str, prefix: str, checkpoint: Path, host: str, port: int, ca, key: str) -> dict:
        raw = nats_harness.nats_raw_config(db, self.server, database, prefix, checkpoint)
        raw["sink"]["nats_jetstream"].update(servers=[f"nats://{host}:{port}"], **_client_files(self.files, ca, key))
        return raw

    def env(self, db) -> dict[str, str]:
        return nats_harness.nats_env(db, self.server)

    @property
    def port(self) -> int:
        return self.server.port

    def messages(self, prefix: str) -> list[Any]:
        from spark_jobs.nats.source import plan_nats, read_range

        settings = self.server.connect_settings()
        out: list[Any] = []
        for part in plan_nats(settings, [f"{prefix}.order"])["partitions"]:
            out += read_range(settings, part["topic"], part["stream"], part["low"], part["high"])
        return out


class RabbitSide:
    label, check_name, section = "rabbitmq", "rabbitmq", "sink.rabbitmq_stream"

    def __init__(self, node, files: TlsFiles):
        self.node, self.files = node, files
        self.password = node.password

    def prepare(self, prefix: str) -> None:
        rabbit_streams.create_streams(self.node, [f"{prefix}.order", f"{prefix}.dlq"])

    def raw(self, db, database: str, prefix: str, checkpoint: Path, host: str, port: int, ca, key: str) -> dict:
        raw = rabbit_streams.rabbit_raw_config(db, self.node, database, prefix, checkpoint)
        raw["sink"]["rabbitmq_stream"].update(host=host, port=port, tls=True, **_client_files(self.files, ca, key))
        return raw

    def env(self, db) -> dict[str, str]:
        return rabbit_streams.rabbit_env(db, self.node)

    @property
    def port(self) -> int:
        return self.node.stream_tls_port

    def messages(self, prefix: str) -> list[Any]:
        return rabbit_streams.stream_messages(self.node, [f"{prefix}.order"])


@pytest.fixture(params=["nats", "rabbitmq"])
def side(request, tls_files):
    if request.param == "nats":
        return NatsSide(request.getfixturevalue("nats_tls"), tls_files)
    return RabbitSide(request.getfixturevalue("rabbit_tls"), tls_files)


def _cdc(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Setup:
    """A database with an outbox, the sink's destinations, and the relay's config file."""

    def __init__(
        self, mariadb, side, tmp_path: Path, host: str = "127.0.0.1", port: int = 0, ca: Path | None = None, key="plain"
    ):
        self.side = side
        self.database = f"t_{uuid.uuid4().hex[:10]}"
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        mariadb.create_database(self.database)
        with mariadb.connect(self.database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(OUTBOX_DDL.format(name="outbox"))
        side.prepare(self.prefix)
        self.raw = side.raw(mariadb, self.database, self.prefix, tmp_path / "cp.json", host, port or side.port, ca, key)
        self.env = {**side.env(mariadb), KEY_PASSWORD_ENV: side.files.key_password}
        self.config = tmp_path / "relay.toml"
        self.config.write_text(_to_toml(self.raw))
        self.tmp = tmp_path
        self.db = mariadb

    def insert(self, n: int) -> list[str]:
        events = [(str(uuid.uuid4()), "order", f"k{i % 4}", "Created", json.dumps({"n": i})) for i in range(n)]
        with self.db.connect(self.database) as conn:
            insert_events(conn, "outbox", events)
            conn.commit()
        return [e[0] for e in events]

    def cdc(self, *args: str) -> subprocess.CompletedProcess:
        result = _cdc([args[0], "--config", str(self.config), *args[1:]], self.env)
        text = result.stdout + result.stderr
        assert "Traceback" not in text, text
        assert self.side.password not in text, f"the sink's password in the output of cdc {args[0]}"
        assert self.side.files.key_password not in text, f"the client key's password in the output of cdc {args[0]}"
        return result

    def report(self, event: Any) -> Path:
        """A verify output directory naming `event` (a message the sink holds) missing."""
        h = {k: v.decode() for k, v in event.headers()}
        out = self.tmp / "seeded-report"
        out.mkdir(exist_ok=True)
        row = {"source": h[H_SOURCE], "file": h[H_FILE], "pos": int(h[H_POS]), "row": int(h[H_ROW]),
               "gtid": h.get(H_GTID), "event_id": h[H_EVENT_ID], "expected_topic": f"{self.prefix}.order"}  # fmt: skip
        (out / "missing.jsonl").write_text(json.dumps(row) + "\n")
        return out


@pytest.mark.spark
def test_relay_check_verify_repair_locate_over_verified_tls(mariadb, side, tmp_path):
    """With an encrypted client key, its password from `key_password_env` (the verifier gets
    it as its source's `key_password` option): the plain key is the faults' test below."""
    s = Setup(mariadb, side, tmp_path, key="encrypted")
    check = s.cdc("check")
    assert check.returncode == 0 and f"ok   {side.check_name}: " in check.stdout, check.stdout + check.stderr

    ids = s.insert(EVENTS)
    relay = RelayProcess(s.raw, s.env, tmp_path / "relay")
    try:
        wait_until(lambda: len(side.messages(s.prefix)) >= EVENTS or not relay.alive(), 120, "the relay to publish")
        assert relay.alive(), relay.log_text()[-3000:]
    finally:
        assert relay.terminate() == 0, relay.log_text()[-3000:]
    assert side.password not in relay.log_text() and side.files.key_password not in relay.log_text()
    held = side.messages(s.prefix)
    assert sorted(dict(m.headers())[H_EVENT_ID].decode() for m in held) == sorted(ids)

    verify = s.cdc("verify", "--output-dir", str(tmp_path / "v"))
    assert verify.returncode == 0, verify.stdout + verify.stderr[-3000:]
    report = (tmp_path / "v" / "report.json").read_text()
    assert json.loads(report)["counts"]["delivered"] == EVENTS, report[:2000]
    assert side.password not in report and side.files.key_password not in report

    repair = s.cdc("repair", "--report", str(s.report(held[5])))
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert len(side.messages(s.prefix)) == EVENTS  # found over TLS: not published again

    locate = s.cdc("locate", "--topic", f"{s.prefix}.order", "--partition", "0", "--offset", str(held[3].offset()))
    assert locate.returncode == 0, locate.stdout + locate.stderr
    assert json.loads(locate.stdout)["event_id"] == dict(held[3].headers())[H_EVENT_ID].decode()


@pytest.mark.spark
@pytest.mark.parametrize("fault", ["wrong_ca", "wrong_host", "key_without_password"])
def test_a_wrong_ca_or_host_name_is_one_fail_line(mariadb, side, tls_files, tmp_path, fault):
    """Also an encrypted client key without its password: one line naming the setting, never
    OpenSSL's prompt for the password (the commands run without a terminal here; with one,
    a prompt would wait)."""
    with TcpProxy(side.port, listen_host=WRONG_HOST) as proxy:
        fragment, fix = "certificate verify failed", f"{side.section}.ca_file"
        if fault == "wrong_ca":
            s = Setup(mariadb, side, tmp_path, ca=tls_files.other_ca)
        elif fault == "wrong_host":
            s = Setup(mariadb, side, tmp_path, host=WRONG_HOST, port=proxy.port)
        else:
            s = Setup(mariadb, side, tmp_path, key="encrypted_no_password")
            fragment, fix = "is encrypted and no password is set", f"{side.section}.key_password_env"
        s.insert(3)

        check = s.cdc("check")
        fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
        assert check.returncode != 0 and len(fails) == 1, check.stdout + check.stderr
        assert fails[0].startswith(f"FAIL {side.check_name}: ") and fragment in fails[0], fails[0]
        assert fix in fails[0], fails[0]  # the fix: the setting to change
        print(f"\n{fails[0]}")

        for args in (
            ["run"],
            ["run", "--skip-check"],
            ["verify", "--output-dir", str(tmp_path / "v")],
            ["repair", "--report", str(s.report(_FakeMessage(s)))],
            ["locate", "--topic", f"{s.prefix}.order", "--partition", "0", "--offset", "1"],
        ):
            t = time.monotonic()
            result = s.cdc(*args)
            print(
                f"cdc {' '.join(args[:1])} ({side.label}, {fault}): exit {result.returncode} in {time.monotonic() - t:.1f}s"
            )
            lines = [line for line in result.stderr.splitlines() if line.startswith("cdc")]
            assert result.returncode not in (0, 3), f"cdc {args[0]}: exit {result.returncode}: {result.stderr}"
            assert len(lines) == 1 and fragment in lines[0], f"cdc {' '.join(args)}: {result.stderr}"


class _FakeMessage:
    """Identity headers of a made-up event, for a seeded report (repair must read the sink
    before it publishes anything)."""

    def __init__(self, s: Setup):
        self._headers = {H_SOURCE: s.raw["source"]["name"], H_FILE: "mysql-bin.000001", H_POS: "4", H_ROW: "0",
                         H_EVENT_ID: "e1"}  # fmt: skip

    def headers(self) -> list[tuple[str, bytes]]:
        return [(k, v.encode()) for k, v in self._headers.items()]
