"""The file checkpoint store with real processes: a writer SIGKILLed inside its save (crash
point `checkpoint_write`, after its temporary file is written, before the rename) leaves
`checkpoint.json.<pid>.<thread>.tmp` behind; the next store to start (load) or save there
removes it, and never the temporary file of a writer still alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cdc.checkpoint import Checkpoint
from cdc.position import BinlogPosition
from connectors.checkpoint_stores import FileCheckpointStore
from tests.integration.harness import ROOT

pytestmark = pytest.mark.integration


def _killed_mid_save(path) -> int:
    """A process that dies by SIGKILL inside its save of `path`; its pid."""
    code = textwrap.dedent(f"""
        import os
        from cdc import crashpoints
        from cdc.checkpoint import Checkpoint
        from cdc.position import BinlogPosition
        from connectors.checkpoint_stores import FileCheckpointStore
        print(os.getpid(), flush=True)
        crashpoints.arm("checkpoint_write")
        FileCheckpointStore({str(path)!r}).save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 999)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return int(proc.stdout.split()[0])


def _tmp_files(path) -> set[str]:
    return {p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")}


def test_a_writer_killed_mid_save_leaves_a_tmp_that_the_next_start_or_save_removes_but_not_a_live_ones(tmp_path):
    path = tmp_path / "cp.json"
    FileCheckpointStore(path).save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 4)))
    dead = _killed_mid_save(path)
    [left] = _tmp_files(path)
    assert left.startswith(f"cp.json.{dead}."), left
    # Writers alive now: another process, and another thread of this one.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        kept = {f"cp.json.{live.pid}.1.tmp", f"cp.json.{os.getpid()}.2.tmp"}
        for name in kept:
            (tmp_path / name).write_text("{}")
        assert FileCheckpointStore(path).load() == Checkpoint("s", BinlogPosition("mysql-bin.000001", 4))
        assert _tmp_files(path) == kept, "a start removes a dead writer's leftover only"

        store = FileCheckpointStore(path)
        store.load()
        dead = _killed_mid_save(path)  # while this store runs
        assert f"cp.json.{dead}." in " ".join(_tmp_files(path))
        store.save(Checkpoint("s", BinlogPosition("mysql-bin.000001", 8)))
        assert _tmp_files(path) == kept, "a save removes a dead writer's leftover only"
    finally:
        live.kill()
        live.wait()
    assert FileCheckpointStore(path).load() == Checkpoint("s", BinlogPosition("mysql-bin.000001", 8))
