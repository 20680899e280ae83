"""Order across a replicated stream's leader change: each message the publisher sends to a
replicated stream names the sequence the stream's last message must have
(`Nats-Expected-Last-Sequence`): the sequence its predecessor on the chain will get. JetStream
refuses it otherwise (error 10071, "wrong last sequence"), so a message is stored only right
after its predecessor, and once one is refused (lost with a dead leader, answered 503 while
the stream had none, or refused itself) every later one in flight is refused too; they are sent
again in order. Why not what else JetStream offers (tried against nats-server 2.15.1 on the lab's
3-node cluster, R3):

- `Nats-Expected-Last-Msg-Id` names the predecessor itself, but a replicated stream checks it when
  the entry is applied: a mismatch is a "critical write error" on every replica, and the stream
  answers nothing more (no leader) until its servers restart;
- `Nats-Expected-Last-Subject-Sequence` is refused (10164) while an earlier message of the same
  subject with that header is still being proposed: one message in flight per subject;
- `Nats-Expected-Last-Sequence` is checked by the leader when it proposes, against the sequence
  the last proposed message will get (nats-server `processClusteredInboundMsg`, `clseq`): 20,000
  chained messages pipelined, none refused; a wrong one refused with 10071 and the stream goes on.
  A message sent again that the stream holds is answered as a duplicate before the expectation
  is checked on a replicated stream (on a single server the expectation comes first: 10071).

So the publisher predicts sequences: after a message it knows the stream stored at `seq`, the
next ones are expected at `seq`, `seq + 1`, ... as they are sent, without waiting. A message
whose predecessor's sequence is not known (the first of a stream, the first after a refusal, a
duplicate or a new connection) is an opening: sent without the header once no message of its
stream is in flight (all earlier ones are stored then), alone; its answer gives the chain its
base again (a duplicate's does not: the stream may hold later messages; the next is an opening
too).

This is exact while the relay is the stream's only writer: every stored message then sits right
after its predecessor, whatever connection carried it. Another writer's message in the stream
(`cdc repair`, another application) moves the sequences: the relay's next message is refused and
sent again after an opening, nothing lost, but a message of the relay sent after the refused one
can find the last sequence it expects taken by the other writer's message and be stored ahead of
it. Chains are therefore kept for replicated streams only (`num_replicas` > 1), where the leader
change they guard against happens; a single server stores a connection's messages in the order
it reads them (docs/sink-delivery.md "Order").

No I/O here: the publisher (connectors/nats/sink.py) asks `expect` before it sends a message and
reports each answer; tests/unit/test_nats_chain.py runs it.
"""

from __future__ import annotations

H_EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
ERR_WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErr (nats-server server/errors.json)
# A replicated stream's answers that say "not stored, for now" (server/errors.json): the chain's
# expectation not met; the same Nats-Msg-Id still being proposed (JSStreamDuplicateMessageConflict,
# a copy sent again while the first is in the RAFT log: it is answered once that is decided);
# the stream's buffer of messages received and not yet stored full (JSStreamTooManyRequests,
# HTTP-like 429: nats-server 2.11+ drops a publish past `jetstream.max_buffered_msgs`, 10,000
# by default); and an HTTP-like `code` 503 (a proposal the stream's RAFT group did not take,
# leader changing). The publisher sends such a message again in order (the old publisher
# failed it: a dead letter for a message the stream might well hold).
ERR_DUPLICATE_IN_PROCESS = 10158
ERR_TOO_MANY_REQUESTS = 10167
RETRIED_ERRORS = frozenset((ERR_WRONG_LAST_SEQUENCE, ERR_DUPLICATE_IN_PROCESS, ERR_TOO_MANY_REQUESTS))

BLOCKED = -2  # not now: wait for an answer
UNCHAINED = -1  # send without the header


class Chain:
    """One replicated stream's chain."""

    __slots__ = ("in_flight", "last", "opening")

    def __init__(self) -> None:
        # The sequence the stream's last message will have once everything sent on the chain
        # is stored; None: not known (the next message is an opening).
        self.last: int | None = None
        self.opening: int | None = None  # the number of the opening in flight
        self.in_flight = 0  # messages of the stream sent and not answered


class Chains:
    """The chains of the publisher's streams, by subject."""

    def __init__(self) -> None:
        self._streams: dict[str, Chain] = {}
        # subject -> its stream's chain; None: sent without one (a stream of one replica, or
        # no stream: the publisher's missing-topic path answers it)
        self.of_subject: dict[str, Chain | None] = {}  # read by the publisher's send loop

    def known(self, subject: str) -> bool:
        return subject in self.of_subject

    def chained(self, subject: str) -> bool:
        return self.of_subject.get(subject) is not None

    def learn(self, subject: str, stream: str | None, replicated: bool) -> None:
        """`subject` belongs to `stream` (None: to none), replicated or not."""
        if stream is None or not replicated:
            self.of_subject[subject] = None
        else:
            self.of_subject[subject] = self._streams.setdefault(stream, Chain())

    def expect(self, subject: str, n: int) -> int:
        """Before message `n` of `subject` is sent: the expected last sequence to send it with,
        UNCHAINED (no header) or BLOCKED (do not send it, nor anything after it, now). The
        subject must be known (`learn`)."""
        chain = self.of_subject[subject]
        if chain is None:
            return UNCHAINED
        last = chain.last
        if last is not None:
            chain.last = last + 1
            chain.in_flight += 1
            return last
        if chain.opening is None and chain.in_flight == 0:
            chain.opening = n
            chain.in_flight = 1
            return UNCHAINED
        return BLOCKED

    def stored(self, subject: str, n: int, seq: int, duplicate: bool, current: bool) -> None:
        """Message `n`, sent (and counted in flight), is in the stream at `seq`. `current`: the
        answer is to the copy sent last (an earlier copy's answer leaves the last one in flight,
        to be answered as a duplicate: the chain's next sequence is not known then)."""
        chain = self.of_subject.get(subject)
        if chain is None:
            return
        chain.in_flight -= 1
        if chain.opening == n:
            chain.opening = None
            chain.last = None if duplicate or not current else seq
        elif duplicate or not current:
            chain.last = None  # it took no sequence: what follows was expected one too high

    def not_stored(self, subject: str, n: int) -> None:
        """Message `n`, sent, was refused or is taken back to be sent again: what was sent after
        it expects a sequence the stream will not reach; the next one sent is an opening."""
        chain = self.of_subject.get(subject)
        if chain is None:
            return
        chain.in_flight -= 1
        if chain.opening == n:
            chain.opening = None
        chain.last = None

    def reset(self) -> None:
        """Nothing in flight any more (a new connection; a stream that had no leader has one):
        every chain starts again with an opening."""
        for chain in self._streams.values():
            chain.last = chain.opening = None
            chain.in_flight = 0

    def forget(self, subject: str) -> None:
        """`subject`'s stream is looked up again before its next message (it had none)."""
        self.of_subject.pop(subject, None)
