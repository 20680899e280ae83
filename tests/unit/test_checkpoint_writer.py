"""The background checkpoint writer: order, coalescing, durability of `save`, errors."""

from __future__ import annotations

import threading

import pytest

from cdc.checkpoint import Checkpoint
from cdc.checkpoint_writer import CheckpointWriter
from cdc.position import BinlogPosition


def cp(pos: int) -> Checkpoint:
    return Checkpoint(source="s", position=BinlogPosition("mysql-bin.000001", pos))


class SlowStore:
    def __init__(self):
        self.saved: list[int] = []
        self.gate = threading.Event()
        self.fail = False

    def load(self):
        return None

    def save(self, c: Checkpoint) -> None:
        self.gate.wait(5)
        if self.fail:
            raise OSError("disk full")
        self.saved.append(c.position.pos)


def test_submit_does_not_wait_and_a_newer_checkpoint_replaces_a_waiting_one():
    store = SlowStore()
    w = CheckpointWriter(store)
    for pos in (10, 20, 30, 40):
        w.submit(cp(pos))  # returns at once although the store is blocked
    store.gate.set()
    w.save(cp(50))
    w.close()
    assert store.saved == sorted(store.saved), "written out of order"
    assert store.saved[-1] == 50
    assert len(store.saved) < 5  # waiting ones were replaced by newer ones


def test_save_returns_only_once_its_checkpoint_is_written():
    store = SlowStore()
    w = CheckpointWriter(store)
    done = threading.Event()
    t = threading.Thread(target=lambda: (w.save(cp(7)), done.set()))
    t.start()
    assert not done.wait(0.2)
    store.gate.set()
    assert done.wait(5)
    assert store.saved[-1] == 7
    w.close()


def test_a_failure_in_the_thread_is_raised_on_the_next_call():
    store = SlowStore()
    store.fail = True
    store.gate.set()
    w = CheckpointWriter(store)
    with pytest.raises(OSError, match="disk full"):
        w.save(cp(1))
    with pytest.raises(OSError):
        w.submit(cp(2))


def test_foreground_mode_writes_on_the_callers_thread():
    store = SlowStore()
    store.gate.set()
    w = CheckpointWriter(store, background=False)
    w.submit(cp(3))
    assert store.saved == [3]
    w.close()
