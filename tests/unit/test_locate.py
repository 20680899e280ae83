"""`cdc locate` by a binlog position or a GTID, over records the Kafka scan would hand
over (the scan itself is Kafka's: replaced here by a list of records)."""

from __future__ import annotations

import pytest

import spark_jobs.locate as locate
from cdc.errors import PositionError
from cdc.events.identity import TxIdentity

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


class _Record:
    def __init__(self, offset: int, gtid: str | None, row: int = 0, source: str = "shop-db"):
        from cdc.position import BinlogPosition

        tx = TxIdentity(source, BinlogPosition("binlog.000001", 100 + offset), gtid, 1, 1_700_000_000_000)
        self._headers = tx.headers() + [("cdc.binlog.row", str(row).encode())]
        self._offset = offset

    def headers(self):
        return self._headers

    def topic(self):
        return "outbox.event.order"

    def partition(self):
        return 0

    def offset(self):
        return self._offset


@pytest.fixture
def records(monkeypatch):
    held = [
        _Record(0, f"{U1}:7"),
        _Record(1, f"{U1}:blue:7"),
        _Record(2, f"{U1}:blue:7", row=1),
        _Record(3, f"{U1}:red:7"),
        _Record(4, f"{U1}:blue:7", source="other-db"),
    ]
    monkeypatch.setattr(locate, "plan_kafka", lambda *a, **k: {"partitions": []})
    monkeypatch.setattr(locate, "scan_partitions", lambda *a, **k: iter(held))
    return held


def _offsets(where, row=None):
    return [o for _t, _p, o in locate.locate_position("kafka:9092", "outbox.event.order", "shop-db", where, row)]


def test_locate_by_a_tagged_gtid_finds_its_records_only(records):
    assert _offsets(f"{U1}:blue:7") == [1, 2]
    assert _offsets(f"{U1.upper()}:Blue:7", row=1) == [2]  # MySQL's text is case-insensitive
    assert _offsets(f"{U1}:7") == [0]  # the untagged GTID is another transaction
    assert _offsets(f" {U1}:red:7 ") == [3]


def test_locate_by_a_malformed_gtid_is_refused_not_read_as_a_position(records):
    with pytest.raises(PositionError, match="malformed MySQL GTID"):
        _offsets(f"{U1}:1tag:7")
