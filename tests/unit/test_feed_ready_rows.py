"""`LocalFeed` takes the row inserts a source has read already in one call when the source
offers `ready_rows` (connectors/mysql/binlog_source.py does), not one `read` each: the
transactions it returns, their rows and order, and the crash point per row stay the same."""

from __future__ import annotations

from typing import Any

import pytest
from delivery_parts import committed

from cdc.assembly import feed as feed_module
from cdc.source_events import RowInsert
from fakes import Binlog, FakeSource, FakeSourceFactory, outbox_row


class ReadyRowsSource(FakeSource):
    """FakeSource plus `ready_rows`: the run of row inserts next in the binlog, as the
    MySQL source gives the run at the head of its decoded batch."""

    def ready_rows(self) -> list[Any]:
        events, start = self._f.binlog.events, self.index
        while self.index < len(events) and type(events[self.index]) is RowInsert:
            self.index += 1
        return events[start : self.index]


class ReadyRowsFactory(FakeSourceFactory):
    def open(self, start: Any) -> FakeSource:
        plain = super().open(start)
        source = ReadyRowsSource(self, plain.index)
        source._info_sent = plain._info_sent
        self.sources[-1] = source
        return source


def _binlog() -> Binlog:
    b = Binlog()
    n = 0
    for tx in range(4):
        b.begin(gtid=f"0-1-{tx + 1}")
        for i in range(7):
            b.insert(outbox_row(f"e{n}", aggregate_id=f"k{i % 3}"))
            n += 1
            if i == 2:
                b.insert({"x": i}, table="other")  # an unwatched table's row inside the run
            if tx == 1 and i == 3:
                b.savepoint("s")
            if tx == 1 and i == 5:
                b.rollback_to("s")
        if tx == 2:  # REPLACE of an event id: delete + insert is a change, not a second event
            b.change("delete", outbox_row("e14"))
            b.insert(outbox_row("e14", payload="again"))
        b.commit()
    return b


def _committed(factory: FakeSourceFactory) -> list[tuple]:
    out = []
    for tx in committed(factory.binlog, factory=factory):
        rows = [(i.event_id, i.payload, i.identity.row) for i in tx.items()]  # type: ignore[union-attr]
        out.append((tx.identity.gtid, tx.end, tx.size, rows))
    return out


def test_a_run_of_rows_taken_at_once_gives_the_same_transactions(monkeypatch: pytest.MonkeyPatch):
    hits: list[str] = []
    monkeypatch.setattr(feed_module.crashpoints, "hit", hits.append)
    monkeypatch.setattr(feed_module.crashpoints, "_armed", "mid_transaction")  # as CDC_CRASH_AT does
    plain, ready = FakeSourceFactory(_binlog()), ReadyRowsFactory(_binlog())
    expected = _committed(plain)
    plain_hits, hits[:] = list(hits), []
    assert _committed(ready) == expected
    assert [tx[2] for tx in expected] == [7, 5, 7, 7]  # the savepoint's two rows rolled back
    assert hits == plain_hits and hits.count("mid_transaction") == 4 * 8 + 1  # one per row
    assert plain.reads - ready.reads >= 20  # most rows did not go through read()


def test_an_unarmed_crash_point_is_not_passed_per_row(monkeypatch: pytest.MonkeyPatch):
    """Unarmed (every run outside the fault tests), the feed does not call `hit` per row."""
    hits: list[str] = []
    monkeypatch.setattr(feed_module.crashpoints, "hit", hits.append)
    monkeypatch.setattr(feed_module.crashpoints, "_armed", None)
    ready = ReadyRowsFactory(_binlog())
    assert [tx[2] for tx in _committed(ready)] == [7, 5, 7, 7]
    assert hits.count("mid_transaction") == 0
    monkeypatch.setattr(feed_module.crashpoints, "_armed", "xa_outcome")  # another point armed
    assert [tx[2] for tx in _committed(ReadyRowsFactory(_binlog()))] == [7, 5, 7, 7]
    assert hits.count("mid_transaction") == 0
