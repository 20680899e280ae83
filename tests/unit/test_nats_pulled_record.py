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


def test_a_pull_answered_no_responders_is_empty_and_asked_again_any_other_status_is_an_error() -> None:
    """A pull the server answers 503 (no responders: the consumer has no leader now, as while
    a replicated stream's servers restart) takes nothing and is asked again by `read_range`
    (its stall timeout bounds the wait); 404 and 408 end a pull; anything else is an error."""
    import asyncio

    import pytest

    from spark_jobs.nats.source import _Puller

    class Server:
        def __init__(self, puller: _Puller, status: bytes) -> None:
            self.puller, self.status = puller, status

        async def publish(self, subject: str, data: bytes, reply: str) -> None:
            self.puller._take(reply.encode(), b"", b"", b"NATS/1.0 " + self.status + b"\r\n\r\n")

    def pulled(status: bytes) -> list:
        puller = _Puller(None, "t.order", "t_events")
        puller.nc, puller.name, puller.inbox = Server(puller, status), "c", b"_INBOX.x."
        return asyncio.run(puller._request({"batch": 10, "no_wait": True}, 5.0))

    assert pulled(b"503") == [] and pulled(b"404 No Messages") == [] and pulled(b"408 Request Timeout") == []
    with pytest.raises(RuntimeError, match="the server said 409 Consumer Deleted"):
        pulled(b"409 Consumer Deleted")
