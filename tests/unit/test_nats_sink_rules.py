"""The NATS JetStream sink's rules that need no server: its settings' validation (one
line naming the fix) and what a message carries for the broker (`Nats-Msg-Id` from the
relay's identity, none for a repair; no line break inside a header)."""

from __future__ import annotations

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from cdc.events.identity import H_DLQ_ERROR, H_FILE, H_POS, H_REPAIR, H_ROW, H_SOURCE
from connectors.nats.sink import H_MSG_ID, nats_headers, stream_name

BASE = {
    "source": {"name": "shop"},
    "outbox": {"tables": [{"schema": "s", "table": "outbox"}]},
    "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
}


def _load(nats: dict | None = None, **sections):
    raw = {**BASE, "sink": {"kind": "nats_jetstream", "nats_jetstream": nats or {}}, **sections}
    return load_config(raw, {})


def test_the_defaults_hold_together():
    cfg = _load().sink.nats_jetstream
    assert cfg.ack_timeout_s < cfg.delivery_timeout_s < cfg.duplicate_window_s == 120


@pytest.mark.parametrize(
    ("nats", "sections", "message"),
    [
        ({}, {"checkpoint": {"store": "kafka"}}, 'set checkpoint.store = "file"'),
        ({}, {"kafka": {"delivery": "transactional"}}, "remove kafka.delivery"),
        ({"delivery_timeout_s": 150}, {}, "ack_timeout_s < delivery_timeout_s < duplicate_window_s"),
        ({"ack_timeout_s": 0}, {}, "ack_timeout_s < delivery_timeout_s"),
        ({"cert_file": "/c.pem"}, {}, "cert_file and key_file go together"),
        ({"max_in_flight": 0}, {}, "max_in_flight must be at least 1"),
        ({"servers": []}, {}, "must name at least one server"),
    ],
)
def test_a_wrong_setting_is_one_line_naming_the_fix(nats, sections, message):
    with pytest.raises(ConfigError, match=message):
        _load(nats, **sections)


IDENTITY = [(H_SOURCE, b"shop"), (H_FILE, b"bin.000002"), (H_POS, b"4711"), (H_ROW, b"3")]


def test_the_msg_id_is_the_subject_and_the_identity():
    headers = nats_headers("shop.order", b"k1", b"v", IDENTITY, 1700000000123)
    assert headers[H_MSG_ID] == "shop.order|shop|bin.000002|4711|3"
    assert headers["cdc.key"] == "k1" and headers["cdc.timestamp"] == "1700000000123"
    # the same event on another subject (a dead letter) is another message
    assert nats_headers("shop.dlq", b"k1", b"v", IDENTITY, None)[H_MSG_ID] != headers[H_MSG_ID]


def test_a_repair_and_a_message_without_identity_carry_no_msg_id():
    assert H_MSG_ID not in nats_headers("shop.order", None, b"v", [*IDENTITY, (H_REPAIR, b"1")], None)
    assert H_MSG_ID not in nats_headers("shop.order", None, b"v", [("id", b"e1")], None)


def test_a_line_break_in_a_header_value_is_sent_as_a_space():
    headers = nats_headers("shop.dlq", None, None, [(H_DLQ_ERROR, b"first\r\nsecond")], None)
    assert headers[H_DLQ_ERROR] == "first  second" and headers["cdc.value.null"] == "true"


def test_a_created_stream_is_named_after_its_subject():
    assert stream_name("shop.order.*") == "shop_order__"
