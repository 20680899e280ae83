"""The verifier's own binlog reader (python-mysql-replication) across changes of the
outbox table's definition inside one binlog file: it maps a table id once (the library's
`freeze_schema`), which holds because the server gives the table a new id whenever its
definition is loaded anew. Rows written before and after an ALTER that moves every column,
and after FLUSH TABLES, decode with their own layout.

Without `binlog_row_metadata=FULL` (a mariadbd with MINIMAL: Table_maps without names
or ENUM / SET values) the reader takes them from information_schema: names, an ENUM, a
SET (the empty set too), an unsigned INT after a YEAR; rows of a Table_map the lookup no
longer matches (an ALTER since) are one anomaly naming the cause, never guessed events."""

from __future__ import annotations

import pytest

from cdc.events.outbox import OutboxTable
from spark_jobs.mysql.binlog_readers import read_binlog_file
from testbed.mariadb import EmbeddedMariaDB
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


@pytest.fixture(scope="module")
def minimal_metadata_server():
    with EmbeddedMariaDB.start(server_id=31, extra_args=["--binlog-row-metadata=MINIMAL"]) as db:
        yield db


ENUM_SET_DDL = """CREATE TABLE outbox (
    id CHAR(36) PRIMARY KEY, aggregatetype ENUM('order','invoice') NOT NULL, aggregateid VARCHAR(255),
    type VARCHAR(255) NOT NULL, tags SET('a','b','c') NOT NULL, y YEAR, n INT UNSIGNED, payload LONGTEXT
) ENGINE=InnoDB"""


def test_without_full_metadata_names_and_enum_set_values_come_from_information_schema(
    minimal_metadata_server,
) -> None:
    db = minimal_metadata_server
    db.create_database("shop")
    with db.connect("shop") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT @@binlog_row_metadata")
            assert cur.fetchone()[0] == "MINIMAL"
            cur.execute(ENUM_SET_DDL)
            file, start = _head(conn)
            cur.execute(
                "INSERT INTO outbox VALUES ('e-1', 'invoice', 'k1', 'Created', 'a,c', 2024, 4294967295, '{\"n\": 1}'),"
                " ('e-2', 'order', 'k2', 'Created', '', NULL, 7, NULL)"
            )
        conn.commit()
        end_file, end = _head(conn)
    assert end_file == file
    txs = list(read_binlog_file(db.connection_settings(), file, start, end, 99_302, [OutboxTable("shop", "outbox")]))
    rows = [values for tx in txs for (_s, _t, values) in tx.rows]
    assert rows == [
        {"id": "e-1", "aggregatetype": "invoice", "aggregateid": "k1", "type": "Created", "tags": "a,c", "y": 2024,
         "n": 4294967295, "payload": '{"n": 1}'},
        {"id": "e-2", "aggregatetype": "order", "aggregateid": "k2", "type": "Created", "tags": "", "y": None,
         "n": 7, "payload": None},
    ]  # fmt: skip


def test_rows_of_a_table_changed_since_are_undecidable_with_their_cause(minimal_metadata_server) -> None:
    db = minimal_metadata_server
    db.create_database("shop2")
    with db.connect("shop2") as conn:
        with conn.cursor() as cur:
            cur.execute(OUTBOX_DDL.format(name="outbox"))
            file, start = _head(conn)
        insert_events(conn, "outbox", [("e-1", "order", "k1", "Created", "{}")])
        conn.commit()
        end_file, end = _head(conn)
        with conn.cursor() as cur:  # information_schema now describes another layout
            cur.execute("ALTER TABLE outbox ADD COLUMN note VARCHAR(20)")
    anomalies: list[str] = []
    tables = [OutboxTable("shop2", "outbox")]
    txs = list(read_binlog_file(db.connection_settings(), file, start, end, 99_303, tables, anomalies.append))
    assert [tx.rows for tx in txs] == [[]]
    (text,) = anomalies
    assert "undecidable" in text and "shop2.outbox" in text and "7 column(s) there, 6 in the Table_map" in text
    assert "binlog_row_metadata" in text
