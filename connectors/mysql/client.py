"""Every MySQL connection the project makes, from one connection dict: PyMySQL with the
source's TLS settings (`cdc/tls.py`), TLS problems as one line naming the setting to fix,
what a connection negotiated, and the statements that differ by server version.

A connection dict holds `host`, `port`, `user`, `password` (or PyMySQL's `passwd`) and
the `tls_*` keys of `TlsConfig.settings()`; any other key (`connect_timeout`,
`cursorclass`, ...) goes to PyMySQL as it is. `pymysql_args()` turns it into PyMySQL's
arguments (also python-mysql-replication's `connection_settings`); `connect()` connects.

TLS. PyMySQL sends the SSLRequest packet after the server's greeting when the server
offers CLIENT_SSL and then wraps the socket (so does the relay's binlog client, which
logs in through PyMySQL and reads the wrapped socket afterwards). The context is built
here: "preferred" is PyMySQL's own default (TLS when offered, unchecked), "required"
an unchecked context that PyMySQL insists on, "verify-ca" / "verify-identity" a context
that checks the chain against `ca_file` (and the host name). Contexts are built once per
settings (the files are read once per process).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping
from typing import Any

import pymysql

from cdc.errors import ConfigError
from cdc.server_version import ServerVersion, binlog_status_statement
from cdc.tls import TLS_KEYS, TlsConfig
from connectors.tls_files import KeyPasswordMissing, load_client_cert

# require_secure_transport=ON refusing a connection without TLS: MySQL 3159
# (ER_SECURE_TRANSPORT_REQUIRED), MariaDB 4036 (ER_SECURE_TRANSPORT_REQUIRED).
ER_SECURE_TRANSPORT_REQUIRED = (3159, 4036)
CR_SSL_CONNECTION_ERROR = 2026
ER_ACCESS_DENIED = 1045


class MySQLTlsError(ConfigError):
    """TLS to the server failed in a way only a person can fix (a certificate the
    settings refuse, a server that needs TLS or does not offer it, unreadable files)."""


def _where(settings: Mapping[str, Any]) -> str:
    return f"{settings.get('host')}:{settings.get('port')}"


@functools.lru_cache(maxsize=16)
def _context(mode: str, ca_file: str, cert_file: str, key_file: str, key_password: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # MySQL's auto-generated certificates do not pass Python 3.13's strict X.509 checks.
    ctx.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    if mode in ("verify-ca", "verify-identity"):
        ctx.check_hostname = mode == "verify-identity"
        ctx.verify_mode = ssl.CERT_REQUIRED
        if ca_file:
            try:
                ctx.load_verify_locations(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise MySQLTlsError(
                    f"cannot use source.tls.ca_file {ca_file}: {_reason(exc)}: give a PEM file "
                    "with the CA certificate(s) that signed the server's certificate"
                ) from None
        else:
            ctx.load_default_certs()
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        try:
            load_client_cert(ctx, cert_file, key_file, key_password)  # never OpenSSL's prompt
        except KeyPasswordMissing:
            raise MySQLTlsError(
                f"the client key source.tls.{'key_file ' + key_file if key_file else 'cert_file'} is "
                "encrypted and no password is set: set source.tls.key_password_env or "
                "source.tls.key_password_file"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise MySQLTlsError(
                f"cannot use the client certificate source.tls.cert_file {cert_file} / key_file "
                f"{key_file or '(in cert_file)'}: {_reason(exc)}: give PEM files of a matching "
                "certificate and key (an encrypted key needs source.tls.key_password_env or "
                "key_password_file)"
            ) from None
    return ctx


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).replace("_", " ").lower()
    return getattr(exc, "strerror", None) or str(exc)


class Connection(pymysql.connections.Connection):
    """PyMySQL's connection, every MySQL connection the project makes (the binlog readers'
    too, as python-mysql-replication's `pymysql_wrapper`). In the `preferred` TLS mode
    PyMySQL builds a default context for each connection - loading the system's CA bundle,
    ~20 ms CPU - although that mode checks no certificate; here it is built once per process,
    the same context: TLS when the server offers it, no certificate or name check."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if isinstance(sslp, dict) and not sslp:
            return _preferred_context()
        return super()._create_ssl_ctx(sslp)


@functools.cache
def _preferred_context() -> ssl.SSLContext:
    # PyMySQL 1.2.4's `_create_ssl_ctx({})`, step by step
    ctx = ssl.create_default_context()
    ctx.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def tls_args(tls: TlsConfig) -> dict[str, Any]:
    """PyMySQL's TLS arguments for `tls`."""
    if tls.mode == "disabled":
        return {"ssl_disabled": True}
    if tls.mode == "preferred":
        return {}  # PyMySQL's default: TLS when the server offers it, the certificate not checked
    return {"ssl": _context(tls.mode, tls.ca_file, tls.cert_file, tls.key_file, tls.key_password.reveal())}


def pymysql_args(settings: Mapping[str, Any]) -> dict[str, Any]:
    """PyMySQL's (and python-mysql-replication's) connection arguments from a connection
    dict: `tls_*` keys become TLS arguments, `passwd` becomes `password`."""
    args = {k: v for k, v in settings.items() if k not in TLS_KEYS and k != "passwd"}
    args["port"] = int(args.get("port") or 3306)
    password = settings.get("password", settings.get("passwd")) or ""
    # PyMySQL encodes a str password as latin-1 (pymysql/connections.py: `password.encode("latin1")`),
    # which cannot hold most characters and gives other bytes for the rest (é is one byte, not
    # UTF-8's two). The server hashed the password as its client sent it, and `mariadb` /
    # `mysql` send UTF-8: so does this, for the native and caching_sha2 scrambles, the
    # cleartext and RSA exchanges, and the replication connection (which logs in here too).
    args["password"] = password.encode("utf-8") if isinstance(password, str) else password
    args.update(tls_args(TlsConfig.from_settings(settings)))
    return args


def connect(settings: Mapping[str, Any], **overrides: Any) -> pymysql.connections.Connection:
    """A PyMySQL connection. A TLS problem raises `MySQLTlsError` (one line naming the
    setting to fix); other PyMySQL errors are raised as they are."""
    args = pymysql_args(settings)
    args.update(overrides)
    try:
        return Connection(**args)
    except pymysql.err.MySQLError as exc:
        problem = tls_problem(exc, settings)
        if problem is not None:
            raise MySQLTlsError(problem) from None
        raise


def tls_problem(exc: BaseException, settings: Mapping[str, Any]) -> str | None:
    """One line for a connection error that TLS settings caused (or a server's TLS
    demands), None for any other error. Never holds a secret."""
    tls = TlsConfig.from_settings(settings)
    where = _where(settings)
    code = exc.args[0] if isinstance(exc, pymysql.err.MySQLError) and exc.args else None
    if code in ER_SECURE_TRANSPORT_REQUIRED:
        return (
            f"the server {where} accepts only TLS connections (require_secure_transport=ON) and source.tls.mode "
            f'is {tls.mode!r}: set source.tls.mode = "verify-identity" and source.tls.ca_file to the CA of '
            "the server's certificate"
        )
    if code == ER_ACCESS_DENIED and tls.mode == "disabled":
        # MariaDB answers a connection without TLS to a require_secure_transport server so
        return (
            f'access denied for user {settings.get("user")!r} at {where} and source.tls.mode is "disabled": '
            "a server with require_secure_transport=ON refuses connections without TLS like this; set "
            'source.tls.mode = "verify-identity" with source.tls.ca_file (or check source.user and the password)'
        )
    if code == CR_SSL_CONNECTION_ERROR:
        return (
            f"the server {where} does not offer TLS and source.tls.mode is {tls.mode!r}: enable TLS on the "
            'server (ssl_cert, ssl_key), or set source.tls.mode = "preferred" (no encryption)'
        )
    original = getattr(exc, "original_exception", None) or exc.__cause__ or exc.__context__
    if isinstance(exc, ssl.SSLError):
        original = exc
    if isinstance(original, ssl.SSLCertVerificationError):
        reason = (original.verify_message or _reason(original)).rstrip(".")
        if original.verify_code == 62 or "mismatch" in reason.lower():  # X509_V_ERR_HOSTNAME_MISMATCH
            return (
                f"TLS to {where}: the server's certificate does not name {settings.get('host')!r} ({reason}): "
                'set source.host to a name the certificate holds, or source.tls.mode = "verify-ca"'
            )
        if original.verify_code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
            return f"TLS to {where}: the server's certificate has expired: renew it on the server"
        ca = (
            f"source.tls.ca_file ({tls.ca_file})" if tls.ca_file else "source.tls.ca_file (now empty: the system's CAs)"
        )
        return (
            f"TLS to {where}: the server's certificate is not trusted ({reason}): set {ca} to the CA that "
            "signed the server's certificate"
        )
    if isinstance(original, ssl.SSLError):
        return (
            f"TLS to {where} failed ({_reason(original)}): check source.tls.cert_file / key_file (the server "
            "may require a client certificate) and the server's TLS settings"
        )
    return None


def negotiated(conn: Any) -> tuple[str | None, str | None, bool]:
    """(TLS version or None when the connection is not encrypted, cipher, whether the
    server's certificate was verified) of a PyMySQL connection."""
    sock = getattr(conn, "_sock", None)
    if not isinstance(sock, ssl.SSLSocket):
        return None, None, False
    cipher = sock.cipher()
    return sock.version(), cipher[0] if cipher else None, sock.context.verify_mode == ssl.CERT_REQUIRED


def describe_tls(conn: Any, settings: Mapping[str, Any]) -> tuple[bool, bool, str]:
    """(ok, warn, line) for `cdc check`: the negotiated TLS version and whether the
    certificate was verified."""
    tls = TlsConfig.from_settings(settings)
    version, cipher, verified = negotiated(conn)
    if version is None:
        if tls.requires:  # PyMySQL refuses a connection without TLS then; never reached
            return False, False, f"the connection is not encrypted although source.tls.mode is {tls.mode!r}"
        return (
            True,
            True,
            (
                f"the connection is not encrypted (source.tls.mode = {tls.mode!r}): set source.tls.mode "
                '= "verify-identity" with source.tls.ca_file for production'
            ),
        )
    if verified:
        what = (
            "certificate verified and its name matches " + repr(settings.get("host"))
            if tls.mode == "verify-identity"
            else "certificate verified (its name not checked: verify-ca)"
        )
        return True, tls.mode != "verify-identity", f"{version} ({cipher}), server {what}"
    return (
        True,
        True,
        (
            f"{version} ({cipher}), server certificate NOT verified (source.tls.mode = {tls.mode!r}): "
            'set source.tls.mode = "verify-identity" with source.tls.ca_file for production'
        ),
    )


def binlog_end(cur: Any) -> tuple[str, int] | None:
    """(file, position) of the server's binlog end, by the statement its version takes
    (`cdc.server_version.binlog_status_statement`); None when binary logging is off."""
    cur.execute("SELECT VERSION()")
    statement = binlog_status_statement(ServerVersion.parse(str(cur.fetchone()[0])))
    cur.execute(statement)
    row = cur.fetchone()
    if not row:
        return None
    return str(row[0]), int(row[1])
