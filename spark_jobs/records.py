"""The records of any broker the verifier reads (Kafka topics, RabbitMQ streams, JetStream
streams) in the verifier's columns: the schema, the identity columns decoded from the
headers, the value decoded from the Confluent wire format + Avro `outbox_event.avsc` or a
payload format, and the Arrow batches the data sources hand to Spark. The columns are
described in `spark_jobs/kafka/source.py`'s docstring (Kafka is the reference shape; the
other brokers' records are read into the same shape by `spark_jobs/log_record.py`).
A plan's ranges become Spark partitions by `chunks`."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from cdc.events import identity as hdr
from cdc.events.formats import H_FORMAT, PAYLOAD_FORMATS
from spark_jobs.common import file_seq_or_none, identity_key

BASE_FIELDS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp_ms", "bigint"),
    ("timestamp_type", "int"),
    ("key", "binary"),
    ("key_text", "string"),
)
RAW_FIELDS: tuple[tuple[str, str], ...] = (
    ("headers", "map<string,string>"),
    ("value", "binary"),
)
DECODED_FIELDS: tuple[tuple[str, str], ...] = (
    ("ikey", "string"),
    ("source", "string"),
    ("h_file", "string"),
    ("h_file_seq", "bigint"),
    ("h_pos", "bigint"),
    ("h_row", "int"),
    ("h_gtid", "string"),
    ("h_commit_ts", "bigint"),
    ("h_event_id", "string"),
    ("h_event_type", "string"),
    ("h_table", "string"),
    ("repair", "boolean"),
    ("dlq_cause", "string"),
    ("dlq_error", "string"),
    ("dlq_topic", "string"),
    ("schema_id", "int"),
    ("v_id", "string"),
    ("v_aggregate_type", "string"),
    ("v_aggregate_id", "string"),
    ("v_type", "string"),
    ("v_payload", "binary"),
    ("v_payload_is_text", "boolean"),
    ("v_timestamp_us", "bigint"),
    ("value_error", "string"),
    ("h_xa_prepare", "string"),
    ("h_xa_file_seq", "bigint"),
    ("h_xa_pos", "bigint"),
    ("v_format", "string"),
)
BATCH_ROWS = 8192
DEFAULT_CHUNK = 100_000


def fields_for(include_raw: bool, decode: bool) -> tuple[tuple[str, str], ...]:
    return BASE_FIELDS + (RAW_FIELDS if include_raw else ()) + (DECODED_FIELDS if decode else ())


def schema_for(include_raw: bool, decode: bool) -> str:
    return ", ".join(f"`{n}` {k}" for n, k in fields_for(include_raw, decode))


# ------------------------------------------------------------------------ consumer


def chunks(plan: Mapping[str, Any], chunk: int = DEFAULT_CHUNK) -> list[list[dict[str, Any]]]:
    """Spark partitions: lists of `{topic, partition, low, high}` offset ranges of at most
    `chunk` offsets in all - a big Kafka partition is split, small ones share a task
    (and one consumer)."""
    ranges = []
    for p in plan["partitions"]:
        start = p["low"]
        while start < p["high"]:
            end = min(p["high"], start + chunk)
            ranges.append({**p, "low": start, "high": end})  # and what else a source's plan keeps per partition
            start = end
    tasks: list[list[dict[str, Any]]] = []
    size = 0
    for r in ranges:
        n = r["high"] - r["low"]
        if not tasks or size + n > chunk:
            tasks.append([])
            size = 0
        tasks[-1].append(r)
        size += n
    return tasks


# ------------------------------------------------------------------------ decoding

_AVRO = None


def _strip_logical(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_logical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical(s) for s in schema]
    return schema


def avro_schema() -> Any:
    """The parsed outbox event schema, with logical types dropped so that `timestamp`
    decodes to its raw long (microseconds)."""
    global _AVRO
    if _AVRO is None:
        import fastavro

        from connectors.schema_registry.avro_schemas import schema

        _AVRO = fastavro.parse_schema(_strip_logical(schema()))
    return _AVRO


# The layout of outbox_event.avsc that `_decode_outbox` reads without fastavro: four
# strings, a [null, string, bytes] union and a [null, long] union. When the schema file
# says anything else, the fast path is off and every value goes through fastavro.
_OUTBOX_LAYOUT = (
    ("id", "string"), ("aggregate_type", "string"), ("aggregate_id", "string"), ("type", "string"),
    ("payload", ("null", "string", "bytes")), ("timestamp", ("null", "long")),
)  # fmt: skip
_FAST_AVRO: bool | None = None


def _fast_avro_ok() -> bool:
    global _FAST_AVRO
    if _FAST_AVRO is None:
        try:
            from connectors.schema_registry.avro_schemas import schema

            fields = _strip_logical(schema())["fields"]
            layout = tuple(
                (
                    f["name"],
                    tuple(t if isinstance(t, str) else t["type"] for t in f["type"])
                    if isinstance(f["type"], list)
                    else f["type"],
                )
                for f in fields
            )
            _FAST_AVRO = layout == _OUTBOX_LAYOUT
        except Exception:
            _FAST_AVRO = False
    return _FAST_AVRO


class _Bad(Exception):
    pass


def _decode_outbox(v: bytes) -> tuple:
    """(id, aggregate_type, aggregate_id, type, payload, timestamp) of a Confluent
    wire-format value (Avro body from offset 5) that holds exactly one outbox event
    record; raises on anything else (the caller then asks fastavro, for the same result
    or the same error)."""
    p = 5
    size = len(v)
    out: list[Any] = []
    for _ in range(4):
        b = v[p]
        p += 1
        if b < 0x80:
            n = b
        else:
            n = b & 0x7F
            shift = 7
            while b & 0x80:
                b = v[p]
                p += 1
                n |= (b & 0x7F) << shift
                shift += 7
        n = (n >> 1) ^ -(n & 1)
        if n < 0 or p + n > size:
            raise _Bad
        out.append(v[p : p + n].decode())
        p += n
    u = v[p]
    p += 1
    if u == 0:
        out.append(None)
    elif u == 2 or u == 4:  # zigzag 1 (string), 2 (bytes)
        b = v[p]
        p += 1
        if b < 0x80:
            n = b
        else:
            n = b & 0x7F
            shift = 7
            while b & 0x80:
                b = v[p]
                p += 1
                n |= (b & 0x7F) << shift
                shift += 7
        n = (n >> 1) ^ -(n & 1)
        if n < 0 or p + n > size:
            raise _Bad
        out.append(v[p : p + n].decode() if u == 2 else v[p : p + n])
        p += n
    else:
        raise _Bad
    u = v[p]
    p += 1
    if u == 0:
        out.append(None)
    elif u == 2:
        b = v[p]
        p += 1
        n = b & 0x7F
        shift = 7
        while b & 0x80:
            b = v[p]
            p += 1
            n |= (b & 0x7F) << shift
            shift += 7
        out.append((n >> 1) ^ -(n & 1))
    else:
        raise _Bad
    if p != size:
        raise _Bad
    return tuple(out)


def decode_value(value: bytes | None) -> tuple[dict[str, Any] | None, int | None, str | None]:
    """(avro record, schema id, error) of a Confluent wire-format value."""
    import fastavro

    if value is None:
        return None, None, "null value"
    if len(value) < 5 or value[0] != 0:
        return None, None, "not Confluent wire format (magic byte 0 + 4-byte schema id)"
    schema_id = int.from_bytes(value[1:5], "big")
    buf = io.BytesIO(value)
    buf.seek(5)
    try:
        parsed = avro_schema()
        record = fastavro.schemaless_reader(buf, parsed, parsed)
    except Exception as exc:
        return None, schema_id, f"Avro decoding failed: {type(exc).__name__}: {exc}"[:300]
    if not isinstance(record, dict):  # the envelope schema is a record
        return None, schema_id, "Avro value is not a record"
    if buf.tell() != len(value):
        return record, schema_id, f"{len(value) - buf.tell()} trailing byte(s) after the Avro record"
    return record, schema_id, None


def formatted_value(
    fmt: str, value: bytes | None, event_id: str | None, event_type: str | None, key_text: str | None
) -> tuple:
    """The value columns (`_VALUE_FIELDS`) of a record written in a payload format."""
    schema_id, payload, error = None, value, None
    if fmt == "avro" and value is not None:
        schema_id, payload, error = _avro_payload(value)
    elif fmt not in PAYLOAD_FORMATS:
        error = f"unknown value format {fmt!r} (header {H_FORMAT})"
    return (schema_id, event_id, None, key_text, event_type, payload, None, None, error)


def _avro_payload(value: bytes) -> tuple[int | None, bytes | None, str | None]:
    """(schema id, payload bytes, error) of a Confluent wire-format Avro string or bytes, or
    their union with null (branch 1): the registry is not asked, the layout says which (the
    one body both could read, 02 00, is taken as the union's empty payload)."""
    if len(value) < 6 or value[0] != 0:
        return None, None, "not Confluent wire format (magic byte 0 + 4-byte schema id)"
    schema_id = int.from_bytes(value[1:5], "big")
    for start in (6, 5) if value[5] == 2 else (5,):
        n, p, shift = 0, start, 0
        while p < len(value):
            b = value[p]
            p += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        n = (n >> 1) ^ -(n & 1)
        if n >= 0 and p + n == len(value):
            return schema_id, value[p:], None
    return schema_id, None, "the Avro body is not a string or bytes payload"


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def decode_record(
    topic: str,
    headers: Mapping[str, str],
    value: bytes | None,
    dlq_topic: str | None,
    key_text: str | None = None,
) -> dict[str, Any]:
    """The identity (from the headers) and the event (from the value) of one record."""
    h = headers
    source = h.get(hdr.H_SOURCE)
    row = _int_or_none(h.get(hdr.H_ROW))
    pos = _int_or_none(h.get(hdr.H_POS))
    gtid = h.get(hdr.H_GTID) or None
    file = h.get(hdr.H_FILE)
    ikey = None
    if source is not None and row is not None and (gtid or (file and pos is not None)):
        ikey = identity_key(source, gtid, file, pos, row)
    out: dict[str, Any] = {
        "ikey": ikey,
        "source": source,
        "h_file": file,
        "h_file_seq": file_seq_or_none(file),
        "h_pos": pos,
        "h_row": row,
        "h_gtid": gtid,
        "h_commit_ts": _int_or_none(h.get(hdr.H_COMMIT_TS)),
        "h_event_id": h.get(hdr.H_EVENT_ID),
        "h_event_type": h.get(hdr.H_EVENT_TYPE),
        "h_table": h.get(hdr.H_TABLE),
        "repair": hdr.H_REPAIR in h,
        "dlq_cause": h.get(hdr.H_DLQ_CAUSE),
        "dlq_error": h.get(hdr.H_DLQ_ERROR),
        "dlq_topic": h.get(hdr.H_DLQ_TOPIC),
        "schema_id": None,
        "v_id": None,
        "v_aggregate_type": None,
        "v_aggregate_id": None,
        "v_type": None,
        "v_payload": None,
        "v_payload_is_text": None,
        "v_timestamp_us": None,
        "value_error": None,
        **_xa_prepare_columns(h.get(hdr.H_XA_PREPARE)),
        "v_format": h.get(H_FORMAT),
    }
    if dlq_topic and topic == dlq_topic:
        try:
            json.loads(value or b"")
        except ValueError as exc:
            out["value_error"] = f"dead-letter value is not JSON: {exc}"[:300]
        return out
    if out["v_format"] is not None:
        out.update(
            zip(
                _VALUE_FIELDS,
                formatted_value(out["v_format"], value, out["h_event_id"], out["h_event_type"], key_text),
                strict=True,
            )
        )
        return out
    record, schema_id, error = decode_value(value)
    out["schema_id"] = schema_id
    out["value_error"] = error
    if record is not None:
        payload = record.get("payload")
        out.update(
            v_id=record.get("id"),
            v_aggregate_type=record.get("aggregate_type"),
            v_aggregate_id=record.get("aggregate_id"),
            v_type=record.get("type"),
            v_payload=payload.encode("utf-8") if isinstance(payload, str) else payload,
            v_payload_is_text=None if payload is None else isinstance(payload, str),
            v_timestamp_us=record.get("timestamp"),
        )
    return out


def _xa_prepare_columns(text: str | None) -> dict[str, Any]:
    """`cdc.xa.prepare` (file:pos of an XA transaction's prepare group) as columns."""
    file, _, pos = (text or "").rpartition(":")
    return {"h_xa_prepare": text, "h_xa_file_seq": file_seq_or_none(file) if text else None,
            "h_xa_pos": _int_or_none(pos) if text else None}  # fmt: skip


def message_row(msg: Any, include_raw: bool, decode: bool, dlq_topic: str | None) -> dict[str, Any]:
    ts_type, ts = msg.timestamp()
    key = msg.key()
    headers = hdr.header_dict(msg.headers())
    row: dict[str, Any] = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp_ms": ts if ts_type else None,
        "timestamp_type": ts_type,
        "key": key,
        "key_text": None if key is None else key.decode("utf-8", "replace"),
    }
    if include_raw:
        row["headers"] = headers
        row["value"] = msg.value()
    if decode:
        row.update(decode_record(msg.topic(), headers, msg.value(), dlq_topic, row["key_text"]))
    return row


_WANTED_HEADERS = (
    hdr.H_SOURCE, hdr.H_FILE, hdr.H_POS, hdr.H_ROW, hdr.H_GTID, hdr.H_COMMIT_TS, hdr.H_EVENT_ID, hdr.H_EVENT_TYPE,
    hdr.H_TABLE, hdr.H_REPAIR, hdr.H_DLQ_CAUSE, hdr.H_DLQ_ERROR, hdr.H_DLQ_TOPIC, hdr.H_XA_PREPARE, H_FORMAT,
)  # fmt: skip
_HEADER_INDEX = {name: i for i, name in enumerate(_WANTED_HEADERS)}


class RecordColumns:
    """The rows of `message_row` built column by column (no dict per record) and handed
    out as Arrow record batches; the same values, at a fraction of the cost."""

    def __init__(self, include_raw: bool, decode: bool, dlq_topic: str | None):
        self.include_raw = include_raw
        self.decode = decode
        self.dlq_topic = dlq_topic
        self.fast_avro = _fast_avro_ok()
        self.fields = fields_for(include_raw, decode)
        self._seq: dict[str, int | None] = {}
        self._reset()

    def _reset(self) -> None:
        self.cols: list[list[Any]] = [[] for _ in self.fields]
        self.n = 0

    def _file_seq(self, file: str | None) -> int | None:
        if file is None:
            return None
        try:
            return self._seq[file]
        except KeyError:
            seq = file_seq_or_none(file)
            if len(self._seq) < 100_000:
                self._seq[file] = seq
            return seq

    def add(self, msg: Any) -> None:
        cols = self.cols
        topic = msg.topic()
        ts_type, ts = msg.timestamp()
        key = msg.key()
        cols[0].append(topic)
        cols[1].append(msg.partition())
        cols[2].append(msg.offset())
        cols[3].append(ts if ts_type else None)
        cols[4].append(ts_type)
        cols[5].append(key)
        cols[6].append(None if key is None else key.decode("utf-8", "replace"))
        i = 7
        raw_headers = msg.headers()
        value = msg.value()
        if self.include_raw:
            cols[7].append(list(hdr.header_dict(raw_headers).items()))
            cols[8].append(value)
            i = 9
        if not self.decode:
            self.n += 1
            return
        h: list[Any] = [None] * 15
        index = _HEADER_INDEX.get
        for name, text in raw_headers or ():
            j = index(name)
            if j is not None and text is not None:
                h[j] = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        source, file, pos_t, row_t, gtid = h[0], h[1], h[2], h[3], h[4]
        row = _int_or_none(row_t)
        pos = _int_or_none(pos_t)
        gtid = gtid or None
        ikey = None
        if source is not None and row is not None and (gtid or (file and pos is not None)):
            ikey = identity_key(source, gtid, file, pos, row)
        decoded = (ikey, source, file, self._file_seq(file), pos, row, gtid, _int_or_none(h[5]), h[6], h[7], h[8],
                   h[9] is not None, h[10], h[11], h[12])  # fmt: skip
        for j, item in enumerate(decoded, i):
            cols[j].append(item)
        i += 15
        # value: schema_id, v_id, v_aggregate_type, v_aggregate_id, v_type, v_payload, v_payload_is_text,
        # v_timestamp_us, value_error
        if self.dlq_topic and topic == self.dlq_topic:
            error = None
            try:
                json.loads(value or b"")
            except ValueError as exc:
                error = f"dead-letter value is not JSON: {exc}"[:300]
            v: tuple[Any, ...] | None = (None, None, None, None, None, None, None, None, error)
        elif h[14] is not None:  # a payload format: the value is the payload
            v = formatted_value(h[14], value, h[6], h[7], cols[6][-1])
        else:
            v = _fast_value(value) if self.fast_avro else None
            if v is None:  # not the plain layout, or broken: fastavro says what it is
                d = decode_record(topic, {}, value, self.dlq_topic)
                v = tuple(d[n] for n in _VALUE_FIELDS)
        for j, item in enumerate(v or (), i):
            cols[j].append(item)
        i += 9
        if h[13] is None:
            cols[i].append(None)
            cols[i + 1].append(None)
            cols[i + 2].append(None)
        else:
            xa = _xa_prepare_columns(h[13])
            cols[i].append(xa["h_xa_prepare"])
            cols[i + 1].append(xa["h_xa_file_seq"])
            cols[i + 2].append(xa["h_xa_pos"])
        cols[i + 3].append(h[14])
        self.n += 1

    def take(self) -> Any:
        import pyarrow as pa

        schema = arrow_schema(self.include_raw, self.decode)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(self.cols, schema, strict=True)], schema=schema
        )
        self._reset()
        return batch


def _fast_value(value: bytes | None) -> tuple | None:
    """The value columns of a Confluent wire-format outbox event read by `_decode_outbox`,
    or None when that reader does not take it (fastavro decides then)."""
    if value is None or len(value) < 5 or value[0] != 0:
        return None
    try:
        rid, atype, aid, etype, payload, stamp = _decode_outbox(value)
    except Exception:
        return None
    return (int.from_bytes(value[1:5], "big"), rid, atype, aid, etype,
            payload.encode("utf-8") if isinstance(payload, str) else payload,
            None if payload is None else isinstance(payload, str), stamp, None)  # fmt: skip


_VALUE_FIELDS = (
    "schema_id", "v_id", "v_aggregate_type", "v_aggregate_id", "v_type", "v_payload", "v_payload_is_text", "v_timestamp_us",
    "value_error",
)  # fmt: skip


_ARROW: dict[tuple[bool, bool], Any] = {}


def arrow_schema(include_raw: bool, decode: bool) -> Any:
    key = (include_raw, decode)
    if key not in _ARROW:
        import pyarrow as pa

        kinds = {
            "string": pa.string(),
            "bigint": pa.int64(),
            "int": pa.int32(),
            "binary": pa.binary(),
            "boolean": pa.bool_(),
            "map<string,string>": pa.map_(pa.string(), pa.string()),
        }
        _ARROW[key] = pa.schema([(n, kinds[k]) for n, k in fields_for(include_raw, decode)])
    return _ARROW[key]
