"""A NATS connection for synchronous callers: nats-py is asyncio-only, so each
connection runs its own event loop in a daemon thread and the relay's thread hands it
coroutines (`run`) or plain callbacks (`call_soon`). The relay's ports stay synchronous
(cdc/ports.py), as they are over confluent-kafka.

`connect_options` turns `[sink.nats_jetstream]` into `nats.connect` keyword arguments:
user and password, a token, or a credentials file (JWT + NKey seed); TLS from ca_file /
cert_file / key_file. Secrets go to the client only, never into a message.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Coroutine
from typing import Any

import nats
from nats.errors import (
    AuthorizationError,
    ConnectionClosedError,
    InvalidUserCredentialsError,
    NoRespondersError,
    NoServersError,
    StaleConnectionError,
)

from cdc.config import NatsJetStreamConfig
from cdc.errors import BrokerUnreachable, ConfigError, DeliveryError
from connectors.loop_thread import LoopThread
from connectors.tls_files import KeyPasswordMissing, client_cert_error, load_client_cert

log = logging.getLogger("cdc.nats")


def connect_options(cfg: NatsJetStreamConfig) -> dict[str, Any]:
    """`nats.connect` keyword arguments for `cfg` (without callbacks)."""
    out: dict[str, Any] = {"servers": list(cfg.servers)}
    if cfg.creds_file:
        out["user_credentials"] = cfg.creds_file
    elif cfg.token.reveal():
        out["token"] = cfg.token.reveal()
    elif cfg.user:
        out["user"] = cfg.user
        out["password"] = cfg.password.reveal()
    if cfg.ca_file or cfg.cert_file or any(s.startswith("tls://") for s in cfg.servers):
        try:
            context = ssl.create_default_context(cafile=cfg.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"sink.nats_jetstream TLS files cannot be used ({type(exc).__name__}: {exc}): "
                "check ca_file, cert_file and key_file"
            ) from None
        if cfg.cert_file:
            try:
                load_client_cert(context, cfg.cert_file, cfg.key_file, cfg.key_password.reveal())
            except (KeyPasswordMissing, OSError, ssl.SSLError) as exc:
                raise ConfigError(client_cert_error(exc, "sink.nats_jetstream", cfg.cert_file, cfg.key_file)) from None
        out["tls"] = context
    return out


async def connect(cfg: NatsJetStreamConfig, name: str, timeout: float = 5.0, pending_size: int = 2 << 20) -> Any:
    """A new connection that does not reconnect by itself: a caller that needs to go on
    opens a new one (the publisher does, to control what is sent again and in which order).

    The wait is bounded: each server is tried twice, without a pause, each attempt within
    `timeout`. `allow_reconnect=False` alone does not do it: nats-py's first connect only
    gives up at once on a failed handshake; a refused TCP connection (a server down) is
    tried again every `reconnect_time_wait` (2 s) up to `max_reconnect_attempts` (60) times
    per server, two minutes in which the publisher's pump could not notice its
    `delivery_timeout_s` (nats/aio/client.py `_select_next_server`)."""

    async def on_error(exc: Exception) -> None:  # nats-py would print each one
        log.debug("nats %s: %s: %s", name, type(exc).__name__, exc)

    nc = nats.NATS()
    try:
        await nc.connect(
            **connect_options(cfg),
            name=f"cdc-relay {name}",
            allow_reconnect=False,
            max_reconnect_attempts=1,  # 0 would be "no limit"; 1 is two attempts
            reconnect_time_wait=0,
            connect_timeout=max(1, int(timeout)),
            error_cb=on_error,
            # nats-py buffers what it has not written yet up to this many bytes; above it a
            # publish waits for the socket (without a deadline: a stopped server holds it).
            pending_size=pending_size,
        )
    except NoServersError:
        raise nc.last_error or NoServersError() from None  # the cause, not "no servers available"
    return nc


def server_down(exc: BaseException) -> bool:
    """A failure of a server that is down, restarting or not answering (connection refused,
    reset or closed, a timeout, JetStream not answering yet), not a refusal of the relay."""
    if isinstance(exc, (ssl.SSLError, AuthorizationError, InvalidUserCredentialsError)):
        return False
    return isinstance(
        exc,
        (OSError, asyncio.TimeoutError, NoServersError, StaleConnectionError, ConnectionClosedError, NoRespondersError),
    )


def unreachable(cfg: NatsJetStreamConfig, exc: BaseException) -> DeliveryError:
    """The one line for a NATS server that cannot be reached (no secrets in it):
    BrokerUnreachable when the server is down or restarting, which a start waits out."""
    if isinstance(exc, ConfigError):  # the settings' own fix (a client key that cannot be used)
        return DeliveryError(str(exc))
    text = f"cannot reach NATS {','.join(cfg.servers)} (sink.nats_jetstream.servers): {type(exc).__name__}: {exc}; "
    if server_down(exc):
        return BrokerUnreachable(text + "the server is down or restarting: check that it runs, with JetStream (-js)")
    return DeliveryError(
        text + (_tls_fix(exc) or "check the address, that the server runs with JetStream (-js) and the credentials")
    )


def server_where(cfg: NatsJetStreamConfig) -> str:
    return f"NATS {','.join(cfg.servers)}"


def _tls_fix(exc: BaseException) -> str:
    """The fix for a TLS failure ("" for another): the certificate's CA or its name, or the
    handshake (a client certificate the server wants, a port without TLS)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            "the server's certificate was refused: set sink.nats_jetstream.ca_file to its CA and name the server "
            "in servers as its certificate does (a host name or IP address it holds)"
        )
    if isinstance(exc, ssl.SSLError):
        return "the TLS handshake failed: check sink.nats_jetstream.cert_file / key_file and that the server serves TLS"
    return ""


class EventLoopThread(LoopThread):
    """The shared loop thread (connectors/loop_thread.py) under the names this sink calls."""

    def __init__(self, name: str):
        super().__init__(f"nats-{name}")

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run `coro` on the loop and wait for its result (raises what it raises)."""
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop)
        return future.result()

    call_soon = LoopThread.soon
