"""The reader process pickles its messages with one pickler (connectors/mysql/reader_process.py,
`MessagePickler`), a TxIdentity and positions by their fields, not through the dataclasses'
per-field state: the relay's `Connection.recv` unpickles the same objects, message after
message (the memo and buffer start afresh each time)."""

from __future__ import annotations

import pickle

import pytest

from cdc.assembly.transaction import XA_COMMIT, XaMark, tx_identity
from cdc.events.identity import TxIdentity
from cdc.position import BinlogPosition, unchecked_position
from connectors.mysql.reader_process import MessagePickler

_START = BinlogPosition("mysql-bin.000007", 4)


@pytest.mark.parametrize(
    "identity",
    [
        TxIdentity("src", _START, None, 1, 1764200000123),
        TxIdentity("src", _START, "0-1-77", 2, 0, BinlogPosition("mysql-bin.000006", 99)),
        TxIdentity("src", _START, "3E11FA47-71CA-11E1-9E33-C80AA9429562:23", 3, 5),
    ],
)
def test_a_tx_message_unpickles_to_the_same_objects(identity: TxIdentity):
    end = BinlogPosition("mysql-bin.000007", 1234)
    message = ("tx", identity, end, 1, [(2, "e1", "order")], False, (0, 0, 0), XaMark(XA_COMMIT, "x1", _START))
    dumps = MessagePickler().dumps
    data = dumps(message)
    for _ in range(3):  # the same pickler, message after message: the same bytes, read back alone
        again = dumps(message)
        assert again == data and pickle.loads(again) == message
    back = pickle.loads(data)
    assert back == message
    assert type(back[1]) is TxIdentity and type(back[2]) is BinlogPosition and type(back[1].start) is BinlogPosition
    assert back[2] > _START and hash(back[2]) == hash(end)  # a position that orders and hashes as built
    assert (
        b"unchecked_position" in data and b"tx_identity" in data and b"__setstate__" not in data
    )  # the fields, not the dataclass's state
    # nothing named by the reader process's module: in the child it is `__main__`, which the
    # relay cannot import from (python -m connectors.mysql.reader_process, connectors/mysql/reader_spawn.py)
    assert b"reader_process" not in data and b"__main__" not in data


def test_an_identity_built_without_its_init_is_the_same():
    for args in [("s", _START, None, 1, 2), ("s", _START, "0-1-2", 3, 4, BinlogPosition("mysql-bin.000001", 9))]:
        fast, plain = tx_identity(*args), TxIdentity(*args)
        assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    position = unchecked_position("mysql-bin.000003", 77)
    assert position == BinlogPosition("mysql-bin.000003", 77) and hash(position) == hash(
        BinlogPosition("mysql-bin.000003", 77)
    )
