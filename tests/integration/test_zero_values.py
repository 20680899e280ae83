"""Zero-like values against the real mariadbd, with a sql_mode that allows zero dates, zero
parts and invalid days: the relay's default decoder gives, for every column type, the value
MySQL prints (`SELECT CAST(col AS CHAR)`, session time zone UTC) or its Python value of it,
never None for a stored value; the verifier's own reader (`read_binlog_file`) gives the
same values; the library decoder (`source.decoder = "library"`) gives them too, except a
zero or partly-zero DATE / DATETIME, which python-mysql-replication reads as None, and
`cdc check` names those columns in one line naming `source.decoder`.
The representations are docs/mysql.md's "Zero-like values"."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

from cdc.events.outbox import OutboxTable
from cdc.source_events import RowInsert
from spark_jobs.mysql.binlog_readers import read_binlog_file
from tests.integration.test_binlog_decoder import _status, read_fast, read_library

pytestmark = pytest.mark.integration

DDL = """CREATE TABLE z (
  id INT PRIMARY KEY, dt DATE, d0 DATETIME, d3 DATETIME(3), d6 DATETIME(6),
  ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL, y YEAR, s SET('x','y'), e ENUM('a','b'), bt BIT(8),
  dec1 DECIMAL(20,10), dec0 DECIMAL(5,0), f DOUBLE, fl FLOAT, tm TIME, tm3 TIME(3),
  vc VARCHAR(10), bl BLOB, j JSON
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""
COLUMNS = [
    "dt", "d0", "d3", "d6", "ts", "ts3", "y", "s", "e", "bt", "dec1", "dec0", "f", "fl", "tm", "tm3", "vc", "bl", "j",
]  # fmt: skip
FSP = {"d3": 3, "d6": 6, "ts3": 3, "tm3": 3}
ROWS = [
    # every zero-like value
    "(1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00.000', '0000-00-00 00:00:00.000000', "
    "'0000-00-00 00:00:00', '0000-00-00 00:00:00.000', 0, '', 'c', b'0', 0, 0, -0e0, -0e0, '00:00:00', "
    "'00:00:00.000', '', '', 'null')",
    # zero parts, a day the month lacks, year 0, negative zero-ish times
    "(2, '2024-00-00', '2024-02-31 10:11:12', '0000-01-01 00:00:00.123', '2024-05-00 23:59:59.999999', "
    "'2024-01-02 03:04:05', '1970-01-01 00:00:01.500', 2155, 'x,y', 'b', b'11111111', -0.0000000001, -0, "
    "0e0, 0e0, '-00:00:01', '-838:59:59.000', 'x', X'00', '{}')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL)",
]
LIBRARY_NONE = {1: {"dt", "d0", "d3", "d6"}, 2: {"dt", "d0", "d3", "d6"}}  # python-mysql-replication's None


def _write(mariadb, database: str) -> tuple[str, int, int]:
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(DDL)
        cur.execute("FLUSH BINARY LOGS")
        file, pos = _status(mariadb)
        # no NO_ZERO_DATE / NO_ZERO_IN_DATE / strict mode: what a server that allows them stores
        cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES', SESSION time_zone = '+00:00'")
        for row in ROWS:
            cur.execute(f"INSERT INTO z VALUES {row}")
    end_file, end = _status(mariadb)
    assert end_file == file
    return file, pos, end


def _server_text(mariadb, database: str) -> dict[int, dict[str, str | None]]:
    """What the server prints of each value."""
    out: dict[int, dict[str, str | None]] = {}
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        exprs = ", ".join(
            "HEX(bl)" if c == "bl" else "CAST(bt + 0 AS CHAR)" if c == "bt" else f"CAST({c} AS CHAR)" for c in COLUMNS
        )
        cur.execute(f"SELECT id, {exprs} FROM z ORDER BY id")
        for r in cur.fetchall():
            out[r[0]] = dict(zip(COLUMNS, r[1:], strict=True))
    return out


def _as_server_prints(column: str, value: Any) -> str | None:
    """The decoded value written as the server prints it (floats compared as numbers)."""
    if value is None:
        return None
    fsp = FSP.get(column, 0)
    if column == "y":
        return f"{value:04d}"
    if column == "bt":
        return str(int(value, 2))
    if column == "bl":
        return (value if isinstance(value, bytes) else value.encode()).hex().upper()
    if isinstance(value, datetime.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        return text + ("." + f"{value.microsecond:06d}"[:fsp] if fsp else "")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        micros = value // datetime.timedelta(microseconds=1)
        seconds, us = divmod(abs(micros), 1_000_000)
        text = f"{'-' if micros < 0 else ''}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return text + ("." + f"{us:06d}"[:fsp] if fsp else "")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)


def test_zero_like_values_read_as_the_server_prints_them_by_every_reader(mariadb, database):
    file, pos, end = _write(mariadb, database)
    server = _server_text(mariadb, database)
    watched = {(database, "z")}
    fast = {e.values["id"]: e.values for e in read_fast(mariadb, watched, file, pos) if isinstance(e, RowInsert)}
    library = {e.values["id"]: e.values for e in read_library(mariadb, watched, file, pos) if isinstance(e, RowInsert)}
    txs = list(read_binlog_file(mariadb.connection_settings(), file, pos, end, 99_401, [OutboxTable(database, "z")]))
    verifier = {values["id"]: values for tx in txs for (_s, _t, values) in tx.rows}
    assert sorted(fast) == sorted(library) == sorted(verifier) == [1, 2, 3]
    for rid, printed in server.items():
        for column in COLUMNS:
            want, got = printed[column], fast[rid][column]
            assert (got is None) == (want is None), (rid, column, got, want)
            if column in ("f", "fl"):
                assert got is None or float(want) == got, (rid, column, got, want)
            else:
                assert _as_server_prints(column, got) == want, (rid, column, got, want)
            assert verifier[rid][column] == got and type(verifier[rid][column]) is type(got), (rid, column)
            if column in LIBRARY_NONE.get(rid, ()):
                assert library[rid][column] is None and got is not None, (rid, column)
            else:
                assert library[rid][column] == got and type(library[rid][column]) is type(got), (rid, column)
    # the texts docs/mysql.md promises
    assert fast[1]["dt"] == "0000-00-00" and fast[1]["d6"] == "0000-00-00 00:00:00.000000"
    assert fast[1]["ts"] == "0000-00-00 00:00:00" and fast[1]["ts3"] == "0000-00-00 00:00:00.000"
    assert fast[1]["y"] == 0 and fast[1]["s"] == "" and fast[1]["e"] == "" and fast[1]["j"] == "null"
    assert fast[2]["dt"] == "2024-00-00" and fast[2]["d0"] == "2024-02-31 10:11:12"
    assert fast[2]["s"] == "x,y" and fast[2]["ts3"] == datetime.datetime(1970, 1, 1, 0, 0, 1, 500000)


def test_cdc_check_names_the_date_columns_the_library_decoder_reads_as_null(
    mariadb, kafka, database, topic_prefix, tmp_path
):
    from connectors.mysql.preflight import run_checks
    from tests.integration.harness import OUTBOX_DDL, relay_config

    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
        cur.execute("ALTER TABLE outbox ADD COLUMN due DATE, ADD COLUMN n INT")

    def check(**over: Any) -> dict:
        cfg = relay_config(mariadb, kafka, database, topic_prefix, tmp_path / "cp.json", **over)
        return {r.name: r for r in run_checks(cfg, replica_id=False)}

    line = check(source__decoder="library")["decoder_values"]
    assert line.ok and line.warn, line
    assert line.message.startswith('source.decoder = "library" (python-mysql-replication) publishes a zero')
    assert f"{database}.outbox.created_at, {database}.outbox.due as NULL" in line.message
    assert line.message.endswith('set source.decoder = "fast"') and "\n" not in line.message
    assert "decoder_values" not in check()  # the default decoder publishes them


def test_the_library_decoder_publishes_mysql_json_as_the_default_decoder_does(tmp_path):
    """MySQL binary JSON (the MySQL lab server: mariadbd has no binary JSON) read through
    `open_library_stream`, the relay's library stream (python-mysql-replication with
    `binlog_library_values.use_mysql_json_text`), and through the default decoder: the
    same text, MySQL's (a DECIMAL at its scale, keys in MySQL's order, a TIME over 24 h)."""
    import time

    from cdc.position import BinlogPosition
    from connectors.mysql.binlog_decoder import BinlogDecoder
    from connectors.mysql.binlog_library import LibraryConverter, open_library_stream
    from connectors.mysql.binlog_protocol import BinlogConnection
    from testbed.mysql_lab.binlog_writer import Column
    from testbed.mysql_lab.json_binary import JsonDecimal
    from testbed.mysql_lab.lab import MysqlLab

    docs = [
        {"b": [1, 2.5, "é", None, True], "a": JsonDecimal(decimal.Decimal("1.80"), 4, 2)},
        {"t": datetime.timedelta(hours=87, minutes=31, seconds=46)},
        [],
        "",
        0,
        False,
    ]
    with MysqlLab.start(datadir=tmp_path / "data") as lab:
        w = lab.writer()
        w.create_table("shop", "outbox", [Column("id", "int", nullable=False, key="PRI"), Column("j", "json")])
        with w.transaction() as tx:
            tx.insert("shop", "outbox", [{"id": i, "j": doc} for i, doc in enumerate(docs)])
        watched = {("shop", "outbox")}
        dec, fast_events = BinlogDecoder(watched, "binlog.000001"), []
        with BinlogConnection(lab.host, lab.port, lab.user, lab.password, 4411, read_timeout=10) as conn:
            for ev in conn.dump_file("binlog.000001", 4, blocking=False).events():
                dec.decode(ev, fast_events)
        fast = [e.values["j"] for e in fast_events if isinstance(e, RowInsert)]
        stream, file = open_library_stream(
            lab.connection_settings(), 4412, watched, 1.0, BinlogPosition("binlog.000001", 4)
        )
        conv, lib_events = LibraryConverter(watched, file), []
        deadline = time.monotonic() + 30
        try:
            for ev in stream:  # blocking: read until the rows are in (heartbeats every second)
                conv.convert(ev, lib_events)
                if sum(isinstance(e, RowInsert) for e in lib_events) == len(docs) or time.monotonic() > deadline:
                    break
        finally:
            stream.close()
        library = [e.values["j"] for e in lib_events if isinstance(e, RowInsert)]
    assert fast[0] == '{"a": 1.80, "b": [1, 2.5, "é", null, true]}' and fast[1] == '{"t": "87:31:46.000000"}'
    assert fast[2:] == ["[]", '""', "0", "false"]
    assert library == fast
