"""What the brokers' lab servers (`rabbitmq.py`, `nats.py`) share: one server process in a
temporary directory, and its life - a clean stop (SIGTERM, SIGKILL after a deadline), a
crash (SIGKILL), a restart on the same data, a cut-off (SIGSTOP / SIGCONT) and the
clean-up, also at interpreter exit (a parent killed by a signal takes its servers with it
through PR_SET_PDEATHSIG, which each subclass sets on its children)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cdc.errors import ServerError
from testbed.process import HOST, OWNER_FILE, owner_stamp, stale_roots

_running: set[LabServer] = set()
_running_lock = threading.Lock()


@atexit.register
def _kill_all_at_exit() -> None:
    with _running_lock:
        servers = list(_running)
    for server in servers:
        try:
            server.cleanup(graceful=False)
        except Exception:
            pass


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat,
    proc(5)); a thread or process that ended meanwhile counts as stopped."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # the process is gone
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        # the state follows the command name, which is in parentheses and may hold any byte
        state = stat[stat.rindex(b")") + 2 :][:1]
        if state not in (b"T", b"t", b"Z", b"X"):
            return False
    return True


def new_root(prefix: str) -> Path:
    """A new temporary directory `$TMPDIR/<prefix>*` stamped with its owner (this process),
    after deleting those of owners that are gone (their servers died with them)."""
    for stale in stale_roots(prefix):
        shutil.rmtree(stale, ignore_errors=True)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    (root / OWNER_FILE).write_text(owner_stamp(os.getpid()) or "")
    return root


@dataclass(frozen=True)
class ServerTls:
    """The certificate a lab server serves TLS with (PEM files), for the sinks' TLS tests.
    `ca`: the CA that signed it, also the one a client certificate must come from when
    `verify` (the server then refuses a client without one)."""

    cert: Path
    key: Path
    ca: Path
    verify: bool = False
    client_cert: Path | None = None  # what the lab's own clients (readiness probe, tests) present
    client_key: Path | None = None

    def client_context(self) -> ssl.SSLContext:
        """A client's TLS context for this server: its CA, the host name checked (the
        certificate holds 127.0.0.1), the client certificate when the server wants one."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key) if self.client_key else None)
        return context


def binary_override(env_var: str, label: str, hint: str, error: type[ServerError]) -> str | None:
    """The executable `env_var` names (None when unset); one line naming the fix when it
    names no executable file."""
    override = os.environ.get(env_var)
    if not override:
        return None
    if os.path.isfile(override) and os.access(override, os.X_OK):
        return override
    raise error(f"{label} not found: {env_var}={override!r} is not an executable file; {hint}")


def log_excerpt(sources: list[tuple[Path, int]], marks: tuple[str, ...]) -> str:
    """One line for an error message: the last lines of the logs (each read from its byte
    offset) that hold one of `marks`, else their last lines."""
    lines: list[str] = []
    for path, start in sources:
        try:
            data = path.read_bytes()[start:]
        except OSError:
            continue
        lines += [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    wanted = [line for line in lines if any(mark in line for mark in marks)][-4:] or lines[-4:]
    return "its log: " + (" | ".join(wanted) if wanted else "(empty)")


def log_mentions(paths: list[Path], needle: str) -> bool:
    """Whether any of the logs holds `needle` (case-insensitive)."""
    for path in paths:
        try:
            if needle.lower() in path.read_bytes().decode("utf-8", "replace").lower():
                return True
        except OSError:
            continue
    return False


# How often a start is tried again, with new ports, when a port it picked was taken before
# the server bound it (testbed/process.py's free_port: the kernel's choice, released at once).
PORT_TAKEN_TRIES = 3


class LabServer:
    """A server process (`self._proc`) living in `self.root`. A subclass starts it in
    `_spawn_and_wait(timeout) -> seconds` (calling `_started()` once it has a process), and
    names itself in `label` and its error class in `error`."""

    label = "server"
    error: type[ServerError] = ServerError
    host = HOST  # loopback only
    user = "cdc"  # the tests' account on the server
    password = "cdc-test"

    def __init__(self, root: Path, startup_timeout: float) -> None:
        self.root = root
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.timings: dict[str, float] = {}
        """Seconds from spawning the server to its first answer: `start`, and the last `restart`."""

    def _spawn_and_wait(self, timeout: float) -> float:
        raise NotImplementedError

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        with _running_lock:
            _running.add(self)

    def _stop_helpers(self) -> None:
        """Stop what else the subclass runs beside the server (at clean-up)."""

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    def stop(self, timeout: float = 60.0) -> None:
        """A clean stop (SIGTERM), SIGKILL when it is not gone within `timeout` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot stop
                proc.terminate()
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the server, like a crash."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self, startup_timeout: float | None = None, *, graceful: bool = True) -> Any:
        """Stop (SIGTERM, or SIGKILL with `graceful=False`) and start again on the same
        ports and data: what the server had stored survives."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self.timings["restart"] = self._spawn_and_wait(
            self.startup_timeout if startup_timeout is None else startup_timeout
        )
        return self

    def pause(self) -> None:
        """SIGSTOP the server: it is cut off (connections stay open and silent, new ones wait
        in the listen backlog) until `resume()`."""
        if self.pid is None:
            raise self.error(f"cannot pause: {self.label} is not running; start() or restart() it first")
        pid = self.pid
        os.kill(pid, signal.SIGSTOP)
        # SIGSTOP is asynchronous: kill() returns while the server's threads are still on
        # their way to the stop (a thread running on the other core until its interrupt),
        # and a connection made in that window was once answered. Cut off means every
        # thread stopped.
        deadline = time.monotonic() + 10
        while not all_threads_stopped(pid):
            if time.monotonic() >= deadline:
                raise self.error(f"{self.label} (pid {pid}) did not stop within 10 s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT the server after `pause()`."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def cleanup(self, graceful: bool = True) -> None:
        """Stop the server (and its helpers) and delete the temporary directory (idempotent)."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self._stop_helpers()
        with _running_lock:
            _running.discard(self)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
