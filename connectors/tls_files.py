"""A client certificate's files loaded into a TLS context, for the relay's connections to
MySQL, RabbitMQ and NATS (each says its own error lines): an encrypted key is opened with its
password, and a key that is
encrypted with no password set is an error, never OpenSSL's prompt on the terminal (which
`load_cert_chain` without a password falls back to)."""

from __future__ import annotations

import ssl


class KeyPasswordMissing(Exception):
    """The client key is encrypted and no password was given."""


def _no_password() -> bytes:
    raise KeyPasswordMissing()


def load_client_cert(context: ssl.SSLContext, cert_file: str, key_file: str, password: str) -> None:
    """`context.load_cert_chain` of the certificate and key (`key_file` "": the key is in
    `cert_file`), decrypting the key with `password` when it is encrypted. Raises
    KeyPasswordMissing for an encrypted key without a password, ssl.SSLError for a wrong
    password or files that do not match, OSError for a file that cannot be read."""
    context.load_cert_chain(cert_file, key_file or None, password=password or _no_password)


def client_cert_error(exc: BaseException, section: str, cert_file: str, key_file: str) -> str:
    """One line for a client certificate that cannot be loaded; `section` names the settings."""
    key = f"{section}.key_file {key_file}" if key_file else f"{section}.cert_file {cert_file}"
    if isinstance(exc, KeyPasswordMissing):
        return f"the client key {key} is encrypted and no password is set: set {section}.key_password_env or key_password_file"
    reason = str(exc.reason).replace("_", " ").lower() if isinstance(exc, ssl.SSLError) and exc.reason else str(exc)
    return (
        f"cannot use the client certificate {section}.cert_file {cert_file} / key_file {key_file or '(in cert_file)'}: "
        f"{reason}: give PEM files of a matching certificate and key (an encrypted key needs its password: "
        f"{section}.key_password_env or key_password_file)"
    )
