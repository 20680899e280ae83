"""spark_jobs/mysql/json_text.py: MySQL binary JSON (sql-common/json_binary.h) as the text
MySQL prints (`SELECT json_col`, sql/json_dom.cc). Hand-made documents in MySQL's small
format, opaque DECIMAL / DATE / TIME (over 24 h, negative) / DATETIME / TIMESTAMP / BLOB
values, doubles as my_gcvt prints them; fuzzed (hypothesis): any document the verifier
writes reads back to the same value, and any byte string is either read or refused
with JsonBinaryError, never another exception."""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.mysql.json_text import Double, JsonBinaryError, Opaque, gcvt, parse, render, to_binary, to_text


def test_small_object_as_mysql_writes_json_object_a_1():
    """JSON_OBJECT('a', 1): small object, one key entry (offset 11, length 1), the int16
    inlined in its value entry."""
    doc = bytes.fromhex("00" + "0100" + "0c00" + "0b000100" + "050100") + b"a"
    assert to_text(doc) == '{"a": 1}'


def test_small_array_with_a_string_and_nested_object():
    # ["x", {}] : count 2, size; entries: string at offset 10, object at offset 12
    inner = bytes.fromhex("0000" + "0400")  # empty small object: count 0, size 4
    body = struct.pack("<HH", 2, 10 + 2 + len(inner)) + b"\x0c" + struct.pack("<H", 10) + b"\x00"
    body += struct.pack("<H", 12) + b"\x01x" + inner
    assert to_text(b"\x02" + body) == '["x", {}]'


def _decimal_bin(value: Decimal, precision: int, scale: int) -> bytes:
    """strings/decimal.cc decimal2bin, written from its comment: 9 digits to 4 bytes,
    leftover digits to 1-4 bytes, big-endian, sign bit flipped, negatives inverted."""
    dig2bytes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    text = f"{abs(value):.{scale}f}"
    whole, _, frac = text.partition(".")
    intg = precision - scale
    whole = whole.rjust(intg, "0")[-intg:] if intg else ""
    out = bytearray()
    lead = (precision - scale) % 9
    groups = ([whole[:lead]] if lead else []) + [whole[i : i + 9] for i in range(lead, len(whole), 9)]
    for g in groups:
        out += int(g or "0").to_bytes(4 if len(g) == 9 else dig2bytes[len(g)], "big")
    for i in range(0, scale, 9):
        g = frac[i : i + 9]
        out += int(g).to_bytes(4 if len(g) == 9 else dig2bytes[len(g)], "big")
    out[0] ^= 0x80
    if value < 0:
        out = bytearray(b ^ 0xFF for b in out)
    return bytes([precision, scale]) + bytes(out)


def _time_packed(negative: bool, hours: int, minutes: int, seconds: int, micros: int) -> bytes:
    packed = (((hours << 12) | (minutes << 6) | seconds) << 24) + micros
    return struct.pack("<q", -packed if negative else packed)


def _datetime_packed(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0) -> bytes:
    ymd = ((y * 13 + mo) << 5) | d
    return struct.pack("<q", (((ymd << 17) | (h << 12) | (mi << 6) | s) << 24) + us)


@pytest.mark.parametrize(
    "value, text",
    [
        (Opaque(246, _decimal_bin(Decimal("123.456"), 10, 3)), "123.456"),
        (Opaque(246, _decimal_bin(Decimal("-0.5"), 5, 2)), "-0.50"),
        (Opaque(246, _decimal_bin(Decimal("1234567890123.000000001"), 30, 9)), "1234567890123.000000001"),
        (Opaque(246, _decimal_bin(Decimal("42"), 4, 0)), "42"),
        (Opaque(11, _time_packed(False, 87, 31, 46, 654321)), '"87:31:46.654321"'),
        (Opaque(11, _time_packed(True, 838, 59, 59, 0)), '"-838:59:59.000000"'),
        (Opaque(11, _time_packed(False, 1, 2, 3, 0)), '"01:02:03.000000"'),
        (Opaque(10, _datetime_packed(2024, 2, 29)), '"2024-02-29"'),
        (Opaque(12, _datetime_packed(2024, 2, 29, 23, 59, 58, 7)), '"2024-02-29 23:59:58.000007"'),
        (Opaque(7, _datetime_packed(1970, 1, 1, 0, 0, 1)), '"1970-01-01 00:00:01.000000"'),
        (Opaque(252, b"\x00\xff"), '"base64:type252:AP8="'),
        (Opaque(16, b"\x05"), '"base64:type16:BQ=="'),
        (Opaque(253, b"plain"), '"plain"'),
    ],
)
def test_opaque_values_as_mysql_prints_them(value, text):
    assert to_text(to_binary({"v": value})) == '{"v": ' + text + "}"


def test_long_opaque_base64_breaks_lines_every_76_characters_escaped():
    text = render(Opaque(252, bytes(range(100))))
    assert text.count("\\n") == 1 and len(text.split("\\n")[0]) == len('"base64:type252:') + 76


@pytest.mark.parametrize(
    "x, text",
    [(1.0, "1.0"), (0.1, "0.1"), (-2.5, "-2.5"), (1e15, "1e15"), (1e14, "100000000000000.0"), (1e-5, "0.00001"),
     (1e-15, "0.000000000000001"), (1e-16, "1e-16"), (1.5e300, "1.5e300"), (-1.2345678901234567e-100, "-1.2345678901234567e-100"),
     (123456789012345.6, "123456789012345.6")],
)  # fmt: skip
def test_doubles_as_my_gcvt_prints_them(x, text):
    assert render(Double(x)) == text


def test_strings_escaped_as_double_quote_does():
    assert render(['a"b\\c\n\t\x01\x1f\x7f é 🐢']) == '["a\\"b\\\\c\\n\\t\\u0001\\u001f\x7f é 🐢"]'


def test_empty_value_is_null_and_junk_is_refused():
    assert to_text(b"") == "null"
    for junk in (b"\x0e", b"\x00\x05", b"\x0c\xff\xff\xff\xff\xff\x01", b"\x01" + b"\xff" * 8):
        with pytest.raises(JsonBinaryError):
            to_text(junk)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False).map(Double)
    | st.text()
)
_docs = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_docs)
def test_any_document_reads_back_and_renders_as_json(doc):
    data = to_binary(doc)
    assert parse(data) == doc
    text = to_text(data)
    assert json.loads(text) == json.loads(json.dumps(doc))  # the same value, read by a JSON parser
    if isinstance(doc, dict) and doc:
        assert text.startswith("{") and '": ' in text


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_gcvt_reads_back_exactly(x):
    text = gcvt(x)
    assert float(text) == x or (x == 0 and float(text) == 0)
    assert "+" not in text and (math.copysign(1, x) < 0) == text.startswith("-")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 65).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, min(p, 30)))), st.data())
def test_decimals_print_with_their_scale(ps, data):
    precision, scale = ps
    digits = data.draw(st.integers(-(10**precision) + 1, 10**precision - 1))
    with localcontext(prec=100):
        value = Decimal(digits).scaleb(-scale)
        text = render(Opaque(246, _decimal_bin(value, precision, scale)))
        assert text == (f"{value:.{scale}f}" if digits else f"{Decimal(0):.{scale}f}")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_are_read_or_refused_with_one_error_type(data):
    try:
        to_text(data)
    except JsonBinaryError:
        pass
