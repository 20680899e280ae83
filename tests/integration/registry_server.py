"""A tiny Confluent-compatible schema registry over HTTP, for tests that need one registry
reachable from several processes (`mock://` registries are per process).

The Debezium compatibility test needs it: Debezium's AvroConverter (Java, in its own
process) and the relay's registry client must register the payload schema in the same
registry, so that both write the same schema id into the Confluent wire format.

Only what the two clients call is served, as Confluent Schema Registry answers it:

    POST /subjects/{subject}/versions   register (idempotent) -> {"id": N}
    POST /subjects/{subject}            look a schema up      -> {subject, id, version, schema} | 404 40403
    GET  /subjects/{subject}/versions/latest                  -> {subject, id, version, schema} | 404 40401
    GET  /schemas/ids/{id}                                    -> {"schema": ...} | 404 40403
    GET  /associations/...                                    -> 404 (confluent-kafka 2.16 asks, then falls back)

Ids are global and per distinct schema (compared after parsing the JSON), as in Confluent's
registry: the same schema registered under any subject gets the same id.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


def _canonical(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


class RegistryServer:
    """`with RegistryServer() as reg: reg.url` (http://127.0.0.1:PORT)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}  # canonical schema -> id
        self._schemas: dict[int, str] = {}  # id -> schema text as first registered
        self._subjects: dict[str, list[int]] = {}  # subject -> ids in version order
        self.requests: list[tuple[str, str]] = []  # (method, path) served, for tests to inspect
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_GET(self) -> None:
                registry._serve(self, "GET")

            def do_POST(self) -> None:
                registry._serve(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="registry", daemon=True)

    def __enter__(self) -> RegistryServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def subjects(self) -> dict[str, list[int]]:
        with self._lock:
            return {k: list(v) for k, v in self._subjects.items()}

    def schema(self, schema_id: int) -> str | None:
        with self._lock:
            return self._schemas.get(schema_id)

    # ------------------------------------------------------------------------- serving

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(h.path).path
        self.requests.append((method, path))
        body: dict[str, Any] = {}
        if method == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            try:
                body = json.loads(h.rfile.read(length) or b"{}")
            except ValueError:
                return self._reply(h, 422, {"error_code": 42201, "message": "request body is not JSON"})
        with self._lock:
            status, answer = self._route(method, path, body)
        self._reply(h, status, answer)

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
            if method == "POST" and isinstance(body.get("schema"), str):
                return 200, {"id": self._register(unquote(m.group(1)), body["schema"])}
        elif m := re.fullmatch(r"/subjects/([^/]+)", path):
            if method == "POST" and isinstance(body.get("schema"), str):
                subject = unquote(m.group(1))
                schema_id = self._ids.get(_canonical(body["schema"]))
                versions = self._subjects.get(subject, [])
                if schema_id is None or schema_id not in versions:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, self._version(subject, versions.index(schema_id) + 1)
        elif m := re.fullmatch(r"/subjects/([^/]+)/versions/latest", path):
            subject = unquote(m.group(1))
            if subject not in self._subjects:
                return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
            return 200, self._version(subject, len(self._subjects[subject]))
        elif m := re.fullmatch(r"/schemas/ids/(\d+)", path):
            text = self._schemas.get(int(m.group(1)))
            if text is None:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            return 200, {"schema": text}
        return 404, {"error_code": 40401, "message": f"not served here: {method} {path}"}

    def _register(self, subject: str, text: str) -> int:
        key = _canonical(text)
        schema_id = self._ids.get(key)
        if schema_id is None:
            schema_id = self._ids[key] = len(self._ids) + 1
            self._schemas[schema_id] = text
        versions = self._subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def _version(self, subject: str, version: int) -> dict[str, Any]:
        schema_id = self._subjects[subject][version - 1]
        return {"subject": subject, "id": schema_id, "version": version, "schema": self._schemas[schema_id]}

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
