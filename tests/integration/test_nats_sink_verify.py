"""`cdc verify`, `cdc repair` and `cdc locate` on the NATS JetStream sink, by the relay's
config (`[sink] kind = "nats_jetstream"`: the verifier reads with `cdc_nats`): clean after
a clean run; a message deleted from the stream (missing), a second copy (duplicate), a
copy under another key (altered) and a message of a transaction the binlog never had
(phantom) are each named; repair re-publishes exactly the missing one; locate goes from a
stream sequence to the binlog and back."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cdc.config import load_config
from cdc.events.identity import H_EVENT_ID, H_FILE, H_GTID, H_POS, H_REPAIR, H_SOURCE
from cdc.events.sink_fields import H_KEY
from cdc_cli.repair import load_missing, repair
from cdc_cli.verify_commands import sink_source_options, verify_config
from spark_jobs.locate import locate_offset, locate_position
from spark_jobs.nats.source import plan_nats, read_range
from spark_jobs.verify import run_verify
from tests.integration.harness import OUTBOX_DDL, RelayThread, insert_events
from tests.integration.nats_harness import create_streams, nats_env, nats_raw_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _messages(server, subject: str) -> list:
    settings = server.connect_settings()
    [part] = plan_nats(settings, [subject])["partitions"]
    return list(read_range(settings, subject, part["stream"], part["low"], part["high"]))


def _tamper(server, stream: str, delete: list[int], publish: list[tuple[str, dict[str, str], bytes]]) -> None:
    import nats

    async def run() -> None:
        nc = await nats.connect(**server.connect_settings())
        try:
            js = nc.jetstream()
            for seq in delete:
                await js.delete_msg(stream, seq)
            for subject, headers, data in publish:
                await js.publish(subject, data, headers=headers)
        finally:
            await nc.close()

    asyncio.run(run())


def _copy(rec, **changes: str) -> dict[str, str]:
    headers = {k: v.decode() for k, v in rec.headers()}
    if rec.key() is not None:
        headers[H_KEY] = rec.key().decode()
    return {**headers, **changes}


def test_verify_repair_and_locate_on_jetstream(mariadb, nats_server, database, topic_prefix, tmp_path, spark):
    prefix = topic_prefix
    subject, stream = f"{prefix}.order", f"{prefix}_events"
    with mariadb.connect(database) as conn, conn.cursor() as cur:
        cur.execute(OUTBOX_DDL.format(name="outbox"))
    create_streams(nats_server, {stream: [subject, f"{prefix}.payment"], f"{prefix}_dlq": [f"{prefix}.dlq"]})
    raw = nats_raw_config(mariadb, nats_server, database, prefix, tmp_path / "cp.json")
    cfg = load_config(raw, nats_env(mariadb, nats_server))
    events = [(str(uuid.uuid4()), "order", f"k{n % 5}", "Created", '{"n": %d}' % n) for n in range(40)]
    events += [(str(uuid.uuid4()), "payment", f"p{n % 3}", "Paid", '{"n": %d}' % n) for n in range(10)]
    relay = RelayThread(cfg, check=False)
    try:
        with mariadb.connect(database) as conn:
            for start in range(0, len(events), 10):
                insert_events(conn, "outbox", events[start : start + 10])
                conn.commit()
        relay.wait_delivered(len(events), timeout=120)
    finally:
        relay.stop()

    from spark_jobs.session import register_sources

    register_sources(spark)
    start_file = raw["source"]["start"].split(":")[0]
    clean = run_verify(verify_config(cfg, str(tmp_path / "v1"), start_file=start_file), spark=spark)
    assert clean.ok and clean.counts["delivered"] == len(events), clean.summary_text()
    # the report names the sink it read, not Kafka's inputs
    assert "kafka" not in clean.inputs and clean.inputs["sink"]["kind"] == "nats_jetstream"
    assert "kafka_bootstrap" not in clean.config and "isolation" not in str(clean.inputs)

    held = _messages(nats_server, subject)
    by_id = {dict(r.headers())[H_EVENT_ID].decode(): r for r in held}
    dropped, duplicated, altered = by_id[events[7][0]], by_id[events[12][0]], held[-1]
    # a transaction that is not in the binlog: inside the verified range, at no transaction's start
    pos = int(dict(held[3].headers())[H_POS]) + 1
    phantom = _copy(held[3], **{H_POS: str(pos), H_GTID: "0-1-900000"})
    _tamper(
        nats_server,
        stream,
        delete=[dropped.offset(), altered.offset()],
        publish=[
            (subject, _copy(duplicated), duplicated.value()),
            (subject, _copy(altered, **{H_KEY: "tampered"}), altered.value()),
            (subject, phantom, held[3].value()),
        ],
    )
    faulty = run_verify(verify_config(cfg, str(tmp_path / "v2"), start_file=start_file), spark=spark)
    assert faulty.problems == {"missing": 1, "duplicate": 1, "altered": 1, "phantom": 1}, faulty.summary_text()
    examples = faulty.summary["examples"]
    assert [m["event_id"] for m in examples["missing"]] == [events[7][0]]
    assert [d["event_id"] for d in examples["duplicate"]] == [events[12][0]]
    assert examples["altered"][0]["reasons"] == ["key"]
    ghost = [r.offset() for r in _messages(nats_server, subject) if dict(r.headers()).get(H_GTID) == b"0-1-900000"]
    assert [p["kafka"]["offset"] for p in examples["phantom"]] == ghost

    missing = load_missing(str(tmp_path / "v2"))
    assert [m["event_id"] for m in missing] == [events[7][0]]
    result = repair(cfg, missing)
    assert (result.requested, result.published, result.already_present) == (1, 1, 0)
    repaired = [r for r in _messages(nats_server, subject) if H_REPAIR in dict(r.headers())]
    assert [dict(r.headers())[H_EVENT_ID].decode() for r in repaired] == [events[7][0]]
    assert repair(cfg, missing).published == 0  # found there now: nothing twice

    # locate: a sequence to its binlog event, and that event's position back to its sequence
    sink = sink_source_options(cfg)
    found = locate_offset("", subject, 0, by_id[events[20][0]].offset(), sink=sink)
    assert found is not None and found["event_id"] == events[20][0] and found["source"] == cfg.source.name
    hits = locate_position("", [subject], found["headers"][H_SOURCE], found["position"], found["row"], sink=sink)
    assert hits == [(subject, 0, by_id[events[20][0]].offset())]
    assert found["headers"][H_FILE] == found["file"]
