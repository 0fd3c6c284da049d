"""Storage limits on a real writer whose data directory is a small tmpfs: a full disk, or one that
an upload would take below ARKVORY_MIN_FREE_BYTES, is 507 `insufficient_storage` for the one-shot
upload and for upload sessions, leaves nothing partial, and uploads work again once space is back."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import uuid

import httpx
import pytest

from .harness import db_fetch

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
ARTIFACTS = "/api/v1/repositories/builds/artifacts"
UPLOADS = "/api/v1/repositories/builds/uploads"


@contextlib.contextmanager
def small_tmpfs(path, size: str = "8m"):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs as the data directory (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(path, size: int) -> None:
    with open(path, "wb") as file:
        file.write(b"\0" * size)


def leftovers(data_dir) -> list[str]:
    """Anything partial an upload could leave: temp files and session files."""
    tmp = [p.name for p in (data_dir / "tmp").iterdir() if p.name.startswith("upload-")]
    return tmp + [p.name for p in (data_dir / "uploads").iterdir()]


def test_a_full_disk_is_507_leaves_nothing_partial_and_uploads_work_once_space_is_back(cluster, database_url):
    with small_tmpfs(cluster.data_dir):
        writer = cluster.writer(ARKVORY_MIN_FREE_BYTES=str(MiB)).wait_ready()
        try:
            filler = cluster.data_dir / "filler"
            with writer.client() as client:
                assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
                fill(filler, 4 * MiB)  # about 4 MiB left, of which 1 MiB is the reserve
                # Declared too large for what is left: refused before a byte is stored.
                answer = client.post(ARTIFACTS, params={"name": "a"}, content=os.urandom(3 * MiB + MiB // 2))
                assert answer.status_code == 507 and answer.json()["code"] == "insufficient_storage", answer.text

                # Streamed without a length: noticed while writing, within a batch.
                def chunks():
                    for _ in range(14):
                        yield os.urandom(MiB // 4)

                try:
                    answer = client.post(ARTIFACTS, params={"name": "b"}, content=chunks())
                    assert answer.status_code == 507, answer.text
                except httpx.TransportError:
                    pass  # the server answered and closed while the client still sent
                # A session reserves its space at creation: refused there, not mid-upload.
                answer = client.post(UPLOADS, json={"name": "c", "size": 4 * MiB},
                                     headers={"Idempotency-Key": uuid.uuid4().hex})
                assert answer.status_code == 507 and answer.json()["code"] == "insufficient_storage"
                assert db_fetch(database_url, "SELECT 1 FROM arkvory_artifacts") == []
                assert db_fetch(database_url, "SELECT 1 FROM arkvory_uploads") == []
                assert leftovers(cluster.data_dir) == []

                filler.unlink()  # space is back
                data = os.urandom(3 * MiB)
                answer = client.post(ARTIFACTS, params={"name": "a"}, content=data)
                assert answer.status_code == 201, answer.text
                assert answer.json()["sha256"] == hashlib.sha256(data).hexdigest()
                session = client.post(UPLOADS, json={"name": "c", "size": MiB},
                                      headers={"Idempotency-Key": uuid.uuid4().hex}).json()
                part = os.urandom(MiB)
                assert client.put(f"{UPLOADS}/{session['id']}/content", content=part).status_code == 200
                assert client.post(f"{UPLOADS}/{session['id']}/complete").status_code == 201
            assert len(db_fetch(database_url, "SELECT 1 FROM arkvory_artifacts")) == 2
            assert leftovers(cluster.data_dir) == []
        finally:
            writer.kill()


def test_without_a_reserve_a_session_larger_than_the_free_space_is_507(cluster, database_url):
    """ARKVORY_MIN_FREE_BYTES=0 still never promises space the disk does not have."""
    with small_tmpfs(cluster.data_dir):
        writer = cluster.writer(ARKVORY_MIN_FREE_BYTES="0").wait_ready()
        try:
            with writer.client() as client:
                assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
                answer = client.post(UPLOADS, json={"name": "c", "size": 9 * MiB},
                                     headers={"Idempotency-Key": uuid.uuid4().hex})
                assert answer.status_code == 507 and answer.json()["code"] == "insufficient_storage"
                assert db_fetch(database_url, "SELECT 1 FROM arkvory_uploads") == []
                assert leftovers(cluster.data_dir) == []
        finally:
            writer.kill()
