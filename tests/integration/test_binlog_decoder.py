"""The fast binlog reader (connectors.mysql.binlog_protocol + connectors.mysql.binlog_decoder) against
python-mysql-replication + binlog_library.LibraryConverter, on a real MariaDB binlog: both must
yield equal source events (types, positions, values) for every column type."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import re
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent,
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.position import BinlogPosition
from cdc.source_events import Heartbeat, RowChange, RowInsert, ServerStarted, TxBegin, TxCommit
from connectors.mysql.binlog_decoder import BinlogDecoder, UndecodableEvent
from connectors.mysql.binlog_library import LibraryConverter as _Converter
from connectors.mysql.binlog_protocol import BinlogConnection, BinlogConnectionError, BinlogPositionError
from connectors.mysql.client import binlog_end

pytestmark = pytest.mark.integration

_ids = iter(range(1000, 10**9))


def _status(mariadb) -> tuple[str, int]:
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        return binlog_end(cur)


def _run(mariadb, database: str | None, statements: list[str]) -> None:
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def _conn(mariadb, **kw) -> BinlogConnection:
    s = mariadb.connection_settings()
    return BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=next(_ids), **kw)


def read_fast(mariadb, watched, file, pos, **decoder_kw) -> list:
    dec = BinlogDecoder(watched, file, **decoder_kw)
    out: list = []
    with _conn(mariadb).dump_file(file, pos, blocking=False) as bc:
        for ev in bc.events():
            dec.decode(ev, out)
    return out


def read_library(mariadb, watched, file, pos) -> list:
    reader = BinLogStreamReader(
        connection_settings=mariadb.connection_settings(),
        server_id=next(_ids),
        blocking=False,
        only_events=[
            FormatDescriptionEvent,
            RotateEvent,
            GtidEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            UpdateRowsEvent,
            DeleteRowsEvent,
            HeartbeatLogEvent,
            XAPrepareEvent,
            ExecuteLoadQueryEvent,
        ],
        only_schemas=sorted({s for s, _ in watched}) or None,
        only_tables=sorted({t for _, t in watched}) or None,
        enable_logging=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
    )
    conv = _Converter(set(watched), file)
    out: list = []
    try:
        for ev in reader:
            conv.convert(ev, out)
    finally:
        reader.close()
    return out


def assert_same(mariadb, watched, file, pos) -> list:
    """Both readers agree; returns the events."""
    fast = read_fast(mariadb, watched, file, pos)
    lib = read_library(mariadb, watched, file, pos)
    assert len(fast) == len(lib), (len(fast), len(lib))
    for i, (a, b) in enumerate(zip(fast, lib, strict=True)):
        assert type(a) is type(b), (i, a, b)
        if isinstance(a, (RowInsert, RowChange)):
            b = _with_library_date_none(a, b)
            assert a.values == b.values, (i, a.values, b.values)
            for k, v in a.values.items():  # same Python types too (1 == 1.0 == True would hide a slip)
                assert type(v) is type(b.values[k]), (i, k, v, b.values[k])
        assert a == b, (i, a, b)
    return fast


_MYSQL_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}:\d{2}(\.\d{1,6})?)?")


def _with_library_date_none(fast: Any, lib: Any) -> Any:
    """`lib` with the one documented difference put back: python-mysql-replication reads a
    zero or partly-zero DATE / DATETIME as None (and keeps nothing of it), where the relay's
    decoder gives MySQL's text (docs/mysql.md "Zero-like values"); only there, and only a
    None, is the fast decoder's date text taken."""
    values = dict(lib.values)
    for k, v in fast.values.items():
        if values.get(k) is None and isinstance(v, str) and _MYSQL_DATE_TEXT.fullmatch(v):
            values[k] = v
    if values == lib.values:
        return lib
    if isinstance(lib, RowInsert):
        return RowInsert(lib.schema, lib.table, values, lib.end)
    return dataclasses.replace(lib, values=values)


# -- the outbox shape first ---------------------------------------------------------------

OUTBOX = """CREATE TABLE outbox (
    id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
    type VARCHAR(255) NOT NULL, payload LONGTEXT, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""


def test_outbox_rows_equal_library(mariadb, database):
    _run(mariadb, database, [OUTBOX, "CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=InnoDB"])
    file, pos = _status(mariadb)
    stmts = []
    for i in range(30):
        stmts.append("BEGIN")
        for j in range(3):
            stmts.append(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                f"('{i:08d}-0000-4000-8000-{j:012d}', 'order', 'o-{i}', 'Created', '{{\"n\": {i}, \"s\": \"é😀\"}}')"
            )
            stmts.append(f"INSERT INTO other VALUES ({i * 10 + j}, 'x')")
        stmts.append("COMMIT")
    stmts.append(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES "
        "('a', 't', 'k', 'T', NULL, '2024-02-29 23:59:59.999999'), ('b', 't', 'k', 'T', '', '1000-01-01')"
    )
    stmts.append("UPDATE outbox SET payload = 'changed' WHERE id = 'a'")
    stmts.append("DELETE FROM outbox WHERE id = 'b'")
    _run(mariadb, database, stmts)
    events = assert_same(mariadb, {(database, "outbox")}, file, pos)
    inserts = [e for e in events if isinstance(e, RowInsert)]
    assert len(inserts) == 92
    assert inserts[0].values["payload"] == '{"n": 0, "s": "é😀"}'
    assert inserts[-1].values["created_at"] == datetime.datetime(1000, 1, 1)
    changes = [e for e in events if isinstance(e, RowChange)]
    assert [(c.kind, c.values["id"], c.values["payload"]) for c in changes] == [
        ("update", "a", "changed"),
        ("delete", "b", ""),
    ]
    assert sum(isinstance(e, TxCommit) for e in events) >= 33


def test_true_begin_start_is_where_the_event_starts(mariadb, database):
    """TxBegin.start is the real start of the GTID event (the header's event size, as the
    verifier and the fixed _Converter compute it); a dump started there re-reads that
    GTID. legacy_begin_start reproduces the old _Converter (body size only)."""
    _run(mariadb, database, [OUTBOX])
    file, pos = _status(mariadb)
    _run(mariadb, database, ["INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('x','t','k','T')"])
    watched = {(database, "outbox")}
    fast = read_fast(mariadb, watched, file, pos)
    legacy = read_fast(mariadb, watched, file, pos, legacy_begin_start=True)
    begin = next(e for e in fast if isinstance(e, TxBegin))
    begin_legacy = next(e for e in legacy if isinstance(e, TxBegin))
    assert begin_legacy.start.pos - begin.start.pos == 23  # 19-byte header + CRC32
    again = read_fast(mariadb, watched, begin.start.file, begin.start.pos)
    first = next(e for e in again if isinstance(e, TxBegin))
    assert first == begin


# -- every column type ---------------------------------------------------------------------

TYPES_DDL = """CREATE TABLE types (
  id INT PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
  d1 DECIMAL(10,2), d2 DECIMAL(5,0), d3 DECIMAL(30,10), d4 DECIMAL(65,30), d5 DECIMAL(4,4), d6 DECIMAL(18,9),
  d7 DECIMAL(12,2) UNSIGNED,
  f FLOAT, dbl DOUBLE,
  c10 CHAR(10) CHARACTER SET utf8mb4, c255 CHAR(255) CHARACTER SET utf8mb4, vc VARCHAR(300) CHARACTER SET utf8mb4,
  vl VARCHAR(20) CHARACTER SET latin1, cl CHAR(5) CHARACTER SET latin1, va VARCHAR(20) CHARACTER SET ascii,
  b4 BINARY(4), vb VARBINARY(300),
  tt TINYTEXT, tx TEXT, mt MEDIUMTEXT CHARACTER SET latin1, lt LONGTEXT,
  tb TINYBLOB, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB,
  dt DATE, tm TIME, tm1 TIME(1), tm3 TIME(3), tm6 TIME(6),
  dtm DATETIME, dtm1 DATETIME(1), dtm2 DATETIME(2), dtm3 DATETIME(3), dtm4 DATETIME(4), dtm5 DATETIME(5),
  dtm6 DATETIME(6),
  ts TIMESTAMP NULL, ts1 TIMESTAMP(1) NULL, ts3 TIMESTAMP(3) NULL, ts6 TIMESTAMP(6) NULL,
  y YEAR,
  bt1 BIT(1), bt7 BIT(7), bt8 BIT(8), bt9 BIT(9), bt16 BIT(16), bt64 BIT(64),
  e ENUM('a','b','ü'), s SET('x','y','z'), j JSON, g GEOMETRY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

MAX_ROW = """INSERT INTO types VALUES (1,
  127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807, 18446744073709551615,
  99999999.99, 99999, 12345678901234567890.0123456789, 12345678901234567890123456789012345.123456789012345678901234567890,
  0.9999, 123456789.123456789, 9999999999.99,
  3.5, 1.7976931348623157e308,
  'ab😀', REPEAT('é', 255), REPEAT('x', 300), 'caf\\xe9 ÿ', 'über', 'ascii',
  X'00FF0102', X'000102FF',
  'tiny', 'text 😀', 'mediumtext é', REPEAT('long', 1000),
  X'00', X'0102', X'FF00FF', REPEAT(X'AB', 70000),
  '9999-12-31', '838:59:59', '-838:59:59.0', '12:34:56.789', '-00:00:01.000001',
  '9999-12-31 23:59:59', '2020-01-01 00:00:00.1', '2020-01-01 00:00:00.12', '2020-01-01 00:00:00.123',
  '2020-01-01 00:00:00.1234', '2020-01-01 00:00:00.12345', '2020-01-01 00:00:00.999999',
  '2038-01-19 03:14:07', '1970-01-01 00:00:01.5', '2001-02-03 04:05:06.789', '2001-02-03 04:05:06.000001',
  2155,
  b'1', b'1111111', b'11111111', b'100000001', b'1010101010101010', 18446744073709551615,
  'ü', 'x,y,z', '{"a": [1, 2.5, "é", null, true]}', ST_GeomFromText('POINT(1 2)')
)"""

MIN_ROW = """INSERT INTO types VALUES (2,
  -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
  -99999999.99, -99999, -12345678901234567890.0123456789, -0.000000000000000000000000000001,
  -0.0001, -0.000000001, 0.00,
  -3.5, -2.2250738585072014e-308,
  '', '', '', '', '', '',
  X'', X'',
  '', '', '', '',
  X'', X'', X'', X'',
  '1000-01-01', '00:00:00', '00:00:00.1', '-00:00:00.001', '00:00:00',
  '1000-01-01 00:00:00', '1000-01-01 00:00:00.9', '1000-01-01 00:00:00.01', '1000-01-01 00:00:00.001',
  '1000-01-01 00:00:00.0001', '1000-01-01 00:00:00.00001', '1000-01-01 00:00:00.000001',
  '1970-01-01 00:00:01', '1970-01-01 00:00:01.1', '1970-01-01 00:00:01.001', '1970-01-01 00:00:01.000001',
  1901,
  b'0', b'0', b'0', b'0', b'0', 0,
  'a', '', '[]', ST_GeomFromText('LINESTRING(0 0, 1 1)')
)"""

NULL_ROW = "INSERT INTO types (id) VALUES (3)"


def test_every_type_equal_library(mariadb, database):
    _run(mariadb, database, [TYPES_DDL])
    file, pos = _status(mariadb)
    with mariadb.connect(database, autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # zero dates below
        cur.execute(MAX_ROW)
        cur.execute(MIN_ROW)
        cur.execute(NULL_ROW)
        conn.commit()
        cur.execute(
            "INSERT INTO types (id, dt, dtm, dtm6, y, e, s) VALUES (4, '0000-00-00', '0000-00-00 00:00:00', "
            "'0000-00-00 00:00:00.000000', 0, '', '')"
        )
        cur.execute("INSERT INTO types (id, ti, vc) VALUES (5, 1, 'a'), (6, 2, 'b'), (7, NULL, NULL)")
        conn.commit()
        cur.execute("UPDATE types SET vc = CONCAT(IFNULL(vc, ''), '+'), d1 = -d1 WHERE id >= 1")
        cur.execute("DELETE FROM types WHERE id IN (2, 6)")
        conn.commit()
    events = assert_same(mariadb, {(database, "types")}, file, pos)
    rows = {e.values["id"]: e.values for e in events if isinstance(e, RowInsert)}
    assert rows[1]["biu"] == 18446744073709551615 and rows[2]["bi"] == -9223372036854775808
    assert rows[1]["d4"] == decimal.Decimal("12345678901234567890123456789012345.123456789012345678901234567890")
    assert rows[1]["c10"] == "ab😀" and rows[1]["b4"] == b"\x00\xff\x01\x02"
    assert rows[1]["bt64"] == "1" * 64 and rows[1]["s"] == "x,y,z"
    # zero-like values (docs/mysql.md "Zero-like values"), never None; the library decoder's
    # None for the zero dates is the one difference assert_same allows
    assert rows[3]["vc"] is None and rows[4]["dt"] == "0000-00-00" and rows[4]["dtm"] == "0000-00-00 00:00:00"
    assert rows[4]["dtm6"] == "0000-00-00 00:00:00.000000" and rows[4]["y"] == 0
    assert rows[4]["e"] == "" and rows[4]["s"] == ""
    assert rows[1]["dtm6"] == datetime.datetime(2020, 1, 1, 0, 0, 0, 999999)


def test_alter_flush_rollback_savepoint_ddl(mariadb, database):
    _run(
        mariadb,
        database,
        [
            "CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10)) ENGINE=InnoDB",
            "CREATE TABLE m (id INT PRIMARY KEY) ENGINE=MyISAM",
        ],
    )
    file, pos = _status(mariadb)
    _run(
        mariadb,
        database,
        [
            "INSERT INTO t VALUES (1, 'one')",
            "ALTER TABLE t ADD COLUMN b DECIMAL(6,2) DEFAULT 1.5, ADD COLUMN c DATETIME(3) NULL",
            "INSERT INTO t VALUES (2, 'two', -3.25, '2021-05-06 07:08:09.123')",
            "FLUSH BINARY LOGS",
            "ALTER TABLE t DROP COLUMN a",
            "INSERT INTO t VALUES (3, 4.5, NULL)",
            "BEGIN",
            "INSERT INTO t VALUES (4, 0, NULL)",
            "INSERT INTO m VALUES (1)",
            "ROLLBACK",
            "BEGIN",
            "INSERT INTO t VALUES (5, 0, NULL)",
            "SAVEPOINT `sp one`",
            "INSERT INTO t VALUES (6, 0, NULL)",
            "INSERT INTO m VALUES (2)",
            "ROLLBACK TO SAVEPOINT `sp one`",
            "INSERT INTO t VALUES (7, 0, NULL)",
            "COMMIT",
            "CREATE TABLE t2 (x INT)",
            "DROP TABLE t2",
            "FLUSH BINARY LOGS",
        ],
    )
    events = assert_same(mariadb, {(database, "t"), (database, "m")}, file, pos)
    files = {e.end.file for e in events if hasattr(e, "end")}
    assert len(files) >= 2  # events on both sides of the first FLUSH (nothing after the last)
    kinds = {type(e).__name__ for e in events}
    # MariaDB 10.11 (ROW) writes the MyISAM rows of a rolled-back mixed transaction as a
    # committed transaction of their own, never a ROLLBACK: see test_query_classification.
    assert {"Savepoint", "RollbackToSavepoint", "Statement", "RowInsert"} <= kinds
    ids = [e.values["id"] for e in events if isinstance(e, RowInsert) and e.table == "t"]
    assert ids == [1, 2, 3, 5, 6, 7]  # 4 rolled back; 6 stays logged, undone by ROLLBACK TO
    assert next(e.values for e in events if isinstance(e, RowInsert) and e.values["id"] == 2) == {
        "id": 2,
        "a": "two",
        "b": decimal.Decimal("-3.25"),
        "c": datetime.datetime(2021, 5, 6, 7, 8, 9, 123000),
    }


def test_xa_and_statement_logged_events_equal_library(mariadb, database, tmp_path):
    """XA prepare/commit/rollback/one phase, a statement-logged INSERT and LOAD DATA
    (Execute_load_query): both readers name the same xids, SQL and default database."""
    csv = tmp_path / "rows.csv"
    csv.write_text("10\n11\n")
    csv.chmod(0o644)
    tmp_path.chmod(0o755)
    _run(mariadb, database, ["CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB"])
    file, pos = _status(mariadb)
    _run(
        mariadb,
        database,
        [
            "XA START 'a1', 'b\\'q', 7",
            "INSERT INTO t VALUES (1)",
            "XA END 'a1', 'b\\'q', 7",
            "XA PREPARE 'a1', 'b\\'q', 7",
            "XA COMMIT 'a1', 'b\\'q', 7",
            "XA START 'a2'",
            "INSERT INTO t VALUES (2)",
            "XA END 'a2'",
            "XA PREPARE 'a2'",
            "XA ROLLBACK 'a2'",
            "XA START 'a3'",
            "INSERT INTO t VALUES (3)",
            "XA END 'a3'",
            "XA COMMIT 'a3' ONE PHASE",
            "SET SESSION binlog_format = 'STATEMENT'",
            "INSERT INTO t VALUES (4)",
            f"LOAD DATA INFILE '{csv}' INTO TABLE t",
            "SET SESSION binlog_format = 'ROW'",
        ],
    )
    events = assert_same(mariadb, {(database, "t")}, file, pos)
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("XaPrepare") == 2 and kinds.count("XaCommit") == 1 and kinds.count("XaRollback") == 1
    prepares = [e for e in events if type(e).__name__ == "XaPrepare"]
    assert prepares[0].xid == "X'6131',X'622771',7" and not prepares[0].one_phase
    statements = [e for e in events if type(e).__name__ == "Statement"]
    assert [e.schema for e in statements if e.sql.startswith(("INSERT", "LOAD"))] == [database, database]
    assert any(e.sql.startswith("LOAD DATA") for e in statements)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            st.integers(0, 2**32 - 1),
            st.decimals(min_value=-(10**11), max_value=10**11, places=4, allow_nan=False, allow_infinity=False),
            st.one_of(st.none(), st.text(max_size=40).filter(lambda s: "\x00" not in s and not s.endswith(" "))),
            st.binary(max_size=300),
            st.datetimes(min_value=datetime.datetime(1000, 1, 1), max_value=datetime.datetime(9999, 12, 31)),
            st.floats(allow_nan=False, allow_infinity=False, width=64),
            st.sampled_from(["a", "b", "c d", None]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_random_rows_equal_library(mariadb, rows):
    database = f"h_{next(_ids)}"
    mariadb.create_database(database)
    try:
        _run(
            mariadb,
            database,
            [
                "CREATE TABLE r (n INT AUTO_INCREMENT PRIMARY KEY, a BIGINT, b INT UNSIGNED, c DECIMAL(20,4), "
                "d VARCHAR(50), e BLOB, f DATETIME(6), g DOUBLE, h ENUM('a','b','c d')) ENGINE=InnoDB"
            ],
        )
        file, pos = _status(mariadb)
        with mariadb.connect(database, autocommit=False) as conn, conn.cursor() as cur:
            cur.executemany("INSERT INTO r (a, b, c, d, e, f, g, h) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
            cur.execute("UPDATE r SET d = 'u' WHERE n % 2 = 0")
            conn.commit()
        events = assert_same(mariadb, {(database, "r")}, file, pos)
        got = [e.values for e in events if isinstance(e, RowInsert)]
        assert [v["a"] for v in got] == [r[0] for r in rows]
        assert [v["d"] for v in got] == [r[3] for r in rows]
    finally:
        _run(mariadb, None, [f"DROP DATABASE `{database}`"])


# -- the protocol ---------------------------------------------------------------------------


def test_mariadb_gtid_start(mariadb, database):
    _run(mariadb, database, [OUTBOX])
    _run(mariadb, database, ["INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('g1','t','k','T')"])
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        after = cur.fetchone()[0]
    _run(
        mariadb,
        database,
        [
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('g2','t','k','T')",
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('g3','t','k','T')",
        ],
    )
    dec = BinlogDecoder({(database, "outbox")}, None)
    out: list = []
    with _conn(mariadb).dump_mariadb_gtid(after, blocking=False) as bc:
        for ev in bc.events():
            dec.decode(ev, out)
    ids = [e.values["id"] for e in out if isinstance(e, RowInsert)]
    assert ids == ["g2", "g3"]
    begins = [e for e in out if isinstance(e, TxBegin)]
    assert begins[0].gtid.rsplit("-", 1)[0] == after.split(",")[0].rsplit("-", 1)[0]
    assert dec.file is not None and all(e.end.file == dec.file for e in out if hasattr(e, "end"))


def test_purged_or_unknown_file_is_error_1236(mariadb):
    with (
        pytest.raises(BinlogPositionError) as info,
        _conn(mariadb).dump_file("mysql-bin.000000", 4, blocking=False) as bc,
    ):
        list(bc.events())
    assert info.value.code == 1236
    assert isinstance(info.value, BinlogConnectionError) and isinstance(info.value, ConnectionError)


def test_bad_password_is_connection_error_without_password(mariadb):
    s = mariadb.connection_settings()
    bc = BinlogConnection(s["host"], s["port"], s["user"], "sekrit-pw-123", server_id=next(_ids))
    with pytest.raises(BinlogConnectionError) as info:
        bc.dump_file("mysql-bin.000001", 4)
    assert info.value.code == 1045
    assert "sekrit-pw-123" not in str(info.value) and "sekrit" not in repr(bc)


def test_close_from_another_thread_unblocks_blocking_read(mariadb):
    file, pos = _status(mariadb)
    bc = _conn(mariadb).dump_file(file, pos, blocking=True)
    seen: list = []
    done = threading.Event()

    def reader():
        for ev in bc.events():
            seen.append(ev)
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set()  # blocked at the end of the binlog
    t0 = time.monotonic()
    bc.close()
    assert done.wait(5)
    assert time.monotonic() - t0 < 2
    assert len(seen) >= 2  # fake rotate + format description


def test_heartbeat_in_blocking_mode(mariadb):
    file, pos = _status(mariadb)
    bc = _conn(mariadb, heartbeat_s=0.2).dump_file(file, pos, blocking=True)
    dec = BinlogDecoder(set(), file)
    out: list = []

    def stop_later():
        time.sleep(1.5)
        bc.close()

    threading.Thread(target=stop_later, daemon=True).start()
    for ev in bc.events():
        dec.decode(ev, out)
    beats = [e for e in out if isinstance(e, Heartbeat)]
    assert beats and all(isinstance(b.end, BinlogPosition) and b.end.pos > 4 for b in beats)


def test_large_event_over_16mb_is_reassembled(mariadb, database):
    _run(mariadb, database, ["SET GLOBAL max_allowed_packet = 64 * 1024 * 1024"])
    _run(mariadb, database, ["CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB) ENGINE=InnoDB"])
    file, pos = _status(mariadb)
    size = 17 * 1024 * 1024 + 123
    with mariadb.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO big VALUES (1, REPEAT(X'5A', %s))", (size,))
    out = read_fast(mariadb, {(database, "big")}, file, pos)
    rows = [e for e in out if isinstance(e, RowInsert)]
    assert len(rows) == 1 and rows[0].values["b"] == b"Z" * size


def test_corrupt_compressed_event_is_refused():
    """A Query_compressed event whose zlib data is garbage: refused, never skipped
    (tests/unit/test_binlog_compression.py has the rest)."""
    import struct

    dec = BinlogDecoder(set(), "mysql-bin.000001")
    body = struct.pack("<IIBHH", 7, 0, 2, 0, 0) + b"db\x00" + b"\x81\x05" + b"garbage"
    ev = struct.pack("<IBIIIH", 1, 165, 1, 19 + len(body) + 4, 100 + 19 + len(body) + 4, 0) + body + b"\x00" * 4
    with pytest.raises(UndecodableEvent, match=r"Query_compressed event \(type 165\) at mysql-bin.000001:100 "):
        dec.decode(ev, [])


@pytest.mark.parametrize(
    "sql",
    [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT `a b`",
        "ROLLBACK TO SAVEPOINT `a b`",
        "ROLLBACK TO x",
        "XA START 'x'",
        "  create table x (y int) ",
        "ALTER TABLE é ADD c INT",
        "XA END X'78',X'',1",
        "XA COMMIT X'78',X'',1",
        "XA ROLLBACK X'78',X'',1",
        "XA COMMIT 'x' ONE PHASE",
        "INSERT INTO outbox VALUES (1)",
    ],
)
def test_query_classification_like_converter(sql):
    """Query events the server rarely writes in ROW mode (ROLLBACK, XA): decoder vs _Converter."""
    import struct
    from types import SimpleNamespace

    body = struct.pack("<IIBHH", 7, 0, 2, 0, 0) + b"db\x00" + sql.encode()
    ev = struct.pack("<IBIIIH", 1700000000, 2, 1, 19 + len(body) + 4, 5000, 0) + body
    ev += struct.pack("<I", __import__("zlib").crc32(ev))
    dec = BinlogDecoder(set(), "mysql-bin.000001")
    dec.crc, dec._crc_known = 4, True
    fast: list = []
    dec.decode(ev, fast)
    lib: list = []
    fake = SimpleNamespace(
        query=sql,
        schema=b"db",
        packet=SimpleNamespace(log_pos=5000, event_size=len(ev)),
        event_size=len(body),
        timestamp=1700000000,
    )
    _Converter(set(), "mysql-bin.000001")._query(fake, lib)
    assert fast == lib


def test_binlog_checksum_none_server():
    """A server with binlog_checksum=NONE: no CRC to strip (found from the FDE itself)."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=7, extra_args=["--binlog-checksum=NONE"]) as db:
        db.create_database("nc")
        _run(db, "nc", [OUTBOX])
        file, pos = _status(db)
        _run(
            db,
            "nc",
            [
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                "('n1','t','k','T','p'), ('n2','t','k','T',NULL)",
                "FLUSH BINARY LOGS",
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('n3','t','k','T')",
            ],
        )
        events = assert_same(db, {("nc", "outbox")}, file, pos)
        assert [e.values["id"] for e in events if isinstance(e, RowInsert)] == ["n1", "n2", "n3"]
        # from the start of the first file too (fake rotate, FDE, GTID list, checkpoint...)
        assert_same(db, {("nc", "outbox")}, "mysql-bin.000001", 4)


# -- binlog_row_metadata=MINIMAL: names and ENUM/SET values from information_schema ------------

MINIMAL_DDL = """CREATE TABLE tagged (
  id INT PRIMARY KEY, name VARCHAR(20), e ENUM('a','b','c d','it''s'), s SET('x','y','z'), n INT UNSIGNED
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""


def _write_tagged(mariadb, database: str, metadata: str, first_id: int) -> tuple[str, int]:
    """Rows written by a session opened after SET GLOBAL binlog_row_metadata (a new session
    takes the global value); the global is put back afterwards."""
    with mariadb.connect(autocommit=True) as admin, admin.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.binlog_row_metadata")
        (before,) = cur.fetchone()
        cur.execute(f"SET GLOBAL binlog_row_metadata = '{metadata}'")
        try:
            file, pos = _status(mariadb)
            with mariadb.connect(database, autocommit=False) as conn, conn.cursor() as w:
                w.execute("SET SESSION sql_mode = ''")  # '' into an ENUM: index 0, the error value
                w.execute(
                    "INSERT INTO tagged VALUES (%s, 'ü', 'b', 'x,z', 4000000000), (%s, NULL, '', '', 0), "
                    "(%s, 'c', 'it''s', 'y', NULL)",
                    (first_id, first_id + 1, first_id + 2),
                )
                w.execute("UPDATE tagged SET e = 'c d', s = 'x,y,z' WHERE id = %s", (first_id,))
                conn.commit()
        finally:
            cur.execute(f"SET GLOBAL binlog_row_metadata = '{before}'")
    return file, pos


def test_minimal_row_metadata_is_completed_from_information_schema(mariadb, database):
    from connectors.mysql.table_columns import InformationSchemaColumns

    _run(mariadb, database, [MINIMAL_DDL])
    watched = {(database, "tagged")}
    file, pos = _write_tagged(mariadb, database, "MINIMAL", 1)
    columns = InformationSchemaColumns(mariadb.connection_settings())
    try:
        minimal = read_fast(mariadb, watched, file, pos, table_columns=columns)
    finally:
        columns.close()
    bare = read_fast(mariadb, watched, file, pos)
    full_file, full_pos = _write_tagged(mariadb, database, "FULL", 11)
    full = read_fast(mariadb, watched, full_file, full_pos)

    rows = [e.values for e in minimal if isinstance(e, (RowInsert, RowChange))]
    assert rows == [
        {"id": 1, "name": "ü", "e": "b", "s": "x,z", "n": 4000000000},
        {"id": 2, "name": None, "e": "", "s": "", "n": 0},  # the empty SET is '', never NULL
        {"id": 3, "name": "c", "e": "it's", "s": "y", "n": None},
        {"id": 1, "name": "ü", "e": "c d", "s": "x,y,z", "n": 4000000000},
    ]
    full_rows = [e.values for e in full if isinstance(e, (RowInsert, RowChange))]
    assert [dict(r, id=r["id"] - 10) for r in full_rows] == rows  # the same values as with FULL metadata
    # without the lookup: no names, an ENUM is its index and a SET its bitmask, never NULL
    assert next(e.values for e in bare if isinstance(e, RowInsert)) == {
        "UNKNOWN_COL0": 1,
        "UNKNOWN_COL1": "ü",
        "UNKNOWN_COL2": 2,
        "UNKNOWN_COL3": 0b101,
        "UNKNOWN_COL4": -294967296,  # no signedness applied without names (python-mysql-replication's rule)
    }


def test_a_server_restart_is_read_off_the_binlog_its_start_opened():
    """Killed and restarted, the server opens a new binlog whose Format_description has
    `created` set; the dump thread sends it as written when the stream enters that file, and
    zeroes it in the file the stream starts inside: one ServerStarted, for the new file (what
    proves an XA prepare in an earlier file older than the start, cdc/assembly/feed.py)."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=7) as db:
        db.create_database("rs")
        _run(db, "rs", [OUTBOX, "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('r1','t','k','T')"])
        file, pos = _status(db)
        db.kill()
        db.restart()
        _run(db, "rs", ["INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('r2','t','k','T')"])
        after, _ = _status(db)
        assert after != file
        events = read_fast(db, {("rs", "outbox")}, file, 4)
        assert [e for e in events if isinstance(e, ServerStarted)] == [
            ServerStarted(BinlogPosition(file, 4)),
            ServerStarted(BinlogPosition(after, 4)),
        ]
        events = read_fast(db, {("rs", "outbox")}, file, pos)
        assert [e for e in events if isinstance(e, ServerStarted)] == [ServerStarted(BinlogPosition(after, 4))]
        assert [e.values["id"] for e in events if isinstance(e, RowInsert)] == ["r2"]
