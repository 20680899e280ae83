"""A secret value that never prints itself (passwords, keys' passwords, credentials), and
the last guard for text that quotes a library's message: `scrub_secrets`."""

from __future__ import annotations

_SECRET_VALUES: set[str] = set()  # every secret loaded in this process (scrub_secrets)


def scrub_secrets(text: str) -> str:
    """`text` with every secret value this process loaded replaced by `***`: the last
    guard for log lines and error messages that quote a library's text."""
    for value in _SECRET_VALUES:
        if value in text:
            text = text.replace(value, "***")
    return text


class Secret:
    """A secret value; `str()`/`repr()` show `***`, only `reveal()` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value
        if len(value) >= 6:  # shorter: replacing it would mangle ordinary text
            _SECRET_VALUES.add(value)

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:  # to the reader process and back: still a Secret
        return (Secret, (self._value,))

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)
