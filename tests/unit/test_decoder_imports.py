"""The reader process imports the binlog decoder on the way to its first event: what only
MySQL JSON columns, partial JSON updates, tagged GTIDs and compressed events need is
imported when such an event first comes, not with the decoder."""

from __future__ import annotations

import subprocess
import sys

LATER = (
    "connectors.mysql.json_diff",
    "connectors.mysql.json_binary",
    "connectors.mysql.gtid_tagged",
    "connectors.mysql.binlog_compression",
)


def test_importing_the_decoder_leaves_the_rare_features_modules_unloaded():
    code = (
        "import sys, connectors.mysql.binlog_decoder, connectors.mysql.binlog_source\n"
        f"print(sorted(m for m in {LATER!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_verifiers_modules_import_no_decoder_module():
    # The verifier reads the binlog with python-mysql-replication, a decoder independent of the
    # relay's (docs/verifier.md): none of the relay decoder's modules is loaded with it. (Its
    # opt-in `binlog_reader="fast"` imports the relay's reader when a read starts, not before.)
    code = (
        "import sys, spark_jobs.verify, spark_jobs.follow, spark_jobs.mysql.binlog_source, "
        "spark_jobs.mysql.binlog_stream, spark_jobs.mysql.binlog_compressed\n"
        "print(sorted(m for m in sys.modules if m.startswith('connectors.mysql.binlog_') "
        f"or m in {LATER!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
