"""The `cdc` command.

    cdc run     --config relay.toml   stream the binlog's outbox inserts to Kafka
    cdc check   --config relay.toml   preflight only: server settings, grants, tables, start, Kafka
    cdc adopt   --config relay.toml   take over from a stopped Debezium connector at its stored offset
    cdc demo                          embedded MariaDB + Kafka stand-in + relay + workload + verify
    cdc verify  --config verify.toml  Spark verifier: binlog vs topics, position by position
    cdc repair  --config verify.toml  re-publish exactly the events a verify found missing
    cdc locate  --config relay.toml   binlog position/GTID <-> topic/partition/offset

Exit status: 0 success; 1 the relay stopped on an error a restart may cure (Kafka, the
binlog connection, a database that does not answer at start, a lost lease); 2 a problem a person must fix (config, server set-up, a purged start
position), printed as one line per problem with the fix; 3 verification found problems.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from cdc.errors import CdcError, PreflightError, StopRequested
from cdc.secret import scrub_secrets

log = logging.getLogger("cdc")


def _cmd_run(args: argparse.Namespace) -> int:
    # First of all: a SIGTERM during start-up (imports, preflight, lease, recovery) is a
    # stop like any other, not a death by signal.
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: stop reading, drain, checkpoint", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The reader process is started before the relay's own imports and config, so that its
    # imports (the longest part of the start) run alongside them: time to the first event.
    from connectors.mysql.reader_spawn import spawn, wanted

    spawned = spawn() if wanted(args.config) else None
    from connectors.mysql.driver import import_deferring_rsa

    import_deferring_rsa()  # before anything imports PyMySQL: 10 MiB less (connectors/mysql/driver.py)
    try:
        from cdc_cli.config_file import read_config

        cfg = read_config(args.config)
    except BaseException:
        if spawned is not None:
            spawned.popen.kill()  # it waits for a spec that never comes
            spawned.popen.wait()
        raise
    feeds = None
    if cfg.source.reader == "process":
        from connectors.mysql.reader_process import ReaderProcessFeeds

        feeds = ReaderProcessFeeds(spawned=spawned)
    elif spawned is not None:  # an environment override chose the thread
        spawned.popen.kill()
        spawned.popen.wait()
    from cdc_cli.app import run_relay
    from cdc_cli.logs import configure

    configure(cfg.log.format, cfg.log.level, cfg.log.kafka_level)
    try:
        summary = run_relay(cfg, stop.is_set, check=not args.skip_check, feeds=feeds)
    except StopRequested as exc:  # a SIGTERM while the start waited on the broker: a clean stop
        log.info("%s; the next start recovers from the checkpoint", exc)
        return 0
    log.info(
        "stopped at %s: %d events published, %d dead-lettered, %d skipped as already delivered",
        summary.position,
        summary.events_published,
        summary.dead_lettered,
        summary.skipped_recovery,
    )
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from cdc_cli.config_file import read_config
    from cdc_cli.sinks import sink_check
    from connectors.mysql.preflight import CheckResult, run_checks

    cfg = read_config(args.config)
    # With a relay of this source active (it holds the lease), the replica id is its: the
    # next relay settles it when it takes the lease over.
    lease: list[CheckResult] = []
    if cfg.lease.enabled:
        from cdc.lease import lock_name
        from connectors.mysql.lease import LeaseUnknown, lease_holder

        name = lock_name(cfg.source.name)
        try:
            holder = lease_holder(name, cfg.source.connection())
            lease = [
                CheckResult(
                    "lease",
                    True,
                    f"lease {name!r} is free: `cdc run` takes it at once"
                    if holder is None
                    else f"lease {name!r} is held by connection {holder}: a relay of this source is "
                    "active; another `cdc run` waits as its standby",
                )
            ]
        except LeaseUnknown:
            lease = [
                CheckResult(
                    "lease",
                    True,
                    f"not checked: whether lease {name!r} is held cannot be asked while the MySQL login fails "
                    "(see the connect check)",
                    warn=True,  # said, not a second failure: the login's FAIL line is the one to act on
                )
            ]
    replica_id = not lease or "is free" in lease[0].message
    # Kafka first (at most kafka_check.TIMEOUT_S): a checkpoint kept in Kafka is read only
    # when Kafka answers; its lines are printed last.
    kafka = sink_check(cfg)
    if cfg.checkpoint.store == "kafka" and not all(r.ok for r in kafka if r.name == "kafka"):
        results = run_checks(cfg, replica_id=replica_id)
        results.append(
            CheckResult(
                "start_position",
                True,
                f"not checked: the checkpoint (checkpoint.topic "
                f"{cfg.checkpoint.topic!r}) cannot be read while Kafka does not answer",
                warn=True,
            )
        )
    else:
        from cdc_cli.app import checkpoint_store, start_position

        store = checkpoint_store(cfg)
        results = run_checks(cfg, start_position(cfg, store), store.load(), replica_id=replica_id)
    results += lease + kafka
    for r in results:
        print(f"{('warn' if r.warn else 'ok  ') if r.ok else 'FAIL'} {r.name}: {r.message}")
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"{len(failed)} check(s) failed", file=sys.stderr)
        return 2
    return 0


def _cmd_adopt(args: argparse.Namespace) -> int:
    from cdc_cli.adopt import cmd_adopt

    return cmd_adopt(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from cdc_cli.demo import run_demo

    return run_demo(orders=args.orders, workdir=args.workdir, verify=not args.no_verify, brokers=args.brokers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description="Binlog outbox relay to Kafka, and its verifier.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="stream outbox inserts of committed transactions to Kafka")
    p.add_argument("--config", required=True, help="relay TOML file")
    p.add_argument("--skip-check", action="store_true", help="skip the preflight checks at start")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("check", help="preflight: is the server set up for the relay?")
    p.add_argument("--config", required=True)
    p.set_defaults(func=_cmd_check)
    p = sub.add_parser("demo", help="embedded MariaDB + Kafka stand-in + relay + workload + verification")
    p.add_argument("--orders", type=int, default=2000, help="order transactions the workload writes (default 2000)")
    p.add_argument("--brokers", type=int, default=3, help="stand-in brokers (default 3)")
    p.add_argument("--workdir", default=None, help="where reports and the checkpoint go (default: var/demo)")
    p.add_argument("--no-verify", action="store_true", help="skip the Spark verification at the end")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("adopt", help="take over from a stopped Debezium MySQL connector at its stored offset")
    p.add_argument("--config", required=True, help="relay TOML file")
    p.add_argument("--debezium-connector", required=True, help="the connector's `name` in Debezium")
    p.add_argument("--debezium-server", default=None, help="its `topic.prefix` (when the store holds several)")
    p.add_argument(
        "--debezium-offsets-file", default=None, help="a FileOffsetBackingStore file (offset.storage.file.filename)"
    )
    p.add_argument("--debezium-offsets-topic", default=None, help="the Connect worker's offset.storage.topic")
    p.add_argument(
        "--topic", action="append", help="a topic Debezium wrote that the relay's routing does not produce (repeatable)"
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be adopted; write nothing")
    p.set_defaults(func=_cmd_adopt)
    try:
        from cdc_cli.verify_commands import add_parsers
    except ImportError:  # the verifier's commands are added when spark_jobs is present
        pass
    else:
        add_parsers(sub)
    return parser


class _Version(argparse.Action):
    """argparse's "version" action, asked only when used: reading the installed package's
    metadata takes 0.05-0.08 s, before `cdc run` can start its reader process."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        print(f"cdc {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cdc-outbox-relay")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


# What the verifier needs and the relay does not (pyproject.toml's `verify` extra).
_VERIFY_ONLY = ("pyspark", "pyarrow")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PreflightError as exc:
        for problem in exc.problems:
            print(f"cdc: {scrub_secrets(str(problem))}", file=sys.stderr)
        return 2
    except CdcError as exc:
        print(f"cdc: {scrub_secrets(str(exc))}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _VERIFY_ONLY:
            raise
        print(
            f"cdc: {args.command} needs the verifier's dependencies ({exc.name} is not installed): "
            "pip install 'cdc-outbox-relay[verify]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
