"""What the binlog decoder (connectors/mysql/binlog_decoder.py) raises.

BinlogDecodeError            an event could not be decoded
├── UnsupportedColumnType    a watched table has a column type the decoder does not read
├── ServerSettingRequired    the binlog lacks what a watched table needs: a server setting must change
└── UndecodableEvent         an event cannot be decoded exactly (corrupt or unknown compression)
"""

from __future__ import annotations

from connectors.mysql.binlog_column_types import TYPE_NAMES


class BinlogDecodeError(Exception):
    """A binlog event could not be decoded."""


class UnsupportedColumnType(BinlogDecodeError):
    """A watched table has a column whose type this decoder does not decode."""

    def __init__(self, schema: str, table: str, column: str, type_code: int, detail: str = ""):
        self.schema, self.table, self.column, self.type_code = schema, table, column, type_code
        name = TYPE_NAMES.get(type_code, "unknown")
        super().__init__(
            f"column {column!r} of {schema}.{table} has type {type_code} ({name}) which the fast binlog decoder "
            f"does not decode{': ' + detail if detail else ''}; use python-mysql-replication for this table"
        )


class ServerSettingRequired(BinlogDecodeError):
    """The binlog lacks what decoding a watched table needs (a before image without the
    column a partial JSON update changes, ENUM/SET metadata that no longer matches the
    table): a server setting must change; the message names it."""


class UndecodableEvent(BinlogDecodeError):
    """An event that cannot be decoded exactly (a corrupt compressed event, an unknown
    compression algorithm): reading on would lose its rows. A person must act."""
