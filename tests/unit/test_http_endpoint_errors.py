"""The operator's HTTP endpoints (the relay's, and `cdc verify --follow`'s) when a client goes
away mid-response - a Prometheus scrape that timed out, a load balancer's probe: nothing on
stderr (no traceback), the server serves on. Any other handler error is one log line."""

import logging
import socket
import urllib.request

from cdc.metrics import RelayMetrics
from connectors.http_endpoint import HttpEndpoint, OperatorHTTPServer


def _fail_with(exc, server, capsys):
    try:
        raise exc
    except Exception:
        server.handle_error(socket.socket(), ("127.0.0.1", 40000))
    return capsys.readouterr().err


def test_a_client_that_went_away_is_not_an_error(capsys):
    endpoint = HttpEndpoint(RelayMetrics(), "shop")
    try:
        server = endpoint._server
        assert isinstance(server, OperatorHTTPServer)
        for exc in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset"), TimeoutError()):
            assert _fail_with(exc, server, capsys) == ""
        with urllib.request.urlopen(endpoint.url + "/healthz", timeout=5) as resp:  # still serving
            assert resp.status == 200
    finally:
        endpoint.close()


def test_another_handler_error_is_one_log_line(capsys, caplog):
    endpoint = HttpEndpoint(RelayMetrics(), "shop")
    try:
        with caplog.at_level(logging.WARNING):
            err = _fail_with(ValueError("bad"), endpoint._server, capsys)
        assert "Traceback" not in err and err == ""
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "ValueError: bad" in lines[0] and "127.0.0.1" in lines[0], lines
    finally:
        endpoint.close()
