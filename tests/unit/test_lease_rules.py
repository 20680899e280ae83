"""The lease's rules (cdc/lease.py) and the relay loop under a lease: it stops handing
messages to the producer once the lease runs out, purges the rest, writes no checkpoint
after that; every checkpoint carries the epoch; a file store refuses an older epoch."""

import pytest

from cdc.checkpoint import Checkpoint
from cdc.errors import ConfigError
from cdc.lease import LeaseClock, LeaseLost, LeaseSettings, Previous, lock_name, takeover_wait
from cdc.position import BinlogPosition
from connectors.checkpoint_stores import FileCheckpointStore
from fakes import Binlog, FakeCheckpointStore, RelayHarness, outbox_row

S = LeaseSettings(ttl_s=10.0, renew_s=1.0, margin_s=0.5)


def test_settings_refuse_a_lease_time_too_short_for_its_renewals():
    with pytest.raises(ConfigError, match=r"lease.ttl_s must be at least 2 and at least 3 x lease.renew_s"):
        LeaseSettings(ttl_s=2.0, renew_s=1.0)
    with pytest.raises(ConfigError, match=r"lease.margin_s"):
        LeaseSettings(ttl_s=10.0, margin_s=6.0)
    assert LeaseSettings(ttl_s=7.9).wait_timeout == 7


def test_lock_names_stay_within_64_characters_and_apart():
    assert lock_name("shop") == "cdc.relay.shop"
    a, b = lock_name("x" * 80), lock_name("x" * 79 + "y")
    assert len(a) == len(b) == 64 and a != b


@pytest.mark.parametrize(
    "previous,wait,why",
    [
        (Previous(0, False, False, False), 0.0, "no relay held"),
        (Previous(3, True, False, False), 0.0, "released the lease at a clean stop"),
        (Previous(3, False, True, False), 0.0, "is gone"),
        (Previous(3, False, False, True), 10.0, "ended while it was active"),
        (Previous(3, False, False, False), 70.0, "went silent or cannot be checked"),
    ],
)
def test_takeover_waits_only_as_long_as_the_previous_holder_could_still_publish(previous, wait, why):
    got, text = takeover_wait(previous, S, delivery_timeout_s=60.0)
    assert got == wait and why in text


def test_the_lease_runs_out_before_the_server_could_release_it():
    clock = LeaseClock(S, acquired_at=100.0)
    clock.check(109.4)  # acquired at 100: valid until 100 + 10 - 0.5
    with pytest.raises(LeaseLost, match=r"not confirmed for 9.5 s"):
        clock.check(109.5)


def test_confirmations_extend_from_when_they_were_sent():
    clock = LeaseClock(S, acquired_at=100.0)
    clock.confirmed(105.0)
    clock.confirmed(104.0)  # an older send time never moves it back
    clock.check(114.4)
    with pytest.raises(LeaseLost):
        clock.check(114.5)


def test_a_failed_confirmation_ends_the_lease_at_once_for_good():
    clock = LeaseClock(S, acquired_at=100.0)
    clock.lose("the lease session failed (2013 Lost connection)")
    clock.confirmed(101.0)
    with pytest.raises(LeaseLost, match=r"the lease session failed .*restart this one to make it a standby"):
        clock.check(100.1)


class _Monotonic:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _leased(binlog, store=None, **kw):
    h = RelayHarness(binlog, store=store, **kw)
    mono = _Monotonic()
    h.relay._monotonic = mono
    return h, mono


def _binlog(n):
    b = Binlog()
    for i in range(n):
        b.transaction([outbox_row(f"e{i}", "order", f"k{i % 3}")])
    return b


def test_every_checkpoint_carries_the_new_epoch_and_the_first_is_written_before_publishing():
    store = FakeCheckpointStore(Checkpoint("shop-db", BinlogPosition("mysql-bin.000001", 4), epoch=4))
    h, _mono = _leased(_binlog(5), store=store)
    published_at_first_save = []
    store.on_save = lambda cp: published_at_first_save.append(len(h.publisher.published))
    h.relay.run(lambda: h.factory.exhausted, lease=LeaseClock(S, 0.0), holder="cdc;c=9;h=a;b=1;n=2;p=3;s=4")
    assert published_at_first_save[0] == 0
    assert {cp.epoch for cp in store.history} == {5}
    assert {cp.holder for cp in store.history} == {"cdc;c=9;h=a;b=1;n=2;p=3;s=4"}
    assert [cp.released for cp in store.history][-1] is True and not any(cp.released for cp in store.history[:-1])
    assert len(h.kafka.records("outbox.event.order")) == 5


def test_without_a_lease_the_epoch_is_kept_and_nothing_is_released():
    store = FakeCheckpointStore(Checkpoint("shop-db", BinlogPosition("mysql-bin.000001", 4), epoch=4))
    h = RelayHarness(_binlog(2), store=store)
    h.run()
    assert {cp.epoch for cp in store.history} == {4} and not any(cp.released for cp in store.history)


def test_a_relay_whose_lease_runs_out_stops_handing_messages_over_purges_and_writes_no_checkpoint():
    h, mono = _leased(_binlog(40), publisher={"hold_acks": True})
    lease = LeaseClock(S, 0.0)

    def stop():
        # the clock runs out after 10 messages were handed to the producer
        if len(h.publisher.published) >= 10:
            mono.now = 9.5
        return h.factory.exhausted

    with pytest.raises(LeaseLost):
        h.relay.run(stop, lease=lease)
    assert len(h.publisher.published) == 10
    assert h.publisher.purged > 0 or not h.publisher.queue
    assert not h.publisher.queue and not h.publisher.unacked
    saved = len(h.store.history)
    assert all(cp.epoch == 1 for cp in h.store.history) and saved >= 1
    assert not any(cp.released for cp in h.store.history)


def test_a_lost_lease_is_noticed_while_idle_too():
    h, _mono = _leased(_binlog(1))
    lease = LeaseClock(S, 0.0)
    calls = []

    def stop():
        calls.append(1)
        if len(calls) == 50:
            lease.lose("the server says connection 7 holds lease 'cdc.relay.shop-db' now")
        return len(calls) > 1000

    with pytest.raises(LeaseLost, match="connection 7 holds"):
        h.relay.run(stop, lease=lease)
    assert len(calls) < 60


def test_a_file_store_refuses_a_checkpoint_of_an_older_epoch(tmp_path):
    store = FileCheckpointStore(tmp_path / "cp.json")
    pos = BinlogPosition("mysql-bin.000001", 4)
    store.save(Checkpoint("s", pos, epoch=2))
    store.save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 99), epoch=2))
    with pytest.raises(LeaseLost, match="lease epoch 2, this relay's is 1: a newer relay holds the source"):
        store.save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 500), epoch=1))
    assert store.load().position.pos == 99
    store.save(Checkpoint("s", pos, epoch=3))
    assert store.load().epoch == 3


def test_a_relay_frozen_while_writing_its_file_checkpoint_holds_up_no_successor(tmp_path, monkeypatch):
    """Found by test_lease.py's freeze test under load (2 failures in 2 runs): the relay
    SIGSTOPped inside its checkpoint's save, in the fsync that takes long on a busy disk,
    held the store's lock, so its successor's first checkpoint (the new lease epoch, written
    before anything is published) waited for the frozen relay to wake: it never published.
    Woken later, the frozen relay's write is refused: its epoch is older."""
    import os
    import threading

    from connectors import checkpoint_stores

    path = tmp_path / "cp.json"
    FileCheckpointStore(path).save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 4), epoch=1))
    frozen, wake = threading.Event(), threading.Event()
    fsync = os.fsync

    def freezing_fsync(fd: int) -> None:
        if threading.current_thread().name == "frozen relay" and not wake.is_set():
            frozen.set()
            wake.wait(30)
        fsync(fd)

    monkeypatch.setattr(checkpoint_stores.os, "fsync", freezing_fsync)
    outcome: dict = {}

    def save(name: str, checkpoint: Checkpoint) -> None:
        try:
            FileCheckpointStore(path).save(checkpoint)
            outcome[name] = "saved"
        except LeaseLost as exc:
            outcome[name] = exc

    old = threading.Thread(
        target=save, args=("old", Checkpoint("s", BinlogPosition("mysql-bin.000001", 50), epoch=1)), name="frozen relay"
    )
    old.start()
    assert frozen.wait(10)
    new = threading.Thread(target=save, args=("new", Checkpoint("s", BinlogPosition("mysql-bin.000001", 60), epoch=2)))
    new.start()
    new.join(5)
    waited = new.is_alive()
    wake.set()
    old.join(10)
    new.join(10)
    assert not waited, "the successor's checkpoint waited for the frozen relay"
    assert outcome["new"] == "saved" and isinstance(outcome["old"], LeaseLost), outcome
    assert FileCheckpointStore(path).load() == Checkpoint("s", BinlogPosition("mysql-bin.000001", 60), epoch=2)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == [], "no temporary file left"


def test_a_relay_that_stops_on_another_error_after_its_lease_ran_out_drops_what_is_queued_and_says_lease_lost():
    """Woken from a freeze, a relay may find a delivery failure (messages that timed out
    while it was frozen) as well as its lease gone: it must not drain (send) what is
    queued, nor write a checkpoint; the lease is what it reports."""
    from cdc.ports import Delivery, DeliveryFailure

    h, mono = _leased(_binlog(30), publisher={"hold_acks": True})
    lease = LeaseClock(S, 0.0)

    def stop():
        if len(h.publisher.published) >= 10 and mono.now == 0.0:
            mono.now = 9.5
            h.relay._failure = Delivery("outbox.event.order", 0, -1, DeliveryFailure("_MSG_TIMED_OUT", "timed out"))
        return h.factory.exhausted

    saved_before = []
    h.store.on_save = lambda cp: saved_before.append(mono.now)
    with pytest.raises(LeaseLost):
        h.relay.run(stop, lease=lease)
    assert not h.publisher.queue and not h.publisher.unacked
    assert all(t == 0.0 for t in saved_before), "a checkpoint was written after the lease ran out"
