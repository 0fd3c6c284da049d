"""Storage limits on a real writer whose data directory is a small tmpfs: a full disk, or one that
an upload would take below ARKVORY_MIN_FREE_BYTES, is 507 `insufficient_storage` for the one-shot
upload and for upload sessions, leaves nothing partial, and uploads work again once space is back."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import threading
import uuid

import httpx
import pytest

from .harness import DEFAULT_KEYS, Cluster, db_fetch

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


def test_concurrent_sessions_never_take_the_disk_below_the_reserve(database_url, tmp_path):
    """Issue 13 item 10: the free-space check and the preallocation are one step. Eight
    principals create 4 MiB sessions at once on a 24 MiB disk that must keep 8 MiB free: those
    that got 201 fit, the others are 507 with nothing left behind, and the reserve holds."""
    tokens = {f"arkvory_key_test_writer_{n}_{'0' * 20}": (f"writer{n}", ["write:builds"]) for n in range(8)}
    cluster = Cluster(database_url, tmp_path, keys={**DEFAULT_KEYS, **tokens})
    try:
        with small_tmpfs(cluster.data_dir, "24m"):
            writer = cluster.writer(
                ARKVORY_MIN_FREE_BYTES=str(8 * MiB), ARKVORY_DATABASE_POOL_SIZE="10"
            ).wait_ready()
            with writer.client() as client:
                assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
            for _ in range(5):  # a race: a few rounds make a lost one likely to show
                answers: list[httpx.Response] = []
                go = threading.Barrier(len(tokens))

                def create(token: str) -> None:
                    with writer.client(token) as own:
                        go.wait()
                        answers.append(own.post(UPLOADS, json={"name": "c", "size": 4 * MiB},
                                                headers={"Idempotency-Key": uuid.uuid4().hex}))

                threads = [threading.Thread(target=create, args=(token,)) for token in tokens]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
                statuses = sorted(a.status_code for a in answers)
                assert set(statuses) <= {201, 507} and 201 in statuses, [a.text for a in answers]
                stats = os.statvfs(cluster.data_dir)
                assert stats.f_bavail * stats.f_frsize >= 8 * MiB, statuses
                sessions = db_fetch(database_url, "SELECT id, principal_id FROM arkvory_uploads")
                assert len(sessions) == statuses.count(201)
                assert sorted(leftovers(cluster.data_dir)) == sorted(str(r["id"]) for r in sessions)
                owners = {f"key:{key_id}": token for token, (key_id, _) in tokens.items()}
                for row in sessions:
                    with writer.client(owners[row["principal_id"]]) as own:
                        assert own.delete(f"{UPLOADS}/{row['id']}").status_code == 204
            writer.kill()
    finally:
        cluster.close()
