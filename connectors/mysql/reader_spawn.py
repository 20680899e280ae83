"""Starting the reader process (connectors/mysql/reader_process.py) before anything else.

The reader process's imports (the binlog decoder, the Avro serializer and its registry
client) are the longest part of the relay's start: it must start before the relay's own
imports and config, so that both run side by side. This module imports nothing of the
relay (and not multiprocessing): `cdc run` starts the child with it first of all
(cdc_cli/main.py), then hands it to `ReaderProcessFeeds`.

Two one-way pipes: transactions child -> relay (enlarged, so the child can run a few
transactions ahead instead of waiting for each to be taken), control relay -> child. A
plain `python -m` child (not multiprocessing's spawn, which would start a resource-tracker
process too and re-import the relay's main module).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SpawnedReader:
    """A reader process waiting for its spec: its pipes' relay ends as file descriptors."""

    popen: subprocess.Popen
    data_fd: int  # read end: what the child ships
    control_fd: int  # write end: the spec, "open", "close"


def spawn() -> SpawnedReader:
    data_r, data_w = os.pipe()
    control_r, control_w = os.pipe()
    _enlarge(data_r)
    popen = subprocess.Popen(
        [sys.executable, "-m", "connectors.mysql.reader_process", str(data_w), str(control_r), str(os.getpid())],
        pass_fds=(data_w, control_r),
        close_fds=True,
        cwd=os.getcwd(),
    )
    os.close(data_w)
    os.close(control_r)
    return SpawnedReader(popen, data_r, control_w)


def wanted(config_path: str) -> bool:
    """Does the config file at `config_path` ask for the reader process (`source.reader`,
    "process" by default)? A quick look before the config is read for real: a file that
    cannot be read or parsed says yes here (the real read reports it), and an environment
    override is only seen then (the relay starts or stops the child accordingly)."""
    try:
        source = tomllib.loads(Path(config_path).read_text()).get("source", {})
        return not isinstance(source, dict) or source.get("reader", "process") != "thread"
    except (OSError, ValueError):
        return True


def _enlarge(fd: int, size: int = 1 << 20) -> None:
    """Grow a pipe's buffer (Linux F_SETPIPE_SZ; up to /proc/sys/fs/pipe-max-size)."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, size)
    except (ImportError, OSError):
        pass
