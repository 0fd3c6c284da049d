"""Start-up refusals with real processes: download policy, storage identity, one writer, schema."""

from __future__ import annotations

import shutil
import urllib.parse
import uuid

import pytest

from arkvory.shared import db
from arkvory.shared.db import MAINTENANCE_LOCK

from .harness import WRITER_SHARED, db_execute, db_fetch as fetch, free_port, run_arkvory

pytestmark = pytest.mark.timeout(120)


def refuse(cluster, **env) -> tuple[int, str]:
    result = run_arkvory(cluster.base_env(**env))
    return result.returncode, result.stderr


def test_writer_saves_policy_and_gateway_starts_with_matching_numbers(cluster):
    shared = cluster.shared_env(slots=3, total=3 * 1_000_000)
    writer = cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    rows = fetch(cluster.database_url, "SELECT slots, total_bytes_per_second FROM arkvory_download_policy")
    assert [tuple(r) for r in rows] == [(3, 3_000_000)]
    with gateway.client() as client:
        ready = client.get("/health/ready").json()
    assert ready["sharedDownloads"]["slot"] == 1 and ready["sharedDownloads"]["slots"] == 3
    assert ready["transfers"]["downloads"]["bandwidth"]["bytesPerSecond"] == 1_000_000
    assert writer.proc.poll() is None


def test_gateway_before_any_policy_refuses(cluster):
    cluster.writer().wait_ready()  # standalone writer: schema and storage exist, no policy
    status, stderr = refuse(
        cluster, ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", **cluster.shared_env()
    )
    assert status == 78
    assert "no download policy" in stderr


def test_gateway_before_writer_ever_ran_refuses_and_creates_nothing(cluster):
    status, stderr = refuse(
        cluster, ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", **cluster.shared_env()
    )
    assert status == 78
    assert "start the writer first" in stderr
    assert not cluster.data_dir.exists()


def test_gateway_with_other_numbers_refuses(cluster):
    cluster.writer(cluster.shared_env(slots=3, total=3_000_000)).wait_ready()
    status, stderr = refuse(
        cluster,
        ARKVORY_ROLE="reader",
        ARKVORY_GATEWAY_SLOT="1",
        **cluster.shared_env(slots=3, total=6_000_000),
    )
    assert status == 78
    assert "requires the shared download configuration" in stderr
    assert "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND=3000000" in stderr


def test_standalone_writer_after_policy_refuses(cluster):
    writer = cluster.writer(cluster.shared_env()).wait_ready()
    writer.kill()
    status, stderr = refuse(cluster, ARKVORY_ROLE="api")
    assert status == 78
    assert "the database requires the shared download configuration" in stderr


def test_writer_with_other_numbers_refuses(cluster):
    writer = cluster.writer(cluster.shared_env(slots=3, total=3_000_000)).wait_ready()
    writer.kill()
    status, stderr = refuse(cluster, **WRITER_SHARED, **cluster.shared_env(slots=4, total=4_000_000))
    assert status == 78
    assert "the database requires the shared download configuration" in stderr
    assert "ARKVORY_GATEWAY_SLOTS=3" in stderr and "ARKVORY_GATEWAY_SLOTS=4" in stderr


def test_gateway_with_missing_storage_directory_refuses_and_creates_nothing(cluster, tmp_path):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    elsewhere = tmp_path / "no-such-storage"
    status, stderr = refuse(
        cluster, ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_DATA_DIR=str(elsewhere), **shared
    )
    assert status == 78
    assert "does not exist" in stderr and str(elsewhere) in stderr
    assert not elsewhere.exists()


def test_gateway_with_foreign_storage_refuses(cluster, tmp_path):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    foreign = tmp_path / "foreign"
    shutil.copytree(cluster.data_dir, foreign)
    (foreign / "arkvory-storage-id").write_text("00000000-0000-0000-0000-000000000000\n")
    status, stderr = refuse(
        cluster, ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_DATA_DIR=str(foreign), **shared
    )
    assert status == 78
    assert "storage id mismatch" in stderr
    assert "00000000-0000-0000-0000-000000000000" in stderr


def test_gateway_with_empty_directory_refuses_without_writing(cluster, tmp_path):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    empty = tmp_path / "empty"
    empty.mkdir()
    status, stderr = refuse(
        cluster, ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_DATA_DIR=str(empty), **shared
    )
    assert status == 78
    assert "no arkvory-storage-id" in stderr
    assert list(empty.iterdir()) == []


def test_writer_refuses_storage_of_another_database(cluster, tmp_path):
    writer = cluster.writer().wait_ready()
    writer.kill()
    (cluster.data_dir / "arkvory-storage-id").write_text("11111111-1111-1111-1111-111111111111\n")
    status, stderr = refuse(cluster, ARKVORY_ROLE="api")
    assert status == 78
    assert "storage id mismatch" in stderr


def test_second_writer_refuses(cluster):
    cluster.writer().wait_ready()
    status, stderr = refuse(cluster, ARKVORY_ROLE="api")
    assert status == 78
    assert "another Arkvory writer is already running" in stderr


def test_migrations_are_idempotent_and_recorded(cluster):
    writer = cluster.writer().wait_ready()
    writer.kill()
    cluster.writer().wait_ready()
    versions = fetch(cluster.database_url, "SELECT version FROM arkvory_schema_version ORDER BY 1")
    assert [r["version"] for r in versions] == list(range(1, db.CODE_SCHEMA_VERSION + 1))


def test_gateway_older_than_schema_reports_unavailable(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    fetch(cluster.database_url, "INSERT INTO arkvory_schema_version (version, name) VALUES (999, 'future')")
    gateway = cluster.gateway(1, shared).wait_listening()
    assert gateway.status() == (503, "unavailable")
    with gateway.client() as client:
        assert client.get("/health/ready").status_code == 503
    assert "newer than this gateway" in gateway.stderr


def test_gateways_hold_the_shared_maintenance_lock(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    exclusive = "SELECT pg_try_advisory_lock($1) AS got"

    assert fetch(cluster.database_url, exclusive, MAINTENANCE_LOCK)[0]["got"] is False
    gateway.kill()
    assert fetch(cluster.database_url, exclusive, MAINTENANCE_LOCK)[0]["got"] is True


def test_unreachable_database_exits_69_without_the_password(cluster):
    status, stderr = refuse(
        cluster, ARKVORY_DATABASE_URL="postgresql://arkvory:hunter2@127.0.0.1:1/none"
    )
    assert status == 69
    assert "cannot connect to the database" in stderr
    assert "hunter2" not in stderr


# The commands that connect first thing: a server, the worker, an admin tool, the offline init.
CONNECTING_COMMANDS = [("serve",), ("worker",), ("admin", "status"), ("admin", "init")]


@pytest.fixture
def refused_urls(cluster):
    """URLs that the running test server answers with a refusal, by kind (issue 22: they exited
    69, so the units restarted a wrong password every second for ever; they stop at 78). An
    unknown role is refused as a wrong password (SCRAM hides which roles exist)."""
    parts = urllib.parse.urlsplit(cluster.database_url)
    where, database = f"{parts.hostname}:{parts.port}", parts.path.lstrip("/")
    suffix, password = uuid.uuid4().hex[:8], uuid.uuid4().hex
    barred, outsider = f"barred_{suffix}", f"outsider_{suffix}"
    # Roles belong to the whole server: made for this test, dropped after it.
    db_execute(cluster.database_url, f"CREATE ROLE {barred} NOLOGIN PASSWORD '{password}'")
    db_execute(cluster.database_url, f"CREATE ROLE {outsider} LOGIN PASSWORD '{password}'")
    db_execute(cluster.database_url, f'REVOKE CONNECT ON DATABASE "{database}" FROM PUBLIC')
    try:
        yield {
            "InvalidPasswordError": parts._replace(netloc=f"{parts.username}:Wr0ng-hunter2@{where}").geturl(),
            "InvalidCatalogNameError": parts._replace(path=f"/no_such_db_{suffix}").geturl(),
            # "role ... is not permitted to log in": SQLSTATE 28000, as a pg_hba.conf rejection.
            "InvalidAuthorizationSpecificationError": parts._replace(netloc=f"{barred}:{password}@{where}").geturl(),
            "InsufficientPrivilegeError": parts._replace(netloc=f"{outsider}:{password}@{where}").geturl(),
        }
    finally:
        db_execute(cluster.database_url, f"DROP ROLE {barred}")
        db_execute(cluster.database_url, f"DROP ROLE {outsider}")


@pytest.mark.parametrize("command", CONNECTING_COMMANDS, ids=" ".join)
def test_a_database_that_refuses_us_exits_78_in_one_line_without_the_password(cluster, refused_urls, command):
    real_password = urllib.parse.urlsplit(cluster.database_url).password
    for error, url in refused_urls.items():
        env = cluster.base_env(ARKVORY_DATABASE_URL=url, ARKVORY_WORKER_PORT=str(free_port()))
        result = run_arkvory(env, *command)
        assert result.returncode == 78, (error, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (error, result.stderr)
        assert lines[0].startswith("arkvory: the database at postgresql://"), lines[0]
        assert f"(ARKVORY_DATABASE_URL) refuses us: {error}: " in lines[0], lines[0]
        for secret in ("hunter2", real_password, urllib.parse.urlsplit(url).password):
            assert secret not in result.stderr + result.stdout
    assert not cluster.data_dir.exists()  # nothing was created


@pytest.mark.parametrize("command", CONNECTING_COMMANDS, ids=" ".join)
def test_a_database_that_does_not_answer_still_exits_69(cluster, command):
    url = f"postgresql://arkvory:hunter2@127.0.0.1:{free_port()}/none"
    result = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL=url, ARKVORY_WORKER_PORT=str(free_port())), *command)
    assert result.returncode == 69, result.stderr
    assert "cannot connect to the database at postgresql://arkvory:***@127.0.0.1:" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_code_schema_version_is_the_highest_migration():
    from arkvory.shared import db

    assert db.CODE_SCHEMA_VERSION == db.migrations()[-1][0]
