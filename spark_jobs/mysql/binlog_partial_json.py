"""The verifier's own reading of MySQL's partial JSON updates.

With `binlog_row_value_options=PARTIAL_JSON`, MySQL 8.0+ logs an UPDATE that changes a
JSON column in place as a PARTIAL_UPDATE_ROWS_EVENT (type 39): its after image of that
column is a list of diffs, not the document. python-mysql-replication 1.0.17 reads only
the first diff of such a column and applies none of them. The project's rule: the after
image is the full document, as MySQL applies the diffs (`sql/json_diff.cc`
apply_json_diff). So the verifier's connection (`binlog_compressed.prepare_event`)
rewrites each type 39 event of a watched table into the Update_rows v2 event (type 31)
it stands for: the before image as it is, the after image without its value options
and partial bits, each partial JSON column replaced by the document the diffs make of
the before image's document (written back as binary JSON, `mysql_json_text.to_binary`).
The library then decodes an ordinary Update_rows event, which the verifier treats as it
treats every UPDATE of an outbox row (not an event). When the before image does not
hold the document (binlog_row_image=MINIMAL) or a diff does not apply, the event is
left as it is (a type the verifier does not read, like Update_rows).

Layouts (little-endian; `libs/mysql/binlog/event/rows_event.h`, `sql/log_event.cc`
Rows_log_event::print_verbose_one_row, `sql/json_diff.cc`):

    rows event v2   table id 6, flags 2, extra-data length 2 (counts itself), extra data |
                    column count (lenenc), before columns bitmap, after columns bitmap,
                    rows: before image, after image
    after image of type 39   value options (lenenc; bit 0 PARTIAL_JSON_UPDATES), if set
                    a partial bit per JSON column of the table (present or not, lowest
                    bit first), the null bitmap of the present columns, the values
    a partial JSON value     diff-vector length (4) | diffs: operation 1 (0 REPLACE,
                    1 INSERT, 2 REMOVE), path length (lenenc), path (text, `$.a[2]`), and
                    but for REMOVE value length (lenenc), value (binary JSON)
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from spark_jobs.mysql.binlog_compressed import lenenc_int
from spark_jobs.mysql.json_text import parse, to_binary

__all__ = ["PartialJsonError", "apply_diffs", "full_update_body", "read_diffs"]

PARTIAL_UPDATE_ROWS, UPDATE_ROWS_V2 = 39, 31
_REPLACE, _INSERT, _REMOVE = 0, 1, 2
_JSON = 245
_FIXED = {1: 1, 2: 2, 9: 3, 3: 4, 8: 8, 4: 4, 5: 8, 13: 1, 10: 3, 14: 3, 11: 3, 12: 8, 7: 4, 6: 0}
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


class PartialJsonError(ValueError):
    """A partial JSON update that does not apply to its document."""


# -------------------------------------------------------------------------------- paths

_LEG = re.compile(r'\.(?:([A-Za-z_$][\w$]*)|("(?:[^"\\]|\\.)*"))|\[\s*(?:(\d+)|last(?:\s*-\s*(\d+))?)\s*\]', re.DOTALL)


def parse_path(text: str) -> list[Any]:
    """A JSON path as MySQL writes it in a diff (`Json_path::to_string`): `$` and legs,
    `.name` / `."quoted name"` (a str) and `[N]` / `[last]` / `[last-N]` (an int, or a
    negative int -1 - N counted from the end)."""
    if not text.startswith("$"):
        raise PartialJsonError(f"JSON path {text!r} does not start with $")
    legs: list[Any] = []
    at = 1
    while at < len(text):
        m = _LEG.match(text, at)
        if m is None:
            raise PartialJsonError(f"JSON path {text!r}: cannot read from {text[at:]!r}")
        if m.group(1) is not None:
            legs.append(m.group(1))
        elif m.group(2) is not None:
            legs.append(json.loads(m.group(2)))
        elif m.group(3) is not None:
            legs.append(int(m.group(3)))
        else:
            legs.append(-1 - int(m.group(4) or 0))
        at = m.end()
    return legs


def _index(leg: Any, size: int) -> int | None:
    """An array leg's position (None for a member leg)."""
    if isinstance(leg, str):
        return None
    return size + leg if leg < 0 else leg


# -------------------------------------------------------------------------------- diffs


def read_diffs(data: bytes) -> list[tuple[int, list[Any], Any]]:
    """The diffs of a partial JSON value (after its 4-byte length): (operation, path legs,
    parsed value or None)."""
    diffs = []
    at = 0
    while at < len(data):
        op = data[at]
        if op not in (_REPLACE, _INSERT, _REMOVE):
            raise PartialJsonError(f"JSON diff operation {op}")
        size, at = lenenc_int(data, at + 1)
        path = parse_path(data[at : at + size].decode("utf-8"))
        at += size
        value = None
        if op != _REMOVE:
            size, at = lenenc_int(data, at)
            value = parse(data[at : at + size])
            at += size
        diffs.append((op, path, value))
    if at != len(data):
        raise PartialJsonError("JSON diffs run past their length")
    return diffs


def _key_order(key: str) -> tuple[int, bytes]:
    raw = key.encode("utf-8", "surrogateescape")
    return len(raw), raw  # json_binary.h: keys sorted by length, then bytewise


def _seek(doc: Any, legs: list[Any]) -> Any:
    """json_diff.cc seek_exact_path: the value at `legs`, or KeyError."""
    for leg in legs:
        at = _index(leg, len(doc)) if isinstance(doc, list) else None
        if isinstance(doc, list) and at is not None and 0 <= at < len(doc):
            doc = doc[at]
        elif isinstance(doc, dict) and isinstance(leg, str) and leg in doc:
            doc = doc[leg]
        else:
            raise KeyError(leg)
    return doc


def apply_diffs(doc: Any, diffs: list[tuple[int, list[Any], Any]]) -> Any:
    """`doc` with the diffs applied in order, as json_diff.cc apply_json_diff does
    (a member inserted into an object takes its place in MySQL's key order)."""
    for op, path, value in diffs:
        if not path:
            raise PartialJsonError("a JSON diff at the document's root")
        try:
            parent = _seek(doc, path[:-1])
        except KeyError:
            raise PartialJsonError(f"JSON diff path {path} not found") from None
        leg = path[-1]
        if isinstance(parent, dict) and isinstance(leg, str):
            if (op == _INSERT) == (leg in parent):
                raise PartialJsonError(f"JSON diff {op} at member {leg!r} rejected")
            if op == _REMOVE:
                del parent[leg]
            else:
                parent[leg] = value
                if op == _INSERT:
                    items = sorted(parent.items(), key=lambda kv: _key_order(kv[0]))
                    parent.clear()
                    parent.update(items)
        elif isinstance(parent, list) and not isinstance(leg, str):
            at = _index(leg, len(parent))
            assert at is not None
            if op == _INSERT:
                parent.insert(min(max(at, 0), len(parent)), value)
            elif 0 <= at < len(parent):
                if op == _REMOVE:
                    del parent[at]
                else:
                    parent[at] = value
            else:
                raise PartialJsonError(f"JSON diff {op} at cell {leg} of {len(parent)} rejected")
        else:
            raise PartialJsonError(f"JSON diff path {path} does not lead into an object or array")
    return doc


# ------------------------------------------------------------------------- row images


def _bit(bitmap: bytes, i: int) -> bool:
    return bool(bitmap[i // 8] >> (i % 8) & 1)


def _value_size(t: int, meta: bytes, data: bytes, at: int) -> int:
    """Bytes of one column value in a row image (log_event.cc / field.cc pack lengths)."""
    if t in _FIXED:
        return _FIXED[t]
    if t in (17, 18, 19):  # TIMESTAMP2, DATETIME2, TIME2: fraction bytes by precision
        return {17: 4, 18: 5, 19: 3}[t] + (meta[0] + 1) // 2
    if t == 246:  # NEWDECIMAL (precision, scale)
        intg, frac = meta[0] - meta[1], meta[1]
        return intg // 9 * 4 + _DIG2BYTES[intg % 9] + frac // 9 * 4 + _DIG2BYTES[frac % 9]
    if t in (15, 253):  # VARCHAR: a 1- or 2-byte length
        prefix = 1 if struct.unpack("<H", meta)[0] < 256 else 2
        return prefix + int.from_bytes(data[at : at + prefix], "little")
    if t == 16:  # BIT (bits, bytes)
        return meta[1] + (meta[0] + 7) // 8
    if t == 254:  # CHAR, or ENUM / SET by the real type in its metadata
        if meta[0] in (247, 248):
            return meta[1]
        max_len = ((((meta[0] << 8) >> 4) & 0x300) ^ 0x300) + meta[1]
        prefix = 1 if max_len < 256 else 2
        return prefix + int.from_bytes(data[at : at + prefix], "little")
    if t in (247, 248):
        return meta[1]
    if t in (242, 245, 249, 250, 251, 252, 255):  # BLOB-like: a length of meta[0] bytes
        return meta[0] + int.from_bytes(data[at : at + meta[0]], "little")
    raise PartialJsonError(f"column type {t} has no known size")


def _image(data: bytes, at: int, bitmap: bytes, types: list[int], metas: list[bytes]) -> tuple[dict[int, bytes], int]:
    """One row image: {column: value bytes} of its non-NULL present columns, and its end."""
    present = [i for i in range(len(types)) if _bit(bitmap, i)]
    nulls = data[at : at + (len(present) + 7) // 8]
    at += len(nulls)
    values = {}
    for k, i in enumerate(present):
        if _bit(nulls, k):
            continue
        size = _value_size(types[i], metas[i], data, at)
        values[i] = data[at : at + size]
        at += size
    return values, at


def full_update_body(body: bytes, types: list[int], metas: list[bytes], post_header: int = 10) -> bytes | None:
    """A PARTIAL_UPDATE_ROWS_EVENT body as the Update_rows v2 body it stands for, every
    partial JSON value replaced by the whole document; None when a document is not in
    the before image."""
    (extra,) = struct.unpack_from("<H", body, 8)
    count, at = lenenc_int(body, post_header + extra - 2)
    width = (count + 7) // 8
    before_bitmap, after_bitmap = body[at : at + width], body[at + width : at + 2 * width]
    at += 2 * width
    out = bytearray(body[:at])
    json_columns = [i for i, t in enumerate(types) if t == _JSON]
    while at < len(body):
        start = at
        before, at = _image(body, at, before_bitmap, types, metas)
        out += body[start:at]
        options, at = lenenc_int(body, at)
        partial: set[int] = set()
        if options & 1:  # PARTIAL_JSON_UPDATES
            bits = body[at : at + (len(json_columns) + 7) // 8]
            at += len(bits)
            partial = {col for k, col in enumerate(json_columns) if _bit(bits, k)}
        present = [i for i in range(count) if _bit(after_bitmap, i)]
        nulls = body[at : at + (len(present) + 7) // 8]
        out += nulls
        at += len(nulls)
        for k, i in enumerate(present):
            if _bit(nulls, k):
                continue
            if i in partial:
                (length,) = struct.unpack_from("<I", body, at)
                diffs = read_diffs(body[at + 4 : at + 4 + length])
                at += 4 + length
                if i not in before:
                    return None
                doc = to_binary(apply_diffs(parse(before[i][metas[i][0] :]), diffs))
                out += len(doc).to_bytes(metas[i][0], "little") + doc
            else:
                size = _value_size(types[i], metas[i], body, at)
                out += body[at : at + size]
                at += size
    return bytes(out)
