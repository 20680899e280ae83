"""What the lab servers share: free local ports (dying with the parent is
`connectors.process.die_with_parent`, which the relay's reader process uses too)."""

from __future__ import annotations

import errno
import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether `port` can be bound on the loopback address now."""
    probe = socket.socket()
    try:
        probe.bind((HOST, port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    finally:
        probe.close()
    return True
