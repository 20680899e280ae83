"""GTID value objects: MySQL sets and MariaDB positions."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.errors import PositionError
from cdc.gtid import (
    MariadbGtidPosition,
    MysqlGtidSet,
    empty_set_for,
    is_mariadb_gtid,
    parse_gtid_set,
)

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "8c5f7d1a-0000-11ee-aaaa-000000000001"


# -- MySQL ---------------------------------------------------------------------------------


def test_mysql_parse_and_canonical_string():
    s = MysqlGtidSet.parse(f"{U1}:1-100,{U2}:1-7")
    assert str(s) == f"{U1}:1-100,{U2}:1-7"
    assert MysqlGtidSet.parse(str(s)) == s


def test_mysql_canonical_form_merges_sorts_and_lowercases():
    text = f"{U2.upper()}:5-7:1-3,{U1}:10:1-4:5-9 , {U2}:4"
    s = MysqlGtidSet.parse(text)
    # U2: 1-3, 4, 5-7 merge (adjacent) into 1-7; U1: 1-4, 5-9, 10 merge into 1-10;
    # uuids sorted and lower-case
    assert str(s) == f"{U1}:1-10,{U2}:1-7"


def test_mysql_overlapping_and_disjoint_intervals():
    s = MysqlGtidSet.parse(f"{U1}:1-5:3-8:20-30:10")
    assert str(s) == f"{U1}:1-8:10:20-30"


def test_mysql_parse_tolerates_newlines_as_gtid_executed_prints_them():
    assert str(MysqlGtidSet.parse(f"{U1}:1-3,\n{U2}:1")) == f"{U1}:1-3,{U2}:1"


def test_mysql_empty_set():
    s = MysqlGtidSet.parse("")
    assert not s and str(s) == ""
    assert not s.contains(f"{U1}:1")


def test_mysql_contains():
    s = MysqlGtidSet.parse(f"{U1}:1-5:10")
    assert s.contains(f"{U1}:1") and s.contains(f"{U1}:5") and s.contains(f"{U1}:10")
    assert not s.contains(f"{U1}:6") and not s.contains(f"{U1}:11")
    assert s.contains(f"{U1.upper()}:3")
    assert not s.contains(f"{U2}:1")


def test_mysql_add():
    s = MysqlGtidSet.parse(f"{U1}:1-5")
    t = s.add(f"{U1}:6").add(f"{U2}:3")
    assert str(t) == f"{U1}:1-6,{U2}:3"
    assert str(s) == f"{U1}:1-5"  # immutable
    assert s.add(f"{U1}:3") == s  # already held: no change


def test_mysql_union_and_issuperset():
    a = MysqlGtidSet.parse(f"{U1}:1-5")
    b = MysqlGtidSet.parse(f"{U1}:6-9,{U2}:1")
    u = a.union(b)
    assert str(u) == f"{U1}:1-9,{U2}:1"
    assert u.issuperset(a) and u.issuperset(b)
    assert not a.issuperset(b)
    assert a.issuperset(MysqlGtidSet())
    assert not MysqlGtidSet.parse(f"{U1}:1-4").issuperset(a)


@pytest.mark.parametrize(
    "text",
    [
        "not-a-uuid:1",
        f"{U1}",
        f"{U1}:",
        f"{U1}:0",
        f"{U1}:5-3",
        f"{U1}:a-b",
        f"{U1}:1-2-3",
        f"{U1}:-5",
        f"{U1[:-1]}:1",
        f"{U1}:1,{U2}",
    ],
)
def test_mysql_malformed_sets_raise_position_error(text):
    with pytest.raises(PositionError):
        MysqlGtidSet.parse(text)


def test_mysql_open_ended_interval_is_refused():
    # "1-" is not an interval; accepting it as "1" would silently misread a set.
    with pytest.raises(PositionError):
        MysqlGtidSet.parse(f"{U1}:1-")


@pytest.mark.parametrize("gtid", ["", U1, f"{U1}:0", f"{U1}:x", "0-1-5", f"{U1}:1-3"])
def test_mysql_malformed_single_gtid(gtid):
    with pytest.raises(PositionError):
        MysqlGtidSet().contains(gtid)
    with pytest.raises(PositionError):
        MysqlGtidSet().add(gtid)


# -- MariaDB -------------------------------------------------------------------------------


def test_mariadb_parse_and_str_sorted_by_domain():
    p = MariadbGtidPosition.parse("1-2-7, 0-1-100")
    assert str(p) == "0-1-100,1-2-7"
    assert MariadbGtidPosition.parse(str(p)) == p


def test_mariadb_contains_is_per_domain_last_sequence_whatever_the_server():
    p = MariadbGtidPosition.parse("0-1-100,1-2-7")
    assert p.contains("0-1-100") and p.contains("0-1-1") and p.contains("0-9-50")
    assert not p.contains("0-1-101")
    assert p.contains("1-2-7") and not p.contains("1-2-8")
    assert not p.contains("2-1-1")


def test_mariadb_add_moves_the_domain_forward_and_older_is_a_no_op():
    p = MariadbGtidPosition.parse("0-1-100")
    q = p.add("0-2-101")
    assert str(q) == "0-2-101"
    assert q.add("0-1-50") == q  # older sequence: no-op
    assert q.add("0-1-101") == q  # same sequence: no-op
    r = q.add("3-1-1")
    assert str(r) == "0-2-101,3-1-1"
    assert str(p) == "0-1-100"  # immutable


def test_mariadb_union_and_issuperset():
    a = MariadbGtidPosition.parse("0-1-10,1-1-5")
    b = MariadbGtidPosition.parse("0-1-8,2-1-3")
    u = a.union(b)
    assert str(u) == "0-1-10,1-1-5,2-1-3"
    assert u.issuperset(a) and u.issuperset(b)
    assert a.issuperset(MariadbGtidPosition.parse("0-1-9"))
    assert not a.issuperset(b)


@pytest.mark.parametrize("text", ["0-1", "0-1-x", "a-b-c", "0-1-2-3", "0-1-5,0-2-6", "0_1_5", "-1-1-1"])
def test_mariadb_malformed_positions_raise_position_error(text):
    with pytest.raises(PositionError):
        MariadbGtidPosition.parse(text)


def test_mariadb_domain_twice_is_named_in_the_message():
    with pytest.raises(PositionError, match="domain 0 twice"):
        MariadbGtidPosition.parse("0-1-5,0-2-6")


# -- flavour detection ---------------------------------------------------------------------


def test_parse_gtid_set_detects_the_flavour():
    assert isinstance(parse_gtid_set("0-1-100,1-2-3"), MariadbGtidPosition)
    assert isinstance(parse_gtid_set(f"{U1}:1-3"), MysqlGtidSet)
    assert str(parse_gtid_set(f" {U1.upper()}:1-3 ")) == f"{U1}:1-3"


@pytest.mark.parametrize("text", ["", "   ", ",", "garbage", "0-1", f"0-1-2,{U1}:1"])
def test_parse_gtid_set_refuses_malformed_input(text):
    with pytest.raises(PositionError):
        parse_gtid_set(text)


def test_is_mariadb_gtid_and_empty_set_for():
    assert is_mariadb_gtid("0-1-5") and not is_mariadb_gtid(f"{U1}:5")
    assert empty_set_for("0-1-5") == MariadbGtidPosition()
    assert empty_set_for(f"{U1}:5") == MysqlGtidSet()


# -- properties ----------------------------------------------------------------------------

uuids = st.sampled_from([U1, U2, "00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-fffffffffffe"])
seqs = st.integers(1, 60)
mysql_gtids = st.builds(lambda u, n: f"{u}:{n}", uuids, seqs)


def _mysql_set(gtids):
    s = MysqlGtidSet()
    for g in gtids:
        s = s.add(g)
    return s


mysql_sets = st.lists(mysql_gtids, max_size=30).map(_mysql_set)


@given(mysql_sets, mysql_sets)
def test_mysql_union_is_commutative(a, b):
    assert a.union(b) == b.union(a)
    assert str(a.union(b)) == str(b.union(a))


@given(mysql_sets, mysql_gtids)
def test_mysql_add_then_contains(s, g):
    t = s.add(g)
    assert t.contains(g)
    assert t.issuperset(s)
    assert MysqlGtidSet.parse(str(t)) == t


@given(st.lists(mysql_gtids, max_size=30))
def test_mysql_contains_exactly_what_was_added(gtids):
    s = _mysql_set(gtids)
    for u in [U1, U2]:
        for n in range(1, 61):
            assert s.contains(f"{u}:{n}") == (f"{u}:{n}" in gtids)


mariadb_gtids = st.builds(lambda d, s, n: f"{d}-{s}-{n}", st.integers(0, 3), st.integers(1, 3), st.integers(1, 50))


def _mariadb_pos(gtids):
    p = MariadbGtidPosition()
    for g in gtids:
        p = p.add(g)
    return p


mariadb_positions = st.lists(mariadb_gtids, max_size=10).map(_mariadb_pos)


@given(mariadb_positions, mariadb_positions)
def test_mariadb_union_is_commutative_as_a_set(a, b):
    ab, ba = a.union(b), b.union(a)
    assert ab.issuperset(ba) and ba.issuperset(ab)
    assert ab.issuperset(a) and ab.issuperset(b)


@given(mariadb_positions, mariadb_gtids)
def test_mariadb_add_then_contains(p, g):
    q = p.add(g)
    assert q.contains(g)
    assert q.issuperset(p)
    assert MariadbGtidPosition.parse(str(q)) == q


# -- MySQL tagged GTIDs (8.3+) -------------------------------------------------------------
# Grammar from MySQL's own parser (sql/rpl_gtid_set.cc `Gtid_set::add_gtid_text`,
# libs/mysql/gtid/tag.cpp `Tag::from_cstring`): after the uuid, ':'-separated items are
# either a tag (a letter or '_', then letters, digits or '_', 32 characters at most,
# stored lower-case) that applies to the intervals after it, or an interval. The text form
# (`Gtid_set::to_string`) sorts by (uuid, tag), the untagged intervals first:
# `uuid:1-5:tag1:1-3:tag2:7`.


def test_tagged_set_canonical_string_orders_tags_after_untagged_intervals():
    s = MysqlGtidSet.parse(f"{U1}:Zeta:7,{U1}:1-5,{U1}:alpha:1-3")
    assert str(s) == f"{U1}:1-5:alpha:1-3:zeta:7"
    assert MysqlGtidSet.parse(str(s)) == s


def test_tagged_set_as_mysql_prints_it_and_several_tags_in_one_element():
    text = f"{U1}:1-5:tag1:1-3:tag2:7,{U2}:_t:4"
    s = MysqlGtidSet.parse(text)
    assert str(s) == text
    assert s.contains(f"{U1}:tag1:2") and s.contains(f"{U1}:tag2:7") and s.contains(f"{U2}:_t:4")
    assert not s.contains(f"{U1}:tag1:4") and not s.contains(f"{U1}:tag2:6")
    assert s.contains(f"{U1}:5") and not s.contains(f"{U1}:6")


def test_tagged_and_untagged_gtids_of_one_uuid_are_different_transactions():
    s = MysqlGtidSet.parse(f"{U1}:1-5")
    assert not s.contains(f"{U1}:a:1")
    t = MysqlGtidSet.parse(f"{U1}:a:1-5")
    assert not t.contains(f"{U1}:1") and not t.contains(f"{U1}:b:1")


def test_tags_are_case_insensitive_and_kept_lower_case():
    s = MysqlGtidSet.parse(f"{U1.upper()}:Domain_1:1-3:11")
    assert str(s) == f"{U1}:domain_1:1-3:11"
    assert s.contains(f"{U1}:DOMAIN_1:2") and s.contains(f"{U1}:domain_1:11")
    assert s.add(f"{U1}:Domain_1:4") == MysqlGtidSet.parse(f"{U1}:domain_1:1-4:11")


def test_tagged_add_union_issuperset():
    a = MysqlGtidSet.parse(f"{U1}:1-2:x:1")
    b = a.add(f"{U1}:x:2").add(f"{U1}:y:1").add(f"{U2}:z:9")
    assert str(b) == f"{U1}:1-2:x:1-2:y:1,{U2}:z:9"
    assert str(a) == f"{U1}:1-2:x:1"  # immutable
    assert b.issuperset(a) and not a.issuperset(b)
    assert str(a.union(MysqlGtidSet.parse(f"{U1}:x:3"))) == f"{U1}:1-2:x:1:3"
    assert a.tagged and not MysqlGtidSet.parse(f"{U1}:1-2").tagged


def test_thirty_two_character_tag_is_the_longest():
    tag = "t" + "0" * 31
    assert str(MysqlGtidSet.parse(f"{U1}:{tag}:1")) == f"{U1}:{tag}:1"
    with pytest.raises(PositionError, match="tag"):
        MysqlGtidSet.parse(f"{U1}:{tag}0:1")


def test_whitespace_around_items_is_tolerated_as_mysql_does():
    assert str(MysqlGtidSet.parse(f" {U1} : tag : 1 - 3 ")) == f"{U1}:tag:1-3"


@pytest.mark.parametrize(
    "text",
    [
        f"{U1}:1tag:1",  # a tag starts with a letter or _
        f"{U1}:ta-g:1",
        f"{U1}:tag",  # a tag with no interval after it
        f"{U1}:1-3:tag",
        f"{U1}:tag:",
        f"{U1}::1",
        f"{U1}:tág:1",  # ASCII letters only
        f"{U1}:tag:0",
    ],
)
def test_malformed_tagged_sets_raise_position_error(text):
    with pytest.raises(PositionError):
        MysqlGtidSet.parse(text)


@pytest.mark.parametrize("gtid", [f"{U1}:tag", f"{U1}:tag:0", f"{U1}:1tag:5", f"{U1}:a:b:5", f"{U1}:tag:1-3"])
def test_malformed_tagged_single_gtid(gtid):
    with pytest.raises(PositionError):
        MysqlGtidSet().contains(gtid)


def test_parse_gtid_set_and_empty_set_for_know_tagged_gtids():
    assert isinstance(parse_gtid_set(f"{U1}:tag:1-3"), MysqlGtidSet)
    assert empty_set_for(f"{U1}:tag:5") == MysqlGtidSet()
    assert not is_mariadb_gtid(f"{U1}:tag:5")


tags = st.sampled_from(["", "a", "tag1", "Tag1", "_x", "z" * 32])
tagged_gtids = st.builds(lambda u, t, n: f"{u}:{t}:{n}" if t else f"{u}:{n}", uuids, tags, seqs)
tagged_sets = st.lists(tagged_gtids, max_size=30).map(_mysql_set)


@given(tagged_sets)
def test_tagged_set_string_round_trips(s):
    assert MysqlGtidSet.parse(str(s)) == s
    assert str(MysqlGtidSet.parse(str(s).upper())) == str(s)


@given(tagged_sets, tagged_sets)
def test_tagged_union_is_commutative_and_a_superset(a, b):
    assert a.union(b) == b.union(a)
    assert a.union(b).issuperset(a) and a.union(b).issuperset(b)


@given(st.lists(tagged_gtids, max_size=30), tagged_gtids)
def test_tagged_contains_exactly_what_was_added(gtids, probe):
    s = _mysql_set(gtids)
    assert s.contains(probe) == (probe.lower() in {g.lower() for g in gtids})


def test_gtid_numbers_stop_below_int64_max_as_mysql_parse_gno_says():
    # sql/rpl_gtid_set.cc parse_gno: a number >= GNO_END (INT64_MAX) is malformed; the
    # largest GTID number is 2^63 - 2 (it also has to fit COM_BINLOG_DUMP_GTID's int64)
    top = (1 << 63) - 2
    assert str(MysqlGtidSet.parse(f"{U1}:{top}:t:1-{top}")) == f"{U1}:{top}:t:1-{top}"
    assert MysqlGtidSet().add(f"{U1}:t:{top}").contains(f"{U1}:t:{top}")
    for text in (f"{U1}:{top + 1}", f"{U1}:1-{top + 1}", f"{U1}:t:{10**30}"):
        with pytest.raises(PositionError, match="9223372036854775806"):
            MysqlGtidSet.parse(text)
    with pytest.raises(PositionError):
        MysqlGtidSet().add(f"{U1}:t:{top + 1}")
