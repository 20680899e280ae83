"""The text of a TIME value where a column is published as text (an outbox id / key / type
column, a header, a payload column that is not text), in the relay and the verifier alike.

`str(timedelta(seconds=-1))` is `-1 day, 23:59:59` and `str(timedelta(0))` `0:00:00`: neither
MySQL's text nor a number. MySQL prints `-00:00:01` and `00:00:00`, hours up to 838
(sql-common/my_time.cc my_time_to_str). The value holds no fsp: a fraction is printed with 6
digits when it is not zero, none otherwise.

A DECIMAL keeps Python's `str`, which follows the same rule as Java's
`BigDecimal.toString()` (scientific notation when the adjusted exponent is below -6:
`0E-10` for 0.0000000000, the same number and scale): what Kafka Connect's header and
string converters write for Debezium (`Values.append` appends a Number with its
`toString()`), and this project writes Debezium's bytes where they are defined
(docs/output-formats.md).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

__all__ = ["special_text", "time_text"]

_MICROSECOND = _dt.timedelta(microseconds=1)


def time_text(value: _dt.timedelta) -> str:
    micros = value // _MICROSECOND
    sign = "-" if micros < 0 else ""
    seconds, us = divmod(abs(micros), 1_000_000)
    minutes, s = divmod(seconds, 60)
    h, m = divmod(minutes, 60)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")


def special_text(value: Any) -> str | None:
    """MySQL's text of a TIME value; None for any other value."""
    if isinstance(value, _dt.timedelta):
        return time_text(value)
    return None
