"""Tokens of the SQL the lab answers (clients interpolate their parameters, so statements
arrive with literals in them: PyMySQL escapes strings with backslashes, as MySQL's
lexer reads them: sql/sql_lex.cc, "String Literals" in the reference manual)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from testbed.mysql_lab.protocol import MysqlError

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|/\*.*?\*/|--[ \t][^\n]*|\#[^\n]*)
  | (?P<str>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<bq>`(?:[^`]|``)*`)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<sysvar>@@(?:(?:global|session|local)\.)?[A-Za-z0-9_$]+)
  | (?P<uvar>@(?:[A-Za-z0-9_$.]+|'[^']*'|`[^`]*`))
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><=|>=|<>|!=|:=|[=<>(),.*;+\-/%])
    """,
    re.VERBOSE | re.DOTALL | re.IGNORECASE,
)

_ESCAPES = {"0": "\0", "'": "'", '"': '"', "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "\\": "\\"}


@dataclass(frozen=True)
class Token:
    kind: str  # str, bq, num, sysvar, uvar, id, op
    value: str  # unquoted / unescaped text
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "id" and self.value.upper() in words

    def is_op(self, op: str) -> bool:
        return self.kind == "op" and self.value == op


class SqlSyntaxError(ValueError):
    pass


def _unquote_string(text: str) -> str:
    quote = text[0]
    body = text[1:-1]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            # \% and \_ keep their backslash (they matter to LIKE); others per the table.
            out.append(_ESCAPES.get(nxt, "\\" + nxt if nxt in "%_" else nxt))
            i += 2
            continue
        if c == quote and i + 1 < len(body) and body[i + 1] == quote:
            out.append(quote)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def tokenize(sql: str) -> list[Token]:
    out = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise SqlSyntaxError(sql[pos:])
        kind = m.lastgroup or ""
        text = m.group(0)
        if kind != "ws":
            if kind == "str":
                value = _unquote_string(text)
            elif kind == "bq":
                value = text[1:-1].replace("``", "`")
            else:
                value = text
            out.append(Token(kind, value, m.start(), m.end()))
        pos = m.end()
    while out and out[-1].is_op(";"):
        out.pop()
    return out


def like_regex(pattern: str) -> re.Pattern[str]:
    """LIKE as a regular expression: % any run, _ one character, \\ escapes; case-insensitive
    (the collations of the names LIKE is used on here are)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("^" + "".join(out) + "$", re.IGNORECASE | re.DOTALL)


ER_PARSE_ERROR = 1064


def parse_error(near: str) -> MysqlError:
    return MysqlError(
        ER_PARSE_ERROR,
        "42000",
        "You have an error in your SQL syntax; check the manual that corresponds to your MySQL server "
        f"version for the right syntax to use near '{near[:80]}' at line 1",
    )


class Parser:
    """A cursor over a statement's tokens."""

    def __init__(self, tokens: list[Token], sql: str):
        self.toks = tokens
        self.sql = sql
        self.i = 0

    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def peek_kind(self) -> str:
        tok = self.peek()
        return tok.kind if tok is not None else ""

    def next(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise parse_error("")
        self.i += 1
        return tok

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def accept_word(self, *words: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_word(*words):
            self.i += 1
            return True
        return False

    def accept_op(self, op: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_op(op):
            self.i += 1
            return True
        return False

    def expect_word(self, *words: str) -> None:
        if not self.accept_word(*words):
            raise parse_error(self.rest())

    def rest(self) -> str:
        tok = self.peek()
        return self.sql[tok.start :] if tok else ""

    def name(self) -> str:
        tok = self.next()
        if tok.kind not in ("id", "bq"):
            raise parse_error(self.sql[tok.start :])
        return tok.value
