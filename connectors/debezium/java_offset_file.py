"""Kafka Connect's `FileOffsetBackingStore` file, read (and written) without a JVM.

The store (`org.apache.kafka.connect.storage.FileOffsetBackingStore.save`) writes its
whole map with `ObjectOutputStream.writeObject(HashMap<byte[], byte[]>)`: keys and values
are the converter's bytes (JSON text: the key `["<connector>",{"server":"<prefix>"}]`, the
value the source offset). Java's serialization format (the Java Object Serialization
Specification, chapter 6, "Object Serialization Stream Protocol") for that one shape is
small: the stream header, a `java.util.HashMap` object (its class descriptor with the
fields `loadFactor` and `threshold`, their values, then the block its `writeObject`
writes: capacity and size), then `size` pairs of objects, each a `byte[]` (`TC_ARRAY`
with the class descriptor `[B`, a back-reference to it after the first) or null.

The reader accepts exactly that (any field list and class descriptor flags, back-
references, null keys or values) and refuses anything else with `OffsetFileError`: it
never guesses at a file it does not understand. `save` writes the file in place
(`Files.newOutputStream` truncates it first), so a Debezium killed while saving leaves it
empty or cut short: `OffsetFileCutShort` says so and what the operator can do instead. The writer produces what the JVM
writes, so tests can seed a store that Debezium then reads (it does).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from cdc.errors import ConfigError

STREAM_MAGIC = 0xACED
STREAM_VERSION = 5
TC_NULL, TC_REFERENCE, TC_CLASSDESC, TC_OBJECT = 0x70, 0x71, 0x72, 0x73
TC_ARRAY, TC_BLOCKDATA, TC_ENDBLOCKDATA, TC_BLOCKDATALONG = 0x75, 0x77, 0x78, 0x7A
BASE_HANDLE = 0x7E0000
HASHMAP_UID = 0x0507DAC1C31660D1  # java.util.HashMap's serialVersionUID
BYTE_ARRAY_UID = 0xACF317F8060854E0  # byte[]'s serialVersionUID
_PRIMITIVE_SIZES = {"B": 1, "C": 2, "D": 8, "F": 4, "I": 4, "J": 8, "S": 2, "Z": 1}


class OffsetFileError(ConfigError):
    """The file is not a Kafka Connect FileOffsetBackingStore file this reader knows."""


class OffsetFileCutShort(OffsetFileError):
    """The file is empty, or a valid beginning of the stream that ends early: a save that
    did not finish."""

    def __init__(self, where: str, size: int):
        state = "is empty" if size == 0 else f"is truncated after {size} bytes"
        super().__init__(
            f"{where} {state}: Debezium was stopped while saving it (its FileOffsetBackingStore rewrites "
            "offset.storage.file.filename in place), so no position can be taken from it; adopt from the "
            "Kafka Connect offsets topic with --debezium-offsets-topic if the connector also kept one there, "
            'or start the relay at a position you choose: `cdc run` with source.start = "<file>:<pos>" (or a '
            "GTID set) in its config and no checkpoint"
        )


class _Reader:
    def __init__(self, data: bytes, where: str):
        self.data, self.at, self.where = data, 0, where
        self.handles: list[object] = []

    def fail(self, what: str) -> OffsetFileError:
        return OffsetFileError(
            f"{self.where} is not a Kafka Connect FileOffsetBackingStore file this relay reads ({what} at byte "
            f"{self.at}): point the option at the connector's offset.storage.file.filename, or adopt from the "
            "Kafka Connect offsets topic instead"
        )

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise OffsetFileCutShort(self.where, len(self.data))
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def utf(self) -> str:
        return self.take(self.u16()).decode("utf-8", "replace")

    def new_handle(self, obj: object) -> int:
        self.handles.append(obj)
        return len(self.handles) - 1

    def classdesc(self) -> dict:
        tag = self.u8()
        if tag == TC_NULL:
            return {}
        if tag == TC_REFERENCE:
            index = self.i32() - BASE_HANDLE
            if not 0 <= index < len(self.handles) or not isinstance(self.handles[index], dict):
                raise self.fail("a reference to an unknown class descriptor")
            found: dict = self.handles[index]  # type: ignore[assignment]  # checked to be a dict just above
            return found
        if tag != TC_CLASSDESC:
            raise self.fail(f"a class descriptor was expected, found tag 0x{tag:02x}")
        desc: dict = {"name": self.utf(), "uid": struct.unpack(">Q", self.take(8))[0]}
        self.new_handle(desc)
        desc["flags"] = self.u8()
        fields = []
        for _ in range(self.u16()):
            code, name = chr(self.u8()), self.utf()
            if code not in _PRIMITIVE_SIZES:
                raise self.fail(f"a field {name!r} of object type")
            fields.append((code, name))
        desc["fields"] = fields
        if self.u8() != TC_ENDBLOCKDATA:  # class annotations: none expected
            raise self.fail("class annotations")
        desc["super"] = self.classdesc()
        return desc

    def content(self) -> bytes | object | None:
        tag = self.u8()
        if tag == TC_NULL:
            return None
        if tag == TC_ARRAY:
            desc = self.classdesc()
            if desc.get("name") != "[B":
                raise self.fail(f"an array of {desc.get('name')!r} where byte[] was expected")
            value = self.take(self.i32())
            self.new_handle(value)
            return value
        if tag == TC_REFERENCE:
            index = self.i32() - BASE_HANDLE
            if not 0 <= index < len(self.handles) or not isinstance(self.handles[index], bytes):
                raise self.fail("a reference to something other than a byte[]")
            return self.handles[index]
        raise self.fail(f"an object of tag 0x{tag:02x} where byte[] or null was expected")

    def block(self) -> bytes:
        tag = self.u8()
        if tag == TC_BLOCKDATA:
            return self.take(self.u8())
        if tag == TC_BLOCKDATALONG:
            return self.take(self.i32())
        raise self.fail(f"a data block was expected, found tag 0x{tag:02x}")


def parse_offset_file(data: bytes, where: str = "the offset file") -> dict[bytes | None, bytes | None]:
    """The map a FileOffsetBackingStore file holds (key bytes -> value bytes)."""
    r = _Reader(data, where)
    header = struct.pack(">HH", STREAM_MAGIC, STREAM_VERSION)
    if data[:4] != header[: len(data)]:
        raise r.fail("no Java serialization stream header")
    r.take(4)  # a beginning of the header only: cut short
    if r.u8() != TC_OBJECT:
        raise r.fail("no object")
    desc = r.classdesc()
    if desc.get("name") != "java.util.HashMap":
        raise r.fail(f"an object of class {desc.get('name')!r} where java.util.HashMap was expected")
    r.new_handle("map")
    for code, _name in desc["fields"]:  # loadFactor, threshold: not needed
        r.take(_PRIMITIVE_SIZES[code])
    header = r.block()
    if len(header) != 8:
        raise r.fail("a HashMap header block of the wrong size")
    size = struct.unpack(">ii", header)[1]
    if size < 0:
        raise r.fail("a negative map size")
    out: dict[bytes | None, bytes | None] = {}
    for _ in range(size):
        key, value = r.content(), r.content()
        out[key] = value  # type: ignore[index,assignment]  # content() is bytes or None here (strings)
    if r.u8() != TC_ENDBLOCKDATA:
        raise r.fail("no end of the map's data")
    return out


def read_offset_file(path: str | os.PathLike[str]) -> dict[bytes | None, bytes | None]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise OffsetFileError(
            f"cannot read the Debezium offset file {p}: {exc.strerror}; check the path "
            "(offset.storage.file.filename of the connector) and that this user may read it"
        ) from exc
    return parse_offset_file(data, str(p))


def _utf(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def serialize_offset_map(entries: dict[bytes | None, bytes | None]) -> bytes:
    """What `ObjectOutputStream.writeObject(new HashMap<byte[], byte[]>(entries))` writes."""
    size = len(entries)
    capacity = 16
    while size > capacity * 0.75:
        capacity *= 2
    out = bytearray(struct.pack(">HH", STREAM_MAGIC, STREAM_VERSION))
    out += bytes([TC_OBJECT, TC_CLASSDESC]) + _utf("java.util.HashMap") + struct.pack(">QB", HASHMAP_UID, 0x03)
    out += struct.pack(">H", 2) + b"F" + _utf("loadFactor") + b"I" + _utf("threshold")
    out += bytes([TC_ENDBLOCKDATA, TC_NULL])
    out += struct.pack(">fi", 0.75, int(capacity * 0.75))
    out += bytes([TC_BLOCKDATA, 8]) + struct.pack(">ii", capacity, size)
    byte_array_desc: int | None = None
    next_handle = BASE_HANDLE + 2  # 0: HashMap's descriptor, 1: the map
    for key, value in entries.items():
        for item in (key, value):
            if item is None:
                out.append(TC_NULL)
                continue
            out.append(TC_ARRAY)
            if byte_array_desc is None:
                out += bytes([TC_CLASSDESC]) + _utf("[B") + struct.pack(">QB", BYTE_ARRAY_UID, 0x02)
                out += struct.pack(">H", 0) + bytes([TC_ENDBLOCKDATA, TC_NULL])
                byte_array_desc, next_handle = next_handle, next_handle + 1
            else:
                out += bytes([TC_REFERENCE]) + struct.pack(">i", byte_array_desc)
            out += struct.pack(">i", len(item)) + item
            next_handle += 1
    out.append(TC_ENDBLOCKDATA)
    return bytes(out)


def write_offset_file(path: str | os.PathLike[str], entries: dict[bytes | None, bytes | None]) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(serialize_offset_map(entries))
    os.replace(tmp, p)
