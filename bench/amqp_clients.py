"""Publish + confirm throughput of the AMQP 0-9-1 clients that could carry the RabbitMQ
exchange sink (docs/sinks.md), against a real RabbitMQ node: each publishes N persistent
messages of the relay's shape (about 400 bytes, 8 headers, a message id) to a topic exchange
bound to a stream and a classic queue, mandatory, with publisher confirms, and waits for the
last confirm.

* `aiormq`: asyncio, a window of unconfirmed messages in flight (what the sink does);
* `pika`: BlockingConnection with confirm_delivery (basic_publish waits for each confirm:
  its only confirm mode without writing the I/O loop ourselves);
* `amqp` (py-amqp, Celery's): confirm_publish, which also waits for each confirm.

    python bench/amqp_clients.py [--messages 20000] [--window 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from testbed.rabbitmq import EmbeddedRabbitMQ

BODY = b"x" * 300


def headers(i: int) -> dict[str, Any]:
    return {"cdc.key": f"order-{i % 97}", "cdc.source": "bench", "cdc.file": "binlog.000001", "cdc.pos": str(i),
            "cdc.row": "0", "cdc.event.id": str(i), "id": str(i), "eventType": "OrderCreated"}  # fmt: skip


def setup(node: EmbeddedRabbitMQ, exchange: str) -> None:
    import pika  # type: ignore[import-untyped]  # a measured candidate (the test extra), no stubs

    params = pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, credentials=pika.PlainCredentials(node.user, node.password)
    )
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare(exchange, "topic", durable=True)
    for name, args in ((f"{exchange}.audit", {"x-queue-type": "stream"}), (f"{exchange}.q", None)):
        ch.queue_declare(name, durable=True, arguments=args)
        ch.queue_bind(name, exchange, "#")
    conn.close()


async def run_aiormq(node: EmbeddedRabbitMQ, exchange: str, n: int, window: int) -> None:
    import aiormq
    from pamqp import commands as spec

    conn = await aiormq.connect(f"amqp://{node.user}:{node.password}@127.0.0.1:{node.amqp_port}/")
    ch = await conn.channel(publisher_confirms=True, on_return_raises=False)
    sem = asyncio.Semaphore(window)
    pending = set()
    for i in range(n):
        await sem.acquire()
        props = spec.Basic.Properties(delivery_mode=2, message_id=str(i), headers=headers(i))
        fut = asyncio.ensure_future(ch.basic_publish(BODY, exchange=exchange, routing_key="bench.order",
                                                     properties=props, mandatory=True))  # fmt: skip
        fut.add_done_callback(lambda _f: sem.release())
        pending.add(fut)
        fut.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await conn.close()


def run_pika(node: EmbeddedRabbitMQ, exchange: str, n: int) -> None:
    import pika

    params = pika.ConnectionParameters(
        "127.0.0.1", node.amqp_port, credentials=pika.PlainCredentials(node.user, node.password)
    )
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        props = pika.BasicProperties(delivery_mode=2, message_id=str(i), headers=headers(i))
        ch.basic_publish(exchange, "bench.order", BODY, props, mandatory=True)
    conn.close()


def run_amqp(node: EmbeddedRabbitMQ, exchange: str, n: int) -> None:
    import amqp  # type: ignore[import-untyped]  # a measured candidate (the test extra), no stubs

    conn = amqp.Connection(
        f"127.0.0.1:{node.amqp_port}", userid=node.user, password=node.password, confirm_publish=True
    )
    conn.connect()
    ch = conn.channel()
    for i in range(n):
        msg = amqp.Message(BODY, delivery_mode=2, message_id=str(i), application_headers=headers(i))
        ch.basic_publish(msg, exchange=exchange, routing_key="bench.order", mandatory=True)
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=2_000)
    args = ap.parse_args()
    with EmbeddedRabbitMQ.start() as node:
        for name in ("aiormq", "pika", "amqp"):
            exchange = f"bench-{name}-{uuid.uuid4().hex[:6]}"
            setup(node, exchange)
            t = time.monotonic()
            if name == "aiormq":
                asyncio.run(run_aiormq(node, exchange, args.messages, args.window))
            elif name == "pika":
                run_pika(node, exchange, args.messages)
            else:
                run_amqp(node, exchange, args.messages)
            took = time.monotonic() - t
            print(
                f"{name}: {args.messages} messages confirmed in {took:.2f}s = {args.messages / took:,.0f}/s", flush=True
            )


if __name__ == "__main__":
    main()
