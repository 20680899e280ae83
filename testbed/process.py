"""What the lab servers share: free local ports (dying with the parent is
`connectors.process.die_with_parent`, which the relay's reader process uses too)."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether `HOST:port` can be bound the way the lab servers bind it (SO_REUSEADDR: a
    socket lingering in TIME_WAIT does not count as in use; a live listener does)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((HOST, port))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def owner_stamp(pid: int) -> str | None:
    """``"<pid> <start time>"``: identifies a process even after its pid is reused (None:
    no such process, or a zombie). A lab server's temporary directory holds its owner's, so
    that a later start can delete the directories of owners killed by a signal."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return f"{pid} {fields[19]}"  # field 22 of stat: start time in clock ticks


OWNER_FILE = "owner"


def stale_roots(prefix: str) -> Iterator[Path]:
    """Temporary directories `$TMPDIR/<prefix>*` whose owner (the stamp in their `owner`
    file) is gone: a parent killed by a signal runs no atexit, PR_SET_PDEATHSIG kills its
    servers but their directories stay. A directory without a readable stamp is never one."""
    try:
        candidates = list(Path(tempfile.gettempdir()).glob(f"{prefix}*"))
    except OSError:
        return
    for root in candidates:
        try:
            stamp = (root / OWNER_FILE).read_text().strip()
            pid = int(stamp.split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if owner_stamp(pid) != stamp:
            yield root
