"""PySpark Python data source `cdc_outbox_table`: the rows still kept in an outbox table,
read in primary-key ranges over PyMySQL (for outbox tables whose rows are not deleted).

    spark.read.format("cdc_outbox_table")
        .option("host", ...).option("port", ...).option("user", ...).option("password", ...)
        .option("table", tables_to_json([OutboxTable(...)]))   # exactly one table
        .option("chunk", "100000")                               # rows per Spark partition
        .load()

Partitions: numeric primary keys are split into `[lo, hi]` ranges of `chunk` key values
between MIN and MAX; other keys (a VARCHAR(36) UUID, BINARY(16)) into ranges bounded by
every `chunk`-th key in key order. Schema: `table, event_id, aggregate_type,
aggregate_id, event_type, payload (binary), payload_is_text` - the same text rules as the
binlog source (`cdc.events.outbox.text_of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdc.events.outbox import OutboxTable, text_of
from spark_jobs.common import (
    DataSource,
    DataSourceReader,
    InputPartition,
    mysql_settings_from_options,
    opt_int,
    scrub,
    where,
)
from spark_jobs.mysql.binlog_plan import connect_mysql
from spark_jobs.mysql.binlog_rows import payload_bytes
from spark_jobs.mysql.binlog_source import tables_from_json

TABLE_SCHEMA = (
    "`table` string, `event_id` string, `aggregate_type` string, `aggregate_id` string, "
    "`event_type` string, `payload` binary, `payload_is_text` boolean"
)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def plan_ranges(settings: Mapping[str, Any], table: OutboxTable, chunk: int) -> list[dict[str, Any]]:
    conn = connect_mysql(settings)
    qualified = f"{_q(table.schema)}.{_q(table.table)}"
    key = _q(table.id_column)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MIN({key}), MAX({key}), COUNT(*) FROM {qualified}")
            lo, hi, count = cur.fetchone()
            if not count:
                return []
            if isinstance(lo, int) and isinstance(hi, int):
                return [{"kind": "int", "lo": a, "hi": min(hi, a + chunk - 1)} for a in range(lo, hi + 1, chunk)]
            bounds = [lo]
            offset = chunk
            while offset < count:
                cur.execute(f"SELECT {key} FROM {qualified} ORDER BY {key} LIMIT 1 OFFSET %s", (offset,))
                bounds.append(cur.fetchone()[0])
                offset += chunk
            out = []
            for i, b in enumerate(bounds):
                out.append({"kind": "ordered", "lo": b, "hi": bounds[i + 1] if i + 1 < len(bounds) else None})
            return out
    except Exception as exc:
        raise RuntimeError(
            f"cdc_outbox_table: planning {table.qualified_name} on {where(settings)}: {scrub(str(exc), settings)}"
        ) from None
    finally:
        conn.close()


def read_range(settings: Mapping[str, Any], table: OutboxTable, rng: Mapping[str, Any]) -> Iterator[tuple]:
    qualified = f"{_q(table.schema)}.{_q(table.table)}"
    key = _q(table.id_column)
    cols = [
        table.id_column,
        table.aggregate_type_column,
        table.aggregate_id_column,
        table.type_column,
        table.payload_column,
    ]
    select = ", ".join(_q(c) for c in cols)
    if rng["kind"] == "int":
        args: tuple[Any, ...]
        sql, args = f"SELECT {select} FROM {qualified} WHERE {key} BETWEEN %s AND %s", (rng["lo"], rng["hi"])
    elif rng["hi"] is None:
        sql, args = f"SELECT {select} FROM {qualified} WHERE {key} >= %s", (rng["lo"],)
    else:
        sql, args = f"SELECT {select} FROM {qualified} WHERE {key} >= %s AND {key} < %s", (rng["lo"], rng["hi"])
    import pymysql.cursors

    conn = connect_mysql({**settings, "cursorclass": pymysql.cursors.SSCursor})
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            for ident, atype, aid, etype, payload in cur:
                data, is_text = payload_bytes(payload)
                yield (
                    table.qualified_name,
                    None if ident is None else text_of(ident),
                    None if atype is None else text_of(atype),
                    None if aid is None else text_of(aid),
                    None if etype is None else text_of(etype),
                    data,
                    is_text,
                )
    except Exception as exc:
        raise RuntimeError(
            f"cdc_outbox_table: reading {table.qualified_name} on {where(settings)}: {scrub(str(exc), settings)}"
        ) from None
    finally:
        conn.close()


class OutboxTableReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        tables = tables_from_json(self.options.get("table") or self.options.get("tables"))
        if len(tables) != 1:
            raise ValueError("cdc_outbox_table: option 'table' must name exactly one outbox table")
        self.table = tables[0]

    def partitions(self) -> Sequence[InputPartition]:
        ranges = plan_ranges(
            mysql_settings_from_options(self.options), self.table, opt_int(self.options, "chunk", 100_000) or 100_000
        )
        return [InputPartition(r) for r in ranges] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if partition.value is None:
            return
        yield from read_range(mysql_settings_from_options(self.options), self.table, partition.value)


class OutboxTableDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_outbox_table"

    def schema(self) -> str:
        return TABLE_SCHEMA

    def reader(self, schema: Any) -> OutboxTableReader:
        return OutboxTableReader(self.options)
