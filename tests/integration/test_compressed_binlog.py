"""Issue 19, against a real mariadbd with `--log-bin-compress=ON --log-bin-compress-min-len=10`:
every statement and row image of 10 bytes or more is written as a Query_compressed /
Write/Update/Delete_rows_compressed_v1 event.

* the relay's decoder and the verifier's reader (python-mysql-replication behind
  spark_jobs/binlog_compressed.py) read the compressed binlog alike, for every column type;
* the relay (`cdc run` processes) publishes every committed outbox insert of a mixed
  workload once (NULL to 60 KB payloads, multi-byte text, rollbacks) across a SIGKILL and
  restart mid-stream, per the independent checker, and `cdc verify` reports 0 problems;
* a compressed event whose bytes were damaged (a byte flipped in a copy of the binlog)
  stops the relay with one line naming the event, its position and the fix, exit 2,
  the checkpoint before it.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent, FormatDescriptionEvent, GtidEvent, HeartbeatLogEvent, MariadbGtidEvent, QueryEvent,
    RotateEvent, XAPrepareEvent, XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from cdc.config import load_config
from cdc.position import BinlogPosition
from cdc.source_events import RowChange, RowInsert, Statement, TxCommit
from connectors.binlog_decoder import BinlogDecoder
from connectors.binlog_library import LibraryConverter
from connectors.binlog_protocol import BinlogConnection
from connectors.mariadb_server import EmbeddedMariaDB
from spark_jobs.binlog_compressed import ExpandingConnection
from tests.integration.harness import (
    OUTBOX_DDL, RelayProcess, env_for, master_position, read_topic, relay_raw_config, wait_until,
)
from tests.integration.test_binlog_decoder import MAX_ROW, MIN_ROW, TYPES_DDL

pytestmark = pytest.mark.integration

COMPRESS_ARGS = ("--log-bin-compress=ON", "--log-bin-compress-min-len=10")
_ids = iter(range(61_000, 10**9))


@pytest.fixture(scope="module")
def zdb():
    """A mariadbd of this module's own that compresses its binlog."""
    with EmbeddedMariaDB.start(server_id=19, extra_args=COMPRESS_ARGS) as db:
        yield db


@pytest.fixture
def zdatabase(zdb):
    name = f"z_{next(_ids)}"
    zdb.create_database(name)
    yield name
    with zdb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


def run_sql(db, database: str | None, statements: list[str]) -> None:
    with db.connect(database, autocommit=True) as conn, conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def event_kinds(db, since: str) -> list[str]:
    pos = BinlogPosition.parse(since)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        files = [r[0] for r in cur.fetchall() if BinlogPosition(r[0], 4) >= BinlogPosition(pos.file, 4)]
        kinds = []
        for name in files:
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (name, pos.pos if name == pos.file else 4))
            kinds += [r[2] for r in cur.fetchall()]
    return kinds


def read_fast(db, watched, file: str, pos: int) -> list:
    s = db.connection_settings()
    dec = BinlogDecoder(watched, file)
    out: list = []
    with BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=next(_ids)) as conn:
        conn.dump_file(file, pos, blocking=False)
        for ev in conn.events():
            dec.decode(ev, out)
    return out


def read_verifier_way(db, watched, file: str, pos: int) -> list:
    """python-mysql-replication with the verifier's expanding connection (its own
    decompression), its events converted by the library path's converter."""
    reader = BinLogStreamReader(
        connection_settings=db.connection_settings(), server_id=next(_ids), blocking=False,
        pymysql_wrapper=ExpandingConnection,
        only_events=[FormatDescriptionEvent, RotateEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent,
                     WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent, XAPrepareEvent,
                     ExecuteLoadQueryEvent],
        only_schemas=sorted({s for s, _ in watched}), only_tables=sorted({t for _, t in watched}),
        enable_logging=False, resume_stream=True, log_file=file, log_pos=pos,
    )
    conv = LibraryConverter(set(watched), file)
    out: list = []
    try:
        for ev in reader:
            conv.convert(ev, out)
    finally:
        reader.close()
    return out


def test_both_readers_read_every_compressed_event_kind(zdb, zdatabase):
    """Query_compressed (DDL, a statement-logged insert), Write/Update/Delete_rows_compressed_v1
    of every column type: the relay's decoder and the verifier's reader agree on every
    event, value and position."""
    run_sql(zdb, zdatabase, [OUTBOX_DDL.format(name="outbox"), TYPES_DDL])
    start = master_position(zdb)
    file, pos = BinlogPosition.parse(start).file, BinlogPosition.parse(start).pos
    run_sql(zdb, zdatabase, [
        MAX_ROW, MIN_ROW, "INSERT INTO types (id) VALUES (3)",
        "UPDATE types SET vc = 'changed é', j = '{\"k\": [1]}' WHERE id = 1",
        "DELETE FROM types WHERE id = 2",
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
        "('a1', 'order', 'k', 'created', REPEAT('ü😀', 3000)), ('a2', 'order', 'k', 'created', NULL)",
        "SET SESSION binlog_format = 'STATEMENT'",
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('s1','order','k','created','x')",
        "SET SESSION binlog_format = 'ROW'",
        "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(20) NULL",
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, tenant) VALUES ('a3', 'order', 'k', 'c', 't')",
    ])
    kinds = set(event_kinds(zdb, start))
    assert {"Query_compressed", "Write_rows_compressed_v1", "Update_rows_compressed_v1",
            "Delete_rows_compressed_v1"} <= kinds, kinds
    watched = {(zdatabase, "outbox"), (zdatabase, "types")}
    fast = read_fast(zdb, watched, file, pos)
    lib = read_verifier_way(zdb, watched, file, pos)
    assert len(fast) == len(lib)
    for i, (a, b) in enumerate(zip(fast, lib)):
        assert type(a) is type(b), (i, a, b)
        if isinstance(a, (RowInsert, RowChange)):
            for k, v in a.values.items():
                assert type(v) is type(b.values[k]), (i, k, v, b.values[k])
        assert a == b, (i, a, b)
    ids = [e.values["id"] for e in fast if isinstance(e, RowInsert) and e.table == "outbox"]
    assert ids == ["a1", "a2", "a3"]
    assert next(e for e in fast if isinstance(e, RowInsert) and e.values["id"] == "a1").values["payload"] == "ü😀" * 3000
    assert any(isinstance(e, Statement) and "'s1'" in e.sql for e in fast)
    assert [e.kind for e in fast if isinstance(e, RowChange)] == ["update", "delete"]
    # positions are the binlog's own: every event ends where SHOW BINLOG EVENTS says one ends
    with zdb.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", (file, pos))
        ends = {int(r[4]) for r in cur.fetchall()}
    assert all(e.end.pos in ends for e in fast if isinstance(e, (RowInsert, RowChange, TxCommit, Statement)))
