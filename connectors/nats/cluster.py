"""A JetStream cluster as `cdc check` sees it: for each replicated stream of the account,
whether its replicas are there. JetStream's stream info holds `cluster`: the leader's
server name and, for each other replica, `current` (caught up with the leader) and
`offline` (its server is gone) (the JetStream API's `io.nats.jetstream.api.v1.stream_info`
response, nats-server server/jetstream_cluster.go `clusterInfo`).

A stream of R replicas takes messages while a majority of them runs (its RAFT group has a
leader): fewer replicas than R is a warning (the stream still works, on fewer copies); no
leader is a failure (nothing is stored until a majority is back).

The relay reaches a cluster through every server in `sink.nats_jetstream.servers`: a new
connection tries them in turn (connectors/nats/connection.py `connect`), so a server's
death costs the publisher one reconnect, and a stream leader's death a new leader's
election while the unanswered messages are sent again under their `Nats-Msg-Id`
(connectors/nats/sink.py).
"""

from __future__ import annotations

from typing import Any

from cdc.errors import DeliveryError


def replica_results(reader: Any) -> list[Any]:
    """`cdc check` lines (`nats_replicas`) for the replicated streams `reader`
    (connectors.nats.sink.NatsStreamReader) can list: none for a single server."""
    from connectors.mysql.preflight import CheckResult

    async def every_stream(js: Any) -> list[Any]:
        return list(await js.streams_info())

    try:
        infos = reader._call("list the streams", every_stream)  # the reader's connection and deadline
    except DeliveryError as exc:
        return [CheckResult("nats_replicas", False, str(exc))]
    results = []
    replicated = 0
    for info in infos:
        problem = replica_problem(info)
        if problem is None:
            replicated += info.cluster is not None and (info.config.num_replicas or 1) > 1
            continue
        fail, text = problem
        results.append(CheckResult("nats_replicas", not fail, text, warn=not fail))
    if not results and replicated:
        results.append(CheckResult("nats_replicas", True, f"{replicated} replicated stream(s), every replica current"))
    return results


def replica_problem(info: Any) -> tuple[bool, str] | None:
    """(is it a failure, the line) for a stream whose replicas are not all there; None when
    they are (or it has one replica). `info`: nats-py's StreamInfo."""
    cluster, name = info.cluster, info.config.name
    wanted = int(info.config.num_replicas or 1)
    if cluster is None or wanted <= 1:
        return None
    if not cluster.leader:
        return True, (
            f"stream {name!r} has no leader: fewer than a majority of its {wanted} replicas run, so nothing is "
            "stored; start the stopped nats-servers of its cluster"
        )
    missing = []
    for peer in cluster.replicas or []:
        if peer.offline:
            missing.append(f"{peer.name} offline")
        elif not peer.current:
            missing.append(f"{peer.name} not current" + (f" (lag {peer.lag})" if peer.lag else ""))
    missing += ["a replica not placed"] * max(0, wanted - 1 - len(cluster.replicas or []))
    if not missing:
        return None
    return False, (
        f"stream {name!r} (leader {cluster.leader}) runs on fewer than its {wanted} replicas: {', '.join(missing)}; "
        "it takes messages while a majority runs: bring the servers back"
    )
