"""A workload that looks like a real service: orders and their line items written in the
same transaction as their outbox rows.

Mixed in, deterministically from the seed: rolled-back orders, transactions with several
events, a savepoint rollback, a transaction that also wrote a MyISAM table and rolled
back (so a ROLLBACK reaches the binlog), the insert-then-delete outbox pattern, and one
event whose aggregate type makes an illegal topic name (it must be dead-lettered).

The workload keeps its own ledger of what it committed, so the relay's and the
verifier's counts can be checked against the application's, not against themselves.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pymysql

SCHEMA_SQL = (
    """CREATE TABLE IF NOT EXISTS orders (
        id BIGINT PRIMARY KEY AUTO_INCREMENT, customer VARCHAR(64) NOT NULL,
        total DECIMAL(12,2) NOT NULL, status VARCHAR(16) NOT NULL, created_at DATETIME(6) NOT NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS order_lines (
        id BIGINT PRIMARY KEY AUTO_INCREMENT, order_id BIGINT NOT NULL, sku VARCHAR(32) NOT NULL,
        qty INT NOT NULL, price DECIMAL(10,2) NOT NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS outbox (
        id CHAR(36) PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
        type VARCHAR(255) NOT NULL, payload LONGTEXT, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
    ) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS audit_log (
        id BIGINT PRIMARY KEY AUTO_INCREMENT, note VARCHAR(255) NOT NULL
    ) ENGINE=MyISAM""",
)

ILLEGAL_AGGREGATE = "gift card"  # a space: not a legal Kafka topic character


@dataclass(frozen=True)
class CommittedEvent:
    event_id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str


@dataclass
class WorkloadResult:
    committed: list[CommittedEvent] = field(default_factory=list)  # in commit order
    rolled_back: list[str] = field(default_factory=list)  # event ids that must never appear
    transactions: int = 0
    rollbacks: int = 0
    expected_dead_letters: int = 0

    @property
    def committed_count(self) -> int:
        return len(self.committed)


class ShopWorkload:
    def __init__(self, connect: Callable[[], pymysql.connections.Connection], seed: int = 7, payload_bytes: int = 300):
        self._connect = connect
        self._rng = random.Random(seed)
        self._payload_bytes = payload_bytes
        self.result = WorkloadResult()

    def create_schema(self) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                for sql in SCHEMA_SQL:
                    cur.execute(sql)
            conn.commit()
        finally:
            conn.close()

    def _event_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _payload(self, order_id: int, kind: str, extra: dict[str, Any]) -> str:
        body = {"order_id": order_id, "kind": kind, **extra}
        text = json.dumps(body, separators=(",", ":"))
        pad = max(0, self._payload_bytes - len(text) - 10)
        body["note"] = "x" * pad
        return json.dumps(body, separators=(",", ":"))

    def _outbox(
        self, cur, pending: list[CommittedEvent], aggregate_type: str, aggregate_id: str, event_type: str, payload: str
    ) -> str:
        event_id = self._event_id()
        cur.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s,%s,%s,%s,%s)",
            (event_id, aggregate_type, aggregate_id, event_type, payload),
        )
        pending.append(CommittedEvent(event_id, aggregate_type, aggregate_id, event_type, payload))
        return event_id

    def run(
        self, orders: int, on_progress: Callable[[WorkloadResult], None] | None = None, special_cases: bool = True
    ) -> WorkloadResult:
        """Write `orders` order transactions (plus the special cases once, early on)."""
        conn = self._connect()
        rng, res = self._rng, self.result
        specials = (
            {
                max(1, orders // 10): self._savepoint_rollback,
                max(2, orders // 5): self._myisam_rollback,
                max(3, orders // 4): self._insert_then_delete,
                max(4, orders // 3): self._dead_letter,
            }
            if special_cases
            else {}
        )
        customers = [f"c{n:04d}" for n in range(50)]
        try:
            for n in range(orders):
                if n in specials:
                    specials[n](conn)
                pending: list[CommittedEvent] = []
                with conn.cursor() as cur:
                    customer = rng.choice(customers)
                    lines = rng.randint(1, 3)
                    total = round(rng.uniform(5, 500), 2)
                    cur.execute(
                        "INSERT INTO orders (customer,total,status,created_at) VALUES (%s,%s,'new',NOW(6))",
                        (customer, total),
                    )
                    order_id = cur.lastrowid
                    for _ in range(lines):
                        cur.execute(
                            "INSERT INTO order_lines (order_id,sku,qty,price) VALUES (%s,%s,%s,%s)",
                            (order_id, f"sku-{rng.randint(1, 999)}", rng.randint(1, 5), round(rng.uniform(1, 99), 2)),
                        )
                    key = f"order-{order_id}"
                    self._outbox(
                        cur,
                        pending,
                        "order",
                        key,
                        "OrderCreated",
                        self._payload(order_id, "created", {"customer": customer, "total": total}),
                    )
                    if rng.random() < 0.3:  # several events in one transaction
                        self._outbox(
                            cur,
                            pending,
                            "payment",
                            key,
                            "PaymentRequested",
                            self._payload(order_id, "payment", {"amount": total}),
                        )
                rollback = rng.random() < 0.05
                res.transactions += 1
                if rollback:
                    conn.rollback()
                    res.rollbacks += 1
                    res.rolled_back.extend(e.event_id for e in pending)
                else:
                    conn.commit()
                    res.committed.extend(pending)
                if on_progress is not None and n % 50 == 0:
                    on_progress(res)
        finally:
            conn.close()
        if on_progress is not None:
            on_progress(res)
        return res

    def _savepoint_rollback(self, conn) -> None:
        """Two events; the second is rolled back to a savepoint, the first commits."""
        res, pending = self.result, list[Any]()
        with conn.cursor() as cur:
            self._outbox(cur, pending, "order", "order-sp", "OrderNoted", self._payload(0, "savepoint-kept", {}))
            cur.execute("SAVEPOINT before_second")
            cut: list[CommittedEvent] = []
            self._outbox(cur, cut, "order", "order-sp", "OrderNoted", self._payload(0, "savepoint-cut", {}))
            cur.execute("ROLLBACK TO SAVEPOINT before_second")
        conn.commit()
        res.transactions += 1
        res.committed.extend(pending)
        res.rolled_back.extend(e.event_id for e in cut)

    def _myisam_rollback(self, conn) -> None:
        """A transaction that also wrote a MyISAM table rolls back: the binlog then
        carries the transaction with a ROLLBACK at its end."""
        res, pending = self.result, list[Any]()
        with conn.cursor() as cur:
            cur.execute("INSERT INTO audit_log (note) VALUES ('non-transactional write')")
            self._outbox(cur, pending, "order", "order-myisam", "OrderNoted", self._payload(0, "myisam", {}))
        conn.rollback()
        res.transactions += 1
        res.rollbacks += 1
        res.rolled_back.extend(e.event_id for e in pending)

    def _insert_then_delete(self, conn) -> None:
        """Debezium's recommended pattern: insert the outbox row and delete it in the same
        transaction; the insert is still in the binlog and must be published once."""
        res, pending = self.result, list[Any]()
        with conn.cursor() as cur:
            event_id = self._outbox(cur, pending, "order", "order-itd", "OrderNoted", self._payload(0, "itd", {}))
            cur.execute("DELETE FROM outbox WHERE id=%s", (event_id,))
        conn.commit()
        res.transactions += 1
        res.committed.extend(pending)

    def _dead_letter(self, conn) -> None:
        res, pending = self.result, list[Any]()
        with conn.cursor() as cur:
            self._outbox(cur, pending, ILLEGAL_AGGREGATE, "card-1", "CardIssued", self._payload(0, "card", {}))
        conn.commit()
        res.transactions += 1
        res.expected_dead_letters += 1
        res.committed.extend(pending)
