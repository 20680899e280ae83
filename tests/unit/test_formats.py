"""Output formats (cdc/events/formats.py): each format's exact bytes, built from what Debezium 3.6.3's
EventRouter writes (observed on this machine, and its documented examples), never from our
own encoder; the mapping of a row's extra columns; the table settings' refusals."""

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc import json_kinds, json_kinds_native
from cdc.errors import ConfigError
from cdc.events import formats
from cdc.events.formats import (
    H_FORMAT,
    ExtrasPlan,
    MessageExtras,
    _compact_as_debezium,
    _expand_text,
    _fast_json,
    blank,
    debezium_json,
    debezium_json_bytes,
    epoch_ms,
    expected_timestamp_ms,
    header_value,
    java_double,
    parse_placement,
    payload_value,
)
from cdc.events.identity import EventIdentity, TxIdentity
from cdc.events.outbox import OutboxMapper, OutboxTable
from cdc.events.topics import TopicRouter
from cdc.position import BinlogPosition
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client

IDENTITY = EventIdentity(TxIdentity("shop", BinlogPosition("mysql-bin.000001", 4), None, 1, 1_700_000_000_123), 0)


def row(payload, **more):
    return {
        "id": "4d47e190-0402-4048-bc2c-89dd54343cdc",
        "aggregatetype": "order",
        "aggregateid": "1",
        "type": "OrderCreated",
        "payload": payload,
        "created_at": dt.datetime(2024, 5, 3, 10, 11, 12, 345678),
        **more,
    }


def mapped(payload, **table):
    t = OutboxTable("shop", "outbox", **table)
    event = OutboxMapper(TopicRouter()).map(t, row(payload, traceparent=TRACEPARENT, tenant="acme"), IDENTITY)
    return event


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# ---------------------------------------------------------------- json (JsonConverter, expanded)


def test_json_is_the_payload_re_serialised_compactly_as_debezium_writes_it():
    # observed: {"n": 0} -> {"n":0}; non-ASCII as UTF-8 bytes, not \u escapes
    assert payload_value("json", '{"n": 0}') == b'{"n":0}'
    assert payload_value("json", '{"name": "Zo\u00eb", "city": "K\u00f8benhavn"}') == (
        b'{"name":"Zo\xc3\xab","city":"K\xc3\xb8benhavn"}'
    )
    nested = '{ "id": 1, "lineItems": { "item": "Debezium in Action", "quantity": 2 }, "ok": true }'
    assert payload_value("json", nested) == b'{"id":1,"lineItems":{"item":"Debezium in Action","quantity":2},"ok":true}'


def test_json_null_payload_is_the_four_bytes_null():
    assert payload_value("json", None) == b"null"


def test_json_follows_debeziums_schema_inference():
    # a null member has no schema: dropped; an array's type is its first element's
    assert debezium_json('{"a": null, "b": [1, 2]}') == '{"b":[1,2]}'
    # objects in an array share the union of their fields; a missing one is null
    assert debezium_json('{"d": [{"x": 1}, {"y": "z"}]}') == '{"d":[{"x":1,"y":null},{"x":null,"y":"z"}]}'
    # doubles as Java's Double.toString
    assert debezium_json('{"p": 39.98, "big": 1e7, "small": 0.0001, "one": 1.0}') == (
        '{"p":39.98,"big":1.0E7,"small":1.0E-4,"one":1.0}'
    )
    # not expandable: the payload stays a string, written as a JSON string literal
    assert debezium_json('{"a": [1, 2.5]}') == '"{\\"a\\": [1, 2.5]}"'
    assert debezium_json("not json") == '"not json"'
    assert debezium_json(' {"a": 1}') == '" {\\"a\\": 1}"'  # only a payload starting with { or [ is parsed
    assert debezium_json('{"a": 1') == '"{\\"a\\": 1"'
    assert debezium_json('{"a": 123456789012345678901}') == '"{\\"a\\": 123456789012345678901}"'
    # a top-level array: Debezium fails the record; the relay keeps the data as a string (it wrote {})
    assert debezium_json("[1, 2]") == '"[1, 2]"'
    # Jackson's escapes: upper-case hex for control characters
    assert debezium_json('{"c": "\\u001f\\n"}') == '{"c":"\\u001F\\n"}'


# Observed: Debezium 3.6.3's expansion (JsonSchemaData) + JsonConverter on Java 17, one case
# per class of docs/output-formats.md's "The json format's bytes" (the compatibility corpus runs
# thousands more through the embedded engine).
DEBEZIUM_OBSERVED = [
    ('{"s":"żółw 🐢"}', b'{"s":"\xc5\xbc\xc3\xb3\xc5\x82w \\uD83D\\uDC22"}'),
    ('{"s":"\\ud83d\\udc22","k🐢":1}', b'{"s":"\\uD83D\\uDC22","k\\uD83D\\uDC22":1}'),
    ('{"lone":"\\ud800","low":"\\udc00x"}', b'{"lone":"\\uD800","low":"\\uDC00x"}'),
    ('{"c":"\\u0000\\u0007\\b\\t\\n\\u000b\\f\\r\\u001f"}', b'{"c":"\\u0000\\u0007\\b\\t\\n\\u000B\\f\\r\\u001F"}'),
    ('{"e":"\\" \\\\ \\/ \\u007f \u2028 \u2029"}', b'{"e":"\\" \\\\ / \x7f \xe2\x80\xa8 \xe2\x80\xa9"}'),
    (
        '{"n":-0,"z":-0.0,"one":1.0,"e":1E2,"big":1e400,"nbig":-1e400,"small":1e-400}',
        b'{"n":0,"z":-0.0,"one":1.0,"e":100.0,"big":"Infinity","nbig":"-Infinity","small":0.0}',
    ),
    (
        '{"d":[5e-324,1e23,7e22,2.82879384806159E17]}',
        b'{"d":[4.9E-324,9.999999999999999E22,7.0000000000000004E22,2.82879384806159008E17]}',
    ),
    ('{"digits":0.1234567890123456789012345}', b'{"digits":0.12345678901234568}'),
    ('{"a":1,"a":2}', b'{"a":2}'),
    ('{"a":null,"b":1,"a":2}', b'{"a":2,"b":1}'),
    ('{"a":1,"b":2,"a":null}', b'{"b":2}'),
    ('{"a":[],"b":{"c":[]},"d":[[1],[]]}', b'{"b":{},"d":[[1],[]]}'),
    ("[]", b'"[]"'),
    ('{"a":[[],[1]]}', b'"{\\"a\\":[[],[1]]}"'),
    ('{"":1}', b'"{\\"\\":1}"'),
    ('{"":null,"b":1}', b'{"b":1}'),
    ('{"a":1} trailing', b'{"a":1}'),
    ('{"a":1}{"b":2}', b'{"a":1}'),
    (' {"a":1}', b'" {\\"a\\":1}"'),
    ('{ "a" :\n\t1 }\r\n', b'{"a":1}'),
    ("plain 🐢\x01", b'"plain \\uD83D\\uDC22\\u0001"'),
    # Jackson takes a non-ASCII UTF-16 unit's low byte as a hex digit of a \u escape
    ('{"q":"\\ud59𝄞x"}', b'{"q":"\xed\x96\x94\\uDD1Ex"}'),
    ('{"b":"\\u011𝄞r"}', b'{"b":"\xc4\x94\\uDD1Er"}'),
    ('{"q":"\\\\ud59𝄞x"}', b'{"q":"\\\\ud59\\uD834\\uDD1Ex"}'),
]


@pytest.mark.parametrize(("payload", "observed"), DEBEZIUM_OBSERVED)
def test_json_writes_the_bytes_debezium_wrote(payload, observed):
    assert debezium_json_bytes(payload) == observed
    assert _expand_text(payload).encode() == observed  # the general rules, whatever the fast path did


def test_json_at_jacksons_limits():
    """Jackson 2.21 reads 1000 levels of nesting and numbers of 1000 digits, and no more: a
    deeper or longer document stays a string (observed)."""
    deep = '{"a":' * 1000 + "1" + "}" * 1000
    assert debezium_json_bytes(deep) == deep.encode()
    deeper = '{"a":' * 1001 + "1" + "}" * 1001
    assert debezium_json_bytes(deeper) == json_string_literal(deeper)
    long_number = '{"x":1' + "0" * 999 + ".5}"  # 1001 digits
    assert debezium_json_bytes(long_number) == json_string_literal(long_number)
    assert debezium_json_bytes('{"x":0.' + "1" * 999 + "}") == b'{"x":0.1111111111111111}'  # 1000 digits
    name = "k" * 50_000  # Jackson reads names of up to 50,000 characters
    assert debezium_json_bytes('{"' + name + '":1}') == b'{"' + name.encode() + b'":1}'
    longer = '{"' + name + 'k":1}'
    assert debezium_json_bytes(longer) == json_string_literal(longer)


def json_string_literal(text: str) -> bytes:
    import json

    return json.dumps(text).encode()


def test_java_double_matches_double_tostring():
    cases = {
        1.0: "1.0",
        0.5: "0.5",
        100.0: "100.0",
        1e7: "1.0E7",
        12345678.9: "1.23456789E7",
        0.001: "0.001",
        1e-4: "1.0E-4",
        -2.5: "-2.5",
        9999999.0: "9999999.0",
        1e21: "1.0E21",
        0.0: "0.0",
        123.456: "123.456",
        # Java 17's FloatingDecimal, observed: not always the shortest digits
        5e-324: "4.9E-324",
        1e23: "9.999999999999999E22",
        7e22: "7.0000000000000004E22",
        2.82879384806159e17: "2.82879384806159008E17",
        2.0**60: "1.15292150460684698E18",
        1e-05: "1.0E-5",
        4.35e-321: "4.35E-321",
    }
    for value, text in cases.items():
        assert java_double(value) == text, value


# ---------------------------------------------------------------- string, bytes


def test_string_is_the_stored_text_unchanged_and_null_is_a_null_value():
    text = '{"n": 0,  "s": "caf\u00e9"}'
    assert payload_value("string", text) == text.encode("utf-8")
    assert payload_value("string", None) is None
    assert payload_value("string", "") == b""
    with pytest.raises(ValueError, match='format = "bytes"'):
        payload_value("string", b"\xff\xfe")


def test_bytes_is_the_raw_payload():
    assert payload_value("bytes", b"\x00\x01\xff") == b"\x00\x01\xff"
    assert payload_value("bytes", "caf\u00e9") == b"caf\xc3\xa9"
    assert payload_value("bytes", None) is None


# ---------------------------------------------------------------- avro (AvroConverter)


def _avro(**table):
    client = registry_client("mock://test-formats-" + "-".join(f"{k}{v}" for k, v in sorted(table.items())))
    return client, ConfluentAvroSerializer(client)


def test_avro_payload_is_a_string_value_registered_under_the_topics_value_subject():
    client, serializer = _avro()
    event = mapped('{"n": 0}', format="avro")
    value = serializer.encode(event, event.topic)
    registered = client.get_latest_version("outbox.event.order-value")
    # a nullable payload column is an optional Connect string: the AvroConverter registers
    # the union ["null","string"]; the body is the branch index 1 (zig-zag 0x02), the length
    # (8 -> zig-zag 0x10), then the UTF-8 text
    assert registered.schema.schema_str.replace(" ", "") == '["null","string"]'
    assert value == b"\x00" + registered.schema_id.to_bytes(4, "big") + b"\x02\x10" + b'{"n": 0}'
    assert serializer.encode(mapped(None, format="avro"), event.topic) is None


def test_avro_payload_of_a_not_null_column_registers_plain_string():
    client, serializer = _avro(nullable=False)
    event = mapped("hi", format="avro", payload_nullable=False)
    value = serializer.encode(event, event.topic)
    registered = client.get_latest_version("outbox.event.order-value")
    assert registered.schema.schema_str.replace(" ", "") == '"string"'
    assert value == b"\x00" + registered.schema_id.to_bytes(4, "big") + b"\x04hi"


# ---------------------------------------------------------------- the row's other columns


def test_mapping_headers_timestamp_and_trace_context():
    event = mapped(
        '{"n": 0}',
        format="json",
        additional_placement="type:header:eventType,tenant:header",
        timestamp_column="created_at",
        traceparent_column="traceparent",
    )
    extras = event.extras
    assert extras.format == "json"
    assert extras.headers == [
        ("eventType", b"OrderCreated"),
        ("tenant", b"acme"),
        ("traceparent", TRACEPARENT.encode()),
    ]
    # DATETIME(6) 2024-05-03 10:11:12.345678 (UTC) -> epoch milliseconds, truncated
    assert extras.timestamp_ms == 1714731072345
    assert event.aggregate_id == "1" and event.event_id == "4d47e190-0402-4048-bc2c-89dd54343cdc"


def test_the_record_timestamp_of_a_datetime_before_1970_is_truncated_toward_zero():
    before = dt.datetime(1969, 12, 31, 23, 59, 59, 999500)  # -500 us: Debezium's micros / 1000 is 0
    t = OutboxTable("shop", "outbox", format="json", timestamp_column="created_at")
    event = OutboxMapper(TopicRouter()).map(t, row("{}", created_at=before), IDENTITY)
    # 0 ms: no record timestamp librdkafka can send (it reads 0 as "now"): none, so the commit
    # time, as the verifier expects; the payload's timestamp keeps the -500 us
    assert (event.timestamp_us, event.extras.timestamp_ms) == (-500, None)
    assert expected_timestamp_ms(-500, 77) == expected_timestamp_ms(999, 77) == expected_timestamp_ms(None, 77) == 77
    assert expected_timestamp_ms(1000, 77) == 1 and expected_timestamp_ms(-1000, 77) == -1
    zero = OutboxMapper(TopicRouter()).map(t, row("{}", created_at=dt.datetime(1970, 1, 1)), IDENTITY)
    assert (zero.timestamp_us, zero.extras.timestamp_ms) == (0, None)
    earlier = OutboxMapper(TopicRouter()).map(t, row("{}", created_at=before - dt.timedelta(seconds=1)), IDENTITY)
    assert (earlier.timestamp_us, earlier.extras.timestamp_ms) == (-1_000_500, -1000)
    as_ms = OutboxMapper(TopicRouter()).map(t, row("{}", created_at=1714731072345), IDENTITY)  # an epoch-ms column
    assert as_ms.extras.timestamp_ms == 1714731072345


def test_a_text_header_is_one_object_per_distinct_text_across_events():
    """What the pipe's pickling relies on (ExtrasPlan): the same header of two events is the
    same object (pickled once per chunk); another text is another header; the mapper keeps
    one plan per table, and a second table gets its own."""
    mapper = OutboxMapper(TopicRouter())
    t = OutboxTable("shop", "outbox", format="json", additional_placement="type:header:eventType,tenant:header")
    first, second = (mapper.map(t, row("{}", tenant="acme"), IDENTITY) for _ in range(2))
    assert first.extras.headers == [("eventType", b"OrderCreated"), ("tenant", b"acme")]
    assert all(a is b for a, b in zip(first.extras.headers, second.extras.headers, strict=True))
    other = mapper.map(t, row("{}", type="OrderShipped", tenant=None), IDENTITY)
    assert other.extras.headers == [("eventType", b"OrderShipped"), ("tenant", None)]
    renamed = OutboxTable("shop", "outbox", format="json", additional_placement="type:header:kind")
    assert mapper.map(renamed, row("{}"), IDENTITY).extras.headers == [("kind", b"OrderCreated")]
    assert mapper.map(t, row("{}", tenant="acme"), IDENTITY).extras.headers == first.extras.headers


def test_a_header_column_of_many_distinct_texts_keeps_a_bounded_cache():
    plan = ExtrasPlan(OutboxTable("shop", "outbox", format="string", additional_placement="tenant:header"))
    for n in range(3 * ExtrasPlan._SEEN_MAX):
        assert plan.extras({"tenant": f"t{n}"}, None).headers == [("tenant", f"t{n}".encode())]
    assert len(plan.headers[0][2]) <= ExtrasPlan._SEEN_MAX
    assert plan.shared is not None and len(plan.shared[1]) <= ExtrasPlan._SEEN_MAX


def test_one_text_header_column_shares_the_whole_header_list_across_events():
    """With one header column and no trace column, the header list itself is one object per
    distinct text (the pipe pickles it once per chunk); a value that is not text, or a plan
    with trace columns, gets a list of its own per event, with the same contents as before."""
    mapper = OutboxMapper(TopicRouter())
    t = OutboxTable("shop", "outbox", format="json", additional_placement="type:header:eventType")
    first, second = (mapper.map(t, row("{}"), IDENTITY) for _ in range(2))
    assert first.extras.headers == [("eventType", b"OrderCreated")]
    assert first.extras.headers is second.extras.headers
    other = mapper.map(t, row("{}", type="OrderShipped"), IDENTITY)
    assert other.extras.headers == [("eventType", b"OrderShipped")]
    assert first.extras.headers == [("eventType", b"OrderCreated")]  # not changed by the other text
    plan = ExtrasPlan(t)
    assert plan.extras({"type": 7}, None).headers == [("eventType", b"7")]
    assert plan.extras({"type": 7}, None).headers is not plan.extras({"type": 7}, None).headers
    traced = ExtrasPlan(
        OutboxTable(
            "shop", "outbox", format="json", additional_placement="type:header:eventType", traceparent_column="tp"
        )
    )
    assert traced.shared is None
    one, two = (traced.extras({"type": "X", "tp": "00-ab"}, None) for _ in range(2))
    assert one.headers == [("eventType", b"X"), ("traceparent", b"00-ab")] and one.headers is not two.headers


def test_envelope_placement_wraps_the_payload_as_debeziums_struct():
    event = mapped('{"n": 0}', format="json", additional_placement="type:envelope:eventType")
    assert payload_value("json", event.payload, event.extras) == b'{"payload":{"n":0},"eventType":"OrderCreated"}'


def test_tombstone_on_empty_payload():
    _client, serializer = _avro()
    for payload in (None, "", "  \t"):
        event = mapped(payload, format="string", tombstone_on_empty_payload=True)
        assert serializer.encode(event, event.topic) is None
    event = mapped("", format="string")
    assert serializer.encode(event, event.topic) == b""
    assert blank(" \u00a0") is False  # Java's trim() keeps U+00A0


def test_envelope_stays_the_default_and_has_no_extras():
    event = mapped('{"n": 0}')
    assert event.extras is None
    assert H_FORMAT == "cdc.format"


def test_header_values_as_simple_header_converter_writes_them():
    assert header_value("x") == b"x"
    assert header_value(42) == b"42"
    assert header_value(True) == b"true"
    assert header_value(None) is None
    assert epoch_ms(dt.datetime(1969, 12, 31, 23, 59, 59, 999500)) == 0  # toward zero, like micros / 1000
    assert epoch_ms(None) is None


def test_extras_survive_the_pipe_to_the_relay_process():
    import pickle

    extras = MessageExtras("json", [("a", b"1"), ("b", None)], 5, (("x", 1),), True, False, True)
    assert pickle.loads(pickle.dumps(extras)) == extras
    # as the reader process sends them: inside an event's wire tuple, as a plain tuple
    from cdc.events.identity import EventIdentity, TxIdentity
    from cdc.events.outbox import OutboxEvent
    from cdc.position import BinlogPosition

    identity = EventIdentity(TxIdentity("s", BinlogPosition("b.000001", 4), None, 1, 0), 0)
    event = OutboxEvent("i", "t", "k", "e", "{}", 1, "topic", "db.outbox", identity, b"{}", extras)
    back = OutboxEvent.from_wire(pickle.loads(pickle.dumps(event.to_wire())), identity)
    assert back == event and back.extras == extras and back.extras.null_value is True


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"format": "xml"}, "format must be one of"),
        ({"format": "json", "additional_placement": "type:partition"}, "partition"),
        ({"format": "json", "additional_placement": "type"}, "column:placement"),
        ({"format": "string", "additional_placement": "type:envelope:t"}, 'format = "json" only'),
        ({"additional_placement": "type:header"}, 'not to format = "envelope"'),
        ({"format": "json", "tombstone_on_empty_payload": "yes"}, "true or false"),
    ],
)
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError, match=message) as err:
        OutboxTable("shop", "outbox", **settings)
    assert "\n" not in str(err.value)


def test_placement_syntax_is_debeziums():
    fields = parse_placement("type:header:eventType, aggregateid:envelope , tenant:HEADER")
    assert [(f.column, f.placement, f.alias) for f in fields] == [
        ("type", "header", "eventType"),
        ("aggregateid", "envelope", "aggregateid"),
        ("tenant", "header", "tenant"),
    ]


# The JSON documents a payload is made of, with the shapes that decide Debezium's form:
# nulls, int32/int64/beyond-64-bit integers, doubles in and out of Java's plain range,
# control characters, arrays of one kind or mixed, objects sharing members or not.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.001, 0.000999, 1e7, 9999999.5, -0.0, 0.0, 39.98, 1e-4, 123.0]),
    st.text(alphabet=st.characters(max_codepoint=0x2FF) | st.sampled_from('\x00\x1f\x7f\u2028"\\/'), max_size=6),
)
_KEYS = st.sampled_from(["a", "b", "c", "sku", "q", "\u00e9"])
_DOCS = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_KEYS, inner, max_size=4),
        st.lists(st.fixed_dictionaries({"sku": st.text(max_size=3), "q": st.integers(-5, 5)}), max_size=3),
    ),
    max_leaves=12,
)


# The fast-path tests run on each build of the proof walk (cdc/json_kinds.py): the pure-Python
# module, and the mypyc-compiled one when it is built and current (cdc/json_kinds_native.py).
# Module-scoped (hypothesis refuses function-scoped fixtures): pytest runs the tests of one
# build, then those of the other, and the walk `formats` loaded is back after the module.
WALKS = {"python": json_kinds} | ({"compiled": json_kinds_native.WALK} if json_kinds_native.COMPILED else {})


@pytest.fixture(scope="module", params=list(WALKS))
def walk(request):
    """`formats` with the walk `request.param` in place of the one it loaded."""
    loaded = formats._member_kinds
    formats._member_kinds = WALKS[request.param].member_kinds
    yield request.param
    formats._member_kinds = loaded


@settings(max_examples=600, deadline=None)
@given(doc=st.dictionaries(_KEYS, _DOCS, max_size=5), spaced=st.booleans())
def test_json_fast_path_writes_exactly_what_the_general_rules_write(doc, spaced, walk):
    """debezium_json's C-speed path (json.loads/dumps when `_compact_as_debezium` proves the
    output equal) never differs from the general rules (`_expand_text`), whatever the shape."""
    import json

    text = json.dumps(doc, ensure_ascii=bool(spaced), separators=(", ", ": ") if spaced else (",", ":"))
    assert debezium_json(text) == _expand_text(text)


def test_json_fast_path_is_taken_for_the_common_shapes(walk):
    """The shapes an outbox payload usually has go through the fast path (json.dumps), and
    the ones it must not handle do not."""
    import json

    common = {
        "order_id": 7,
        "customer": "c00042",
        "amount": 39.98,
        "currency": "EUR",
        "big": 2**40,
        "items": [{"sku": "sku-1", "qty": 2}, {"sku": "sku-2", "qty": 1}],
        "tags": ["a"],
        "ok": True,
        "nested": {"x": [1.5, 2.25]},
    }
    assert _compact_as_debezium(json.loads(json.dumps(common)))
    assert _fast_json(json.dumps(common, indent=1)) == json.dumps(common, separators=(",", ":")).encode()
    for odd in (
        {"a": None},
        {"a": 1e7},
        {"a": 0.0001},
        {"a": [1, 2**40]},
        {"a": [1, "x"]},
        {"a": [[1]]},
        {"a": [{"x": 1}, {"y": 1}]},
        {"a": [{"x": 1}, {"x": "s"}]},
        {"a": [{"x": 1}, {"x": 2**40}]},  # int32 then int64: two Connect types
        {"a": [{"x": {"y": 1}}, {"x": {"y": None}}]},
        {"a": [{"x": [1]}, {"x": [1, "s"]}]},
        {"a": 2**64},
        {"a": [None]},
    ):
        assert not _compact_as_debezium(odd), odd


def test_json_fast_path_looks_for_control_character_escapes_only_behind_a_backslash(walk):
    """orjson writes a control character as a lower-case `\\u00xx` escape, which Jackson writes
    in upper case: such a document takes the general path, found through the backslash gate;
    other escapes (`\\"`, `\\\\`, `\\n`) are the same in both and stay on the fast path."""
    assert _fast_json('{"a":"x\\u001fy"}') is None
    assert _expand_text('{"a":"x\\u001fy"}') == '{"a":"x\\u001Fy"}'
    for text in ('{"a":"x\\"y\\\\z\\n"}', '{"a":"plain"}'):
        assert _fast_json(text) == _expand_text(text).encode(), text


def test_json_fast_path_drops_null_and_empty_array_members_as_debezium_does(walk):
    """An optional member left null (or an empty list) no longer sends the payload to the
    general rules: the fast path drops it as Debezium does, nested objects included; inside
    an array's objects (where Debezium writes the null) the general path still decides."""
    for text, expected in (
        ('{"a":null,"b":1}', b'{"b":1}'),
        ('{"a": [], "b": {"c": null, "d": "x"}, "e": {"f": null}}', b'{"b":{"d":"x"},"e":{}}'),
        ('{"":null,"n":1.5}', b'{"n":1.5}'),
        ('{"a":1,"a":null}', b"{}"),
    ):
        assert _fast_json(text) == expected == _expand_text(text).encode(), text
    for text in ('{"a":[{"x":1},{"x":null}]}', '{"a":[{"x":[]}]}', '{"a":[null]}', '{"":1,"b":null}'):
        assert _fast_json(text) is None, text


# JSON texts as applications store them, with what a parser may read differently: whitespace
# anywhere JSON allows it, \u escapes (surrogate pairs, lone surrogates, control characters),
# duplicate members, integers at and beyond the 64-bit bounds, numbers in every spelling, NaN,
# trailing content, nesting.
_NUMBERS = st.sampled_from(
    [
        "0",
        "-0",
        "1E2",
        "1e+2",
        "0.1e1",
        "-0.0",
        "1.0",
        "1e7",
        "1e-4",
        "5e-324",
        "1e400",
        "-1e400",
        "2147483648",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "123456789012345678901234567890",
        "0.30000000000000004",
        "1.00000000000000000001",
        "NaN",
        "Infinity",
        "01",
    ]
)
_STRINGS = st.sampled_from(
    [
        '"a"',
        '"\\u00e9"',
        '"\\ud83d\\ude00"',
        '"🐢 \U0010ffff"',
        '"\\ud800"',
        '"\\u001f"',
        '"\\u007f"',
        '"\\/"',
        '"\u2028"',
        '"\\\\u0041"',
        '""',
    ]
)
_WS = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


@st.composite
def _json_text(draw, depth=0):
    kind = draw(st.integers(0, 5 if depth < 3 else 2))
    if kind == 0:
        return draw(_NUMBERS)
    if kind == 1:
        return draw(_STRINGS)
    if kind == 2:
        return draw(st.sampled_from(["true", "false", "null"]))
    if kind == 3:
        items = draw(st.lists(_json_text(depth + 1), max_size=3))
        return "[" + ",".join(draw(_WS) + i + draw(_WS) for i in items) + "]"
    return _json_object(draw, depth)


def _json_object(draw, depth):
    keys = draw(st.lists(st.sampled_from(['"a"', '"b"', '"\\u0061"', '"\u00e9"']), max_size=4))  # repeats: duplicates
    members = [draw(_WS) + k + draw(_WS) + ":" + draw(_WS) + draw(_json_text(depth + 1)) + draw(_WS) for k in keys]
    return "{" + ",".join(members) + "}"


@settings(max_examples=1500, deadline=None)
@given(
    body=st.composite(lambda draw: _json_object(draw, 0))(), tail=st.sampled_from(["", " ", "\n", " x", "}", "\x0c"])
)
def test_json_fast_path_agrees_with_the_general_rules_on_any_text(body, tail, walk):
    """The fast path (orjson) reads what Python's json reads and nothing else: for any text
    starting with `{` - valid or not - it gives the general rules' bytes."""
    text = body + tail
    assert debezium_json(text) == _expand_text(text)
    assert debezium_json_bytes(text) == _expand_text(text).encode()


def test_a_lone_surrogate_in_a_json_payload_is_published_escaped_as_jackson_writes_it():
    """Jackson reads `"\\ud800"` into a Java string and writes the lone UTF-16 unit back as
    an escape (observed: Debezium 3.6.3 writes `{"a":"\\uD800"}`): the relay publishes the
    same bytes (it used to dead-letter the event, as if UTF-8 could not carry it)."""
    from cdc.assembly.feed import prepare
    from cdc.events.outbox import DeadLetter

    event = mapped('{"a":"\\ud800"}', format="json")
    prepared = prepare(event, _avro(surrogate=1)[1], 1_000_000)
    assert not isinstance(prepared, DeadLetter)
    assert prepared.encoded == b'{"a":"\\uD800"}'


def test_the_verifier_matches_json_values_by_debeziums_bytes():
    """`payload_matches` (the verifier's content check) takes the expanded form, the
    envelope struct, a tombstone for a blank payload, and a lone surrogate escaped as
    Jackson writes it."""
    from cdc.events.formats import payload_matches

    stored = b'{"n": 1, "s": "caf\\u00e9"}'
    assert payload_matches("json", '{"n":1,"s":"caf\u00e9"}'.encode(), stored)
    assert payload_matches("json", '{"payload":{"n":1,"s":"caf\u00e9"},"eventType":"X"}'.encode(), stored)
    assert not payload_matches("json", b'{"n":2,"s":"caf\xc3\xa9"}', stored)
    assert payload_matches("json", None, b"  ")
    assert not payload_matches("json", b'{"a":"?"}', b'{"a":"\\ud800"}')
    assert payload_matches("json", b'{"a":"\\uD800"}', b'{"a":"\\ud800"}')


def test_json_fast_path_agrees_with_the_general_rules_on_the_compat_corpus(walk):
    """The corpus the compatibility test runs through Debezium (tests/integration/
    json_corpus.py, every class of docs/output-formats.md's "The json format's bytes"): on each payload
    of a few seeds the fast path gives the general rules' bytes, and those are UTF-8."""
    from tests.integration.json_corpus import FIXED, CorpusGenerator

    for seed in (1, 2, 3):
        for payload in FIXED + CorpusGenerator(seed).payloads(2000):
            if payload is not None:
                assert debezium_json_bytes(payload) == _expand_text(payload).encode(), payload
