"""The proof walk of the json format's fast path: whether orjson's compact bytes of a parsed
payload are Debezium's expansion of it byte for byte, listing each member's Connect kind on
the way (docs/output-formats.md, "The json format's bytes").

The one source of truth for the walk, pure Python and typed so that mypyc can compile it:
`tools/build_native.py json_kinds` (run by `./run.sh setup` when a C compiler is there) builds
`cdc/_json_kinds_compiled.*.so` from this file, stamped with its SHA-256, and
`cdc/json_kinds_native.py` loads that build only while the stamp matches this file (else
this module). Nothing here may import beyond the standard library: the compiled copy is
built outside the package.
"""

from __future__ import annotations

I32_LO, I32_HI, I64_LO, I64_HI = -(2**31), 2**31 - 1, -(2**63), 2**63 - 1


class Int64:
    """The kind of an integer beyond 32 bits (`member_kinds`: int32 and int64 are two
    Connect types, so an array's objects must agree on which one a member is)."""


def plain_double(v: float) -> bool:
    """Python's repr of `v` is Java 17's Double.toString: zero, or 10^-3 <= |v| < 10^7,
    where both write plain decimal with the shortest digits (Java's digit generation can
    only differ from the shortest when a neighbour's midpoint is the shorter decimal, and
    in this range a midpoint has more than 17 significant digits; NaN and infinities fail
    every comparison). `member_kinds` has the same test inline."""
    return 1e-3 <= v < 1e7 or -1e7 < v <= -1e-3 or v == 0


def member_kinds(obj: dict) -> list[type] | None:
    """The Connect kind of each member of `obj` (its type; `Int64` for an integer beyond
    32 bits), or None unless `json.dumps(obj)` is Debezium's expansion of it byte for byte:
    no null or empty-array member (Debezium drops them), no empty name (Connect refuses the
    field), integers within 64 bits, doubles that Python and Java write alike, and arrays
    whose elements share one kind (`array_as_debezium`).

    One pass over the members that both checks them and lists their kinds, because an array
    of objects needs both of each element; it used to be two (a check, then a `_member_kind`
    call per member): 2.0 -> 1.4 us for the bench's payload (`bench/workloads.py`: six
    members, two objects in an array), the largest share of the json format's conversion."""
    if "" in obj:
        return None
    kinds: list[type] = []
    add = kinds.append
    for v in obj.values():
        t = type(v)
        if t is str or t is bool:
            add(t)
        elif t is int:
            if I32_LO <= v <= I32_HI:
                add(t)
            elif I64_LO <= v <= I64_HI:
                add(Int64)
            else:
                return None
        elif t is float:
            if not (1e-3 <= v < 1e7 or -1e7 < v <= -1e-3 or v == 0):  # plain_double, inline: one call less
                return None
            add(t)
        elif t is dict:
            if member_kinds(v) is None:
                return None
            add(t)
        elif t is list:
            if not v or not array_as_debezium(v):
                return None
            add(t)
        else:
            return None  # None
    return kinds


def array_as_debezium(items: list) -> bool:
    """An array Debezium writes as json.dumps does: scalars of one kind (int32, int64,
    double, string, boolean; no null); or objects with the same members in the same order,
    each member of one kind across the elements (one schema: nothing to merge). Arrays of
    arrays take the general path."""
    first = items[0]
    t = type(first)
    if t is str or t is bool:
        return all(type(x) is t for x in items)
    if t is int:
        if not all(type(x) is int for x in items):
            return False
        if all(I32_LO <= x <= I32_HI for x in items):
            return True
        return all(I64_LO <= x <= I64_HI and not I32_LO <= x <= I32_HI for x in items)
    if t is float:
        return all(type(x) is float and plain_double(x) for x in items)
    if t is dict:
        keys = list(first)
        kinds = member_kinds(first)
        if kinds is None:
            return False
        for x in items:
            if x is not first and (type(x) is not dict or list(x) != keys or member_kinds(x) != kinds):
                return False
        return True
    return False
