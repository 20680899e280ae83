"""`cdc run` starts the reader process before its own imports and config
(connectors/mysql/reader_spawn.py): the quick look at the config file, and that the command's
module stays light enough for the child to start first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from connectors.mysql.reader_spawn import wanted

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[source]\nname = "s"\n', True),  # the default: the reader process
        ('[source]\nreader = "process"\n', True),
        ('[source]\nreader = "thread"\n', False),
        ("", True),
        ("this is = not [toml", True),  # the real read reports it; the child is stopped then
        ('source = "not a table"\n', True),
    ],
)
def test_a_quick_look_says_whether_the_config_wants_the_reader_process(tmp_path, text, expected):
    path = tmp_path / "relay.toml"
    path.write_text(text)
    assert wanted(str(path)) is expected


def test_a_missing_config_file_is_left_to_the_real_read(tmp_path):
    assert wanted(str(tmp_path / "absent.toml")) is True


def test_the_command_module_does_not_import_the_relay_before_the_reader_starts():
    # cdc_cli.main's imports and its argument parser run before `cdc run` starts the child: the relay's config
    # (and everything cdc.config pulls in) must come after, or the two do not overlap.
    code = (
        "import sys, cdc_cli.main, connectors.mysql.reader_spawn\n"
        "cdc_cli.main.build_parser()\n"
        "heavy = [m for m in ('cdc.config', 'cdc.assembly.feed', 'cdc.relay', 'confluent_kafka', 'pymysql') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
