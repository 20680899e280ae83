"""What the lab servers share: free local ports (dying with the parent is
`connectors.process.die_with_parent`, which the relay's reader process uses too)."""

from __future__ import annotations

import socket

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
