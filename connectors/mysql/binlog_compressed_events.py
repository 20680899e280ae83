"""Compressed events (the decompression itself: connectors/mysql/binlog_compression.py,
imported at the first one). A MariaDB *_COMPRESSED_* event is decompressed into the plain
event it stands for (same header, so the same position) and decoded as that one; the
events inside a MySQL Transaction_payload are decoded in order as if each sat where the
payload sits (see connectors/mysql/binlog_decoder.py and docs/binlog-decoding.md, "Compressed binlogs")."""

from __future__ import annotations

import struct
import zlib

from cdc.source_events import TxCommit, TxRollback, XaCommit, XaPrepare, XaRollback
from connectors.mysql.binlog_decode_errors import UndecodableEvent
from connectors.mysql.binlog_event_types import (
    EVENT_NAMES,
    FORMAT_DESCRIPTION_EVENT,
    MARIADB_QUERY_COMPRESSED,
    ROTATE_EVENT,
    TRANSACTION_PAYLOAD_EVENT,
    U32,
)
from connectors.mysql.binlog_query_events import QueryEvents
from connectors.mysql.binlog_rows import RowsEvents

# source events that end a transaction: inside a Transaction_payload only the last may be one
_TX_ENDS = (TxCommit, TxRollback, XaPrepare, XaCommit, XaRollback)


class CompressedEvents(QueryEvents, RowsEvents):
    """MariaDB's Query_compressed and *_rows_compressed events, MySQL's Transaction_payload:
    each decoded as the plain events it holds (`_query`, `_inserts`, the dispatch table)."""

    def _undecodable(self, ev: bytes, why: str) -> UndecodableEvent:
        t = ev[4]
        size, log_pos = U32(ev, 9)[0], U32(ev, 13)[0]
        return UndecodableEvent(
            f"cannot decode the {EVENT_NAMES.get(t, 'binlog')} event (type {t}) at {self.file}:{log_pos - size} "
            f"(ending at {log_pos}): {why}; nothing from it on was published and the checkpoint stays before it: "
            "restore this binlog file from an intact copy (a backup, or a replica's), then restart the relay"
        )

    def _post_header(self, t: int, default: int) -> int:
        ph = self.post_header
        return ph[t - 1] if len(ph) >= t and ph[t - 1] else default

    def _query_compressed(self, ev: bytes, out: list) -> None:
        from connectors.mysql import binlog_compression as _compression

        ph = self._post_header(MARIADB_QUERY_COMPRESSED, self._ph_query)
        try:
            plain = _compression.mariadb_query(ev, ph, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        self._query(plain, out, ph)

    def _rows_compressed(self, ev: bytes, out: list) -> None:
        tbl = self._tables.get(ev[19:25])
        # not watched (or a table id whose Table_map lies before where the stream started,
        # which only happens inside a transaction the relay never starts in): skipped
        # without decompressing
        if tbl is None or tbl.columns is None:
            return
        t = ev[4]
        ph = self._ph_rows_v1 if t < 169 else self._ph_rows_v2
        if self._ph_compressed_rows.get(t, ph) != ph:
            raise self._undecodable(ev, "its post-header length differs from the plain rows event's")
        from connectors.mysql import binlog_compression as _compression

        try:
            plain = _compression.mariadb_rows(ev, ph, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        if t == 166:  # Write_rows_compressed_v1: MariaDB's usual one
            self._inserts(plain, out, tbl, 19 + ph)
        else:
            self._handlers[plain[4]](plain, out)

    def _payload(self, ev: bytes, out: list) -> None:
        """MySQL Transaction_payload: its events, each placed where the payload is."""
        from connectors.mysql import binlog_compression as _compression

        try:
            inner = _compression.transaction_payload(ev, self.crc)
        except _compression.CompressedEventError as exc:
            raise self._undecodable(ev, str(exc)) from None
        size, log_pos = U32(ev, 9)[0], U32(ev, 13)[0]
        pad = b""
        if self.crc:
            first = inner[0]
            has_own = len(first) > 23 and zlib.crc32(first[:-4]) == U32(first, len(first) - 4)[0]
            pad = b"" if has_own else b"\0" * self.crc
        last = len(inner) - 1
        get = self._get_handler
        for i, raw in enumerate(inner):
            t = raw[4]
            if t in (TRANSACTION_PAYLOAD_EVENT, FORMAT_DESCRIPTION_EVENT, ROTATE_EVENT):
                raise self._undecodable(ev, f"inner event {i} has type {t}, which a payload never holds")
            handler = get(t)
            if handler is None:
                continue
            before = len(out)
            try:
                handler(_compression.positioned(raw, size, log_pos, pad), out)
            except (IndexError, struct.error, UnicodeDecodeError) as exc:
                raise self._undecodable(ev, f"inner event {i} (type {t}) is malformed ({exc})") from None
            if i < last and len(out) > before and isinstance(out[-1], _TX_ENDS):
                raise self._undecodable(
                    ev,
                    f"inner event {i} of {last + 1} ends a transaction and more events follow it; MySQL writes "
                    "one transaction per payload, and a checkpoint cannot name a place inside one",
                )
