"""The verifier's own binlog reader (python-mysql-replication) across changes of the
outbox table's definition inside one binlog file: it maps a table id once (the library's
`freeze_schema`), which holds because the server gives the table a new id whenever its
definition is loaded anew. Rows written before and after an ALTER that moves every column,
and after FLUSH TABLES, decode with their own layout."""

from __future__ import annotations

import pytest

from cdc.outbox import OutboxTable
from spark_jobs.binlog_source import read_binlog_file
from tests.integration.harness import OUTBOX_DDL, insert_events

pytestmark = pytest.mark.integration


def _head(conn) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        file, pos = cur.fetchone()[:2]
    return file, int(pos)


def test_rows_before_and_after_an_alter_and_a_flush_decode_with_their_own_layout(mariadb, database) -> None:
    with mariadb.connect(database) as conn:
        with conn.cursor() as cur:
            cur.execute("FLUSH BINARY LOGS")  # one file for the whole test
            cur.execute(OUTBOX_DDL.format(name="outbox"))
        file, start = _head(conn)
        insert_events(conn, "outbox", [("before-1", "order", "k1", "Created", '{"n": 1}')])
        conn.commit()
        with conn.cursor() as cur:  # every column moves one place to the right
            cur.execute("ALTER TABLE outbox ADD COLUMN note VARCHAR(20) NOT NULL DEFAULT 'x' FIRST")
        insert_events(conn, "outbox", [("after-alter", "order", "k2", "Updated", '{"n": 2}')])
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("FLUSH TABLES")
        insert_events(conn, "outbox", [("after-flush", "order", "k3", "Deleted", '{"n": 3}')])
        conn.commit()
        end_file, end = _head(conn)
    assert end_file == file
    table = OutboxTable(database, "outbox")
    txs = list(read_binlog_file(mariadb.connection_settings(), file, start, end, 99_301, [table]))
    rows = [values for tx in txs for (_s, _t, values) in tx.rows]
    assert [(r["id"], r["aggregateid"], r["type"], r["payload"]) for r in rows] == [
        ("before-1", "k1", "Created", '{"n": 1}'),
        ("after-alter", "k2", "Updated", '{"n": 2}'),
        ("after-flush", "k3", "Deleted", '{"n": 3}'),
    ]
    assert rows[1]["note"] == "x" and "note" not in rows[0]
