"""MySQL client errors as text that is safe to show."""

from __future__ import annotations

import pymysql


def error_text(exc: BaseException) -> str:
    """An error message safe to show: pymysql errors never carry the password, but keep
    only the code and text to be sure nothing else leaks."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args:
        return " ".join(str(a) for a in exc.args[:2])
    return f"{type(exc).__name__}: {exc}"
