"""System variables of the lab server: MySQL 8.4's defaults for what clients ask, with
`lab_state.json`'s values over them (reference manual, "Server System Variables"); as an
older version, without the variables it does not have (error 1193 when asked) and with
5.7's defaults where they differ."""

from __future__ import annotations

from typing import Any

from testbed.mysql_lab.binlog_dir import BinlogDir

DEFAULT_VERSION = "8.4.3"

# MySQL 8.4's defaults for what the clients ask; lab_state.json's "variables" override.
GLOBAL_DEFAULTS: dict[str, Any] = {
    "autocommit": "ON",
    "binlog_checksum": "CRC32",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "MINIMAL",
    "binlog_row_value_options": "",
    "binlog_transaction_compression": "OFF",
    "character_set_client": "utf8mb4",
    "character_set_connection": "utf8mb4",
    "character_set_results": "utf8mb4",
    "character_set_server": "utf8mb4",
    "collation_connection": "utf8mb4_0900_ai_ci",
    "collation_server": "utf8mb4_0900_ai_ci",
    "enforce_gtid_consistency": "OFF",
    "gtid_mode": "OFF",
    "hostname": "mysql-lab",
    "interactive_timeout": 28800,
    "log_bin": "ON",
    "log_bin_basename": "",
    "log_replica_updates": "ON",
    "lower_case_table_names": 0,
    "max_allowed_packet": 67108864,
    "net_read_timeout": 30,
    "net_write_timeout": 60,
    "sql_mode": "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
    "system_time_zone": "UTC",
    "time_zone": "SYSTEM",
    "transaction_isolation": "REPEATABLE-READ",
    "version_comment": "MySQL Community Server - GPL",
    "version_compile_os": "Linux",
    "wait_timeout": 28800,
}
BOOLEAN_VARIABLES = {"autocommit", "log_bin", "binlog_transaction_compression", "log_replica_updates", "sql_log_bin"}
SESSION_ONLY = {"autocommit", "sql_mode", "time_zone", "wait_timeout", "interactive_timeout", "net_read_timeout",
                "net_write_timeout", "character_set_client", "character_set_connection", "character_set_results",
                "collation_connection", "transaction_isolation", "sql_log_bin", "binlog_format",
                "max_execution_time", "lock_wait_timeout", "innodb_lock_wait_timeout"}  # fmt: skip


def server_version(d: BinlogDir, default: str) -> str:
    """The version the lab is (lab_state.json's, else the one it was started as)."""
    return str(d.state().get("server_version") or default)


def version_tuple(version: str) -> tuple[int, int, int]:
    nums = []
    for part in version.split("-")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        nums.append(int(digits or 0))
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


# Variables the product asks about and the version that added them (reference manual,
# each variable's "Introduced"): an older server answers error 1193 for them.
INTRODUCED: dict[str, tuple[int, int, int]] = {
    "binlog_row_metadata": (8, 0, 1),
    "binlog_row_value_options": (8, 0, 3),
    "binlog_transaction_compression": (8, 0, 20),
    "log_replica_updates": (8, 0, 26),
}
# MySQL 5.7's defaults where 8.0 changed them (reference manual 5.7, "Server System
# Variables"): latin1 for the server, utf8mb4's default collation utf8mb4_general_ci (5.7
# has no utf8mb4_0900_ai_ci), NO_AUTO_CREATE_USER in sql_mode (8.0 removed it).
MYSQL57_DEFAULTS: dict[str, Any] = {
    "character_set_server": "latin1",
    "collation_server": "latin1_swedish_ci",
    "collation_connection": "utf8mb4_general_ci",
    "sql_mode": "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
    "ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
    "version_comment": "MySQL Community Server (GPL)",
}


def known_at(name: str, version: tuple[int, int, int]) -> bool:
    """Whether the lab as `version` answers the variable `name`. log_slave_updates is the
    only name before 8.0.26; later servers keep it as a deprecated alias of
    log_replica_updates, which the lab answers only by the new name (as before)."""
    if name == "log_slave_updates":
        return version < INTRODUCED["log_replica_updates"]
    return version >= INTRODUCED.get(name, (0, 0, 0))


def global_variables(d: BinlogDir, default_version: str) -> dict[str, Any]:
    state = d.state()
    version = version_tuple(server_version(d, default_version))
    out = dict(GLOBAL_DEFAULTS)
    if version < (8, 0, 0):
        out.update(MYSQL57_DEFAULTS)
    out["log_slave_updates"] = out["log_replica_updates"]
    out.update({k.lower(): v for k, v in (state.get("variables") or {}).items()})
    out = {k: v for k, v in out.items() if known_at(k, version)}
    server_uuid = state.get("server_uuid") or out.get("server_uuid") or ""
    out.update(
        {
            "version": server_version(d, default_version),
            "server_id": int(state.get("server_id", out.get("server_id", 1))),
            "server_uuid": server_uuid,
            "gtid_executed": state.get("gtid_executed", out.get("gtid_executed", "")),
            "gtid_purged": state.get("gtid_purged", out.get("gtid_purged", "")),
            "log_bin_basename": str(d.path / "binlog"),
            "log_bin_index": str(d.path / "binlog.index"),
        }
    )
    return out
