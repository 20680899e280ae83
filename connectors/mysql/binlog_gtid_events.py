"""The events that begin a transaction with its GTID: MySQL's Gtid_log_event, its
tagged form (MySQL 8.3+, connectors/mysql/gtid_tagged.py, imported at the first one) and
MariaDB's Gtid_event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc.position import unchecked_position as _pos  # the file name is validated once per Rotate
from cdc.source_events import TxBegin
from connectors.mysql.binlog_decode_errors import BinlogDecodeError
from connectors.mysql.binlog_decoder_state import DecoderState
from connectors.mysql.binlog_event_types import FL_STANDALONE, HDR, U32, U64


@dataclass(frozen=True)
class MysqlGtid:
    """The fields of a MySQL Gtid_log_event (type 33) body, as MySQL 8.0 writes it
    (libbinlogevents `Gtid_event`): flags (1), source uuid (16), gno (8), then, when the
    event is long enough, the logical clock (type code 2 (1), last_committed (8),
    sequence_number (8)), immediate_commit_timestamp (7 bytes, microseconds; its top bit
    set: original_commit_timestamp (7) follows, else it equals the immediate one),
    transaction_length (a packed integer), immediate_server_version (4; top bit set:
    original_server_version (4) follows). MySQL 5.6 / 5.7 events end earlier; absent
    fields are None."""

    flags: int
    gtid: str
    last_committed: int | None = None
    sequence_number: int | None = None
    immediate_commit_us: int | None = None
    original_commit_us: int | None = None
    transaction_length: int | None = None
    immediate_server_version: int | None = None
    original_server_version: int | None = None


def _packed_int(b: bytes, p: int) -> tuple[int, int]:
    """MySQL's net_field_length: < 251 one byte; 252 + 2, 253 + 3, 254 + 8 bytes."""
    first = b[p]
    if first < 251:
        return first, p + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None:
        raise BinlogDecodeError(f"malformed packed integer (first byte {first}) in a GTID event")
    return int.from_bytes(b[p + 1 : p + 1 + width], "little"), p + 1 + width


def parse_mysql_gtid(ev: bytes, crc: int = 4) -> MysqlGtid:
    """A whole Gtid_log_event (header + body [+ CRC of `crc` bytes]) -> its fields."""
    end = len(ev) - crc
    h = ev[20:36].hex()
    gtid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}:{U64(ev, 36)[0]}"
    p = 44
    if p + 17 > end or ev[p] != 2:  # no logical clock (MySQL 5.6)
        return MysqlGtid(ev[19], gtid)
    last_committed, sequence_number = U64(ev, p + 1)[0], U64(ev, p + 9)[0]
    p += 17
    fields: dict[str, Any] = {}
    if p + 7 <= end:
        immediate = int.from_bytes(ev[p : p + 7], "little")
        p += 7
        original = immediate & ~(1 << 55)
        if immediate & (1 << 55):
            immediate = original
            original = int.from_bytes(ev[p : p + 7], "little")
            p += 7
        fields.update(immediate_commit_us=immediate, original_commit_us=original)
        if p < end:
            fields["transaction_length"], p = _packed_int(ev, p)
        if p + 4 <= end:
            server = U32(ev, p)[0]
            p += 4
            original_server = server & 0x7FFFFFFF
            if server & 0x80000000:
                server = original_server
                original_server = U32(ev, p)[0]
                p += 4
            fields.update(immediate_server_version=server, original_server_version=original_server)
    return MysqlGtid(ev[19], gtid, last_committed, sequence_number, **fields)


class GtidEvents(DecoderState):
    """MySQL's Gtid_log_event and Gtid_tagged_log_event, MariaDB's Gtid_event."""

    def _mariadb_gtid(self, ev: bytes, out: list) -> None:
        _, _, server_id, size, log_pos, _ = HDR.unpack_from(ev)
        seq = U64(ev, 19)[0]
        domain = U32(ev, 27)[0]
        flags = ev[31]
        file = self.file
        standalone = bool(flags & FL_STANDALONE)
        out.append(
            TxBegin(
                _pos(file, self._begin_start(size, log_pos)),
                _pos(file, log_pos),
                f"{domain}-{server_id}-{seq}",
                standalone,
                not standalone,
            )
        )

    def _mysql_gtid(self, ev: bytes, out: list) -> None:
        _, _, _, size, log_pos, _ = HDR.unpack_from(ev)
        gtid = parse_mysql_gtid(ev, self.crc).gtid
        file = self.file
        out.append(TxBegin(_pos(file, self._begin_start(size, log_pos)), _pos(file, log_pos), gtid, False))

    def _mysql_tagged_gtid(self, ev: bytes, out: list) -> None:
        """A tagged transaction's GTID event: the same TxBegin as a Gtid_log_event's, its
        GTID `uuid:tag:gno`."""
        from connectors.mysql.gtid_tagged import TaggedGtidError, read_tagged_gtid

        _, _, _, size, log_pos, _ = HDR.unpack_from(ev)
        start = _pos(self.file, self._begin_start(size, log_pos))
        try:
            gtid = read_tagged_gtid(ev[19 : len(ev) - self.crc]).gtid
        except TaggedGtidError as exc:
            raise BinlogDecodeError(f"Gtid_tagged_log_event at {start}: {exc}") from None
        out.append(TxBegin(start, _pos(self.file, log_pos), gtid, False))
