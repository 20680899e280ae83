"""Checkpoint stores (implement cdc.ports.CheckpointStore).

* `FileCheckpointStore`: one JSON file, replaced atomically (write a temporary file,
  fsync, rename, fsync the directory), so a crash leaves the old or the new checkpoint,
  never a torn one. Used by the embedded demo. A save whose lease epoch is older than
  the file's is refused (LeaseLost): a newer relay holds the source (cdc/lease.py); an
  advisory lock on a side file, held for the compare and the rename only (not the
  fsyncs), makes them one step. A writer killed inside its save leaves its temporary
  file (`<name>.<pid>.<thread>.tmp`); a load or save removes those of processes no
  longer running on this machine, never one of a live writer.
* `KafkaCheckpointStore`: the default for deployments: a compacted topic keyed by the
  source name. The record with the newest lease epoch wins, the last of those if
  several: a relay that lost its lease may still append one, and it is ignored. `save`
  returns only once the broker acknowledged the record (acks=all). Create the topic
  with cleanup.policy=compact beforehand (the stand-in here cannot set topic configs;
  compaction is a space matter, not a correctness one: compaction keeps the last record
  for the key, which is the newest epoch's unless a relay that lost its lease wrote
  after its successor, and then only until the successor's next checkpoint).
* `TransactionalCheckpointStore`: the same topic, written by the relay's transactional
  producer inside the Kafka transaction that holds the messages before the checkpoint
  (`kafka.delivery = "transactional"`): the record becomes visible to the read_committed
  `load` exactly when those messages do. `save` only produces; the relay's commit makes
  it durable.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from cdc import crashpoints
from cdc.checkpoint import Checkpoint
from cdc.errors import ConfigError, DeliveryError
from cdc.kafka_client import KafkaClientConfig
from cdc.lease import LeaseLost
from connectors.kafka.client_log import client_logging
from connectors.kafka.reader import KafkaTopicReader


class FileCheckpointStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> Checkpoint | None:
        self._remove_dead_writers_files()
        return self._read()

    def _remove_dead_writers_files(self) -> None:
        """Delete the temporary files that writers killed inside `save` left behind: those
        named after a pid with no process now. A live pid keeps its file, whoever it is
        (a reused pid errs on keeping); so does every thread of this process."""
        prefix = self.path.name + "."
        try:
            names = os.listdir(self.path.parent)
        except FileNotFoundError:
            return
        for name in names:
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid, _, thread = name[len(prefix) : -len(".tmp")].partition(".")
            if not (pid.isdigit() and thread.isdigit()) or _process_exists(int(pid)):
                continue
            (self.path.parent / name).unlink(missing_ok=True)

    def _read(self) -> Checkpoint | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read checkpoint file {self.path}: {exc.strerror}") from exc
        try:
            return Checkpoint.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"checkpoint file {self.path} is not valid JSON ({exc.msg}); restore it from backup"
            ) from exc

    def save(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._remove_dead_writers_files()
        # Written and fsynced before the lock is taken, under a name of this writer's own:
        # a relay frozen (SIGSTOP, a paused VM) in the slow part of a save must not hold
        # up its successor's checkpoints, and two writers never share a temporary file (one
        # killed before its rename leaves its own behind, which the next load or save removes).
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        data = json.dumps(checkpoint.to_dict(), sort_keys=True).encode()
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            crashpoints.hit("checkpoint_write")
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if checkpoint.epoch:
                    current = self._read()
                    if current is not None and current.epoch > checkpoint.epoch:
                        raise LeaseLost(
                            f"checkpoint file {self.path} was written by a relay of lease epoch "
                            f"{current.epoch}, this relay's is {checkpoint.epoch}: a newer relay holds "
                            "the source"
                        )
                os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)  # refused, or failed before the replace
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: the existence and permission checks only (kill(2))
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


# The checkpoint producer: [kafka.client] and [kafka.producer] apply, but a checkpoint
# is written at once and acknowledged by every in-sync replica, whatever they say.
CHECKPOINT_PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 0, "partitioner": "murmur2_random"}


def checkpoint_producer_settings(clients: KafkaClientConfig | str) -> dict:
    return KafkaClientConfig.of(clients).conf("producer", enforced=CHECKPOINT_PRODUCER)


class KafkaCheckpointStore:
    def __init__(
        self,
        clients: KafkaClientConfig | str,
        topic: str,
        source: str,
        timeout_s: float = 30.0,
        own_producer: bool = True,
    ):
        self._topic = topic
        self._key = source.encode()
        self._timeout = timeout_s
        self._clients = KafkaClientConfig.of(clients)
        if own_producer:
            self._producer = Producer({**checkpoint_producer_settings(self._clients), **client_logging()})

    def load(self) -> Checkpoint | None:
        # End-of-partition events: a partition that ends in a transaction marker (no record
        # at high - 1) is done at once instead of after a consume timeout.
        reader = KafkaTopicReader(self._clients, {"enable.partition.eof": True})
        try:
            count = reader.partition_count(self._topic)
            if count is None:
                return None
            newest: Checkpoint | None = None
            for partition in range(count):
                low, high = reader.watermarks(self._topic, partition)
                for msg in reader.messages(self._topic, partition, low, high):
                    if msg.key() == self._key:
                        cp = Checkpoint.from_dict(json.loads(msg.value()))
                        if newest is None or cp.epoch >= newest.epoch:
                            newest = cp
            return newest
        finally:
            reader.close()

    def save(self, checkpoint: Checkpoint) -> None:
        result: list[KafkaError | None] = []
        self._producer.produce(
            self._topic,
            key=self._key,
            value=json.dumps(checkpoint.to_dict(), sort_keys=True).encode(),
            on_delivery=lambda err, _msg: result.append(err),
        )
        crashpoints.hit("checkpoint_write")
        self._producer.flush(self._timeout)
        if not result:
            raise DeliveryError(f"checkpoint write to {self._topic} not acknowledged within {self._timeout:.0f} s")
        if result[0] is not None:
            raise DeliveryError(f"checkpoint write to {self._topic} failed: {result[0].str()}")


class TransactionalCheckpointStore(KafkaCheckpointStore):
    """The Kafka store written inside the relay's open Kafka transaction (see above)."""

    def __init__(self, clients: KafkaClientConfig | str, topic: str, source: str, publisher) -> None:
        super().__init__(clients, topic, source, own_producer=False)
        self._publisher = publisher  # connectors.kafka.sink.TransactionalKafkaPublisher

    def save(self, checkpoint: Checkpoint) -> None:
        self._publisher.produce_record(
            self._topic, self._key, json.dumps(checkpoint.to_dict(), sort_keys=True).encode()
        )
        crashpoints.hit("checkpoint_write")
