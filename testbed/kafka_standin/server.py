"""Embedded Kafka stand-in: librdkafka's mock cluster served from its own process.

No Apache Kafka can be installed where this project is developed and tested
(no Docker, no JVM build tools), so integration tests and the demo talk to
librdkafka's built-in mock cluster instead.  The confluent-kafka wheel ships a
``librdkafka.so`` that exports the experimental ``rd_kafka_mock_*`` C API
(``rdkafka_mock.h``); this module drives it with :mod:`ctypes`.

Why a separate process
    The mock cluster runs on librdkafka threads inside whatever process created
    it.  Keeping it out of the test process means a crash, hang or
    ``os._exit`` in the code under test cannot take the "broker" down with it
    (and vice versa), clients connect over real TCP exactly as they would to a
    real cluster, and the relay can be killed and restarted against the same,
    still-running log - which the crash tests need.

Two halves live here:

* the server, ``python -m testbed.kafka_standin --brokers N [--port P]``,
  which creates the cluster, prints ONE JSON line
  ``{"bootstrap": "127.0.0.1:x,...", "control": "127.0.0.1:y", "pid": n, ...}``
  on stdout and then serves a line-delimited JSON control channel on
  127.0.0.1 (one request object per line, one reply per line:
  ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``).  Commands:
  ``ping``, ``create_topic {topic, partitions, replication_factor=1}``,
  ``broker_down {broker_id}``, ``broker_up {broker_id}``,
  ``set_rtt {broker_id, rtt_ms}``, ``push_errors {api_key, errors}``,
  ``clear_errors {api_key}``, ``set_leader {topic, partition, broker_id}``,
  ``set_group_initial_rebalance_delay {delay_ms}``, ``shutdown``.
  The server exits when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``)
  and when its stdin reaches end-of-file, so no orphan outlives a test run;
* the client handle :class:`KafkaStandin` that tests and the demo use.

Broker ids start at 1 (``rd_kafka_mock_cluster_new`` numbers them 1..N).

Fixed ports
    The mock always binds its listeners to an ephemeral 127.0.0.1 port; the C
    API has no way to choose the listening port
    (``rd_kafka_mock_broker_set_host_port`` only changes the address advertised
    in Metadata).  With ``--port P`` the server therefore listens on P, P+1, ...
    itself, forwards each connection byte-for-byte to the matching mock broker,
    and advertises the fixed ports through ``rd_kafka_mock_broker_set_host_port``.
    ``broker_down`` closes the fixed-port listener too, so clients see a refused
    connection exactly as with the ephemeral ports.

Limits of the stand-in, measured against librdkafka 2.16.0 (the confluent-kafka
2.16.1 wheel).  Product code must never special-case them; tests that would
hit them must be written so that they also hold on real Kafka.

* No de-duplication for idempotent, non-transactional producers: the mock
  checks producer sequence numbers only when a request carries a
  transactional.id.  Measured: with a 1500 ms RTT, a broker taken down while a
  Produce request was in flight and brought back up, the one message was
  appended twice (offsets 1 and 2) and acknowledged once.  Real Kafka would
  have rejected the retry as a duplicate.  (Transactional producers are
  de-duplicated, but the delivery report of a de-duplicated retry has no
  offset - ``Message.offset()`` is None - where Kafka returns the original.)
* No aborted-transaction filtering: a read_committed consumer receives the
  records of aborted transactions.
* No last-stable-offset: a read_committed consumer receives records of a
  still-open transaction, and the high watermark is the log end.
* No zombie fencing: after a second producer ran init_transactions with the
  same transactional.id, the first one still committed its transaction.
  (Transaction markers do take an offset each, as in Kafka.)
* ``offsets_for_times`` (ListOffsets by timestamp) returns offset -1.
* AdminClient ``create_topics`` is unsupported (the mock has no CreateTopics;
  the call fails with _TIMED_OUT "Failed while waiting for controller").
  Create topics through :meth:`KafkaStandin.create_topic`
  (``rd_kafka_mock_topic_create``).  Producing to an unknown topic
  auto-creates it with 4 partitions.  Metadata reports controller id 0.
* Retention is fixed per partition at 5 MiB or 100 000 batches (``max_size``
  and ``max_cnt`` in ``rdkafka_mock.c``); older batches are dropped silently
  and the low watermark rises.  Measured: after 7000 one-record 1 KiB batches
  the watermarks were (2208, 7000).
* ``broker_down`` does not move partition leadership (as documented in
  ``rdkafka_mock.h``; use ``set_leader``), but Metadata stops listing the
  broker until ``broker_up``.
* Everything lives in memory: stopping the process loses every topic.
* Consumer groups (classic protocol) work.  The mock applies Kafka's default
  ``group.initial.rebalance.delay.ms`` of 3000 ms to a new group (measured:
  3.1 s from subscribe() to the first message; 0.1 s with the delay at 0);
  ``KafkaStandin.start(group_initial_rebalance_delay_ms=0)`` removes it.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import glob
import importlib.util
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from connectors.process import die_with_parent
from testbed.kafka_standin.common import (
    EXIT_FAILURE,
    EXIT_PORT_IN_USE,
    HOST,
    PARENT_PID_ENV,
    RD_KAFKA_PRODUCER,
    StandinError,
    port_in_use_message,
    resolve_api_key,
    resolve_error_code,
)

# ---------------------------------------------------------------------------
# Server side: ctypes binding of rdkafka_mock.h
# ---------------------------------------------------------------------------


def _find_librdkafka() -> str:
    """Locate the librdkafka shared object bundled with confluent-kafka.

    Loading the very file the confluent_kafka extension links against keeps the
    mock's protocol implementation in step with the client used by the tests.
    """
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            libs_dir = Path(location).parent / "confluent_kafka.libs"
            candidates = sorted(glob.glob(str(libs_dir / "librdkafka*.so*")))
            if candidates:
                return candidates[0]
    system = ctypes.util.find_library("rdkafka")
    if system:
        return system
    raise StandinError(
        "Kafka stand-in: librdkafka not found (expected it inside the "
        "confluent-kafka wheel's confluent_kafka.libs directory)"
    )


class _MockCluster:
    """Owns one ``rd_kafka_t`` and the ``rd_kafka_mock_cluster_t`` built on it.

    Every ``rd_kafka_mock_*`` setter used here enqueues an op to the mock
    cluster thread and waits for it (``rd_kafka_op_req``), so the methods are
    safe to call from the control server's threads concurrently.
    """

    def __init__(self, brokers: int, debug: str | None = None) -> None:
        self.brokers = brokers
        self._lib = ctypes.CDLL(_find_librdkafka())
        self._declare_prototypes()
        lib = self._lib

        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # Keep librdkafka quiet about the handle having no bootstrap.servers
        # (a NOTICE, level 5); mock failures are logged at CRIT/ERR.
        settings = {"log_level": "7" if debug else "4"}
        if debug:
            settings["debug"] = debug
        for key, value in settings.items():
            if lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, 512) != 0:
                lib.rd_kafka_conf_destroy(conf)
                raise StandinError(
                    f"Kafka stand-in: rd_kafka_conf_set({key}) failed: {errstr.value.decode(errors='replace')}"
                )
        # rd_kafka_new takes ownership of conf on success only.
        rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, 512)
        if not rk:
            lib.rd_kafka_conf_destroy(conf)
            raise StandinError("Kafka stand-in: rd_kafka_new failed: " + errstr.value.decode(errors="replace"))
        self._rk: int | None = rk
        mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            lib.rd_kafka_destroy(rk)
            self._rk = None
            raise StandinError("Kafka stand-in: rd_kafka_mock_cluster_new failed (see the log lines above)")
        self._mc: int | None = mc
        raw = lib.rd_kafka_mock_cluster_bootstraps(mc)
        self.bootstraps: list[tuple[str, int]] = []
        for item in raw.decode().split(","):
            host, _, port = item.rpartition(":")
            self.bootstraps.append((host, int(port)))

    def _declare_prototypes(self) -> None:
        """Declare argtypes/restype for every function used (rdkafka.h, rdkafka_mock.h).

        Pointers are ``c_void_p`` so 64-bit addresses are never truncated to
        ``int``; ``rd_kafka_resp_err_t`` is a C enum, i.e. ``c_int``.
        """
        lib = self._lib
        vp, cp, i, i16, i32, sz = (
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_int16,
            ctypes.c_int32,
            ctypes.c_size_t,
        )
        protos: dict[str, tuple[list[Any], Any]] = {
            "rd_kafka_conf_new": ([], vp),
            "rd_kafka_conf_destroy": ([vp], None),
            "rd_kafka_conf_set": ([vp, cp, cp, cp, sz], i),
            "rd_kafka_new": ([i, vp, cp, sz], vp),
            "rd_kafka_destroy": ([vp], None),
            "rd_kafka_err2str": ([i], cp),
            "rd_kafka_err2name": ([i], cp),
            "rd_kafka_mock_cluster_new": ([vp, i], vp),
            "rd_kafka_mock_cluster_destroy": ([vp], None),
            "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
            "rd_kafka_mock_topic_create": ([vp, cp, i, i], i),
            "rd_kafka_mock_broker_set_down": ([vp, i32], i),
            "rd_kafka_mock_broker_set_up": ([vp, i32], i),
            "rd_kafka_mock_broker_set_rtt": ([vp, i32, i], i),
            "rd_kafka_mock_broker_set_host_port": ([vp, i32, cp, i], None),
            "rd_kafka_mock_push_request_errors_array": ([vp, i16, sz, ctypes.POINTER(i)], None),
            "rd_kafka_mock_clear_request_errors": ([vp, i16], None),
            "rd_kafka_mock_partition_set_leader": ([vp, cp, i32, i32], i),
            "rd_kafka_mock_group_initial_rebalance_delay_ms": ([vp, i32], None),
        }
        for name, (argtypes, restype) in protos.items():
            try:
                func = getattr(lib, name)
            except AttributeError as exc:
                raise StandinError(
                    f"Kafka stand-in: {name} is missing from librdkafka "
                    f"{lib._name}; the mock API is experimental and may have changed"
                ) from exc
            func.argtypes = argtypes
            func.restype = restype

    # -- helpers ----------------------------------------------------------

    def _mc_ptr(self) -> int:
        if self._mc is None:
            raise StandinError("Kafka stand-in: the mock cluster is already destroyed")
        return self._mc

    def _check(self, err: int, what: str) -> None:
        """Turn an ``rd_kafka_resp_err_t`` into a StandinError naming it."""
        if err:
            name = self._lib.rd_kafka_err2name(err).decode()
            text = self._lib.rd_kafka_err2str(err).decode()
            raise StandinError(f"Kafka stand-in: {what} failed: {name} ({err}): {text}")

    def _check_broker(self, broker_id: int, allow_all: bool = True) -> None:
        if allow_all and broker_id == -1:
            return
        if not 1 <= broker_id <= self.brokers:
            raise StandinError(
                f"Kafka stand-in: no broker {broker_id}; broker ids are 1..{self.brokers}"
                + (" (or -1 for all)" if allow_all else "")
            )

    # -- operations ---------------------------------------------------------

    def create_topic(self, topic: str, partitions: int, replication_factor: int) -> None:
        if not topic:
            raise StandinError("Kafka stand-in: topic name must not be empty")
        if partitions < 1:
            raise StandinError(f"Kafka stand-in: partitions must be >= 1, not {partitions}")
        if not 1 <= replication_factor <= self.brokers:
            raise StandinError(
                f"Kafka stand-in: replication_factor must be 1..{self.brokers} "
                f"(the broker count), not {replication_factor}"
            )
        err = self._lib.rd_kafka_mock_topic_create(self._mc_ptr(), topic.encode(), partitions, replication_factor)
        self._check(err, f"create_topic {topic!r}")

    def broker_down(self, broker_id: int) -> None:
        self._check_broker(broker_id)
        self._check(
            self._lib.rd_kafka_mock_broker_set_down(self._mc_ptr(), broker_id),
            f"broker_down {broker_id}",
        )

    def broker_up(self, broker_id: int) -> None:
        self._check_broker(broker_id)
        self._check(
            self._lib.rd_kafka_mock_broker_set_up(self._mc_ptr(), broker_id),
            f"broker_up {broker_id}",
        )

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        self._check_broker(broker_id)
        if rtt_ms < 0:
            raise StandinError(f"Kafka stand-in: rtt_ms must be >= 0, not {rtt_ms}")
        self._check(
            self._lib.rd_kafka_mock_broker_set_rtt(self._mc_ptr(), broker_id, rtt_ms),
            f"set_rtt {broker_id}",
        )

    def set_host_port(self, broker_id: int, host: str, port: int) -> None:
        self._check_broker(broker_id, allow_all=False)
        self._lib.rd_kafka_mock_broker_set_host_port(self._mc_ptr(), broker_id, host.encode(), port)

    def push_errors(self, api_key: int, errors: Sequence[int]) -> None:
        if not errors:
            raise StandinError("Kafka stand-in: push_errors needs at least one error code")
        array = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(self._mc_ptr(), api_key, len(errors), array)

    def clear_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._mc_ptr(), api_key)

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        self._check_broker(broker_id)  # -1 makes the partition leader-less
        err = self._lib.rd_kafka_mock_partition_set_leader(self._mc_ptr(), topic.encode(), partition, broker_id)
        self._check(err, f"set_leader {topic!r} [{partition}] -> {broker_id}")

    def set_group_initial_rebalance_delay(self, delay_ms: int) -> None:
        if delay_ms < 0:
            raise StandinError(f"Kafka stand-in: delay_ms must be >= 0, not {delay_ms}")
        self._lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self._mc_ptr(), delay_ms)

    def destroy(self) -> None:
        """Destroy the cluster before its handle, as librdkafka requires.

        (``rd_kafka_destroy`` asserts that "All mock clusters must be destroyed
        prior to rd_kafka_t destroy".)
        """
        if self._mc is not None:
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if self._rk is not None:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None


# ---------------------------------------------------------------------------
# Server side: fixed-port forwarding
# ---------------------------------------------------------------------------


class _PortForwarder:
    """Listen on a fixed port and splice each connection to one mock broker.

    Needed because the mock's listener port is always kernel-chosen (see the
    module docstring).  A thread pair per connection is plenty for tests.
    """

    def __init__(self, broker_id: int, port: int) -> None:
        self.broker_id = broker_id
        self.port = port
        self.target_port: int | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()

    def bind(self) -> None:
        """Bind and listen; raises OSError(EADDRINUSE) if the port is taken."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        with self._lock:
            self._listener = sock

    def start(self, target_port: int) -> None:
        """Begin accepting; connections go to ``127.0.0.1:target_port``."""
        self.target_port = target_port
        with self._lock:
            listener = self._listener
        if listener is not None:
            threading.Thread(
                target=self._accept_loop,
                args=(listener,),
                name=f"forward-{self.port}",
                daemon=True,
            ).start()

    def down(self) -> None:
        """Stop listening (clients get ECONNREFUSED) and cut live connections."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns = list(self._conns)
        if listener is not None:
            # shutdown() wakes the thread blocked in accept() on Linux.
            _quiet_shutdown(listener)
            listener.close()
        for conn in conns:
            _quiet_shutdown(conn)

    def up(self) -> None:
        with self._lock:
            listening = self._listener is not None
        if not listening:
            self.bind()
            assert self.target_port is not None
            self.start(self.target_port)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                with self._lock:
                    still_current = self._listener is listener
                if not still_current:
                    return  # listener shut down by down()
                time.sleep(0.05)  # transient (e.g. EMFILE): keep serving
                continue
            threading.Thread(target=self._bridge, args=(client,), daemon=True).start()

    def _bridge(self, client: socket.socket) -> None:
        assert self.target_port is not None
        try:
            upstream = socket.create_connection((HOST, self.target_port), timeout=5.0)
        except OSError:
            client.close()  # mock broker is down: behave like a dropped connection
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._conns.update((client, upstream))
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        with self._lock:
            self._conns.discard(client)
            self._conns.discard(upstream)
        client.close()
        upstream.close()


def _quiet_shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes until either side closes, then cut both (Kafka never half-closes)."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _quiet_shutdown(src)
        _quiet_shutdown(dst)


# ---------------------------------------------------------------------------
# Server side: control channel
# ---------------------------------------------------------------------------


class _Standin:
    """The running server: mock cluster, optional forwarders, stop signal."""

    def __init__(self, cluster: _MockCluster, forwarders: list[_PortForwarder]) -> None:
        self.cluster = cluster
        self.forwarders = {f.broker_id: f for f in forwarders}
        self.stop = threading.Event()
        self.stop_reason = ""
        self._handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "ping": self._ping,
            "create_topic": self._create_topic,
            "broker_down": self._broker_down,
            "broker_up": self._broker_up,
            "set_rtt": self._set_rtt,
            "push_errors": self._push_errors,
            "clear_errors": self._clear_errors,
            "set_leader": self._set_leader,
            "set_group_initial_rebalance_delay": self._set_delay,
            "shutdown": self._shutdown,
        }

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def handle(self, line: bytes) -> dict[str, Any]:
        """Decode and run one request; never raises."""
        try:
            request = json.loads(line)
        except ValueError as exc:
            return {"ok": False, "error": f"Kafka stand-in: request is not JSON: {exc}"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "Kafka stand-in: request must be a JSON object"}
        cmd = request.get("cmd")
        handler = self._handlers.get(cmd) if isinstance(cmd, str) else None
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            return {"ok": False, "error": f"Kafka stand-in: unknown cmd {cmd!r} (known: {known})"}
        try:
            reply = handler(request)
        except StandinError as exc:
            return {"ok": False, "error": str(exc)}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"Kafka stand-in: bad arguments for {cmd}: {exc!r}"}
        reply.setdefault("ok", True)
        return reply

    # -- handlers -----------------------------------------------------------

    def _ping(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "brokers": self.cluster.brokers}

    def _create_topic(self, req: dict[str, Any]) -> dict[str, Any]:
        self.cluster.create_topic(
            _str(req, "topic"),
            _int(req, "partitions", 1),
            _int(req, "replication_factor", 1),
        )
        return {}

    def _forwarders_for(self, broker_id: int) -> list[_PortForwarder]:
        if broker_id == -1:
            return list(self.forwarders.values())
        fwd = self.forwarders.get(broker_id)
        return [fwd] if fwd else []

    def _broker_down(self, req: dict[str, Any]) -> dict[str, Any]:
        broker_id = _int(req, "broker_id")
        self.cluster.broker_down(broker_id)
        for fwd in self._forwarders_for(broker_id):
            fwd.down()
        return {}

    def _broker_up(self, req: dict[str, Any]) -> dict[str, Any]:
        broker_id = _int(req, "broker_id")
        self.cluster.broker_up(broker_id)
        for fwd in self._forwarders_for(broker_id):
            try:
                fwd.up()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StandinError(port_in_use_message(fwd.port)) from exc
                raise StandinError(f"Kafka stand-in: cannot listen on {fwd.port}: {exc}") from exc
        return {}

    def _set_rtt(self, req: dict[str, Any]) -> dict[str, Any]:
        self.cluster.set_rtt(_int(req, "broker_id"), _int(req, "rtt_ms"))
        return {}

    def _push_errors(self, req: dict[str, Any]) -> dict[str, Any]:
        api_key = resolve_api_key(req["api_key"])
        raw = req["errors"]
        if not isinstance(raw, list):
            raise StandinError("Kafka stand-in: errors must be a list of error codes")
        codes = [resolve_error_code(e) for e in raw]
        self.cluster.push_errors(api_key, codes)
        return {"api_key": api_key, "errors": codes}

    def _clear_errors(self, req: dict[str, Any]) -> dict[str, Any]:
        api_key = resolve_api_key(req["api_key"])
        self.cluster.clear_errors(api_key)
        return {"api_key": api_key}

    def _set_leader(self, req: dict[str, Any]) -> dict[str, Any]:
        self.cluster.set_leader(_str(req, "topic"), _int(req, "partition"), _int(req, "broker_id"))
        return {}

    def _set_delay(self, req: dict[str, Any]) -> dict[str, Any]:
        self.cluster.set_group_initial_rebalance_delay(_int(req, "delay_ms"))
        return {}

    def _shutdown(self, _: dict[str, Any]) -> dict[str, Any]:
        self.request_stop("shutdown command")
        return {}


def _int(req: dict[str, Any], key: str, default: int | None = None) -> int:
    value = req.get(key, default)
    if value is None:
        raise StandinError(f"Kafka stand-in: missing argument {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise StandinError(f"Kafka stand-in: argument {key!r} must be an integer, not {value!r}")
    return value


def _str(req: dict[str, Any], key: str) -> str:
    value = req.get(key)
    if not isinstance(value, str) or not value:
        raise StandinError(f"Kafka stand-in: argument {key!r} must be a non-empty string")
    return value


class _ControlServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, standin: _Standin) -> None:
        self.standin = standin
        super().__init__((HOST, port), _ControlHandler)


class _ControlHandler(socketserver.StreamRequestHandler):
    server: _ControlServer

    def handle(self) -> None:
        for line in self.rfile:
            if not line.strip():
                continue
            reply = self.server.standin.handle(line)
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


# ---------------------------------------------------------------------------
# Server side: process life cycle
# ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGKILL us when the parent goes away; the expected parent pid (in the environment)
    reveals a parent that died before prctl ran."""
    expected = os.environ.get(PARENT_PID_ENV)
    die_with_parent(int(expected) if expected and expected.isdigit() else None, EXIT_FAILURE)


def _watch_stdin(standin: _Standin) -> None:
    """Stop when stdin reaches EOF: the parent closed the pipe or died."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0:
        standin.request_stop("no stdin")
        return
    while True:
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            standin.request_stop("stdin closed")
            return


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.kafka_standin",
        description="Serve a librdkafka mock Kafka cluster until stdin closes.",
    )
    parser.add_argument("--brokers", type=int, default=1, help="number of brokers (ids 1..N)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="fixed port of broker 1; broker k listens on PORT+k-1 (default: ephemeral ports)",
    )
    parser.add_argument("--control-port", type=int, default=0, help="control channel port (default: ephemeral)")
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=None,
        help="override the mock's group.initial.rebalance.delay.ms (3000 like Kafka)",
    )
    parser.add_argument(
        "--ignore-stdin",
        action="store_true",
        help="do not exit when stdin closes nor when the parent exits (for running in the background by hand)",
    )
    parser.add_argument("--debug", default=None, help="librdkafka debug contexts, e.g. 'mock'")
    args = parser.parse_args(argv)
    if args.brokers < 1:
        parser.error("--brokers must be >= 1")
    if args.port is not None and not 1 <= args.port <= 65535 - (args.brokers - 1):
        parser.error(f"--port must leave room for {args.brokers} consecutive ports")
    return args


def _emit(obj: dict[str, Any]) -> None:
    """Write the single stdout line the parent waits for."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stand-in server until shutdown, stdin EOF, SIGTERM or SIGINT."""
    args = _parse_args(argv)
    if not args.ignore_stdin:
        _die_with_parent()  # started by hand in the background: it outlives the shell

    # Bind fixed ports before creating the cluster so a taken port fails fast
    # with one clear line and nothing to clean up.
    forwarders: list[Any] = []
    if args.port is not None:
        for index in range(args.brokers):
            fwd = _PortForwarder(index + 1, args.port + index)
            try:
                fwd.bind()
            except OSError as exc:
                for done in forwarders:
                    done.down()
                if exc.errno == errno.EADDRINUSE:
                    message = port_in_use_message(fwd.port)
                else:
                    message = f"Kafka stand-in: cannot listen on port {fwd.port}: {exc}"
                _emit({"error": message})
                return EXIT_PORT_IN_USE if exc.errno == errno.EADDRINUSE else EXIT_FAILURE
            forwarders.append(fwd)

    try:
        cluster = _MockCluster(args.brokers, debug=args.debug)
    except StandinError as exc:
        for fwd in forwarders:
            fwd.down()
        _emit({"error": str(exc)})
        return EXIT_FAILURE

    standin = _Standin(cluster, forwarders)
    if args.group_initial_rebalance_delay_ms is not None:
        cluster.set_group_initial_rebalance_delay(args.group_initial_rebalance_delay_ms)
    for fwd, (_, mock_port) in zip(forwarders, cluster.bootstraps, strict=False):
        # Advertise the fixed port in Metadata so clients come back through it.
        cluster.set_host_port(fwd.broker_id, HOST, fwd.port)
        fwd.start(mock_port)

    try:
        server = _ControlServer(args.control_port, standin)
    except OSError as exc:
        cluster.destroy()
        _emit({"error": f"Kafka stand-in: cannot open control port {args.control_port}: {exc}"})
        return EXIT_PORT_IN_USE if exc.errno == errno.EADDRINUSE else EXIT_FAILURE
    # A short poll interval keeps server.shutdown() (and so stop()) fast.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="control", daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: standin.request_stop(signal.Signals(s).name))

    if forwarders:
        bootstrap = ",".join(f"{HOST}:{f.port}" for f in forwarders)
    else:
        bootstrap = ",".join(f"{h}:{p}" for h, p in cluster.bootstraps)
    control_host, control_port = server.server_address[:2]
    _emit(
        {
            "bootstrap": bootstrap,
            "control": f"{control_host!s}:{control_port}",
            "pid": os.getpid(),
            "brokers": args.brokers,
        }
    )
    # Nothing else may reach the parent's stdout pipe (it may be closed now).
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    if not args.ignore_stdin:
        threading.Thread(target=_watch_stdin, args=(standin,), name="stdin", daemon=True).start()

    # Event.wait() is interruptible by signals on POSIX, so SIGTERM/SIGINT
    # handlers run promptly; the timeout only bounds each wait.
    while not standin.stop.wait(3600.0):
        pass

    # librdkafka destroy should take milliseconds; never let it hang the exit.
    watchdog = threading.Timer(10.0, os._exit, args=(EXIT_FAILURE,))
    watchdog.daemon = True
    watchdog.start()
    server.shutdown()
    server.server_close()
    for fwd in forwarders:
        fwd.down()
    cluster.destroy()
    sys.stderr.write(f"Kafka stand-in: stopped ({standin.stop_reason})\n")
    sys.stderr.flush()
    return 0
