"""What a `cdc_binlog` read covers: the verifier's own connection to the server
(`connect_mysql`), the snapshot of the binlog files and byte ranges to read
(`plan_binlog`), and those ranges cut at transaction starts into pieces of about
`split_bytes` (`split_ranges`, from `SHOW BINLOG EVENTS`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from cdc.position import BinlogPosition, file_sequence
from connectors.mysql.client import binlog_end
from spark_jobs.common import scrub, where

# ------------------------------------------------------------------------- planning


def connect_mysql(settings: Mapping[str, Any]) -> Any:
    from connectors.mysql.client import connect

    try:
        return connect({"connect_timeout": 10, **settings})  # TLS as the relay's config says
    except Exception as exc:
        raise RuntimeError(f"cdc_binlog: cannot connect to {where(settings)}: {scrub(str(exc), settings)}") from None


def plan_binlog(
    settings: Mapping[str, Any],
    start_file: str | None = None,
    end_position: str | None = None,
    server_id_base: int | None = None,
) -> dict[str, Any]:
    """A snapshot of what to read: the binlog files on the server and, for each, the
    byte range `[start, end)`; the end of the newest file is the server's current
    position (SHOW MASTER STATUS) unless `end_position` says otherwise."""
    conn = connect_mysql(settings)
    try:
        with conn.cursor() as cur:
            status = binlog_end(cur)
            if not status:
                raise RuntimeError(f"cdc_binlog: binary logging is off on {where(settings)}: start it with --log-bin")
            current = BinlogPosition(status[0], status[1])
            cur.execute("SHOW BINARY LOGS")
            logs = [(r[0], int(r[1])) for r in cur.fetchall()]
            cur.execute("SELECT @@server_id")
            server_id = int(cur.fetchone()[0])
            gtid_pos = None
            try:
                cur.execute("SELECT @@gtid_binlog_pos")
                gtid_pos = cur.fetchone()[0]
            except Exception:
                try:
                    cur.execute("SELECT @@gtid_executed")
                    gtid_pos = cur.fetchone()[0]
                except Exception:
                    gtid_pos = None
    finally:
        conn.close()
    end = BinlogPosition.parse(end_position) if end_position else current
    if end > current:
        end = current
    oldest = logs[0][0] if logs else current.file
    start_seq = file_sequence(start_file)[1] if start_file else None
    files = []
    for name, size in sorted(logs, key=lambda item: file_sequence(item[0])[1]):
        seq = file_sequence(name)[1]
        if start_seq is not None and seq < start_seq:
            continue
        if seq > end.sequence:
            continue
        stop = end.pos if seq == end.sequence else size
        files.append({"file": name, "start": 4, "end": stop})
    if server_id_base is None:
        server_id_base = random.randint(1 << 30, (1 << 31) - 100_000)
    first = files[0]["file"] if files else end.file
    return {
        "server_id": server_id,
        "oldest_file": oldest,
        "range_start": {"file": first, "pos": 4},
        "range_end": {"file": end.file, "pos": end.pos},
        "gtid_binlog_pos": gtid_pos,
        "server_id_base": server_id_base,
        "files": files,
    }


# SHOW BINLOG EVENTS' names (libs/mysql/binlog/event/binlog_event.cpp `event_type_to_string`):
# MySQL 8.4 names a tagged GTID event (type 42) "Gtid_tagged_log_event".
_CUT_EVENTS = ("Gtid", "Anonymous_Gtid", "Gtid_tagged_log_event")


def transaction_starts(
    settings: Mapping[str, Any], file: str, start: int, end: int, until: int | None = None
) -> list[int]:
    """Positions in `(start, end)` of `file` where a transaction begins (its GTID event;
    without GTIDs its BEGIN), from `SHOW BINLOG EVENTS` (the server reads the file; the
    rows are streamed, not buffered). With `until`, the scan stops at the first
    transaction start at or after it."""
    import pymysql.cursors

    conn = connect_mysql({**settings, "cursorclass": pymysql.cursors.SSCursor})
    cuts: list[int] = []
    try:
        cur = conn.cursor()
        cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, start))
        prev = None
        for row in cur:
            pos, kind = int(row[1]), row[2]
            if pos >= end:
                break
            if pos > start and (
                kind in _CUT_EVENTS
                or (kind == "Query" and str(row[5]).strip().upper() == "BEGIN" and prev not in _CUT_EVENTS)
            ):
                cuts.append(pos)
                if until is not None and pos >= until:
                    break
            prev = kind
    finally:
        # Close without draining the rest of the listing: tell PyMySQL's unbuffered
        # result it is done, or its cleanup would try to read from the closed socket.
        result = getattr(cur, "_result", None) if "cur" in locals() else None
        if result is not None:
            result.unbuffered_active = False
            cur._result = None
        conn.close()
    return cuts


def split_ranges(settings: Mapping[str, Any], plan: Mapping[str, Any], split_bytes: int) -> dict[str, Any]:
    """The plan with `ranges`: each file's `[start, end)` cut at transaction starts into
    ceil(size / split_bytes) pieces of about equal size (more Spark tasks than files:
    better balance, and more cores finish sooner). A piece always starts at a
    transaction's first event, so the verifier's assembly of every piece sees whole
    transactions."""
    ranges = []
    for f in plan["files"]:
        start, end = int(f["start"]), int(f["end"])
        pieces = -(-(end - start) // split_bytes) if split_bytes > 0 else 1
        if pieces <= 1:
            ranges.append({"file": f["file"], "start": start, "end": end})
            continue
        targets = [start + (end - start) * i // pieces for i in range(1, pieces)]
        lo = start
        for pos in transaction_starts(settings, f["file"], start, end, until=targets[-1]):
            if targets and pos >= targets[0]:
                ranges.append({"file": f["file"], "start": lo, "end": pos})
                lo = pos
                while targets and targets[0] <= pos:
                    targets.pop(0)
        ranges.append({"file": f["file"], "start": lo, "end": end})
    return {**plan, "ranges": ranges}
