"""SpillBuffer: a list that moves to a temporary file past its memory limit."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.assembly.spill import SpillBuffer


def test_stays_in_memory_up_to_the_limit():
    buf = SpillBuffer(memory_limit=3)
    for i in range(3):
        buf.append(i)
    assert not buf.spilled and buf.spilled_total == 0
    assert list(buf) == [0, 1, 2] and len(buf) == 3


def test_spills_beyond_the_limit_and_iterates_in_order(tmp_path):
    buf = SpillBuffer(memory_limit=3, spill_dir=str(tmp_path))
    items = [("shop", {"id": i, "blob": b"x" * i}) for i in range(10)]
    for item in items:
        buf.append(item)
    assert buf.spilled
    assert buf.spilled_total == 10  # the 4 held so far moved to disk, then 6 more
    assert len(buf) == 10
    assert list(buf) == items
    assert list(buf) == items  # iterating twice gives the same
    buf.append("more")
    assert list(buf) == items + ["more"] and len(buf) == 11


def test_truncate_in_memory():
    buf = SpillBuffer(memory_limit=10)
    for i in range(5):
        buf.append(i)
    buf.truncate(2)
    assert list(buf) == [0, 1] and len(buf) == 2
    buf.append("x")
    assert list(buf) == [0, 1, "x"]
    buf.truncate(10)  # longer than held: nothing happens
    assert list(buf) == [0, 1, "x"]


def test_truncate_spilled_then_append():
    buf = SpillBuffer(memory_limit=2)
    for i in range(8):
        buf.append(i)
    assert buf.spilled
    buf.truncate(3)
    assert len(buf) == 3 and list(buf) == [0, 1, 2]
    buf.append("a")
    buf.append("b")
    assert list(buf) == [0, 1, 2, "a", "b"]
    buf.truncate(0)
    assert len(buf) == 0 and list(buf) == []
    buf.append("c")
    assert list(buf) == ["c"]


def test_clear_in_memory_and_spilled():
    buf = SpillBuffer(memory_limit=2)
    buf.append(1)
    buf.clear()
    assert len(buf) == 0 and list(buf) == []
    for i in range(5):
        buf.append(i)
    assert buf.spilled
    buf.clear()
    assert not buf.spilled and len(buf) == 0 and list(buf) == []
    buf.append("again")
    assert list(buf) == ["again"] and not buf.spilled


def test_append_after_a_partial_iteration_keeps_every_item():
    # A list-like buffer: stopping an iteration early must not corrupt later appends.
    buf = SpillBuffer(memory_limit=1)
    for i in range(4):
        buf.append(i)
    it = iter(buf)
    assert next(it) == 0
    it.close()
    buf.append(4)
    assert list(buf) == [0, 1, 2, 3, 4]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers()),
        st.tuples(st.just("truncate"), st.integers(0, 12)),
        st.tuples(st.just("iter"), st.just(0)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(0, 5), operations=ops)
def test_behaves_like_a_list(limit, operations):
    buf, model = SpillBuffer(memory_limit=limit), []
    for op, arg in operations:
        if op == "append":
            buf.append(arg)
            model.append(arg)
        elif op == "truncate":
            buf.truncate(arg)
            del model[arg:]
        elif op == "clear":
            buf.clear()
            model = []
        assert len(buf) == len(model)
        assert list(buf) == model
