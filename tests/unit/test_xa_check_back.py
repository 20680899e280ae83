"""The check-back of undecided XA transactions: immunity time, interval, the number of
checks, and the operator problem after the last one (a fake clock, a fake XA RECOVER)."""

import logging

from cdc.delivery.inflight import HeldPrepare, Resume
from cdc.delivery.xa_check_back import XaCheckBack
from cdc.events.outbox import OutboxTable
from cdc.metrics import RelayMetrics
from cdc.position import BinlogPosition
from cdc.relay_settings import RelaySettings

XID = "X'78',X'',1"


class Server:
    def __init__(self, listed):
        self.listed, self.asked = listed, 0

    def prepared_xids(self):
        self.asked += 1
        return self.listed


def held(prepared_ts=1000):
    resume = Resume(BinlogPosition("mysql-bin.000001", 400), 1, None, {}, 0)
    return {XID: HeldPrepare(XID, BinlogPosition("mysql-bin.000001", 420), prepared_ts, resume)}


def check_back(server, **kw):
    settings = RelaySettings(
        "src", (OutboxTable("shop", "outbox"),), xa_check_after_s=60, xa_check_interval_s=30, xa_max_checks=3, **kw
    )
    metrics = RelayMetrics()
    return XaCheckBack(settings, server, metrics), metrics


def test_checked_after_the_immunity_time_every_interval_then_reported_once(caplog):
    server = Server({XID})
    cb, m = check_back(server)
    caplog.set_level(logging.INFO)
    h = held()
    cb.run(h, 1059)  # younger than the immunity time
    assert server.asked == 0 and m.xa_undecided == 1 and m.xa_oldest_undecided_age_s == 59
    cb.run(h, 1060)
    cb.run(h, 1080)  # within the interval: not asked again
    assert server.asked == 1
    cb.run(h, 1090)
    cb.run(h, 1120)
    assert server.asked == 3 and m.xa_problems and XID in m.xa_problems[0]
    cb.run(h, 1500)  # past the last check: held and reported, never asked again, logged once
    assert server.asked == 3 and m.xa_problems
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and f"XA COMMIT {XID} or XA ROLLBACK {XID}" in errors[0].getMessage()
    assert "checkpoint stays at mysql-bin.000001:400" in errors[0].getMessage()
    cb.run({}, 1600)  # decided and delivered: the problem clears
    assert m.xa_problems == [] and m.xa_undecided == 0


def test_a_transaction_no_longer_listed_is_waited_for_and_a_denied_xa_recover_is_said(caplog):
    caplog.set_level(logging.INFO)
    cb, _ = check_back(Server(set()))
    cb.run(held(), 2000)
    assert "no longer lists it: decided, its outcome is not read yet" in caplog.text
    cb, _ = check_back(Server(None))
    cb.run(held(), 2000)
    assert "XA RECOVER not permitted" in caplog.text
