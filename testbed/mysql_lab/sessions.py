"""A client session of the lab server: what SHOW PROCESSLIST, SHOW REPLICAS, KILL and the
user-level locks know of it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Replica:
    """What COM_REGISTER_SLAVE announced (sql/rpl_source.cc register_replica): server id,
    report host, user, password, port, rank (ignored), source id."""

    server_id: int
    host: str
    port: int
    source_id: int


@dataclass
class Session:
    id: int
    user: str
    host: str  # client address
    port: int  # client port
    db: str | None = None
    command: str = "Sleep"  # Query, Sleep, Binlog Dump, Binlog Dump GTID (PROCESSLIST.COMMAND)
    state: str = ""
    since: float = field(default_factory=time.monotonic)
    user_vars: dict[str, Any] = field(default_factory=dict)
    session_vars: dict[str, Any] = field(default_factory=dict)
    replica: Replica | None = None
    replica_uuid: str = ""
    killed: threading.Event = field(default_factory=threading.Event)
    interrupted: threading.Event = field(default_factory=threading.Event)  # KILL QUERY

    def stopped(self) -> bool:
        """Whether the running statement must stop waiting (KILL or KILL QUERY)."""
        return self.killed.is_set() or self.interrupted.is_set()

    def set_command(self, command: str, state: str = "") -> None:
        self.command = command
        self.state = state
        self.since = time.monotonic()

    def user_var(self, *names: str) -> Any:
        """The first of `names` set as a user variable (names are case-insensitive)."""
        for name in names:
            if name.lower() in self.user_vars:
                return self.user_vars[name.lower()]
        return None
