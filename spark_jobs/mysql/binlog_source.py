"""PySpark Python data source `cdc_binlog`: the committed outbox inserts of a MariaDB /
MySQL binlog, one row per event, with the coordinates the relay puts in its headers.

    spark.read.format("cdc_binlog")
        .option("host", ...).option("port", ...).option("user", ...).option("password", ...)
        .option("source", "shop-db")                       # the relay's source name
        .option("tables", tables_to_json([OutboxTable(...)]))
        .option("server_id_base", "1234567")               # optional
        .option("start_file", "mysql-bin.000003")          # optional
        .option("end_position", "mysql-bin.000007:1234")   # optional, default: now
        .option("split_bytes", str(8 << 20))               # optional: pieces of ~8 MiB
        .option("binlog_reader", "default")                # or "fast" (NOT independent)
        .option("plan", json.dumps(plan_binlog(...)))      # optional: a fixed snapshot
        .load()

Partitions: one per binlog file (`SHOW BINARY LOGS`), or with `split_bytes` (the verify
job sets it: about three pieces per core) pieces of about that many bytes cut at
transaction starts (`SHOW BINLOG EVENTS`: GTID events, or BEGIN without GTIDs), so more
cores finish sooner. Each piece is read over its own replication connection with its own
server_id (`server_id_base + index`; two dump threads with one server_id would disconnect
each other). Every partition reads `[start, end)` of one file; the end of the newest file
is the server's position when the plan was made, so a read is a consistent snapshot even
while the server keeps writing.

Readers (`binlog_reader`, `spark_jobs/mysql/binlog_readers.py`): "default" decodes with python-mysql-replication - a second,
independent decoder, so a bug of the relay's decoder cannot hide itself. Compressed
events (MariaDB's log_bin_compress, MySQL's Transaction_payload), which the library does
not know, are expanded into the plain events they stand for by the verifier's own code
(`spark_jobs/mysql/binlog_compressed.py`) before the library decodes them, and what the
library misreads of MySQL 8.4 / 9.x rows is prepared by the verifier's own code too:
Table_maps without `binlog_row_metadata=FULL` get names and ENUM / SET values from
information_schema, JSON reaches the payload as MySQL's own text, VECTOR as its bytes,
a partial JSON update as the whole document (`spark_jobs/mysql/binlog_table_map.py`,
`json_text.py`, `binlog_partial_json.py`; docs/verifier.md, "Reading what MySQL writes"). "fast" uses the
relay's own reader (`connectors.mysql.binlog_protocol` + `connectors.mysql.binlog_decoder`) and is
several times faster, but a decoder bug would then be made by both sides: opt in only
when that trade is acceptable. Either way the events go through the verifier's own
transaction assembly, and rows reach Spark as Arrow batches built column by column.

The transaction assembly (`spark_jobs/mysql/binlog_assembly.py`) is the verifier's own
(buffer outbox rows until XID or `COMMIT`; drop them on `ROLLBACK`; cut back to the
savepoint on `ROLLBACK TO`); it shares nothing with the relay's `cdc/assembly/transaction.py` /
`cdc/source_events.py` / `cdc/recovery.py`, so a bug there cannot hide
itself. Beyond that:

* XA. A prepare group (MariaDB: GTID event, rows, `XA END`, XA_prepare event) yields its
  outbox rows as `kind = xa_row` rows tagged with the xid (`xa_xid`, text form
  `X'<gtrid hex>',X'<bqual hex>',<formatID>`) and the prepare group's coordinates, with
  no identity yet; an outcome group (`XA COMMIT <xid>` / `XA ROLLBACK <xid>`, its own GTID
  event) yields one marker row (`xa_commit` / `xa_rollback`) with the outcome group's
  coordinates. A prepare and its outcome are often read by different partitions (other
  byte ranges, other files), so nothing is decided here: `spark_jobs/reconcile.py`
  `resolve_xa` pairs them over the whole read before reconciling. `XA COMMIT ... ONE
  PHASE` (and MySQL's one-phase XA_prepare event) is an ordinary commit.
* A statement-logged INSERT / REPLACE / LOAD DATA into an outbox table (a Query or
  Execute_load_query event inside a multi-statement transaction; an unqualified table is
  in the event's default schema) takes one row index, like the relay's dead letter for it;
  its row has `dlq_cause = statement_format` and no content (the binlog holds no row image).
* A Write_rows of an outbox id that a Delete_rows of the same table removed earlier in the
  same transaction (REPLACE written as delete + insert) is not an event: the relay treats
  it as a change of an existing event. So both readers read Delete_rows of outbox tables.

Schema: `BINLOG_FIELDS` / `BINLOG_SCHEMA`, with what the relay must publish for each row
(`spark_jobs/mysql/binlog_rows.py`). The plan and its pieces: `spark_jobs/mysql/binlog_plan.py`.

The password is never logged and is scrubbed from error messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from cdc.events.outbox import OutboxTable
from spark_jobs.common import (
    DataSource,
    DataSourceReader,
    InputPartition,
    mysql_settings_from_options,
    opt_int,
    opt_json,
    settle_worker,
)
from spark_jobs.mysql.binlog_plan import plan_binlog, split_ranges
from spark_jobs.mysql.binlog_readers import read_binlog_file, read_binlog_file_fast
from spark_jobs.mysql.binlog_rows import BINLOG_SCHEMA, EventColumns, EventMapper, anomaly_row

BATCH_ROWS = 8192
BINLOG_READERS = ("default", "fast")


# --------------------------------------------------------------------------- config


def tables_to_json(tables: Sequence[OutboxTable]) -> str:
    return json.dumps([asdict(t) for t in tables])


def tables_from_json(text: str | None) -> list[OutboxTable]:
    if not text:
        raise ValueError("cdc_binlog: option 'tables' (JSON list of outbox tables) is required")
    return [OutboxTable(**item) for item in json.loads(text)]


def _reader_of(options: Mapping[str, str]) -> Any:
    name = (options.get("binlog_reader") or "default").strip().lower()
    if name not in BINLOG_READERS:
        raise ValueError(f"cdc_binlog: option 'binlog_reader' must be one of {BINLOG_READERS}, got {name!r}")
    return read_binlog_file_fast if name == "fast" else read_binlog_file


def iter_binlog_batches(
    options: Mapping[str, str], part: Mapping[str, Any], batch_rows: int = BATCH_ROWS
) -> Iterator[Any]:
    """The event rows of one planned file range as Arrow record batches (BINLOG_FIELDS),
    anomaly rows last."""
    settings = mysql_settings_from_options(options)
    tables = tables_from_json(options.get("tables"))
    mapper = EventMapper(tables, opt_json(options, "topic_allowlist", []) or [])
    source = options.get("source") or ""
    if not source:
        raise ValueError("cdc_binlog: option 'source' (the relay's source name) is required")
    read = _reader_of(options)
    anomalies: list[str] = []
    cols = EventColumns(source, mapper)
    file = part["file"]
    # only the expected columns are converted: the rows carry nothing else (EventMapper)
    txs = read(settings, file, part["start"], part["end"], part["server_id"], tables, anomalies.append, True)
    for tx in txs:
        cols.add_tx(file, tx)
        if cols.n >= batch_rows:
            yield cols.take()
    for text in anomalies:
        cols.add_row(anomaly_row(source, file, text))
    if cols.n:
        yield cols.take()


# ----------------------------------------------------------------------- data source


class BinlogReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)

    def _plan(self) -> dict[str, Any]:
        plan = opt_json(self.options, "plan")
        if plan is None:
            plan = plan_binlog(
                mysql_settings_from_options(self.options),
                self.options.get("start_file") or None,
                self.options.get("end_position") or None,
                opt_int(self.options, "server_id_base"),
            )
        return plan

    def partitions(self) -> Sequence[InputPartition]:
        plan = self._plan()
        split = opt_int(self.options, "split_bytes")
        if split and not plan.get("ranges"):
            plan = split_ranges(mysql_settings_from_options(self.options), plan, split)
        base = int(plan["server_id_base"])
        parts = [
            InputPartition({"file": f["file"], "start": f["start"], "end": f["end"], "server_id": base + i})
            for i, f in enumerate(plan.get("ranges") or plan["files"])
            if f["end"] > f["start"]
        ]
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle_worker()
        part = partition.value
        if part is None:
            return
        yield from iter_binlog_batches(self.options, part)


class BinlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_binlog"

    def schema(self) -> str:
        return BINLOG_SCHEMA

    def reader(self, schema: Any) -> BinlogReader:
        return BinlogReader(self.options)
