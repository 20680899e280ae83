"""TLS to the RabbitMQ exchange sink against a real RabbitMQ 3.10 node: the node serves AMQP
0-9-1 (`listeners.ssl.default`), the stream protocol (`stream.listeners.ssl.1`) and the
management API (`management.ssl.*`) over TLS with a certificate of the test's CA for
127.0.0.1 and localhost, and wants a client certificate of that CA (`verify_peer`,
`fail_if_no_peer_cert`); tests/integration/tls_certs.py makes the files.

- verified TLS, the server's name checked (`ca_file`, `cert_file`, an encrypted `key_file`
  and its `key_password_env`): `cdc check`
  passes, the bindings read over HTTPS; a relay publishes, a second one SIGKILLed after an
  acknowledgement and before its checkpoint, and a third one's recovery scan reads the audit
  stream over the stream protocol's TLS port and sends nothing again: every event once in the
  audit stream and once in a consumer's queue, both read back over TLS with aiormq (not the
  relay's code); no password in any output;
- a CA that did not sign the node's certificate, and the node reached as 127.0.0.2 (loopback,
  through TCP proxies, but not a name the certificate holds): `cdc check` says one FAIL line
  naming the certificate and `sink.rabbitmq_exchange.ca_file`, `cdc run` exits non-zero with
  one `cdc:` line, no traceback; an encrypted key without its password: the same, naming
  `sink.rabbitmq_exchange.key_password_env`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testbed.lab_server import ServerTls
from tests.integration.harness import OUTBOX_DDL, ROOT, RelayProcess, TcpProxy, _to_toml, insert_events, wait_until
from tests.integration.rabbit_exchange import event_id_of, exchange_raw_config, names
from tests.integration.rabbit_streams import rabbit_env
from tests.integration.tls_certs import TlsFiles, make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRONG_HOST = "127.0.0.2"  # loopback, not in the certificate's names (127.0.0.1, localhost)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def rabbit_tls(tls_files):
    from tests.integration.rabbit_exchange import ManagedRabbitMQ

    tls = ServerTls(
        tls_files.server_cert, tls_files.server_key, tls_files.ca, True, tls_files.client_cert, tls_files.client_key
    )
    with ManagedRabbitMQ.start(tls=tls) as node:
        yield node


def _context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.client_cert), str(files.client_key))
    return context


async def _channel(node, files: TlsFiles) -> tuple[Any, Any]:
    """aiormq over the node's AMQP TLS port, the server's name checked (the test's own client)."""
    import aiormq

    url = f"amqps://{node.user}:{node.password}@127.0.0.1:{node.amqp_tls_port}/"
    connection = await aiormq.connect(url, context=_context(files))
    return connection, await connection.channel()


def _declare(node, files: TlsFiles, prefix: str) -> None:
    n = names(prefix)

    async def go() -> None:
        connection, ch = await _channel(node, files)
        try:
            await ch.exchange_declare(n.exchange, exchange_type="topic", durable=True)
            await ch.queue_declare(n.audit, durable=True, arguments={"x-queue-type": "stream"})
            await ch.queue_bind(n.audit, n.exchange, routing_key="#")
            await ch.queue_declare(n.queue, durable=True)
            await ch.queue_bind(n.queue, n.exchange, routing_key="#")
        finally:
            await connection.close()

    asyncio.run(go())


def _audit_over_amqp(node, files: TlsFiles, prefix: str, at_least: int) -> list[tuple[str | None, bytes]]:
    """(message_id, body) of every message of the audit stream, consumed over AMQP 0-9-1 from
    its first offset (`x-stream-offset`, https://www.rabbitmq.com/streams.html#consuming):
    what arrives within a second of the last, once `at_least` arrived or 20 s passed."""

    async def go() -> list[tuple[str | None, bytes]]:
        connection, ch = await _channel(node, files)
        got: list[tuple[str | None, bytes]] = []
        more = asyncio.Event()

        async def on_message(message: Any) -> None:
            got.append((message.header.properties.message_id, message.body))
            more.set()
            await ch.basic_ack(message.delivery.delivery_tag)

        try:
            await ch.basic_qos(prefetch_count=100)  # a stream consumer needs a prefetch
            await ch.basic_consume(names(prefix).audit, on_message, arguments={"x-stream-offset": "first"})
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                more.clear()
                try:
                    await asyncio.wait_for(more.wait(), 1.0)
                except TimeoutError:
                    if len(got) >= at_least or asyncio.get_running_loop().time() > deadline:
                        return got
        finally:
            await connection.close()

    return asyncio.run(go())


def _drain(node, files: TlsFiles, queue: str) -> list[tuple[str | None, bytes]]:
    async def go() -> list[tuple[str | None, bytes]]:
        connection, ch = await _channel(node, files)
        out = []
        try:
            while True:
                msg = await ch.basic_get(queue, no_ack=True)
                if msg.delivery_tag is None or getattr(msg.delivery, "message_count", None) is None:
                    return out
                out.append((msg.header.properties.message_id, msg.body))
        finally:
            await connection.close()

    return asyncio.run(go())


class Setup:
    """A database with an outbox, the exchange / audit stream / a consumer's queue, and the
    relay's configuration over TLS (through `ports`: the node's own TLS ports by default)."""

    def __init__(self, mariadb, node, files: TlsFiles, tmp_path: Path, host: str = "127.0.0.1", ca: Path | None = None,
                 ports: tuple[int, int, int] | None = None, key: str = "plain"):  # fmt: skip
        self.node, self.files, self.db, self.tmp = node, files, mariadb, tmp_path
        self.database = f"t_{uuid.uuid4().hex[:10]}"
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        mariadb.create_database(self.database)
        with mariadb.connect(self.database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(OUTBOX_DDL.format(name="outbox"))
        _declare(node, files, self.prefix)
        amqp, stream, management = ports or (node.amqp_tls_port, node.stream_tls_port, node.management_tls_port)
        self.raw = exchange_raw_config(mariadb, node, self.database, self.prefix, tmp_path / "cp.json")
        self.raw["sink"]["rabbitmq_exchange"].update(
            host=host, port=amqp, stream_port=stream, management_port=management, tls=True,
            ca_file=str(ca or files.ca), cert_file=str(files.client_cert), key_file=str(files.client_key),
        )  # fmt: skip
        if key != "plain":  # the encrypted copy of the client key, with its password or (a fault) without
            self.raw["sink"]["rabbitmq_exchange"]["key_file"] = str(files.client_key_encrypted)
        if key == "encrypted":
            self.raw["sink"]["rabbitmq_exchange"]["key_password_env"] = "CDC_TEST_SINK_KEY_PASSWORD"
        self.env = {**rabbit_env(mariadb, node), "CDC_TEST_SINK_KEY_PASSWORD": files.key_password}
        self.config = tmp_path / "relay.toml"
        self.config.write_text(_to_toml(self.raw))

    def insert(self, n: int, per_tx: int = 5) -> list[str]:
        events = [(str(uuid.uuid4()), "order", f"k{i % 4}", "Created", json.dumps({"n": i})) for i in range(n)]
        with self.db.connect(self.database) as conn:
            for start in range(0, n, per_tx):
                insert_events(conn, "outbox", events[start : start + per_tx])
                conn.commit()
        return [e[0] for e in events]

    def cdc(self, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "cdc_cli.main", args[0], "--config", str(self.config), *args[1:]],
            cwd=ROOT, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        text = result.stdout + result.stderr
        assert "Traceback" not in text, text
        assert self.node.password not in text, f"the node's password in the output of cdc {args[0]}"
        assert self.files.key_password not in text, f"the client key's password in the output of cdc {args[0]}"
        return result

    def relay_log_clean(self, relay: RelayProcess) -> str:
        text = relay.log_text()
        assert self.node.password not in text and "Traceback" not in text, text[-3000:]
        assert self.files.key_password not in text, text[-3000:]
        return text


def test_publish_and_recover_over_verified_tls(mariadb, rabbit_tls, tls_files, tmp_path):
    s = Setup(mariadb, rabbit_tls, tls_files, tmp_path, key="encrypted")  # its password from key_password_env
    check = s.cdc("check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok   rabbitmq: " in check.stdout, check.stdout
    # the bindings, read from the management API over HTTPS with the same CA
    assert f"ok   rabbitmq_binding: routing key '{s.prefix}.dlq' reaches the audit stream" in check.stdout, check.stdout
    assert "not checked" not in check.stdout, check.stdout

    ids = s.insert(10)
    relay = RelayProcess(s.raw, s.env, tmp_path / "r1")
    wait_until(lambda: _queued(s) >= 10 or not relay.alive(), 120, "the first relay to publish")
    assert relay.terminate() == 0, relay.log_text()[-3000:]
    s.relay_log_clean(relay)

    # a second relay publishes 20 more; then its checkpoint is put back to the first one's, as
    # a relay SIGKILLed before writing it would leave it: the third relay's recovery scan must
    # find all 20 in the audit stream, read over the stream protocol's TLS port, and send none
    cp = Path(s.raw["checkpoint"]["path"])
    first_cp = cp.read_bytes()
    ids += s.insert(20)
    relay = RelayProcess(s.raw, s.env, tmp_path / "r2")
    wait_until(lambda: _queued(s) >= 30 or not relay.alive(), 120, "the second relay to publish")
    assert relay.terminate() == 0, relay.log_text()[-3000:]
    cp.write_bytes(first_cp)
    relay = RelayProcess(s.raw, s.env, tmp_path / "r3")
    try:
        found = wait_until(
            lambda: (
                re.search(r"recovering from checkpoint \S+: (\d+) events found delivered", relay.log_text())
                or not relay.alive()
            ),
            120,
            "the third relay's recovery scan",
        )
        assert relay.alive(), relay.log_text()[-3000:]
    finally:
        assert relay.terminate() == 0, relay.log_text()[-3000:]
    text = s.relay_log_clean(relay)
    assert int(found.group(1)) == 20, text[-3000:]  # the scan read the audit stream over TLS
    assert "0 events published" in text, text[-3000:]

    audit = _audit_over_amqp(rabbit_tls, tls_files, s.prefix, at_least=30)
    queued = _drain(rabbit_tls, tls_files, names(s.prefix).queue)
    for where, held in (("audit stream", audit), ("consumer queue", queued)):
        counts = Counter(event_id_of(body) for _mid, body in held)
        assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}, (where, counts)
        assert all(mid and mid.startswith(s.raw["source"]["name"] + "|") for mid, _ in held), where
    print(f"\nexchange sink over TLS: 30 events once in the audit stream and the queue; {found.group(0)}")


def _queued(s: Setup) -> int:
    """How many messages the consumer's queue holds (a passive declare's count), over TLS."""

    async def go() -> int:
        connection, ch = await _channel(s.node, s.files)
        try:
            declared = await ch.queue_declare(names(s.prefix).queue, passive=True)
            return int(declared.message_count)
        finally:
            await connection.close()

    return asyncio.run(go())


@pytest.mark.parametrize("fault", ["wrong_ca", "wrong_host", "key_without_password"])
def test_a_wrong_ca_or_host_name_is_one_line(mariadb, rabbit_tls, tls_files, tmp_path, fault):
    node = rabbit_tls
    # each of the node's TLS ports reached as 127.0.0.2: the relay reads the audit stream and
    # the bindings on that host too, so none of them may fail for another reason
    with (
        TcpProxy(node.amqp_tls_port, listen_host=WRONG_HOST) as amqp,
        TcpProxy(node.stream_tls_port, listen_host=WRONG_HOST) as stream,
        TcpProxy(node.management_tls_port, listen_host=WRONG_HOST) as management,
    ):
        fragment, fix = "certificate verify failed", "sink.rabbitmq_exchange.ca_file"
        if fault == "wrong_ca":
            s = Setup(mariadb, node, tls_files, tmp_path, ca=tls_files.other_ca)
        elif fault == "wrong_host":
            s = Setup(
                mariadb, node, tls_files, tmp_path, host=WRONG_HOST, ports=(amqp.port, stream.port, management.port)
            )
        else:  # an encrypted client key without its password: one line, never OpenSSL's prompt
            s = Setup(mariadb, node, tls_files, tmp_path, key="encrypted_no_password")
            fragment, fix = "is encrypted and no password is set", "sink.rabbitmq_exchange.key_password_env"
        s.insert(3)
        check = s.cdc("check")
        fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
        assert check.returncode != 0 and len(fails) == 1, check.stdout + check.stderr
        assert fails[0].startswith("FAIL rabbitmq: ") and fragment in fails[0], fails[0]
        assert fix in fails[0], fails[0]  # the fix: the setting to change
        print(f"\n{fails[0]}")
        for args in (["run"], ["run", "--skip-check"]):
            result = s.cdc(*args)
            lines = [line for line in result.stderr.splitlines() if line.startswith("cdc")]
            assert result.returncode not in (0, 3), f"cdc {' '.join(args)}: exit {result.returncode}: {result.stderr}"
            assert len(lines) == 1 and fragment in lines[0], f"cdc {' '.join(args)}: {result.stderr}"
            assert fix in lines[0], lines[0]
            print(f"cdc {' '.join(args)} ({fault}): exit {result.returncode}: {lines[0][:200]}")
