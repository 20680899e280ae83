"""Binlog file/position coordinates.

A binlog file name is `<basename>.<sequence>`; the server numbers files with at least six
digits but the sequence keeps growing past 999999 (`mysql-bin.999999` is followed by
`mysql-bin.1000000`), so order is by the numeric suffix, never by the string. This is the
rule go-mysql's `Position.Compare` tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from cdc.errors import PositionError

_FILE = re.compile(r"^(?P<base>[^\s:/\\]+)\.(?P<seq>[0-9]+)$")


def file_sequence(name: str) -> tuple[str, int]:
    """Split `mysql-bin.000042` into `("mysql-bin", 42)`."""
    match = _FILE.match(name)
    if not match:
        raise PositionError(
            f"malformed binlog file name {name!r}: expected <basename>.<number>, for example mysql-bin.000042"
        )
    return match.group("base"), int(match.group("seq"))


@total_ordering
@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """A point in the binlog: the byte offset `pos` in the file `file`.

    Positions from one server are totally ordered by (file sequence, offset)."""

    file: str
    pos: int

    def __post_init__(self) -> None:
        file_sequence(self.file)
        if not isinstance(self.pos, int) or self.pos < 0:
            raise PositionError(f"binlog offset must be a non-negative integer, got {self.pos!r}")

    @classmethod
    def parse(cls, text: str) -> BinlogPosition:
        """Parse `mysql-bin.000042:1234`."""
        name, sep, offset = text.strip().rpartition(":")
        if not sep or not (offset.isascii() and offset.isdigit()):
            raise PositionError(
                f"malformed binlog position {text!r}: expected <file>:<offset>, for example mysql-bin.000042:1234"
            )
        return cls(name, int(offset))

    @property
    def sequence(self) -> int:
        return file_sequence(self.file)[1]

    def sort_key(self) -> tuple[int, int]:
        return (self.sequence, self.pos)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self.sort_key() < other.sort_key()

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"


# A frozen slotted dataclass's slot descriptors set its fields without __init__'s
# per-field object.__setattr__ and its regex check of the file name. Read from the class's
# namespace: attribute access on the class means the field to a type checker.
_new = object.__new__
_set_file = vars(BinlogPosition)["file"].__set__
_set_pos = vars(BinlogPosition)["pos"].__set__


def unchecked_position(file: str, pos: int) -> BinlogPosition:
    """`BinlogPosition(file, pos)`, equal to it, without the file name's check: for a file
    name checked already (the decoder checks it once per Rotate; the reader process pickles
    positions it made from checked ones, connectors/mysql/reader_process.py `MessagePickler`)."""
    position = _new(BinlogPosition)
    _set_file(position, file)
    _set_pos(position, pos)
    return position
