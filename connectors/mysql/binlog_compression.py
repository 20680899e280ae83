"""Compressed binlog events -> the plain events they stand for (the relay's decoder side).

MariaDB, `log_bin_compress=ON` (zlib): a query or rows event whose statement / row data
is longer than `log_bin_compress_min_len` is written as its compressed twin. Only the
variable part is compressed, behind a one-byte header `0x80 | algorithm << 4 | n` (the
algorithm is 0 = zlib; n = 1..4 bytes of the uncompressed size follow, big-endian), then
a zlib stream:

    165 Query_compressed             post-header, status vars, schema, NUL | the statement
    166/167/168 Write/Update/Delete_rows_compressed_v1    post-header, column count,
    169/170/171 Write/Update/Delete_rows_compressed       bitmap(s) | the row images

`mariadb_query` / `mariadb_rows` return the plain event (type 2, 23..25 or 30..32) with
the same header (so the same position and size), the decompressed part and the CRC's
place kept; the decoder then decodes it like any other.

MySQL 8.0.20+, `binlog_transaction_compression=ON`: a transaction's events (BEGIN .. XID;
its GTID event stays outside) as one Transaction_payload event (type 40). Its body: header
fields, each (type, length, value) as length-encoded integers - 1 payload size, 2
compression type (0 = zstd, 255 = none), 3 uncompressed size - ended by a field of type
0, then the payload: the events one after the other, without checksums.
`transaction_payload` returns them.

Anything that does not add up (an unknown algorithm, a zlib or zstd error, sizes that
disagree, an inner event cut short) raises `CompressedEventError`: the decoder names the
event and its position; the relay stops instead of skipping rows.

Decompression here uses `zlib.decompressobj` and zstandard's streaming decompressor; the
verifier (`spark_jobs/mysql/binlog_compressed.py`) decompresses with other calls on purpose.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "QUERY_COMPRESSED",
    "ROWS_COMPRESSED",
    "TRANSACTION_PAYLOAD",
    "CompressedEventError",
    "mariadb_query",
    "mariadb_rows",
    "positioned",
    "transaction_payload",
]

QUERY_COMPRESSED = 165
# compressed type -> (plain type, V2 layout, update: two bitmaps)
ROWS_COMPRESSED = {
    166: (23, False, False),
    167: (24, False, True),
    168: (25, False, False),
    169: (30, True, False),
    170: (31, True, True),
    171: (32, True, False),
}
TRANSACTION_PAYLOAD = 40
ZSTD, NO_COMPRESSION = 0, 255
_FIELD_END, _FIELD_SIZE, _FIELD_COMPRESSION, _FIELD_UNCOMPRESSED = 0, 1, 2, 3
_U32 = struct.Struct("<I").unpack_from
_SIZE_AND_POS = struct.Struct("<II").pack


class CompressedEventError(ValueError):
    """A compressed event that cannot be decompressed exactly; the text says why."""


def _lenenc(buf: bytes, p: int, what: str) -> tuple[int, int]:
    if p >= len(buf):
        raise CompressedEventError(f"{what} is cut short")
    c = buf[p]
    if c < 251:
        return c, p + 1
    width = {252: 2, 253: 3, 254: 8}.get(c)
    if width is None or p + 1 + width > len(buf):
        raise CompressedEventError(f"{what} is not a length-encoded integer")
    return int.from_bytes(buf[p + 1 : p + 1 + width], "little"), p + 1 + width


def _inflate(buf: bytes, p: int, stop: int) -> bytes:
    """MariaDB's compressed block `buf[p:stop]`: header byte, big-endian size, zlib stream."""
    if p >= stop:
        raise CompressedEventError("the compressed part is empty")
    head = buf[p]
    if not head & 0x80:
        raise CompressedEventError(f"the compressed part has no compression header (first byte 0x{head:02x})")
    if head & 0x70:
        raise CompressedEventError(f"unknown compression algorithm {(head >> 4) & 0x07} (this reader knows 0 = zlib)")
    n = head & 0x07
    if not 1 <= n <= 4 or stop < p + 1 + n:
        raise CompressedEventError(f"bad size field ({n} bytes) in the compression header")
    size = int.from_bytes(buf[p + 1 : p + 1 + n], "big")
    d = zlib.decompressobj()
    try:
        data = d.decompress(buf[p + 1 + n : stop], size) if size else d.decompress(buf[p + 1 + n : stop])
    except zlib.error as exc:
        raise CompressedEventError(f"its zlib data is corrupt ({exc})") from None
    if not d.eof or len(data) != size or d.unconsumed_tail or d.unused_data:
        raise CompressedEventError(f"its zlib data does not decompress to the {size} bytes its header announces")
    return data


def _check_length(ev: bytes, post_header: int, crc: int) -> None:
    if len(ev) < 19 + post_header + crc + 1:
        raise CompressedEventError(f"the event ({len(ev)} bytes) is shorter than its header and post-header")


def mariadb_query(ev: bytes, post_header: int, crc: int) -> bytes:
    """Query_compressed -> the Query event it stands for."""
    _check_length(ev, post_header, crc)
    status_len = ev[19 + 11] | (ev[19 + 12] << 8)
    db_len = ev[19 + 8]
    start = 19 + post_header + status_len + db_len + 1
    stop = len(ev) - crc
    if start > stop:
        raise CompressedEventError("its post-header and schema run past the end of the event")
    return b"".join((ev[:4], b"\x02", ev[5:start], _inflate(ev, start, stop), ev[stop:]))


def mariadb_rows(ev: bytes, post_header: int, crc: int) -> bytes:
    """Write/Update/Delete_rows_compressed[_v1] -> the rows event it stands for (the hot
    path of a compressed MariaDB binlog: kept to a few operations)."""
    plain, v2, update = ROWS_COMPRESSED[ev[4]]
    p = 19 + post_header
    stop = len(ev) - crc
    if v2:
        if stop < p:
            raise CompressedEventError("the event is shorter than its post-header")
        p += (ev[27] | (ev[28] << 8)) - 2  # the extra row info; its length counts its own 2 bytes
    if p >= stop:
        raise CompressedEventError("the event ends before its column count")
    ncols = ev[p]
    if ncols < 251:
        p += 1
    else:
        ncols, p = _lenenc(ev, p, "the column count")
    p += ((ncols + 7) >> 3) << update  # one columns bitmap, two for an update
    if p > stop:
        raise CompressedEventError("its column bitmaps run past the end of the event")
    return b"".join((ev[:4], _TYPE_BYTE[plain], ev[5:p], _inflate(ev, p, stop), ev[stop:]))


_TYPE_BYTE = {t: bytes((t,)) for t in (23, 24, 25, 30, 31, 32)}


def _zstd(payload: bytes) -> bytes:
    import zstandard

    obj = zstandard.ZstdDecompressor().decompressobj()
    try:
        data = obj.decompress(payload)
    except zstandard.ZstdError as exc:
        raise CompressedEventError(f"its zstd data is corrupt ({exc})") from None
    if not obj.eof or obj.unused_data:
        raise CompressedEventError("its zstd data is cut short or followed by stray bytes")
    return data


def transaction_payload(ev: bytes, crc: int) -> list[bytes]:
    """The events inside a MySQL Transaction_payload event, in order (without checksums,
    as MySQL writes them)."""
    body = ev[19 : len(ev) - crc]
    p = 0
    size = compression = uncompressed = None
    while True:
        field, p = _lenenc(body, p, "the payload header")
        if field == _FIELD_END:
            break
        length, p = _lenenc(body, p, "a payload header field's length")
        if p + length > len(body):
            raise CompressedEventError(f"payload header field {field} runs past the end of the event")
        value, q = _lenenc(body[p : p + length], 0, f"payload header field {field}")
        if q != length:
            raise CompressedEventError(f"payload header field {field} is {length} bytes but holds {q}")
        p += length
        if field == _FIELD_SIZE:
            size = value
        elif field == _FIELD_COMPRESSION:
            compression = value
        elif field == _FIELD_UNCOMPRESSED:
            uncompressed = value
    payload = body[p:]
    if size is not None and size != len(payload):
        raise CompressedEventError(f"its payload is {len(payload)} bytes but its header says {size}")
    if compression == ZSTD:
        data = _zstd(payload)
    elif compression == NO_COMPRESSION or (compression is None and uncompressed is None):
        data = payload
    else:
        raise CompressedEventError(
            f"unknown compression type {compression} (this reader knows 0 = zstd and 255 = none)"
        )
    if uncompressed is not None and uncompressed != len(data):
        raise CompressedEventError(f"its payload decompresses to {len(data)} bytes but its header says {uncompressed}")
    events: list[bytes] = []
    q = 0
    end = len(data)
    while q < end:
        if end - q < 19:
            raise CompressedEventError(f"inner event {len(events)} is cut short ({end - q} bytes left)")
        n = _U32(data, q + 9)[0]
        if n < 19 or q + n > end:
            raise CompressedEventError(f"inner event {len(events)} claims {n} bytes; {end - q} are left")
        events.append(data[q : q + n])
        q += n
    if not events:
        raise CompressedEventError("its payload holds no event")
    return events


def positioned(inner: bytes, size: int, log_pos: int, crc_pad: bytes) -> bytes:
    """An inner event given the payload event's place: its header's size and end position
    become the payload's (so it starts where the payload starts and ends where it ends),
    and the checksum place the decoder strips is added."""
    return b"".join((inner[:9], _SIZE_AND_POS(size, log_pos), inner[17:], crc_pad))
