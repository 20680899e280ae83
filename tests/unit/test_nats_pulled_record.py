"""`pulled_record` (spark_jobs/nats/source.py) makes of a pulled message's reply subject what
`message_record` makes of nats-py's Msg, to the millisecond, for a message without
`cdc.timestamp` (the time stored): nats-py's Msg.metadata.timestamp is a datetime, which keeps
microseconds (rounded), so a time stored a fraction of a microsecond before a millisecond
boundary is that millisecond. The integration test `test_nats_raw_pulls_read_what_nats_pys_
fetch_reads` met one (1795970102364 against nats-py's 1795970102365) once in a full run."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from spark_jobs.nats.source import message_record, pulled_record


@pytest.mark.parametrize(
    "stored_ns",
    [1795970102364999700, 1795970102364999500, 1795970102364999499, 1795970102365000000, 1700000000000000001, 0],
)
def test_the_time_stored_is_nats_pys_to_the_millisecond(stored_ns: int) -> None:
    reply = f"$JS.ACK.S.C.1.42.42.{stored_ns}.0"
    msg = Msg(_client=None, subject="t.a", reply=reply, data=b"v", headers={"id": "e1"})  # type: ignore[arg-type]  # no client: only metadata is read
    record, pending = pulled_record("t.a", reply.encode(), b"v", b"NATS/1.0\r\nid: e1\r\n\r\n")
    reference = message_record("t.a", msg)
    assert (record.offset(), record.timestamp(), pending) == (reference.offset(), reference.timestamp(), 0)
