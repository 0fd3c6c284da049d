"""`arkvory admin migrate-storage` (SPEC §11) on a real SeaweedFS with real processes: a migration
from the directory to the store that is killed midway resumes where it stopped; after it every
artifact downloads byte-exact from the store; the way back to a directory (after the old copy was
removed as the output says) leaves every artifact byte-exact again; and it refuses while a
process holds a lease, saying which."""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import sys

import pytest

from arkvory.shared.storage.s3 import blob_key

from .harness import ROOT, db_fetch, run_arkvory


pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

KiB = 1024
REPO = "builds"
ON_DISK = {"ARKVORY_STORAGE_URL": "file:", "ARKVORY_S3_ENDPOINT_URL": None, "ARKVORY_S3_REGION": None}


def location(cluster) -> str:
    return db_fetch(cluster.database_url, "SELECT location FROM arkvory_storage")[0]["location"]


def stop(process) -> None:
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0


def check_all(process, artifacts: dict[str, bytes]) -> None:
    with process.client(timeout=30) as client:
        for artifact_id, data in artifacts.items():
            answer = client.get(f"/api/v1/repositories/{REPO}/artifacts/{artifact_id}/content")
            assert answer.status_code == 200 and answer.content == data, artifact_id


def test_migrate_refuses_while_a_lease_is_held_resumes_after_a_kill_and_goes_there_and_back(s3_cluster):
    writer = s3_cluster.writer(**ON_DISK).wait_ready()  # standalone: no lease to wait out on restarts
    contents = [os.urandom(size) for size in [200 * KiB] * 24 + [3 * 1024 * KiB, 0]]
    artifacts = {}
    with writer.client(timeout=30) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        for index, data in enumerate(contents):
            made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": f"a{index}"}, content=data)
            assert made.status_code == 201, made.text
            artifacts[made.json()["id"]] = data
    bucket_url = f"s3://{s3_cluster.bucket.name}/{s3_cluster.prefix}"
    env = s3_cluster.base_env()  # the store's settings; ARKVORY_STORAGE_URL is not what it reads

    stop(writer)

    # Killed after its first blob: nothing is switched, and the next run continues.
    first = subprocess.Popen(
        [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "migrate-storage", "--to", bucket_url],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert first.stdout.readline().startswith("migrating 26 blobs")
        assert " 1/26 blobs" in first.stdout.readline()
        first.kill()
    finally:
        first.wait(10)
        first.stdout.close()
        first.stderr.close()
    assert location(s3_cluster) == "file:"
    copied_before = sum(1 for key in s3_cluster.object_keys() if key.startswith("blobs/"))
    assert 1 <= copied_before

    resumed = run_arkvory(env, "admin", "migrate-storage", "--to", bucket_url)
    assert resumed.returncode == 0, resumed.stderr
    summary = resumed.stdout.splitlines()
    switched = next(line for line in summary if line.startswith("switched:"))
    copied, present = (int(word) for word in switched.split(";")[1].split() if word.isdigit())
    assert present >= copied_before and copied + present == 26, switched
    assert location(s3_cluster) == bucket_url
    assert sum(1 for key in s3_cluster.object_keys() if key.startswith("blobs/")) == 26
    assert f"now set ARKVORY_STORAGE_URL={bucket_url}, with the same ARKVORY_S3_ENDPOINT_URL" in resumed.stdout
    advice = next(line for line in summary if line.startswith("the old copy is left in "))
    assert (s3_cluster.data_dir / "blobs").is_dir()  # left in place until the operator removes it

    writer = s3_cluster.writer().wait_ready()  # now on the store
    check_all(writer, artifacts)
    stop(writer)
    again = run_arkvory(env, "admin", "migrate-storage", "--to", bucket_url)
    assert again.returncode == 0 and "already" in again.stdout

    # Back to a directory, after removing the old copy as the advice says.
    command = shlex.split(advice.split("remove it with: ", 1)[1])
    assert command[:2] == ["rm", "-r"] and command[2] == str(s3_cluster.data_dir / "blobs")
    subprocess.run(command, check=True)
    back = run_arkvory(env, "admin", "migrate-storage", "--to", "file:")
    assert back.returncode == 0, back.stderr
    assert "26 blobs copied, 0 were there already" in back.stdout
    # Every step of the move back, not only the URL: the S3 settings and the cache go, and every
    # process shares the one directory.
    for step in (
        "set ARKVORY_STORAGE_URL=file: (or remove it)",
        "remove ARKVORY_S3_ENDPOINT_URL, ARKVORY_S3_REGION and the AWS_* keys",
        "set ARKVORY_CACHE_MAX_BYTES=0",
        f"the one storage directory, ARKVORY_DATA_DIR={s3_cluster.data_dir}",
    ):
        assert step in back.stdout, back.stdout
    assert location(s3_cluster) == "file:"
    for data in contents:
        digest = hashlib.sha256(data).hexdigest()
        assert (s3_cluster.data_dir / "blobs" / "sha256" / digest[:2] / digest[2:4] / digest).read_bytes() == data
    assert not any(p.name.startswith("upload-migrate") for p in (s3_cluster.data_dir / "tmp").iterdir())
    # A process holding a lease: refused, saying which, and nothing changes.
    writer = s3_cluster.writer(s3_cluster.shared_env(slots=2), **ON_DISK).wait_ready()
    check_all(writer, artifacts)
    refused = run_arkvory(env, "admin", "migrate-storage", "--to", bucket_url)
    assert refused.returncode == 75, refused.stderr
    assert "refusing to migrate the storage while servers are up" in refused.stderr
    assert f"slot 0 (pid {writer.proc.pid} on " in refused.stderr
    assert location(s3_cluster) == "file:"


def test_a_bad_target_is_a_usage_error_naming_it_and_nothing_is_touched(s3_cluster):
    env = s3_cluster.base_env()
    bad = run_arkvory(env, "admin", "migrate-storage", "--to", "s3://No_Such..Bucket")
    assert bad.returncode == 2 and bad.stderr.startswith("arkvory: invalid setting --to: expected a bucket name")
    env.pop("AWS_SECRET_ACCESS_KEY")
    half = run_arkvory(env, "admin", "migrate-storage", "--to", f"s3://{s3_cluster.bucket.name}")
    assert half.returncode == 2 and "AWS_SECRET_ACCESS_KEY: not set, but AWS_ACCESS_KEY_ID is" in half.stderr
    assert s3_cluster.secret not in bad.stderr + half.stderr
    assert s3_cluster.object_keys() == []


def test_a_corrupt_or_short_object_at_the_source_is_reported_and_nothing_is_switched(s3_cluster):
    """A short object used to stop the run as a store that does not answer (exit 69, "run it
    again"), on every run: it is a corrupt blob, reported with the others (exit 1)."""
    writer = s3_cluster.writer().wait_ready()
    contents = [os.urandom(100 * KiB) for _ in range(3)]
    with writer.client(timeout=30) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        for index, data in enumerate(contents):
            made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": f"a{index}"}, content=data)
            assert made.status_code == 201, made.text
    stop(writer)
    bucket_url = location(s3_cluster)
    corrupt, short = (hashlib.sha256(data).hexdigest() for data in contents[:2])
    s3_cluster.put_object(blob_key(corrupt), os.urandom(100 * KiB))  # same size, other bytes
    s3_cluster.put_object(blob_key(short), b"")  # cut short: a ranged GET of it answers 416
    moved = run_arkvory(s3_cluster.base_env(), "admin", "migrate-storage", "--to", "file:")
    assert moved.returncode == 1, moved.stderr
    assert f"{corrupt}: corrupt in {bucket_url}" in moved.stderr
    assert f"{short}: corrupt in {bucket_url} (0 bytes, not {100 * KiB})" in moved.stderr
    assert "nothing was switched" in moved.stderr
    assert location(s3_cluster) == bucket_url
    blobs = s3_cluster.data_dir / "blobs" / "sha256"
    for digest in (corrupt, short):
        assert not (blobs / digest[:2] / digest[2:4] / digest).exists()  # no bad copy at the target
