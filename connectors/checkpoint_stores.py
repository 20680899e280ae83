"""Checkpoint stores (implement cdc.ports.CheckpointStore).

* `FileCheckpointStore`: one JSON file, replaced atomically (write a temporary file,
  fsync, rename, fsync the directory), so a crash leaves the old or the new checkpoint,
  never a torn one. Used by the embedded demo.
* `KafkaCheckpointStore`: the default for deployments: a compacted topic keyed by the
  source name, the last record for the key wins. `save` returns only once the broker
  acknowledged the record (acks=all). Create the topic with cleanup.policy=compact
  beforehand (the stand-in here cannot set topic configs; compaction is a space
  matter, not a correctness one: the reader takes the last record for the key).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from cdc import crashpoints
from cdc.checkpoint import Checkpoint
from cdc.errors import ConfigError, DeliveryError
from connectors.kafka_reader import KafkaTopicReader


class FileCheckpointStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> Checkpoint | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read checkpoint file {self.path}: {exc.strerror}") from exc
        try:
            return Checkpoint.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"checkpoint file {self.path} is not valid JSON ({exc.msg}); restore it from backup") from exc

    def save(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps(checkpoint.to_dict(), sort_keys=True).encode()
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        crashpoints.hit("checkpoint_write")
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class KafkaCheckpointStore:
    def __init__(self, bootstrap: str, topic: str, source: str, producer_config: dict | None = None,
                 timeout_s: float = 30.0):
        self._topic = topic
        self._key = source.encode()
        self._timeout = timeout_s
        self._bootstrap = bootstrap
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
            "partitioner": "murmur2_random", **(producer_config or {}),
        })

    def load(self) -> Checkpoint | None:
        reader = KafkaTopicReader(self._bootstrap)
        try:
            count = reader.partition_count(self._topic)
            if count is None:
                return None
            latest: bytes | None = None
            for partition in range(count):
                low, high = reader.watermarks(self._topic, partition)
                for msg in reader.messages(self._topic, partition, low, high):
                    if msg.key() == self._key:
                        latest = msg.value()
            if latest is None:
                return None
            return Checkpoint.from_dict(json.loads(latest))
        finally:
            reader.close()

    def save(self, checkpoint: Checkpoint) -> None:
        result: list[KafkaError | None] = []
        self._producer.produce(
            self._topic, key=self._key, value=json.dumps(checkpoint.to_dict(), sort_keys=True).encode(),
            on_delivery=lambda err, _msg: result.append(err),
        )
        crashpoints.hit("checkpoint_write")
        self._producer.flush(self._timeout)
        if not result:
            raise DeliveryError(f"checkpoint write to {self._topic} not acknowledged within {self._timeout:.0f} s")
        if result[0] is not None:
            raise DeliveryError(f"checkpoint write to {self._topic} failed: {result[0].str()}")
