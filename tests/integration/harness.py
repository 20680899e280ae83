"""Helpers for integration tests: a relay in a thread or in its own process, topic
readers, outbox tables, and waits with deadlines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.config import Config, load_config
from cdc.events.identity import header_dict
from cdc.metrics import RelayMetrics
from cdc.relay import RunSummary
from connectors.kafka.reader import KafkaTopicReader
from connectors.mysql.client import binlog_end
from connectors.schema_registry.avro_serializer import decode

ROOT = Path(__file__).resolve().parents[2]

OUTBOX_DDL = """CREATE TABLE {name} (
    id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255),
    type VARCHAR(255) NOT NULL, payload LONGTEXT, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def master_position(db) -> str:
    with db.connect() as conn, conn.cursor() as cur:
        end = binlog_end(cur)  # SHOW MASTER STATUS / SHOW BINARY LOG STATUS by version
    if end is None:
        raise RuntimeError("binary logging is off on the test server")
    file, pos = end
    return f"{file}:{pos}"


def relay_raw_config(db, kafka, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> dict:
    """A relay config as the TOML dict: outbox table `<database>.outbox`, topics
    `<prefix>.<aggregate_type>`, dead letters in `<prefix>.dlq`, a file checkpoint,
    `topics.missing = "auto"` (the stand-in creates topics on first use)."""
    raw: dict[str, Any] = {
        "source": {
            "name": f"src-{prefix}",
            "host": db.host,
            "port": db.port,
            "user": db.user,
            "password_env": "CDC_TEST_MYSQL_PASSWORD",
            "replica_server_id": 5000 + (hash(prefix) % 10000),
            "start": master_position(db),
            "heartbeat_s": 0.5,
        },
        "outbox": {"tables": [{"schema": database, "table": "outbox", "topic": prefix + ".{aggregate_type}"}]},
        "kafka": {"bootstrap": kafka.bootstrap_servers, "dead_letter_topic": f"{prefix}.dlq"},
        "schema_registry": {"url": f"mock://{prefix}"},
        "checkpoint": {"store": "file", "path": str(checkpoint), "interval_s": 0.2},
        # The stand-in creates a topic on its first produce (auto.create.topics.enable=true):
        # "auto" is that broker's setting. tests/integration/test_kafka_security.py runs
        # the default ("dead_letter") and "create".
        "topics": {"missing": "auto"},
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        if key:
            raw.setdefault(section, {})[key] = value
        else:
            raw[section] = value
    return raw


def env_for(db) -> dict[str, str]:
    return {"CDC_TEST_MYSQL_PASSWORD": db.password or ""}


def relay_config(db, kafka, database: str, prefix: str, checkpoint: Path, **overrides: Any) -> Config:
    return load_config(relay_raw_config(db, kafka, database, prefix, checkpoint, **overrides), env_for(db))


class RelayThread:
    """`run_relay` in a thread of the test process."""

    def __init__(self, cfg: Config, check: bool = True):
        from cdc_cli.app import run_relay

        self.metrics = RelayMetrics()
        self._stop = threading.Event()
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.summary = run_relay(cfg, self._stop.is_set, self.metrics, check=check)
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=target, name="relay-under-test", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_delivered(self, count: int, timeout: float = 60.0) -> None:
        m = self.metrics
        wait_until(
            lambda: self.error or m.events_published + m.dead_lettered_total >= count,
            timeout,
            f"{count} events delivered (have {m.events_published} + {m.dead_lettered_total} dead-lettered)",
        )
        if self.error:
            raise self.error

    def stop(self, timeout: float = 60.0) -> RunSummary:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "relay did not stop"
        if self.error:
            raise self.error
        assert self.summary is not None
        return self.summary


class RelayProcess:
    """`cdc run` in its own process (what SIGTERM, SIGKILL and crash points need)."""

    def __init__(
        self,
        raw_config: dict,
        env: dict[str, str],
        workdir: Path,
        crash_at: str | None = None,
        extra_env: dict[str, str] | None = None,
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "relay.json.toml"
        self.config_path.write_text(_to_toml(raw_config))
        self.log_path = workdir / f"relay-{time.monotonic_ns()}.log"
        full_env = {**os.environ, **env, **(extra_env or {})}
        full_env.pop("CDC_CRASH_AT", None)
        if crash_at:
            full_env["CDC_CRASH_AT"] = crash_at
        self._log = open(self.log_path, "wb")  # the child process writes it until it is stopped
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cdc_cli.main", "run", "--config", str(self.config_path), "--skip-check"],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def catches_sigterm(self) -> bool:
        """Whether the child has installed its SIGTERM handler (SigCgt bit 15 in /proc)."""
        return bool(int(proc_status(self.proc.pid).get("SigCgt", "0"), 16) >> (signal.SIGTERM - 1) & 1)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, once the child catches it: sent while the interpreter is still starting,
        it is a death by signal whatever the relay does, and on a loaded machine a test that
        stops a relay it has just started can get there first (a CI failure: -15)."""
        deadline = time.monotonic() + 30
        while self.alive() and not self.catches_sigterm() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def proc_status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a dict ({} once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _to_toml(raw: dict) -> str:
    """Enough TOML for test configs: sections of scalars, lists and inline tables."""
    lines = []
    for section, body in raw.items():
        lines.append(f"[{section}]")
        for key, value in body.items():
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    value: dict | None  # the decoded Avro envelope (None on the dead-letter topic)
    raw_value: bytes
    timestamp_ms: int
    value_was_null: bool = False  # a null value (a tombstone): raw_value is then b""


def read_topic(bootstrap: str, topic: str) -> list[Record]:
    """Every record the topic holds, partition by partition, in offset order."""
    reader = KafkaTopicReader(bootstrap)
    try:
        count = reader.partition_count(topic)
        out: list[Record] = []
        for partition in range(count or 0):
            low, high = reader.watermarks(topic, partition)
            for msg in reader.messages(topic, partition, low, high):
                raw = msg.value() or b""
                try:
                    value = decode(raw)[1]
                except (ValueError, EOFError, StopIteration):  # not the envelope (a payload format)
                    value = None
                key = msg.key()
                out.append(
                    Record(
                        topic,
                        partition,
                        msg.offset(),
                        key.decode() if key is not None else None,
                        header_dict(msg.headers()),
                        value,
                        raw,
                        msg.timestamp()[1],
                        msg.value() is None,
                    )
                )
        return out
    finally:
        reader.close()


def insert_events(conn, table: str, events: list[tuple[str, str, str, str, str | None]]) -> None:
    """INSERT (id, aggregatetype, aggregateid, type, payload) rows in the current transaction."""
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) VALUES (%s,%s,%s,%s,%s)", events
        )


class TcpProxy:
    """A TCP proxy to a local port, for network faults a test sets up itself.

    `freeze()`: the connections open now stop forwarding (they stay open and silent, no
    reset), new ones are forwarded normally. `freeze_busiest()`: only the open connection
    that has carried the most bytes from the server (a binlog stream, not the relay's
    lease or control sessions) goes silent. `cut()`: from now on every byte of every
    connection, new ones included, is dropped (a partition as both ends see it)."""

    def __init__(self, target_port: int, listen_host: str = "127.0.0.1"):
        self._target = target_port
        # listen_host: another loopback address (127.0.0.2) reaches the same server under
        # a name its certificate does not hold (tests/integration/test_sink_tls.py)
        self._listener = socket.create_server((listen_host, 0))
        self.port = self._listener.getsockname()[1]
        self._frozen: set[int] = set()
        self._live: list[int] = []
        self._received: dict[int, int] = {}  # bytes from the server, per connection
        self._cut = threading.Event()
        self._socks: list[socket.socket] = []
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
                gen = len(self._live) + 1
                self._live.append(gen)
                self._socks += [client, server]
            for a, b, from_server in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(a, b, gen, from_server), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gen: int, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if gen in self._frozen or self._cut.is_set():
                    continue  # swallowed: the peer hears nothing, and no reset either
                if from_server:
                    self._received[gen] = self._received.get(gen, 0) + len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if from_server:
                self._received.pop(gen, None)  # closed: no longer a candidate for freeze_busiest

    def freeze(self) -> None:
        with self._lock:
            self._frozen.update(self._live)

    def freeze_busiest(self) -> None:
        with self._lock:
            self._frozen.add(max(self._received, key=self._received.__getitem__))

    def cut(self) -> None:
        self._cut.set()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
