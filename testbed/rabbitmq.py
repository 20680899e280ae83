"""A throwaway RabbitMQ 3.10 node with the stream plugin, for the RabbitMQ Streams sink's
tests (`EmbeddedRabbitMQ.start()`), as `testbed/mariadb.py` does for mariadbd.

What the node gets, all inside one temporary directory (`$TMPDIR/cdc-rabbitmq-*`):

* its own `RABBITMQ_NODENAME` (`cdc-<hex>@localhost`), `RABBITMQ_MNESIA_BASE` (the
  message store and the streams' segment files, kept by `restart()`), `RABBITMQ_LOG_BASE`,
  `RABBITMQ_CONFIG_FILE`, `RABBITMQ_ENABLED_PLUGINS_FILE` (`[rabbitmq_stream].`) and `HOME`
  (the Erlang cookie); `RABBITMQ_CONF_ENV_FILE` and `RABBITMQ_ADVANCED_CONFIG_FILE` point into
  it too, so nothing of the host's `/etc/rabbitmq` is read;
* free ports on 127.0.0.1 only: AMQP 0-9-1 (`listeners.tcp.1`), the stream protocol
  (`stream.listeners.tcp.1`, advertised as 127.0.0.1 so that clients that follow the
  stream's leader come back to this address), Erlang distribution (`RABBITMQ_DIST_PORT`,
  `distribution.listener.interface`) and epmd (`ERL_EPMD_PORT`): two nodes, or a node
  and the host's own RabbitMQ, never meet. A port is picked free and bound by the node
  seconds later, so another process can take it in between (two nodes started at once):
  the node then stops with `eaddrinuse`, and `start()` starts it again on new ports (3
  tries, each logged);
* a user and password for the tests (`default_user` / `default_pass`, `loopback_users =
  none`).

How it runs. Debian's `/usr/sbin/rabbitmq-server` re-runs itself through `su rabbitmq`, and
the script behind it (`/usr/lib/rabbitmq/bin/rabbitmq-server`) keeps a shell between us and
the Erlang VM unless `RUNNING_UNDER_SYSTEMD` is set (see the end of that script): a
parent-death signal (PR_SET_PDEATHSIG) set on either would not reach the VM. So the script
behind the wrapper is started directly, as user `rabbitmq` (when we are root: the node's
files must belong to it, as the package's own service runs it) with `RUNNING_UNDER_SYSTEMD`
set, which makes it `exec erl`: the VM (`beam.smp`) is our child, dies with us, takes SIGTERM
as a clean stop (rabbit_prelaunch_sighandler) and SIGSTOP/SIGCONT for `pause()`/`resume()`.
epmd is started by us too, on its own port, before the node (the node uses a running epmd
and starts none), so it also dies with us.

TLS (`start(tls=ServerTls(...))`): the stream plugin's TLS listener too
(`stream.listeners.ssl.1` on `stream_tls_port`, advertised as `stream.advertised_tls_port`)
and an AMQP 0-9-1 TLS listener (`listeners.ssl.default` on `amqp_tls_port`), both with the
node's `ssl_options.*` (the certificate files copied into the node's directory,
readable by its user; `verify_peer` and `fail_if_no_peer_cert` when a client certificate is
wanted): https://www.rabbitmq.com/ssl.html and https://www.rabbitmq.com/stream.html#tls.

Start-up takes about 5 s on an idle machine (the Erlang VM boots RabbitMQ's ~100
applications); `start()` waits until the stream port accepts and a client can declare and
delete a stream, with a deadline. `timings` holds the seconds taken.

Binaries: `$CDC_RABBITMQ_SERVER`, else Debian's `/usr/lib/rabbitmq/bin/rabbitmq-server`,
else `rabbitmq-server` on PATH (a generic-unix tarball's `sbin/`); `epmd` on PATH or in
`/usr/lib/erlang/bin`. Missing: one line naming `apt-get install rabbitmq-server`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import socket
import subprocess
import time
import uuid
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

__all__ = ["EmbeddedRabbitMQ", "RabbitMQServerError"]

log = logging.getLogger("testbed.rabbitmq")

_ENV_SERVER = "CDC_RABBITMQ_SERVER"
_SERVER_PATHS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
_EPMD_DIRS = ("/usr/lib/erlang/bin", "/usr/local/lib/erlang/bin")
_INSTALL_HINT = "install it with 'apt-get install rabbitmq-server' (Debian/Ubuntu; ./run.sh setup does)"
_ROOT_PREFIX = "cdc-rabbitmq-"
_RUN_AS = "rabbitmq"
_POLL = 0.1


class RabbitMQServerError(ServerError):
    """The embedded RabbitMQ node could not be found, started or stopped (one line, with the fix)."""


def find_server() -> str:
    """The `rabbitmq-server` script that execs the Erlang VM (not Debian's `su` wrapper)."""
    override = binary_override(_ENV_SERVER, "rabbitmq-server", _INSTALL_HINT, RabbitMQServerError)
    if override:
        return override
    for path in _SERVER_PATHS:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("rabbitmq-server")
    if found and not found.startswith("/usr/sbin/"):  # /usr/sbin's is Debian's su wrapper
        return found
    raise RabbitMQServerError(f"rabbitmq-server not found: {_INSTALL_HINT}")


def find_epmd() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    for directory in _EPMD_DIRS:
        path = os.path.join(directory, "epmd")
        if os.access(path, os.X_OK):
            return path
    raise RabbitMQServerError(f"epmd (Erlang) not found: {_INSTALL_HINT}")


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the node as: user `rabbitmq` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_RUN_AS)
    except KeyError:
        raise RabbitMQServerError(
            f"user {_RUN_AS!r} does not exist: the rabbitmq-server package creates it; {_INSTALL_HINT}"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _chown_tree(root: Path, ids: tuple[int, int] | None) -> None:
    if ids is None:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, *ids)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), *ids, follow_symlinks=False)


class EmbeddedRabbitMQ(LabServer):
    """A throwaway RabbitMQ node on 127.0.0.1 with the stream plugin. Use `start()`, from a
    long-lived thread (PR_SET_PDEATHSIG fires when the starting *thread* exits)::

        with EmbeddedRabbitMQ.start() as rabbit:
            producer = rstream.Producer(**rabbit.stream_settings())
    """

    label = "the RabbitMQ node"
    error = RabbitMQServerError

    def __init__(self, root: Path, server: str, epmd: str, startup_timeout: float) -> None:
        super().__init__(root, startup_timeout)
        self._server = server
        self._epmd = epmd
        self.nodename = f"cdc-{uuid.uuid4().hex[:10]}@localhost"
        self.amqp_port = free_port()
        self.stream_port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self._ids = _run_as()
        self._epmd_proc: subprocess.Popen[bytes] | None = None
        self.tls: ServerTls | None = None
        self.stream_tls_port = 0  # with `tls`: the stream plugin's TLS listener
        self.amqp_tls_port = 0  # with `tls`: AMQP 0-9-1 over TLS (`listeners.ssl.default`)

    # ------------------------------------------------------------------ start

    @classmethod
    def start(cls, startup_timeout: float = 120.0, tls: ServerTls | None = None) -> EmbeddedRabbitMQ:
        """Write the node's files into a new temporary directory, start it and wait until a
        client can declare a stream on its stream port (`startup_timeout` seconds at most)."""
        server, epmd = find_server(), find_epmd()
        try:
            import rstream  # noqa: F401  # the readiness probe speaks the stream protocol
        except ImportError:
            raise RabbitMQServerError("rstream is not installed: run ./run.sh setup (the rabbitmq extra)") from None
        for attempt in range(1, PORT_TAKEN_TRIES + 1):
            node = cls(new_root(_ROOT_PREFIX), server, epmd, startup_timeout)
            node._use_tls(tls)
            try:
                node._write_files()
                node.timings["start"] = node._spawn_and_wait(startup_timeout)
                return node
            except RabbitMQServerError as exc:
                taken = node._port_taken()
                node.cleanup(graceful=False)
                if not taken or attempt == PORT_TAKEN_TRIES:
                    raise
                # The ports are picked free, then bound by the node seconds later: another
                # process (a second node, a pytest worker) can take one in between. The node
                # says eaddrinuse; new ports, not a wait, cure it.
                log.warning(
                    "RabbitMQ start %d: a port was taken before the node bound it (%s); new ports", attempt, exc
                )
            except BaseException:
                node.cleanup(graceful=False)
                raise
        raise AssertionError("unreachable")

    def _port_taken(self) -> bool:
        """The node's logs say a listener's port was in use (`eaddrinuse`: the stream, AMQP or
        distribution listener) or epmd could not bind its own."""
        logs = [self.stdout_log, self.node_log, self.root / "epmd.log"]
        return log_mentions(logs, "eaddrinuse") or log_mentions(logs, "address already in use")

    def _write_files(self) -> None:
        for sub in ("mnesia", "log", "home"):
            (self.root / sub).mkdir()
        # rabbitmq.conf (sysctl format), RabbitMQ 3.10: https://www.rabbitmq.com/configure.html
        self.config_file.write_text(
            f"listeners.tcp.1 = {HOST}:{self.amqp_port}\n"
            f"stream.listeners.tcp.1 = {HOST}:{self.stream_port}\n"
            f"stream.advertised_host = {HOST}\n"
            f"stream.advertised_port = {self.stream_port}\n"
            f"distribution.listener.interface = {HOST}\n"
            "loopback_users = none\n"
            f"default_user = {self.user}\n"
            f"default_pass = {self.password}\n"
            "log.console = false\n"
            "log.file.level = info\n" + self._tls_config()
        )
        (self.root / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        _chown_tree(self.root, self._ids)

    def _use_tls(self, tls: ServerTls | None) -> None:
        """Serve the stream protocol over TLS too, with copies of `tls`'s files the node's
        user can read (the originals may be another user's, mode 0600)."""
        if tls is None:
            return
        (self.root / "tls").mkdir()
        copies = {}
        for field in ("cert", "key", "ca"):
            copy = self.root / "tls" / f"{field}.pem"
            shutil.copyfile(getattr(tls, field), copy)
            copy.chmod(0o600)
            copies[field] = copy
        self.tls = ServerTls(copies["cert"], copies["key"], copies["ca"], tls.verify, tls.client_cert, tls.client_key)
        self.stream_tls_port = free_port()
        self.amqp_tls_port = free_port()

    def _tls_config(self) -> str:
        tls = self.tls
        if tls is None:
            return ""
        verify = "verify_peer" if tls.verify else "verify_none"
        return (
            f"stream.listeners.ssl.1 = {HOST}:{self.stream_tls_port}\n"
            f"stream.advertised_tls_port = {self.stream_tls_port}\n"
            f"listeners.ssl.default = {HOST}:{self.amqp_tls_port}\n"
            f"ssl_options.cacertfile = {tls.ca}\n"
            f"ssl_options.certfile = {tls.cert}\n"
            f"ssl_options.keyfile = {tls.key}\n"
            f"ssl_options.verify = {verify}\n"
            f"ssl_options.fail_if_no_peer_cert = {str(tls.verify).lower()}\n"
        )

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(self.root)
        env.update(
            HOME=f"{root}/home",
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_MNESIA_BASE=f"{root}/mnesia",
            RABBITMQ_LOG_BASE=f"{root}/log",
            RABBITMQ_CONFIG_FILE=str(self.config_file),
            RABBITMQ_ADVANCED_CONFIG_FILE=f"{root}/advanced.config",  # absent: none
            RABBITMQ_CONF_ENV_FILE=f"{root}/rabbitmq-env.conf",  # absent: the host's is not read
            RABBITMQ_ENABLED_PLUGINS_FILE=f"{root}/enabled_plugins",
            RABBITMQ_PID_FILE=f"{root}/rabbitmq.pid",
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS=HOST,
            RUNNING_UNDER_SYSTEMD="true",  # the script execs erl: the VM is our child (module docstring)
        )
        env.pop("NOTIFY_SOCKET", None)
        return env

    def _popen(self, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        user: dict[str, Any] = {}
        if self._ids is not None:
            # setuid happens before preexec_fn, and it clears a parent-death signal set
            # earlier (kernel commit_creds): set it afterwards, in preexec_fn
            user = {"user": self._ids[0], "group": self._ids[1], "extra_groups": []}
        with log.open("ab") as out:
            return subprocess.Popen(
                cmd,
                env=self._env(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
                start_new_session=True,  # a terminal's Ctrl-C reaches the tests, not the node
                **user,
            )

    def _spawn_and_wait(self, timeout: float) -> float:
        t0 = time.monotonic()
        offset = self._spawn()
        return self._wait(t0, offset, timeout)

    def _spawn(self) -> int:
        """Start epmd (unless it runs) and the node; the offset its stdout log had before."""
        if self._epmd_proc is None or self._epmd_proc.poll() is not None:
            self._epmd_proc = self._popen(
                [self._epmd, "-port", str(self.epmd_port), "-address", HOST], self.root / "epmd.log"
            )
        offset = self.stdout_log.stat().st_size if self.stdout_log.exists() else 0
        self._started(self._popen([self._server], self.stdout_log))
        return offset

    def _wait(self, t0: float, offset: int, timeout: float) -> float:
        """Wait until the node spawned at `t0` takes a stream declaration: the seconds since `t0`."""
        deadline = t0 + timeout
        beam = self._proc
        assert beam is not None
        last = "the stream port does not accept connections yet"
        while True:
            code = beam.poll()
            if code is not None:
                raise RabbitMQServerError(
                    f"rabbitmq-server exited with code {code} during start-up: {self._excerpt(offset)}"
                )
            if self._stream_port_accepts():
                try:
                    asyncio.run(asyncio.wait_for(self._probe(), max(1.0, deadline - time.monotonic())))
                    return time.monotonic() - t0
                except Exception as exc:
                    last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                self.kill()
                raise RabbitMQServerError(
                    f"RabbitMQ did not take a stream declaration on {HOST}:{self.stream_port} within {timeout:.0f}s "
                    f"(last: {last}): raise startup_timeout on a busy machine; {self._excerpt(offset)}"
                )
            time.sleep(_POLL)

    def _stream_port_accepts(self) -> bool:
        try:
            with socket.create_connection((HOST, self.stream_port), timeout=1):
                return True
        except OSError:
            return False

    async def _probe(self) -> None:
        """Declare and delete a stream: the node, its stream plugin and the test user work."""
        from rstream import Producer

        name = f"cdc-probe-{uuid.uuid4().hex[:8]}"
        async with Producer(**self.stream_settings()) as producer:
            await producer.create_stream(name)
            await producer.delete_stream(name)

    def _excerpt(self, offset: int) -> str:
        return log_excerpt([(self.stdout_log, offset), (self.node_log, 0)], ("error", "Error", "ERROR"))

    # ------------------------------------------------------------- properties

    @property
    def config_file(self) -> Path:
        return self.root / "rabbitmq.conf"

    @property
    def stdout_log(self) -> Path:
        return self.root / "rabbitmq-server.log"

    @property
    def node_log(self) -> Path:
        return self.root / "log" / f"{self.nodename}.log"

    @property
    def data_dir(self) -> Path:
        """The node's Mnesia directory: its metadata and the streams' segment files."""
        return self.root / "mnesia" / self.nodename

    @property
    def epmd_pid(self) -> int | None:
        """The node's own epmd's process id while it runs."""
        epmd = self._epmd_proc
        return epmd.pid if epmd is not None and epmd.poll() is None else None

    def stream_settings(self) -> dict[str, Any]:
        """Keyword arguments for rstream's `Producer` / `Consumer` (stream protocol)."""
        return {"host": HOST, "port": self.stream_port, "username": self.user, "password": self.password}

    def stream_tls_settings(self) -> dict[str, Any]:
        """`stream_settings()` for the TLS listener (a node started with `tls`)."""
        if self.tls is None:
            raise self.error("this node serves no TLS: start it with tls=ServerTls(...)")
        return {**self.stream_settings(), "port": self.stream_tls_port, "ssl_context": self.tls.client_context()}

    def ctl_eval(self, expression: str, timeout: float = 60.0) -> str:
        """`rabbitmqctl eval <expression>` on this node (its environment, cookie and user):
        the Erlang term it prints. RabbitMQ's CLI, https://www.rabbitmq.com/rabbitmqctl.8.html"""
        return self.ctl(["eval", expression], timeout)

    def ctl(self, args: list[str], timeout: float = 60.0) -> str:
        """`rabbitmqctl -n <this node> <args>` with the node's environment, cookie and user: its output."""
        user: dict[str, Any] = {}
        if self._ids is not None:
            user = {"user": self._ids[0], "group": self._ids[1], "extra_groups": []}
        ctl = str(Path(self._server).with_name("rabbitmqctl"))
        done = subprocess.run(
            [ctl, "-n", self.nodename, *args],
            env=self._env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            **user,
        )
        if done.returncode != 0:
            raise self.error(f"rabbitmqctl {args[0]} failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}")
        return done.stdout.strip()

    def kill_stream_leader(self, stream: str, vhost: str = "/") -> None:
        """Kill the stream's leader (its osiris writer process, the queue record's pid): the
        stream coordinator starts it again, and every connection with a publisher on the
        stream gets a MetadataUpdate and loses that publisher (rabbit_stream_reader: a
        leader change), without the connection itself breaking. What a node does to a
        stream's publishers when the stream's member restarts after a failure."""
        for ch in stream + vhost:
            if ch in '"\\':
                raise ValueError(f"a stream or vhost name with {ch!r}")
        said = self.ctl_eval(
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{stream}">>)), '
            "P = amqqueue:get_pid(Q), exit(P, kill), node(P)."
        )
        if "@" not in said:
            raise self.error(f"no leader to kill for stream {stream!r}: {said}")

    def _stop_helpers(self) -> None:
        epmd = self._epmd_proc
        if epmd is not None and epmd.poll() is None:
            epmd.kill()
            epmd.wait(timeout=10)

    def __repr__(self) -> str:
        return f"EmbeddedRabbitMQ(node={self.nodename!r}, stream_port={self.stream_port}, pid={self.pid})"


if __name__ == "__main__":  # a node for a manual run or a benchmark: prints its stream address
    import signal

    with EmbeddedRabbitMQ.start() as node:  # started before blocking: the server must not inherit the mask
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # for sigwait
        print(f"{HOST}:{node.stream_port} user={node.user} node={node.nodename}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
