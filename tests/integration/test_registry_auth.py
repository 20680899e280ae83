"""Issue 13: the schema registry client with a bearer token or basic auth (secrets), a
TLS CA and a client certificate, against a tiny HTTPS registry in this process (Python's
http.server behind an ssl context that requires a client certificate; certificates
generated here with `cryptography`). What the server received is what is checked:
the Authorization header, the client certificate's subject; refusals are one line
without a secret."""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cdc.config import RegistryConfig, Secret, load_config
from cdc.errors import ConfigError, RegistryError
from connectors.schema_registry.avro_serializer import ConfluentAvroSerializer, registry_client

pytestmark = [pytest.mark.integration]

TOKEN = "tok-Bearer-s3cret-51"
USER_INFO = "svc-relay:Basic-s3cret-62"
KEY_PW = "key-pass-s3cret-73"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer_name: x509.Name, issuer_key, ca: bool = False, san: bool = False):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *objs, password: bytes | None = None) -> str:
    out = b""
    for obj in objs:
        if isinstance(obj, x509.Certificate):
            out += obj.public_bytes(serialization.Encoding.PEM)
        else:
            enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
            out += obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    path.write_bytes(out)
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, _name("test-ca"), ca_key, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _cert("other-ca", other_key, _name("other-ca"), other_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _cert("registry", server_key, ca.subject, ca_key, san=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _cert("cdc-relay-client", client_key, ca.subject, ca_key)
    return {
        "ca": _write(d / "ca.pem", ca),
        "other_ca": _write(d / "other-ca.pem", other_ca),
        "server": _write(d / "server.pem", server, server_key),
        "client_cert": _write(d / "client.pem", client),
        "client_key": _write(d / "client.key", client_key),
        "client_key_enc": _write(d / "client-enc.key", client_key, password=KEY_PW.encode()),
    }


class _Registry(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []
    status = 200

    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        peer = self.connection.getpeercert() or {}
        subject = dict(x[0] for x in peer.get("subject", ()))
        self.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "authorization": self.headers.get("Authorization"),
                "client_cn": subject.get("commonName"),
            }
        )

    def do_POST(self) -> None:
        self._record()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if type(self).status != 200:
            self._answer(type(self).status, {"error_code": 40101, "message": "Unauthorized"})
        else:
            self._answer(200, {"id": 7})

    def do_GET(self) -> None:
        self._record()
        self._answer(404, {"error_code": 40401, "message": "not found"})


@pytest.fixture
def registry(pki):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server"])
    ctx.load_verify_locations(pki["ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: a client certificate signed by the CA
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    _Registry.seen, _Registry.status = [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", _Registry
    server.shutdown()
    server.server_close()


def _serializer(url: str, pki: dict, **kw) -> ConfluentAvroSerializer:
    reg = RegistryConfig(url=url, ca_file=pki["ca"], cert_file=pki["client_cert"], key_file=pki["client_key"])
    for key, value in kw.items():
        reg = RegistryConfig(**{**reg.__dict__, key: value})
    return ConfluentAvroSerializer(registry_client(reg))


def test_bearer_token_over_mutual_tls(registry, pki):
    url, handler = registry
    assert _serializer(url, pki, bearer_token=Secret(TOKEN)).schema_id("orders") == 7
    posts = [s for s in handler.seen if s["method"] == "POST"]
    assert posts and posts[0]["path"].startswith("/subjects/orders-value/versions")
    assert posts[0]["authorization"] == f"Bearer {TOKEN}"
    assert posts[0]["client_cn"] == "cdc-relay-client"


def test_basic_auth_and_a_client_key_with_a_password(registry, pki):
    url, handler = registry
    ser = _serializer(
        url, pki, basic_auth=Secret(USER_INFO), key_file=pki["client_key_enc"], key_password=Secret(KEY_PW)
    )
    assert ser.schema_id("orders") == 7
    post = next(s for s in handler.seen if s["method"] == "POST")
    assert post["authorization"] == "Basic " + base64.b64encode(USER_INFO.encode()).decode()
    assert post["client_cn"] == "cdc-relay-client"


def test_a_wrong_ca_is_refused_in_one_line_naming_the_certificate_problem(registry, pki):
    url, _handler = registry
    with pytest.raises(RegistryError) as err:
        _serializer(url, pki, ca_file=pki["other_ca"], bearer_token=Secret(TOKEN)).schema_id("orders")
    text = str(err.value)
    assert "TLS" in text and "certificate verify failed" in text and "ca_file" in text and "\n" not in text, text
    assert TOKEN not in text


def test_no_client_certificate_is_refused_by_the_registry(registry, pki):
    url, handler = registry
    reg = RegistryConfig(url=url, ca_file=pki["ca"], bearer_token=Secret(TOKEN))
    with pytest.raises(RegistryError) as err:
        ConfluentAvroSerializer(registry_client(reg)).schema_id("orders")
    assert "unreachable" in str(err.value) and TOKEN not in str(err.value)
    assert handler.seen == []  # the handshake failed: no request reached the registry


def test_a_refused_token_names_the_setting_and_never_the_token(registry, pki):
    url, handler = registry
    handler.status = 401
    with pytest.raises(RegistryError) as err:
        _serializer(url, pki, bearer_token=Secret(TOKEN)).schema_id("orders")
    text = str(err.value)
    assert "refused subject 'orders-value'" in text and "bearer_token" in text and TOKEN not in text, text


def test_a_wrong_key_password_is_a_config_error_without_the_password(pki):
    reg = RegistryConfig(
        url="https://127.0.0.1:1",
        ca_file=pki["ca"],
        cert_file=pki["client_cert"],
        key_file=pki["client_key_enc"],
        key_password=Secret("not-the-pass-99"),
    )
    with pytest.raises(ConfigError) as err:
        registry_client(reg)
    assert "schema_registry.cert_file, key_file and key_password" in str(err.value)
    assert "not-the-pass-99" not in str(err.value)


def test_registry_secrets_come_from_env_or_file_and_not_both_kinds_of_auth(tmp_path):
    base = {"source": {"name": "s"}, "outbox": {"tables": [{"schema": "d", "table": "outbox"}]}}
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    cfg = load_config(
        {
            **base,
            "schema_registry": {
                "url": "https://r:8081",
                "bearer_token_file": str(token),
                "key_password_env": "KP",
                "cert_file": "/c.pem",
            },
        },
        {"KP": KEY_PW},
    )
    assert cfg.schema_registry.bearer_token.reveal() == TOKEN and cfg.schema_registry.key_password.reveal() == KEY_PW
    assert TOKEN not in repr(cfg) and KEY_PW not in repr(cfg)
    with pytest.raises(ConfigError, match="schema_registry.bearer_token must not be written in the config file"):
        load_config({**base, "schema_registry": {"bearer_token": TOKEN}})
    with pytest.raises(ConfigError, match="set basic_auth or bearer_token, not both"):
        load_config(
            {**base, "schema_registry": {"bearer_token_env": "T", "basic_auth_env": "B"}}, {"T": TOKEN, "B": USER_INFO}
        )
    with pytest.raises(ConfigError, match="key_file / key_password need schema_registry.cert_file"):
        load_config({**base, "schema_registry": {"key_file": "/k.pem"}})
