"""Who holds this relay's replica server id when it starts (pure decisions; the queries,
the KILL and the waiting are in connectors/mysql/replica_sessions.py).

The server lists every binlog session by its replica server id (SHOW SLAVE HOSTS /
SHOW REPLICAS) and shows each as a `Binlog Dump` thread in its process list; nothing
ties the two together, so the relay ties them itself: it registers with a *tag* as its
report host (COM_REGISTER_SLAVE), naming its connection id and the process that owns
the binlog socket (machine name, boot id, pid namespace, pid, process start time):

    cdc;c=57;h=web-1;b=1a2b3c4d;n=4026531836;p=1234;s=998877;r=5f1e0a

(`r`: a short hash of the relay's source name, `source_mark`.)

A listed session with our server id is, in order:

* `dead` — our own previous session: its tag names this machine, this boot and this
  pid namespace, the process it names is gone (pid and start time), and its dump thread
  runs under our user. The server keeps such a session until a heartbeat write to the
  closed socket fails (one or two heartbeat periods): the relay ends it with KILL.
* With the source's lease held (cdc/lease.py), a session under our user tagged with our
  source is also `dead`: the lease decides which relay of this source reads, so another
  one's session is left over from a relay that lost the lease (frozen, cut off): the
  relay ends it. A relay of another source with the same id is waited out and refused.
* `wait` — anything else: a relay that is still running (perhaps stopping), a session
  from another machine or container whose process cannot be checked from here, another
  account's, an untagged replica. It is waited out for `wait_bound(heartbeat_s)`; one
  that outlives the bound is another replica, and the relay refuses to start (`refusal`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DumpThread", "Finding", "Listed", "Machine", "SessionTag", "assess", "refusal", "wait_bound"]

_TAG = re.compile(r"cdc;c=(\d+);h=([^;]*);b=([0-9a-f]*);n=(\d*);p=(\d+);s=(\d+)(?:;r=([0-9a-f]{6}))?")
_HOST_CHARS = 40  # the tag stays short: MySQL/MariaDB keep report hosts of up to 60 (older) or 255 bytes


@dataclass(frozen=True)
class SessionTag:
    """What a relay's binlog session says about itself in its report host."""

    conn: int  # the binlog connection's CONNECTION_ID()
    host: str  # the machine (container) name, at most 40 characters
    boot: str  # the first 8 hex digits of the kernel's boot id ('' where unknown)
    pidns: str  # the pid namespace's inode number ('' where unknown)
    pid: int  # the process that owns the binlog socket
    start: int  # its start time (clock ticks since boot), so a reused pid is not taken for it
    source: str = ""  # source_mark of the relay's source name ('' where not known)

    def text(self) -> str:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", self.host)[:_HOST_CHARS]
        mark = f";r={self.source}" if self.source else ""
        return f"cdc;c={self.conn};h={host};b={self.boot};n={self.pidns};p={self.pid};s={self.start}{mark}"

    @classmethod
    def parse(cls, text: str) -> SessionTag | None:
        """The tag in a report host, or None (never raises: report hosts are any text)."""
        m = _TAG.fullmatch(text or "")
        if m is None:
            return None
        return cls(int(m[1]), m[2], m[3], m[4], int(m[5]), int(m[6]), m[7] or "")


def source_mark(source_name: str) -> str:
    """Six hex digits naming a source in a session tag (short: report hosts are limited)."""
    return hashlib.sha256(source_name.encode()).hexdigest()[:6] if source_name else ""


@dataclass(frozen=True)
class Listed:
    """A row of SHOW SLAVE HOSTS / SHOW REPLICAS."""

    server_id: int
    host: str  # the report host (the peer's address when the replica reported none)


@dataclass(frozen=True)
class DumpThread:
    """A `Binlog Dump` row of the process list that the checking account can see."""

    id: int
    user: str
    host: str  # address:port the server sees


@dataclass(frozen=True)
class Machine:
    """Where the check runs, in the terms of `SessionTag`."""

    host: str
    boot: str
    pidns: str

    def same_as(self, tag: SessionTag) -> bool:
        short = re.sub(r"[^A-Za-z0-9._-]", "_", self.host)[:_HOST_CHARS]
        return (
            bool(self.boot) and bool(self.pidns) and (tag.host, tag.boot, tag.pidns) == (short, self.boot, self.pidns)
        )


@dataclass(frozen=True)
class Finding:
    """One listed session with our server id: `dead` (ours, end it with KILL `conn`) or
    `wait` (wait it out; `conn` is its connection id where known). `where` names it."""

    kind: str
    conn: int | None
    where: str


def wait_bound(heartbeat_s: float) -> float:
    """How long a session with our server id is waited out: a dead socket ends its dump
    thread at the second heartbeat the server writes to it, so three periods and a half
    second cover it."""
    return 3.0 * max(0.0, heartbeat_s) + 0.5


def assess(
    server_id: int,
    listed: list[Listed],
    dumps: list[DumpThread],
    user: str,
    machine: Machine,
    alive: Callable[[int, int], bool],
    lease_held: str = "",
) -> list[Finding]:
    """A finding for each listed session with `server_id` (empty: the id is free).
    `alive(pid, start)`: does that process run on this machine (in this pid namespace)?
    `lease_held`: the `source_mark` of the source whose lease this relay holds (another
    relay's session tagged with it is stale); '' without a lease."""
    by_id = {d.id: d for d in dumps}
    tagged = {t.conn for t in (SessionTag.parse(x.host) for x in listed) if t is not None}
    out = []
    for entry in listed:
        if entry.server_id != server_id:
            continue
        tag = SessionTag.parse(entry.host)
        if tag is None:
            out.append(_untagged(entry, dumps, tagged, user))
            continue
        thread = by_id.get(tag.conn)
        who = f"relay pid {tag.pid} on {tag.host or 'an unnamed host'}"
        if thread is None:
            where = (
                f"connection {tag.conn} ({who}; its dump thread is not visible to user {user!r}: "
                "another account's, or ending)"
            )
            out.append(Finding("wait", tag.conn, where))
            continue
        where = f"connection {thread.id} from {thread.host} (user {thread.user!r}, {who})"
        if lease_held and thread.user == user and tag.source == lease_held:
            out.append(Finding("dead", thread.id, where + ", a relay that lost the lease"))
            continue
        mine = thread.user == user and machine.same_as(tag)
        if mine and not alive(tag.pid, tag.start):
            out.append(Finding("dead", thread.id, where))
        else:
            out.append(Finding("wait", thread.id, where))
    return out


def _untagged(entry: Listed, dumps: list[DumpThread], tagged: set[int], user: str) -> Finding:
    """Another kind of replica: its dump connection is the only untagged dump thread
    from its address, if there is exactly one."""
    candidates = [d for d in dumps if d.id not in tagged and d.host.rpartition(":")[0] == entry.host]
    if len(candidates) == 1:
        d = candidates[0]
        return Finding("wait", d.id, f"connection {d.id} from {d.host} (user {d.user!r})")
    return Finding(
        "wait",
        None,
        f"host {entry.host}, connection id not visible to user {user!r} (seeing other "
        "accounts' sessions needs the PROCESS privilege)",
    )


def refusal(server_id: int, finding: Finding, waited_s: float) -> str:
    """The one line `cdc check` and `cdc run` print when the id stays taken."""
    return (
        f"another replica is connected with server id {server_id}: {finding.where}, still there after "
        f"{waited_s:.1f} s: set source.replica_server_id to an id no other replica uses (or stop the other "
        "relay)"
    )
