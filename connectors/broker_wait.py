"""A relay that starts while its broker (RabbitMQ, NATS) is down or restarting waits for it,
as a running relay waits out the same outage: it tries again every second and gives up
only after the sink's delivery timeout (`publish_timeout_s`, `delivery_timeout_s`), with one
line naming the broker. A stop (SIGTERM) during the wait ends it at once: `StopRequested`,
which `cdc run` takes as a clean stop (exit 0). A refusal (a wrong password, a missing
permission) is not waited on: only `BrokerUnreachable` is."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from cdc.errors import BrokerUnreachable, StopRequested

T = TypeVar("T")
log = logging.getLogger("cdc.broker")

RETRY_EVERY_S = 1.0


def never() -> bool:
    return False


def wait_for_broker(
    attempt: Callable[[], T],
    where: str,
    wait_s: float,
    setting: str,
    should_stop: Callable[[], bool] = never,
) -> T:
    """`attempt()`, again every second while it raises BrokerUnreachable, for up to `wait_s`
    seconds (0: once). `where` names the broker (no secrets), `setting` the option that
    bounds the wait."""
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        try:
            return attempt()
        except BrokerUnreachable as exc:
            if time.monotonic() >= deadline:
                if not warned:
                    raise
                raise BrokerUnreachable(f"{where} did not come back within {wait_s:g} s ({setting}): {exc}") from exc
            if not warned:
                warned = True
                log.warning("%s: trying again every %g s for up to %g s (%s)", exc, RETRY_EVERY_S, wait_s, setting)
        pause_until = min(deadline, time.monotonic() + RETRY_EVERY_S)
        while time.monotonic() < pause_until:
            if should_stop():
                raise StopRequested(f"stopped while waiting for {where}")
            time.sleep(0.05)
        if should_stop():
            raise StopRequested(f"stopped while waiting for {where}")
