"""What a Table_map written with `binlog_row_metadata=MINIMAL` (MySQL's default) leaves out:
column names and ENUM / SET value names, looked up in `information_schema.COLUMNS`.

A row event holds an ENUM's index and a SET's bitmask; only `binlog_row_metadata=FULL`
puts the names of the columns and of the values in the Table_map. Without them the
decoder (connectors/mysql/binlog_table_map.py) asks a `TableColumns` port, for a watched table
only, once per table id and Table_map: `(schema, table) -> [ColumnDefinition]` in
ordinal order. `InformationSchemaColumns` answers from the server; a test passes a
function. The answer describes the table as it is now: when it no longer matches the
Table_map (column count or types: the table was altered after the event was written),
the decoder stops and names `binlog_row_metadata=FULL` as the fix.

`COLUMN_TYPE` writes an ENUM / SET's values as SHOW CREATE TABLE does (MySQL
`sql/sql_show.cc` append_unescaped, called by Field_enum::sql_type): each in single
quotes, a quote doubled, a backslash, NUL, newline and carriage return escaped with a
backslash; `parse_column_type` reads them back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ColumnDefinition", "InformationSchemaColumns", "TableColumns", "TableColumnsError", "parse_column_type"]


class TableColumnsError(Exception):
    """The columns of a table could not be read (the server did not answer, the table is gone)."""


@dataclass(frozen=True)
class ColumnDefinition:
    """One column as information_schema.COLUMNS describes it."""

    name: str
    data_type: str  # DATA_TYPE, lower case: "int", "enum", "varchar", ...
    unsigned: bool = False
    charset: str | None = None  # CHARACTER_SET_NAME; None for non-character columns
    values: tuple[str, ...] | None = None  # an ENUM's or SET's value names, in order


TableColumns = Callable[[str, str], Sequence[ColumnDefinition]]

_UNESCAPE = {"0": "\0", "n": "\n", "r": "\r", "\\": "\\", "'": "'", "Z": "\x1a"}


def parse_column_type(column_type: str) -> tuple[tuple[str, ...] | None, bool]:
    """`enum('a','it''s')` -> (("a", "it's"), False); `int(10) unsigned` -> (None, True)."""
    lowered = column_type.lower()
    unsigned = " unsigned" in lowered
    if not (lowered.startswith("enum(") or lowered.startswith("set(")):
        return None, unsigned
    s = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    values: list[str] = []
    i = 0
    while i < len(s):
        if s[i] != "'":
            i += 1  # the commas between values
            continue
        i += 1
        out = []
        while i < len(s):
            c = s[i]
            if c == "'" and i + 1 < len(s) and s[i + 1] == "'":
                out.append("'")
                i += 2
            elif c == "'":
                i += 1
                break
            elif c == "\\" and i + 1 < len(s):
                out.append(_UNESCAPE.get(s[i + 1], s[i + 1]))
                i += 2
            else:
                out.append(c)
                i += 1
        values.append("".join(out))
    return tuple(values), unsigned


_QUERY = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION"
)


class InformationSchemaColumns:
    """`TableColumns` from the server's information_schema, over one connection opened
    on first use with the source's connection settings (connectors/mysql/client.py)."""

    def __init__(self, settings: Mapping[str, Any]):
        self._settings = dict(settings)
        self._conn: Any = None

    def __call__(self, schema: str, table: str) -> list[ColumnDefinition]:
        import pymysql

        from connectors.mysql.client import connect
        from connectors.mysql.errors import error_text

        try:
            if self._conn is None:
                self._conn = connect(self._settings)
            with self._conn.cursor() as cur:
                cur.execute(_QUERY, (schema, table))
                rows = cur.fetchall()
        except (pymysql.err.MySQLError, OSError) as exc:
            self.close()
            raise TableColumnsError(
                f"cannot read the columns of {schema}.{table} from information_schema.COLUMNS: {error_text(exc)}"
            ) from None
        if not rows:
            raise TableColumnsError(f"information_schema.COLUMNS has no columns for {schema}.{table}")
        out = []
        for name, data_type, column_type, charset in rows:
            values, unsigned = parse_column_type(_text(column_type))
            out.append(
                ColumnDefinition(_text(name), _text(data_type).lower(), unsigned, charset and _text(charset), values)
            )
        return out

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection can fail; nothing to recover
                pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
