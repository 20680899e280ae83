"""Partial JSON update diffs (connectors/mysql/json_diff.py): paths as MySQL's Json_path::to_string
writes them, and diffs applied as sql/json_diff.cc apply_json_diffs applies them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.mysql import json_binary as mysql_json
from connectors.mysql.json_diff import INSERT, REMOVE, REPLACE, JsonDiffError, _path_text, apply_diffs, parse_path
from tests.unit import mysql_json_bytes as jb


@pytest.mark.parametrize(
    "text, legs",
    [
        ("$", []),
        ("$.a", [("member", "a")]),
        ('$."a b".c', [("member", "a b"), ("member", "c")]),
        ('$."q\\"uote"', [("member", 'q"uote')]),
        ("$.a[3]", [("member", "a"), ("index", 3, False)]),
        ("$[last]", [("index", 0, True)]),
        ("$[last-2]", [("index", 2, True)]),
        ("$ . a [ 1 ]", [("member", "a"), ("index", 1, False)]),
    ],
)
def test_paths_read_as_mysql_writes_them(text, legs):
    assert parse_path(text) == legs


@pytest.mark.parametrize("text", ["a.b", "$.", "$[", "$[*]", "$.*", "$**.a", "$[1 to 2]", '$."open'])
def test_paths_mysql_never_writes_in_a_diff_are_refused(text):
    with pytest.raises(JsonDiffError):
        parse_path(text)


_legs = st.lists(
    st.one_of(
        st.tuples(st.just("member"), st.text(min_size=1, max_size=8)),
        st.tuples(st.just("index"), st.integers(min_value=0, max_value=99), st.booleans()),
    ),
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(_legs)
def test_any_path_reads_back(legs):
    assert parse_path(_path_text(legs)) == legs


def test_inserts_keep_mysqls_key_order_and_arrays_insert_at_the_index():
    doc = {"b": 1, "aa": [1, 2]}
    out = apply_diffs(
        doc,
        [
            (INSERT, [("member", "a")], 0),
            (INSERT, [("member", "aa"), ("index", 1, False)], 9),
            (INSERT, [("member", "aa"), ("index", 99, False)], 3),  # past the end: appended
            (REPLACE, [("member", "aa"), ("index", 0, True)], 4),  # [last]
            (REMOVE, [("member", "b")], None),
        ],
    )
    assert mysql_json.text(out) == '{"a": 0, "aa": [1, 9, 2, 4]}'


_docs = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _docs, max_size=5), st.text(max_size=6), _docs)
def test_an_insert_then_a_remove_of_a_new_member_gives_the_document_back(doc, key, value):
    doc = mysql_json.parse(jb.encode(doc))  # as a before image holds it: keys in MySQL's order
    original = mysql_json.text(doc)
    if key in doc:
        with pytest.raises(JsonDiffError, match="has already"):
            apply_diffs(doc, [(INSERT, [("member", key)], value)])
        return
    apply_diffs(doc, [(INSERT, [("member", key)], value)])
    assert key in doc and mysql_json.text(doc[key]) == mysql_json.text(value)
    apply_diffs(doc, [(REMOVE, [("member", key)], None)])
    assert mysql_json.text(doc) == original


@pytest.mark.parametrize(
    "doc, diff, why",
    [
        ({"a": 1}, (REPLACE, [("member", "b")], 1), "REPLACE of"),
        ([1], (REPLACE, [("index", 1, False)], 1), "REPLACE of"),
        ({"a": 1}, (REMOVE, [("member", "a"), ("member", "x")], None), "REMOVE of"),
        ({"a": 1}, (INSERT, [("member", "a"), ("index", 0, False)], 1), "parent"),
        ({"a": 1}, (REPLACE, [], 1), "whole document"),
    ],
)
def test_a_diff_mysql_would_reject_is_refused(doc, diff, why):
    with pytest.raises(JsonDiffError, match=why):
        apply_diffs(doc, [diff])
