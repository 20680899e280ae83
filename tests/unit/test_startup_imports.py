"""Issue 28, the relay's start: what `cdc run`'s two processes import before their first
event. The reader process loads neither confluent-kafka's registry client (and its
authlib / httpx2 / joserfc) nor `cryptography`; the relay's process no `cryptography`;
PyMySQL's RSA password exchange still works, `cryptography` loaded on its first use
(connectors/mysql/driver.py). Each check runs in a fresh interpreter: what a process
imports is only seen from its start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = "('cryptography', 'confluent_kafka', 'httpx2', 'authlib', 'joserfc')"


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_reader_process_imports_no_registry_library_and_no_cryptography():
    # what connectors/mysql/reader_process.py's _child_main imports before its spec arrives, then
    # the serializer it builds and an event's registration in a mock:// registry
    code = (
        "import sys\n"
        "from connectors.mysql.driver import import_deferring_rsa\n"
        "import_deferring_rsa()\n"
        "import connectors.mysql.reader_process, connectors.mysql.binlog_decoder, connectors.mysql.binlog_source\n"
        "from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client\n"
        "assert ConfluentAvroSerializer(registry_client('mock://t')).schema_id('orders') == 1\n"
        f"print([m for m in {HEAVY} if m in sys.modules])\n"
    )
    assert _run(code) == "[]"


def test_the_relay_process_imports_no_cryptography():
    # cdc_cli/main.py's `cdc run`: the deferral, then the relay's wiring and its Kafka sink
    code = (
        "import sys\n"
        "from connectors.mysql.driver import import_deferring_rsa\n"
        "import_deferring_rsa()\n"
        "import cdc_cli.app, cdc_cli.sinks, connectors.kafka.sink, connectors.checkpoint_stores\n"
        "print([m for m in ('cryptography', 'httpx2', 'authlib') if m in sys.modules])\n"
    )
    assert _run(code) == "[]"


def test_pymysql_rsa_exchange_loads_cryptography_on_first_use_and_encrypts_as_before():
    # sha256_password / caching_sha2_password full auth without TLS: the password XOR the
    # scramble, RSA-OAEP (SHA-1) with the server's public key (pymysql/_auth.py); the
    # server's private key must read it back
    code = (
        "import sys\n"
        "from connectors.mysql.driver import import_deferring_rsa\n"
        "import_deferring_rsa()\n"
        "import pymysql._auth as auth\n"
        "before = 'cryptography' in sys.modules\n"
        "from cryptography.hazmat.primitives import hashes, serialization\n"
        "from cryptography.hazmat.primitives.asymmetric import padding, rsa\n"
        "key = rsa.generate_private_key(public_exponent=65537, key_size=2048)\n"
        "pem = key.public_key().public_bytes(serialization.Encoding.PEM, "
        "serialization.PublicFormat.SubjectPublicKeyInfo)\n"
        "salt = bytes(range(1, 21))\n"
        "sealed = auth.sha2_rsa_encrypt(b'pw-s3cret', salt, pem)\n"
        "oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)\n"
        "print(before, key.decrypt(sealed, oaep) == auth._xor_password(b'pw-s3cret\\0', salt), auth._have_cryptography)\n"
    )
    assert _run(code) == "False True True"


def test_without_cryptography_the_rsa_exchange_fails_as_pymysql_does():
    code = (
        "import sys\n"
        "from connectors.mysql.driver import import_deferring_rsa\n"
        "import_deferring_rsa()\n"
        "sys.modules['cryptography'] = None  # not installed\n"
        "import pymysql._auth as auth\n"
        "try:\n"
        "    auth.sha2_rsa_encrypt(b'pw', bytes(20), b'')\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    assert "'cryptography' package is required for sha256_password or caching_sha2_password" in _run(code)
