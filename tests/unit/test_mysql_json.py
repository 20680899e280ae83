"""MySQL binary JSON -> MySQL's JSON text (connectors/mysql/json_binary.py), against documents
written by tests/unit/mysql_json_bytes.py from MySQL's format description, and the text
MySQL's own printer (`sql-common/json_dom.cc` wrapper_to_string, `strings/dtoa.cc`
my_gcvt) writes for them."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.mysql.json_binary import JsonDecodeError, document_text, double_text, parse
from tests.unit import mysql_json_bytes as jb


@pytest.mark.parametrize(
    "doc, large, text",
    [
        ({"n": 1, "ok": True, "tag": "é"}, False, '{"n": 1, "ok": true, "tag": "é"}'),
        ({"b": [1, 2], "a": 1}, False, '{"a": 1, "b": [1, 2]}'),
        ({"bb": 1, "a": 2, "c": 3}, True, '{"a": 2, "c": 3, "bb": 1}'),  # by length, then bytes
        ([1, None, [2], "x"], False, '[1, null, [2], "x"]'),
        ([1, None, [2], "x", 70000, -70000], True, '[1, null, [2], "x", 70000, -70000]'),
        ({}, False, "{}"),
        ([], True, "[]"),
        ([-(1 << 63), (1 << 64) - 1, 1 << 40], False, "[-9223372036854775808, 18446744073709551615, 1099511627776]"),
        (
            [jb.Raw(jb.UINT16, struct.pack("<H", 65535)), jb.Raw(jb.UINT32, struct.pack("<I", 1 << 31))],
            True,
            "[65535, 2147483648]",
        ),
        (False, False, "false"),
        ("", False, '""'),
        ('a"b\\c\n\t\r\b\f\x01\x1f\x7f🐢', False, '"a\\"b\\\\c\\n\\t\\r\\b\\f\\u0001\\u001f\x7f🐢"'),
        ({"k\n": 1}, False, '{"k\\n": 1}'),
    ],
)
def test_documents_print_as_mysql_prints_them(doc, large, text):
    assert document_text(jb.encode(doc, large)) == text


@pytest.mark.parametrize(
    "value, text",
    [
        (1.5, "1.5"),
        (3.0, "3.0"),
        (-3.0, "-3.0"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e20, "1e20"),
        (1e15, "1e15"),
        (1e14, "100000000000000.0"),
        (123456789012345.6, "123456789012345.6"),
        (1.2345678901234568e20, "1.2345678901234568e20"),
        (1e-5, "0.00001"),
        (1e-14, "0.00000000000001"),
        (1e-15, "0.000000000000001"),  # dtoa.h: the f format down to 10^-15
        (1e-16, "1e-16"),
        (-2.5e-300, "-2.5e-300"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e308"),
        (12345678.9, "12345678.9"),
    ],
)
def test_doubles_print_as_my_gcvt_prints_them(value, text):
    assert double_text(value) == text
    assert document_text(jb.encode(value)) == text


@pytest.mark.parametrize(
    "digits, precision, scale, text",
    [
        ("123.456", 6, 3, "123.456"),
        ("1.50", 10, 2, "1.50"),
        ("-0.5", 3, 2, "-0.50"),
        ("0", 10, 0, "0"),
        ("0.000000001", 20, 10, "0.0000000010"),
        ("-1234567890123456789.123456789012", 31, 12, "-1234567890123456789.123456789012"),
        (
            "99999999999999999999999999999999999.999999999999999999999999999999",
            65,
            30,
            "99999999999999999999999999999999999.999999999999999999999999999999",
        ),
    ],
)
def test_a_decimal_in_a_document_is_a_number(digits, precision, scale, text):
    data = bytes([precision, scale]) + jb.decimal_bytes(digits, precision, scale)
    assert document_text(jb.encode({"d": jb.opaque(246, data)})) == '{"d": ' + text + "}"


@pytest.mark.parametrize(
    "field_type, data, text",
    [
        (11, jb.packed_time(87, 31, 46, 654321), '"87:31:46.654321"'),
        (11, jb.packed_time(1, 0, 0, negative=True), '"-01:00:00.000000"'),
        (11, jb.packed_time(838, 59, 59), '"838:59:59.000000"'),
        (11, jb.packed_time(0, 0, 0), '"00:00:00.000000"'),
        (12, jb.packed_datetime(2024, 2, 29, 13, 14, 15, 1), '"2024-02-29 13:14:15.000001"'),
        (7, jb.packed_datetime(1970, 1, 1, 0, 0, 1), '"1970-01-01 00:00:01.000000"'),
        (10, jb.packed_datetime(2024, 12, 31), '"2024-12-31"'),
        (16, b"\x05", '"base64:type16:BQ=="'),
        (252, b"", '"base64:type252:"'),
        (253, "ünï".encode(), '"ünï"'),  # an opaque VAR_STRING prints as a string
    ],
)
def test_opaque_values_print_as_mysql_prints_them(field_type, data, text):
    assert document_text(jb.encode(jb.opaque(field_type, data))) == text


def test_base64_breaks_after_76_characters_as_mysql_does():
    text = document_text(jb.encode(jb.opaque(252, bytes(60))))
    assert text == '"base64:type252:' + "A" * 76 + "\\n" + "A" * 4 + '"'


def test_an_empty_value_is_the_json_null_literal():
    assert document_text(b"") == "null"


# -- properties ----------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_documents, st.booleans())
def test_any_document_reads_back_equal(doc, large):
    text = document_text(jb.encode(doc, large))
    assert json.loads(text) == doc
    assert text == json.dumps(_mysql_order(doc), ensure_ascii=False) or _has_floats_or_escapes(doc)


def _mysql_order(doc):
    if isinstance(doc, dict):
        return {k: _mysql_order(doc[k]) for k in sorted(doc, key=lambda k: (len(k.encode()), k.encode()))}
    if isinstance(doc, list):
        return [_mysql_order(v) for v in doc]
    return doc


def _has_floats_or_escapes(doc) -> bool:
    """json.dumps differs from MySQL in doubles and control-character escapes only."""
    if isinstance(doc, float):
        return True
    if isinstance(doc, str):
        return any(ord(c) < 0x20 or c == "\x7f" for c in doc)
    if isinstance(doc, dict):
        return any(_has_floats_or_escapes(k) or _has_floats_or_escapes(v) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_has_floats_or_escapes(v) for v in doc)
    return False


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_reads_back_as_itself(d):
    text = double_text(d)
    assert float(text) == d and ("." in text or "e" in text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_a_document_or_a_json_decode_error(data):
    try:
        document_text(data)
    except JsonDecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(_documents, st.booleans(), st.data())
def test_a_damaged_document_gives_a_json_decode_error_or_a_document(doc, large, data):
    raw = bytearray(jb.encode(doc, large))
    cut = data.draw(st.integers(min_value=1, max_value=len(raw)))
    i = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[i] = data.draw(st.integers(min_value=0, max_value=255))
    for damaged in (bytes(raw), bytes(raw[:cut])):
        try:
            document_text(damaged)
        except JsonDecodeError:
            pass


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x0c\x05ab", "runs past"),
        (b"\x04\x07", "unknown literal"),
        (b"\x0e", "unknown value type"),
        (b"\x0c\x82", "variable-length"),
        (b"\x0f\x0b" + jb.varlen(4) + b"\0\0\0\0", "8"),
        (b"\x0f\xf6\x02\x41\x00", "DECIMAL"),
        (b"\x00\x01\x00\xff\x00", "container"),
        (b"\x0c\x02\xc3\x28", "utf8mb4"),
    ],
)
def test_malformed_documents_are_named(data, why):
    with pytest.raises(JsonDecodeError, match=why):
        parse(data)


def test_a_document_nested_deeper_than_mysql_allows_is_refused():
    doc: list = []
    for _ in range(120):
        doc = [doc]
    with pytest.raises(JsonDecodeError, match="deeper"):
        parse(jb.encode(doc))
