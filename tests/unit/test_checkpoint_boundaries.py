"""Issue 17: the checkpoint never names a position inside a transaction. Every event kind
that can stand between a transaction's start and its commit is put there (rows of outbox
and other tables, UPDATE/DELETE, savepoints and rollbacks to them, a statement-logged
outbox INSERT, a statement that writes nothing, heartbeats, XA prepare groups decided
later, rotations), in random order and mixes (hypothesis); the relay checkpoints after
every step, and each checkpoint must name the end of a whole event group (a commit, a
rollback, a standalone statement, an XA prepare or outcome) or the start."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.position import BinlogPosition
from cdc.source_events import Statement
from fakes import SCHEMA, Binlog, RelayHarness, outbox_row

START = BinlogPosition("mysql-bin.000001", 4)
SHAPES = (
    "rows",
    "other_rows",
    "change",
    "savepoint",
    "statement_insert",
    "statement_other",
    "heartbeat",
    "rollback",
    "xa",
    "rotate",
    "ddl",
)


def _build(shapes: list[str]) -> tuple[Binlog, set[BinlogPosition]]:
    b = Binlog()
    ends: set[BinlogPosition] = {START}
    ends.add(b.transaction([outbox_row("first", "order", "k")]).end)  # the stream has a first event
    n = 0
    pending_xa: list[str] = []
    for shape in shapes:
        n += 1
        if shape == "rotate":
            b.rotate()
            continue
        if shape == "ddl":
            ends.add(b.statement("CREATE TABLE t%d (a INT)" % n).end)
            continue
        if shape == "xa":
            xid = f"x{n}"
            b.xa_prepare(xid, [outbox_row(f"xa{n}", "order", "k")])
            ends.add(b.end)
            pending_xa.append(xid)
            continue
        b.begin()
        b.insert(outbox_row(f"e{n}", "order", f"k{n % 3}"))
        if shape == "other_rows":
            b.insert({"id": n, "name": "x"}, table="orders")
        elif shape == "change":
            b.change("update", outbox_row(f"e{n}", "order", f"k{n % 3}"))
        elif shape == "savepoint":
            b.savepoint("s")
            b.insert(outbox_row(f"s{n}", "order", "k"))
            b.rollback_to("s")
        elif shape == "statement_insert":
            b._add(lambda s, e, n=n: Statement(f"INSERT INTO {SCHEMA}.outbox VALUES ('st{n}')", e, 1, SCHEMA))
        elif shape == "statement_other":
            b._add(lambda s, e: Statement("SET @x = 1", e, 1, SCHEMA))
        elif shape == "heartbeat":
            b.heartbeat()
        b.insert(outbox_row(f"f{n}", "user", f"u{n % 2}"))
        tx = b.rollback() if shape == "rollback" else b.commit()
        ends.add(tx.end)
        if pending_xa and n % 2:
            tx = b.xa_outcome(pending_xa.pop(0), commit=n % 3 != 0)
            ends.add(tx.end)
    for xid in pending_xa:
        ends.add(b.xa_outcome(xid).end)
    return b, ends


def _assert_boundaries(shapes: list[str]) -> None:
    b, ends = _build(shapes)
    h = RelayHarness(b, publisher={"per_poll": 1}, on_statement="dead_letter", on_change="ignore")
    h.run()
    assert h.store.history, "no checkpoint was written"
    inside = [cp.position for cp in h.store.history if cp.position not in ends]
    assert not inside, f"checkpoints inside a transaction: {inside[:5]}"
    assert h.store.current.position == b.end or h.store.current.position in ends


def test_every_event_kind_between_start_and_commit_leaves_the_checkpoint_on_a_boundary():
    _assert_boundaries(list(SHAPES) * 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=30))
def test_any_mix_of_shapes_leaves_the_checkpoint_on_a_boundary(shapes):
    _assert_boundaries(shapes)
