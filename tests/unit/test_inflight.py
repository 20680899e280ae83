"""InflightWindow: the delivered position moves over a prefix of whole, acknowledged
transactions only."""

from cdc.checkpoint import Checkpoint
from cdc.delivery.inflight import InflightWindow
from cdc.gtid import MariadbGtidPosition, MysqlGtidSet
from cdc.position import BinlogPosition

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def P(pos):
    return BinlogPosition("mysql-bin.000001", pos)


def tx(window, end, gtid=None, messages=1):
    entry = window.begin(P(end), gtid)
    for _ in range(messages):
        InflightWindow.expect(entry)
    entry.sealed = True
    return entry


def test_starts_from_the_checkpoint():
    cp = Checkpoint("s", P(500), gtids=f"{U1}:1-3", offsets={"t": {0: 7}}, events_delivered=4)
    w = InflightWindow(cp)
    assert w.position == P(500) and str(w.gtids) == f"{U1}:1-3" and w.offsets == {"t": {0: 7}}
    assert w.events_delivered == 4
    w.offsets["t"][0] = 99
    assert cp.offsets["t"][0] == 7  # the window does not write into the checkpoint
    empty = InflightWindow(None)
    assert empty.position is None and empty.gtids is None and empty.offsets == {}


def test_unacknowledged_transaction_holds_the_position():
    w = InflightWindow(None)
    a = tx(w, 100, messages=2)
    assert not w.advance() and w.position is None
    InflightWindow.acknowledged(a, "t", 0, 5)
    assert not w.advance() and w.position is None
    InflightWindow.acknowledged(a, "t", 1, 3)
    assert w.advance() and w.position == P(100)
    assert len(w) == 0 and w.messages_in_flight == 0


def test_unsealed_transaction_holds_the_position_even_when_acknowledged():
    w = InflightWindow(None)
    entry = w.begin(P(100), None)
    InflightWindow.expect(entry)
    InflightWindow.acknowledged(entry, "t", 0, 0)
    assert not w.advance() and w.position is None  # more messages may still be handed over
    entry.sealed = True
    assert w.advance() and w.position == P(100)


def test_out_of_order_acks_do_not_pass_an_unacknowledged_transaction():
    w = InflightWindow(None)
    a = tx(w, 100)
    b = tx(w, 200)
    c = tx(w, 300, messages=2)
    assert w.messages_in_flight == 4
    # c and b complete first
    InflightWindow.acknowledged(c, "t", 1, 10)
    InflightWindow.acknowledged(c, "t", 2, 4)
    InflightWindow.acknowledged(b, "t", 1, 9)
    assert not w.advance()
    assert w.position is None and w.offsets == {}
    InflightWindow.acknowledged(a, "t", 0, 2)
    assert w.advance()
    assert w.position == P(300)
    assert w.offsets == {"t": {0: 3, 1: 11, 2: 5}}


def test_position_stops_at_the_first_gap():
    w = InflightWindow(None)
    a, b, c = tx(w, 100), tx(w, 200), tx(w, 300)
    InflightWindow.acknowledged(a, "t", 0, 0)
    InflightWindow.acknowledged(c, "t", 0, 2)
    assert w.advance() and w.position == P(100)
    assert w.offsets == {"t": {0: 1}}  # c's offset is not recorded while b is in flight
    assert len(w) == 2
    InflightWindow.acknowledged(b, "t", 0, 1)
    w.advance()
    assert w.position == P(300) and w.offsets == {"t": {0: 3}}


def test_offsets_are_the_last_acknowledged_plus_one_and_never_go_back():
    cp = Checkpoint("s", P(50), offsets={"t": {0: 40}})
    w = InflightWindow(cp)
    a = tx(w, 100, messages=3)
    for offset in (41, 43, 42):  # out of order within the transaction
        InflightWindow.acknowledged(a, "t", 0, offset)
    w.advance()
    assert w.offsets["t"][0] == 44
    b = tx(w, 200)
    InflightWindow.acknowledged(b, "t", 0, 12)  # a lower offset (cannot happen, but must not go back)
    w.advance()
    assert w.offsets["t"][0] == 44


def test_transactions_without_messages_pass_at_once():
    w = InflightWindow(None)
    tx(w, 100, messages=0)
    tx(w, 200, messages=0)
    assert w.advance() and w.position == P(200)


def test_mysql_gtids_accumulate():
    w = InflightWindow(Checkpoint("s", P(1), gtids=f"{U1}:1-3"))
    for n, end in ((4, 100), (5, 200)):
        InflightWindow.acknowledged(tx(w, end, f"{U1}:{n}"), "t", 0, n)
    tx(w, 300, None, messages=0)
    w.advance()
    assert isinstance(w.gtids, MysqlGtidSet) and str(w.gtids) == f"{U1}:1-5"
    assert w.position == P(300)


def test_tagged_mysql_gtids_accumulate_in_their_own_source():
    w = InflightWindow(Checkpoint("s", P(1), gtids=f"{U1}:1-3:blue:1"))
    InflightWindow.acknowledged(tx(w, 100, f"{U1}:blue:2"), "t", 0, 1)
    InflightWindow.acknowledged(tx(w, 200, f"{U1}:4"), "t", 0, 2)
    w.advance()
    assert str(w.gtids) == f"{U1}:1-4:blue:1-2"
    assert w.position == P(200)


def test_gtids_start_empty_and_take_the_flavour_of_the_first_gtid():
    w = InflightWindow(None)
    tx(w, 100, "0-1-7", messages=0)
    tx(w, 200, "0-1-8", messages=0)
    w.advance()
    assert isinstance(w.gtids, MariadbGtidPosition) and str(w.gtids) == "0-1-8"


def test_gtid_of_an_unacknowledged_transaction_is_not_added():
    w = InflightWindow(None)
    InflightWindow.acknowledged(tx(w, 100, f"{U1}:1"), "t", 0, 0)
    tx(w, 200, f"{U1}:2")
    w.advance()
    assert str(w.gtids) == f"{U1}:1"


def test_events_delivered_counts_acknowledged_and_skipped_events():
    w = InflightWindow(Checkpoint("s", P(1), events_delivered=10))
    entry = w.begin(P(100), None)
    InflightWindow.skipped(entry)
    InflightWindow.expect(entry)
    entry.sealed = True
    assert w.messages_in_flight == 1
    InflightWindow.acknowledged(entry, "t", 0, 0)
    w.advance()
    assert w.events_delivered == 12
