"""Start-up on a real SeaweedFS (SPEC §3 identity rules, §11): wrong credentials, a missing bucket
or a store that does not answer stop the writer with one line naming the setting and never the
secret; the writer creates the store's identity once and records it; a gateway or the worker
pointed at another bucket, or at a bucket that another installation's identity took over,
refuses and says which."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from arkvory.shared.storage.s3_client import IDENTITY_KEY

from .harness import db_fetch, run_arkvory

from .worker_harness import start_worker

pytestmark = [pytest.mark.timeout(180)]

EXIT_UNAVAILABLE, EXIT_REFUSED = 69, 78


def one_line(stderr: str) -> str:
    """The one line that says why (log lines before it, e.g. migrations, have a timestamp)."""
    lines = [line for line in stderr.splitlines() if line.startswith("arkvory:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_wrong_credentials_stop_the_writer_naming_the_setting_and_never_the_secret(s3_cluster):
    wrong = "Wr0ng-" + s3_cluster.secret[::-1]
    refused = run_arkvory(s3_cluster.base_env(AWS_SECRET_ACCESS_KEY=wrong))
    assert refused.returncode == EXIT_REFUSED, refused.stderr
    line = one_line(refused.stderr)
    assert line.startswith("arkvory: AWS_ACCESS_KEY_ID: the object store at ") and "refused our credentials" in line
    assert "AWS_SECRET_ACCESS_KEY" in line
    assert wrong not in refused.stderr and s3_cluster.secret not in refused.stderr
    unknown = run_arkvory(s3_cluster.base_env(AWS_ACCESS_KEY_ID="AKNOBODY00000000000"))
    assert unknown.returncode == EXIT_REFUSED and "AWS_ACCESS_KEY_ID" in one_line(unknown.stderr)
    assert s3_cluster.secret not in unknown.stderr
    assert db_fetch(s3_cluster.database_url, "SELECT * FROM arkvory_storage") == []


def test_a_missing_bucket_or_a_silent_store_stop_the_writer_in_one_line(s3_cluster, refused_url):
    missing = run_arkvory(s3_cluster.base_env(ARKVORY_STORAGE_URL="s3://no-such-bucket-here/x"))
    assert missing.returncode == EXIT_REFUSED, missing.stderr
    line = one_line(missing.stderr)
    assert line.startswith("arkvory: ARKVORY_STORAGE_URL: the bucket 'no-such-bucket-here' does not exist at http://")
    closed = refused_url()
    silent = run_arkvory(s3_cluster.base_env(ARKVORY_S3_ENDPOINT_URL=closed))
    assert silent.returncode == EXIT_UNAVAILABLE, silent.stderr
    line = one_line(silent.stderr)
    assert line.startswith(f"arkvory: ARKVORY_S3_ENDPOINT_URL: the object store at {closed} could not")
    for answer in (missing, silent):
        assert s3_cluster.secret not in answer.stderr + answer.stdout
    bad = run_arkvory(s3_cluster.base_env(AWS_SECRET_ACCESS_KEY=None))
    assert bad.returncode == 2
    assert one_line(bad.stderr) == (
        "arkvory: invalid setting AWS_SECRET_ACCESS_KEY: not set, but AWS_ACCESS_KEY_ID is; set both or neither"
    )


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_writer_creates_the_identity_once_and_other_processes_only_check_it(s3_cluster):
    shared = s3_cluster.shared_env(slots=2)
    writer = s3_cluster.writer(shared).wait_ready()
    (row,) = db_fetch(s3_cluster.database_url, "SELECT storage_id::text AS id, location FROM arkvory_storage")
    assert row["location"] == f"s3://{s3_cluster.bucket.name}/inst"
    store = s3_cluster.object_store()
    assert asyncio.run(store.read_identity()) == row["id"]
    # The worker runs beside the writer (its ARKVORY_DATA_DIR), and checks the same identity.
    worker = start_worker(s3_cluster, real=True).wait_active()
    writer.kill()
    writer = s3_cluster.writer(shared).wait_ready()  # a restart finds and keeps the identity
    assert asyncio.run(store.read_identity()) == row["id"]

    # A gateway pointed at another bucket: the database says where the blobs are.
    other = f"t-{uuid.uuid4().hex[:16]}"
    s3_cluster.bucket.store.create_bucket(other)
    try:
        elsewhere = run_arkvory(s3_cluster.base_env(
            ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_STORAGE_URL=f"s3://{other}/inst",
            ARKVORY_DATA_DIR=str(s3_cluster.workdir / "gw"), **shared,
        ))
    finally:
        s3_cluster.bucket.store.delete_bucket(other)
    assert elsewhere.returncode == EXIT_REFUSED
    assert one_line(elsewhere.stderr) == (
        f"arkvory: ARKVORY_STORAGE_URL: the database records its blobs at s3://{s3_cluster.bucket.name}/inst,"
        f" but this process has s3://{other}/inst: set ARKVORY_STORAGE_URL=s3://{s3_cluster.bucket.name}/inst"
        " (arkvory admin migrate-storage moves them)"
    )
    assert not (s3_cluster.workdir / "gw").exists()

    # The bucket's identity taken over by another installation (a recreated bucket, another
    # endpoint with the same name): a gateway and the worker refuse, naming both ids.
    intruder = str(uuid.uuid4())
    s3_cluster.put_object(IDENTITY_KEY, f"{intruder}\n".encode())
    gateway = run_arkvory(s3_cluster.base_env(
        ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_DATA_DIR=str(s3_cluster.workdir / "gw"), **shared,
    ))
    assert gateway.returncode == EXIT_REFUSED
    line = one_line(gateway.stderr)
    assert "ARKVORY_STORAGE_URL: storage id mismatch" in line and intruder in line and row["id"] in line
    worker.kill()
    again = start_worker(s3_cluster, "worker2", real=True)
    assert again.wait_exit() == EXIT_REFUSED and "storage id mismatch" in again.stderr
    # ...and a worker elsewhere than the writer's ARKVORY_DATA_DIR refuses too (it sweeps its files).
    s3_cluster.put_object(IDENTITY_KEY, f"{row['id']}\n".encode())
    away = start_worker(s3_cluster, "worker3", real=True, ARKVORY_DATA_DIR=str(s3_cluster.workdir / "away"))
    assert away.wait_exit() == EXIT_REFUSED and "is not the writer's" in away.stderr

    # A second installation (another database) on the same bucket and prefix is refused.
    second = s3_cluster.database_url.rsplit("/", 1)[0] + f"/t_{uuid.uuid4().hex[:12]}"
    from .harness import db_execute

    db_execute(s3_cluster.database_url, f"CREATE DATABASE {second.rsplit('/', 1)[1]}")
    foreign = run_arkvory(s3_cluster.base_env(ARKVORY_DATABASE_URL=second, ARKVORY_DATA_DIR=str(s3_cluster.workdir / "2")))
    assert foreign.returncode == EXIT_REFUSED
    line = one_line(foreign.stderr)
    assert f"has storage id {row['id']}, but the database has none" in line
