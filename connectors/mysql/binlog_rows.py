"""Rows events of the watched tables: Write_rows (v1, v2) through the table's generated
inserters, Update_rows and Delete_rows (v1, v2) through its generated row readers
(connectors/mysql/binlog_row_code.py), and MySQL's Partial_update_rows (partial JSON
updates; connectors/mysql/json_diff.py and json_binary.py, imported at the first one).
A rows event of a table that is not watched is dropped after one look-up."""

from __future__ import annotations

from typing import Any

from cdc.position import unchecked_position as _pos  # the file name is validated once per Rotate
from cdc.source_events import RowChange
from connectors.mysql.binlog_decode_errors import BinlogDecodeError, ServerSettingRequired
from connectors.mysql.binlog_decoder_state import DecoderState
from connectors.mysql.binlog_event_types import U16, U32, lenenc
from connectors.mysql.binlog_row_code import make_inserter, make_reader
from connectors.mysql.binlog_table_layout import Table
from connectors.mysql.binlog_value_readers import Diffs


class RowsEvents(DecoderState):
    """Write_rows, Update_rows, Delete_rows (v1, v2) and Partial_update_rows events."""

    def _rows_start(self, ev: bytes, v2: bool) -> int:
        if v2:
            extra = U16(ev, 19 + 8)[0]
            return 19 + self._ph_rows_v2 + extra - 2
        return self._v1_start(ev)

    def _v1_start(self, ev: bytes) -> int:
        """Where a v1 rows event's body starts; refused when the server has no v1 rows events."""
        ph = self._ph_rows_v1
        if not ph:
            raise BinlogDecodeError(
                f"a rows event of event type {ev[4]} ending at {self.file}:{U32(ev, 13)[0]}, a type server "
                f"{self.server_version} does not have (its Format_description gives it post-header length 0)"
            )
        return 19 + ph

    def _write_v1(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        self._inserts(ev, out, tbl, self._v1_start(ev))

    def _write_v2(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        self._inserts(ev, out, tbl, self._rows_start(ev, True))

    def _inserts(self, ev: bytes, out: list, tbl: Table, p: int) -> None:
        # The column count and the columns-present bitmap (sql/log_event.h, Rows_log_event:
        # "m_width" as a packed integer, then "m_cols") are the same bytes on every rows event
        # of a table in practice: those bytes, sliced by the Table_map's count, name the
        # inserter (`Table.inserters`), one look-up instead of parsing them per event.
        insert = tbl.inserters.get(ev[p : p + tbl.head])
        if insert is None:
            insert, p = self._inserter(ev, tbl, p)
        else:
            p += tbl.head
        insert(ev, p, len(ev) - self.crc, self.file, U32(ev, 13)[0], out.append)

    def _inserter(self, ev: bytes, tbl: Table, p: int) -> tuple[Any, int]:
        """The inserter of a Write_rows event's bitmap at ev[p:], and where its rows start."""
        start = p
        ncols = ev[p]
        if ncols >= 251:
            ncols, p = lenenc(ev, p)
        else:
            p += 1
        nb = (ncols + 7) >> 3
        present = ev[p : p + nb]
        p += nb
        inserters = tbl.inserters
        insert = inserters.get((ncols, present))
        if insert is None:
            insert = inserters[(ncols, present)] = make_inserter(tbl, present)
            if ncols == tbl.ncols and ncols < 251:
                # the key `_inserts` slices: 1 + nb bytes (a Table_map's count below 251
                # is one byte; a rows event of another width never starts with that byte)
                inserters[ev[start:p]] = insert
        return insert, p

    def _update_v1(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, self._v1_start(ev), True)

    def _update_v2(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, None, True)

    def _delete_v1(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, self._v1_start(ev), False)

    def _delete_v2(self, ev: bytes, out: list) -> None:
        self._changes(ev, out, None, False)

    def _changes(self, ev: bytes, out: list, p: int | None, update: bool) -> None:
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        if p is None:
            p = self._rows_start(ev, True)
        ncols, p = lenenc(ev, p)
        nb = (ncols + 7) >> 3
        present = ev[p : p + nb]
        p += nb
        readers = tbl.readers
        reader = readers.get(present)
        if reader is None:
            reader = readers[present] = make_reader(tbl, present)
        after = reader
        if update:
            present2 = ev[p : p + nb]
            p += nb
            after = readers.get(present2)
            if after is None:
                after = readers[present2] = make_reader(tbl, present2)
        stop = len(ev) - self.crc
        end = _pos(self.file, U32(ev, 13)[0])
        kind = "update" if update else "delete"
        schema, table = tbl.schema, tbl.table
        while p < stop:
            values, p = reader(ev, p)
            if update:
                values, p = after(ev, p)
            out.append(RowChange(kind, schema, table, values, end))

    def _partial_update(self, ev: bytes, out: list) -> None:
        """Partial_update_rows (type 39, binlog_row_value_options=PARTIAL_JSON): as
        Update_rows v2, but each after image starts with value_options (a packed integer:
        1 = PARTIAL_JSON) and, when it is 1, one bit per JSON column of the table (in
        column order, low bit first) saying whether that column's value is a list of diffs
        (MySQL sql/rpl_record.cc pack_row / start_partial_bit_reader). The diffs are applied
        to the before image's document (connectors/mysql/json_diff.py), so the row change is the
        same UPDATE an Update_rows event with the whole document gives."""
        tbl = self._tables.get(ev[19:25])
        if tbl is None or tbl.columns is None:
            return
        from connectors.mysql import json_binary as _mysql_json

        p = self._rows_start(ev, True)
        ncols, p = lenenc(ev, p)
        nb = (ncols + 7) >> 3
        before_present, after_present = ev[p : p + nb], ev[p + nb : p + 2 * nb]
        p += 2 * nb
        readers = tbl.readers
        no_partial: frozenset[int] = frozenset()
        before_reader = readers.get((before_present, no_partial))
        if before_reader is None:
            before_reader = readers[(before_present, no_partial)] = make_reader(tbl, before_present, no_partial)
        json_columns = tbl.json_columns
        stop = len(ev) - self.crc
        end = _pos(self.file, U32(ev, 13)[0])
        while p < stop:
            before, p = before_reader(ev, p)
            options, p = lenenc(ev, p)
            if options > 1:
                raise BinlogDecodeError(
                    f"malformed Partial_update_rows event ending at {self.file}:{end.pos} (value options {options})"
                )
            partial = no_partial
            if options:
                jb = (len(json_columns) + 7) >> 3
                bits = int.from_bytes(ev[p : p + jb], "little")
                p += jb
                partial = frozenset(i for k, i in enumerate(json_columns) if bits >> k & 1)
            key = (after_present, partial)
            after_reader = readers.get(key)
            if after_reader is None:
                after_reader = readers[key] = make_reader(tbl, after_present, partial)
            after, p = after_reader(ev, p)
            for i in json_columns:
                name = tbl.names[i]
                value = after[name]
                if type(value) is Diffs:
                    value = self._apply_diffs(tbl, i, before_present, before[name], value, end)
                if value is not None:
                    after[name] = _mysql_json.text(value)
            out.append(RowChange("update", tbl.schema, tbl.table, after, end))

    def _apply_diffs(self, tbl: Table, i: int, before_present: bytes, doc: Any, diffs: Diffs, end) -> Any:
        from connectors.mysql import json_diff as _json_diff

        name = tbl.names[i]
        where = f"column {name!r} of {tbl.schema}.{tbl.table} in the Partial_update_rows event ending at {end}"
        if not before_present[i >> 3] & (1 << (i & 7)):
            raise ServerSettingRequired(
                f"{where} changes a JSON document the before image does not hold, so its new value cannot be "
                "rebuilt: set binlog_row_image=FULL on the server (or binlog_row_value_options='' to log whole "
                "documents)"
            )
        if doc is None:
            raise BinlogDecodeError(f"{where}: a partial update of a NULL document, which MySQL never writes")
        try:
            return _json_diff.apply_diffs(doc, diffs.diffs)
        except _json_diff.JsonDiffError as exc:
            raise BinlogDecodeError(f"{where}: {exc}") from None
