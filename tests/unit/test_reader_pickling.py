"""The reader process pickles what each "tx" message carries, a TxIdentity and positions, by
their fields (connectors/reader_process.py, `register_reductions`), not through the
dataclasses' per-field state: the relay unpickles the same objects."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest

from cdc.identity import TxIdentity
from cdc.position import BinlogPosition
from cdc.transaction import XA_COMMIT, XaMark
from connectors.reader_process import register_reductions

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
    register_reductions()
    end = BinlogPosition("mysql-bin.000007", 1234)
    message = ("tx", identity, end, 1, [], False, (0, 0, 0), XaMark(XA_COMMIT, "x1", _START))
    data = bytes(ForkingPickler.dumps(message))
    back = pickle.loads(data)
    assert back == message
    assert type(back[1]) is TxIdentity and type(back[2]) is BinlogPosition and type(back[1].start) is BinlogPosition
    assert back[2] > _START and hash(back[2]) == hash(end)  # a position that orders and hashes as built
    assert b"unchecked_position" in data and b"__setstate__" not in data  # the fields, not the dataclass's state
    # nothing named by the reader process's module: in the child it is `__main__`, which the
    # relay cannot import from (python -m connectors.reader_process, connectors/reader_spawn.py)
    assert b"reader_process" not in data and b"__main__" not in data
