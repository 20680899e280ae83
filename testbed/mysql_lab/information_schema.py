"""The INFORMATION_SCHEMA tables the product reads, as rows (reference manual,
"INFORMATION_SCHEMA Tables": COLUMNS, COLLATIONS, TABLES, PROCESSLIST, USER_PRIVILEGES, SCHEMATA; MySQL 8
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


# information_schema.COLLATIONS as MySQL 8.4 / 9.x list them (ID, the number a Table_map's
# charset metadata carries; strings/collations in MySQL's source: strings/ctype-*.cc), the
# ones the lab's tables use; a character set's default collation in MySQL 8 first.
COLLATIONS = (
    ("utf8mb4_0900_ai_ci", "utf8mb4", 255, "Yes"),
    ("utf8mb4_general_ci", "utf8mb4", 45, ""),
    ("utf8mb4_bin", "utf8mb4", 46, ""),
    ("utf8mb3_general_ci", "utf8mb3", 33, "Yes"),
    ("utf8mb3_bin", "utf8mb3", 83, ""),
    ("latin1_swedish_ci", "latin1", 8, "Yes"),
    ("latin1_bin", "latin1", 47, ""),
    ("ascii_general_ci", "ascii", 11, "Yes"),
    ("binary", "binary", 63, "Yes"),
)
_DEFAULT_COLLATION = {charset: name for name, charset, _, default in COLLATIONS if default}


def collations() -> list[dict[str, Any]]:
    return [
        {"COLLATION_NAME": name, "CHARACTER_SET_NAME": charset, "ID": cid, "IS_DEFAULT": default}
        for name, charset, cid, default in COLLATIONS
    ]


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
                    # BLOB / VARBINARY columns have neither (NULL), as in MySQL
                    "CHARACTER_SET_NAME": None if c.get("character_set") == "binary" else c.get("character_set"),
                    "COLLATION_NAME": c.get("collation") or _DEFAULT_COLLATION.get(c.get("character_set") or "")
                    if c.get("character_set") not in (None, "binary")
                    else None,
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


# MySQL 5.7's SHOW GRANTS of the same account, as 5.7 prints it: the user and host in
# single quotes (8.0 prints backquotes) and no XA_RECOVER_ADMIN (a dynamic privilege of
# 8.0.19; on 5.7 any user may run XA RECOVER).
MYSQL57_GRANTS = ("GRANT SELECT, RELOAD, PROCESS, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'",)


def grants(state: dict[str, Any], user: str) -> list[str]:
    """SHOW GRANTS's lines: lab_state.json's `grants` (`{user}` replaced), else the default
    of the lab's version."""
    version = str(state.get("server_version") or "8")
    lines = state.get("grants") or (MYSQL57_GRANTS if version.startswith("5.") else DEFAULT_GRANTS)
    return [str(line).format(user=user) for line in lines]
