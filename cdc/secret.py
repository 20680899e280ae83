"""A secret value that never prints itself (passwords, keys' passwords, credentials)."""

from __future__ import annotations


class Secret:
    """A secret value; `str()`/`repr()` show `***`, only `reveal()` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)
