"""Outbox payloads for the Debezium compatibility corpus (test_debezium_compat.py): a seeded
generator of JSON texts as applications store them, plus fixed cases for each class of
docs/output-formats.md's "The json format's bytes".

The generator covers what a JSON reader and writer can disagree on: strings with every kind
of character (controls, `"` `\\` `/`, U+007F, U+2028/9, the BMP, beyond the BMP) written raw
or as escapes (`\\u00e9`, `\\uD83D\\uDC22`, short forms, lone surrogates, an escape whose digits
run into a non-ASCII character), member names with
the same, duplicate names, numbers in every spelling and range (int32/int64 bounds, `-0`,
exponents, many digits, subnormals, overflow to Infinity, underflow to 0.0), nulls and empty
arrays (no schema), empty objects, arrays of one kind (with nulls), of arrays, of objects of
one shape, whitespace anywhere JSON allows it, trailing content after the document, and text
that is not JSON or not expandable.

It leaves out, by construction, what Debezium cannot write or writes in an order no one can
derive (docs/output-formats.md): top-level arrays whose schema can be inferred and documents holding an
integer beyond 64 bits or an array whose elements' schemas differ (Debezium's converter
fails such a record: a Connect task stops), and arrays of objects of different shapes
(merged in a HashSet's order).
"""

from __future__ import annotations

import random
import struct

_WS = [" ", "\t", "\n", "\r\n", "  "]
_RAW_CHARS = (
    [chr(c) for c in range(0x20, 0x7F)]
    + ["\x7f", "é", "ß", "ж", "€", "中", "\u2028", "\u2029", "\ufeff", "\ue000", "\uffff", "\u00a0"]
    + ["🐢", "😀", "\U00010000", "\U0010ffff", "𝄞"]
)
_WORDS = ["id", "name", "amount", "items", "a", "b", "é", "🐢", "a.b", "1x", "type", " ", "x-y", "𝄞k", "k\u2028"]


class CorpusGenerator:
    """`payloads(n)`: n payload texts (str, or None for a NULL) from `seed`."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)

    # -------------------------------------------------------------------- text pieces

    def ws(self) -> str:
        return self.rng.choice(_WS) if self.rng.random() < 0.15 else ""

    def char(self) -> str:
        """One character of a JSON string, raw or escaped (the writer's choice)."""
        r = self.rng.random()
        if r < 0.05:
            return self.rng.choice(["\\n", "\\t", "\\r", "\\b", "\\f", "\\/", "\\\\", '\\"'])
        if r < 0.09:
            c = self.rng.randrange(0x20)
            return self.rng.choice([f"\\u{c:04x}", f"\\u{c:04X}"])
        if r < 0.12:  # a character beyond the BMP as an escaped surrogate pair
            c = self.rng.randrange(0x10000, 0x110000) - 0x10000
            hi, lo = 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF)
            return self.rng.choice([f"\\u{hi:04x}\\u{lo:04x}", f"\\u{hi:04X}\\u{lo:04X}"])
        if r < 0.13:  # a lone surrogate escape
            return f"\\u{self.rng.randrange(0xD800, 0xE000):04x}"
        if r < 0.132:  # a short escape ended by a non-ASCII character (Jackson reads its low byte)
            digits = "".join(self.rng.choice("0123456789abcdef") for _ in range(self.rng.randint(1, 3)))
            return "\\u" + digits + self.rng.choice(["𝄞", "ж", "Ė", "é", "中", "🐢"])
        if r < 0.17:  # any BMP character as an escape
            c = self.rng.choice([0x7F, 0xE9, 0x2028, 0x2029, 0xFEFF, 0x4E2D, 0x41, 0x2F])
            return f"\\u{c:04x}"
        if r < 0.25:  # raw, beyond the BMP
            return self.rng.choice(["🐢", "😀", "\U00010000", "\U0010ffff", "𝄞"])
        return self.rng.choice(_RAW_CHARS).replace("\\", "\\\\").replace('"', '\\"')

    def string(self, max_len: int = 12, min_len: int = 0) -> str:
        return '"' + "".join(self.char() for _ in range(self.rng.randint(min_len, max_len))) + '"'

    def name(self) -> str:
        if self.rng.random() < 0.6:
            word = self.rng.choice(_WORDS)
            return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return self.string(6, 1)  # the empty name only where chosen (obj)

    def double_text(self) -> str:
        rng = self.rng
        kind = rng.randrange(9)
        if kind == 0:
            v = round(rng.uniform(-1e5, 1e5), rng.randint(0, 4))
        elif kind == 1:
            v = rng.random() * 10 ** rng.randint(-30, 30)
        elif kind == 2:
            v = float(rng.randint(1, 2**63))  # integer-valued: Java 17's own digits
        elif kind == 3:
            v = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if v != v or v in (float("inf"), float("-inf")):
                v = 1.5
        elif kind == 4:
            v = struct.unpack("<d", rng.getrandbits(52).to_bytes(8, "little"))[0]  # subnormal
        elif kind == 5:
            return rng.choice(["1e400", "-1E400", "1e-400", "-0.0", "0e0", "1.0", "1E2", "1e+2", "2.5E-3", "100.0"])
        elif kind == 6:  # more digits than a double holds
            return f"{rng.randint(0, 9)}.{''.join(rng.choice('0123456789') for _ in range(rng.randint(17, 40)))}"
        elif kind == 7:
            v = float(f"{rng.randint(1, 99)}e{rng.randint(-324, 308)}")
        else:
            v = rng.uniform(-1e7, 1e7)
        text = repr(v)
        if "e" in text and rng.random() < 0.5:
            text = text.replace("e", "E")
        if "." not in text and "e" not in text.lower() and "inf" not in text:
            text += ".0"
        return text

    def int_text(self, wide: bool) -> str:
        rng = self.rng
        if wide:
            return str(rng.choice([2**31, -(2**31) - 1, 2**63 - 1, -(2**63), rng.randint(2**31, 2**63 - 1)]))
        return str(
            rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-1000, 1000), rng.randint(-(2**31), 2**31 - 1)])
        )

    # ---------------------------------------------------------------- typed values

    def scalar(self, kind: str) -> str:
        if kind == "str":
            return self.string()
        if kind == "bool":
            return self.rng.choice(["true", "false"])
        if kind == "int32":
            return self.int_text(False)
        if kind == "int64":
            return self.int_text(True)
        return self.double_text()

    def value(self, depth: int) -> str:
        r = self.rng.random()
        if depth >= 4:
            r = r * 0.6
        if r < 0.2:
            return self.string()
        if r < 0.3:
            return self.scalar(self.rng.choice(["int32", "int64"]))
        if r < 0.4:
            return self.double_text()
        if r < 0.45:
            return self.rng.choice(["true", "false"])
        if r < 0.52:
            return "null"  # no schema: the member is dropped
        if r < 0.55:
            return "[" + self.ws() + "]"  # no schema either
        if r < 0.6:
            return self.scalar_array()
        if r < 0.7:
            return self.obj(depth + 1)
        if r < 0.8:
            return self.object_array(depth + 1)
        if r < 0.85:
            return self.nested_array()
        return self.string()

    def scalar_array(self) -> str:
        kind = self.rng.choice(["str", "bool", "int32", "int64", "double"])
        items = [self.scalar(kind) for _ in range(self.rng.randint(1, 4))]
        for _ in range(self.rng.randint(0, 2)):  # nulls anywhere, the array keeps its kind
            items.insert(self.rng.randint(0, len(items)), "null")
        return "[" + ",".join(self.ws() + i + self.ws() for i in items) + "]"

    def nested_array(self) -> str:
        kind = self.rng.choice(["str", "int32", "double"])
        inner = ["[" + ",".join(self.scalar(kind) for _ in range(self.rng.randint(1, 3))) + "]"]
        inner += [
            "[" + ",".join(self.scalar(kind) for _ in range(self.rng.randint(0, 3))) + "]"
            for _ in range(self.rng.randint(0, 2))
        ]
        return "[" + ",".join(inner) + "]"

    def shape(self, depth: int) -> list[tuple[str, str]]:
        """Members of one schema: (name, kind), names distinct, kinds with a schema."""
        names: list[str] = []
        while len(names) < self.rng.randint(0, 4):
            n = self.name()
            if n not in names and n != '""':
                names.append(n)
        kinds = ["str", "bool", "int32", "int64", "double"] + (["object"] if depth < 3 else [])
        return [(n, self.rng.choice(kinds)) for n in names]

    def shaped(self, shape: list[tuple[str, str]], inner: dict, depth: int) -> str:
        parts = []
        for n, kind in shape:
            if kind == "object":
                value = self.shaped(inner[n], {}, depth + 1)
            else:
                value = self.scalar(kind)
                if kind == "int64" and -(2**31) <= int(value) < 2**31:
                    value = str(2**40)
                if kind == "int32":
                    value = str(int(value))
            parts.append(self.ws() + n + self.ws() + ":" + self.ws() + value)
        return "{" + ",".join(parts) + self.ws() + "}"

    def object_array(self, depth: int) -> str:
        """Objects of one shape (one schema: no merge), with nulls between them."""
        shape = self.shape(depth)
        inner = {n: [(m, k) for m, k in self.shape(depth + 1) if k != "object"] for n, k in shape if k == "object"}
        items = [self.shaped(shape, inner, depth) for _ in range(self.rng.randint(1, 3))]
        if self.rng.random() < 0.3:
            items.insert(self.rng.randint(0, len(items)), "null")
        return "[" + ",".join(items) + "]"

    def obj(self, depth: int) -> str:
        members = []
        names = [self.name() for _ in range(self.rng.randint(0, 5))]
        if names and self.rng.random() < 0.1:
            names.append(self.rng.choice(names))  # a duplicate: the last one wins, in the first's place
        if self.rng.random() < 0.03:
            names.append('""')
            members_null = True
        else:
            members_null = False
        for n in names:
            v = "null" if (members_null and n == '""') else self.value(depth)
            members.append(self.ws() + n + self.ws() + ":" + self.ws() + v + self.ws())
        return "{" + ",".join(members) + "}"

    # ------------------------------------------------------------------- payloads

    def payload(self) -> str | None:
        r = self.rng.random()
        if r < 0.75:
            text = self.obj(1)
            t = self.rng.random()
            if t < 0.1:
                text += self.rng.choice(["\n", " ", "\r\n\t"])
            elif t < 0.14:
                text += self.rng.choice([" x", "}", '{"b":2}', ",", "]", "\x00"])  # ignored by readTree
            return text
        if r < 0.8:
            return self.rng.choice(_NOT_EXPANDABLE)
        if r < 0.83:
            return None
        if r < 0.9:  # text that is not JSON, with every kind of character
            chars = _RAW_CHARS + ["\n", "\t", "\x01", "\x1f"]
            text = "".join(self.rng.choice(chars) for _ in range(self.rng.randint(0, 20)))
            return "x" + text if text[:1] in ("{", "[") else text  # never a top-level array by chance
        if r < 0.95:  # not parsed: does not start with { or [
            return self.rng.choice([" ", "\n", "\t", "\ufeff"]) + self.obj(1)
        return self.broken()

    def broken(self) -> str:
        text = self.obj(1)
        how = self.rng.randrange(5)
        if how == 0 and len(text) > 2:
            return text[: self.rng.randint(1, len(text) - 1)]  # cut short
        if how == 1:
            return "{'a': 1}"
        if how == 2:
            return '{"a": 1,}'
        if how == 3:
            return '{"a": NaN, "b": 01}'
        return '{"a": "tab\there"}'  # a raw control character in a string

    def payloads(self, n: int) -> list[str | None]:
        return [self.payload() for _ in range(n)]


# Deterministic texts Debezium does not expand (it writes the payload as a JSON string).
_NOT_EXPANDABLE = [
    "[]",
    "[null]",
    "[[], [1]]",
    '{"a": [1, "x"]}',
    '{"a": [1, 2.5]}',
    '{"a": [1, 3000000000]}',
    '{"a": [null, null]}',
    '{"a": [[]]}',
    '{"": 1}',
    '{"x": 1' + "0" * 1001 + ".5}",  # more digits than Jackson reads
    '{"a":' * 1001 + "1" + "}" * 1001,  # deeper than Jackson reads
]

# Fixed cases, one or more per class (docs/output-formats.md), always in the corpus.
FIXED = [
    '{"s":"żółw 🐢"}',
    '{"s":"\\ud83d\\udc22","t":"\\uD83D\\uDC22"}',
    '{"lone":"\\ud800","low":"\\udc00x","pair_then_lone":"\\ud83d\\udc22\\ud83d"}',
    '{"c":"' + "".join(f"\\u{c:04x}" for c in range(32)) + '"}',
    '{"e":"\\" \\\\ \\/ / \\u007f \u007f \u2028 \u2029 \\u2028"}',
    '{"k\\u0001":1,"🐢":2,"\\ud83d\\ude00":3," ":4,"a.b":5}',
    '{"n":-0,"z":-0.0,"one":1.0,"e":1E2,"big":1e400,"nbig":-1e400,"small":1e-400}',
    '{"i32":2147483647,"i32n":-2147483648,"i64":2147483648,"max":9223372036854775807,"min":-9223372036854775808}',
    '{"d":[5e-324,4.9E-324,1e23,7e22,2.82879384806159E17,1.7976931348623157E308,2.2250738585072014E-308]}',
    '{"plain":[0.001,9999999.999,1e7,0.00099999,100.0,0.1,0.30000000000000004]}',
    '{"digits":0.1234567890123456789012345678901234567890,"x":1.00000000000000005}',
    '{"a":1,"a":2}',
    '{"a":null,"b":1,"a":2}',
    '{"a":1,"b":2,"a":null}',
    '{"a":{"x":1},"a":[1,2]}',
    "{}",
    '{"a":{},"b":[],"c":null,"d":{"e":[]}}',
    '{"a":[{}],"b":[{"x":1},null,{"x":2}]}',
    '{"a":[[1],[]],"b":[[1,2],[3]]}',
    '{ "a" : 1 ,\n\t"b" :\r\n [ 1 , 2 ] }',
    '{"a":1} trailing text',
    '{"a":1}{"b":2}',
    '{"q":"\\ud59𝄞x","r":"\\u011ж","s":"\\\\ud59𝄞"}',  # Jackson's hex digits: a unit's low byte
    '{"a":1}\n',
    ' {"a":1}',
    '{"a":1',
    '{"": null, "x": 1}',
    '{"deep":' * 60 + "1" + "}" * 60,
    "plain text 🐢 with \u2028 and \x01",
    "",
    "   ",
    None,
]
