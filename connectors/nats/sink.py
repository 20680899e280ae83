"""The NATS JetStream sink: the relay's publisher (cdc.ports.Publisher), what reads the
streams back (cdc.ports.DeliveredLog) and what creates a missing one (cdc.ports.TopicAdmin).
What maps to what (topic = subject, offset = stream sequence, key and null value as
headers) is docs/sinks.md and cdc/events/sink_fields.py; why delivery is exactly once is
docs/sink-delivery.md "NATS JetStream".

Publishing. Each message is a core NATS PUB with a reply subject `<inbox>.<n>`: the
server's JetStream answers there with a PubAck (`{"stream", "seq", "duplicate"}`), an
API error (`{"error": {"err_code", ...}}`) or, when no stream takes the subject, the
status 503 "no responders" (ADR-22 / the JetStream publish reference). A PUB does not
wait for its answer, so up to `max_in_flight` messages are on the wire, in publish order,
on ONE connection: the server stores them in that order.

Every message carries `Nats-Msg-Id`, derived from the relay's identity headers (the
binlog position or GTID and the row, cdc/events/identity.py) and the subject: a message sent
again within the stream's `duplicate_window` is answered "duplicate" with the first
copy's sequence and not stored again. Hence the publisher's rule when an answer does not
come (`ack_timeout_s`) or the connection breaks: close the connection, open a new one,
and send every unanswered message again, oldest first, before anything new. Each
connection carries an in-order run of the messages, and the server stores a message at
its first arrival, so the stream keeps publish order whatever mix of first and second
copies reaches it. (nats-py's own reconnect is off: it would replay its buffered tail
before the unanswered messages that the broken socket lost, out of order.) A message
still unanswered after `delivery_timeout_s` fails, and so does every later one (order),
which stops the relay (exit 1); the restart finds what was stored (cdc/recovery.py).

`purge()` drops whatever is unanswered and stops sending it again.

The publish path writes the NATS protocol itself (`hpub`): the header block is made in the
relay's thread when the message is handed over (`message_header_block`: a transaction's
leading headers made once), the messages go to the loop's thread in batches (`_hand_over`),
and the pump writes all it may send in one command to nats-py's buffer and flushes once,
where nats-py's `publish` builds each message's headers and command line and asks its
flusher once a message. The PubAcks at the head of each read are taken by one pattern of
their one shape (`MSG <inbox>.<n>_<copy> <sid> <size>` and `{"stream":..,"seq":..}`) before
nats-py's parser sees the read (`_answer_first`); anything else goes through the parser, and
an answer that is not a PubAck is read by json. The publisher is a
cdc.ports.ReportingPublisher: a message is its own report (`partition()`, `offset()`), so the
hand-over sends the reader process's events from their tuples (cdc/delivery/handover.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NotFoundError
from nats.protocol.parser import AWAITING_CONTROL_LINE

from cdc.config import NatsJetStreamConfig
from cdc.errors import BrokerUnreachable, DeliveryError
from cdc.events.identity import H_FILE, H_GTID, H_POS, H_REPAIR, H_ROW, H_SOURCE, identity_key_from_headers
from cdc.events.sink_fields import BROKER_HEADER_PREFIXES, H_KEY, H_NULL_VALUE, H_TIMESTAMP, message_properties
from cdc.ports import Delivery, DeliveryCallback, DeliveryFailure, Report
from connectors import sink_native
from connectors.broker_wait import never, wait_for_broker
from connectors.nats.chain import (
    BLOCKED,
    ERR_TOO_MANY_REQUESTS,
    H_EXPECTED_LAST_SEQUENCE,
    RETRIED_ERRORS,
    UNCHAINED,
    Chains,
)
from connectors.nats.cluster import replica_results
from connectors.nats.connection import EventLoopThread, connect, server_down, server_where, unreachable

log = logging.getLogger("cdc.nats")

H_MSG_ID = "Nats-Msg-Id"
# JetStream API error codes (nats-server server/errors.json).
ERR_MESSAGE_TOO_LARGE = 10054  # JSStreamMessageExceedsMaximumErr
# Room left for the headers within the server's max_payload, which counts them.
HEADER_ROOM = 8192
# Messages the relay's thread gathers before it hands them to the loop's thread (poll hands over
# what is gathered sooner): a wake-up of the loop a burst (call_soon_threadsafe, a write to its
# self-pipe) was 4% of the relay's profile (bench/catchup.py --profile, docs/benchmarks.md), as
# it was on the RabbitMQ Streams sink (connectors/rabbitmq/stream_sink.py).
HANDOFF_EVERY = 256
# Messages handed over and not yet reported, at most: then `publish` waits.
QUEUE_LIMIT = 100_000
# Bytes sent and not yet answered, at most (with max_in_flight messages). nats-py's own
# buffer is larger, so a publish never waits on a socket that a stopped server does not
# read: the pump stays free to notice the silence and move to a new connection.
MAX_IN_FLIGHT_BYTES = 32 << 20
CONNECTION_BUFFER = 256 << 20
# How often a stream without a leader is asked whether it has one again (`_leader_back`).
LEADER_POLL_S = 0.25


def msg_id(subject: str, headers: dict[str, str]) -> str | None:
    """The de-duplication id of a message: its identity and subject. None for a message
    without the relay's identity, and for `cdc repair`'s (it re-publishes a message the
    stream lost, possibly within the window of the first copy)."""
    key = identity_key_from_headers(headers)
    if key is None or H_REPAIR in headers:
        return None
    return "|".join((subject, *map(str, key)))


def nats_headers(
    topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int | None
) -> dict[str, str]:
    # A header value ends at CR LF on the wire (NATS/1.0 headers, as HTTP's): a line break
    # inside one (a dead letter's error text) is sent as a space.
    out = {k: v.replace("\r", " ").replace("\n", " ") for k, v in message_properties(key, headers, value).items()}
    if ts is not None:
        out[H_TIMESTAMP] = str(ts)
    ident = msg_id(topic, out)
    if ident is not None:
        out[H_MSG_ID] = ident
    return out


# The NATS protocol's message with headers (https://docs.nats.io/reference/reference-protocols/nats-protocol,
# HPUB): `HPUB <subject> <reply-to> <#header bytes> <#total bytes>\r\n<headers><payload>\r\n`,
# the headers `NATS/1.0\r\n` then `Name: value\r\n` each, then `\r\n`. Names and values as
# nats-py writes them (nats/aio/client.py `_send_publish`): stripped, line breaks in a
# value as spaces, a name of its allowed characters only.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_LINE = b"NATS/1.0\r\n"
# What ends a header block: with the chain's expectation (connectors/nats/chain.py) or without.
_END = b"\r\n"
_CHAINED_END = H_EXPECTED_LAST_SEQUENCE.encode() + b": %d\r\n\r\n"
_CHAIN_ROOM = _CHAINED_END % (2**64 - 1)  # the longest
_SUBJECT_BREAKS = re.compile(r"\s")
# A PubAck (nats-server server/stream.go JSPubAckResponse): {"stream":..,"seq":..} with
# "domain" and "duplicate" when they apply; an error or anything else goes through json.
# The server writes a duplicate's as `"seq":N,"duplicate": true}` (stream.go appends that text).
_PUB_ACK_BODY = rb'(\{"stream":"[^"\\]*",(?:"domain":"[^"\\]*",)?"seq":(\d+)(,"duplicate": ?true)?\})\r\n'
_PUB_ACK = re.compile(rb'\{"stream":"[^"\\]*",(?:"domain":"[^"\\]*",)?"seq":(\d+)(,"duplicate": ?true)?\}')


# name -> `Name: ` (checked once); the relay writes a few names only
_names: dict[str, bytes] = {}


def _name_bytes(name: str) -> bytes:
    name = name.strip()
    if not name:
        return b""
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"header name {name!r} is not allowed in a NATS message")
    return name.encode() + b": "


def header_block(headers: dict[str, str], end: bool = True) -> bytes:
    """The headers of an HPUB, byte for byte as nats-py's `publish` writes `headers`
    (tests/unit/test_nats_sink_rules.py compares them); ValueError for a name NATS refuses.
    `end=False`: without the empty line that ends them (the pump adds it, after the chain's
    header when the message has one: `_hpub`)."""
    names = _names
    parts = [_HEADER_LINE]
    for name, value in headers.items():
        prefix = names.get(name)
        if prefix is None:
            prefix = names[name] = _name_bytes(name)
            if len(names) > 4096:  # not the relay's names: keep none
                names.clear()
        if not prefix:
            continue  # nats-py leaves out an empty name
        value = value.strip()
        if "\r" in value or "\n" in value:
            value = value.replace("\r", " ").replace("\n", " ")
        parts += (prefix, value.encode(), b"\r\n")
    if end:
        parts.append(b"\r\n")
    return b"".join(parts)


# The fast way to `header_block(nats_headers(...), end=False)`, the same bytes: the headers of
# a transaction's messages are the same but for their last few (cdc/delivery/handover.py
# `_headers`: the transaction's, then the row, event id, type and table), so the leading ones'
# lines and identity texts are made once a transaction (by their value: a tuple of them is the
# key), and only the last SUFFIX, the key, timestamp and Nats-Msg-Id once a message. Anything
# the fast way does not reproduce exactly (a name twice: the dict keeps its first place and
# last value; a name the tail writes itself; a name NATS refuses) goes the general way.
SUFFIX = 4
_SLOW_NAMES = frozenset((H_KEY, H_NULL_VALUE, H_TIMESTAMP, H_MSG_ID, H_REPAIR))
_IDENTITY_NAMES = frozenset((H_SOURCE, H_ROW, H_GTID, H_FILE, H_POS))
_KEY_PREFIX = H_KEY.encode() + b": "
_NULL_LINE = H_NULL_VALUE.encode() + b": true\r\n"
_TIMESTAMP_PREFIX = H_TIMESTAMP.encode() + b": "
_MSG_ID_PREFIX = H_MSG_ID.encode() + b": "


class _Prefix:
    """The leading headers of a message, made: their lines, their names (of a value), the
    identity's texts among them and, when they hold the transaction's identity without the
    row, the middle of the Nats-Msg-Id (`msg_id`: subject|middle|row)."""

    __slots__ = ("block", "closed", "ident", "middle", "names")

    def __init__(self, block: bytes, names: frozenset[str], ident: dict[str, str]):
        self.block, self.names, self.ident = block, names, ident
        self.closed = names | _SLOW_NAMES  # what a message's own header may not be named (the C way)
        self.middle: str | None = None
        if H_ROW not in ident:
            key = identity_key_from_headers({**ident, H_ROW: "0"})
            if key is not None:
                self.middle = "|".join(map(str, key[:-1]))


_prefixes: dict[tuple, _Prefix | None] = {}  # None: the general way
# The C maker of a message's own lines (connectors/sink_native.c, sink_native.py), or None
_HEADER_TAIL = sink_native.NATS_HEADER_TAIL
# (name, value) of a message's own headers -> its line and text: most repeat (the row of each
# of a transaction's events, the event type, the table; the hand-over passes the same tuples)
_lines: dict[tuple, tuple[bytes, str]] = {}
_LINES_KEPT = 4096


def _text(raw: bytes | str) -> str:
    """A header's value as `nats_headers` has it (message_properties, line breaks as spaces)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if "\r" in text or "\n" in text:
        text = text.replace("\r", " ").replace("\n", " ")
    return text


def _prefix_of(shared: tuple) -> _Prefix | None:
    names: set[str] = set()
    ident: dict[str, str] = {}
    parts = [_HEADER_LINE]
    for name, raw in shared:
        if raw is None:
            continue
        if name in names or name in _SLOW_NAMES or not isinstance(name, str):
            return None
        text = _text(raw)
        prefix = _names.get(name)
        if prefix is None:
            return None  # the general way checks the name (and keeps it in `_names`)
        if prefix:
            parts += (prefix, text.strip().encode(), b"\r\n")
        names.add(name)
        if name in _IDENTITY_NAMES:
            ident[name] = text
    return _Prefix(b"".join(parts), frozenset(names), ident)


_NO_PREFIX = _Prefix(_HEADER_LINE, frozenset(), {})


def message_header_block(
    topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], ts: int | None
) -> bytes:
    """`header_block(nats_headers(topic, key, value, headers, ts), end=False)`, byte for byte
    (tests/unit/test_nats_sink_rules.py compares them), with the leading headers made once."""
    cut = len(headers) - SUFFIX
    if cut > 0:
        shared = tuple(headers[:cut])
        prefix = _prefixes.get(shared, _NO_PREFIX)
        if prefix is _NO_PREFIX:
            if len(_prefixes) >= 1024:  # a transaction's: older ones are not seen again
                _prefixes.clear()
            prefix = _prefixes[shared] = _prefix_of(shared)
            if prefix is None:
                _prefixes.pop(shared, None)  # its names may be known after the general way
        if prefix is None:
            return header_block(nats_headers(topic, key, value, headers, ts), end=False)
        if _HEADER_TAIL is not None and prefix.middle is not None:  # the same bytes in C, or None
            made_in_c = _HEADER_TAIL(
                prefix.block, prefix.closed, prefix.middle, headers, cut, key, value, ts, topic, _names,
                _IDENTITY_NAMES, H_ROW, _KEY_PREFIX, _NULL_LINE, _TIMESTAMP_PREFIX, _MSG_ID_PREFIX,
            )  # fmt: skip
            if made_in_c is not None:
                return made_in_c
    else:
        cut, prefix = 0, _NO_PREFIX
    names, known = prefix.names, _names
    parts = [prefix.block]
    own: list[str] = []
    row: str | None = None
    other = False  # an identity header other than the row among the last ones
    lines = _lines
    for i in range(cut, len(headers)):
        item = headers[i]
        name, raw = item
        if raw is None:
            continue
        if name in names or name in _SLOW_NAMES or name in own:
            return header_block(nats_headers(topic, key, value, headers, ts), end=False)
        made = lines.get(item)
        if made is None:
            line = known.get(name)
            if line is None:
                return header_block(nats_headers(topic, key, value, headers, ts), end=False)
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if "\r" in text or "\n" in text:
                text = text.replace("\r", " ").replace("\n", " ")
            made = (line + text.strip().encode() + b"\r\n" if line else b""), text
            if len(lines) >= _LINES_KEPT:
                lines.clear()
            lines[item] = made
        else:
            text = made[1]
        parts.append(made[0])
        own.append(name)
        if name in _IDENTITY_NAMES:
            if name == H_ROW:
                row = text
            else:
                other = True
    if key is not None:
        parts += (_KEY_PREFIX, _text(key).strip().encode(), b"\r\n")
    if value is None:
        parts.append(_NULL_LINE)
    if ts is not None:
        parts += (_TIMESTAMP_PREFIX, str(ts).strip().encode(), b"\r\n")
    ident: str | None = None
    middle = prefix.middle
    if middle is not None and not other:
        if row is not None:
            try:
                ident = f"{topic}|{middle}|{int(row)}"
            except ValueError:
                pass  # no identity (identity_key_from_headers)
    else:  # the identity is not the transaction's headers and the row: read it as msg_id does
        texts = dict(prefix.ident)
        for name, raw in headers[cut:]:
            if raw is not None and name in _IDENTITY_NAMES:
                texts[name] = _text(raw)
        identity = identity_key_from_headers(texts)
        if identity is not None:
            ident = "|".join((topic, *map(str, identity)))
    if ident is not None:
        parts += (_MSG_ID_PREFIX, _text(ident).strip().encode(), b"\r\n")
    return b"".join(parts)


class _Out:
    """One message handed over and not yet reported: its subject, its HPUB's header block
    without the empty line that ends it, and payload (the reply subject is the connection's,
    given when it is sent: `<inbox>.<n>_<copy>`, the copy counted from 1, so an answer to an
    earlier copy is told from one to the last). It is also the message a report of
    `publish_reported` gets (cdc.ports.ReportingPublisher): `partition()` and `offset()`, as
    confluent-kafka's Message has them."""

    __slots__ = (
        "expected",
        "failure",
        "first_sent",
        "gen",
        "header",
        "last_sent",
        "n",
        "on_delivery",
        "payload",
        "reported",
        "sends",
        "seq",
        "subject",
    )

    def __init__(
        self,
        n: int,
        subject: str,
        payload: bytes,
        header: bytes,
        on_delivery: Callable[..., None],
        gen: int,
        reported: bool = False,
    ):
        self.n, self.subject, self.payload, self.header = n, subject, payload, header
        self.on_delivery, self.gen = on_delivery, gen
        self.reported = reported  # on_delivery is a Report (error, message), else a DeliveryCallback
        self.first_sent = self.last_sent = 0.0
        self.sends = 0
        self.expected = UNCHAINED  # the chain's expected last sequence for the copy sent last
        self.seq = -1  # the stream sequence it was stored at, once answered
        self.failure: DeliveryFailure | None = None

    def partition(self) -> int:
        return 0  # a subject is a topic of one partition (docs/sinks.md)

    def offset(self) -> int | None:
        return self.seq if self.seq >= 0 else None


def _failure(code: str, message: str, too_large: bool = False, topic_missing: bool = False) -> DeliveryFailure:
    return DeliveryFailure(code=code, message=message, too_large=too_large, topic_missing=topic_missing)


class NatsJetStreamPublisher:
    def __init__(self, cfg: NatsJetStreamConfig, name: str = "publisher", should_stop: Callable[[], bool] = never):
        """Waits up to `delivery_timeout_s` for a server that is down or restarting (its
        max_payload is needed before a message is taken; connectors/broker_wait.py)."""
        self._cfg = cfg
        self._name = name
        self._loop = EventLoopThread(name)
        # The caller's side (the relay loop's thread).
        self._pending = 0
        self._gen = 0  # purge() moves on: reports of older messages are not served
        self._next_n = 0
        self._subjects: dict[str, bytes] = {}  # subject -> its bytes in an HPUB (checked once)
        self._batch: list[_Out] = []  # published, not yet handed over (`_hand_over`)
        self._inbox: deque[list[_Out]] = deque()  # handed over in batches, not yet seen by the pump
        self._done: deque[_Out] = deque()  # reported (`_report`), served by poll
        self._ready = threading.Event()
        self._wake_asked = False
        # The loop's side.
        self._nc: Any = None
        self._reply_prefix = ""
        self._unsent: deque[_Out] = deque()
        self._unacked: dict[int, _Out] = {}  # in send order
        self._taken_back: list[_Out] = []  # sent, to be sent again (before anything unsent after them)
        self._chains = Chains()  # replicated streams' chains (connectors/nats/chain.py)
        self._learn_at = 0.0  # when a failed look-up of a subject's stream is tried again
        self._unacked_bytes = 0
        self._window_full = False  # the pump waits for answers to send more: an answer wakes it
        self._last_answer = 0.0  # loop time of the last answer on the current connection
        self._down_since: float | None = None  # loop time since when no connection could be had
        self._closing_old: set[asyncio.Task] = set()  # connections left behind, closing
        self._failed: str | None = None  # why every message waiting fails (`_fail`), and its code
        self._failed_code = "TIMED_OUT"
        self._retry_at = 0.0
        self._leaderless: str | None = None  # a stream that answered 503 while it exists (`_leader_back`)
        self._leader_check_at = 0.0
        self._closing = False
        self.reconnects = 0

        def start() -> int:
            try:
                return int(self._loop.run(self._start(), 30))
            except Exception as exc:
                raise unreachable(cfg, exc) from None

        try:
            # the server's max_payload, which counts the headers too
            self.max_payload: int = wait_for_broker(
                start, server_where(cfg), cfg.delivery_timeout_s, "sink.nats_jetstream.delivery_timeout_s", should_stop
            )
        except BaseException:
            self._loop.stop()
            raise

    # -- the caller's side ---------------------------------------------------------------

    @property
    def max_message_bytes(self) -> int:
        return max(1, self.max_payload - HEADER_ROOM)

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: DeliveryCallback,
        timestamp_ms: int | None = None,
    ) -> None:
        self._put(topic, key, value, headers, on_delivery, timestamp_ms, False)

    def publish_reported(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        report: Report,
        timestamp_ms: int | None = None,
    ) -> None:
        """cdc.ports.ReportingPublisher: `report(error, message)` from poll, `error` None or a
        DeliveryFailure, `message` this publisher's own (`partition()`, `offset()`). The
        hand-over then sends the reader process's events from their tuples, without an event
        object or a Delivery each (cdc/delivery/handover.py, the tuple way), as with Kafka."""
        self._put(topic, key, value, headers, report, timestamp_ms, True)

    def delivery(self, topic: str, error: DeliveryFailure | None, message: _Out | None) -> Delivery:
        """A report of `publish_reported`, as the port's Delivery."""
        if error is None and message is not None:
            return Delivery(topic, 0, message.seq)
        return Delivery(topic, 0, -1, error)

    def _put(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        on_delivery: Callable[..., None],
        timestamp_ms: int | None,
        reported: bool,
    ) -> None:
        while self._pending >= QUEUE_LIMIT:
            self.poll(0.05)  # never drop: wait for reports
        payload = value or b""
        self._pending += 1
        self._next_n += 1
        try:
            block = message_header_block(topic, key, value, headers, timestamp_ms)
            if topic not in self._subjects:
                if not topic or _SUBJECT_BREAKS.search(topic):
                    raise ValueError(f"subject {topic!r} is empty or holds white space")
                self._subjects[topic] = topic.encode()
        except ValueError as exc:  # nats-py raised these at its publish (BadHeaderError, BadSubjectError)
            out = _Out(self._next_n, topic, payload, b"", on_delivery, self._gen, reported)
            self._report(out, _failure("BAD_MESSAGE", str(exc)))
            return
        out = _Out(self._next_n, topic, payload, block, on_delivery, self._gen, reported)
        size = len(payload) + len(block) + len(_CHAIN_ROOM)
        if size > self.max_payload:
            text = f"message of {size} bytes with its headers; the server's max_payload is {self.max_payload}"
            self._report(out, _failure("MAX_PAYLOAD", text, too_large=True))
            return
        batch = self._batch
        batch.append(out)
        if len(batch) >= HANDOFF_EVERY:
            self._hand_over()

    def _hand_over(self) -> None:
        """The relay's batch to the loop: one append and at most one wake-up of the loop a
        batch. The relay calls poll after each transaction (cdc/relay.py), and the hand-over
        every 256 messages of a longer one (cdc/delivery/handover.py), which hands over
        what is left: a message waits at most until then."""
        batch, self._batch = self._batch, []
        self._inbox.append(batch)
        if not self._wake_asked:
            self._wake_asked = True
            self._loop.call_soon(self._wake.set)

    def poll(self, timeout: float) -> None:
        if self._batch:
            self._hand_over()
        if not self._serve() and timeout > 0:
            self._ready.wait(timeout)
            self._serve()

    def _serve(self) -> int:
        self._ready.clear()
        served = 0
        done, gen = self._done, self._gen
        while done:
            out = done.popleft()
            if out.gen != gen:
                continue  # purged
            self._pending -= 1
            served += 1
            if out.reported:
                out.on_delivery(out.failure, out)
            else:
                out.on_delivery(Delivery(out.subject, 0, out.seq if out.failure is None else -1, out.failure))
        return served

    def pending(self) -> int:
        return self._pending

    def flush(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.poll(min(0.1, left))
        return self._pending

    def purge(self) -> None:
        self._gen += 1
        self._pending = 0
        self._batch = []
        self._done.clear()
        self._loop.call_soon(self._drop_all)

    def close(self) -> None:
        self.flush(5.0)
        try:
            self._loop.run(self._stop(), 15)
        except Exception as exc:  # the server is gone: nothing left to save
            log.debug("nats %s: close: %s", self._name, exc)
        self._loop.stop()

    def _report(self, out: _Out, failure: DeliveryFailure | None = None) -> None:
        """Either thread: hand `out`'s report to `poll` (acknowledged at `out.seq` when
        `failure` is None)."""
        out.failure = failure
        self._done.append(out)
        # After the append: `_serve` clears the flag before it takes the reports, so a flag
        # found set means this report is taken; setting a set Event costs a lock.
        if not self._ready.is_set():
            self._ready.set()

    # -- the loop's side ------------------------------------------------------------------

    async def _start(self) -> int:
        self._wake = asyncio.Event()
        await self._connect()
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        return int(self._nc.max_payload)

    async def _connect(self) -> None:
        nc = await connect(
            self._cfg, self._name, timeout=min(5.0, self._cfg.ack_timeout_s), pending_size=CONNECTION_BUFFER
        )
        prefix = nc.new_inbox()
        replies = await nc.subscribe(prefix + ".*", cb=self._on_reply)
        self._answer_first(nc, replies._id, prefix + ".")
        self._nc, self._reply_prefix = nc, prefix + "."
        self._reply_bytes = self._reply_prefix.encode()
        self._last_answer = asyncio.get_running_loop().time()
        self._down_since = None

    async def _stop(self) -> None:
        self._closing = True
        self._wake.set()
        await self._pump_task
        if self._nc is not None and not self._nc.is_closed:
            self._leave(self._nc)
        if self._closing_old:
            await asyncio.wait(self._closing_old, timeout=10)

    def _drop_all(self) -> None:
        self._unsent.clear()
        self._unacked.clear()
        self._taken_back.clear()
        self._chains.reset()
        self._unacked_bytes = 0
        self._inbox.clear()

    def _leave(self, nc: Any) -> None:
        """Close a connection without waiting for it: closing flushes what it buffered,
        which waits as long as a stopped server does not read. What it still delivers is
        an in-order run of messages, like any connection's (the module docstring)."""

        async def close() -> None:
            try:
                await asyncio.wait_for(nc.close(), 30)
            except Exception as exc:
                log.debug("nats %s: close: %s", self._name, exc)

        task = asyncio.get_running_loop().create_task(close())
        self._closing_old.add(task)
        task.add_done_callback(self._closing_old.discard)

    async def _pump(self) -> None:
        """The one sender: new messages in order, and everything unanswered again after
        a reconnect, oldest first."""
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), 0.05)
            except TimeoutError:
                pass
            self._wake.clear()
            self._wake_asked = False
            while self._inbox:
                self._unsent.extend(self._inbox.popleft())
            if self._failed is not None:
                self._fail(self._failed)
                continue
            now = loop.time()
            self._merge_taken_back()
            oldest = next(iter(self._unacked.values()), None)
            head = self._unsent[0] if self._unsent else None
            # The oldest message waiting: sent and unanswered or to be sent again, or, with
            # nothing sent, kept unsent for want of a connection (a server down since then).
            waiting, since = oldest, oldest.first_sent if oldest is not None else None
            if head is not None and head.first_sent and (since is None or head.first_sent < since):
                waiting, since = head, head.first_sent
            if waiting is None and head is not None and self._down_since is not None:
                waiting, since = head, self._down_since
            if waiting is not None and since is not None and now - since >= self._cfg.delivery_timeout_s:
                self._failed = (
                    f"no acknowledgement from NATS {','.join(self._cfg.servers)} for {waiting.subject} within "
                    f"{self._cfg.delivery_timeout_s:g} s (sink.nats_jetstream.delivery_timeout_s)"
                )
                self._fail(self._failed)
                continue
            if self._leaderless is not None and not await self._leader_back(now):
                continue  # nothing new while the stream takes nothing: it would be stored first
            # Silent, not slow: nothing answered for ack_timeout_s while a message waits
            # (a loaded server answers late, and sending it all again would only add load).
            wait = self._cfg.ack_timeout_s
            stale = oldest is not None and now - oldest.last_sent >= wait and now - self._last_answer >= wait
            # A connection is opened again when there is something to send (an idle
            # publisher whose server went away stays quiet).
            lost = self._nc is None or self._nc.is_closed
            broken = stale or (lost and bool(self._unacked or self._unsent))
            if broken and self._down_since is None:
                self._down_since = now
            if broken and (now < self._retry_at or not await self._reconnect(now)):
                continue
            await self._send_new(now)

    async def _reconnect(self, now: float) -> bool:
        old, self._nc = self._nc, None
        if old is not None and old.is_closed:
            log.warning("NATS %s: connection lost; connecting again", self._name)
        elif old is not None:
            log.warning("NATS %s: no answer for %g s; connecting again", self._name, self._cfg.ack_timeout_s)
            self._leave(old)
        try:
            await self._connect()
        except Exception as exc:
            self._retry_at = now + 0.5
            log.debug("nats %s: connect: %s", self._name, exc)
            return False
        self.reconnects += 1
        log.info("NATS %s: connected; sending %d unacknowledged messages again", self._name, len(self._unacked))
        self._take_back_all()
        return True

    def _take_back_all(self) -> None:
        """Everything unanswered is sent again, oldest first, before anything new, each chain
        starting with an opening (connectors/nats/chain.py)."""
        self._taken_back += self._unacked.values()
        self._unacked.clear()
        self._unacked_bytes = 0
        self._chains.reset()
        self._merge_taken_back()

    def _take_back(self, out: _Out) -> None:
        """`out`, refused for its chain's expectation, is sent again in its place in order."""
        if self._unacked.pop(out.n, None) is not None:
            self._unacked_bytes -= len(out.payload)
            self._chains.not_stored(out.subject, out.n)
            self._taken_back.append(out)
            self._wake.set()

    def _merge_taken_back(self) -> None:
        """The messages taken back go before the unsent ones of higher numbers (the unsent
        ones before them were taken back earlier and wait to be sent again)."""
        if not self._taken_back:
            return
        back = self._taken_back
        self._taken_back = []
        top = max(out.n for out in back)
        unsent = self._unsent
        while unsent and unsent[0].n < top:
            back.append(unsent.popleft())
        back.sort(key=lambda out: out.n)
        unsent.extendleft(reversed(back))

    async def _learn(self, subject: str, now: float) -> bool:
        """Find `subject`'s stream and whether it is replicated (once a subject); False when the
        server did not say (asked again 0.5 s later: nothing of the subject is sent meanwhile)."""
        if now < self._learn_at:
            return False
        js = self._nc.jetstream(timeout=min(5.0, self._cfg.ack_timeout_s))
        try:
            try:
                stream = await js.find_stream_name_by_subject(subject)
            except NotFoundError:
                self._chains.learn(subject, None, False)  # the missing-topic path answers it
                return True
            info = await js.stream_info(stream)
        except (NatsError, JetStreamError, TimeoutError, AttributeError) as exc:
            log.debug("nats %s: stream of %s: %s", self._name, subject, exc)
            self._learn_at = now + 0.5
            return False
        replicas = int(getattr(info.config, "num_replicas", None) or 1)
        self._chains.learn(subject, stream, replicas > 1)
        return True

    async def _send_new(self, now: float) -> None:
        unsent, unacked, limit, chains = self._unsent, self._unacked, self._cfg.max_in_flight, self._chains
        if self._nc is None:
            return  # kept unsent: the next connection sends it
        self._merge_taken_back()
        batch: list[_Out] = []
        size = self._unacked_bytes
        blocked = False
        of_subject = chains.of_subject
        while unsent and len(unacked) < limit and size < MAX_IN_FLIGHT_BYTES:
            out = unsent[0]
            chain = of_subject.get(out.subject, unsent)  # `unsent`: not known yet
            if chain is None:
                expected = UNCHAINED  # the common case, asked without a call
            else:
                if chain is unsent:
                    if not await self._learn(out.subject, now):
                        break
                    if self._taken_back:
                        break  # refused while the stream was looked up: it goes first (the next round)
                expected = chains.expect(out.subject, out.n)
                if expected == BLOCKED:
                    blocked = True  # an answer frees it
                    break
            unsent.popleft()
            out.expected = expected
            unacked[out.n] = out
            size += len(out.payload)
            if not out.first_sent:
                out.first_sent = now
            batch.append(out)
        self._unacked_bytes = size
        self._window_full = bool(unsent) and (blocked or len(unacked) >= limit or size >= MAX_IN_FLIGHT_BYTES)
        await self._send(batch, now)  # failed: unanswered, sent again by the next connection

    def _hpub(self, batch: list[_Out], now: float) -> bytes:
        """`batch` as one run of HPUB commands, each replying to `<inbox>.<n>_<copy>`, with the
        chain's expectation when the message has one."""
        subjects, reply = self._subjects, self._reply_bytes
        parts: list[bytes] = []
        for out in batch:
            out.last_sent = now
            out.sends += 1
            header, payload, expected = out.header, out.payload, out.expected
            end = _END if expected < 0 else _CHAINED_END % expected
            hlen = len(header) + len(end)
            parts += (
                b"HPUB %s %s%d_%d %d %d\r\n"
                % (subjects[out.subject], reply, out.n, out.sends, hlen, hlen + len(payload)),
                header,
                end,
                payload,
                b"\r\n",
            )
        return b"".join(parts)

    async def _send(self, batch: list[_Out], now: float) -> bool:
        """Hand `batch` to the connection's buffer in one command and flush it once (what
        nats-py's `publish` does a message: nats/aio/client.py `_send_publish`)."""
        nc = self._nc
        if not batch:
            return True
        try:
            if nc.is_closed or not nc.is_connected:
                raise OSError("the connection is closed")
            await nc._send_command(self._hpub(batch, now))
            await nc._flush_pending()
        except (NatsError, OSError) as exc:
            # What this connection carried may be cut anywhere: the next one sends it all again.
            log.debug("nats %s: publish: %s", self._name, exc)
            self._nc = None
            if not nc.is_closed:
                self._leave(nc)
            return False
        return True

    def _fail(self, why: str) -> None:
        """After a message failed for want of an answer (or was dropped: `_on_reply`), every
        later one fails too: sent after it, it must not be stored before it."""
        self._merge_taken_back()
        for out in sorted([*self._unacked.values(), *self._unsent], key=lambda out: out.n):
            self._report(out, _failure(self._failed_code, why))
        self._unacked.clear()
        self._unacked_bytes = 0
        self._unsent.clear()
        self._chains.reset()

    def _answer_first(self, nc: Any, sid: int, reply_prefix: str) -> None:
        """A PubAck on the replies' subscription `sid` is taken from nats-py's reader as it
        arrives, without the message object, queue and task switch nats-py's subscription
        spends on each; anything else (an error, a status) goes on to `_on_reply` through
        the subscription.

        Two ways in. nats/protocol/parser.py hands every message to the client's
        `_process_msg(sid, subject, reply, payload, headers)`: a PubAck there is taken by
        `_pub_acked`. Before that, each read's run of whole PubAcks at the head of the
        parser's buffer is taken by one pattern a PubAck, command line and body together
        (`_take_pub_acks`): the parser's own way costs a pattern, two copies and a coroutine
        a message, which was the loop thread's largest cost (bench/catchup.py --profile).
        An answer cut by the read waits in the buffer for the next read, as in the parser;
        anything else, and what follows it in the buffer, the parser reads as before, in
        order."""
        general = nc._process_msg

        async def process_msg(msg_sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
            if msg_sid != sid or headers or not self._pub_acked(subject, data, nc is self._nc):
                await general(msg_sid, subject, reply, data, headers)

        nc._process_msg = process_msg
        parser = nc._ps
        parse = parser.parse
        line = b"MSG " + re.escape(reply_prefix.encode()) + rb"(\d+)_(\d+) %d (\d+)\r\n" % sid
        run, reply_line = re.compile(line + _PUB_ACK_BODY), re.compile(line)

        async def parse_acks_first(data: bytes = b"") -> None:
            buf = parser.buf
            buf.extend(data)
            if parser.state == AWAITING_CONTROL_LINE and buf[:4] == b"MSG ":
                taken = self._take_pub_acks(run, buf, nc is self._nc)
                if taken:
                    del buf[:taken]
                cut = reply_line.match(buf)
                if cut is not None and len(buf) < cut.end() + int(cut[3]) + 2:
                    return  # an answer the read cut: the next read completes it, and the run goes on
            await parse()

        parser.parse = parse_acks_first

    def _take_pub_acks(self, run: re.Pattern[bytes], buf: bytearray, current: bool) -> int:
        """The PubAcks at the head of `buf`, resolved as `_pub_acked` would, one after the
        other, up to the first that `run` does not match whole: the bytes they took."""
        pos = 0
        unacked, of_subject, chains = self._unacked, self._chains.of_subject, self._chains
        match = run.match
        while True:
            m = match(buf, pos)
            if m is None:
                break
            n, copy, size, seq, duplicate = m.group(1, 2, 3, 5, 6)
            start, end = m.span(4)
            if int(size) != end - start:
                break  # not a PubAck's command line: the parser reads it
            pos = m.end()
            out = unacked.get(int(n))
            if out is not None:  # else answered already (a copy sent again), or purged
                stored = int(seq)
                if out.expected >= 0 or of_subject.get(out.subject) is not None:
                    chains.stored(out.subject, out.n, stored, duplicate is not None, int(copy) == out.sends)
                self._resolve(out, stored)
        if pos and current:
            self._last_answer = asyncio.get_running_loop().time()
        return pos

    def _pub_acked(self, subject: bytes, data: bytes, current: bool) -> bool:
        """A PubAck to `<inbox>.<n>_<copy>` resolved (or `<n>` answered already): True; else
        False. `current`: on the connection in use (an answer on one left behind says nothing
        of it)."""
        acked = _PUB_ACK.fullmatch(data)
        if acked is None:
            return False
        if current:
            self._last_answer = asyncio.get_running_loop().time()
        n, _, copy = subject[subject.rfind(b".") + 1 :].partition(b"_")
        try:
            out = self._unacked.get(int(n))
            if out is not None:  # else answered already (a copy sent again), or purged
                seq = int(acked[1])
                if out.expected >= 0 or self._chains.of_subject.get(out.subject) is not None:
                    self._chains.stored(out.subject, out.n, seq, acked[2] is not None, int(copy) == out.sends)
                self._resolve(out, seq)
        except ValueError:
            return False
        return True

    def _answered(self, subject: str) -> tuple[_Out, bool] | None:
        """The message `<inbox>.<n>_<copy>` answers, unanswered, and whether the answer is to
        its last copy."""
        n, _, copy = subject[subject.rfind(".") + 1 :].partition("_")
        try:
            out = self._unacked.get(int(n))
            return None if out is None else (out, int(copy) == out.sends)
        except ValueError:
            return None

    async def _on_reply(self, msg: Any) -> None:
        if msg.subject.startswith(self._reply_prefix) and (msg.headers or {}).get("Status") != "503":
            self._last_answer = asyncio.get_running_loop().time()
        answered = self._answered(msg.subject)
        if answered is None:
            return  # answered already (a copy sent again), or purged
        out, last_copy = answered
        if msg.headers is None:
            acked = _PUB_ACK.fullmatch(msg.data)
            if acked is not None:
                seq = int(acked[1])
                self._chains.stored(out.subject, out.n, seq, acked[2] is not None, last_copy)
                self._resolve(out, seq)
                return
        elif msg.headers.get("Status") == "503":
            if last_copy:  # an earlier copy's says nothing of the last one's
                await self._no_stream(out)
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            answer = {"error": {"err_code": 0, "description": f"not a JetStream answer: {msg.data[:100]!r}"}}
        error = answer.get("error")
        if error is None:
            seq = int(answer["seq"])
            self._chains.stored(out.subject, out.n, seq, bool(answer.get("duplicate")), last_copy)
            self._resolve(out, seq)
            return
        if not last_copy:
            return  # a refusal of an earlier copy: the last one is answered for itself
        code = int(error.get("err_code") or 0)
        if self._chains.chained(out.subject) and (code in RETRIED_ERRORS or error.get("code") == 503):
            # Not stored for now (connectors/nats/chain.py): sent again in order, after an
            # opening; the rest of the chain in flight is refused behind it.
            self._take_back(out)
            return
        self._chains.not_stored(out.subject, out.n)
        text = f"JetStream refused the message: {error.get('description')} (error {code})"
        if code == ERR_TOO_MANY_REQUESTS:
            # Dropped, not refused: the stream's buffer was full. Unchained, a later message
            # may already be stored: nothing more is sent, every message waiting fails with
            # it (the relay stops, and its restart sends the rest from its checkpoint: the
            # dropped one then lands after those, docs/sinks.md), and the fix is a window the
            # server's buffer holds.
            text += (
                f"; the server buffers fewer messages a stream than sink.nats_jetstream.max_in_flight "
                f"({self._cfg.max_in_flight}): set max_in_flight below its jetstream.max_buffered_msgs "
                "(10000 by default)"
            )
            self._resolve(out, -1, _failure(f"JS_{code}", text))
            if self._failed is None:
                self._failed, self._failed_code = text, f"JS_{code}"
                self._wake.set()
            return
        self._resolve(out, -1, _failure(f"JS_{code}", text, too_large=code == ERR_MESSAGE_TOO_LARGE))

    async def _no_stream(self, out: _Out) -> None:
        """No stream listens on the subject: a missing topic, once the server confirms that
        no stream has it (a stream starting up answers later: keep it unanswered)."""
        if self._leaderless is not None:
            return  # a stream is known to have no leader now: sent again once it has
        try:
            stream = await self._nc.jetstream(timeout=self._cfg.ack_timeout_s).find_stream_name_by_subject(out.subject)
        except NotFoundError:
            why = f"no JetStream stream takes subject {out.subject!r}"
            if out.n in self._unacked:
                self._chains.not_stored(out.subject, out.n)
                self._chains.forget(out.subject)  # looked up again: a stream may be made for it
            self._resolve(out, -1, _failure("NO_STREAM", why, topic_missing=True))
        except (NatsError, JetStreamError, TimeoutError, AttributeError) as exc:
            log.debug("nats %s: stream lookup: %s", self._name, exc)
        else:
            self._no_leader(stream)

    def _no_leader(self, stream: str) -> None:
        """503 for a subject whose stream exists: no server takes the subject now, as while
        a cluster elects the stream's new leader (the leader subscribes to the stream's
        subjects when elected: nats-server stream.go `subscribeToStream`). What was sent since
        may be refused too, and what is sent once a leader takes the subject would be stored
        before it: send nothing new, and once the stream answers again, everything
        unanswered, oldest first (`_leader_back`)."""
        if self._leaderless is None:
            log.warning("NATS %s: stream %s takes no message now (no leader): waiting for one", self._name, stream)
            self._leaderless = stream

    async def _leader_back(self, now: float) -> bool:
        """Whether the stream that had no leader has one (it answers stream info: only its
        leader does); then the unanswered messages are sent again in order. A lost
        connection ends the wait too: the new one sends them all again."""
        nc, stream = self._nc, self._leaderless
        if nc is not None and not nc.is_closed and stream is not None:
            if now < self._leader_check_at:
                return False
            self._leader_check_at = now + LEADER_POLL_S
            try:
                info = await nc.jetstream(timeout=1.0).stream_info(stream)
            except (NatsError, JetStreamError, TimeoutError) as exc:
                log.debug("nats %s: stream %s: %s", self._name, stream, exc)
                return False
            if info.cluster is not None and not info.cluster.leader:
                return False
            log.info("NATS %s: stream %s has a leader: sending %d again", self._name, stream, len(self._unacked))
            self._leaderless = None
            self._take_back_all()  # sent again in order by the pump
            return True
        self._leaderless = None
        return True

    def _resolve(self, out: _Out, seq: int, failure: DeliveryFailure | None = None) -> None:
        """`out` answered: stored at `seq`, or refused (`failure`)."""
        if self._unacked.pop(out.n, None) is not None:
            self._unacked_bytes -= len(out.payload)
            out.seq = seq
            self._report(out, failure)
            if self._window_full:  # else the pump has nothing to send that this answer frees
                self._window_full = False
                self._wake.set()


def stream_name(subject: str) -> str:
    """The stream `topics.missing = "create"` makes for a subject: JetStream stream names
    may not hold `.`, `*`, `>`, whitespace or path separators."""
    return re.sub(r"[.*>\s/\\]", "_", subject)


class NatsStreamReader:
    """What the streams hold, by subject (implements cdc.ports.DeliveredLog): a subject is
    a topic of one partition; offsets are stream sequences (shared by the stream's
    subjects, so one subject's offsets have gaps, which recovery and `cdc locate` take as
    they take compaction gaps in Kafka)."""

    def __init__(
        self,
        cfg: NatsJetStreamConfig,
        timeout_s: float = 30.0,
        wait_s: float = 0.0,
        should_stop: Callable[[], bool] = never,
    ):
        """`wait_s`: how long a look at the streams waits for a server that is down or
        restarting (connectors/broker_wait.py; the relay's start: `delivery_timeout_s`)."""
        self._cfg = cfg
        self._timeout = timeout_s
        self._loop = EventLoopThread("reader")
        self._nc: Any = None
        self._streams: dict[str, str] = {}
        self._wait_s = wait_s
        self._should_stop = should_stop

    def _js(self) -> Any:
        if self._nc is None or self._nc.is_closed:
            try:
                self._nc = self._loop.run(connect(self._cfg, "reader"), self._timeout)
            except Exception as exc:
                raise unreachable(self._cfg, exc) from None
        return self._nc.jetstream(timeout=self._timeout)

    def _call(self, what: str, coro_fn: Any) -> Any:
        return wait_for_broker(
            lambda: self._call_once(what, coro_fn),
            server_where(self._cfg),
            self._wait_s,
            "sink.nats_jetstream.delivery_timeout_s",
            self._should_stop,
        )

    def _call_once(self, what: str, coro_fn: Any) -> Any:
        js = self._js()
        try:
            return self._loop.run(coro_fn(js), self._timeout + 5)
        except NotFoundError:
            raise
        except Exception as exc:
            if server_down(exc):
                self._nc = None  # the next call connects again
                raise BrokerUnreachable(f"NATS: cannot {what}: {type(exc).__name__}: {exc}") from None
            raise DeliveryError(f"NATS: cannot {what}: {type(exc).__name__}: {exc}") from None

    def stream_of(self, topic: str) -> str | None:
        if topic not in self._streams:
            try:
                self._streams[topic] = self._call(
                    f"find the stream of {topic}", lambda js: js.find_stream_name_by_subject(topic)
                )
            except NotFoundError:
                return None
        return self._streams[topic]

    def partition_count(self, topic: str) -> int | None:
        return 1 if self.stream_of(topic) is not None else None

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        stream = self.stream_of(topic)
        if stream is None:
            raise DeliveryError(f"NATS: no stream takes subject {topic!r}")
        state = self._call(f"read stream {stream}", lambda js: js.stream_info(stream)).state
        return int(state.first_seq), int(state.last_seq) + 1

    def records(self, topic: str, partition: int, start: int, end: int) -> Iterator[tuple[int, dict[str, str]]]:
        for seq, headers, _data in self.messages(topic, start, end):
            yield seq, headers

    def messages(self, topic: str, start: int, end: int) -> Iterator[tuple[int, dict[str, str], bytes]]:
        """(sequence, headers without JetStream's own, payload) of the subject's messages
        in [start, end), through an ephemeral pull consumer without acknowledgements
        (reading changes nothing on the server)."""
        stream = self.stream_of(topic)
        if stream is None or end <= start:
            return
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, start),
            ack_policy=AckPolicy.NONE,
            filter_subject=topic,
            inactive_threshold=60.0,
        )
        sub = self._call(
            f"read {topic} in stream {stream}", lambda js: js.pull_subscribe(topic, stream=stream, config=config)
        )
        try:
            info = self._loop.run(sub.consumer_info(), self._timeout)
            left = int(info.num_pending)  # the subject's messages at or after `start`, now
            stalled_since = time.monotonic()
            while left > 0:
                try:
                    batch = self._loop.run(sub.fetch(min(left, 1000), timeout=1.0), self._timeout + 5)
                except TimeoutError:
                    if time.monotonic() - stalled_since > self._timeout:
                        raise DeliveryError(
                            f"NATS: reading {topic} in stream {stream} from {start} made no progress "
                            f"for {self._timeout:g} s"
                        ) from None
                    continue
                stalled_since = time.monotonic()
                for msg in batch:
                    seq = int(msg.metadata.sequence.stream)
                    left = int(msg.metadata.num_pending)
                    if seq >= end:
                        return
                    headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith(BROKER_HEADER_PREFIXES)}
                    yield seq, headers, msg.data
        finally:
            try:
                self._loop.run(sub.unsubscribe(), 10)
            except Exception as exc:  # the consumer goes away by itself (inactive_threshold)
                log.debug("nats reader: unsubscribe: %s", exc)

    def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            try:
                self._loop.run(self._nc.close(), 10)
            except Exception as exc:
                log.debug("nats reader: close: %s", exc)
        self._loop.stop()


class NatsStreamAdmin:
    """Creates a stream for a subject that has none (`topics.missing = "create"`)."""

    def __init__(self, cfg: NatsJetStreamConfig, reader: NatsStreamReader):
        self._cfg = cfg
        self._reader = reader

    def create_topic(self, topic: str) -> str | None:
        if self._reader.stream_of(topic) is not None:
            return None
        config = StreamConfig(
            name=stream_name(topic),
            subjects=[topic],
            storage=StorageType.FILE,
            duplicate_window=self._cfg.duplicate_window_s,
        )
        try:
            self._reader._call(f"create a stream for {topic}", lambda js: js.add_stream(config))
        except (DeliveryError, NotFoundError) as exc:
            if self._reader.stream_of(topic) is not None:
                return None  # someone else made one meanwhile
            return f"{exc}; create a stream for subject {topic!r} (nats stream add) or check the account's limits"
        return None


def check_nats(cfg: NatsJetStreamConfig, dead_letter_subject: str) -> list[Any]:
    """`cdc check` for the NATS sink: results named `nats` (a server answers with
    JetStream) and `dead_letter_topic` (a stream takes the dead letters' subject)."""
    from connectors.mysql.preflight import CheckResult

    reader = NatsStreamReader(cfg, timeout_s=10.0)
    try:
        try:
            stream = reader.stream_of(dead_letter_subject)
        except DeliveryError as exc:
            return [CheckResult("nats", False, str(exc))]
        results = [CheckResult("nats", True, f"NATS JetStream answers at {','.join(cfg.servers)}")]
        if stream is None:
            results.append(
                CheckResult(
                    "dead_letter_topic",
                    False,
                    f"no JetStream stream takes the dead letters' subject {dead_letter_subject!r} "
                    "(kafka.dead_letter_topic): add one, e.g. nats stream add --subjects "
                    f"'{dead_letter_subject}'",
                )
            )
        else:
            results.append(CheckResult("dead_letter_topic", True, f"{dead_letter_subject!r} is in stream {stream!r}"))
        return results + replica_results(reader)
    finally:
        reader.close()
