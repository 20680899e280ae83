"""Binlog layouts of MySQL servers no server here can run, on byte sequences written out
from MySQL's source (tests/unit/binlog_bytes.py cites the layouts): the Format_description
of MySQL 9 (v1 rows events removed, their post-header lengths 0)."""

from __future__ import annotations

import pytest

from cdc.source_events import RowInsert, TxCommit
from connectors.binlog_decoder import BinlogDecodeError, BinlogDecoder
from tests.unit import binlog_bytes as bb


def _decode(log: bb.Binlog) -> list:
    dec = BinlogDecoder({(bb.SCHEMA, bb.TABLE)}, "binlog.000001")
    out: list = []
    for ev in log.events:
        dec.decode(ev, out)
    return out


def _one_insert(version: str, post_header: bytes) -> bb.Binlog:
    log = bb.Binlog()
    log.add(15, bb.fde_body(version, post_header))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(30, bb.write_rows_body([("e-1", b"{}", 7)]))
    log.add(16, bb.xid_body(3))
    return log


@pytest.mark.parametrize(
    "version, post_header",
    [("9.0.1", bb.MYSQL_90_POST_HEADER), ("9.6.0", bb.MYSQL_90_POST_HEADER), ("8.2.0", bb.MYSQL_82_POST_HEADER)],
    ids=["9.0.1", "9.6.0", "8.2.0"],
)
def test_the_format_description_of_mysql_9_is_read(version, post_header):
    """MySQL 9 gives post-header length 0 for event types 23-25 (refused before: 'unsupported
    binlog layout from server 9.0.1 (table id size)')."""
    out = _decode(_one_insert(version, post_header))
    rows = [e for e in out if isinstance(e, RowInsert)]
    assert [(r.values["id"], r.values["n"]) for r in rows] == [("e-1", 7)]
    assert len([e for e in out if isinstance(e, TxCommit)]) == 1


def test_four_byte_table_ids_are_refused_naming_them():
    """A Table_map post-header of 6 bytes means 4-byte table ids (servers before MySQL 5.1.4)."""
    post_header = bytearray(bb.MYSQL_82_POST_HEADER)
    post_header[19 - 1] = 6
    log = bb.Binlog()
    log.add(15, bb.fde_body("5.1.3-beta", bytes(post_header)))
    with pytest.raises(BinlogDecodeError, match=r"Table_map .*post-header length 6.*4-byte table ids"):
        _decode(log)


def test_a_rows_event_of_a_type_the_format_description_removed_is_refused():
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.0.1", bb.MYSQL_90_POST_HEADER))
    log.add(2, bb.query_body("BEGIN"))
    log.add(19, bb.table_map_body())
    log.add(23, bb.write_rows_body([("e-1", b"{}", 7)], v2=False))
    with pytest.raises(BinlogDecodeError, match=r"event type 23 .*9\.0\.1.*post-header length 0"):
        _decode(log)


def test_an_unexpected_v2_rows_post_header_is_refused_naming_it():
    post_header = bytearray(bb.MYSQL_90_POST_HEADER)
    post_header[30 - 1] = 12
    log = bb.Binlog()
    log.add(15, bb.fde_body("9.9.9", bytes(post_header)))
    with pytest.raises(BinlogDecodeError, match=r"Write_rows \(event type 30\).*post-header length 12.*10"):
        _decode(log)
