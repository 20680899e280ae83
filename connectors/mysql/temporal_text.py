"""MySQL's own text of the DATE / DATETIME / TIMESTAMP values a Python `date` / `datetime`
cannot hold: the zero date `0000-00-00`, zero parts (`2024-00-00`, allowed unless sql_mode
has NO_ZERO_IN_DATE), days a month lacks (`2024-02-31`, ALLOW_INVALID_DATES) and year 0
(`0000-01-01`). python-mysql-replication 1.0.17 turns all of these into None (or raises),
which the relay would publish as SQL NULL; the relay's decoder publishes this text
instead, the text `SELECT` prints (docs/mysql.md, "Values Python cannot hold").

MySQL prints a DATETIME(fsp) / TIMESTAMP(fsp) with exactly fsp fraction digits
(`0000-00-00 00:00:00.000` for fsp 3): my_datetime_to_str in mysys/my_time.cc.

Binary layouts (the same in MySQL and MariaDB, mysys/my_time.cc, sql-common/my_time.c):
DATE 3 bytes little-endian `day | month << 5 | year << 9`; the old DATETIME 8 bytes
little-endian YYYYMMDDhhmmss as a decimal number; DATETIME2 5 bytes big-endian (bit 39
the sign, 17 bits year*13+month, 5 day, 5 hour, 6 minute, 6 second) and the fraction;
TIMESTAMP / TIMESTAMP2 seconds since the epoch, 0 meaning `0000-00-00 00:00:00`
(Field_timestampf::get_date_internal: tv_sec == 0 is the zero datetime).
"""

from __future__ import annotations

__all__ = ["date_text", "datetime2_text", "datetime_text", "old_date_text", "old_datetime_text", "zero_timestamp"]


def date_text(year: int, month: int, day: int) -> str:
    return f"{year:04d}-{month:02d}-{day:02d}"


def datetime_text(
    year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int = 0, fsp: int = 0
) -> str:
    text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
    if fsp:
        text += "." + f"{max(micros, 0):06d}"[:fsp]
    return text


def old_date_text(packed: int) -> str:
    """A DATE's 3 bytes (as one little-endian number) as MySQL's text."""
    return date_text((packed >> 9) & 0x7FFF, (packed >> 5) & 0xF, packed & 0x1F)


def old_datetime_text(value: int) -> str:
    """The old DATETIME's 8 bytes (YYYYMMDDhhmmss as one number) as MySQL's text."""
    date, time = divmod(value, 1000000)
    return datetime_text(date // 10000, date // 100 % 100, date % 100, time // 10000, time // 100 % 100, time % 100)


def datetime2_text(packed: int, micros: int, fsp: int) -> str:
    """A DATETIME2's 5 bytes (one big-endian number) and its fraction in microseconds."""
    ym = (packed >> 22) & 0x1FFFF
    return datetime_text(
        ym // 13,
        ym % 13,
        (packed >> 17) & 0x1F,
        (packed >> 12) & 0x1F,
        (packed >> 6) & 0x3F,
        packed & 0x3F,
        micros,
        fsp,
    )


def zero_timestamp(fsp: int = 0) -> str:
    """A TIMESTAMP of 0 seconds: MySQL's zero datetime, never 1970-01-01 00:00:00."""
    return datetime_text(0, 0, 0, 0, 0, 0, 0, fsp)
