"""`[source.tls]`: parsing, secrets, validation, and what each mode hands PyMySQL;
TLS errors as one line naming the setting to fix. No server, no socket."""

from __future__ import annotations

import pickle
import ssl

import pymysql
import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from cdc.tls import TlsConfig
from connectors.mysql.client import MySQLTlsError, pymysql_args, tls_problem

BASE = {"source": {"name": "shop", "password_env": "PW"}, "outbox": {"tables": [{"schema": "s", "table": "outbox"}]}}
ENV = {"PW": "db-secret"}


def _load(tls: dict | None, env: dict | None = None, files: dict | None = None):
    raw = {**BASE, "source": {**BASE["source"], **({"tls": tls} if tls is not None else {})}}
    return load_config(raw, {**ENV, **(env or {})}, read_file=lambda p: (files or {})[p])


def test_the_default_is_preferred_and_reaches_every_connection_dict():
    cfg = _load(None)
    assert cfg.source.tls.mode == "preferred"
    conn = cfg.source.connection()
    assert conn["tls_mode"] == "preferred" and conn["password"] == "db-secret"
    assert "ssl" not in pymysql_args(conn) and "ssl_disabled" not in pymysql_args(conn)  # PyMySQL's own PREFERRED


def test_verify_identity_with_a_client_key_password_from_a_file_or_the_environment():
    tls = {
        "mode": "VERIFY_IDENTITY",
        "ca_file": "/ca.pem",
        "cert_file": "/c.pem",
        "key_file": "/k.pem",
        "key_password_file": "/run/kpw",
    }
    cfg = _load(tls, files={"/run/kpw": "kp-secret\n"})
    assert cfg.source.tls.mode == "verify-identity" and cfg.source.tls.key_password.reveal() == "kp-secret"
    assert "kp-secret" not in repr(cfg) and "kp-secret" not in str(cfg.source.tls)
    cfg = _load({**tls, "key_password_file": None, "key_password_env": "KPW"}, env={"KPW": "kp2"})
    assert cfg.source.connection()["tls_key_password"] == "kp2"
    again = TlsConfig.from_settings(pickle.loads(pickle.dumps(cfg.source.connection())))
    assert again.settings() == cfg.source.tls.settings()  # travels to the reader process and Spark


def test_environment_override_of_the_mode():
    assert _load(None, env={"CDC_SOURCE_TLS_MODE": "disabled"}).source.tls.mode == "disabled"


@pytest.mark.parametrize(
    "tls, words",
    [
        ({"mode": "sometimes"}, "source.tls.mode must be one of"),
        ({"key_password": "x"}, "source.tls.key_password must not be written in the config file"),
        ({"mode": "preferred", "cert_file": "/c.pem"}, "may connect without TLS"),
        ({"mode": "required", "ca_file": "/ca.pem"}, "does not check the server's certificate"),
        ({"mode": "required", "key_file": "/k.pem"}, "without source.tls.cert_file"),
        ({"colour": "blue"}, "unknown setting source.tls.colour"),
    ],
)
def test_bad_tls_settings_are_one_config_error(tls, words):
    with pytest.raises(ConfigError) as info:
        _load(tls)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_modes_map_to_pymysql():
    base = {"host": "db", "port": "3306", "user": "u", "passwd": "p"}
    assert pymysql_args({**base, "tls_mode": "disabled"}) == {
        "host": "db",
        "port": 3306,
        "user": "u",
        "password": b"p",  # UTF-8 bytes: PyMySQL would encode a str as latin-1
        "ssl_disabled": True,
    }
    required = pymysql_args({**base, "tls_mode": "required"})["ssl"]
    assert required.verify_mode == ssl.CERT_NONE and not required.check_hostname
    verify = pymysql_args({**base, "tls_mode": "verify-identity"})["ssl"]  # the system's CAs
    assert verify.verify_mode == ssl.CERT_REQUIRED and verify.check_hostname
    verify_ca = pymysql_args({**base, "tls_mode": "verify-ca"})["ssl"]
    assert verify_ca.verify_mode == ssl.CERT_REQUIRED and not verify_ca.check_hostname
    assert verify_ca.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_an_unreadable_ca_file_is_one_line_naming_the_setting(tmp_path):
    with pytest.raises(MySQLTlsError) as info:
        pymysql_args({"host": "db", "tls_mode": "verify-ca", "tls_ca_file": str(tmp_path / "missing.pem")})
    assert "source.tls.ca_file" in str(info.value) and "missing.pem" in str(info.value)


def _failed(original: BaseException) -> pymysql.err.OperationalError:
    exc = pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on 'db' ({original})")
    exc.original_exception = original
    return exc


def test_certificate_problems_name_the_setting():
    settings = {
        "host": "db",
        "port": 3306,
        "user": "u",
        "password": "pw",
        "tls_mode": "verify-identity",
        "tls_ca_file": "/etc/ca.pem",
    }
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_code, untrusted.verify_message = 20, "unable to get local issuer certificate"
    line = tls_problem(_failed(untrusted), settings)
    assert line == (
        "TLS to db:3306: the server's certificate is not trusted (unable to get local issuer certificate): "
        "set source.tls.ca_file (/etc/ca.pem) to the CA that signed the server's certificate"
    )
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_code, mismatch.verify_message = 62, "Hostname mismatch, certificate is not valid for 'db'."
    line = tls_problem(_failed(mismatch), settings)
    assert "does not name 'db'" in line and 'source.tls.mode = "verify-ca"' in line
    expired = ssl.SSLCertVerificationError(1, "certificate verify failed")
    expired.verify_code, expired.verify_message = 10, "certificate has expired"
    assert "has expired" in tls_problem(_failed(expired), settings)
    assert tls_problem(pymysql.err.OperationalError(3159, "insecure transport"), settings).startswith(
        "the server db:3306 accepts only TLS connections"
    )
    assert tls_problem(pymysql.err.OperationalError(1045, "Access denied"), settings) is None  # a wrong password
    assert tls_problem(pymysql.err.OperationalError(2003, "Connection refused"), settings) is None
    for text in (tls_problem(_failed(untrusted), settings), tls_problem(_failed(mismatch), settings)):
        assert "pw" not in text.replace("pwd", "")


def test_preferred_mode_builds_its_tls_context_once_per_process(monkeypatch):
    """PyMySQL's preferred mode makes a default context (the system's CA bundle loaded, ~20 ms
    CPU) on every connection although it checks no certificate; ours is built once and is
    what PyMySQL would build: TLS when offered, no certificate or name check."""
    from connectors.mysql.client import Connection

    made = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **kw: made.append(1) or real(*a, **kw))
    args = {**pymysql_args(_load(None).source.connection()), "defer_connect": True}
    contexts = {id(Connection(**args).ctx) for _ in range(5)}
    assert len(contexts) == 1 and len(made) <= 1
    ctx = Connection(**args).ctx
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    conn = Connection(**args)
    assert conn.ssl and not conn._ssl_required  # TLS when the server offers it, plain otherwise
    # a mode with checks keeps its own context (cached per settings in _context)
    strict = Connection(
        **{**pymysql_args(_load({"mode": "verify-identity"}).source.connection()), "defer_connect": True}
    )
    assert strict.ctx.check_hostname and strict.ctx is not ctx
