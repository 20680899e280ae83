"""The schema registry client: the one call the relay makes of a Confluent-compatible
registry, register a schema under a subject and learn its id.

    POST {url}/subjects/{subject}/versions?normalize=False   {"schema": text}  ->  {"id": N}

Why not confluent_kafka.schema_registry's client: the reader process (which encodes)
would load it at start for this one request per topic, and it pulls in authlib, httpx2,
joserfc, cryptography and librdkafka: +38 MiB RSS and 0.3-0.6 s of imports measured in
that process (`python -X importtime`, /proc/self/status; 2026-11-26), a third of the
relay's peak memory. This client uses the standard library (urllib.request, loaded on
the first request to an HTTP registry; `mock://` never loads it).

It keeps that client's behaviour for this call (confluent-kafka 2.16.1,
schema_registry/_sync/schema_registry_client.py, `_RestClient.send_request` and
`send_http_request`), so that `[schema_registry]` means what it meant:

* `url`: a comma-separated list, tried in turn when one fails to answer or answers with a
  retriable status (408, 429, 500, 502, 503, 504); each is asked up to 1 + 3 times with a
  full-jitter back-off (base 1 s, cap 20 s); user:password in the URL is basic auth;
* TLS: `ssl.ca.location` (a file or a directory), else $SSL_CERT_FILE / $SSL_CERT_DIR,
  else certifi's bundle; a client certificate with its key and the key's password;
* `basic.auth.user.info` ("user:password"), or a static bearer token with the
  `target-sr-cluster` and `Confluent-Identity-Pool-Id` headers (Confluent Cloud);
* proxies from the environment ($HTTPS_PROXY, $NO_PROXY), no request timeout;
* a refusal is a `SchemaRegistryError` whose text is "<message> (HTTP status code N, SR
  code M)"; a connection that fails raises the transport's own exception.

`mock://NAME` is an in-process registry, as Confluent's MockSchemaRegistryClient: ids
1, 2, ... in the order new (subject, schema) pairs are registered, per client.
"""

from __future__ import annotations

import base64
import json
import os
import random
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

RETRIABLE = (408, 429, 500, 502, 503, 504)
MAX_RETRIES = 3
RETRY_WAIT_MS, RETRY_MAX_WAIT_MS = 1000, 20000
# what confluent-kafka 2.16.1 sends (its version in the client header, as it does)
CLIENT_VERSION = "python/2.16.1"


class SchemaRegistryError(Exception):
    """The registry refused a request (its HTTP status and its own error code)."""

    def __init__(self, http_status_code: int, error_code: int, error_message: str):
        super().__init__(http_status_code, error_code, error_message)
        self.http_status_code, self.error_code, self.error_message = http_status_code, error_code, error_message

    def __str__(self) -> str:
        return f"{self.error_message} (HTTP status code {self.http_status_code}, SR code {self.error_code})"


@dataclass(frozen=True)
class RegisteredSchema:
    """A subject's version, as `MockRegistry.get_latest_version` returns it."""

    schema_id: int
    subject: str
    version: int
    schema: RegisteredText


@dataclass(frozen=True)
class RegisteredText:
    schema_str: str
    schema_type: str = "AVRO"


def new_client(conf: dict[str, Any]) -> MockRegistry | RestRegistry:
    """The client for `conf` (the keys avro_serializer.registry_conf writes): the
    in-process registry for a `mock://` URL, the REST client otherwise. Raises ValueError
    / TypeError for settings it cannot use, OSError / ssl.SSLError for TLS files."""
    url = conf.get("url")
    if isinstance(url, str) and url.startswith("mock://"):
        return MockRegistry()
    return RestRegistry(conf)


class MockRegistry:
    """An in-process registry (`mock://`): what Confluent's mock client answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, list[RegisteredSchema]] = {}
        self._last_id = 0

    def register_schema(self, subject: str, schema_text: str) -> int:
        with self._lock:
            versions = self._versions.setdefault(subject, [])
            for registered in versions:
                if registered.schema.schema_str == schema_text:
                    return registered.schema_id
            self._last_id += 1
            versions.append(RegisteredSchema(self._last_id, subject, len(versions) + 1, RegisteredText(schema_text)))
            return self._last_id

    def get_latest_version(self, subject: str) -> RegisteredSchema:
        with self._lock:
            versions = self._versions.get(subject)
            if not versions:
                raise SchemaRegistryError(404, 40400, "Schema Not Found")
            return versions[-1]


class RestRegistry:
    """A Confluent-compatible registry over HTTP(S) (see the module docstring)."""

    def __init__(self, conf: dict[str, Any]):
        conf = dict(conf)
        url = conf.pop("url", None)
        if url is None:
            raise ValueError("Missing required configuration property url")
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url)}")
        self.base_urls = [u.strip().rstrip("/") for u in url.split(",")]
        for u in self.base_urls:
            if not u.startswith("http"):  # named without user:password@ (never a secret in an error)
                raise ValueError(f"Invalid url {_without_userinfo(u)}")
        self._context = _tls_context(
            conf.pop("ssl.ca.location", None),
            conf.pop("ssl.certificate.location", None),
            conf.pop("ssl.key.location", None),
            conf.pop("ssl.key.password", None),
        )
        parts = urlsplit(self.base_urls[0])
        user_info = (unquote(parts.username or ""), unquote(parts.password or ""))
        # user:password@ in a URL is sent as basic auth, never as part of the host (httpx's rule)
        self.base_urls = [_without_userinfo(u) for u in self.base_urls]
        self._headers: dict[str, str] = {"Confluent-Client-Version": CLIENT_VERSION}
        if "basic.auth.user.info" in conf:
            if user_info != ("", ""):
                raise ValueError(
                    "basic.auth.user.info configured with userinfo credentials in the URL. Remove userinfo "
                    "credentials from the url or remove basic.auth.user.info from the configuration"
                )
            pair = str(conf.pop("basic.auth.user.info")).split(":", 1)
            if len(pair) != 2:
                raise ValueError("basic.auth.user.info must be in the form of {username}:{password}")
            user_info = (pair[0], pair[1])
        if user_info != ("", ""):
            token = base64.b64encode(f"{user_info[0]}:{user_info[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        source = conf.pop("bearer.auth.credentials.source", None)
        bearer = {k: conf.pop(k) for k in list(conf) if k.startswith("bearer.auth.")}
        if source is not None:
            if source != "STATIC_TOKEN":
                raise ValueError(f"Unrecognized bearer.auth.credentials.source {source!r} (STATIC_TOKEN only here)")
            missing = [k for k in ("bearer.auth.token", "bearer.auth.logical.cluster") if k not in bearer]
            if missing:
                raise ValueError(f"Missing required bearer auth fields: {', '.join(missing)}")
            self._headers["Authorization"] = f"Bearer {bearer['bearer.auth.token']}"
            self._headers["target-sr-cluster"] = str(bearer["bearer.auth.logical.cluster"])
            if "bearer.auth.identity.pool.id" in bearer:
                self._headers["Confluent-Identity-Pool-Id"] = str(bearer["bearer.auth.identity.pool.id"])
        elif bearer:
            conf.update(bearer)
        if conf:
            raise ValueError(f"Unrecognized properties: {', '.join(conf)}")
        self._ids: dict[tuple[str, str], int] = {}
        self._opener: Any = None

    def register_schema(self, subject: str, schema_text: str) -> int:
        key = (subject, schema_text)
        schema_id = self._ids.get(key)
        if schema_id is None:
            answer = self._post(f"subjects/{quote(subject, safe='')}/versions?normalize=False", _body(schema_text))
            schema_id = self._ids[key] = int(answer["id"])
        return schema_id

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        headers = {
            **self._headers,
            "Content-Length": str(len(data)),
            "Content-Type": "application/vnd.schemaregistry.v1+json",
            "Confluent-Accept-Unknown-Properties": "true",
        }
        status, content = 0, b""
        for i, base in enumerate(self.base_urls):
            try:
                status, content = self._send(f"{base}/{path}", data, headers)
            except Exception:
                if i == len(self.base_urls) - 1:
                    raise  # no further URL to try
                continue
            if 200 <= status <= 299:
                return json.loads(content) if status != 204 and content else None
            if status not in RETRIABLE:
                break
        try:
            answer = json.loads(content)
            raise SchemaRegistryError(status, answer.get("error_code"), answer.get("message"))
        except (ValueError, KeyError, AttributeError):
            raise SchemaRegistryError(status, -1, f"Unknown Schema Registry Error: {content!r}") from None

    def _send(self, url: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """One URL, retried on a transport error or a retriable status: (status, body)."""
        import urllib.error
        import urllib.request

        if self._opener is None:
            self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._context))
        status, content = 0, b""
        for i in range(MAX_RETRIES + 1):
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with self._opener.open(request) as response:
                    status, content = response.status, response.read()
            except urllib.error.HTTPError as exc:
                status, content = exc.code, exc.read()
            except (urllib.error.URLError, OSError):
                if i >= MAX_RETRIES:
                    raise
                time.sleep(_full_jitter(i))
                continue
            if 200 <= status <= 299 or status not in RETRIABLE or i >= MAX_RETRIES:
                return status, content
            time.sleep(_full_jitter(i))
        return status, content


def _body(schema_text: str) -> dict[str, Any]:
    """What confluent-kafka's `Schema(text, "AVRO").to_dict()` posts."""
    return {"schema": schema_text, "schemaType": "AVRO", "references": []}


def _full_jitter(attempt: int) -> float:
    return random.random() * min(RETRY_WAIT_MS * 2.0**attempt, RETRY_MAX_WAIT_MS) / 1000


def _without_userinfo(url: str) -> str:
    """`url` without its `user:password@`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _tls_context(ca: Any, cert: str | None, key: str | None, password: str | None) -> ssl.SSLContext:
    """Confluent's client's context: the CA given (file or directory), else the
    environment's, else certifi's; then the client certificate."""
    if isinstance(ca, str) and os.path.isdir(ca):
        context = ssl.create_default_context(capath=ca)
    elif isinstance(ca, str):
        context = ssl.create_default_context(cafile=ca)
    elif os.environ.get("SSL_CERT_FILE"):
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    elif os.environ.get("SSL_CERT_DIR"):
        context = ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    else:
        import certifi

        context = ssl.create_default_context(cafile=certifi.where())
    if cert is not None:
        context.load_cert_chain(certfile=cert, keyfile=key, password=password)
    elif key is not None or password is not None:
        raise ValueError("ssl.certificate.location required when configuring ssl.key.location or ssl.key.password")
    return context
