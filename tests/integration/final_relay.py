"""The fault suites' last step, on any sink: a clean relay (`cdc run`) catches up to the
binlog's end now, stops cleanly, and the independent checker compares the committed
outbox inserts since `start` with everything the sink holds (read by the verifier's own
reader, which the caller passes as `records`). And what their 'recovery' crash point needs
first, on any sink: events delivered past the checkpoint (`delivered_past_checkpoint`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cdc.position import BinlogPosition
from connectors.mysql.client import binlog_end
from tests.integration.harness import RelayProcess, wait_until
from tests.integration.independent_checker import CheckResult, TopicRecord, check, committed_outbox_events


def server_end(db) -> tuple[str, int]:
    """The binlog's end now (file, position)."""
    with db.connect() as conn, conn.cursor() as cur:
        return binlog_end(cur)


def delivered_past_checkpoint(raw: dict, env: dict[str, str]) -> int:
    """The events a restarted relay's recovery scan would find past the stored checkpoint
    (cdc.recovery.Recovery over the sink's own reader, as `cdc repair` makes it): the
    'recovery' crash point is hit only when there is one."""
    from cdc.config import load_config
    from cdc.recovery import Recovery
    from cdc_cli.sinks import checkpoint_store, repair_reader

    cfg = load_config(raw, env)
    checkpoint = checkpoint_store(cfg).load()
    if checkpoint is None:
        return 0
    reader = repair_reader(cfg)
    try:
        recovery = Recovery(checkpoint, reader)
        recovery.scan_all(set(checkpoint.partitions))
        return recovery.found
    finally:
        reader.close()


def checkpoint_reached(path: Path, end: tuple[str, int]) -> bool:
    """Has the file checkpoint at `path` reached `end`?"""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    return BinlogPosition(data["file"], data["pos"]) >= BinlogPosition(*end)


def catch_up_and_check(
    db,
    database: str,
    raw: dict,
    env: dict[str, str],
    workdir: Path,
    records: Callable[[], list[TopicRecord]],
    timeout: float,
    truncated: list[tuple[str, int, int]] | None = None,
    start: str | None = None,
) -> CheckResult:
    """`records()`: everything the sink holds, read independently (it may add to
    `truncated` the partitions whose start was deleted, for the checker). `start`: the
    binlog position the committed events are counted from (default: the config's)."""
    end = server_end(db)
    final = RelayProcess(raw, env, workdir)
    try:
        wait_until(
            lambda: checkpoint_reached(Path(raw["checkpoint"]["path"]), end) or not final.alive(),
            timeout,
            f"the final relay to reach {end}",
        )
        assert final.alive(), f"final relay exited:\n{final.log_text()[-3000:]}"
        assert final.terminate() == 0
    finally:
        if final.alive():
            final.kill()
    file, pos = (start or raw["source"]["start"]).split(":")
    committed = committed_outbox_events(db.connection_settings(), database, start_file=file, start_pos=int(pos))
    return check(committed, records(), truncated)
