"""Deterministic workloads for the benchmarks.

* outbox-only: N outbox events, one INSERT statement per event, `per_tx` events per
  transaction, a ~300-byte JSON payload (the figures in issue 6 were measured on this).
* mixed: the same, plus 10 other tables carrying equal traffic (the outbox is 1/11 of
  the rows), so the relay's cost for rows it does not publish shows.

Statements go to the server 100 at a time in one round trip (multi-statements), so
generating 200k events takes seconds, while the binlog still holds one row event per
INSERT, as an application writing one event at a time produces.
"""

from __future__ import annotations

import json
import random

import pymysql
from pymysql.constants import CLIENT

OUTBOX_DDL = """CREATE TABLE IF NOT EXISTS outbox (
    id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
    type VARCHAR(255) NOT NULL, payload LONGTEXT, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB"""
OTHER_DDL = """CREATE TABLE IF NOT EXISTS other_{n} (
    id BIGINT PRIMARY KEY AUTO_INCREMENT, ref VARCHAR(64) NOT NULL, amount DECIMAL(12,2) NOT NULL,
    note VARCHAR(255) NOT NULL, created_at DATETIME(6) NOT NULL
) ENGINE=InnoDB"""
OTHER_TABLES = 10


def connect(db, database: str | None = None) -> pymysql.Connection:
    s = db.connection_settings()
    return pymysql.connect(
        host=s["host"],
        port=s["port"],
        user=s["user"],
        password=s["password"],
        database=database,
        client_flag=CLIENT.MULTI_STATEMENTS,
        autocommit=False,
    )


def create_schema(db, database: str, mixed: bool) -> None:
    db.create_database(database)
    with connect(db, database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL)
        if mixed:
            for n in range(OTHER_TABLES):
                cur.execute(OTHER_DDL.format(n=n))
        conn.commit()


def _payload(rng: random.Random, seq: int) -> str:
    body = {
        "order_id": seq,
        "customer": f"c{rng.randrange(5000):05d}",
        "amount": round(rng.uniform(1, 999), 2),
        "currency": "EUR",
        "items": [{"sku": f"sku-{rng.randrange(999)}", "qty": rng.randint(1, 5)} for _ in range(2)],
    }
    text = json.dumps(body, separators=(",", ":"))
    body["note"] = "n" * max(0, 300 - len(text) - 10)
    return json.dumps(body, separators=(",", ":"))


def _quote(conn, value: str) -> str:
    return conn.escape(value)


def write(
    db,
    database: str,
    events: int,
    per_tx: int = 100,
    mixed: bool = False,
    seed: int = 1,
    keys: int = 1000,
    first_seq: int = 0,
) -> int:
    """Write `events` outbox events (and, when mixed, 10x as many other rows)."""
    rng = random.Random(seed)
    written = 0
    with connect(db, database) as conn, conn.cursor() as cur:
        while written < events:
            stmts = []
            for _ in range(min(per_tx, events - written)):
                seq = first_seq + written
                uid = "%08x-0000-4000-8000-%012x" % (seed, seq)
                stmts.append(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES "
                    f"({_quote(conn, uid)}, 'order', 'order-{rng.randrange(keys)}', 'OrderCreated', "
                    f"{_quote(conn, _payload(rng, seq))})"
                )
                if mixed:
                    for n in range(OTHER_TABLES):
                        stmts.append(
                            f"INSERT INTO other_{n} (ref, amount, note, created_at) VALUES "
                            f"('r{seq}', {rng.uniform(1, 999):.2f}, {_quote(conn, 'x' * 200)}, NOW(6))"
                        )
                written += 1
            cur.execute(";".join(stmts))
            while cur.nextset():
                pass
            conn.commit()
    return written


def bench_server(compressed: bool = False, **kwargs):
    """A throwaway MariaDB for benchmarks: the relay's binlog settings, without the
    per-commit fsyncs (the benchmarks measure the relay, not the disk). `compressed`:
    log_bin_compress=ON, every statement or row image of 10 bytes or more compressed."""
    from testbed.mariadb import EmbeddedMariaDB

    extra = [
        "--sync-binlog=0",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-buffer-pool-size=256M",
        "--max-binlog-size=256M",
    ]
    if compressed:
        extra += ["--log-bin-compress=ON", "--log-bin-compress-min-len=10"]
    return EmbeddedMariaDB.start(extra_args=extra, **kwargs)
