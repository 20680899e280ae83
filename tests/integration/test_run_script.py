"""`./run.sh cdc ... --config relay.toml` reads a relative config path from the caller's
directory, not the repository's (issue 17)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_run_sh_cdc_resolves_a_relative_config_path_against_the_callers_directory(tmp_path):
    (tmp_path / "relay.toml").write_text('[source]\nname = "x"\n[bogus]\n')
    result = subprocess.run(
        [str(ROOT / "run.sh"), "cdc", "check", "--config", "relay.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("cdc: unknown section(s) ['bogus']"), result.stderr
