"""BinlogPosition: parsing, formatting and the total order by numeric file suffix."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cdc.errors import PositionError
from cdc.position import BinlogPosition, file_sequence


def test_parse_and_format_round_trip():
    p = BinlogPosition.parse("mysql-bin.000042:1234")
    assert p == BinlogPosition("mysql-bin.000042", 1234)
    assert p.file == "mysql-bin.000042" and p.pos == 1234
    assert str(p) == "mysql-bin.000042:1234"
    assert BinlogPosition.parse(str(p)) == p


def test_parse_strips_whitespace():
    assert BinlogPosition.parse("  mysql-bin.000001:4\n") == BinlogPosition("mysql-bin.000001", 4)


def test_file_sequence_splits_base_and_number():
    assert file_sequence("mysql-bin.000042") == ("mysql-bin", 42)
    assert file_sequence("host.example-bin.1000000") == ("host.example-bin", 1000000)
    assert BinlogPosition("mysql-bin.000042", 0).sequence == 42


def test_order_is_by_numeric_suffix_not_by_string():
    a = BinlogPosition.parse("mysql-bin.999999:4")
    b = BinlogPosition.parse("mysql-bin.1000000:4")
    assert "mysql-bin.999999" > "mysql-bin.1000000"  # the string order would be wrong
    assert a < b and b > a and a <= b and not b < a
    assert sorted([b, a]) == [a, b]


def test_order_within_a_file_is_by_offset():
    assert BinlogPosition("mysql-bin.000001", 4) < BinlogPosition("mysql-bin.000001", 120)
    assert BinlogPosition("mysql-bin.000001", 99999) < BinlogPosition("mysql-bin.000002", 4)
    assert (
        max(BinlogPosition("mysql-bin.000003", 4), BinlogPosition("mysql-bin.000002", 9000)).file == "mysql-bin.000003"
    )


def test_positions_are_hashable_and_equal_by_value():
    assert len({BinlogPosition("mysql-bin.000001", 4), BinlogPosition.parse("mysql-bin.000001:4")}) == 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "mysql-bin.000001",
        "mysql-bin.000001:",
        ":4",
        "mysql-bin:4",
        "mysql-bin.000001:-4",
        "mysql-bin.000001:abc",
        "mysql-bin.00a001:4",
        "my sql-bin.000001:4",
        "dir/mysql-bin.000001:4",
        "mysql-bin.000001:4:5",
        "mysql-bin.:4",
        "mysql-bin.000001:4.5",
    ],
)
def test_malformed_positions_raise_position_error_with_a_clear_message(text):
    with pytest.raises(PositionError) as info:
        BinlogPosition.parse(text)
    message = str(info.value)
    assert "expected" in message or "malformed" in message or "offset" in message
    assert "for example" in message or "non-negative" in message or "malformed" in message


def test_malformed_position_message_names_the_input_and_an_example():
    with pytest.raises(PositionError, match=r"'nonsense'.*mysql-bin\.000042:1234"):
        BinlogPosition.parse("nonsense")
    with pytest.raises(PositionError, match=r"malformed binlog file name 'nofile'"):
        BinlogPosition("nofile", 4)


def test_negative_or_non_integer_offset_is_refused():
    with pytest.raises(PositionError, match="non-negative"):
        BinlogPosition("mysql-bin.000001", -1)
    with pytest.raises(PositionError, match="non-negative"):
        BinlogPosition("mysql-bin.000001", "4")  # type: ignore[arg-type]  # the wrong type is the test


def test_non_decimal_unicode_digit_offset_raises_position_error_not_value_error():
    # "²".isdigit() is True but int("²") raises ValueError: the parser must still
    # answer with a PositionError (an operator-facing refusal, not a traceback).
    with pytest.raises(PositionError):
        BinlogPosition.parse("mysql-bin.000001:\u00b2")


def test_non_decimal_unicode_digit_file_suffix_raises_position_error():
    with pytest.raises(PositionError):
        BinlogPosition.parse("mysql-bin.\u00b9\u00b2:4")


bases = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)


@given(base=bases, seq=st.integers(0, 10**9), width=st.integers(1, 9), pos=st.integers(0, 2**63 - 1))
def test_round_trip_property(base, seq, width, pos):
    text = f"{base}.{seq:0{width}d}:{pos}"
    p = BinlogPosition.parse(text)
    assert str(p) == text
    assert BinlogPosition.parse(str(p)) == p
    assert p.sequence == seq


@given(
    a=st.tuples(st.integers(1, 2_000_000), st.integers(0, 10**6)),
    b=st.tuples(st.integers(1, 2_000_000), st.integers(0, 10**6)),
)
def test_order_matches_numeric_tuple_order(a, b):
    pa = BinlogPosition(f"mysql-bin.{a[0]:06d}", a[1])
    pb = BinlogPosition(f"mysql-bin.{b[0]:06d}", b[1])
    assert (pa < pb) == (a < b)
    assert (pa == pb) == (a == b)


@given(st.text(max_size=40))
@example("mysql-bin.000001:\u00b2")
def test_parse_either_succeeds_and_round_trips_or_raises_position_error(text):
    try:
        p = BinlogPosition.parse(text)
    except PositionError:
        return
    assert BinlogPosition.parse(str(p)) == p
