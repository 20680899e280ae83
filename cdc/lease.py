"""One active relay per source: the lease's rules (pure; the MySQL lock that carries it is
connectors/mysql/lease.py, the wiring cdc_cli/app.py).

The lease is a named lock on the source database (`GET_LOCK`), held by one session of
the relay that publishes. The server releases it when that session ends: the relay
exits or is killed (its socket closes), someone KILLs the session, or the session goes
silent for `ttl_s` (the session's `wait_timeout` is set to the lease time, so a frozen or
cut-off holder loses it on the server's clock). Every other instance is a standby that
waits for the lock.

Timing, and what each side does (docs/lease.md):

* The holder confirms the lease every `renew_s` on its lock session. It may hand
  messages to the producer only until `sent + ttl_s - margin_s`, where `sent` is when it
  sent the last confirmation the server answered: the server's idle clock for that
  session started no earlier, so the holder stops before the server could release the
  lock. A failed confirmation (the session is gone) ends the lease at once. When the
  lease ends, the holder purges what the producer still queues and exits 1.
* A successor that gets the lock waits `takeover_wait` before it publishes, so that a
  previous holder that is still running has stopped and its producer holds nothing:
  0 when there was no previous holder, when it released the lease at a clean stop, or
  when it provably died (its process on this machine is gone); `ttl_s` when its lock
  session ended while it was confirming on time (killed, or its connection closed);
  otherwise (it went silent, or nothing is known) `ttl_s` plus the producer's delivery
  timeout, the longest a message it handed over before stopping can stay queued.
* Each holder takes a new **epoch** (the newest checkpoint's plus one) and writes it
  into a checkpoint before it publishes; every checkpoint carries it, and a checkpoint
  of an older epoch never wins over a newer one (checkpoint stores).

What no timing can cover: a holder frozen (SIGSTOP, a paused VM) longer than the
successor's wait wakes with messages already queued in its producer, and librdkafka may
send them before the relay's own code runs and purges. Those copies are duplicates the
verifier reports; docs/operating.md says how large the window is and how to shrink it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cdc.errors import ConfigError, Transient

# MySQL limits lock names to 64 characters (MariaDB too, from 10.6 on).
_MAX_NAME = 64


class LeaseLost(Transient):
    """This relay no longer holds the lease: another instance may publish now. It stops
    handing messages to Kafka, drops what is queued, and exits 1 (a restart makes it a
    standby)."""


@dataclass(frozen=True)
class LeaseSettings:
    """`[lease]`: one active relay per source (see the module docstring)."""

    enabled: bool = True  # off: no lock; only run one relay per source then
    ttl_s: float = 10.0  # the lease time: a holder silent this long loses the lease
    renew_s: float = 1.0  # the holder confirms this often; a standby polls this often
    margin_s: float = 0.5  # the holder stops this long before the server could release

    def __post_init__(self) -> None:
        if self.renew_s <= 0 or self.ttl_s < 2 or self.ttl_s < 3 * self.renew_s:
            raise ConfigError(
                "lease.ttl_s must be at least 2 and at least 3 x lease.renew_s (> 0): "
                f"got ttl_s = {self.ttl_s}, renew_s = {self.renew_s}"
            )
        if not 0 <= self.margin_s < self.ttl_s / 2:
            raise ConfigError("lease.margin_s must be >= 0 and less than half of lease.ttl_s")

    @property
    def wait_timeout(self) -> int:
        """The lock session's `wait_timeout` (whole seconds): the server ends a silent
        holder's session, and so releases its lock, after this long."""
        return max(1, int(self.ttl_s))


def lock_name(source_name: str) -> str:
    """The lock's name for a source: readable, and within the server's 64 characters."""
    name = f"cdc.relay.{source_name}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(source_name.encode()).hexdigest()[:16]
    return f"{name[: _MAX_NAME - 17]}.{digest}"


@dataclass(frozen=True)
class Previous:
    """What a new holder knows of the one before it."""

    epoch: int  # the newest checkpoint's epoch (0: no holder ever wrote one)
    released: bool  # its last checkpoint says it stopped cleanly, everything acknowledged
    gone: bool  # its process provably no longer runs (same machine, pid and start time gone)
    closed_while_active: bool  # seen confirming on time until its lock session ended


def takeover_wait(previous: Previous, settings: LeaseSettings, delivery_timeout_s: float) -> tuple[float, str]:
    """How long a relay that just got the lock waits before it publishes, and why."""
    if previous.epoch == 0:
        return 0.0, "no relay held this source's lease before"
    if previous.released:
        return 0.0, f"the previous holder (epoch {previous.epoch}) released the lease at a clean stop"
    if previous.gone:
        return 0.0, f"the previous holder (epoch {previous.epoch}) is gone: its process no longer runs"
    if previous.closed_while_active:
        return settings.ttl_s, (
            f"the previous holder's (epoch {previous.epoch}) lock session ended while it was "
            f"active: waiting the lease time ({settings.ttl_s:g} s) for it to stop"
        )
    wait = settings.ttl_s + delivery_timeout_s
    return wait, (
        f"the previous holder (epoch {previous.epoch}) went silent or cannot be checked from here: waiting "
        f"the lease time plus the delivery timeout ({wait:g} s) before publishing"
    )


class LeaseClock:
    """The holder's side: until when it may hand messages to the producer.

    `confirmed(sent_at)` after each confirmation the server answered (`sent_at`: the
    monotonic time the confirmation was sent); `lose(reason)` when a confirmation failed.
    `check(now)` raises LeaseLost once the lease has run out or was lost."""

    def __init__(self, settings: LeaseSettings, acquired_at: float):
        self._settings = settings
        self._valid_until = acquired_at + settings.ttl_s - settings.margin_s
        self.confirmed_at = acquired_at
        self.lost: str | None = None

    def confirmed(self, sent_at: float) -> None:
        if self.lost is None and sent_at > self.confirmed_at:
            self.confirmed_at = sent_at
            self._valid_until = sent_at + self._settings.ttl_s - self._settings.margin_s

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason

    def check(self, now: float) -> None:
        if self.lost is None and now >= self._valid_until:
            self.lost = (
                f"the lease was not confirmed for {now - self.confirmed_at:.1f} s (lease.ttl_s = "
                f"{self._settings.ttl_s:g})"
            )
        if self.lost is not None:
            raise LeaseLost(
                f"lost the lease: {self.lost}; stopped publishing, dropped what was queued: "
                "another relay may publish now (restart this one to make it a standby)"
            )
