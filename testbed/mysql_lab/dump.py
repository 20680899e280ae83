"""The binlog dump: what MySQL's dump thread (sql/rpl_binlog_sender.cc, Binlog_sender) sends
after COM_BINLOG_DUMP or COM_BINLOG_DUMP_GTID.

Commands (page_protocol_com_binlog_dump.html, page_protocol_com_binlog_dump_gtid.html):
  COM_BINLOG_DUMP (0x12)       position 4, flags 2, server_id 4, file name (rest)
  COM_BINLOG_DUMP_GTID (0x1e)  flags 2, server_id 4, name length 4, name, position 8,
                               data length 4, the encoded GTID set (gtid_sets.py)
  flags: BINLOG_DUMP_NON_BLOCK 0x01 (EOF packet at the end instead of waiting),
         USE_HEARTBEAT_EVENT_V2 0x02, BINLOG_THROUGH_GTID 0x04.

Each event travels as one packet: 0x00 (OK) then the event as stored. For each file the
sender sends, in order (Binlog_sender::run / send_binlog):
  1. a fake Rotate: timestamp 0, log_pos 0, flags LOG_EVENT_ARTIFICIAL_F (0x20), body
     position 8 + the file name; a CRC32 when the replica announced it understands them
     (@source_binlog_checksum / @master_binlog_checksum = 'CRC32');
  2. the file's Format_description, with LOG_EVENT_BINLOG_IN_USE_F (0x01) cleared (the
     stored CRC is computed as if it were clear), and, when the dump does not start at
     position 4 (or a GTID dump skips the file's first transaction), log_pos 0 and its
     `created` timestamp 0, the CRC recomputed (send_format_description_event);
  3. the events from the requested position; at the end of the newest file it waits,
     sending a Heartbeat (type 27: timestamp 0, log_pos = the position reached, body the
     file name) every heartbeat period (@source_heartbeat_period / @master_heartbeat_period,
     nanoseconds) while idle; a file that is no longer the newest is read to its end and
     the next one follows.
A GTID dump skips the transactions in the replica's set and, before the next event sent,
sends a Heartbeat at the end of what it skipped (send_events). The lab finds the start file
and the skipped transactions from the `.gtids` sidecars where MySQL reads the files'
Previous_gtids and GTID events.

Errors end the dump with ER_SOURCE_FATAL_ERROR_READING_BINLOG (1236, SQLSTATE HY000) and the
sender's message; a non-blocking dump ends with an EOF packet. Either way the connection
then closes (dispatch_command ends the session after a dump).
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from dataclasses import dataclass

from testbed.mysql_lab.binlog_dir import HEADER_LEN, BinlogDir, Transaction
from testbed.mysql_lab.gtid_sets import GtidSet, GtidSetError
from testbed.mysql_lab.protocol import ConnectionClosed, MysqlError, PacketChannel, eof_packet
from testbed.mysql_lab.sessions import Session

log = logging.getLogger("testbed.mysql_lab")

BINLOG_DUMP_NON_BLOCK = 0x01
USE_HEARTBEAT_EVENT_V2 = 0x02
BINLOG_THROUGH_GTID = 0x04

ROTATE_EVENT = 4
FORMAT_DESCRIPTION_EVENT = 15
HEARTBEAT_LOG_EVENT = 27
GTID_LOG_EVENT = 33
ANONYMOUS_GTID_LOG_EVENT = 34
GTID_TAGGED_LOG_EVENT = 42
LOG_EVENT_BINLOG_IN_USE_F = 0x01
LOG_EVENT_ARTIFICIAL_F = 0x20
FDE_CREATED_OFFSET = HEADER_LEN + 2 + 50  # binlog version 2, server version 50, created 4

ER_SOURCE_FATAL_ERROR_READING_BINLOG = 1236
REPLICA_HAS_MORE_GTIDS = (
    "Replica has more GTIDs than the source has, using the source's SERVER_UUID. This may indicate that the end "
    "of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk "
    "failure when sync_binlog != 1. The source may or may not have rolled back transactions that were already "
    "replicated to the replica. Suggest to replicate any transactions that source has rolled back from replica "
    "to source, and/or commit empty transactions on source to account for transactions that have been committed "
    "on source but are not included in GTID_EXECUTED."
)
POLL_S = 0.02
READ_CHUNK = 1 << 20  # bytes of a file read (and sent) at a time


def fatal(message: str) -> MysqlError:
    return MysqlError(ER_SOURCE_FATAL_ERROR_READING_BINLOG, "HY000", message)


@dataclass(frozen=True)
class DumpRequest:
    file: str
    pos: int
    flags: int
    server_id: int
    gtids: GtidSet | None = None

    @classmethod
    def parse_file(cls, payload: bytes) -> DumpRequest:
        pos, flags, server_id = struct.unpack_from("<IHI", payload, 1)
        return cls(payload[11:].split(b"\x00")[0].decode("utf-8", "replace"), pos, flags, server_id)

    @classmethod
    def parse_gtid(cls, payload: bytes) -> DumpRequest:
        flags, server_id, name_len = struct.unpack_from("<HII", payload, 1)
        at = 11
        # python-mysql-replication sends a 3-byte name of NULs: a C string, so empty.
        name = payload[at : at + name_len].split(b"\x00")[0].decode("utf-8", "replace")
        at += name_len
        pos, data_len = struct.unpack_from("<QI", payload, at)
        at += 12
        try:
            gtids = GtidSet.decode(payload[at : at + data_len])
        except GtidSetError as exc:
            raise MysqlError(1064, "HY000", f"Malformed GTID set encoding in COM_BINLOG_DUMP_GTID: {exc}") from None
        return cls(name, int(pos), flags, server_id, gtids)


def _with_crc(event: bytes, crc: bool) -> bytes:
    return event + struct.pack("<I", zlib.crc32(event)) if crc else event


def _header(kind: int, server_id: int, size: int, log_pos: int, flags: int) -> bytes:
    return struct.pack("<IBIIIH", 0, kind, server_id, size, log_pos, flags)


def fake_rotate(server_id: int, name: str, pos: int, crc: bool) -> bytes:
    """Binlog_sender::fake_rotate_event."""
    body = struct.pack("<Q", pos) + name.encode()
    size = HEADER_LEN + len(body) + (4 if crc else 0)
    return _with_crc(_header(ROTATE_EVENT, server_id, size, 0, LOG_EVENT_ARTIFICIAL_F) + body, crc)


def heartbeat(server_id: int, name: str, pos: int, crc: bool) -> bytes:
    """Binlog_sender::send_heartbeat_event_v1: log_pos is 32 bits there."""
    body = name.encode()
    size = HEADER_LEN + len(body) + (4 if crc else 0)
    return _with_crc(_header(HEARTBEAT_LOG_EVENT, server_id, size, pos & 0xFFFFFFFF, 0) + body, crc)


def format_description_for_sending(raw: bytes, clear_log_pos: bool) -> bytes:
    """Binlog_sender::send_format_description_event's changes to the stored FDE."""
    crc = raw[-5] == 1  # checksum algorithm byte before the CRC (1 = CRC32)
    ev = bytearray(raw)
    ev[17] &= ~LOG_EVENT_BINLOG_IN_USE_F & 0xFF  # flags low byte
    if clear_log_pos:
        ev[13:17] = b"\x00\x00\x00\x00"
        ev[FDE_CREATED_OFFSET : FDE_CREATED_OFFSET + 4] = b"\x00\x00\x00\x00"
        if crc:
            ev[-4:] = struct.pack("<I", zlib.crc32(bytes(ev[:-4])))
    return bytes(ev)


class BinlogSender:
    """One dump, on the session's thread."""

    def __init__(self, d: BinlogDir, session: Session, channel: PacketChannel, req: DumpRequest, server_id: int):
        self.dir = d
        self.session = session
        self.channel = channel
        self.req = req
        self.server_id = server_id
        announced = session.user_var("source_binlog_checksum", "master_binlog_checksum")
        self.replica_crc = str(announced or "").upper() == "CRC32"
        self.replica_knows_checksums = announced is not None
        period = session.user_var("source_heartbeat_period", "master_heartbeat_period")
        self.heartbeat_s = float(period) / 1e9 if period else 0.0
        self.blocking = not (req.flags & BINLOG_DUMP_NON_BLOCK) and req.server_id != 0
        self.last_sent = time.monotonic()
        self.event_crc = self.replica_crc

    # -- sending ---------------------------------------------------------------------------

    def _send(self, event: bytes) -> None:
        self.channel.write_packet(b"\x00" + event)
        self.last_sent = time.monotonic()

    def _send_run(self, events: list[bytes]) -> None:
        """Events read together, in one write (a catch-up reads megabytes at a time)."""
        self.channel.write_packets([b"\x00" + e for e in events])
        if events:
            self.last_sent = time.monotonic()

    def _heartbeat(self, name: str, pos: int) -> None:
        self._send(heartbeat(self.server_id, name, pos, self.event_crc))

    def _killed(self) -> bool:
        return self.session.killed.is_set()

    # -- where to start ----------------------------------------------------------------------

    def _start(self) -> tuple[str, int, bool]:
        """(file, position, clear the first FDE's log_pos) or a fatal error."""
        names = self.dir.names()
        if not names:
            raise fatal("Binary log is not open")
        req = self.req
        if req.gtids is None or req.file:
            name = req.file or names[0]
            if name not in names:
                raise fatal("Could not find first log file name in binary log index file")
            if req.pos < 4:
                raise fatal("Client requested source to start replication from position < 4.")
            if req.pos > self.dir.whole_end(name):
                raise fatal("Client requested source to start replication from position > file size")
            return name, req.pos, req.pos > 4
        state = self.dir.state()
        if str((state.get("variables") or {}).get("gtid_mode", "OFF")).upper() != "ON":
            raise fatal(
                "The replication sender thread cannot start in AUTO_POSITION mode: this server has "
                "GTID_MODE = OFF instead of ON."
            )
        purged = GtidSet.parse(str(state.get("gtid_purged") or ""))
        if not purged.issubset(req.gtids):
            raise fatal(self._purged_message(purged))
        # The replica has transactions of this server's uuid the server never executed
        # (sql/rpl_binlog_sender.cc check_start_file: ER_REPLICA_HAS_MORE_GTIDS_THAN_SOURCE).
        own = str(state.get("server_uuid") or "").lower()
        executed = GtidSet.parse(str(state.get("gtid_executed") or ""))
        mine = GtidSet({k: v for k, v in req.gtids.sets.items() if k[0] == own})
        if not mine.issubset(executed):
            raise fatal(REPLICA_HAS_MORE_GTIDS)
        for name in reversed(names):
            previous, txs = self.dir.sidecar(name)
            if GtidSet.parse(previous).issubset(req.gtids):
                first = next((t for t in txs if t.gtid != "-"), None)
                return name, 4, first is not None and req.gtids.contains(first.gtid)
        raise fatal(self._purged_message(GtidSet.parse(self.dir.sidecar(names[0])[0])))

    def _purged_message(self, needed: GtidSet) -> str:
        assert self.req.gtids is not None
        sent = str(self.req.gtids).replace("\n", "")
        missing = str(needed.minus(self.req.gtids)).replace("\n", "")
        return (
            "Cannot replicate because the source purged required binary logs. Replicate the missing "
            "transactions from elsewhere, or provision a new replica from backup. Consider increasing the "
            "source's binary log expiration period. The GTID set sent by the replica is "
            f"'{sent}', and the missing transactions are '{missing}'"
        )

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            name, pos, clear = self._start()
            while not self._killed():
                self._send(fake_rotate(self.server_id, name, pos, self.event_crc))
                fde = self._wait_for_fde(name)
                if fde is None:
                    return
                file_crc = fde[-5] == 1
                if file_crc and not self.replica_knows_checksums:
                    raise fatal(
                        "Replica can not handle replication events with the checksum that source is "
                        f"configured to log; the first event '{name}' at {pos}, the last event read from "
                        f"'{name}' at 4, the last byte read from '{name}' at 4."
                    )
                self.event_crc = file_crc
                self._send(format_description_for_sending(fde, clear))
                pos = max(pos, 4 + len(fde))
                nxt = self._send_file(name, pos)
                if nxt is None:
                    return
                name, pos, clear = nxt, 4, False
        except MysqlError as exc:
            self.channel.write_packet(exc.packet())
        except ConnectionClosed:
            return

    def _wait_for_fde(self, name: str) -> bytes | None:
        while not self._killed():
            events = self.dir.events(name, 4, None)
            if events:
                raw = events[0][1]
                if raw[4] != FORMAT_DESCRIPTION_EVENT:
                    raise fatal("Could not find format_description_event in binlog file")
                return raw
            time.sleep(POLL_S)
        return None

    def _transactions(self, name: str) -> dict[int, Transaction]:
        return {t.start: t for t in self.dir.sidecar(name)[1]}

    def _excluded_end(self, name: str, at: int, raw: bytes, txs: dict[int, Transaction]) -> int | None:
        """The end of the transaction starting at `at` when the replica has it."""
        gtids = self.req.gtids
        if gtids is None or raw[4] not in (GTID_LOG_EVENT, ANONYMOUS_GTID_LOG_EVENT, GTID_TAGGED_LOG_EVENT):
            return None
        tx = txs.get(at)
        deadline = time.monotonic() + 2.0
        while tx is None and time.monotonic() < deadline:  # the writer adds its line after the bytes
            time.sleep(POLL_S)
            txs.update(self._transactions(name))
            tx = txs.get(at)
        if tx is None:
            log.warning("no .gtids line for the transaction at %s:%d: sent, not checked against the set", name, at)
            return None
        return tx.end if tx.gtid != "-" and gtids.contains(tx.gtid) else None

    def _send_file(self, name: str, pos: int) -> str | None:
        """Send `name` from `pos`; the next file's name once this one is complete, None when
        the dump ended (EOF of a non-blocking dump, a kill)."""
        txs = self._transactions(name) if self.req.gtids is not None else {}
        skip_to = 0
        pending_heartbeat = 0
        while not self._killed():
            end = self.dir.whole_end(name)
            if pos < end:
                run: list[bytes] = []
                events = self.dir.events(name, pos, end, limit=READ_CHUNK)
                if not events or struct.unpack_from("<I", events[0][1], 13)[0] not in (0, pos + len(events[0][1])):
                    # Not an event's start (a position inside an event): MySQL reads garbage
                    # there and stops (Binlog_sender::read_event, LOG_READ_BOGUS).
                    raise fatal(
                        f"bogus data in log event; the first event '{self.req.file or name}' at {self.req.pos}, "
                        f"the last event read from '{name}' at {pos}, the last byte read from '{name}' at {pos}."
                    )
                for at, raw in events:
                    pos = at + len(raw)
                    if at < skip_to:
                        continue
                    excluded = self._excluded_end(name, at, raw, txs)
                    if excluded is not None:
                        self._send_run(run)
                        run = []
                        skip_to = excluded
                        if self.heartbeat_s and time.monotonic() - self.last_sent >= self.heartbeat_s:
                            self._heartbeat(name, excluded)
                            pending_heartbeat = 0
                        else:
                            pending_heartbeat = excluded
                        continue
                    if pending_heartbeat:
                        self._send_run(run)
                        run = []
                        self._heartbeat(name, pending_heartbeat)
                        pending_heartbeat = 0
                    run.append(raw)
                self._send_run(run)
                continue
            if pending_heartbeat:
                self._heartbeat(name, pos)
                pending_heartbeat = 0
            names = self.dir.names()
            if name in names and names.index(name) < len(names) - 1:
                if self.dir.whole_end(name) > pos:
                    continue  # the rest of a file rotated meanwhile
                return names[names.index(name) + 1]
            if name not in names:
                raise fatal("could not find next log")
            if not self.blocking:
                self.channel.write_packet(eof_packet())
                return None
            time.sleep(POLL_S)
            if self.heartbeat_s and time.monotonic() - self.last_sent >= self.heartbeat_s:
                self._heartbeat(name, pos)
        return None
