"""What `source.decoder = "library"` (python-mysql-replication 1.0.17) makes of stored values,
put back to what MySQL stores, as the default decoder (connectors/mysql/binlog_decoder.py)
publishes them (docs/mysql.md, "Zero-like values"):

* MySQL JSON: the library parses it into Python values (keys and strings as bytes, DECIMALs
  as strings, the JSON literal `null` as None, indistinguishable from SQL NULL) and the relay
  published their compact dump. `use_mysql_json_text` makes the library hand a JSON
  column's bytes to connectors/mysql/json_binary.py, which prints MySQL's text.
* SET: the library gives a Python set of the names, and None for the empty set (its
  none_sources says "empty set"): MySQL's text, the names in definition order joined by
  commas (`SELECT set_col`), '' for the empty set.
* YEAR 0000 (byte 0): the library adds 1900 to every byte, so 0 came out as 1900, which no
  other byte gives (1..255 are 1901..2155): 0.
* A TIMESTAMP of 0 seconds (MySQL's zero datetime): the library gives 1970-01-01 00:00:00,
  which no valid TIMESTAMP is (the range starts at 00:00:01 UTC): MySQL's text.

What it cannot put back: a zero or partly-zero DATE / DATETIME (`0000-00-00`, `2024-00-00`):
the library gives None and keeps nothing of the value. `cdc check` says so for the watched
tables' date columns when this decoder is chosen (connectors/mysql/preflight.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pymysqlreplication.binlogstream as _binlogstream
from pymysqlreplication.packet import BinLogPacketWrapper

from cdc.errors import SourceError
from connectors.mysql.temporal_text import zero_timestamp

__all__ = ["LibraryValues", "MysqlJsonPacket", "use_mysql_json_text"]

_TIMESTAMP, _TIMESTAMP2, _YEAR, _SET = 7, 17, 13, 248
_EPOCH = datetime.datetime(1970, 1, 1)


class MysqlJsonPacket(BinLogPacketWrapper):
    """The library's packet, reading a whole (not partial) MySQL JSON value as MySQL's text."""

    def read_binary_json(self, size: int, is_partial: bool) -> Any:
        if is_partial:  # a partial update's diff: the library's own reading
            return super().read_binary_json(size, is_partial)
        from connectors.mysql import json_binary

        data = bytes(self.read(self.read_uint_by_size(size)))
        try:
            return json_binary.document_text(data)  # b"" is MySQL's JSON null too: "null"
        except json_binary.JsonDecodeError as exc:
            raise SourceError(f"a JSON column holds a value MySQL's binary JSON format cannot hold: {exc}") from None


def use_mysql_json_text() -> None:
    """Make the library's stream build its events from `MysqlJsonPacket` (the stream looks the
    class up in its module on each event). Set where the relay opens the library's stream,
    as this module's import already empties its expected error codes (binlog_library.py)."""
    _binlogstream.BinLogPacketWrapper = MysqlJsonPacket  # the library module global the stream calls


class LibraryValues:
    """Per rows event, a function that mends a row's values, or None when the table has no
    column whose values the library changes (the usual outbox table: no cost per row)."""

    def __init__(self) -> None:
        # by the identity of the table's column list, which the entry keeps alive (so its id
        # is never reused while the entry is here)
        self._plans: dict[int, tuple[list[Any], tuple[tuple[str, int, Any], ...]]] = {}

    def mender(self, ev: Any) -> Callable[[dict[str, Any], str], dict[str, Any]] | None:
        columns = ev.columns
        entry = self._plans.get(id(columns))
        if entry is None or entry[0] is not columns:
            if len(self._plans) > 1024:
                self._plans.clear()
            entry = self._plans[id(columns)] = (columns, _plan(columns))
        fixes = entry[1]
        if not fixes:
            return None

        def mend(row: dict[str, Any], key: str) -> dict[str, Any]:
            values = row[key]
            nones = row.get("after_none_sources" if key == "after_values" else "none_sources") or {}
            for name, kind, arg in fixes:
                value = values.get(name)
                if kind == _SET:
                    if value is None and nones.get(name) == "empty set":
                        values[name] = ""
                    elif isinstance(value, set):
                        values[name] = ",".join([n for n in arg if n in value])
                elif kind == _YEAR:
                    if value == 1900:
                        values[name] = 0
                elif type(value) is datetime.datetime and value.replace(microsecond=0) == _EPOCH:
                    values[name] = zero_timestamp(arg)
            return values

        return mend


def _plan(columns: list[Any]) -> tuple[tuple[str, int, Any], ...]:
    """(name, type, fsp or a SET's names) of the columns whose values the library changes. A
    SET without its value names (binlog_row_metadata=MINIMAL) is None for every bitmask:
    left alone."""
    return tuple(
        (c.name, c.type, c.set_values if c.type == _SET else getattr(c, "fsp", 0) or 0)
        for c in columns
        if c.type in (_TIMESTAMP, _TIMESTAMP2, _YEAR) or (c.type == _SET and getattr(c, "set_values", None))
    )
