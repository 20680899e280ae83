"""What the binlog decoder's event families share: the state of the stream being read
(the current file, the checksum's size, the Format_description's post-header lengths, the
table ids and layouts) and the dispatch table. `BinlogDecoder.__init__`
(connectors/mysql/binlog_decoder.py) sets every field; each family's handlers
(connectors/mysql/binlog_*_events.py, binlog_table_map.py, binlog_rows.py) are methods of
a class based on this one, so a handler reads the state as `self.<field>` as it did when
they were one class: no extra call or look-up per event."""

from __future__ import annotations

from typing import Any

from connectors.mysql import table_columns as _table_columns
from connectors.mysql.binlog_table_layout import Table


class DecoderState:
    """The fields of `BinlogDecoder` its handlers read and write (documented where
    `BinlogDecoder.__init__` sets them)."""

    watched: set[tuple[str, str]]
    table_columns: _table_columns.TableColumns | None
    file: str
    dbms: str
    _flavor_fixed: bool
    legacy_begin_start: bool
    verify_checksum: bool
    crc: int
    _crc_known: bool
    post_header: bytes
    _ph_query: int
    _ph_load_query: int
    _ph_table_map: int
    _ph_rows_v1: int
    _ph_rows_v2: int
    _ph_compressed_rows: dict[int, int]
    skippable_rows: frozenset[int]
    server_version: str | None
    _tables: dict[bytes, Table]
    _layouts: dict[bytes, Table]
    table_maps_decoded: int
    _handlers: dict[int, Any]
    _known_handlers: dict[int, Any]
    _get_handler: Any

    def _begin_start(self, size: int, log_pos: int) -> int:
        """Where the event of `size` bytes ending at `log_pos` starts: a TxBegin's start, of a
        GTID event or a Query's BEGIN (`legacy_begin_start`: see connectors/mysql/binlog_decoder.py)."""
        if self.legacy_begin_start:
            return log_pos - (size - 19 - self.crc)
        return log_pos - size
