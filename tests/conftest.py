"""Fixtures: one real PostgreSQL server per test session, a fresh database per test, real
`arkvory serve` processes (tests/harness.py) and a TCP proxy to cut them off the database.

A run leaves nothing large behind: the session server's data is deleted when it stops, pytest
deletes the tmp dirs of passing tests (`tmp_path_retention_policy = "failed"`), and as root the
PostgreSQL data that lived outside those tmp dirs (localpg's shelf) goes with them.
"""

from __future__ import annotations

import uuid

import pytest

from arkvory.shared.cli.localpg import remove_orphaned_homes, start_local_postgres

from .harness import Cluster
from .tcpproxy import TcpProxy


@pytest.fixture(scope="session", autouse=True)
def _no_orphaned_postgres_data():
    yield
    remove_orphaned_homes()  # after every test's tmp_path teardown


@pytest.fixture(scope="session")
def postgres(tmp_path_factory, _no_orphaned_postgres_data):
    server = start_local_postgres(tmp_path_factory.mktemp("pg"), fsync=False)
    yield server
    server.destroy()


@pytest.fixture
def database_url(postgres) -> str:
    return postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")


@pytest.fixture
def cluster(database_url, tmp_path):
    group = Cluster(database_url, tmp_path)
    yield group
    group.close()


@pytest.fixture
def db_proxy(database_url):
    proxy = TcpProxy.for_url(database_url)
    proxy.start()
    yield proxy
    proxy.stop()
