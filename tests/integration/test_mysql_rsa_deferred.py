"""Issue 28: `cdc run` imports PyMySQL with `cryptography` deferred
(connectors/mysql/driver.py). Against the MySQL lab (caching_sha2_password, no TLS), a
process that did so logs in with full authentication, the RSA exchange that needs
`cryptography`, then fast; `cryptography` was not loaded before the first login."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.mysql_lab.lab import MysqlLab

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_deferred_pymysql_logs_in_with_caching_sha2_full_then_fast_authentication(tmp_path):
    with MysqlLab.start(datadir=tmp_path / "data") as lab:
        code = (
            "import sys\n"
            "from connectors.mysql.driver import import_deferring_rsa\n"
            "import_deferring_rsa()\n"
            "import pymysql\n"
            "print('cryptography' in sys.modules)\n"
            "for _ in range(2):\n"
            f"    conn = pymysql.connect(host={lab.host!r}, port={lab.port}, user={lab.user!r}, "
            f"password={lab.password!r})\n"
            "    with conn.cursor() as cur:\n"
            "        cur.execute('SELECT 1')\n"
            "        print(cur.fetchall())\n"
            "    conn.close()\n"
        )
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:3] == ["False", "((1,),)", "((1,),)"]
        logins = [line for line in lab.log_lines() if "caching_sha2_password" in line]
        assert "full authentication" in logins[0] and "fast authentication" in logins[1], logins
