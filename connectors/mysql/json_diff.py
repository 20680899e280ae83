"""A partial JSON update (MySQL `binlog_row_value_options=PARTIAL_JSON`): the after image of
a JSON column in a PARTIAL_UPDATE_ROWS_EVENT is a list of diffs, applied here to the
before image's document as MySQL's replica applies them.

Layout (MySQL `sql/json_diff.cc`, `Json_diff_vector::write_binary` / `read_binary`): the
size of the diffs (4 bytes, little-endian), then per diff its operation (1 byte: 0
REPLACE, 1 INSERT, 2 REMOVE), the length of its path (a packed integer, as
net_field_length reads it), the path as text (`Json_path::to_string`: `$`, `.member` or
`."quoted member"`, `[N]`, `[last]`, `[last-N]`), and unless it is a REMOVE the length of
its value (a packed integer) and the value in binary JSON (connectors/mysql/json_binary.py).

Applying (`apply_json_diffs` in sql/json_diff.cc): a path is followed exactly (no
auto-wrapping); REPLACE needs the value at the path; INSERT needs the parent, adds a
member that is not there yet or inserts into an array at the index (past the end:
appended); REMOVE needs the member or element. A diff MySQL would reject (the path not
there) means the before image is not the document the server changed: `JsonDiffError`.
An object inserted into keeps MySQL's key order (by length, then bytes).
"""

from __future__ import annotations

import json
import re
from typing import Any

from connectors.mysql import json_binary as mysql_json

__all__ = ["JsonDiffError", "apply_diffs", "read_diffs"]

REPLACE, INSERT, REMOVE = 0, 1, 2
_OPERATIONS = {REPLACE: "REPLACE", INSERT: "INSERT", REMOVE: "REMOVE"}


class JsonDiffError(ValueError):
    """Diffs that cannot be read, or that do not apply to the before image's document."""


def _packed(b: bytes, p: int, end: int) -> tuple[int, int]:
    """net_field_length: < 251 one byte; 252 + 2, 253 + 3, 254 + 8 bytes."""
    if p >= end:
        raise JsonDiffError("a length past the end of the diffs")
    first = b[p]
    if first < 251:
        return first, p + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None or p + 1 + width > end:
        raise JsonDiffError(f"a malformed packed length (first byte {first})")
    return int.from_bytes(b[p + 1 : p + 1 + width], "little"), p + 1 + width


Diff = tuple[int, list, Any]


def read_diffs(b: bytes, p: int, limit: int) -> tuple[list[Diff], int]:
    """The diffs of one column at b[p:] -> ([(operation, path legs, value)], end)."""
    if p + 4 > limit:
        raise JsonDiffError("the diffs' size runs past the end of the event")
    size = int.from_bytes(b[p : p + 4], "little")
    p += 4
    end = p + size
    if end > limit:
        raise JsonDiffError(f"diffs of {size} bytes run past the end of the event")
    diffs = []
    while p < end:
        op = b[p]
        if op not in _OPERATIONS:
            raise JsonDiffError(f"unknown diff operation {op}")
        n, p = _packed(b, p + 1, end)
        if p + n > end:
            raise JsonDiffError("a diff's path runs past the end of the diffs")
        try:
            path = parse_path(b[p : p + n].decode("utf-8"))
        except UnicodeDecodeError:
            raise JsonDiffError("a diff's path is not utf-8") from None
        p += n
        value = None
        if op != REMOVE:
            n, p = _packed(b, p, end)
            if p + n > end or n == 0:
                raise JsonDiffError("a diff's value runs past the end of the diffs")
            try:
                value = mysql_json.parse(b[p : p + n])
            except mysql_json.JsonDecodeError as exc:
                raise JsonDiffError(f"a diff's value: {exc}") from None
            p += n
        diffs.append((op, path, value))
    return diffs, end


_LAST = re.compile(r"last\s*(?:-\s*(\d+))?\Z")
_MEMBER_END = re.compile(r"[\s.\[]")


def parse_path(text: str) -> list:
    """`$.a."b c"[3][last-1]` -> [("member", "a"), ("member", "b c"), ("index", 3, False),
    ("index", 1, True)] (the path forms `Json_path::to_string` writes)."""
    s = text.strip()
    if not s.startswith("$"):
        raise JsonDiffError(f"a path that does not start with $: {text!r}")
    legs: list = []
    i = 1
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
        elif c == ".":
            i += 1
            while i < len(s) and s[i].isspace():
                i += 1
            if i < len(s) and s[i] == '"':
                j = i + 1
                while j < len(s) and s[j] != '"':
                    j += 2 if s[j] == "\\" else 1
                try:
                    legs.append(("member", json.loads(s[i : j + 1])))
                except ValueError:
                    raise JsonDiffError(f"a malformed member in the path {text!r}") from None
                i = j + 1
            else:
                m = _MEMBER_END.search(s, i)
                j = m.start() if m else len(s)
                if j == i or "*" in s[i:j]:  # `.*` and `**` are wildcards, never in a diff
                    raise JsonDiffError(f"a member MySQL's diffs do not hold in the path {text!r}")
                legs.append(("member", s[i:j]))
                i = j
        elif c == "[":
            j = s.find("]", i)
            if j < 0:
                raise JsonDiffError(f"an unclosed [ in the path {text!r}")
            cell = s[i + 1 : j].strip()
            last = _LAST.match(cell)
            if last:
                legs.append(("index", int(last.group(1) or 0), True))
            elif cell.isdigit():
                legs.append(("index", int(cell), False))
            else:
                raise JsonDiffError(f"an array cell MySQL's diffs do not hold in the path {text!r}")
            i = j + 1
        else:
            raise JsonDiffError(f"a malformed path {text!r}")
    return legs


def _position(leg: tuple, size: int) -> tuple[int, bool]:
    """Json_array_index: (position, within bounds)."""
    index, from_end = leg[1], leg[2]
    if from_end:
        return (size - index - 1 if index < size else 0), index < size
    return min(index, size), index < size


def _seek(doc: Any, legs: list) -> Any:
    """seek_exact_path: the value at the path, or a KeyError-free None when it is not there."""
    for leg in legs:
        if type(doc) is list and leg[0] == "index":
            pos, inside = _position(leg, len(doc))
            if not inside:
                return _MISSING
            doc = doc[pos]
        elif type(doc) is dict and leg[0] == "member":
            doc = doc.get(leg[1], _MISSING)
            if doc is _MISSING:
                return _MISSING
        else:
            return _MISSING
    return doc


_MISSING = object()


def _mysql_key(k: str) -> tuple[int, bytes]:
    raw = k.encode()
    return len(raw), raw


def apply_diffs(doc: Any, diffs: list[Diff]) -> Any:
    """The document after the diffs (the containers on the changed paths are changed in place)."""
    for op, legs, value in diffs:
        where = _path_text(legs)
        if not legs:
            raise JsonDiffError(f"a {_OPERATIONS[op]} of the whole document, which MySQL never writes as a diff")
        parent = _seek(doc, legs[:-1])
        leg = legs[-1]
        if op == REPLACE:
            if _seek(parent, [leg]) is _MISSING:
                raise JsonDiffError(f"REPLACE of {where}, which the before image does not have")
            if type(parent) is dict:
                parent[leg[1]] = value
            else:
                parent[_position(leg, len(parent))[0]] = value
        elif op == INSERT:
            if type(parent) is dict and leg[0] == "member":
                if leg[1] in parent:
                    raise JsonDiffError(f"INSERT of {where}, which the before image has already")
                parent[leg[1]] = value
                items = sorted(parent.items(), key=lambda kv: _mysql_key(kv[0]))
                parent.clear()
                parent.update(items)
            elif type(parent) is list and leg[0] == "index":
                parent.insert(_position(leg, len(parent))[0], value)
            else:
                raise JsonDiffError(f"INSERT of {where}, whose parent the before image does not have")
        else:
            if _seek(parent, [leg]) is _MISSING:
                raise JsonDiffError(f"REMOVE of {where}, which the before image does not have")
            if type(parent) is dict:
                del parent[leg[1]]
            else:
                del parent[_position(leg, len(parent))[0]]
    return doc


def _path_text(legs: list) -> str:
    out = "$"
    for leg in legs:
        if leg[0] == "member":
            out += "." + mysql_json.quote(leg[1])
        else:
            out += f"[last-{leg[1]}]" if leg[2] else f"[{leg[1]}]"
    return out
