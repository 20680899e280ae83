"""Which server this is (MySQL or MariaDB, which version), read from `SELECT VERSION()`,
and the statements that differ between them.

MySQL 8.2 added `SHOW BINARY LOG STATUS` and deprecated `SHOW MASTER STATUS`; MySQL 8.4
removed the old statement (and `SHOW SLAVE HOSTS`, replaced by `SHOW REPLICAS` since
8.0.22). MariaDB keeps `SHOW MASTER STATUS` and `SHOW SLAVE HOSTS` (its `SHOW BINLOG
STATUS` is a newer alias, not needed). Every place that asks the server for its binlog
end or its replicas chooses the statement here, by the version string.

Version strings seen in the wild: `8.4.0`, `8.0.36-0ubuntu0.22.04.1`, `8.0.32-google`
(Cloud SQL), `8.0.35-27` (Percona), `5.7.19-log`, `10.11.6-MariaDB-0+deb12u1`,
`5.5.5-10.11.6-MariaDB` (MariaDB's handshake prefix, kept for old clients).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBERS = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class ServerVersion:
    """`flavor` ("mysql" or "mariadb") and the numeric version; compares as a tuple."""

    flavor: str
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> ServerVersion:
        """The version of a `SELECT VERSION()` (or handshake) string. A string with no
        `N.N` in it is taken as MySQL 0.0.0 (the oldest statements are used)."""
        text = str(text or "")
        mariadb = "mariadb" in text.lower()
        if mariadb and text.startswith("5.5.5-"):
            text = text[len("5.5.5-") :]
        match = _NUMBERS.search(text)
        if match is None:
            return cls("mariadb" if mariadb else "mysql", 0, 0, 0)
        major, minor, patch = (int(g) if g is not None else 0 for g in match.groups())
        return cls("mariadb" if mariadb else "mysql", major, minor, patch)

    @property
    def is_mariadb(self) -> bool:
        return self.flavor == "mariadb"

    def at_least(self, major: int, minor: int = 0, patch: int = 0) -> bool:
        return (self.major, self.minor, self.patch) >= (major, minor, patch)

    def __str__(self) -> str:
        return f"{'MariaDB' if self.is_mariadb else 'MySQL'} {self.major}.{self.minor}.{self.patch}"


def binlog_status_statement(version: str | ServerVersion) -> str:
    """The statement that names the server's current binlog file and position:
    `SHOW BINARY LOG STATUS` on MySQL 8.2 and later (8.4 has no other), `SHOW MASTER
    STATUS` on older MySQL and on MariaDB. Both return (File, Position, ...) first."""
    v = version if isinstance(version, ServerVersion) else ServerVersion.parse(version)
    if not v.is_mariadb and v.at_least(8, 2):
        return "SHOW BINARY LOG STATUS"
    return "SHOW MASTER STATUS"


def replicas_statement(version: str | ServerVersion) -> str:
    """The statement that lists the replicas connected to the server: `SHOW REPLICAS` on
    MySQL 8.0.22 and later (8.4 has no other), `SHOW SLAVE HOSTS` on older MySQL and on
    MariaDB. Both return (Server_id, Host, Port, ...) first."""
    v = version if isinstance(version, ServerVersion) else ServerVersion.parse(version)
    if not v.is_mariadb and v.at_least(8, 0, 22):
        return "SHOW REPLICAS"
    return "SHOW SLAVE HOSTS"


def writes_checksum_algorithm(version: str | ServerVersion) -> bool:
    """Whether the server's Format_description event ends with the checksum algorithm byte
    and a 4-byte checksum (with `binlog_checksum=NONE` too): MySQL 5.6.1 and later
    (libbinlogevents `checksum_version_product`), MariaDB 5.3 and later. The list of
    post-header lengths before them is then exactly as long as the server's event types."""
    v = version if isinstance(version, ServerVersion) else ServerVersion.parse(version)
    return v.at_least(5, 3) if v.is_mariadb else v.at_least(5, 6, 1)
