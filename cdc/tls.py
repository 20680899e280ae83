"""TLS to MySQL: the settings (`[source.tls]`), as a value. No I/O here: the context,
the handshake and the error lines are connectors/mysql/client.py's.

Modes, after MySQL's `--ssl-mode`:

| mode | TLS | the server's certificate |
|---|---|---|
| disabled | never | - |
| preferred (default) | when the server offers it | not checked (MySQL's default) |
| required | always (a server without TLS is refused) | not checked |
| verify-ca | always | signed by `ca_file` (or the system's CAs when empty) |
| verify-identity | always | as verify-ca, and its name (SAN) matches the host connected to |

`cert_file` / `key_file`: a client certificate for servers that require one (`REQUIRE
X509`); an encrypted key's password comes from `key_password_env` / `key_password_file`.

The settings travel as plain strings (`settings()` / `from_settings()`, keys `tls_*`)
inside the connection dict that every MySQL connection is made from: the dict pickles
(the reader process) and becomes Spark options (the verifier's executors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import ConfigError
from cdc.secret import Secret

TLS_MODES = ("disabled", "preferred", "required", "verify-ca", "verify-identity")
VERIFYING = ("verify-ca", "verify-identity")
TLS_KEYS = ("tls_mode", "tls_ca_file", "tls_cert_file", "tls_key_file", "tls_key_password")


@dataclass(frozen=True)
class TlsConfig:
    mode: str = "preferred"  # disabled | preferred | required | verify-ca | verify-identity
    ca_file: str = ""  # PEM CA bundle that signed the server's certificate ("": the system's CAs)
    cert_file: str = ""  # PEM client certificate (servers that REQUIRE X509)
    key_file: str = ""  # its private key ("": in cert_file)
    key_password: Secret = field(default_factory=lambda: Secret(""))  # an encrypted key's password

    def __post_init__(self) -> None:
        mode = str(self.mode or "").strip().lower().replace("_", "-")
        if mode not in TLS_MODES:
            raise ConfigError(f"source.tls.mode must be one of {', '.join(TLS_MODES)}, got {self.mode!r}")
        object.__setattr__(self, "mode", mode)
        if (self.cert_file or self.key_file) and mode in ("disabled", "preferred"):
            raise ConfigError(
                f"source.tls.cert_file / key_file are set but source.tls.mode is {mode!r}, which may "
                'connect without TLS: set source.tls.mode = "verify-identity" (or "required")'
            )
        if self.key_file and not self.cert_file:
            raise ConfigError("source.tls.key_file is set without source.tls.cert_file: set the client certificate too")
        if self.ca_file and mode not in VERIFYING:
            raise ConfigError(
                f"source.tls.ca_file is set but source.tls.mode is {mode!r}, which does not check the "
                'server\'s certificate: set source.tls.mode = "verify-identity" (or "verify-ca")'
            )

    @property
    def verifies(self) -> bool:
        return self.mode in VERIFYING

    @property
    def requires(self) -> bool:
        """TLS or no connection."""
        return self.mode in ("required",) + VERIFYING

    def settings(self) -> dict[str, str]:
        """The `tls_*` keys of a connection dict (the key's password revealed, as the
        account's password is there)."""
        return {
            "tls_mode": self.mode,
            "tls_ca_file": self.ca_file,
            "tls_cert_file": self.cert_file,
            "tls_key_file": self.key_file,
            "tls_key_password": self.key_password.reveal(),
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> TlsConfig:
        """The TLS settings of a connection dict (no `tls_*` keys: the default)."""
        return cls(
            mode=str(settings.get("tls_mode") or "preferred"),
            ca_file=str(settings.get("tls_ca_file") or ""),
            cert_file=str(settings.get("tls_cert_file") or ""),
            key_file=str(settings.get("tls_key_file") or ""),
            key_password=Secret(str(settings.get("tls_key_password") or "")),
        )
