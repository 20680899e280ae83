"""Which table a statement-logged DML writes.

A session may log its DML as statements (`SET SESSION binlog_format = 'STATEMENT'`, or a
server whose format changed): the binlog then holds the SQL text in a Query event and no
row image at all, so the relay cannot know the inserted row's values. What it can know
is that the statement wrote an outbox table; that must never pass silently (the
transaction-shape rules in cdc/assembly/transaction.py decide what happens to it).

Only the statement's *target* counts, read from its syntax: `INSERT ... SELECT FROM
outbox` into another table does not write the outbox; `INSERT INTO outbox` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_NAME = rf"(?P<name>{_IDENT}(?:\s*\.\s*{_IDENT})?)"
_COMMENTS = re.compile(r"^(?:\s+|/\*.*?\*/|--[^\n]*\n|#[^\n]*\n)*", re.S)


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    """The DML patterns, compiled on first use: case-insensitive over the identifier's
    \\u0080-\\uffff range they take 0.14 s to compile, which every process importing this
    module (both of the relay's) paid at start-up for statements that rarely come."""
    return (
        (
            re.compile(
                rf"(?P<verb>INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*(?:INTO\s+)?{_NAME}",
                re.I,
            ),
            "insert",
        ),
        (re.compile(rf"LOAD\s+(?:DATA|XML)\b.*?\bINTO\s+TABLE\s+{_NAME}", re.I | re.S), "insert"),
        (re.compile(rf"UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_NAME}", re.I), "update"),
        (re.compile(rf"DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_NAME}", re.I), "delete"),
    )


@dataclass(frozen=True, slots=True)
class StatementTarget:
    """`kind`: "insert" (INSERT, REPLACE, LOAD DATA: new rows), "update" or "delete"."""

    kind: str
    schema: str
    table: str


def _unquote(part: str) -> str:
    part = part.strip()
    if part.startswith("`") and part.endswith("`"):
        return part[1:-1].replace("``", "`")
    return part


def _split_name(name: str, default_schema: str) -> tuple[str, str]:
    # A dot inside backquotes belongs to the name: split only outside them.
    depth, parts, current = False, [], ""
    for ch in name:
        if ch == "`":
            depth = not depth
        if ch == "." and not depth:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_schema, _unquote(parts[0])


def statement_target(sql: str, default_schema: str) -> StatementTarget | None:
    """The table a DML statement writes, or None for anything else (DDL, SET, ...).

    Table names compare as the server stores them; a multi-table UPDATE/DELETE names
    only its first table here (they are not inserts: only `on_change` applies)."""
    text = sql[_COMMENTS.match(sql).end() :]  # type: ignore[union-attr]  # the pattern matches the empty string
    for pattern, kind in _patterns():
        m = pattern.match(text)
        if m is not None:
            schema, table = _split_name(m.group("name"), default_schema)
            return StatementTarget(kind, schema, table)
    return None
