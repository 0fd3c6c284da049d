"""Cleanup against uploads and downloads at the worst moments (writer/blobs/locks.py,
shared/cluster/pins.py): an upload reusing an old unreferenced blob while cleanup deletes it, a download
whose artifact is deleted and collected while it waits to open the blob, and a referenced blob
missing on disk. Real writer and gateway processes; cleanup runs in the test against the same
database and storage directory, over and over, with a zero grace period.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import random
import threading
import time

import asyncpg
import httpx
import pytest

from arkvory.shared.storage import Storage
from arkvory.writer.maintenance import cleanup
from arkvory.writer.blobs.locks import DIGEST_NAMESPACE, digest_key
from arkvory.writer.maintenance.cleanup import remove_unreferenced

from .harness import ADMIN_TOKEN, db_fetch

pytestmark = pytest.mark.timeout(240)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _blob_path(data_dir: pathlib.Path, sha256: str) -> pathlib.Path:
    return data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256


async def _hammer(pool: asyncpg.Pool, storage: Storage, sha256: str, stop: asyncio.Event, delay: float = 0.0) -> int:
    """After `delay`, delete `sha256` whenever it is unreferenced, as fast as possible, until `stop`."""
    deleted = 0
    await asyncio.sleep(delay)
    while not stop.is_set():
        count, _ = await remove_unreferenced(pool, storage, [sha256], 0)
        deleted += count
        await asyncio.sleep(0)
    return deleted


def test_upload_reusing_an_old_blob_never_loses_it_to_cleanup(cluster):
    """Each round leaves an old unreferenced blob (row and file), then uploads the same bytes
    while cleanup starts deleting that blob at a random moment of the upload: a committed
    artifact always has its file. (Without the digest claim, the rounds whose deletion lands
    between the upload placing the file and committing its artifact lose the file.)"""
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
    storage = Storage(cluster.data_dir)
    rng = random.Random(8)

    async def rounds() -> dict[bool, int]:
        pool = await asyncpg.create_pool(cluster.database_url, min_size=2, max_size=4)
        outcomes = {True: 0, False: 0}  # did cleanup delete the leftover before the upload claimed it?
        took = 0.01
        try:
            async with httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=30) as http:
                for round_no in range(120):
                    content = os.urandom(64 * 1024) + round_no.to_bytes(4, "big")
                    sha256 = hashlib.sha256(content).hexdigest()
                    # The leftover: uploaded, then its artifact deleted (blob row and file stay).
                    first = await http.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content)
                    assert first.status_code == 201, first.text
                    assert (await http.delete(f"/api/v1/repositories/r/artifacts/{first.json()['id']}")).status_code == 204
                    stop = asyncio.Event()
                    # From a moment before the upload starts to just after it ends: a fast
                    # machine finishes a 64 KiB upload before a cleanup batch that starts with it.
                    offset = rng.uniform(-1.0, 1.1) * took
                    hammer = asyncio.create_task(_hammer(pool, storage, sha256, stop, max(offset, 0.0)))
                    if offset < 0:
                        await asyncio.sleep(-offset)
                    started = time.monotonic()
                    again = await http.post("/api/v1/repositories/r/artifacts", params={"name": "y"}, content=content)
                    took = 0.7 * took + 0.3 * (time.monotonic() - started)
                    stop.set()
                    outcomes[await hammer > 0] += 1
                    assert again.status_code == 201, again.text
                    path = _blob_path(cluster.data_dir, sha256)
                    assert path.is_file(), f"round {round_no}: committed artifact without its blob file"
                    assert path.read_bytes() == content
                    served = await http.get(f"/api/v1/repositories/r/artifacts/{again.json()['id']}/content")
                    assert served.status_code == 200 and served.content == content, served.status_code
        finally:
            await pool.close()
        return outcomes

    outcomes = asyncio.run(rounds())
    # Cleanup's moments were spread around the upload: some before its claim, some after.
    assert outcomes[True] >= 10 and outcomes[False] >= 10, outcomes


def test_download_racing_delete_and_cleanup_is_whole_or_404(cluster):
    """Downloads from a gateway start while their artifact is deleted and its blob collected at
    once: each answer is the whole right body or 404, never a 5xx or a partial body."""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
    gateway = cluster.gateway(1, shared).wait_ready()
    storage = Storage(cluster.data_dir)

    async def rounds() -> dict[int, int]:
        pool = await asyncpg.create_pool(cluster.database_url, min_size=2, max_size=4)
        outcomes: dict[int, int] = {}
        try:
            async with (
                httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=30) as w,
                httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=30) as g,
            ):
                for round_no in range(30):
                    content = os.urandom(200_000 + round_no)
                    sha256 = hashlib.sha256(content).hexdigest()
                    made = await w.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content)
                    assert made.status_code == 201, made.text
                    path = f"/api/v1/repositories/r/artifacts/{made.json()['id']}/content"
                    stop = asyncio.Event()
                    hammer = asyncio.create_task(_hammer(pool, storage, sha256, stop))
                    downloads = [asyncio.create_task(g.get(path)) for _ in range(4)]
                    await asyncio.sleep(0.002 * (round_no % 5))
                    assert (await w.delete(path.removesuffix("/content"))).status_code == 204
                    answers = await asyncio.gather(*downloads)
                    stop.set()
                    await hammer
                    for answer in answers:
                        outcomes[answer.status_code] = outcomes.get(answer.status_code, 0) + 1
                        if answer.status_code == 200:
                            assert answer.content == content, f"round {round_no}: wrong or partial body"
                        else:
                            assert answer.status_code == 404, (round_no, answer.status_code, answer.text)
                            assert answer.json()["code"] == "not_found"
        finally:
            await pool.close()
        return outcomes

    outcomes = asyncio.run(rounds())
    assert set(outcomes) <= {200, 404}, outcomes
    assert outcomes.get(200, 0) > 0, outcomes


def test_open_waits_for_a_committed_pin(cluster):
    """A cold download does not open its blob before a pin naming it is committed: while a
    lock on the pins table keeps the gateway's pin write from committing, the download waits;
    once the write goes through, it is served, and the pin row is there."""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    content = os.urandom(100_000)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content)
        assert made.status_code == 201
    sha256 = made.json()["sha256"]
    gateway = cluster.gateway(1, shared).wait_ready()
    path = f"/api/v1/repositories/r/artifacts/{made.json()['id']}/content"

    async def scenario() -> None:
        conn = await asyncpg.connect(cluster.database_url)
        try:
            async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=30) as g:
                # Hold the pins table: the gateway's pin write blocks, so no pin can commit.
                tx = conn.transaction()
                await tx.start()
                await conn.execute("LOCK TABLE arkvory_read_pins IN ACCESS EXCLUSIVE MODE")
                download = asyncio.create_task(g.get(path))
                await asyncio.sleep(1.0)
                assert not download.done(), "the blob was served before its pin could be written"
                await tx.rollback()
                answer = await download
                assert answer.status_code == 200 and answer.content == content
                rows = await conn.fetch(
                    "SELECT slot FROM arkvory_read_pins WHERE sha256 = $1 AND pinned_until > now()", sha256
                )
                assert [r["slot"] for r in rows] == [1]  # lingers after the transfer (pins.LINGER_S)
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_referenced_blob_missing_on_disk_is_503_content_unavailable(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    content = os.urandom(50_000)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content).json()
    _blob_path(cluster.data_dir, made["sha256"]).unlink()  # as verify's quarantine would
    gateway = cluster.gateway(1, shared).wait_ready()
    with gateway.client() as client:
        answer = client.get(f"/api/v1/repositories/r/artifacts/{made['id']}/content")
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "content_unavailable"
        assert int(answer.headers["Retry-After"]) > 0
        # Re-uploading the same bytes restores it.
        with writer.client() as w:
            assert w.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content).status_code == 201
        again = client.get(f"/api/v1/repositories/r/artifacts/{made['id']}/content")
        assert again.status_code == 200 and again.content == content


def test_a_claimed_digest_is_skipped_and_an_unclaimed_one_waits_for_nobody(cluster):
    """The protocol itself, step by step: while an upload's transaction holds the claim,
    cleanup leaves the blob (row and file) alone at once; after that transaction committed its
    artifact, the re-check keeps it; an unclaimed, unreferenced one goes."""
    from arkvory.writer.blobs.locks import claim_for_upload

    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=b"z" * 999).json()
        assert client.delete(f"/api/v1/repositories/r/artifacts/{made['id']}").status_code == 204
        repo_id = db_fetch(cluster.database_url, "SELECT id FROM arkvory_repositories WHERE name = 'r'")[0]["id"]
    storage = Storage(cluster.data_dir)
    sha256 = made["sha256"]

    async def scenario() -> None:
        upload = await asyncpg.connect(cluster.database_url)
        cleaner = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        try:
            tx = upload.transaction()
            await tx.start()
            await claim_for_upload(upload, sha256)
            started = time.monotonic()
            assert await remove_unreferenced(cleaner, storage, [sha256], 0) == (0, 0)
            assert time.monotonic() - started < 2  # skipped, not waited for
            assert _blob_path(cluster.data_dir, sha256).is_file()
            await upload.execute(
                "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type)"
                " VALUES (gen_random_uuid(), $1, 'y', $2, 999, 'application/octet-stream')",
                repo_id, sha256,
            )
            await tx.commit()
            assert await remove_unreferenced(cleaner, storage, [sha256], 0) == (0, 0)
            assert _blob_path(cluster.data_dir, sha256).is_file()
            await upload.execute("DELETE FROM arkvory_artifacts WHERE sha256 = $1", sha256)
            assert await remove_unreferenced(cleaner, storage, [sha256], 0) == (1, 999)
            assert not _blob_path(cluster.data_dir, sha256).exists()
        finally:
            await upload.close()
            await cleaner.close()

    asyncio.run(scenario())


@pytest.mark.soak  # 30 s of real time: .ci/run runs it (pytest -m soak)
def test_an_upload_waits_for_a_removal_at_most_30_s_then_answers_503(cluster):
    """A removal of the same bytes that does not settle (the store hangs, or the run that marked
    it died) holds an upload for REMOVAL_WAIT_S at most, without a transaction: then 503
    `unavailable` with Retry-After, nothing published; once it settles, the same request
    (the same key) publishes."""
    from arkvory.writer.blobs.locks import REMOVAL_WAIT_S

    writer = cluster.writer().wait_ready()
    content = os.urandom(5000)
    sha256 = hashlib.sha256(content).hexdigest()
    db_fetch(
        cluster.database_url,
        "INSERT INTO arkvory_blob_removals (sha256, reason) VALUES ($1, 'unreferenced') RETURNING id", sha256,
    )
    with writer.client(timeout=REMOVAL_WAIT_S + 30) as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        started = time.monotonic()
        key = {"Idempotency-Key": "again-and-again"}
        refused = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content, headers=key)
        took = time.monotonic() - started
        assert refused.status_code == 503 and refused.json()["code"] == "unavailable", refused.text
        assert refused.headers["Retry-After"] == "5" and "removing an earlier copy" in refused.json()["message"]
        assert REMOVAL_WAIT_S <= took < REMOVAL_WAIT_S + 10
        assert db_fetch(cluster.database_url, "SELECT id FROM arkvory_artifacts") == []
        db_fetch(cluster.database_url, "UPDATE arkvory_blob_removals SET settled_at = now() RETURNING id")
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content, headers=key)
        assert made.status_code == 201, made.text
        assert client.get(f"/api/v1/repositories/r/artifacts/{made.json()['id']}/content").content == content


class _GatedStorage(Storage):
    """The store seen by a cleanup whose disk thread stops just before it unlinks `gated`, until
    the test opens `gate`: a slow unlink at a known moment (the thread is where a cancel cannot
    reach)."""

    def __init__(self, root: pathlib.Path, gated: str) -> None:
        super().__init__(root)
        self.gated = gated
        self.reached = threading.Event()
        self.gate = threading.Event()

    def blob_file(self, sha256: str) -> str:
        if sha256 == self.gated and threading.current_thread() is not threading.main_thread():
            self.reached.set()
            self.gate.wait(30)
        return super().blob_file(sha256)


async def _disk_thread_idle() -> None:
    """Returns once the cleanup's one disk thread has finished what it was given before."""
    await cleanup._on_disk(lambda: None)


def test_a_cancelled_cleanup_settles_its_removal_only_after_its_unlinks_are_done(cluster):
    """Cleanup is cancelled (worker lock lost, drain timeout, second SIGTERM) while its disk
    thread is about to unlink an unreferenced blob, and an upload of the same bytes starts at
    once: it holds no lock and no transaction meanwhile, yet the upload waits for the removal it
    marked until the thread is done, then places its own file, and its artifact has its bytes.
    (Settled at the cancel, the upload would commit and the thread delete the upload's file.)"""
    writer = cluster.writer().wait_ready()
    content = os.urandom(100_000)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content).json()
        assert client.delete(f"/api/v1/repositories/r/artifacts/{made['id']}").status_code == 204
    sha256 = made["sha256"]
    storage = _GatedStorage(cluster.data_dir, sha256)

    async def scenario() -> None:
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        observer = await asyncpg.connect(cluster.database_url)
        try:
            cleaning = asyncio.create_task(remove_unreferenced(pool, storage, [sha256], 0))
            assert await asyncio.to_thread(storage.reached.wait, 10), "cleanup never reached the unlink"
            cleaning.cancel()
            assert await _lock_is_free(observer, sha256), "a digest lock is held across the storage"
            assert await _open_transactions(observer) == 0, "a transaction is open across the storage"
            assert await _pending(observer, sha256) == 1
            async with httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=60) as http:
                upload = asyncio.create_task(
                    http.post("/api/v1/repositories/r/artifacts", params={"name": "again"}, content=content)
                )
                await asyncio.sleep(1.0)
                waited_for_cleanup = not upload.done()
                storage.gate.set()
                with pytest.raises(asyncio.CancelledError):
                    await cleaning
                await _disk_thread_idle()
                assert await _pending(observer, sha256) == 0, "the cancelled removal was not settled"
                again = await upload
                assert again.status_code == 201, again.text
                path = _blob_path(cluster.data_dir, sha256)
                assert path.is_file(), "the cancelled cleanup's thread deleted the new upload's file"
                assert path.read_bytes() == content
                served = await http.get(f"/api/v1/repositories/r/artifacts/{again.json()['id']}/content")
                assert served.status_code == 200 and served.content == content
            assert waited_for_cleanup, "the upload published while cleanup was still deleting"
        finally:
            storage.gate.set()
            await pool.close()
            await observer.close()

    asyncio.run(scenario())


async def _lock_is_free(conn: asyncpg.Connection, sha256: str) -> bool:
    key = digest_key(sha256)
    if await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", DIGEST_NAMESPACE, key):
        await conn.execute("SELECT pg_advisory_unlock($1, $2)", DIGEST_NAMESPACE, key)
        return True
    return False


async def _open_transactions(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    )


async def _pending(conn: asyncpg.Connection, sha256: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM arkvory_blob_removals WHERE sha256 = $1 AND settled_at IS NULL", sha256
    )


@pytest.mark.parametrize("step", ["unreferenced", "stray"])
def test_a_cleanup_batch_holds_no_lock_while_it_unlinks_and_settles_only_after(cluster, step):
    """Both deleting steps: while the disk thread may unlink, no digest lock and no transaction
    is held, and the removal is marked (pending); a cancel meanwhile waits for the thread and
    settles the removal only once it is done."""
    writer = cluster.writer().wait_ready()
    content = os.urandom(10_000)
    sha256 = hashlib.sha256(content).hexdigest()
    if step == "unreferenced":
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
            made = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content).json()
            assert client.delete(f"/api/v1/repositories/r/artifacts/{made['id']}").status_code == 204
    else:  # a file without a row, as a crash between placing and committing leaves one
        path = _blob_path(cluster.data_dir, sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    storage = _GatedStorage(cluster.data_dir, sha256)

    async def scenario() -> None:
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        observer = await asyncpg.connect(cluster.database_url)
        try:
            if step == "unreferenced":
                work = remove_unreferenced(pool, storage, [sha256], 0)
            else:
                work = cleanup.remove_strays(pool, storage, [(sha256, len(content))])
            cleaning = asyncio.create_task(work)
            assert await asyncio.to_thread(storage.reached.wait, 10), "cleanup never reached the unlink"
            assert await _lock_is_free(observer, sha256) and await _open_transactions(observer) == 0
            assert await _pending(observer, sha256) == 1
            cleaning.cancel()
            await asyncio.sleep(0.5)
            ended_early = cleaning.done()
            assert await _pending(observer, sha256) == 1, "settled before the disk thread was done"
            storage.gate.set()
            with pytest.raises(asyncio.CancelledError):
                await cleaning
            await _disk_thread_idle()
            assert not ended_early, "the cancel did not wait for the disk thread"
            assert await _pending(observer, sha256) == 0
            assert not _blob_path(cluster.data_dir, sha256).exists()
        finally:
            storage.gate.set()
            await pool.close()
            await observer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["anyio scope", "task.cancel"])
def test_to_the_end_outlasts_a_cancel_then_raises_it(how):
    """The helper both deleting steps use: a cancel (anyio's, as in the worker, or a plain
    `Task.cancel()`) waits for the thread, without spinning the loop, and is raised as soon as
    the thread has returned."""
    import anyio

    from arkvory.shared.storage import to_the_end

    gate, finished, ended, went_on = threading.Event(), [], [], []

    def slow_unlink() -> None:
        gate.wait(10)
        finished.append(time.monotonic())

    async def waiting() -> None:
        try:
            await to_the_end(asyncio.to_thread(slow_unlink))
            went_on.append(True)  # must not happen: the cancel is raised right after the thread
            await asyncio.sleep(0)
        finally:
            ended.append(time.monotonic())

    async def scenario() -> None:
        loop_turns = 0

        async def count_turns() -> None:
            nonlocal loop_turns
            while True:
                loop_turns += 1
                await asyncio.sleep(0.01)

        counter = asyncio.create_task(count_turns())
        threading.Timer(0.6, gate.set).start()
        if how == "anyio scope":
            with anyio.CancelScope() as scope:
                asyncio.get_running_loop().call_later(0.1, scope.cancel)
                await waiting()
            assert scope.cancelled_caught
        else:
            task = asyncio.create_task(waiting())
            asyncio.get_running_loop().call_later(0.1, task.cancel)
            with pytest.raises(asyncio.CancelledError):
                await task
        counter.cancel()
        assert finished and ended and ended[0] >= finished[0], "the cancel was raised before the thread ended"
        assert not went_on, "the caller went on after the cancel"
        assert loop_turns < 150, f"the wait spun the loop ({loop_turns} turns in about 0.6 s)"

    asyncio.run(scenario())


def test_place_blob_links_over_another_file_and_a_retry_changes_nothing(tmp_path):
    """The session's way of placing (link): a file already under the digest is replaced by the
    session's own (same inode as the session file); the same publish again is a no-op; no
    temporary link is left in tmp/."""
    storage = Storage(tmp_path)
    storage.create_layout("test")
    content = b"verified bytes"
    sha256 = hashlib.sha256(content).hexdigest()
    session = tmp_path / "uploads" / "session"
    session.write_bytes(content)
    final = _blob_path(tmp_path, sha256)
    final.parent.mkdir(parents=True)
    final.write_bytes(b"rotten bytes!!")
    assert storage.place_blob(session, sha256, link=True) is True
    assert os.path.samefile(session, final) and final.read_bytes() == content
    assert storage.place_blob(session, sha256, link=True) is False
    assert os.path.samefile(session, final)
    assert list(storage.tmp.iterdir()) == []
    other = _blob_path(tmp_path, "0" * 64)
    assert storage.place_blob(session, "0" * 64, link=True) is False and os.path.samefile(session, other)
