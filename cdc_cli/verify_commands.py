"""`cdc verify`, `cdc repair`, `cdc locate`: the verifier's commands, driven by the
relay's own config file (one file names the source, the tables and the topics)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from cdc.position import BinlogPosition

if TYPE_CHECKING:  # not at run time: `cdc run` builds this parser before it starts its reader process
    from cdc.config import Config


def verify_config(
    cfg: Config,
    output_dir: str,
    master: str | None = None,
    end_position: str | None = None,
    start_file: str | None = None,
):
    from spark_jobs.verify import VerifyConfig

    return VerifyConfig(
        mysql=cfg.source.connection(),
        source=cfg.source.name,
        tables=tuple(cfg.tables),
        kafka_bootstrap=cfg.kafka.bootstrap,
        dlq_topic=cfg.kafka.dead_letter_topic,
        spark_master=master or "local[*]",
        output_dir=output_dir,
        end_position=end_position,
        start_file=start_file,
        topic_allowlist=tuple(cfg.kafka.topic_allowlist),
        consumer_conf=cfg.kafka.clients().settings("consumer"),  # [kafka.client] + [kafka.consumer], to executors too
        sink=sink_source_options(cfg),
    )


def sink_source_options(cfg: Config) -> dict[str, str]:
    """The verifier's data source of a sink other than Kafka, with its options ({}: Kafka)."""
    if cfg.sink.kind == "rabbitmq_stream":
        mq = cfg.sink.rabbitmq_stream
        return {"format": "cdc_rabbitmq", "host": mq.host, "port": str(mq.port), "hosts": ",".join(mq.hosts),
                "vhost": mq.vhost, "user": mq.user, "password": mq.password.reveal(), "empty_wait": str(mq.empty_wait_s),
                "tls": str(bool(mq.tls or mq.ca_file or mq.cert_file)).lower(), **_tls_files(mq)}  # fmt: skip
    if cfg.sink.kind == "rabbitmq_exchange":  # the audit stream is the record of delivery
        ex = cfg.sink.rabbitmq_exchange
        return {"format": "cdc_rabbitmq", "host": ex.host, "port": str(ex.stream_port),
                "hosts": ",".join(ex.stream_addresses()), "vhost": ex.vhost,
                "user": ex.user, "password": ex.password.reveal(), "empty_wait": str(ex.empty_wait_s),
                "audit_stream": ex.audit_stream,
                "tls": str(bool(ex.tls or ex.ca_file or ex.cert_file)).lower(), **_tls_files(ex)}  # fmt: skip
    if cfg.sink.kind == "nats_jetstream":
        nats = cfg.sink.nats_jetstream
        out = {"format": "cdc_nats", "servers": ",".join(nats.servers), "user": nats.user,
               "password": nats.password.reveal(), **_tls_files(nats)}  # fmt: skip
        return {**out, "token": nats.token.reveal()} if nats.token.reveal() else out
    return {}


def _tls_files(sink) -> dict[str, str]:
    """The sink's TLS files, as the verifier's source options: paths, and an encrypted key's
    password (`key_password`, among spark_jobs/common.py's SECRET_OPTION_NAMES: reports redact it)."""
    files = {name: getattr(sink, name) for name in ("ca_file", "cert_file", "key_file") if getattr(sink, name)}
    if getattr(sink, "key_password", None):
        files["key_password"] = sink.key_password.reveal()  # a secret: the reports redact it
    return files


def _require_spark() -> None:
    """Before any work: without the `verify` extra, cdc_cli.main says so in one line."""
    import pyarrow  # noqa: F401  # imported for the check only
    import pyspark  # noqa: F401  # imported for the check only


def _cmd_verify(args: argparse.Namespace) -> int:
    _require_spark()
    from cdc_cli.config_file import read_config
    from cdc_cli.logs import configure
    from spark_jobs.verify import run_verify

    cfg = read_config(args.config)
    configure("text", "WARNING")
    vcfg = verify_config(cfg, args.output_dir, args.master, args.end_position, args.start_file)
    if args.binlog_reader:
        from dataclasses import replace

        vcfg = replace(vcfg, binlog_reader=args.binlog_reader)
    if args.follow:
        return _follow(args, vcfg, cfg)
    if args.repair:
        print("cdc verify: --repair repairs while following: add --follow (or run cdc repair after cdc verify)",
              file=sys.stderr)  # fmt: skip
        return 2
    report = run_verify(vcfg, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    print(report.summary_text())  # its last line names the JSON and HTML reports
    return 0 if report.ok else 3


def follow_compensation(cfg: Config, every_s: float = 5.0):
    """Continuous compensation for `cdc verify --follow --repair` (spark_jobs/follow_repair.py):
    the relay's checkpoint from its own store (as `cdc check` reads it), and `cdc repair`
    for one event at a time (so each failure is that event's)."""
    from cdc_cli.app import checkpoint_store
    from cdc_cli.repair import repair
    from spark_jobs.follow_repair import Compensation

    def checkpoint() -> tuple[str, int] | None:
        cp = checkpoint_store(cfg).load()
        return (cp.position.file, cp.position.pos) if cp is not None else None

    def republish(entry: dict) -> tuple[bool, str | None]:
        try:
            result = repair(cfg, [entry])
        except Exception as exc:  # the sink refusing, the binlog unreadable: one line, the event's alarm
            return False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        if result.not_found_in_binlog:
            return False, "not_in_binlog: its transaction is no longer in the binlog (purged?)"
        return result.published > 0, None

    return Compensation(checkpoint=checkpoint, republish=republish, every_s=every_s)


def _follow(args: argparse.Namespace, vcfg, cfg: Config) -> int:
    import signal
    import threading

    from spark_jobs.follow import FollowConfig, run_follow

    if args.end_position:
        print(
            "cdc verify: --follow runs until stopped; --end-position is for a one-off run (drop one of them)",
            file=sys.stderr,
        )
        return 2
    for name in ("grace", "trigger", "repair_every"):
        if getattr(args, name) <= 0:
            print(
                f"cdc verify: --{name} must be a positive number of seconds, got {getattr(args, name)}", file=sys.stderr
            )
            return 2
    start = args.start_file or args.follow_start
    compensation = follow_compensation(cfg, args.repair_every) if args.repair else None
    fcfg = FollowConfig(compensation=compensation, verify=vcfg, checkpoint_dir=args.checkpoint_dir or "", grace_s=args.grace, trigger_s=args.trigger,
                        start=start, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
                        report_every_s=args.report_every, dedupe_window_s=args.dedupe_window,
                        max_batch_bytes=args.max_batch_bytes)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_a: stop.set())
    import logging

    logging.getLogger("cdc.verify.follow").setLevel(logging.INFO)
    try:
        code, job = run_follow(fcfg, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True), stop=stop.is_set,
                               duration_s=args.duration)  # fmt: skip
    except (ValueError, RuntimeError) as exc:
        print(f"cdc verify: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if job.error:
        print(f"cdc verify: error: {job.error}", file=sys.stderr)
        return 2
    snap = job.snapshot()
    vt = snap.get("verified_through") or {}
    print(f"follow: {snap.get('batches', 0)} batch(es); verified through {vt.get('file')}:{vt.get('pos')} "
          f"(lag {snap.get('verified_through_lag_s')} s); counts {json.dumps(snap.get('counts'), sort_keys=True)}")  # fmt: skip
    if job.report is not None:
        print(f"report: {job.report.json_path}\nhtml:   {job.report.html_path}")
    return code


def _cmd_repair(args: argparse.Namespace) -> int:
    from cdc_cli.config_file import read_config
    from cdc_cli.logs import configure
    from cdc_cli.repair import load_missing, repair

    cfg = read_config(args.config)
    configure("text", "WARNING")
    result = repair(cfg, load_missing(args.report), progress=lambda m: print(m, file=sys.stderr))
    print(
        f"repair: {result.requested} missing, {result.published} re-published (header cdc.repair), "
        f"{result.already_present} already present, {result.not_found_in_binlog} not found in the binlog"
    )
    return 0 if result.not_found_in_binlog == 0 else 3


def _cmd_locate(args: argparse.Namespace) -> int:
    try:
        return _locate(args)
    except RuntimeError as exc:  # a sink source's one line (cdc_nats / cdc_rabbitmq: cannot connect ...)
        from cdc.errors import DeliveryError

        raise DeliveryError(f"cdc locate: {exc}") from None


def _locate(args: argparse.Namespace) -> int:
    from cdc_cli.config_file import read_config
    from spark_jobs.locate import locate_offset, locate_position
    from spark_jobs.verify import template_pattern

    cfg = read_config(args.config)
    if args.offset is not None:
        if not args.topic or args.partition is None:
            print("cdc locate: --offset needs --topic and --partition", file=sys.stderr)
            return 2
        found = locate_offset(
            cfg.kafka.bootstrap,
            args.topic,
            args.partition,
            args.offset,
            consumer_conf=cfg.kafka.clients().settings("consumer"),
            sink=sink_source_options(cfg),
        )
        if found is None:
            print(f"no record at {args.topic}[{args.partition}]@{args.offset}", file=sys.stderr)
            return 3
        print(json.dumps({k: v for k, v in found.items() if k != "headers"}, default=str))
        return 0
    if not args.position:
        print("cdc locate: give --position <file:pos | GTID> or --topic/--partition/--offset", file=sys.stderr)
        return 2
    where = args.position
    try:
        where = (
            BinlogPosition.parse(args.position)
            if ":" in args.position and "." in args.position.split(":")[0]
            else where
        )
    except Exception:
        pass
    pattern = template_pattern([t.topic for t in cfg.tables])
    topics = [cfg.kafka.dead_letter_topic]
    if cfg.sink.kind in (
        "rabbitmq_stream",
        "rabbitmq_exchange",
    ):  # no stream listing (3.10): the topic named, or the tables' fixed topics
        topics += [args.topic] if args.topic else [t.topic for t in cfg.tables if "{" not in t.topic]
    hits = locate_position(
        cfg.kafka.bootstrap,
        topics,
        cfg.source.name,
        where,
        args.row,
        topic_pattern=pattern,
        consumer_conf=cfg.kafka.clients().settings("consumer"),
        sink=sink_source_options(cfg),
    )
    for topic, partition, offset in hits:
        print(f"{topic}\t{partition}\t{offset}")
    return 0 if hits else 3


def add_parsers(sub) -> None:
    p = sub.add_parser("verify", help="Spark verifier: binlog vs topics, event by event")
    p.add_argument("--config", required=True, help="the relay's TOML file")
    p.add_argument("--output-dir", default="verify-report", help="report.json, report.html, missing.jsonl")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--start-file", default=None, help="verify from this binlog file (default: the oldest)")
    p.add_argument("--end-position", default=None, help="verify up to file:pos (default: the server's end now)")
    p.add_argument(
        "--binlog-reader",
        default=None,
        choices=("default", "fast"),
        help="default: python-mysql-replication (independent of the relay); fast: the relay's own decoder "
        "(several times faster, NOT independent)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="run continuously (Spark Structured Streaming): verified-through, alarms, metrics, report",
    )
    p.add_argument(
        "--checkpoint-dir", default=None, help="--follow: Spark checkpoint + state (default <output-dir>/checkpoint)"
    )
    p.add_argument("--grace", type=float, default=60.0, help="--follow: seconds an event may wait for its record (60)")
    p.add_argument("--trigger", type=float, default=2.0, help="--follow: seconds between micro-batches (2)")
    p.add_argument(
        "--max-batch-bytes",
        type=int,
        default=64 << 20,
        help="--follow: binlog bytes one micro-batch reads at most, cut at a transaction (64 MiB; 0: no limit)",
    )
    p.add_argument(
        "--follow-start",
        default="head",
        help="--follow, new checkpoint: head (default), oldest, a binlog file or file:pos (--start-file wins)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="--follow: metrics endpoint host")
    p.add_argument(
        "--metrics-port", type=int, default=None, help="--follow: serve /metrics on this port (0: any free port)"
    )
    p.add_argument("--report-every", type=float, default=10.0, help="--follow: seconds between report refreshes (10)")
    p.add_argument(
        "--dedupe-window",
        type=float,
        default=300.0,
        help="--follow: seconds a matched event is remembered to catch a later duplicate (300)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="--follow: re-publish (cdc repair) a missing event once the relay's checkpoint is past it",
    )
    p.add_argument("--repair-every", type=float, default=5.0, help="--follow --repair: seconds between passes (5)")
    p.add_argument(
        "--duration", type=float, default=None, help="--follow: stop after this many seconds (default: until SIGTERM)"
    )
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("repair", help="re-publish exactly the events a verify found missing")
    p.add_argument("--config", required=True)
    p.add_argument("--report", default="verify-report", help="the output directory of `cdc verify`")
    p.set_defaults(func=_cmd_repair)
    p = sub.add_parser("locate", help="binlog position/GTID <-> topic/partition/offset")
    p.add_argument("--config", required=True)
    p.add_argument("--position", help="a transaction's start file:pos, or its GTID (d-s-n, uuid:n, uuid:tag:n)")
    p.add_argument("--row", type=int, default=None, help="the event's row index in its transaction")
    p.add_argument("--topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--offset", type=int)
    p.set_defaults(func=_cmd_locate)
