"""Table_map events: a table id -> its layout (connectors/mysql/binlog_table_layout.py),
decoded once per distinct event body; for a watched table whose Table_map lacks column
names or ENUM/SET values (binlog_row_metadata=MINIMAL), those from the `table_columns`
port (connectors/mysql/table_columns.py), checked against the Table_map's types."""

from __future__ import annotations

from cdc.server_version import ServerVersion
from connectors.mysql import table_columns as _table_columns
from connectors.mysql.binlog_column_types import (
    T_BIT,
    T_BLOB,
    T_DATE,
    T_DATETIME,
    T_DATETIME2,
    T_DOUBLE,
    T_ENUM,
    T_FLOAT,
    T_GEOMETRY,
    T_INT24,
    T_JSON,
    T_LONG,
    T_LONGLONG,
    T_NEWDATE,
    T_NEWDECIMAL,
    T_SET,
    T_SHORT,
    T_STRING,
    T_TIME,
    T_TIME2,
    T_TIMESTAMP,
    T_TIMESTAMP2,
    T_TINY,
    T_VARCHAR,
    T_VECTOR,
    T_YEAR,
    TYPE_NAMES,
)
from connectors.mysql.binlog_decode_errors import BinlogDecodeError, ServerSettingRequired
from connectors.mysql.binlog_decoder_state import DecoderState
from connectors.mysql.binlog_event_types import lenenc
from connectors.mysql.binlog_row_code import check_supported
from connectors.mysql.binlog_table_layout import (
    Column,
    RowMetadata,
    Table,
    assign_metadata,
    charset_encoding,
    is_character,
    lacks_metadata,
    parse_column_meta,
    read_optional_metadata,
)

# here, such as MariaDB's inet6 or uuid, is not checked)
_DATA_TYPES = {
    T_TINY: {"tinyint"},
    T_SHORT: {"smallint"},
    T_INT24: {"mediumint"},
    T_LONG: {"int"},
    T_LONGLONG: {"bigint"},
    T_FLOAT: {"float"},
    T_DOUBLE: {"double"},
    T_NEWDECIMAL: {"decimal"},
    T_YEAR: {"year"},
    T_DATE: {"date"},
    T_NEWDATE: {"date"},
    T_TIME: {"time"},
    T_TIME2: {"time"},
    T_DATETIME: {"datetime"},
    T_DATETIME2: {"datetime"},
    T_TIMESTAMP: {"timestamp"},
    T_TIMESTAMP2: {"timestamp"},
    T_VARCHAR: {"varchar", "varbinary"},
    T_STRING: {"char", "binary"},
    T_ENUM: {"enum"},
    T_SET: {"set"},
    T_BIT: {"bit"},
    T_JSON: {"json"},
    T_VECTOR: {"vector"},
    T_BLOB: {"tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob", "json"},
    T_GEOMETRY: {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    },
}
_KNOWN_DATA_TYPES = set().union(*_DATA_TYPES.values())


class TableMapEvents(DecoderState):
    """Table_map events."""

    TABLE_CACHE_LIMIT = 4096

    def _table_map(self, ev: bytes, out: list) -> None:
        key = ev[25 : len(ev) - self.crc]
        tbl = self._layouts.get(key)
        if tbl is None or (tbl.looked_up and tbl.table_id != ev[19:25]):
            tbl = self._parse_table_map(key)
            tbl.table_id = ev[19:25]
            if len(self._layouts) >= self.TABLE_CACHE_LIMIT:
                self._layouts.clear()
            self._layouts[key] = tbl
        self._tables[ev[19:25]] = tbl

    def _parse_table_map(self, body: bytes) -> Table:
        """`body`: the Table_map event body after the 6-byte table id, without CRC."""
        self.table_maps_decoded += 1
        p = 2  # flags
        n = body[p]
        schema = body[p + 1 : p + 1 + n].decode()
        p += 1 + n + 1
        n = body[p]
        table = body[p + 1 : p + 1 + n].decode()
        p += 1 + n + 1
        tbl = Table(schema, table)
        if (schema, table) not in self.watched:
            return tbl
        ncols, p = lenenc(body, p)
        cols = [Column(t) for t in body[p : p + ncols]]
        p += ncols
        meta_len, p = lenenc(body, p)
        q = p
        for c in cols:
            q = parse_column_meta(c, body, q)
        p += meta_len
        nbytes = (ncols + 7) // 8
        nullable = int.from_bytes(body[p : p + nbytes], "little")
        p += nbytes
        for i, c in enumerate(cols):
            c.nullable = bool(nullable & (1 << i))
        meta = read_optional_metadata(cols, body, p, len(body))
        if self.table_columns is not None and lacks_metadata(cols, meta):
            self._look_up(tbl, cols, meta)
        assign_metadata(cols, meta, self.dbms)
        tbl.columns = cols
        tbl.ncols = ncols
        tbl.head = 1 + ((ncols + 7) >> 3) if ncols < 251 else 0
        tbl.names = tuple(c.name for c in cols)
        tbl.json_columns = tuple(i for i, c in enumerate(cols) if c.type == T_JSON)
        check_supported(tbl)
        return tbl

    def _look_up(self, tbl: Table, cols: list[Column], meta: RowMetadata) -> None:
        """Column names and ENUM/SET values the Table_map lacks (binlog_row_metadata=MINIMAL),
        from the `table_columns` port (connectors/mysql/table_columns.py)."""
        assert self.table_columns is not None
        tbl.looked_up = True
        try:
            defs = list(self.table_columns(tbl.schema, tbl.table))
        except _table_columns.TableColumnsError as exc:
            raise BinlogDecodeError(str(exc)) from None
        if ServerVersion.parse(self.server_version or "").at_least(8, 0, 1) or self.dbms != "mysql":
            fix = (
                "so the column names and ENUM/SET values of the binlog's rows cannot be known: set "
                "binlog_row_metadata=FULL on the server (the binlog then carries them), then restart the relay"
            )
        else:  # MySQL before 8.0.1 has no binlog_row_metadata: its Table_maps never carry names
            fix = (
                f"so the column names of the binlog's rows cannot be known (MySQL {self.server_version} has no "
                "binlog_row_metadata; names come from information_schema): do not ALTER an outbox table while the "
                "relay is behind it (let it catch up first), or move to MySQL 8.0.1+, whose binlog can carry the names"
            )
        where = f"{tbl.schema}.{tbl.table}"
        if len(defs) != len(cols):
            raise ServerSettingRequired(
                f"{where} has {len(defs)} columns in information_schema.COLUMNS but {len(cols)} in the binlog's "
                f"Table_map (the table was altered after the event was written), {fix}"
            )
        for c, d in zip(cols, defs, strict=True):
            want = _DATA_TYPES.get(c.type)
            if d.data_type in _KNOWN_DATA_TYPES and want is not None and d.data_type not in want:
                raise ServerSettingRequired(
                    f"column {d.name!r} of {where} is {d.data_type} in information_schema.COLUMNS but of binlog type "
                    f"{c.type} ({TYPE_NAMES.get(c.type, 'unknown')}) in the Table_map (the table was altered after "
                    f"the event was written), {fix}"
                )
        meta.names = [d.name for d in defs]
        if meta.enum_values is None:
            meta.enum_values = [list(d.values or ()) for c, d in zip(cols, defs, strict=True) if c.type == T_ENUM]
        if meta.set_values is None:
            meta.set_values = [list(d.values or ()) for c, d in zip(cols, defs, strict=True) if c.type == T_SET]
        if meta.unsigned is None:
            meta.unsigned = [d.unsigned for d in defs]
        if meta.charsets is None:
            meta.encodings = [
                charset_encoding(d.charset) for c, d in zip(cols, defs, strict=True) if is_character(c.type, self.dbms)
            ]
