"""connectors/schema_registry/client.py, the registry client that replaced confluent-kafka's in
issue 28: what it sends and how it answers refusals, failures and several URLs, as
confluent-kafka 2.16.1's client did, over a recording opener (no socket; the HTTPS
registry with auth and mutual TLS is tests/integration/test_registry_auth.py)."""

from __future__ import annotations

import base64
import io
import json
import urllib.error

import pytest

from connectors.schema_registry import client as schema_registry
from connectors.schema_registry.client import MockRegistry, RestRegistry, SchemaRegistryError, new_client

SCHEMA = '{"type":"record","name":"E","fields":[]}'


class _Opener:
    """Answers each request with the next of `answers`: (status, body dict) or an exception."""

    def __init__(self, *answers):
        self.answers, self.requests = list(answers), []

    def open(self, request):
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        data = json.dumps(body).encode()
        if status >= 400:
            raise urllib.error.HTTPError(request.full_url, status, "refused", {}, io.BytesIO(data))
        response = io.BytesIO(data)
        response.status = status  # type: ignore[attr-defined]
        return response


def _client(conf, *answers):
    client = RestRegistry(conf)
    client._opener = _Opener(*answers)
    return client, client._opener


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(schema_registry, "_full_jitter", lambda attempt: 0.0)


def test_registers_with_confluents_request_and_remembers_the_id():
    client, opener = _client({"url": "https://reg:8081/"}, (200, {"id": 42}))
    assert client.register_schema("orders/eu-value", SCHEMA) == 42
    assert client.register_schema("orders/eu-value", SCHEMA) == 42  # asked once
    (request,) = opener.requests
    assert request.full_url == "https://reg:8081/subjects/orders%2Feu-value/versions?normalize=False"
    assert request.get_method() == "POST"
    assert json.loads(request.data) == {"schema": SCHEMA, "schemaType": "AVRO", "references": []}
    headers = {k.lower(): v for k, v in request.header_items()}
    assert headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    assert headers["confluent-client-version"] == "python/2.16.1"
    assert "authorization" not in headers


def test_bearer_token_headers_and_basic_auth_from_the_url():
    conf = {
        "url": "https://reg",
        "bearer.auth.credentials.source": "STATIC_TOKEN",
        "bearer.auth.token": "tok",
        "bearer.auth.logical.cluster": "lsrc-1",
        "bearer.auth.identity.pool.id": "pool-9",
    }
    client, opener = _client(conf, (200, {"id": 1}))
    client.register_schema("s", SCHEMA)
    headers = {k.lower(): v for k, v in opener.requests[0].header_items()}
    assert headers["authorization"] == "Bearer tok"
    assert headers["target-sr-cluster"] == "lsrc-1" and headers["confluent-identity-pool-id"] == "pool-9"
    client, opener = _client({"url": "https://u%40x:p%3Aw@reg"}, (200, {"id": 1}))
    client.register_schema("s", SCHEMA)
    headers = {k.lower(): v for k, v in opener.requests[0].header_items()}
    assert opener.requests[0].full_url == "https://reg/subjects/s/versions?normalize=False"  # no user:password
    assert headers["authorization"] == "Basic " + base64.b64encode(b"u@x:p:w").decode()


def test_a_refusal_is_the_registrys_message_status_and_code():
    client, opener = _client({"url": "https://reg"}, (409, {"error_code": 409, "message": "incompatible"}))
    with pytest.raises(SchemaRegistryError) as err:
        client.register_schema("s", SCHEMA)
    assert str(err.value) == "incompatible (HTTP status code 409, SR code 409)"
    assert err.value.http_status_code == 409 and len(opener.requests) == 1  # not retried


def test_a_retriable_status_is_asked_four_times_then_the_next_url():
    busy = (503, {"error_code": 50301, "message": "busy"})
    client, opener = _client({"url": "https://a, https://b"}, busy, busy, busy, busy, (200, {"id": 5}))
    assert client.register_schema("s", SCHEMA) == 5
    assert [r.host for r in opener.requests] == ["a"] * 4 + ["b"]


def test_a_connection_failure_is_retried_then_raised_from_the_last_url():
    down = urllib.error.URLError(ConnectionRefusedError(111, "refused"))
    client, opener = _client({"url": "https://a,https://b"}, *[down] * 8)
    with pytest.raises(urllib.error.URLError):
        client.register_schema("s", SCHEMA)
    assert [r.host for r in opener.requests] == ["a"] * 4 + ["b"] * 4


def test_settings_it_cannot_use_are_refused_as_confluents_client_refused_them():
    with pytest.raises(ValueError, match="Invalid url"):
        RestRegistry({"url": "ftp://reg"})
    with pytest.raises(ValueError, match="basic.auth.user.info must be in the form"):
        RestRegistry({"url": "https://reg", "basic.auth.user.info": "nocolon"})
    with pytest.raises(ValueError, match="userinfo credentials in the URL"):
        RestRegistry({"url": "https://u:p@reg", "basic.auth.user.info": "a:b"})
    with pytest.raises(ValueError, match="Unrecognized properties: nope"):
        RestRegistry({"url": "https://reg", "nope": 1})
    with pytest.raises(ValueError, match="ssl.certificate.location required"):
        RestRegistry({"url": "https://reg", "ssl.key.location": "/k.pem"})


def test_mock_ids_count_new_subject_schema_pairs_as_confluents_mock():
    client = new_client({"url": "mock://m"})
    assert isinstance(client, MockRegistry)
    assert client.register_schema("a-value", SCHEMA) == 1
    assert client.register_schema("b-value", SCHEMA) == 2  # another subject: a new id
    assert client.register_schema("a-value", SCHEMA) == 1
    assert client.register_schema("a-value", '"string"') == 3
    latest = client.get_latest_version("a-value")
    assert (latest.schema_id, latest.version, latest.schema.schema_str) == (3, 2, '"string"')
    with pytest.raises(SchemaRegistryError, match="Schema Not Found"):
        client.get_latest_version("c-value")
    assert new_client({"url": "mock://m"}).register_schema("b-value", SCHEMA) == 1  # per client


def test_a_refused_url_never_shows_its_password():
    with pytest.raises(ValueError, match="Invalid url") as refused:
        RestRegistry({"url": "https://ok.example, ftp://alice:s3cr3t-pw@reg.example:8081"})
    assert "s3cr3t-pw" not in str(refused.value) and "reg.example:8081" in str(refused.value)
