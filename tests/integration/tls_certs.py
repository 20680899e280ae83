"""Throwaway certificates for the TLS tests, made with `cryptography`: a CA, a server
certificate it signs (CN and SAN 127.0.0.1 and localhost), a client certificate it
signs, and a second CA that signed none of them (the "wrong CA")."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path  # client_key under `key_password`
    key_password: str
    other_ca: Path  # a CA that signed nothing here


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key, password: bytes | None = None) -> None:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    path.chmod(0o600)


def _ca(cn: str):
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key, ca_cert, cn: str, server: bool):
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key, ca_cert = _ca("cdc test CA")
    _other_key, other_cert = _ca("cdc test other CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "127.0.0.1", server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, "cdc", server=False)
    files = TlsFiles(
        directory / "ca.pem",
        directory / "server-cert.pem",
        directory / "server-key.pem",
        directory / "client-cert.pem",
        directory / "client-key.pem",
        directory / "client-key-enc.pem",
        "k3y-pass-w0rd",
        directory / "other-ca.pem",
    )
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.other_ca.write_bytes(other_cert.public_bytes(pem))
    files.server_cert.write_bytes(server_cert.public_bytes(pem))
    _write_key(files.server_key, server_key)
    files.client_cert.write_bytes(client_cert.public_bytes(pem))
    _write_key(files.client_key, client_key)
    _write_key(files.client_key_encrypted, client_key, files.key_password.encode())
    return files


def server_tls_args(files: TlsFiles, require: bool = True) -> list[str]:
    """mariadbd options: serve TLS with the generated certificate; with `require`, refuse
    every connection without TLS (require_secure_transport=ON)."""
    args = [f"--ssl-ca={files.ca}", f"--ssl-cert={files.server_cert}", f"--ssl-key={files.server_key}"]
    return args + (["--require-secure-transport=ON"] if require else [])
