"""MySQL's packed (length-encoded) integer, written by the lab's binlog writer and its server
alike: `net_store_length` (mysys/pack.cc), the protocol's "length-encoded integer"
(page_protocol_basic_dt_integers.html): < 251 one byte; 0xfc + 2, 0xfd + 3, 0xfe + 8 bytes."""

from __future__ import annotations

import struct


def net_field_length(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)
