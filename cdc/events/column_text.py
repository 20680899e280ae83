"""The text MySQL prints for the column values whose Python `str` is another text: where a
column of one of these types is published as text (an outbox id / key / type column, a
header, a payload column that is not text), the relay and the verifier write this.

* DECIMAL: `str(Decimal("0.0000000000"))` is `0E-10` and `str(Decimal("-0.0000001"))`
  `-1E-7`; MySQL prints `0.0000000000` and `-0.0000001` (the decoders build the Decimal from
  MySQL's digits, so the plain notation gives back exactly the scale the column has).
* TIME: `str(timedelta(seconds=-1))` is `-1 day, 23:59:59` and `str(timedelta(0))`
  `0:00:00`; MySQL prints `-00:00:01` and `00:00:00`, hours up to 838. The value holds no
  fsp: a fraction is printed with 6 digits when it is not zero, none otherwise.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
from typing import Any

__all__ = ["decimal_text", "special_text", "time_text"]


def decimal_text(value: _decimal.Decimal) -> str:
    return format(value, "f")


def time_text(value: _dt.timedelta) -> str:
    micros = value // _dt.timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    seconds, us = divmod(abs(micros), 1_000_000)
    minutes, s = divmod(seconds, 60)
    h, m = divmod(minutes, 60)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{us:06d}" if us else "")


def special_text(value: Any) -> str | None:
    """MySQL's text of a DECIMAL or TIME value; None for any other value."""
    if isinstance(value, _decimal.Decimal):
        return decimal_text(value)
    if isinstance(value, _dt.timedelta):
        return time_text(value)
    return None
