"""The Kafka stand-in's client: `KafkaStandin` starts the server (`python -m
testbed.kafka_standin`) in a process of its own and drives it over its control channel
(see `testbed/kafka_standin/server.py` for what the mock cluster can and cannot do)."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.kafka_standin.common import (
    PARENT_PID_ENV,
    STDERR_TAIL_LINES,
    StandinError,
    port_in_use_message,
)
from testbed.process import port_is_free

# ---------------------------------------------------------------------------
# Client side
# ---------------------------------------------------------------------------


class KafkaStandin:
    """Handle on a running stand-in process; create it with :meth:`start`.

    Thread-safe: control requests are serialised over one TCP connection.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        bootstrap_servers: str,
        control: tuple[str, int],
        log_path: Path,
        brokers: int,
    ) -> None:
        self._proc = proc
        self._bootstrap = bootstrap_servers
        self._control_addr = control
        self._log_path = log_path
        self._brokers = brokers
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._stopped = False

    # -- start ----------------------------------------------------------------

    @classmethod
    def start(
        cls,
        brokers: int = 1,
        port: int | None = None,
        startup_timeout: float = 20.0,
        *,
        group_initial_rebalance_delay_ms: int | None = None,
        debug: str | None = None,
    ) -> KafkaStandin:
        """Spawn ``python -m testbed.kafka_standin`` and wait for its bootstrap line.

        ``port`` fixes broker 1's port (broker k gets ``port + k - 1``); by
        default the kernel picks free ports, which is what tests want.
        ``group_initial_rebalance_delay_ms=0`` makes a consumer group's first
        join immediate instead of Kafka's 3 s.

        The child is bound to this process's lifetime: it holds the read end of
        a pipe on its stdin and exits at EOF, and it asks Linux for SIGKILL when
        the spawning *thread* exits, so call this from a long-lived thread.
        """
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise StandinError(f"Kafka stand-in: brokers must be an integer >= 1, not {brokers!r}")
        if port is not None:
            if not 1 <= port <= 65535 - (brokers - 1):
                raise StandinError(f"Kafka stand-in: port {port} leaves no room for {brokers} consecutive ports")
            for candidate in range(port, port + brokers):
                if not port_is_free(candidate):
                    raise StandinError(port_in_use_message(candidate))

        cmd = [sys.executable, "-m", "testbed.kafka_standin", "--brokers", str(brokers)]
        if port is not None:
            cmd += ["--port", str(port)]
        if group_initial_rebalance_delay_ms is not None:
            cmd += ["--group-initial-rebalance-delay-ms", str(group_initial_rebalance_delay_ms)]
        if debug:
            cmd += ["--debug", debug]

        env = dict(os.environ)
        # Make `-m testbed.kafka_standin` importable whatever the cwd is.
        project_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (project_root, env.get("PYTHONPATH", "")) if p)
        env[PARENT_PID_ENV] = str(os.getpid())

        # stderr goes to a file, not a pipe: nobody drains a pipe after start-up
        # and a chatty librdkafka (debug=...) would block on a full one.
        log_fd, log_name = tempfile.mkstemp(prefix="kafka-standin-", suffix=".log")
        log_path = Path(log_name)
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_fd,
                env=env,
                close_fds=True,
            )
        except OSError as exc:
            os.close(log_fd)
            log_path.unlink(missing_ok=True)
            raise StandinError(f"Kafka stand-in: cannot spawn {cmd[0]}: {exc}") from exc
        os.close(log_fd)

        try:
            info = _read_startup_line(proc, startup_timeout, log_path)
            control_host, _, control_port = str(info["control"]).rpartition(":")
            control = (control_host, int(control_port))
            standin = cls(proc, str(info["bootstrap"]), control, log_path, brokers)
            standin._connect()
        except BaseException:
            # A child that failed to start is of no use: no grace period.
            if proc.poll() is None:
                proc.kill()
            _terminate(proc, 5.0)
            log_path.unlink(missing_ok=True)
            raise
        return standin

    # -- properties -------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``bootstrap.servers`` for clients, e.g. ``"127.0.0.1:41011,127.0.0.1:36789"``."""
        return self._bootstrap

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def brokers(self) -> int:
        return self._brokers

    @property
    def control_address(self) -> tuple[str, int]:
        return self._control_addr

    @property
    def log_path(self) -> Path:
        """The child's stderr (librdkafka logs); removed by :meth:`stop`."""
        return self._log_path

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it has ended, else None."""
        return self._proc.poll()

    # -- control ----------------------------------------------------------------

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one control command and return the reply; raise StandinError on failure."""
        payload = json.dumps({"cmd": cmd, **args}).encode() + b"\n"
        with self._lock:
            if self._stopped:
                raise StandinError(f"Kafka stand-in: {cmd}: the stand-in was stopped")
            try:
                if self._sock is None:
                    self._connect()
                assert self._sock is not None
                self._sock.sendall(payload)
                line = self._reader.readline()
            except OSError as exc:
                self._disconnect()
                message = self._dead_message(f"{cmd}: control channel failed: {exc}")
                raise StandinError(message) from exc
            if not line:
                self._disconnect()
                raise StandinError(self._dead_message(f"{cmd}: control channel closed"))
        reply = json.loads(line)
        if not reply.get("ok"):
            raise StandinError(str(reply.get("error", f"Kafka stand-in: {cmd} failed")))
        return dict(reply)

    def ping(self) -> dict[str, Any]:
        return self.request("ping")

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        """Create a topic (the mock does not implement the CreateTopics admin API)."""
        self.request("create_topic", topic=name, partitions=partitions, replication_factor=replication_factor)

    def broker_down(self, broker_id: int) -> None:
        """Drop the broker's connections and refuse new ones; -1 means all brokers.

        Partition leadership does not move (use :meth:`set_leader`).
        """
        self.request("broker_down", broker_id=broker_id)

    def broker_up(self, broker_id: int) -> None:
        self.request("broker_up", broker_id=broker_id)

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response from the broker (-1: all brokers) by ``rtt_ms``."""
        self.request("set_rtt", broker_id=broker_id, rtt_ms=rtt_ms)

    def push_errors(self, api_key: int | str, errors: Iterable[int | str]) -> None:
        """Make the next ``len(errors)`` requests of ``api_key`` fail with these codes.

        Cluster-wide, consumed in order.  ``api_key`` may be a number or a name
        from :data:`API_KEYS`; errors may be ints or KafkaError names.
        """
        self.request("push_errors", api_key=api_key, errors=list(errors))

    def clear_errors(self, api_key: int | str) -> None:
        self.request("clear_errors", api_key=api_key)

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move a partition's leadership (-1: leader-less); bumps the leader epoch."""
        self.request("set_leader", topic=topic, partition=partition, broker_id=broker_id)

    def set_group_initial_rebalance_delay(self, delay_ms: int) -> None:
        self.request("set_group_initial_rebalance_delay", delay_ms=delay_ms)

    # -- stop -------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down cleanly; kill the process if it has not exited by ``timeout``."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            if self._proc.poll() is None:
                try:
                    if self._sock is None:
                        self._connect()
                    assert self._sock is not None
                    self._sock.sendall(b'{"cmd": "shutdown"}\n')
                    self._reader.readline()
                except OSError:
                    pass  # closing stdin below stops it as well
            self._disconnect()
        _terminate(self._proc, timeout)
        self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> KafkaStandin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._proc.poll() is None else f"exited {self._proc.returncode}"
        return f"KafkaStandin(pid={self.pid}, bootstrap={self._bootstrap!r}, {state})"

    # -- internals --------------------------------------------------------------

    def _connect(self) -> None:
        sock = socket.create_connection(self._control_addr, timeout=10.0)
        self._sock = sock
        self._reader = sock.makefile("rb")

    def _disconnect(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _dead_message(self, what: str) -> str:
        code = self._proc.poll()
        if code is None:
            return f"Kafka stand-in: {what}"
        return _failure_message(f"{what}; the process exited with status {code}", self._log_path)


def _read_startup_line(proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> dict[str, Any]:
    """Read the child's one JSON stdout line, giving up at the deadline."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StandinError(
                    _failure_message(f"did not report its bootstrap address within {timeout:g}s", log_path)
                )
            if not sel.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = proc.wait(timeout=5.0)
                raise StandinError(_failure_message(f"exited with status {code} during start-up", log_path))
            buf += chunk
    proc.stdout.close()
    line = buf.split(b"\n", 1)[0]
    try:
        info = json.loads(line)
    except ValueError as exc:
        raise StandinError(_failure_message(f"printed an unreadable start-up line {line[:200]!r}", log_path)) from exc
    if "error" in info:
        proc.wait(timeout=5.0)
        raise StandinError(str(info["error"]))
    if "bootstrap" not in info or "control" not in info:
        raise StandinError(_failure_message(f"printed an incomplete start-up line {info!r}", log_path))
    return dict(info)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _failure_message(what: str, log_path: Path) -> str:
    tail = _tail(log_path, STDERR_TAIL_LINES)
    message = f"Kafka stand-in {what}"
    if tail:
        message += "; last stderr lines:\n" + tail
    return message


def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Close stdin (the child exits on EOF), wait, then SIGKILL as a last resort."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5.0)
