"""The events that carry a statement or end a transaction: Query (BEGIN, COMMIT,
ROLLBACK, XA, DDL and statement-logged writes), Execute_load_query (LOAD DATA logged as
a statement), XA_prepare and Xid (a commit)."""

from __future__ import annotations

import struct

from cdc.position import unchecked_position as _pos  # the file name is validated once per Rotate
from cdc.source_events import TxCommit, XaPrepare, query_event, xid_text
from connectors.mysql.binlog_decode_errors import BinlogDecodeError
from connectors.mysql.binlog_decoder_state import DecoderState
from connectors.mysql.binlog_event_types import HDR, U16


class QueryEvents(DecoderState):
    """Query, Execute_load_query, XA_prepare and Xid events."""

    def _xid(self, ev: bytes, out: list) -> None:
        ts, _, _, _, log_pos, _ = HDR.unpack_from(ev)
        out.append(TxCommit(_pos(self.file, log_pos), ts))

    def _query(self, ev: bytes, out: list, post_header: int = 0) -> None:
        ts, _, _, size, log_pos, _ = HDR.unpack_from(ev)
        db_len = ev[19 + 8]
        status_len = U16(ev, 19 + 11)[0]
        db_at = 19 + (post_header or self._ph_query) + status_len
        start = db_at + db_len + 1
        sql = ev[start : len(ev) - self.crc].decode("utf-8", "backslashreplace").strip()
        schema = ev[db_at : db_at + db_len].decode("utf-8", "backslashreplace") if db_len else ""
        file = self.file
        out.append(query_event(sql, _pos(file, self._begin_start(size, log_pos)), _pos(file, log_pos), ts, schema))

    def _load_query(self, ev: bytes, out: list) -> None:
        """Execute_load_query (LOAD DATA in statement format): a Query event whose
        post-header also names the loaded file; its text is the LOAD DATA statement."""
        self._query(ev, out, self._ph_load_query)

    def _xa_prepare(self, ev: bytes, out: list) -> None:
        """XA_prepare (type 38): one_phase (1), formatID (4), gtrid length (4), bqual
        length (4), gtrid + bqual bytes."""
        ts, _, _, _, log_pos, _ = HDR.unpack_from(ev)
        one_phase = ev[19] != 0
        format_id, gtrid_len, bqual_len = struct.unpack_from("<iII", ev, 20)
        if 32 + gtrid_len + bqual_len > len(ev) - self.crc or gtrid_len > 64 or bqual_len > 64:
            raise BinlogDecodeError(
                f"malformed XA_prepare event ending at {self.file}:{log_pos} (xid lengths {gtrid_len}/{bqual_len})"
            )
        gtrid = ev[32 : 32 + gtrid_len]
        bqual = ev[32 + gtrid_len : 32 + gtrid_len + bqual_len]
        out.append(XaPrepare(xid_text(format_id, gtrid, bqual), _pos(self.file, log_pos), ts, one_phase))
