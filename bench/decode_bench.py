"""Binlog decode throughput: python-mysql-replication (+ _Converter) vs the fast reader
(connectors.mysql.binlog_protocol + connectors.mysql.binlog_decoder), on the same real binlog.

    python -m bench.decode_bench [--events 200000] [--mixed] [--repeat 1]

Writes N outbox events (one INSERT per event, 100 per transaction, ~300-byte payload;
`--mixed` adds 10 other tables with equal traffic, the outbox being 1/11 of the rows) to
a throwaway MariaDB, then reads the range from its start with:

  library   BinLogStreamReader configured like MySQLBinlogSourceFactory.open (only_events,
            only_schemas/only_tables, non-blocking) + binlog_source._Converter
  fast      BinlogConnection (non-blocking dump) + BinlogDecoder, socket to source events
            (event_runs + decode_reads, as the relay reads)
  decode    BinlogDecoder alone over the raw events already in memory, framed as the
            stream frames them (decode_reads over one buffer: decode cost only)

and prints outbox rows/s for each and the ratios. Both readers must yield the same
number of outbox rows (checked).
"""

from __future__ import annotations

import argparse
import time

from bench.workloads import bench_server, create_schema, write


def _library(db, watched, file, pos):
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import (
        FormatDescriptionEvent,
        GtidEvent,
        HeartbeatLogEvent,
        MariadbGtidEvent,
        QueryEvent,
        RotateEvent,
        XidEvent,
    )
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from cdc.source_events import RowInsert
    from connectors.mysql.binlog_library import LibraryConverter as _Converter

    t0 = time.perf_counter()
    reader = BinLogStreamReader(
        connection_settings=db.connection_settings(),
        server_id=901,
        blocking=False,
        only_events=[
            FormatDescriptionEvent,
            RotateEvent,
            GtidEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
            WriteRowsEvent,
            UpdateRowsEvent,
            DeleteRowsEvent,
            HeartbeatLogEvent,
        ],
        only_schemas=sorted({s for s, _ in watched}),
        only_tables=sorted({t for _, t in watched}),
        enable_logging=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
    )
    conv = _Converter(set(watched), file)
    rows = 0
    out: list = []
    for ev in reader:
        conv.convert(ev, out)
        if len(out) > 1000:
            rows += sum(1 for e in out if type(e) is RowInsert)
            out.clear()
    rows += sum(1 for e in out if type(e) is RowInsert)
    reader.close()
    return rows, time.perf_counter() - t0


def _fast(db, watched, file, pos):
    from cdc.source_events import RowInsert
    from connectors.mysql.binlog_decoder import BinlogDecoder
    from connectors.mysql.binlog_protocol import BinlogConnection

    s = db.connection_settings()
    t0 = time.perf_counter()
    dec = BinlogDecoder(set(watched), file)
    decode = dec.decode_reads  # as the relay's source reads: a socket read at a time
    rows = 0
    out: list = []
    with BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=902).dump_file(
        file, pos, blocking=False
    ) as bc:
        for item in bc.event_runs():
            decode(item, out)
            if len(out) > 1000:
                rows += sum(1 for e in out if type(e) is RowInsert)
                out.clear()
    rows += sum(1 for e in out if type(e) is RowInsert)
    return rows, time.perf_counter() - t0, dec


def _raw_events(db, file, pos) -> list[bytes]:
    """The range's raw events, for `_decode_only` (not timed)."""
    from connectors.mysql.binlog_protocol import BinlogConnection

    s = db.connection_settings()
    with BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=904).dump_file(
        file, pos, blocking=False
    ) as bc:
        return list(bc.events())


def _decode_only(raw, watched, file):
    from cdc.source_events import RowInsert
    from connectors.mysql.binlog_decoder import BinlogDecoder
    from connectors.mysql.binlog_protocol import PacketRun

    # the events as the stream carries them: a packet each (3-byte length, sequence id,
    # the OK byte, the event), in buffers of about a socket read's events
    buffers = [
        b"".join((len(ev) + 1).to_bytes(3, "little") + b"\0\0" + ev for ev in raw[i : i + 1000])
        for i in range(0, len(raw), 1000)
    ]
    dec = BinlogDecoder(set(watched), file)
    out: list = []
    run = PacketRun()
    t0 = time.perf_counter()
    for data in buffers:
        run.data, run.pos = data, 0
        while run.pos < len(data):
            dec.decode_reads(run, out)
            if run.pos < len(data):  # a packet it leaves to the connection: handed over alone
                n = int.from_bytes(data[run.pos : run.pos + 3], "little")
                dec.decode_batch([data[run.pos + 5 : run.pos + 4 + n]], out)
                run.pos += 4 + n
    elapsed = time.perf_counter() - t0
    return sum(1 for e in out if type(e) is RowInsert), elapsed


def _read_only(db, file, pos):
    """Socket + framing only (no decoding)."""
    from connectors.mysql.binlog_protocol import BinlogConnection

    s = db.connection_settings()
    t0 = time.perf_counter()
    n = 0
    with BinlogConnection(s["host"], s["port"], s["user"], s["password"], server_id=903).dump_file(
        file, pos, blocking=False
    ) as bc:
        for evs in bc.event_batches():
            n += len(evs)
    return n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--mixed", action="store_true", help="10 other tables; outbox = 1/11 of the rows")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each reader (best is reported)")
    ap.add_argument("--skip-library", action="store_true")
    args = ap.parse_args(argv)

    database = "bench"
    watched = {(database, "outbox")}
    with bench_server() as db:
        create_schema(db, database, args.mixed)
        with db.connect(autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
        t0 = time.perf_counter()
        write(db, database, args.events, mixed=args.mixed)
        print(
            f"wrote {args.events} outbox events{' (+10x other rows)' if args.mixed else ''} "
            f"in {time.perf_counter() - t0:.1f} s; reading from {file}:{pos}"
        )

        best: dict[str, float] = {}
        raw: list[bytes] = []
        for _ in range(args.repeat):
            n_ev, el = _read_only(db, file, pos)
            best["read"] = min(best.get("read", el), el)
            rows, el, dec = _fast(db, watched, file, pos)
            assert rows == args.events, (rows, args.events)
            raw = raw or _raw_events(db, file, pos)
            best["fast"] = min(best.get("fast", el), el)
            rows, el = _decode_only(raw, watched, file)
            assert rows == args.events, (rows, args.events)
            best["decode"] = min(best.get("decode", el), el)
            if not args.skip_library:
                rows, el = _library(db, watched, file, pos)
                assert rows == args.events, ("library", rows, args.events)
                best["library"] = min(best.get("library", el), el)

        n = args.events
        print(f"binlog events read: {n_ev} ({sum(map(len, raw)) / 2**20:.0f} MiB)")
        print(f"socket+framing only       : {n_ev / best['read']:>10,.0f} events/s  ({best['read']:.2f} s)")
        print(f"fast (socket -> events)   : {n / best['fast']:>10,.0f} outbox rows/s  ({best['fast']:.2f} s)")
        print(f"decode only (in memory)   : {n / best['decode']:>10,.0f} outbox rows/s  ({best['decode']:.2f} s)")
        if "library" in best:
            print(f"library + _Converter      : {n / best['library']:>10,.0f} outbox rows/s  ({best['library']:.2f} s)")
            print(f"ratio fast / library      : {best['library'] / best['fast']:.1f}x")
        print(f"table maps decoded: {dec.table_maps_decoded}")


if __name__ == "__main__":
    main()
