"""Which clock a latency is measured from. MySQL 8's Gtid_log_event carries the
transaction's commit time in microseconds (`immediate_commit_timestamp`); MariaDB's
binlog has only the commit event header (seconds). The verifier's independent reader
takes the former where the server writes it, and both verifiers prefer it to the outbox
timestamp column, and that to the header, naming the clock of every figure.

The byte fixtures follow MySQL's documentation of Gtid_log_event (libbinlogevents
control_events.h): after sequence_number, immediate_commit_timestamp as 7 little-endian
bytes whose top bit (bit 55) says original_commit_timestamp (7 more bytes) follows."""

import pytest

from spark_jobs.follow_state import FollowState
from spark_jobs.mysql.binlog_assembly import TxAssembler, mysql_commit_us
from spark_jobs.mysql.binlog_rows import EventColumns, EventMapper

IMMEDIATE = 1_764_050_000_123_456  # 2025-11-25T05:53:20.123456Z, microseconds


def test_the_commit_timestamp_after_the_logical_clock():
    alone = (
        IMMEDIATE.to_bytes(7, "little") + bytes([0x05]) + (80_400).to_bytes(4, "little")
    )  # + transaction_length, server version
    assert mysql_commit_us(alone) == IMMEDIATE
    with_original = (
        (IMMEDIATE | 1 << 55).to_bytes(7, "little") + (IMMEDIATE - 500).to_bytes(7, "little") + bytes([0x05])
    )
    assert mysql_commit_us(with_original) == IMMEDIATE  # the flag bit is not part of the time
    assert mysql_commit_us(b"") is None  # MySQL 5.7's event ends at sequence_number
    assert mysql_commit_us(bytes(7)) is None  # 0: not written


def test_the_assembled_transaction_and_its_rows_carry_it():
    asm = TxAssembler()
    asm.gtid_event(100, "3e11fa47-71ca-11e1-9e33-c80aa9429562:7", 1, commit_us=IMMEDIATE)
    asm.begin(180, 1)
    asm.add_rows(
        "d", "outbox", [{"id": "e1", "aggregatetype": "order", "aggregateid": "k", "type": "T", "payload": "{}"}], 200
    )
    tx = asm.commit(400, 1_764_050_000)
    assert tx is not None and tx.commit_us == IMMEDIATE and tx.commit_ts == 1_764_050_000
    asm.gtid_event(400, "0-1-8", 1, implies_begin=True)  # MariaDB: no such field
    tx2 = asm.commit(600, 1_764_050_001)
    assert tx2 is not None and tx2.commit_us is None


def test_the_follow_state_prefers_the_mysql_commit_time_and_names_each_clock():
    st = FollowState(source="s", dlq_topic="dlq")
    st.start = st.read_through = st.verified_through = ("mysql-bin.000001", 1, 100)
    st.kafka_next = {("t", 0): 0}
    base = {"source": "s", "server_id": 1, "file": "mysql-bin.000001", "file_seq": 1, "row": 0, "gtid": None,
            "table": "d.outbox", "aggregate_type": "order", "aggregate_id": "k", "event_type": "T", "payload": b"{}",
            "payload_is_text": True, "expected_topic": "t", "dlq_cause": None, "dlq_error": None, "kind": "event",
            "xa_xid": None, "xa_prepare": None, "commit_ts_ms": 1_764_050_000_000}  # fmt: skip
    events = [
        {**base, "ikey": "a", "tx_pos": 100, "tx_end": 150, "event_id": "a", "commit_us": IMMEDIATE, "timestamp_us": IMMEDIATE - 5_000},
        {**base, "ikey": "b", "tx_pos": 150, "tx_end": 200, "event_id": "b", "commit_us": None, "timestamp_us": IMMEDIATE - 5_000},
        {**base, "ikey": "c", "tx_pos": 200, "tx_end": 250, "event_id": "c", "commit_us": None, "timestamp_us": None},
    ]  # fmt: skip
    records = [{"topic": "t", "partition": 0, "offset": i, "timestamp_ms": IMMEDIATE // 1000 + 7, "key_text": "k", "ikey": e["ikey"],
                "source": "s", "h_file": e["file"], "h_file_seq": 1, "h_pos": e["tx_pos"], "h_row": 0, "h_gtid": None,
                "h_commit_ts": e["commit_ts_ms"], "h_event_id": e["event_id"], "h_event_type": "T", "repair": False,
                "dlq_cause": None, "v_id": e["event_id"], "v_aggregate_type": "order", "v_aggregate_id": "k", "v_type": "T",
                "v_payload": b"{}", "v_timestamp_us": e["timestamp_us"], "value_error": None, "h_xa_prepare": None,
                "h_xa_file_seq": None, "h_xa_pos": None, "marker": False}
               for i, e in enumerate(events)]  # fmt: skip
    st.apply_batch(0, events, records, now=0.0)
    assert st.counts["delivered"] == 3, st.counts
    assert list(st.latencies) == [7, 12, IMMEDIATE // 1000 + 7 - 1_764_050_000_000]
    assert st.latency_clocks == {
        "mysql_immediate_commit_timestamp": 1,
        "outbox_timestamp_column": 1,
        "binlog_commit_header": 1,
    }


@pytest.mark.verifier_deps  # builds an Arrow batch
def test_event_rows_have_the_column():
    asm = TxAssembler()
    asm.gtid_event(100, "3e11fa47-71ca-11e1-9e33-c80aa9429562:7", 1, commit_us=IMMEDIATE)
    asm.begin(180, 1)
    asm.add_rows(
        "d", "outbox", [{"id": "e1", "aggregatetype": "order", "aggregateid": "k", "type": "T", "payload": "{}"}], 200
    )
    tx = asm.commit(400, 1_764_050_000)
    from cdc.events.outbox import OutboxTable

    cols = EventColumns("s", EventMapper([OutboxTable("d", "outbox")]))
    cols.add_tx("mysql-bin.000001", tx)
    batch = cols.take().to_pydict()
    assert batch["commit_us"] == [IMMEDIATE] and batch["commit_ts_ms"] == [1_764_050_000_000]
