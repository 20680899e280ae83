"""PyMySQL, imported with its RSA password exchange loaded on first use.

PyMySQL's `_auth` module imports `cryptography` at import time (pymysql/_auth.py, 1.2.4),
yet uses it in one function only, `sha2_rsa_encrypt`: the password encrypted with the
server's RSA key for `caching_sha2_password` / `sha256_password` over a connection
without TLS (MySQL manual, "Caching SHA-2 Pluggable Authentication"). Every relay process
paid for it at start: +10 MiB RSS and ~0.08 s each (measured 2026-11-26, /proc/self/status
around `import pymysql`), whatever the server's authentication.

`import_deferring_rsa()` imports PyMySQL (and through it python-mysql-replication, which
imports PyMySQL) with `cryptography` hidden, then wraps `sha2_rsa_encrypt` so that its
first call imports `cryptography` and gives `_auth` the names its own import would have
bound: authentication behaves exactly as before, the RSA exchange included (and without
`cryptography` installed it raises PyMySQL's own RuntimeError, as before).
`cdc run` calls it first thing in each of its two processes; anywhere else PyMySQL is
imported as usual.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_lock = threading.Lock()


def import_deferring_rsa() -> None:
    """Import PyMySQL without `cryptography` (see the module docstring); a no-op when
    PyMySQL or `cryptography` is imported already."""
    with _lock:
        if "pymysql" in sys.modules or "cryptography" in sys.modules:
            return
        sys.modules["cryptography"] = None  # type: ignore[assignment]  # `import cryptography...` raises ImportError
        try:
            import pymysql._auth as auth
        finally:
            del sys.modules["cryptography"]
        auth.sha2_rsa_encrypt = _rsa_on_first_use(auth, auth.sha2_rsa_encrypt)


def _rsa_on_first_use(auth: Any, encrypt: Any) -> Any:
    def sha2_rsa_encrypt(password: bytes, salt: bytes, public_key: bytes) -> bytes:
        if not auth._have_cryptography:
            try:  # the names pymysql/_auth.py binds at its import
                from cryptography.hazmat.backends import default_backend
                from cryptography.hazmat.primitives import hashes, serialization
                from cryptography.hazmat.primitives.asymmetric import padding
            except ImportError:
                pass  # `encrypt` raises PyMySQL's RuntimeError naming the package
            else:
                auth.default_backend, auth.hashes = default_backend, hashes
                auth.serialization, auth.padding = serialization, padding
                auth._have_cryptography = True
        return encrypt(password, salt, public_key)

    return sha2_rsa_encrypt
