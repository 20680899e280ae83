"""Without a server: `cdc check`'s reading of a JetStream stream's replicas
(connectors/nats/cluster.py), and the TLS options the verifier's sink sources get from the
relay's config (cdc_cli/verify_commands.py) and turn into a context (spark_jobs/common.py).
Against real servers: tests/integration/test_sink_tls.py, test_nats_cluster_faults.py."""

from __future__ import annotations

import ssl
from types import SimpleNamespace

import pytest

from cdc.config import load_config
from cdc.errors import ConfigError
from cdc_cli.verify_commands import sink_source_options
from connectors.nats.cluster import replica_problem
from spark_jobs.common import sink_tls_context


def _info(leader: str, replicas: list[tuple[str, bool, bool | None]], wanted: int = 3) -> SimpleNamespace:
    peers = [SimpleNamespace(name=n, current=c, offline=o, lag=None) for n, c, o in replicas]
    cluster = SimpleNamespace(leader=leader, replicas=peers)
    return SimpleNamespace(cluster=cluster, config=SimpleNamespace(name="ORDERS", num_replicas=wanted))


def test_every_replica_current_is_no_problem():
    assert replica_problem(_info("n1", [("n2", True, None), ("n3", True, None)])) is None
    single = SimpleNamespace(cluster=None, config=SimpleNamespace(name="ORDERS", num_replicas=1))
    assert replica_problem(single) is None


def test_a_replica_offline_or_behind_is_a_warning_naming_it():
    fail, text = replica_problem(_info("n1", [("n2", True, None), ("n3", False, True)]))
    assert not fail and "'ORDERS'" in text and "n3 offline" in text and "leader n1" in text
    fail, text = replica_problem(_info("n2", [("n1", True, None), ("n3", False, None)]))
    assert not fail and "n3 not current" in text
    fail, text = replica_problem(_info("n1", [("n2", True, None)]))  # one never placed
    assert not fail and "a replica not placed" in text


def test_no_leader_is_a_failure():
    fail, text = replica_problem(_info("", [("n2", False, True), ("n3", False, True)]))
    assert fail and "no leader" in text


def _cfg(kind: str, sink: dict):
    raw = {
        "source": {"name": "s", "host": "db", "user": "u", "password_env": "T_MYSQL_PW"},
        "outbox": {"tables": [{"schema": "d", "table": "outbox", "topic": "t.{aggregate_type}"}]},
        "checkpoint": {"store": "file", "path": "/tmp/cp.json"},
        "sink": {"kind": kind, kind: sink},
    }
    return load_config(raw, {"T_MYSQL_PW": "mysql-pw", "T_SINK_PW": "sink-pw"})


def test_the_verifier_gets_the_sinks_tls_files():
    files = {"ca_file": "/etc/ca.pem", "cert_file": "/etc/c.pem", "key_file": "/etc/k.pem"}
    mq = sink_source_options(_cfg("rabbitmq_stream", {"password_env": "T_SINK_PW", **files}))
    assert mq["tls"] == "true" and all(mq[k] == v for k, v in files.items())
    assert sink_source_options(_cfg("rabbitmq_stream", {"password_env": "T_SINK_PW"}))["tls"] == "false"
    nats = sink_source_options(_cfg("nats_jetstream", {"servers": ["nats://n:4222"], "ca_file": "/etc/ca.pem"}))
    assert nats["ca_file"] == "/etc/ca.pem" and "cert_file" not in nats


def test_the_sources_context_checks_the_name_and_says_which_file_is_wrong(tmp_path):
    assert sink_tls_context("cdc_nats", {}) is None
    context = sink_tls_context("cdc_rabbitmq", {}, on=True)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    with pytest.raises(RuntimeError, match=r"^cdc_nats: the TLS files cannot be used .*check ca_file"):
        sink_tls_context("cdc_nats", {"ca_file": str(tmp_path / "none.pem")})


@pytest.fixture(scope="module")
def key_files(tmp_path_factory):
    from tests.integration.tls_certs import make_tls_files

    return make_tls_files(tmp_path_factory.mktemp("keys"))


@pytest.mark.parametrize("kind", ["rabbitmq_stream", "rabbitmq_exchange", "nats_jetstream"])
def test_an_encrypted_keys_password_is_a_secret_setting_of_each_sink(kind):
    files = {"cert_file": "/etc/c.pem", "key_file": "/etc/k.pem", "key_password_env": "T_SINK_PW"}
    extra = {"servers": ["nats://n:4222"]} if kind == "nats_jetstream" else {}
    cfg = _cfg(kind, {**extra, **files})
    sink = getattr(cfg.sink, kind)
    assert sink.key_password.reveal() == "sink-pw" and "sink-pw" not in repr(sink)
    options = sink_source_options(cfg)
    assert options["key_password"] == "sink-pw"  # the verifier's source option (its reports redact it)
    assert "key_password" not in sink_source_options(_cfg(kind, {**extra, "cert_file": "/c", "key_file": "/k"}))
    with pytest.raises(ConfigError, match=f"^sink.{kind}.key_password is the password of key_file") as info:
        _cfg(kind, {**extra, "key_password_env": "T_SINK_PW"})
    assert "\n" not in str(info.value) and "sink-pw" not in str(info.value)


def test_the_relays_client_key_opens_with_its_password_and_without_one_is_one_line(key_files):
    from connectors.tls_files import KeyPasswordMissing, client_cert_error, load_client_cert

    cert, key, password = str(key_files.client_cert), str(key_files.client_key_encrypted), key_files.key_password
    load_client_cert(ssl.create_default_context(), cert, key, password)
    load_client_cert(ssl.create_default_context(), cert, str(key_files.client_key), "")  # a plain key
    with pytest.raises(KeyPasswordMissing) as missing:  # not OpenSSL's prompt on the terminal
        load_client_cert(ssl.create_default_context(), cert, key, "")
    text = client_cert_error(missing.value, "sink.nats_jetstream", cert, key)
    assert text == (
        f"the client key sink.nats_jetstream.key_file {key} is encrypted and no password is set: "
        "set sink.nats_jetstream.key_password_env or key_password_file"
    )
    with pytest.raises(ssl.SSLError) as wrong:
        load_client_cert(ssl.create_default_context(), cert, key, "not-" + password)
    text = client_cert_error(wrong.value, "sink.rabbitmq_stream", cert, key)
    assert text.startswith(
        f"cannot use the client certificate sink.rabbitmq_stream.cert_file {cert} / key_file {key}: "
    )
    assert "key_password_env" in text and "\n" not in text and password not in text


def test_the_sources_open_an_encrypted_key_with_the_key_password_option(key_files):
    options = {"ca_file": str(key_files.ca), "cert_file": str(key_files.client_cert)}
    options["key_file"] = str(key_files.client_key_encrypted)
    assert sink_tls_context("cdc_nats", {**options, "key_password": key_files.key_password}) is not None
    with pytest.raises(RuntimeError, match=r"^cdc_rabbitmq: the client key .* is encrypted and no password is set"):
        sink_tls_context("cdc_rabbitmq", options)
    with pytest.raises(RuntimeError, match=r"^cdc_nats: the TLS files cannot be used .*key_password"):
        sink_tls_context("cdc_nats", {**options, "key_password": "wrong"})
