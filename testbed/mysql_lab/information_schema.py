"""The INFORMATION_SCHEMA tables the product reads, as rows (reference manual,
"INFORMATION_SCHEMA Tables": COLUMNS, TABLES, PROCESSLIST, USER_PRIVILEGES, SCHEMATA; MySQL 8
names their columns in upper case), built from `lab_state.json` and the live sessions."""

from __future__ import annotations

import time
from typing import Any

from testbed.mysql_lab.sessions import Session

# SHOW GRANTS of the lab's account: what the relay needs on MySQL 8 (REPLICATION SLAVE for
# the dump, REPLICATION CLIENT for SHOW BINARY LOGS, XA_RECOVER_ADMIN for XA RECOVER).
DEFAULT_GRANTS = (
    "GRANT SELECT, RELOAD, PROCESS, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `{user}`@`%`",
    "GRANT XA_RECOVER_ADMIN ON *.* TO `{user}`@`%`",
)


def schemas(state: dict[str, Any]) -> list[str]:
    """The schemas of the tables lab_state.json describes."""
    tables = state.get("tables") or {}
    return sorted({name.split(".", 1)[0] for name in tables})


def columns(state: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for qualified, columns in (state.get("tables") or {}).items():
        schema, _, table = qualified.partition(".")
        for i, c in enumerate(columns, 1):
            rows.append(
                {
                    "TABLE_CATALOG": "def",
                    "TABLE_SCHEMA": schema,
                    "TABLE_NAME": table,
                    "COLUMN_NAME": c.get("name"),
                    "ORDINAL_POSITION": int(c.get("ordinal", i)),
                    "COLUMN_DEFAULT": c.get("default"),
                    "IS_NULLABLE": "YES" if c.get("nullable", True) else "NO",
                    "DATA_TYPE": c.get("data_type") or str(c.get("column_type", "")).split("(")[0],
                    "CHARACTER_SET_NAME": c.get("character_set"),
                    "COLUMN_TYPE": c.get("column_type"),
                    "COLUMN_KEY": c.get("key", ""),
                    "EXTRA": c.get("extra", ""),
                }
            )
    return rows


def tables(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "TABLE_CATALOG": "def",
            "TABLE_SCHEMA": q.partition(".")[0],
            "TABLE_NAME": q.partition(".")[2],
            "TABLE_TYPE": "BASE TABLE",
            "ENGINE": "InnoDB",
        }
        for q in (state.get("tables") or {})
    ]


def processlist(sessions: list[Session]) -> list[dict[str, Any]]:
    now = time.monotonic()
    return [
        {
            "ID": s.id,
            "USER": s.user,
            "HOST": f"{s.host}:{s.port}",
            "DB": s.db,
            "COMMAND": s.command,
            "TIME": int(now - s.since),
            "STATE": s.state,
            "INFO": None,
        }
        for s in sessions
    ]


def user_privileges(state: dict[str, Any], user: str) -> list[dict[str, Any]]:
    """The global privileges of SHOW GRANTS's `ON *.*` lines, one row each."""
    rows = []
    for line in grants(state, user):
        if " ON *.*" not in line:
            continue
        head = line[len("GRANT ") : line.index(" ON *.*")]
        for priv in head.split(","):
            rows.append(
                {
                    "GRANTEE": f"'{user}'@'%'",
                    "TABLE_CATALOG": "def",
                    "PRIVILEGE_TYPE": priv.strip(),
                    "IS_GRANTABLE": "NO",
                }
            )
    return rows


def schemata(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"CATALOG_NAME": "def", "SCHEMA_NAME": s, "DEFAULT_CHARACTER_SET_NAME": "utf8mb4"}
        for s in ["information_schema", "mysql", "performance_schema", "sys", *schemas(state)]
    ]


def grants(state: dict[str, Any], user: str) -> list[str]:
    """SHOW GRANTS's lines: lab_state.json's `grants` (`{user}` replaced), else the default."""
    lines = state.get("grants") or DEFAULT_GRANTS
    return [str(line).format(user=user) for line in lines]
