"""A throwaway 3-node RabbitMQ 3.10 cluster on this machine (`RabbitCluster.start()`), for
the RabbitMQ Streams sink's cluster tests: three nodes of `testbed/rabbitmq.py`, each with
its own node name, AMQP, stream and distribution ports and its own directory (data, logs),
joined into one cluster.

What they share (https://www.rabbitmq.com/clustering.html): one Erlang cookie (a
`.erlang.cookie` in one `HOME`, the CLI's too) and one epmd. Erlang distribution finds a
peer through the epmd on the port `ERL_EPMD_PORT` names, the same port a node registers
with: one epmd per node (as a single node has) would hide the nodes from each other. The
epmd is ours, on its own port, so a cluster never meets another one or the host's.

How they join: the first node starts alone; the others start at the same time (their VMs
boot in parallel) and each then does what `rabbitmqctl stop_app; join_cluster <first>;
start_app` does. A port taken between being picked and being bound (`eaddrinuse`, see
testbed/rabbitmq.py) makes that node start again on new ports before it joins.

Every node advertises 127.0.0.1 and its own stream port (`stream.advertised_host/port`),
so the stream protocol's Metadata answer names each node by its port here. With `tls`, each
node also serves TLS on ports of its own (`stream.advertised_tls_port`: a TLS connection's
Metadata answer names the nodes' TLS ports).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from testbed.lab_server import PORT_TAKEN_TRIES, ServerTls, new_root
from testbed.process import HOST, free_port
from testbed.rabbitmq import EmbeddedRabbitMQ, RabbitMQServerError, _chown_tree, _run_as, find_epmd, find_server

__all__ = ["ClusterNode", "RabbitCluster"]

log = logging.getLogger("testbed.rabbitmq")
_ROOT_PREFIX = "cdc-rabbitcluster-"


async def _connect(node: EmbeddedRabbitMQ) -> Any:
    """An rstream client of `node`'s stream port (the relay's own connect: the same settings)."""
    from connectors.rabbitmq.stream_reader import StreamSettings, connect

    return await connect(StreamSettings(HOST, node.stream_port, "/", node.user, node.password), "cdc-testbed")


class ClusterNode(EmbeddedRabbitMQ):
    """One node of a `RabbitCluster`: the cluster's HOME (cookie) and epmd, its own rest."""

    label = "a RabbitMQ cluster node"

    def __init__(self, cluster: RabbitCluster, index: int, root: Path, startup_timeout: float) -> None:
        super().__init__(root, cluster._server, cluster._epmd, startup_timeout)
        self.index = index
        self.nodename = f"rabbit{index}-{cluster.tag}@localhost"
        self._cluster = cluster
        self.epmd_port = cluster.epmd_port
        self._epmd_proc = cluster._epmd_proc  # running: `_spawn` starts none

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["HOME"] = str(self._cluster.home)  # the shared .erlang.cookie
        return env

    async def _probe(self) -> None:
        """The stream plugin answers a login and a request, and no stream is declared: the
        first declaration starts the stream coordinator (a Ra cluster) on the nodes running
        then, and 3.10 does not add a node that joins later (measured: with each node's
        own start-up declaring a probe stream, the coordinator lived on the first node only,
        and killing that node left every stream without a leader, StreamNotAvailable for
        80 s and more). So nothing is declared until all nodes have joined."""
        client = await _connect(self)
        try:
            await client.stream_exists("cdc-probe")
        finally:
            await client.close()

    def _stop_helpers(self) -> None:
        """The epmd is the cluster's: it stops with the cluster, not with a node."""

    def __repr__(self) -> str:
        return f"ClusterNode({self.nodename!r}, stream_port={self.stream_port}, pid={self.pid})"


class RabbitCluster:
    """Three RabbitMQ 3.10 nodes in one cluster, on 127.0.0.1. Start it from a long-lived
    thread (PR_SET_PDEATHSIG, as testbed/rabbitmq.py)::

        with RabbitCluster.start() as cluster:
            cluster.create_stream("events")  # x-initial-cluster-size 3
            cluster.stream_leader("events").kill()
    """

    user = EmbeddedRabbitMQ.user
    password = EmbeddedRabbitMQ.password
    host = HOST

    def __init__(self, size: int, startup_timeout: float, tls: ServerTls | None = None) -> None:
        self._server, self._epmd = find_server(), find_epmd()
        self.tls = tls  # each node serves the stream protocol and AMQP over TLS too (its own ports)
        self.root = new_root(_ROOT_PREFIX)
        self.tag = secrets.token_hex(4)
        self.size = size
        self.startup_timeout = startup_timeout
        self.home = self.root / "home"
        self.epmd_port = free_port()
        self._ids = _run_as()
        self.nodes: list[ClusterNode] = []
        self.timings: dict[str, float] = {}
        """Seconds: `first` (the first node up), `others` (the others up, alone), `join` (all
        joined and a 3-member stream declared), `start` (all of it)."""

    # ------------------------------------------------------------------ start

    @classmethod
    def start(cls, size: int = 3, startup_timeout: float = 180.0, tls: ServerTls | None = None) -> RabbitCluster:
        cluster = cls(size, startup_timeout, tls)
        try:
            cluster._start()
        except BaseException:
            cluster.cleanup(graceful=False)
            raise
        return cluster

    def _start(self) -> None:
        t0 = time.monotonic()
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)  # Erlang refuses a cookie others can read
        _chown_tree(self.root, self._ids)  # the nodes' user reads the cookie
        probe = EmbeddedRabbitMQ(self.root, self._server, self._epmd, self.startup_timeout)
        probe.epmd_port = self.epmd_port
        self._epmd_proc = probe._popen(
            [self._epmd, "-port", str(self.epmd_port), "-address", HOST], self.root / "epmd.log"
        )
        self.nodes = [self._new_node(i) for i in range(1, self.size + 1)]
        self._start_nodes(self.nodes[:1])
        self.timings["first"] = time.monotonic() - t0
        t1 = time.monotonic()
        self._start_nodes(self.nodes[1:])
        self.timings["others"] = time.monotonic() - t1
        t2 = time.monotonic()
        first = self.nodes[0].nodename
        for node in self.nodes[1:]:
            # what `rabbitmqctl stop_app; join_cluster FIRST; start_app` call
            # (rabbitmq-cli's StopAppCommand, JoinClusterCommand, StartAppCommand), in one
            # CLI run: each run of the CLI boots an Erlang VM of its own (~2 s here)
            said = node.ctl_eval(
                f"ok = rabbit:stop(), ok = rabbit_mnesia:join_cluster('{first}', disc), rabbit:start()."
            )
            if said != "ok":
                raise RabbitMQServerError(f"{node.nodename} did not join {first}: {said}")
        self._wait_members(time.monotonic() + self.startup_timeout)
        coordinators = self.nodes[0].ctl_eval("ra:members({rabbit_stream_coordinator, node()}).")
        if any(n.nodename not in coordinators for n in self.nodes):
            raise RabbitMQServerError(f"the stream coordinator does not run on every node: {coordinators}")
        self.timings["join"] = time.monotonic() - t2
        self.timings["start"] = time.monotonic() - t0
        log.info("RabbitMQ cluster of %d started: %s", self.size, {k: round(v, 1) for k, v in self.timings.items()})

    def _new_node(self, index: int) -> ClusterNode:
        node = ClusterNode(self, index, new_root(f"{_ROOT_PREFIX}{index}-"), self.startup_timeout)
        node._use_tls(self.tls)
        node._write_files()
        return node

    def _start_nodes(self, nodes: list[ClusterNode]) -> None:
        """Spawn `nodes` at once, then wait for each; one whose port was taken starts again on
        new ports (its name kept: it has not joined yet)."""
        for attempt in range(1, PORT_TAKEN_TRIES + 1):
            t0 = time.monotonic()
            spawned = [(node, node._spawn()) for node in nodes]
            retry: list[ClusterNode] = []
            for node, offset in spawned:
                try:
                    node.timings["start"] = node._wait(t0, offset, self.startup_timeout)
                except RabbitMQServerError as exc:
                    taken = node._port_taken()
                    node.kill()
                    if not taken or attempt == PORT_TAKEN_TRIES:
                        raise
                    log.warning("RabbitMQ cluster node %d: a port was taken (%s); new ports", node.index, exc)
                    retry.append(node)
            if not retry:
                return
            for node in retry:
                fresh = self._new_node(node.index)
                node.cleanup(graceful=False)
                self.nodes[node.index - 1] = fresh
            nodes = [self.nodes[node.index - 1] for node in retry]

    def _wait_members(self, deadline: float) -> None:
        """Until a stream of `size` members can be declared: every node is in the cluster and
        in the stream coordinator (a stream declared earlier gets fewer members)."""
        last = ""
        while time.monotonic() < deadline:
            try:
                asyncio.run(asyncio.wait_for(self._probe(), 30))
                return
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
        raise RabbitMQServerError(f"the RabbitMQ cluster did not form within {self.startup_timeout:.0f}s: {last}")

    async def _probe(self) -> None:
        name = f"cdc-probe-{secrets.token_hex(4)}"
        client = await _connect(self.nodes[0])
        try:
            await client.create_stream(name, {"x-initial-cluster-size": self.size})
            try:
                _leader, replicas = await client.query_leader_and_replicas(name)
                if len(replicas) != self.size - 1:
                    raise RabbitMQServerError(f"{name} has {len(replicas)} replicas")
            finally:
                await client.delete_stream(name)
        finally:
            await client.close()

    # ------------------------------------------------------------- streams

    def running_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.running]

    def stream_settings(self) -> dict[str, Any]:
        """rstream keyword arguments for a running node."""
        return self.running_nodes()[0].stream_settings()

    def node_on_port(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.stream_port == port:
                return node
        raise RabbitMQServerError(f"no node of the cluster has stream port {port}")

    def _call(self, fn: Any, node: ClusterNode | None = None) -> Any:
        async def go() -> Any:
            client = await _connect(node or self.running_nodes()[0])
            try:
                return await fn(client)
            finally:
                await client.close()

        return asyncio.run(asyncio.wait_for(go(), 30))

    def create_stream(self, name: str, size: int | None = None, leader: ClusterNode | None = None) -> None:
        """A stream replicated on `size` (all) nodes (`x-initial-cluster-size`); `leader`: its
        first leader, declared through that node with `x-queue-leader-locator: client-local`
        (https://www.rabbitmq.com/streams.html#leader-election)."""
        arguments: dict[str, Any] = {"x-initial-cluster-size": size or self.size}
        if leader is not None:
            arguments["x-queue-leader-locator"] = "client-local"
        self._call(lambda c: c.create_stream(name, arguments), leader)

    def leader_and_replicas(self, stream: str) -> tuple[ClusterNode, list[ClusterNode]]:
        """The stream protocol's Metadata answer (asked of a running node), as nodes."""
        leader, replicas = self._call(lambda c: c.query_leader_and_replicas(stream))
        return self.node_on_port(leader.port), [self.node_on_port(r.port) for r in replicas]

    def stream_leader(self, stream: str) -> ClusterNode:
        return self.leader_and_replicas(stream)[0]

    # ------------------------------------------------------------- life

    def cleanup(self, graceful: bool = True) -> None:
        for node in self.nodes:
            try:
                node.cleanup(graceful=graceful)
            except Exception as exc:
                log.warning("cleanup of %s: %s", node.nodename, exc)
        epmd = getattr(self, "_epmd_proc", None)
        if epmd is not None and epmd.poll() is None:
            epmd.kill()
            epmd.wait(timeout=10)
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RabbitCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"RabbitCluster({', '.join(repr(n) for n in self.nodes)})"


if __name__ == "__main__":  # a cluster for a manual run: prints its nodes' stream ports and the start-up
    import signal

    logging.basicConfig(level=logging.INFO)
    with RabbitCluster.start() as started:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        print(" ".join(f"{n.nodename}={HOST}:{n.stream_port}" for n in started.nodes), started.timings, flush=True)
        if os.environ.get("CDC_RABBITCLUSTER_EXIT"):
            raise SystemExit(0)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
