"""Code generation for row images: for a watched table, one Python function per (table
layout, columns-present bitmap) that decodes a whole row image with inlined per-column
code and builds the values dict with a dict display (`make_reader`), and for Write_rows
one that also builds each `RowInsert` (`make_inserter`). Generated once, kept in the
table's layout (connectors/mysql/binlog_table_layout.py)."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from cdc.source_events import RowInsert
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
)
from connectors.mysql.binlog_decode_errors import UnsupportedColumnType
from connectors.mysql.binlog_table_layout import Column, Table
from connectors.mysql.binlog_value_readers import (
    datetime2_text,
    decimal_reader,
    diffs_reader,
    fsp_size,
    json_reader,
    read_date,
    read_datetime2_slow,
    read_datetime_old,
    read_time2,
    read_time_old,
    read_timestamp,
    read_timestamp2,
)

_new = object.__new__
_datetime = datetime.datetime
_utcfromtimestamp = datetime.datetime.utcfromtimestamp


_GLOBALS_BASE = {
    "_u16": struct.Struct("<H").unpack_from,
    "_i16": struct.Struct("<h").unpack_from,
    "_u32": struct.Struct("<I").unpack_from,
    "_i32": struct.Struct("<i").unpack_from,
    "_u64": struct.Struct("<Q").unpack_from,
    "_i64": struct.Struct("<q").unpack_from,
    "_f32": struct.Struct("<f").unpack_from,
    "_f64": struct.Struct("<d").unpack_from,
    "_be40": struct.Struct(">IB").unpack_from,
    "_be64": struct.Struct(">Q").unpack_from,
    "_from_bytes": int.from_bytes,
    "_datetime": _datetime,
    "_read_time2": read_time2,
    "_read_date": read_date,
    "_read_time_old": read_time_old,
    "_read_datetime_old": read_datetime_old,
    "_read_timestamp2": read_timestamp2,
    "_read_datetime2_slow": read_datetime2_slow,
    "_datetime2_text": datetime2_text,
    "_read_timestamp": read_timestamp,
    "_utcfromtimestamp": _utcfromtimestamp,
}


def _uint_expr(size: int) -> str:
    """Little-endian unsigned int of `size` bytes at b[p]."""
    if size == 1:
        return "b[p]"
    if size == 2:
        return "(b[p] | (b[p + 1] << 8))"
    if size == 3:
        return "(b[p] | (b[p + 1] << 8) | (b[p + 2] << 16))"
    if size == 4:
        return "_u32(b, p)[0]"
    if size == 8:
        return "_u64(b, p)[0]"
    return f"_from_bytes(b[p:p + {size}], 'little')"


def _column_code(i: int, c: Column, schema: str, table: str, g: dict[str, Any]) -> list[str]:
    """Lines that set v{i} from b[p:] and advance p (4-space indented, no null check)."""
    t, m, v = c.type, c.meta, f"v{i}"
    u = c.unsigned
    if t == T_TINY:
        return [f"{v} = b[p]", "p += 1"] if u else [f"{v} = b[p]", f"if {v} > 127: {v} -= 256", "p += 1"]
    if t == T_SHORT:
        return [f"{v} = {'_u16' if u else '_i16'}(b, p)[0]", "p += 2"]
    if t == T_INT24:
        lines = [f"{v} = b[p] | (b[p + 1] << 8) | (b[p + 2] << 16)"]
        if not u:
            lines.append(f"if {v} >= 0x800000: {v} -= 0x1000000")
        return lines + ["p += 3"]
    if t == T_LONG:
        return [f"{v} = {'_u32' if u else '_i32'}(b, p)[0]", "p += 4"]
    if t == T_LONGLONG:
        return [f"{v} = {'_u64' if u else '_i64'}(b, p)[0]", "p += 8"]
    if t == T_FLOAT:
        return [f"{v} = _f32(b, p)[0]", "p += 4"]
    if t == T_DOUBLE:
        return [f"{v} = _f64(b, p)[0]", "p += 8"]
    if t == T_YEAR:
        # byte 0 is YEAR 0000 (MySQL's zero year), not 1900 as the library reads it
        return [f"{v} = b[p] + 1900 if b[p] else 0", "p += 1"]
    if t in (T_VARCHAR, T_STRING, T_BLOB):
        size = m["length_size"] if t == T_BLOB else (2 if m["max_length"] > 255 else 1)
        if size not in (1, 2, 3, 4):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"length size {size}")
        lines = [f"n = {_uint_expr(size)}", f"p += {size}"]
        if c.encoding is None:
            # The library "decodes" with a codec Python lacks ('binary') and keeps the
            # bytes on LookupError, but bytes.decode() of b"" never looks the codec up:
            # an empty binary value comes out as "" (mirrored).
            lines.append(f"{v} = b[p:p + n] if n else ''")
        elif c.encoding == "utf-8":
            # bytes.decode() with no argument is UTF-8 (strict) as well, and skips parsing
            # the codec argument: 195 -> 113 ns a value (36 bytes, timeit on this machine),
            # about 0.4 us on an outbox row of five text columns.
            lines.append(f"{v} = b[p:p + n].decode()")
        else:
            lines.append(f"{v} = b[p:p + n].decode({c.encoding!r})")
        return lines + ["p += n"]
    if t in (T_GEOMETRY, T_VECTOR):
        # a VECTOR's value is MySQL's own bytes: float32s, little-endian (published as bytes)
        size = m["length_size"]
        return [f"n = {_uint_expr(size)}", f"p += {size}", f"{v} = b[p:p + n]", "p += n"]
    if t == T_JSON:
        size = m["length_size"]
        g[f"_json{i}"] = json_reader(schema, table, c.name)
        return [f"n = {_uint_expr(size)}", f"p += {size}", f"{v} = _json{i}(b[p:p + n])", "p += n"]
    if t == T_NEWDECIMAL:
        size, reader = decimal_reader(m["precision"], m["decimals"])
        g[f"_dec{i}"] = reader
        return [f"{v} = _dec{i}(b[p:p + {size}])", f"p += {size}"]
    if t == T_DATETIME2:
        fsp = m["fsp"]
        fs = fsp_size(fsp)
        if fsp == 6:
            # The 5 bytes of date and time and the 3 of the fraction as one big-endian
            # 64-bit read (the general path below slices the fraction out and calls
            # int.from_bytes with keywords): 1.40 -> 0.73 us a value (timeit, loaded
            # machine); the usual outbox `created_at DATETIME(6)` is one a row. The fraction
            # is signed (0x800000 and up: negative, ignored as below); 1000000..0x7FFFFF
            # raises as the library's replace(microsecond=) does.
            return [
                "d = _be64(b, p)[0]",
                "us = d & 0xFFFFFF",
                "if us > 999999:",
                "    if us < 0x800000: raise ValueError('microsecond must be in 0..999999')",
                "    us = 0",
                "d >>= 24",
                "ym = (d >> 22) & 0x1FFFF",
                "try:",
                f"    {v} = _datetime(ym // 13, ym % 13, (d >> 17) & 0x1F, (d >> 12) & 0x1F, (d >> 6) & 0x3F, d & 0x3F, us)",
                "except ValueError:",
                f"    {v} = _datetime2_text(b, p, 6)",
                "p += 8",
            ]
        if fsp in (0, 2, 4):  # fast path: even fsp needs no /10 rounding
            scale = 10 ** (6 - fsp)
            lines = ["hi, lo = _be40(b, p)", "d = (hi << 8) | lo", "ym = (d >> 22) & 0x1FFFF"]
            if fs:
                us = f"_from_bytes(b[p + 5:p + {5 + fs}], 'big', signed=True)"
                lines.append(f"us = {us}{f' * {scale}' if scale != 1 else ''}")
            else:
                lines.append("us = 0")
            # One constructor call instead of the library's datetime(...).replace(microsecond=)
            # (5x cheaper); a negative fraction is ignored as the library does.
            lines += [
                "try:",
                f"    {v} = _datetime(ym // 13, ym % 13, (d >> 17) & 0x1F, (d >> 12) & 0x1F, (d >> 6) & 0x3F, d & 0x3F,"
                " us if us > 0 else 0)",
                "except ValueError:",
                f"    {v} = _datetime2_text(b, p, {fsp})",
                f"p += {5 + fs}",
            ]
            return lines
        return [f"{v} = _read_datetime2_slow(b, p, {fsp})", f"p += {5 + fs}"]
    if t == T_TIMESTAMP2:
        fsp = m["fsp"]
        return [f"{v} = _read_timestamp2(b, p, {fsp})", f"p += {4 + fsp_size(fsp)}"]
    if t == T_TIME2:
        fsp = m["fsp"]
        return [f"{v} = _read_time2(b, p, {fsp})", f"p += {3 + fsp_size(fsp)}"]
    if t == T_DATE:
        return [f"{v} = _read_date(b, p)", "p += 3"]
    if t == T_TIME:
        return [f"{v} = _read_time_old(b, p)", "p += 3"]
    if t == T_DATETIME:
        return [f"{v} = _read_datetime_old(b, p)", "p += 8"]
    if t == T_TIMESTAMP:
        return [f"{v} = _read_timestamp(b, p)", "p += 4"]
    if t == T_BIT:
        bits, nbytes = m["bits"], m["bytes"]
        return [
            f"{v} = format(_from_bytes(b[p:p + {nbytes}], 'big') & {(1 << bits) - 1}, '0{bits}b')",
            f"p += {nbytes}",
        ]
    if t == T_ENUM:
        size = m["size"]
        if size not in (1, 2, 3, 4, 5, 6, 7, 8):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"size {size}")
        if c.enum_values is None:
            # no value names (binlog_row_metadata=MINIMAL and no column lookup): the index
            return [f"{v} = {_uint_expr(size)}", f"p += {size}"]
        g[f"_enum{i}"] = c.enum_values  # [""] + the names: index 0 is the empty (error) value
        return [
            f"{v} = {_uint_expr(size)}",
            f"if {v} < {len(c.enum_values)}: {v} = _enum{i}[{v}]",
            f"p += {size}",
        ]
    if t == T_SET:
        size = m["size"]
        if size not in (1, 2, 3, 4, 5, 6, 7, 8):
            raise UnsupportedColumnType(schema, table, str(c.name), t, f"size {size}")
        if not c.set_values:
            # no value names (binlog_row_metadata=MINIMAL and no column lookup): the bitmask
            return [f"{v} = {_uint_expr(size)}", f"p += {size}"]
        g[f"_set{i}"] = tuple(enumerate(c.set_values))
        return [
            f"mask = {_uint_expr(size)}",
            # MySQL's text of the set (`SELECT set_col`): its names in definition order joined by
            # commas, the empty set '' (the library's set of names printed as Python's repr, and None)
            f"{v} = ','.join([val for idx, val in _set{i} if mask & (1 << idx)])",
            f"p += {size}",
        ]
    raise UnsupportedColumnType(schema, table, str(c.name), t)


def check_supported(tbl: Table) -> None:
    """Generate (and drop) the code of the full-image reader: raises UnsupportedColumnType early."""
    assert tbl.columns is not None
    for i, c in enumerate(tbl.columns):
        _column_code(i, c, tbl.schema, tbl.table, {})


def _image_code(tbl: Table, present: bytes, partial: frozenset[int] | None, g: dict[str, Any]) -> list[str]:
    """Lines (not indented) that read one row image with this columns-present bitmap from
    b[p:] into v0, v1, ... and advance p; what they call goes into `g`. `partial`: see
    `make_reader`."""
    cols = tbl.columns
    assert cols is not None
    present_idx = [i for i in range(tbl.ncols) if present[i >> 3] & (1 << (i & 7))]
    nb = (len(present_idx) + 7) // 8
    body = []
    if nb == 1:
        body.append("nulls = b[p]")
    elif nb:
        body.append(f"nulls = _from_bytes(b[p:p + {nb}], 'little')")
    body.append(f"p += {nb}")
    is_present = set(present_idx)
    null_index = 0
    for i, c in enumerate(cols):
        if i not in is_present:
            body.append(f"v{i} = None")
            continue
        if partial is not None and i in partial:
            g[f"_diffs{i}"] = diffs_reader(tbl.schema, tbl.table, c.name)
            code = [f"v{i}, p = _diffs{i}(b, p)"]
        elif partial is not None and c.type == T_JSON:
            g[f"_doc{i}"] = json_reader(tbl.schema, tbl.table, c.name, document=True)
            size = c.meta["length_size"]
            code = [f"n = {_uint_expr(size)}", f"p += {size}", f"v{i} = _doc{i}(b[p:p + n])", "p += n"]
        else:
            code = _column_code(i, c, tbl.schema, tbl.table, g)
        body.append(f"if nulls & {1 << null_index}:")
        body.append(f"    v{i} = None")
        body.append("else:")
        body.extend("    " + line for line in code)
        null_index += 1
    return body


def _values_code(tbl: Table) -> str:
    """The row's values dict of v0, v1, ... (`_image_code`), by column name."""
    return "{" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(tbl.names)) + "}"


def _compiled(tbl: Table, src: str, name: str, g: dict[str, Any]):
    exec(compile(src, f"<binlog row reader {tbl.schema}.{tbl.table}>", "exec"), g)
    fn: Any = g[name]
    fn.__source__ = src
    return fn


def make_reader(tbl: Table, present: bytes, partial: frozenset[int] | None = None):
    """A function (b, p) -> (values dict, new p) for one row image with this bitmap.
    `partial` (a Partial_update_rows image): JSON values as documents (mysql_json.parse),
    and the columns in `partial` as their diffs."""
    g = dict(_GLOBALS_BASE)
    body = ["def _read_row(b, p):"]
    body.extend("    " + line for line in _image_code(tbl, present, partial, g))
    body.append(f"    return {_values_code(tbl)}, p")
    return _compiled(tbl, "\n".join(body) + "\n", "_read_row", g)


def make_inserter(tbl: Table, present: bytes):
    """A function (b, p, stop, file, pos, append) that appends the `RowInsert` of each row
    image in b[p:stop] (a Write_rows event's rows, this columns-present bitmap), all ending
    at file:pos. The row reader of `make_reader` inside the loop, and the rows built there
    with the table's names as constants: no call and no (values, p) tuple per row
    (outbox-only `decode_batch`: one row per Write_rows event). A row's slots are set by
    plain stores, its end as the file and offset it keeps (cdc/source_events.py)."""
    g = dict(_GLOBALS_BASE)
    g.update(_schema=tbl.schema, _table=tbl.table, _RowInsert=RowInsert, _new=_new)
    body = ["def _read_inserts(b, p, stop, file, pos, append):", "    while p < stop:"]
    body.extend("        " + line for line in _image_code(tbl, present, None, g))
    body += [
        "        row = _new(_RowInsert)",
        "        row.schema = _schema",
        "        row.table = _table",
        f"        row.values = {_values_code(tbl)}",
        "        row._end_file = file",
        "        row._end_pos = pos",
        "        append(row)",
    ]
    return _compiled(tbl, "\n".join(body) + "\n", "_read_inserts", g)
