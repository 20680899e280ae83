"""The relay ships without PySpark and PyArrow (pyproject.toml's `verify` extra): no module
on `cdc run` / `cdc check`'s import paths imports them, `cdc --version` answers, and a
verifier command without them is one line naming the extra, exit 2. Each check runs in a
fresh interpreter where importing pyspark or pyarrow fails, as in an install without them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = textwrap.dedent("""
    import sys

    class _NoVerifier:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pyspark", "pyarrow"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoVerifier())
""")

# What `cdc run` and `cdc check` import, eagerly or lazily, in either process.
RELAY_MODULES = [
    "cdc_cli.main",
    "cdc_cli.app",
    "cdc_cli.config_file",
    "cdc_cli.logs",
    "connectors.mysql.reader_process",
    "connectors.mysql.binlog_source",
    "connectors.mysql.binlog_decoder",
    "connectors.mysql.binlog_library",
    "connectors.mysql.binlog_compression",
    "connectors.kafka.sink",
    "connectors.kafka.reader",
    "connectors.kafka.check",
    "connectors.schema_registry.avro_serializer",
    "connectors.checkpoint_stores",
    "connectors.mysql.preflight",
    "connectors.http_endpoint",
    "connectors.mysql.lease",
    "connectors.mysql.replica_sessions",
    "cdc.relay",
    "cdc.assembly.feed",
]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_relays_modules_import_without_pyspark_or_pyarrow():
    done = _run(f"""
        import importlib
        for name in {RELAY_MODULES!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "pyarrow"))
        print("loaded:", loaded)
    """)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout


def test_the_blocker_is_real():
    done = _run("import pyspark")
    assert done.returncode != 0 and "pyspark" in done.stderr


def test_cdc_version():
    done = _run("""
        from cdc_cli.main import main
        main(["--version"])
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cdc "), done.stdout


def test_a_verifier_command_without_pyspark_is_one_line_naming_the_extra(tmp_path):
    done = _run(f"""
        from cdc_cli.main import main
        sys.exit(main(["verify", "--config", {str(tmp_path / "relay.toml")!r}]))
    """)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "[verify]" in lines[0] and "Traceback" not in done.stderr, done.stderr
