"""The NATS publisher's chains (connectors/nats/chain.py): which message may be sent when, and
with which `Nats-Expected-Last-Sequence`, so that a message refused by a replicated stream is
never stored after a later one. What JetStream does with the header is tested against the real
cluster (tests/integration/test_nats_cluster_faults.py); here, the publisher's side alone."""

from __future__ import annotations

from connectors.nats.chain import BLOCKED, UNCHAINED, Chains


def _chains() -> Chains:
    chains = Chains()
    chains.learn("shop.order", "SHOP", replicated=True)
    chains.learn("shop.invoice", "SHOP", replicated=True)  # the same stream: one chain
    chains.learn("audit.row", "AUDIT", replicated=True)
    chains.learn("single.row", "SINGLE", replicated=False)
    return chains


def test_a_stream_of_one_replica_is_not_chained():
    chains = _chains()
    assert [chains.expect("single.row", n) for n in range(3)] == [UNCHAINED] * 3


def test_an_opening_goes_alone_then_the_chain_is_pipelined_from_its_sequence():
    chains = _chains()
    assert chains.expect("shop.order", 1) == UNCHAINED  # the opening
    assert chains.expect("shop.order", 2) == BLOCKED  # until it is answered
    assert chains.expect("shop.invoice", 2) == BLOCKED  # same stream
    assert chains.expect("audit.row", 2) == UNCHAINED  # another stream: its own opening
    chains.stored("shop.order", 1, seq=10, duplicate=False, current=True)
    # each expects its predecessor's sequence, without waiting for its answer
    assert [chains.expect(s, n) for n, s in enumerate(["shop.order", "shop.invoice", "shop.order"], 2)] == [10, 11, 12]
    for n, seq in ((2, 11), (3, 12)):
        chains.stored("shop.order", n, seq=seq, duplicate=False, current=True)
    assert chains.expect("shop.order", 5) == 13  # answers do not hold the chain back


def test_after_a_refusal_nothing_is_sent_until_the_rest_in_flight_is_answered_then_an_opening():
    chains = _chains()
    chains.expect("shop.order", 1)
    chains.stored("shop.order", 1, seq=10, duplicate=False, current=True)
    assert [chains.expect("shop.order", n) for n in (2, 3, 4)] == [10, 11, 12]
    chains.not_stored("shop.order", 2)  # refused (10071, or taken back)
    # 3 and 4 expect sequences the stream will not reach while 2 is not stored: they will be
    # refused too; sending 2 again before their answers could let one of them in after it
    assert chains.expect("shop.order", 2) == BLOCKED
    chains.not_stored("shop.order", 3)
    assert chains.expect("shop.order", 2) == BLOCKED
    chains.not_stored("shop.order", 4)
    assert chains.expect("shop.order", 2) == UNCHAINED  # every earlier message stored: an opening
    assert chains.expect("shop.order", 3) == BLOCKED
    chains.stored("shop.order", 2, seq=11, duplicate=False, current=True)
    assert [chains.expect("shop.order", n) for n in (3, 4)] == [11, 12]


def test_a_duplicate_gives_no_base_and_neither_does_an_earlier_copys_answer():
    chains = _chains()
    chains.expect("shop.order", 1)
    chains.stored("shop.order", 1, seq=7, duplicate=True, current=True)  # stored before: later ones may be too
    assert chains.expect("shop.order", 2) == UNCHAINED  # another opening
    chains.stored("shop.order", 2, seq=30, duplicate=False, current=False)  # an earlier copy's answer
    assert chains.expect("shop.order", 3) == UNCHAINED  # the last copy is still out: not a base
    chains.stored("shop.order", 3, seq=31, duplicate=False, current=True)
    assert chains.expect("shop.order", 4) == 31


def test_a_chained_duplicate_breaks_the_chain():
    chains = _chains()
    chains.expect("shop.order", 1)
    chains.stored("shop.order", 1, seq=10, duplicate=False, current=True)
    assert [chains.expect("shop.order", n) for n in (2, 3)] == [10, 11]
    chains.stored("shop.order", 2, seq=4, duplicate=True, current=True)  # took no sequence
    assert chains.expect("shop.order", 4) == BLOCKED  # 3 is in flight (it will be refused)
    chains.not_stored("shop.order", 3)
    assert chains.expect("shop.order", 3) == UNCHAINED


def test_a_new_connection_starts_every_chain_again():
    chains = _chains()
    chains.expect("shop.order", 1)
    chains.stored("shop.order", 1, seq=10, duplicate=False, current=True)
    chains.expect("shop.order", 2)
    chains.reset()  # everything unanswered is taken back
    assert chains.expect("shop.order", 2) == UNCHAINED
    assert chains.expect("audit.row", 3) == UNCHAINED


def test_a_subject_without_a_stream_is_looked_up_again_once_forgotten():
    chains = Chains()
    assert not chains.known("new.subject")
    chains.learn("new.subject", None, replicated=False)
    assert chains.known("new.subject") and chains.expect("new.subject", 1) == UNCHAINED
    chains.forget("new.subject")
    assert not chains.known("new.subject")
