"""One HTTP port for the operator: `/metrics` (Prometheus text), `/healthz` (the process
serves), `/readyz` (the relay is streaming, or is a standby ready to take over, and no
message has waited for Kafka longer than `relay.max_unacknowledged_age_s`: 200 `ready`,
else 503 `not ready` with a `reason: ...` line; a line `role: active|standby|taking over`
follows; each operator problem the relay holds, such as an XA transaction still undecided after
`xa.max_checks` check-backs, follows as one `problem: ...` line, the status unchanged: the
relay streams on and holds only that transaction). Values come from
`cdc.metrics.RelayMetrics`; nothing secret is ever part of them."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from cdc.metrics import RelayMetrics


class _RelayCollector:
    def __init__(self, metrics: RelayMetrics, source: str):
        self._m = metrics
        self._source = source

    def collect(self):
        m, now, src = self._m, time.time(), self._source

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["source"])
            c.add_metric([src], value)
            return c

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["source"])
            g.add_metric([src], value)
            return g

        yield counter("cdc_events_published", "Events acknowledged by Kafka", m.events_published)
        yield counter("cdc_published_bytes", "Value bytes acknowledged by Kafka", m.bytes_published)
        yield counter(
            "cdc_events_republished_unlocated",
            "Events Kafka acknowledged without an offset that their partition did not hold: published again",
            m.republished_unlocated,
        )
        yield counter(
            "cdc_events_skipped_recovery",
            "Events found delivered before a restart, not re-sent",
            m.events_skipped_recovery,
        )
        dl = CounterMetricFamily(
            "cdc_events_dead_lettered", "Events sent to the dead-letter topic", labels=["source", "cause"]
        )
        for cause, count in sorted(m.dead_lettered.items()):
            dl.add_metric([src, cause], count)
        yield dl
        errors = CounterMetricFamily(
            "cdc_delivery_errors",
            "Messages Kafka refused after retries, by librdkafka error",
            labels=["source", "cause"],
        )
        for cause, count in sorted(m.delivery_error_causes.items()):
            errors.add_metric([src, cause], count)
        if not m.delivery_error_causes:
            errors.add_metric([src, "none"], 0)
        yield errors
        yield gauge(
            "cdc_unacknowledged_age_seconds",
            "Seconds the oldest message handed to Kafka has waited for its acknowledgement (0: none waits)",
            m.unacknowledged_age(now),
        )
        yield gauge(
            "cdc_kafka_reachable", "0 while no broker answers (the relay's own account)", 1 if m.kafka_reachable else 0
        )
        if m.kafka_brokers_up is not None:  # absent until librdkafka's first statistics
            yield gauge("cdc_kafka_brokers_up", "Brokers the producer is connected to", m.kafka_brokers_up)
        yield counter("cdc_kafka_outages", "Times every broker became unreachable", m.kafka_outages)
        yield counter("cdc_transactions", "Committed transactions read", m.transactions)
        yield counter("cdc_reconnects", "Binlog reconnections", m.reconnects)
        yield counter(
            "cdc_outbox_changes_ignored",
            "UPDATE/DELETE on an outbox table let through (outbox.on_change ignore or warn)",
            m.outbox_changes_ignored,
        )
        yield counter(
            "cdc_rows_discarded",
            "Outbox rows of transactions rolled back (ROLLBACK, ROLLBACK TO SAVEPOINT, "
            "XA ROLLBACK) or cut by a stream that ended mid-transaction",
            m.rows_discarded,
        )
        latency = HistogramMetricFamily(
            "cdc_commit_to_acknowledgement_seconds",
            "Per transaction with messages: from its commit (the binlog's "
            "time, whole seconds: up to 1 s early) to Kafka's acknowledgement of its last message",
            labels=["source"],
        )
        h = m.commit_to_ack
        latency.add_metric([src], h.cumulative(), h.total)
        yield latency
        yield gauge("cdc_lag_seconds", "Seconds behind the newest commit read", m.lag_seconds(now))
        yield gauge(
            "cdc_checkpoint_age_seconds",
            "Seconds the checkpoint has lagged what was read (0 while it covers everything: an idle, up-to-date relay)",
            m.checkpoint_age(now),
        )
        if m.server_end_bytes_behind is not None:  # absent until the server was asked
            yield gauge(
                "cdc_binlog_behind_bytes",
                "Binlog bytes between the relay and the server's end",
                m.server_end_bytes_behind,
            )
        yield gauge(
            "cdc_ready",
            "1 while the relay is streaming (or a standby ready to take over) and no message "
            "waits for Kafka longer than relay.max_unacknowledged_age_s",
            1 if m.readiness(now)[0] else 0,
        )
        yield gauge(
            "cdc_lease_held",
            "1 while this relay holds its source's lease (the one that publishes)",
            1 if m.lease_held else 0,
        )
        yield gauge("cdc_lease_epoch", "The lease epoch this relay publishes under (0: none yet)", m.lease_epoch)
        lease_age = m.lease_confirmed_age(now)
        if lease_age is not None and m.lease_held:  # absent while not held
            yield gauge("cdc_lease_confirmed_age_seconds", "Seconds since the lease was last confirmed", lease_age)
        yield gauge(
            "cdc_xa_undecided",
            "XA transactions prepared whose outcome is not read (held, never published)",
            m.xa_undecided,
        )
        yield gauge(
            "cdc_xa_oldest_undecided_age_seconds",
            "Seconds since the oldest undecided XA transaction's prepare",
            m.xa_oldest_undecided_age_s,
        )
        yield gauge(
            "cdc_xa_undecided_problems",
            "Undecided XA transactions past xa.max_checks: an operator must XA COMMIT or XA ROLLBACK them",
            len(m.xa_problems),
        )


def metrics_registry(metrics: RelayMetrics, source: str) -> CollectorRegistry:
    """What `/metrics` serves: the relay's series (each labelled `source`) and the
    process's own (CPU seconds, resident memory, open files: prometheus_client's
    `process_*`, on Linux)."""
    registry = CollectorRegistry()
    registry.register(_RelayCollector(metrics, source))
    ProcessCollector(registry=registry)
    return registry


LOG = logging.getLogger("cdc.http")


class OperatorHTTPServer(ThreadingHTTPServer):
    """An operator endpoint's server: a client that goes away mid-response (a scrape that
    timed out, a probe that hung up) is not an error; any other failure of a request is one
    log line, never a traceback on stderr."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        host = client_address[0] if isinstance(client_address, tuple) else client_address
        LOG.warning("http: a request from %s failed: %s: %s", host, type(exc).__name__, exc)


class HttpEndpoint:
    def __init__(
        self,
        metrics: RelayMetrics,
        source: str,
        host: str = "127.0.0.1",
        port: int = 0,
        healthy: Callable[[], bool] = lambda: True,
    ):
        self.url = ""  # set once it listens
        registry = metrics_registry(metrics, source)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body, status, ctype = generate_latest(registry), 200, "text/plain; version=0.0.4"
                elif self.path == "/healthz":
                    ok = healthy()
                    body, status, ctype = (b"ok\n" if ok else b"unhealthy\n"), (200 if ok else 503), "text/plain"
                elif self.path == "/readyz":
                    ok, reasons = metrics.readiness(time.time())
                    text = (
                        ("ready\n" if ok else "not ready\n")
                        + "".join(f"reason: {r}\n" for r in reasons)
                        + f"role: {metrics.role}\n"
                        + "".join(f"problem: {p}\n" for p in metrics.xa_problems)
                    )
                    body, status, ctype = text.encode(), (200 if ok else 503), "text/plain"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:  # requests are not logged
                return

        self._server = OperatorHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()
        self.url = f"http://{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
