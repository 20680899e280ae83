"""Issue 13, TLS to MySQL: a mariadbd serving generated certificates with
`require_secure_transport=ON` (every connection without TLS refused), one for the module.

- verify-identity (the CA, a client certificate whose key is encrypted, its password
  from an environment variable): `cdc run` publishes (its binlog connection, lease and
  control connections all over TLS), `cdc check` passes and reports the TLS version and
  the verified certificate, `cdc verify` reads the binlog (one event seeded as missing),
  `cdc repair` re-publishes it, `cdc locate` finds an event; no secret in any output;
- a CA that did not sign the server's certificate: refused in one line naming the
  certificate problem and `source.tls.ca_file`, exit 2, by `cdc check`, `cdc run`,
  `cdc verify` and `cdc repair`;
- TLS disabled: nothing works, each command says the server wants TLS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cdc.events.identity import H_FILE, H_POS, H_ROW
from tests.integration.harness import (
    OUTBOX_DDL,
    RelayProcess,
    _to_toml,
    env_for,
    insert_events,
    read_topic,
    relay_raw_config,
    wait_until,
)
from tests.integration.tls_certs import make_tls_files, server_tls_args

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KEY_PW_ENV = "CDC_TEST_TLS_KEY_PASSWORD"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_db(tls_files):
    """A mariadbd that accepts only TLS connections."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=31, extra_args=server_tls_args(tls_files, require=True)) as db:
        yield db


def _cdc(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cdc_cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert result.returncode == 2, f"exit {result.returncode}: {text}"
    lines = [line for line in result.stderr.splitlines() if line.startswith("cdc: ")]  # (repair: progress too)
    assert len(lines) == 1, f"expected one error line, got: {result.stderr}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


class Setup:
    def __init__(self, db, kafka, tls_files, tmp_path: Path, tls: dict):
        self.db, self.files = db, tls_files
        self.database = f"t_{uuid.uuid4().hex[:10]}"
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        db.create_database(self.database)
        with db.connect(self.database, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(OUTBOX_DDL.format(name="outbox"))
        kafka.create_topic(f"{self.prefix}.order", 3)
        kafka.create_topic(f"{self.prefix}.dlq", 1)
        self.raw = relay_raw_config(
            db,
            kafka,
            self.database,
            self.prefix,
            tmp_path / "cp.json",
            source__tls=tls,
            lease__ttl_s=3,
            lease__renew_s=0.5,
        )
        self.env = {**env_for(db), KEY_PW_ENV: tls_files.key_password}
        self.config = tmp_path / "relay.toml"
        self.config.write_text(_to_toml(self.raw))
        self.tmp = tmp_path

    def events(self, n: int, start: int = 0) -> list[tuple]:
        return [
            (str(uuid.uuid4()), "order", f"k{i % 4}", "Created", json.dumps({"n": i})) for i in range(start, start + n)
        ]

    def insert(self, events: list[tuple]) -> None:
        with self.db.connect(self.database) as conn:
            insert_events(conn, "outbox", events)
            conn.commit()


def _verify_identity(files) -> dict:
    return {
        "mode": "verify-identity",
        "ca_file": str(files.ca),
        "cert_file": str(files.client_cert),
        "key_file": str(files.client_key_encrypted),
        "key_password_env": KEY_PW_ENV,
    }


@pytest.mark.spark
def test_relay_check_verify_repair_locate_work_over_verified_tls(tls_db, kafka, tls_files, tmp_path):
    s = Setup(tls_db, kafka, tls_files, tmp_path, _verify_identity(tls_files))
    secrets = (tls_db.password, tls_files.key_password)

    check = _cdc(["check", "--config", str(s.config)], s.env)
    assert check.returncode == 0, check.stdout + check.stderr
    tls_line = next(line for line in check.stdout.splitlines() if " tls: " in line)
    assert tls_line.startswith("ok   tls: TLSv1."), tls_line
    assert "certificate verified and its name matches '127.0.0.1'" in tls_line, tls_line

    published = s.events(30)
    relay = RelayProcess(s.raw, s.env, tmp_path / "relay")  # lease on: its session is a TLS one too
    try:
        s.insert(published[:15])
        s.insert(published[15:])
        topic = f"{s.prefix}.order"
        wait_until(lambda: len(read_topic(kafka.bootstrap_servers, topic)) >= 30, 90, "30 records over TLS")
    finally:
        code = relay.terminate()
    log = relay.log_text()
    assert code == 0, log
    records = read_topic(kafka.bootstrap_servers, topic)
    assert sorted(r.headers["id"] for r in records) == sorted(e[0] for e in published)

    # One event the relay never saw (it was stopped): verify finds it missing, repair publishes it.
    late = s.events(1, start=30)
    s.insert(late)
    start_file = s.raw["source"]["start"].split(":")[0]
    out = tmp_path / "verify"
    verify = _cdc(["verify", "--config", str(s.config), "--output-dir", str(out), "--start-file", start_file], s.env)
    assert verify.returncode == 3, verify.stdout + verify.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["problems"] == {"missing": 1}, report["problems"]
    repair = _cdc(["repair", "--config", str(s.config), "--report", str(out)], s.env)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "1 missing, 1 re-published" in repair.stdout, repair.stdout
    wait_until(
        lambda: late[0][0] in {r.headers["id"] for r in read_topic(kafka.bootstrap_servers, topic)},
        30,
        "the repaired event",
    )

    first = records[0]
    where = f"{first.headers[H_FILE]}:{first.headers[H_POS]}"
    locate = _cdc(["locate", "--config", str(s.config), "--position", where, "--row", first.headers[H_ROW]], s.env)
    assert locate.returncode == 0, locate.stdout + locate.stderr
    assert f"{first.topic}\t{first.partition}\t{first.offset}" in locate.stdout

    for text in (
        check.stdout + check.stderr,
        log,
        verify.stdout + verify.stderr,
        repair.stdout + repair.stderr,
        locate.stdout + locate.stderr,
        (out / "report.json").read_text(),
        (out / "report.html").read_text(),
    ):
        for secret in secrets:
            assert secret not in text


@pytest.mark.spark
def test_a_wrong_ca_is_refused_in_one_line(tls_db, kafka, tls_files, tmp_path):
    s = Setup(tls_db, kafka, tls_files, tmp_path, {**_verify_identity(tls_files), "ca_file": str(tls_files.other_ca)})
    fragments = ("the server's certificate is not trusted", "source.tls.ca_file", str(tls_files.other_ca))

    check = _cdc(["check", "--config", str(s.config)], s.env)
    assert check.returncode == 2, check.stdout + check.stderr
    fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL tls: "), check.stdout
    for fragment in fragments:
        assert fragment in fails[0]

    _one_line(_cdc(["run", "--config", str(s.config)], s.env), *fragments)
    _one_line(_cdc(["run", "--config", str(s.config), "--skip-check"], s.env), *fragments)
    _one_line(_cdc(["repair", "--config", str(s.config), "--report", str(_seed_report(s))], s.env), *fragments)
    verify = _cdc(["verify", "--config", str(s.config), "--output-dir", str(tmp_path / "v")], s.env)
    assert verify.returncode == 2 and "Traceback" not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    assert any(all(f in line for f in fragments) for line in verify.stderr.splitlines()), verify.stderr


def test_without_tls_nothing_works(tls_db, kafka, tls_files, tmp_path):
    s = Setup(tls_db, kafka, tls_files, tmp_path, {"mode": "disabled"})
    fragments = ('source.tls.mode is "disabled"', "require_secure_transport")
    check = _cdc(["check", "--config", str(s.config)], s.env)
    assert check.returncode == 2, check.stdout + check.stderr
    fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and all(f in fails[0] for f in fragments), check.stdout
    _one_line(_cdc(["run", "--config", str(s.config)], s.env), *fragments)
    _one_line(_cdc(["run", "--config", str(s.config), "--skip-check"], s.env), *fragments)
    _one_line(_cdc(["repair", "--config", str(s.config), "--report", str(_seed_report(s))], s.env), *fragments)


def _seed_report(s: Setup) -> Path:
    """A verify output directory naming one missing event (repair must read the binlog)."""
    out = s.tmp / "seeded-report"
    out.mkdir(exist_ok=True)
    (out / "missing.jsonl").write_text(
        json.dumps(
            {
                "source": s.raw["source"]["name"],
                "file": "mysql-bin.000001",
                "pos": 4,
                "row": 0,
                "gtid": None,
                "event_id": "e1",
                "expected_topic": f"{s.prefix}.order",
            }
        )
        + "\n"
    )
    return out
