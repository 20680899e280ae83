"""What reading a topic back costs the broker as the topic grows: the stand-in (librdkafka's
mock cluster) against noida-db, with the verifier's own Kafka reader.

    ./run.sh bench readback [--broker standin|noida] [--partitions 64] [--steps 8] [--step 10000]

A producer writes `--step` small records at a time in one-record batches (as a relay at a few
thousand events/s over many partitions does: linger 1 ms, a pause every 20 records), then the
verifier's stream reader (`spark_jobs/kafka/stream.py`) reads exactly those records; printed
per step: the records in the topic, the reader's CPU per record, and the broker process's CPU
per record read. The stand-in finds a fetch's offset by walking the partition's batches from
the first and answers with one batch per partition, so its cost per record grows with the
partitions' length; a broker with an offset index does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="standin", choices=("standin", "noida"))
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--step", type=int, default=10_000)
    args = ap.parse_args()
    import psutil
    from confluent_kafka import Producer

    from spark_jobs.kafka.stream import KafkaStreamReader

    consumer: dict = {}
    broker: Any
    if args.broker == "noida":
        from testbed.noida import CONSUMER_SETTINGS, NoidaKafka

        broker = NoidaKafka.start()
        consumer = dict(CONSUMER_SETTINGS)
        pid = broker.proc.pid
    else:
        from testbed.kafka_standin import KafkaStandin

        broker = KafkaStandin.start(brokers=1)
        pid = broker.pid
    with broker:
        broker.create_topic("rb.order", args.partitions)
        broker.create_topic("rb.dlq", 1)
        proc = psutil.Process(pid)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 1, "enable.idempotence": True,
                             "partitioner": "murmur2_random"})  # fmt: skip
        reader = KafkaStreamReader({"bootstrap": broker.bootstrap_servers, "topics": "rb.order,rb.dlq",
                                    "dlq_topic": "rb.dlq", "consumer_conf": json.dumps(consumer)})  # fmt: skip
        before = reader.latestOffset({})
        n = 0
        print(f"{args.broker}, {args.partitions} partitions, steps of {args.step} records", flush=True)
        for _ in range(args.steps):
            for i in range(args.step):
                headers: list[tuple[str, str | bytes | None]] = [("cdc.source", b"rb"), ("cdc.binlog.file", b"mysql-bin.000001"),
                           ("cdc.binlog.pos", str(4 + n // 10).encode()), ("cdc.binlog.row", str(n % 10).encode())]  # fmt: skip
                producer.produce("rb.order", key=f"k{n % 1000}".encode(), value=b"x" * 60, headers=headers)
                n += 1
                if i % 20 == 19:
                    producer.poll(0)
                    time.sleep(0.002)
            producer.flush()
            after = reader.latestOffset(before)
            t = proc.cpu_times()
            broker_cpu, own_cpu = t.user + t.system, time.process_time()
            rows = sum(
                b.num_rows for part in reader.partitions(before, after) for b in reader._batches(part.value or [])
            )
            t = proc.cpu_times()
            broker_cpu = t.user + t.system - broker_cpu
            own_cpu = time.process_time() - own_cpu
            print(f"{n:>9} records in the topic: read {rows - args.partitions - 1} new, reader {1e6 * own_cpu / args.step:6.1f} "
                  f"us/record, broker {1e6 * broker_cpu / args.step:6.1f} us/record", flush=True)  # fmt: skip
            before = after


if __name__ == "__main__":
    main()
