"""Wiring: a `Config` becomes a relay with real adapters, and runs.

    MySQLBinlogSourceFactory -> Relay -> the sink's publisher (cdc_cli/sinks.py: Kafka by default)
                                  |-> ConfluentAvroSerializer (schema registry)
                                  |-> File/KafkaCheckpointStore
                                  '-> KafkaTopicReader (recovery)

With `lease.enabled` (the default) `run_relay` first takes the source's lease
(connectors/mysql/lease.py): a standby until it is free, then the takeover wait
(cdc/lease.py), then the replica server id, then the relay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from cdc.config import Config
from cdc.errors import CdcError, PreflightError, SourceError
from cdc.lease import lock_name, takeover_wait
from cdc.metrics import RelayMetrics
from cdc.ports import StartAt
from cdc.relay import Relay, RunSummary, start_point
from cdc.replica_session import source_mark
from cdc_cli.sinks import SinkAdapters, checkpoint_store, sink_adapters
from connectors.http_endpoint import HttpEndpoint
from connectors.mysql.binlog_source import MySQLBinlogSourceFactory
from connectors.mysql.client import MySQLTlsError, connect
from connectors.mysql.errors import error_text
from connectors.mysql.lease import MySQLLease
from connectors.mysql.preflight import failures, run_checks, warnings
from connectors.mysql.reader_process import ReaderProcessFeeds, ReaderSpec
from connectors.mysql.replica_sessions import set_source, settle

log = logging.getLogger(__name__)


def start_position(cfg: Config, store) -> StartAt | str | None:
    """Where `cdc run` would start (the relay's own rule, asked of the server it is
    configured for), for the preflight's start-position check."""
    sources = MySQLBinlogSourceFactory(cfg.source.connection(), cfg.source.replica_server_id, set())
    try:
        server_id = sources.server_id()
    except CdcError:
        return None  # preflight reports the connection problem itself
    return start_point(store.load(), server_id, cfg.relay_settings())


def preflight(cfg: Config, store=None, replica_id: bool = True) -> list:
    store = store or checkpoint_store(cfg)
    results = run_checks(cfg, start_position(cfg, store), replica_id=replica_id)
    problems = failures(results)
    unreachable = [r.message for r in results if r.name == "connect" and not r.ok and "cannot connect" in r.message]
    if unreachable:
        # The database may still be starting (start order in compose or Kubernetes): a
        # restart cures that, so exit 1, not 2. Wrong credentials stay a person's fix.
        raise SourceError(unreachable[0])
    if problems:
        raise PreflightError(problems)
    for warning in warnings(results):
        log.warning("preflight: %s", warning)
    for r in results:
        if r.name == "replica_server_id":  # says whether a previous session was ended or waited out
            log.info("preflight: %s", r.message)
    return results


@dataclass
class RelayHandle:
    relay: Relay
    adapters: SinkAdapters  # the sink's publisher, reader, store, its description and queued_for_s
    feeds: ReaderProcessFeeds | None = None

    @property
    def metrics(self) -> RelayMetrics:
        return self.relay.metrics

    @property
    def publisher(self) -> Any:
        return self.adapters.publisher

    @property
    def reader(self) -> Any:
        return self.adapters.reader

    @property
    def store(self) -> Any:
        return self.adapters.store

    def close(self) -> None:
        self.reader.close()
        if self.feeds is not None:
            self.feeds.close()
        # a publisher holding what the next relay waits for (the RabbitMQ exchange sink's
        # fence) lets it go now, not at the process's exit: a relay run again in the same
        # process (tests, embedding) would wait for it. The others keep theirs to the exit.
        release = getattr(self.publisher, "release", None)
        if release is not None:
            release()


class _LazySerializer:
    """The Avro serializer, built on first use: with `source.reader = "process"` the reader
    process encodes, and the relay's process never loads the registry client."""

    def __init__(self, cfg: Config):
        self._cfg = cfg
        self._serializer: Any = None  # a ConfluentAvroSerializer once built (imported lazily)

    def encode(self, event: Any, topic: str) -> bytes:
        if self._serializer is None:
            from connectors.schema_registry.avro_serializer import (
                ConfluentAvroSerializer,
                registry_client,
            )

            self._serializer = ConfluentAvroSerializer(registry_client(self._cfg.schema_registry))
        return self._serializer.encode(event, topic)


def build_relay(
    cfg: Config,
    metrics: RelayMetrics | None = None,
    feeds: ReaderProcessFeeds | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> RelayHandle:
    """The relay with its adapters. `feeds`: a reader process started earlier (see
    cdc_cli/main.py), configured here; with `source.reader = "process"` and none given,
    one is started here."""
    metrics = metrics or RelayMetrics()
    metrics.max_unacknowledged_age_s = cfg.relay.max_unacknowledged_age_s
    sink = sink_adapters(cfg, metrics, should_stop)
    publisher, reader = sink.publisher, sink.reader
    serializer = _LazySerializer(cfg)
    sources = MySQLBinlogSourceFactory(
        cfg.source.connection(),
        cfg.source.replica_server_id,
        {(t.schema, t.table) for t in cfg.tables},
        heartbeat_s=cfg.source.heartbeat_s,
        decoder=cfg.source.decoder,
    )
    settings = cfg.relay_settings()
    limit = min(settings.max_message_bytes, publisher.max_message_bytes)
    if limit != settings.max_message_bytes:
        from dataclasses import replace

        settings = replace(settings, max_message_bytes=limit)
    if cfg.source.reader != "process":
        feeds = None
    else:
        feeds = feeds or ReaderProcessFeeds()
        feeds.configure(ReaderSpec(
            cfg.source.connection(), cfg.source.replica_server_id, cfg.source.heartbeat_s, cfg.source.decoder,
            cfg.schema_registry, settings,
        ))  # fmt: skip
    set_source(cfg.source.name)  # the tags of this process's binlog sessions name the source
    store = sink.store
    relay = Relay(
        settings, sources, publisher, serializer, store, reader, metrics,
        feeds=feeds, topics=sink.topics, delivery_mode=sink.delivery_mode,
    )  # fmt: skip
    return RelayHandle(relay, sink, feeds)


class _BinlogBehindPoller:
    """Every few seconds: how many binlog bytes lie between the relay and the server's end."""

    def __init__(self, cfg: Config, metrics: RelayMetrics, every_s: float = 5.0):
        self._cfg, self._m, self._every = cfg, metrics, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="binlog-behind", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        src = self._cfg.source
        while not self._stop.wait(self._every):
            try:
                conn = connect(src.connection(), connect_timeout=3)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SHOW BINARY LOGS")
                        logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
                finally:
                    conn.close()
            except (pymysql.err.MySQLError, MySQLTlsError):
                continue
            m = self._m
            if not m.read_file:
                continue
            behind, counting = 0, False
            for name, size in logs:
                if name == m.read_file:
                    counting = True
                    behind += max(0, size - m.read_pos)
                elif counting:
                    behind += size
            m.server_end_bytes_behind = behind

    def close(self) -> None:
        self._stop.set()


def take_lease(cfg: Config, handle: RelayHandle, should_stop: Callable[[], bool]) -> MySQLLease | None:
    """Wait as a standby until this relay holds its source's lease, then wait out what a
    previous holder could still publish, then settle the replica server id (ending a
    stale session of this source's). None when `should_stop()` came first."""
    m = handle.metrics
    lease = MySQLLease(
        cfg.source.connection(),
        lock_name(cfg.source.name),
        cfg.lease,
        on_confirm=lambda at: setattr(m, "lease_confirmed_at", at),
    )
    try:
        m.role, m.ready = "standby", True  # configured and checked: ready to take over

        def waiting(holder: int | None) -> None:
            log.info(
                "standby: the lease %r is held by connection %s; taking over when it is free",
                lease.name,
                holder if holder is not None else "(unknown)",
            )

        if not lease.acquire(should_stop, waiting):
            lease.close()
            return None
        before = handle.store.load()
        epoch_before = before.epoch if before is not None else 0

        def newest_is_ours() -> bool:
            newest = handle.store.load()
            return newest is None or newest.epoch <= (handle.relay.epoch or epoch_before)

        clock = lease.hold(newest_is_ours)
        m.role, m.ready, m.lease_held = "taking over", False, True
        wait, why = takeover_wait(lease.previous(before), cfg.lease, handle.adapters.queued_for_s)
        log.info("holding the lease %r (connection %d): %s", lease.name, lease.conn_id, why)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not should_stop():
            clock.check(time.monotonic())
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        if should_stop():
            lease.close()
            return None
        src = cfg.source
        try:
            conn = connect(src.connection(), connect_timeout=5)
        except pymysql.err.MySQLError as exc:
            raise SourceError(
                f"cannot connect to {src.host}:{src.port} to settle the replica server id: {error_text(exc)}"
            ) from exc
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
                ok, message = settle(
                    cur, src.replica_server_id, src.user, mariadb, src.heartbeat_s, lease_held=source_mark(src.name)
                )
        finally:
            conn.close()
        if not ok:
            raise PreflightError([message])
        log.info("preflight: %s", message)
        m.role = "active"
        return lease
    except BaseException:
        lease.close()
        raise


def _log_start(cfg: Config, handle: RelayHandle, endpoint: HttpEndpoint | None) -> None:
    """The one line that says what this relay streams, where to, and how it is watched."""
    src, store = cfg.source, cfg.checkpoint
    log.info(
        "relay for source %r: MySQL %s:%d as replica %d, %s, checkpoint %s, lease %s, metrics and health %s",
        src.name,
        src.host,
        src.port,
        src.replica_server_id,
        handle.adapters.describe,
        store.path if store.store == "file" else f"topic {store.topic}",
        f"on (ttl {cfg.lease.ttl_s:g} s)" if cfg.lease.enabled else "off (lease.enabled = false)",
        f"on {endpoint.url}" if endpoint is not None else "off (http.port = 0)",
    )


def run_relay(
    cfg: Config,
    should_stop: Callable[[], bool],
    metrics: RelayMetrics | None = None,
    check: bool = True,
    feeds: ReaderProcessFeeds | None = None,
) -> RunSummary:
    """Preflight, take the lease (a standby until then), then run until `should_stop()`;
    the HTTP endpoint lives as long."""
    try:
        handle = build_relay(cfg, metrics, feeds, should_stop)
    except BaseException:
        if feeds is not None:
            feeds.close()
        raise
    if check:
        try:
            preflight(cfg, replica_id=not cfg.lease.enabled)
        except BaseException:
            handle.close()
            raise
    endpoint = None
    failed = threading.Event()
    if cfg.http.port:
        endpoint = HttpEndpoint(
            handle.metrics, cfg.source.name, cfg.http.host, cfg.http.port, healthy=lambda: not failed.is_set()
        )
    poller = _BinlogBehindPoller(cfg, handle.metrics)
    lease = None
    try:
        if cfg.lease.enabled:
            lease = take_lease(cfg, handle, should_stop)
            if lease is None:
                return RunSummary(None, 0, 0, 0, "request")
        _log_start(cfg, handle, endpoint)
        if lease is not None:
            return handle.relay.run(should_stop, lease.lease, lease.holder_tag)
        return handle.relay.run(should_stop)
    except BaseException:
        failed.set()
        raise
    finally:
        if lease is not None:
            lease.close()  # after the last checkpoint: a successor reads it
        poller.close()
        if endpoint is not None:
            endpoint.close()
        handle.close()
