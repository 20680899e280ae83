"""Shared fixtures. The contract is in tests/README.md: unit tests start nothing;
integration tests use the real servers below, each test with its own database and topics."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
# Hypothesis fails an example that takes longer than 200 ms (its `deadline`) and then calls
# the test flaky: a timing check, not the property under test, and on a 2-core machine shared
# with servers and other suites examples of test_gtid.py took longer (DeadlineExceeded /
# FlakyFailure in three loaded unit-tier runs, each passing alone). Speed is measured in
# bench/, not here; the number of examples is unchanged.
settings.register_profile("cdc", deadline=None)
settings.load_profile("cdc")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def mariadb():
    """One throwaway MariaDB for the session (binlog ROW/FULL/FULL, sync_binlog=1)."""
    from testbed.mariadb import EmbeddedMariaDB

    with EmbeddedMariaDB.start(server_id=1) as db:
        yield db


@pytest.fixture(scope="session")
def kafka():
    """One Kafka stand-in (librdkafka mock cluster, 3 brokers) for the session."""
    from testbed.kafka_standin import KafkaStandin

    with KafkaStandin.start(brokers=3, group_initial_rebalance_delay_ms=0) as standin:
        yield standin


@pytest.fixture
def database(mariadb):
    """A fresh database of the session server, owned by one test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    mariadb.create_database(name)
    yield name
    with mariadb.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def topic_prefix() -> str:
    """A unique prefix: the test's topics never meet another test's."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def spark():
    """A local Spark session with the project's data sources registered, one per test
    module: a verifier run that builds its own session stops the JVM's shared context at
    its end, which would leave a session-wide one dead for the modules after it."""
    from spark_jobs.session import build_spark

    session = build_spark("local[2]", "cdc-tests", {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "1g"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def noida_kafka():
    """One noida-db Kafka broker (with transactions) for the session: the transactional-
    delivery tests only (testbed/noida.py has its limits)."""
    from testbed.noida import NoidaKafka

    with NoidaKafka.start() as broker:
        yield broker


@pytest.fixture(scope="session")
def rabbitmq():
    """One throwaway RabbitMQ 3.10 node with the stream plugin for the session (testbed/rabbitmq.py):
    the RabbitMQ Streams sink's tests."""
    from testbed.rabbitmq import EmbeddedRabbitMQ

    with EmbeddedRabbitMQ.start() as node:
        yield node


@pytest.fixture(scope="session")
def rabbitmq_managed():
    """A throwaway RabbitMQ 3.10 node with the stream and management plugins for the session
    (tests/integration/rabbit_exchange.py): the RabbitMQ exchange sink's tests (`cdc check`
    reads the audit stream's bindings through the management API)."""
    from tests.integration.rabbit_exchange import ManagedRabbitMQ

    with ManagedRabbitMQ.start() as node:
        yield node


@pytest.fixture(scope="session")
def nats_server():
    """One throwaway nats-server with JetStream for the session (testbed/nats.py): the NATS
    JetStream sink's tests."""
    from testbed.nats import EmbeddedNats

    with EmbeddedNats.start() as server:
        yield server
