"""Crash recovery, as a property: whatever the workload and wherever the relay is
killed (kill -9: no drain, no last checkpoint, in-flight messages landing as an arbitrary
per-partition prefix), restarting from the stored checkpoint over the same topics ends
with every committed outbox event in the topics exactly once, per key in commit order.
"""

import random
from collections import Counter, defaultdict

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from fakes import (
    TOO_LARGE,
    Binlog,
    FakeCheckpointStore,
    FakeKafka,
    RelayHarness,
    expected_events,
    identity_of,
    outbox_row,
)

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
TOPICS = {"outbox.event.order": 3, "outbox.event.user": 2, "outbox.dlq": 2}

rows = st.lists(
    st.tuples(st.sampled_from(["order", "order", "user", "bad type"]), st.sampled_from(["k1", "k2", "k3", "k4"])),
    min_size=1,
    max_size=5,
)
transactions = st.lists(
    st.fixed_dictionaries(
        {
            "rows": rows,
            "rollback": st.sampled_from([False, False, False, True]),
            "other": st.integers(0, 2),
            "after": st.sampled_from(["", "", "", "heartbeat", "rotate", "ddl"]),
            # an XA transaction: prepared here, decided `xa_delay` transactions later (or never)
            "xa": st.sampled_from(["", "", "", "commit", "commit", "rollback", "undecided"]),
            "xa_delay": st.integers(0, 2),
        }
    ),
    min_size=1,
    max_size=7,
)
runs = st.fixed_dictionaries(
    {
        "kill_after": st.integers(0, 40),  # source events read before kill -9
        "per_poll": st.sampled_from([None, 0, 1, 2]),
        "ack_order": st.sampled_from(["fifo", "reverse"]),
        "interval": st.sampled_from([0.0, 0.004, 100.0]),
        "seed": st.integers(0, 2**16),
        "source_error_at": st.none() | st.integers(0, 40),
    }
)


def build(workload, gtids):
    b = Binlog()
    seq = 0
    due = []  # [transactions still to come, xid, commit?]

    def outcomes(final=False):
        nonlocal seq
        for item in list(due):
            item[0] -= 1
            if item[0] < 0 or (final and item[2] is not None):
                due.remove(item)
                if item[2] is not None:
                    seq += 1
                    b.xa_outcome(item[1], item[2], gtid=f"{U1}:{seq}" if gtids else None)

    for t, tx in enumerate(workload):
        seq += 1
        rows = [outbox_row(f"t{t}r{j}", agg, key) for j, (agg, key) in enumerate(tx["rows"])]
        if tx.get("xa"):
            b.xa_prepare(f"X'{t:02x}',X'',1", rows, gtid=f"{U1}:{seq}" if gtids else None)
            decision = {"commit": True, "rollback": False}.get(tx["xa"])
            due.append([tx.get("xa_delay", 0), f"X'{t:02x}',X'',1", decision])
            outcomes()
            continue
        b.begin(gtid=f"{U1}:{seq}" if gtids else None)
        for i in range(tx["other"]):
            b.insert({"id": i}, table="orders")
        for row in rows:
            b.insert(row)
        b.rollback() if tx["rollback"] else b.commit()
        outcomes()
        if tx["after"] == "heartbeat":
            b.heartbeat()
        elif tx["after"] == "rotate":
            b.rotate()
        elif tx["after"] == "ddl":
            seq += 1
            b.begin(gtid=f"{U1}:{seq}" if gtids else None, begin_query=False, standalone=True)
            b.statement("ALTER TABLE shop.orders ADD COLUMN c INT")
    outcomes(final=True)
    return b


def _plan(kill_after=0, per_poll=None, seed=0, ack_order="fifo", interval=0.0, source_error_at=None):
    return dict(
        kill_after=kill_after,
        per_poll=per_poll,
        ack_order=ack_order,
        interval=interval,
        seed=seed,
        source_error_at=source_error_at,
    )


def _tx(*rows, rollback=False, other=0, after="", xa="", xa_delay=0):
    return dict(rows=list(rows), rollback=rollback, other=other, after=after, xa=xa, xa_delay=xa_delay)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=transactions,
    gtids=st.booleans(),
    crashes=st.lists(runs, max_size=3),
    final=runs,
    too_large_key=st.sampled_from([None, None, b"k3"]),
    reporting=st.booleans(),
)
@example(  # found by this test: a late too-large redirect let the checkpoint's dead-letter
    # offset pass a later transaction's dead letter, which a restart then published again
    workload=[
        _tx(("order", "k1"), ("order", "k1"), ("order", "k1"), ("order", "k3"), ("order", "k1")),
        _tx(("order", "k1"), ("bad type", "k1")),
        _tx(("order", "k1")),
    ],
    gtids=False,
    crashes=[_plan(), _plan(kill_after=11, per_poll=2, seed=299), _plan(kill_after=11, per_poll=1)],
    final=_plan(),
    too_large_key=b"k3",
    reporting=True,
)
def test_kill_and_restart_delivers_every_committed_event_exactly_once_in_order(
    workload, gtids, crashes, final, too_large_key, reporting
):
    """`too_large_key`: the broker refuses every message of that key as too large (the
    relay must redirect each to the dead-letter topic). `reporting`: acknowledgements
    reach the hand-over as the Kafka publisher's own reports, or as the port's Delivery."""
    b = build(workload, gtids)
    kafka = FakeKafka(TOPICS)
    losses = []

    def no_loss(cp):
        # invariant 3: the checkpoint never passes an event that is not in the topics
        present = {r.header_text["id"] for r in kafka.records()}
        for tx in b.committed():
            if tx.end <= cp.position:
                losses.extend((str(cp.position), r["id"]) for r in tx.outbox_rows if r["id"] not in present)
            elif tx.prepared_at is not None and tx.prepared_at < cp.position:
                # an XA transaction's rows lie at its prepare: a checkpoint past the prepare
                # and before the commit loses them unless they are all delivered already
                losses.extend((str(cp.position), r["id"]) for r in tx.outbox_rows if r["id"] not in present)
        for xid, prepared_at in b.xa_undecided.items():
            if prepared_at < cp.position:
                losses.append((str(cp.position), xid))

    store = FakeCheckpointStore(on_save=no_loss)

    def fail(msg):
        return TOO_LARGE if too_large_key and msg.key == too_large_key and msg.topic != "outbox.dlq" else None

    def harness(plan):
        fail_at = {plan["source_error_at"]} if plan["source_error_at"] is not None else set()
        return RelayHarness(
            b,
            kafka=kafka,
            store=store,
            factory=dict(fail_at=fail_at),
            publisher=dict(per_poll=plan["per_poll"], ack_order=plan["ack_order"], fail=fail),
            checkpoint_interval_s=plan["interval"],
            reporting=reporting,
        )

    for plan in crashes:
        h = harness(plan)
        limit = plan["kill_after"]
        killed = h.run_until_killed(lambda h, limit=limit: h.factory.reads >= limit, rng=random.Random(plan["seed"]))
        event("killed" if killed else "ran to the end")
        if h.relay.metrics.events_skipped_recovery:
            event("a restart skipped events found in the topics")
        assert not losses, losses

    last = harness(final)
    summary = last.run()
    if summary.skipped_recovery:
        event("the final run skipped events found in the topics")
    if last.publisher.published and summary.skipped_recovery:
        event("the final run completed a partly delivered workload")
    assert not losses, losses

    # exactly once
    expected = expected_events(b)
    got = Counter((*identity_of(r), r.header_text["id"]) for r in kafka.records())
    assert {k: n for k, n in got.items() if n > 1} == {}
    assert set(got) == set(expected)
    # illegal topics went to the dead-letter topic, the rest to their own
    aggregate = {f"t{t}r{j}": agg for t, tx in enumerate(workload) for j, (agg, _k) in enumerate(tx["rows"])}
    if any(tx.prepared_at is not None for tx in b.committed()):
        event("an XA transaction committed")
    for r in kafka.records():
        agg = aggregate[r.header_text["id"]]
        if agg == "bad type":
            assert r.topic == "outbox.dlq" and r.header_text["cdc.dlq.cause"] == "illegal_topic"
        elif too_large_key and r.key == too_large_key:
            assert r.topic == "outbox.dlq" and r.header_text["cdc.dlq.cause"] == "too_large"
            event("an event was redirected as too large")
        else:
            assert r.topic == f"outbox.event.{agg}"
    # per key, in commit order (and row order inside a transaction)
    order = {e[3]: i for i, e in enumerate(expected)}
    for topic, parts in kafka.logs.items():
        if too_large_key and topic == "outbox.dlq":
            continue  # redirects reach the dead-letter topic after later dead letters
        for part in parts:
            by_key = defaultdict(list)
            for r in part:
                by_key[r.key].append(order[r.header_text["id"]])
            for key, seq in by_key.items():
                assert seq == sorted(seq), (topic, key, seq)
    # and the checkpoint reached the end, or the earliest XA transaction left undecided
    committed = [tx.end for tx in b.committed()]
    if b.xa_undecided:
        event("an XA transaction stayed undecided")
        assert store.current is None or store.current.position <= min(b.xa_undecided.values())
    elif committed:
        assert max(committed) <= store.current.position <= max(tx.end for tx in b.txs)
    assert summary.stopped_by == "request"
