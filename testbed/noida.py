"""A throwaway Kafka broker with transactions, for the transactional-delivery tests.

The Kafka stand-in (testbed/kafka_standin/, librdkafka's mock cluster) cannot
filter aborted transactions or fence a zombie producer. `noida-db` (a test dependency
from PyPI: one binary that speaks the Kafka protocol, among others) can: transactional
commit and abort, read_committed hides aborted and open transactions, a second
`init_transactions` with the same transactional.id fences the first (`_FENCED`), and
AdminClient creates topics. Started as `noida-db start --only kafka --kafka-port N
--data-dir D` on a free port with a temporary data directory; it dies with its parent
(PR_SET_PDEATHSIG) and `stop()` removes the directory.

Its limits, measured here (tests must respect them; docs/limits.md repeats them):
* kill -9 of the broker loses recently acknowledged messages: never kill it in a test
  that checks for loss (kill the relay instead). `stop()` kills it only because the
  data is thrown away anyway;
* it slows down past about a million messages: keep tests well below;
* SIGTERM takes about 20 s;
* consumers should ask for at most about 1 MB per fetch (`fetch.max.bytes`);
* an open transaction of a producer that never returns is not timed out: it blocks
  read_committed readers of its partitions until that transactional.id's next
  `init_transactions` aborts it;
* a read_committed fetch that starts after an aborted transaction's marker, or a consumer
  that waited at a transaction that was then aborted, skips every later committed record
  of the same producer id: read_committed readers in tests start at each partition's
  beginning;
* it grants an epoch bump requested with an older epoch (InitProducerId with producer id
  and epoch, KIP-360: Kafka answers PRODUCER_FENCED), so a zombie producer could fence its
  successor; librdkafka asks for one when it aborts a transaction with a failed message
  and no partition added yet. The relay never aborts after losing its lease when a message
  failed (cdc/delivery/transactional.py `abandon`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from cdc.errors import ServerError
from connectors.process import die_with_parent
from testbed.process import free_port

CONSUMER_SETTINGS = {"fetch.max.bytes": 1_048_576, "max.partition.fetch.bytes": 1_048_576}


def _binary() -> Path:
    try:
        import noida_db
    except ImportError as exc:
        raise ServerError("noida-db is not installed: run ./run.sh setup (it is a test dependency)") from exc
    path = Path(noida_db.__file__).resolve().parent / "noida-db"
    if not path.exists():
        raise ServerError(f"the noida-db package has no binary at {path}: reinstall it (pip install noida-db)")
    return path


class NoidaKafka:
    def __init__(self, proc: subprocess.Popen, port: int, data_dir: Path, log_path: Path):
        self.proc, self.port, self.data_dir, self.log_path = proc, port, data_dir, log_path
        self.bootstrap = self.bootstrap_servers = f"127.0.0.1:{port}"

    @classmethod
    def start(cls, timeout: float = 30.0) -> NoidaKafka:
        binary = _binary()
        data_dir = Path(tempfile.mkdtemp(prefix="cdc-noida-"))
        port = free_port()
        log_path = data_dir / "noida.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(binary), "start", "--only", "kafka", "--kafka-port", str(port), "--data-dir",
                 str(data_dir / "data")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
            )  # fmt: skip
        broker = cls(proc, port, data_dir, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                text = log_path.read_text(errors="replace")[-500:]
                shutil.rmtree(data_dir, ignore_errors=True)
                raise ServerError(f"noida-db exited with {proc.returncode} at start: {text}")
            try:
                if broker._answers():
                    return broker
            except OSError:
                pass
            time.sleep(0.1)
        broker.stop()
        raise ServerError(f"noida-db did not answer on port {port} within {timeout:g} s")

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
            pass
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:
            return False
        return True

    def create_topic(self, name: str, partitions: int = 3) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # kept alive until the answer
        futures = admin.create_topics([NewTopic(name, partitions, 1)])
        for future in futures.values():
            future.result(timeout=10)

    def stop(self) -> None:
        """Kill the broker and throw its data away (a SIGTERM would take about 20 s)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> NoidaKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # a broker for a manual run or a benchmark: prints its address
    broker = NoidaKafka.start()
    print(broker.bootstrap, flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        broker.stop()
    os._exit(0)
