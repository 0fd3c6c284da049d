"""Idempotency-Key on a live writer (SPEC §6): replay, mismatch, in-use, expiry, key checks,
and no second change when the writer dies between the change and the end of its transaction."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import time

import asyncpg
import httpx
import pytest

from arkvory.writer.idempotency import _lock_ids, delete_expired

from .harness import ADMIN_TOKEN, OTHER_TOKEN, db_fetch, eventually

pytestmark = pytest.mark.timeout(120)

KEY = "Idempotency-Key"


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_IDEMPOTENCY_RETENTION="3s").wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        artifact = client.post("/api/v1/repositories/builds/artifacts", params={"name": "a"}, content=b"a").json()
        other = client.post("/api/v1/repositories/builds/artifacts", params={"name": "b"}, content=b"b").json()
    writer.artifacts = (artifact["id"], other["id"])
    return writer


def repository_count(database_url: str) -> int:
    return db_fetch(database_url, "SELECT count(*) FROM arkvory_repositories")[0][0]


def test_retry_replays_without_a_second_change(writer, database_url):
    with writer.client() as client:
        first = client.post("/api/v1/repositories", json={"name": "r1"}, headers={KEY: "k-1"})
        again = client.post("/api/v1/repositories", json={"name": "r1"}, headers={KEY: "k-1"})
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"] == "/api/v1/repositories/r1"
    assert again.headers["x-request-id"] != first.headers["x-request-id"]  # the retry's own
    # Without the key the same request conflicts: the replay did not run the work again.
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r1"}).status_code == 409
    assert repository_count(database_url) == 2


def test_other_parameters_with_the_same_key_are_422(writer):
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r2"}, headers={KEY: "k-2"}).status_code == 201
        changed = client.post("/api/v1/repositories", json={"name": "r3"}, headers={KEY: "k-2"})
        other_route = client.patch("/api/v1/repositories/builds", json={"public": True}, headers={KEY: "k-2"})
        assert client.get("/api/v1/repositories/r3").status_code == 404
    assert changed.status_code == 422 and changed.json()["code"] == "IdempotentParameterMismatch"
    assert other_route.status_code == 422 and other_route.json()["code"] == "IdempotentParameterMismatch"


def test_keys_are_scoped_to_the_principal_and_case_sensitive(writer):
    with writer.client() as admin, writer.client(OTHER_TOKEN) as other:
        assert admin.post("/api/v1/repositories", json={"name": "x1"}, headers={KEY: "shared"}).status_code == 201
        # The same key from another principal is its own request, not a mismatch.
        mine = other.post("/api/v1/repositories", json={"name": "other"}, headers={KEY: "shared"})
        assert mine.status_code == 201 and "idempotent-replayed" not in mine.headers
        # Case matters: "SHARED" is a new key.
        assert admin.post("/api/v1/repositories", json={"name": "x2"}, headers={KEY: "SHARED"}).status_code == 201


@pytest.mark.parametrize(
    "key",
    ["", "a" * 65, "caf\u00e9", "tab\there"],
    ids=["empty", "65-chars", "non-ascii", "tab"],
)
def test_malformed_keys_are_400(writer, key):
    raw = [(b"idempotency-key", key.encode("latin-1"))]
    with writer.client() as client:
        answer = client.post("/api/v1/repositories", json={"name": "never"}, headers=raw)
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", answer.text
        assert client.get("/api/v1/repositories/never").status_code == 404


def test_longest_key_and_two_key_headers(writer):
    with writer.client() as client:
        longest = "~ " + "K" * 62
        assert client.post("/api/v1/repositories", json={"name": "k64"}, headers={KEY: longest}).status_code == 201
        replay = client.post("/api/v1/repositories", json={"name": "k64"}, headers={KEY: longest})
        assert replay.headers["idempotent-replayed"] == "true"
        two = client.post(
            "/api/v1/repositories", json={"name": "two"},
            headers=[(b"idempotency-key", b"a"), (b"idempotency-key", b"b")],
        )
        assert two.status_code == 400


def _holding_row_lock(database_url: str, ready: concurrent.futures.Future, release: concurrent.futures.Future):
    async def run():
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM arkvory_repositories WHERE name = 'builds' FOR UPDATE")
                ready.set_result(True)
                await asyncio.get_running_loop().run_in_executor(None, release.result, 30)
        finally:
            await conn.close()

    asyncio.run(run())


def test_a_duplicate_while_the_first_runs_is_409_then_replays(writer, database_url):
    """The first PATCH waits on a row lock the test holds; its duplicate is refused at once."""
    ready, release = concurrent.futures.Future(), concurrent.futures.Future()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        locker = pool.submit(_holding_row_lock, database_url, ready, release)
        ready.result(10)
        with writer.client() as client:
            first = pool.submit(
                client.patch, "/api/v1/repositories/builds", json={"public": True}, headers={KEY: "busy-1"}
            )
            deadline = time.monotonic() + 10
            while not db_fetch(
                database_url,
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE arkvory_repositories%'",
            ):
                assert time.monotonic() < deadline, "the first request never reached its UPDATE"
                time.sleep(0.05)
            started = time.monotonic()
            duplicate = client.patch("/api/v1/repositories/builds", json={"public": True}, headers={KEY: "busy-1"})
            assert time.monotonic() - started < 2
            assert duplicate.status_code == 409 and duplicate.json()["code"] == "idempotency_key_in_use"
            release.set_result(True)
            locker.result(10)
            assert first.result(10).status_code == 200
            after = client.patch("/api/v1/repositories/builds", json={"public": True}, headers={KEY: "busy-1"})
            assert after.status_code == 200 and after.headers["idempotent-replayed"] == "true"


def test_the_database_lock_refuses_a_duplicate_from_elsewhere(writer, database_url):
    """The transaction-scoped advisory lock on (principal, key) holds across processes: while
    another session holds it, the writer answers 409 and changes nothing."""

    async def run():
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("SELECT pg_advisory_lock($1, $2)", *_lock_ids("key:admin", "elsewhere"))
            async with httpx.AsyncClient(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
                return await client.post("/api/v1/repositories", json={"name": "el"}, headers={KEY: "elsewhere"})
        finally:
            await conn.close()

    answer = asyncio.run(run())
    assert answer.status_code == 409 and answer.json()["code"] == "idempotency_key_in_use"
    assert not db_fetch(database_url, "SELECT 1 FROM arkvory_repositories WHERE name = 'el'")


def test_keys_expire_after_the_retention(cluster, database_url):
    # A retention of its own (1 s, not the module's 3 s): two waits past it, not 7 s of sleep.
    writer = cluster.writer(ARKVORY_IDEMPOTENCY_RETENTION="1s").wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "e1"}, headers={KEY: "old"}).status_code == 201
        time.sleep(1.5)
        # Expired at once: the same key with other parameters is a new request, not a mismatch.
        fresh = client.post("/api/v1/repositories", json={"name": "e2"}, headers={KEY: "old"})
        assert fresh.status_code == 201 and "idempotent-replayed" not in fresh.headers
        assert client.post("/api/v1/repositories", json={"name": "e3"}, headers={KEY: "gone"}).status_code == 201
        time.sleep(1.5)

    async def cleanup():
        conn = await asyncpg.connect(database_url)
        try:
            return await delete_expired(conn)
        finally:
            await conn.close()

    assert asyncio.run(cleanup()) == 2
    assert db_fetch(database_url, "SELECT count(*) FROM arkvory_idempotency_keys")[0][0] == 0


def test_a_failed_request_records_nothing(writer):
    """An error rolls the change back and records no key: the fixed retry does the work."""
    with writer.client() as client:
        missing = client.put(
            "/api/v1/repositories/builds/assets", params={"path": "p"},
            json={"artifactId": "00000000-0000-0000-0000-000000000000"}, headers={KEY: "fail"},
        )
        assert missing.status_code == 404
        fixed = client.put(
            "/api/v1/repositories/builds/assets", params={"path": "p"},
            json={"artifactId": writer.artifacts[0]}, headers={KEY: "fail-2"},
        )
        assert fixed.status_code == 200


def test_every_catalog_change_replays(writer):
    """Each mutating route of repositories, packages and assets: the retry with the key is a
    replay (a delete replayed is 204, not the 404 a second delete would give)."""
    first, second = writer.artifacts
    base = "/api/v1/repositories/builds"
    package = {"group": "g", "name": "n", "version": "1", "artifactId": first}
    coordinates = {"group": "g", "name": "n", "version": "1"}
    steps = [
        ("PUT", f"{base}/packages", {}, package, 201),
        ("POST", f"{base}/packages", {}, {**package, "version": "2"}, 201),
        ("PUT", f"{base}/assets", {"path": "p"}, {"artifactId": first}, 200),
        ("PUT", f"{base}/assets", {"path": "p"}, {"artifactId": second}, 200),
        ("POST", f"{base}/asset/restore", {"path": "p"}, "first-history-entry", 200),
        ("DELETE", f"{base}/package", coordinates, None, 204),
        ("DELETE", f"{base}/asset", {"path": "p"}, None, 204),
        ("PATCH", base, {}, {"public": True}, 200),
        ("DELETE", base, {"force": "true"}, None, 204),
    ]
    with writer.client() as client:
        for number, (method, url, params, body, status) in enumerate(steps):
            if body == "first-history-entry":
                body = {"historyId": client.get(f"{base}/asset", params={"path": "p"}).json()["history"][-1]["id"]}
            headers = {KEY: f"step-{number}"}
            done = client.request(method, url, params=params, json=body, headers=headers)
            assert done.status_code == status, (method, url, done.text)
            again = client.request(method, url, params=params, json=body, headers=headers)
            assert again.status_code == status, (method, url, again.text)
            assert again.headers.get("idempotent-replayed") == "true", (method, url)
            assert again.content == done.content


def test_a_writer_killed_before_commit_does_the_change_once(cluster, database_url):
    """The change and its key commit together: kill -9 while the key's INSERT waits (after the
    change was made in the same transaction), restart, retry: one change, answered 201. Had the
    change committed apart from its key, the retry would find the name taken (409)."""
    writer = cluster.writer().wait_ready()

    async def block_key_inserts_then_kill():
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                # EXCLUSIVE lets the lookups (SELECT) through and stops INSERTs.
                await conn.execute("LOCK TABLE arkvory_idempotency_keys IN EXCLUSIVE MODE")
                async with httpx.AsyncClient(
                    base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=20
                ) as client:
                    request = asyncio.ensure_future(
                        client.post("/api/v1/repositories", json={"name": "once"}, headers={KEY: "crash"})
                    )
                    for _ in range(200):
                        # Activity is read once per transaction unless the snapshot is cleared.
                        await conn.execute("SELECT pg_stat_clear_snapshot()")
                        waiting = await conn.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE 'INSERT INTO arkvory_idempotency_keys%'"
                        )
                        if waiting:
                            break
                        await asyncio.sleep(0.05)
                    assert waiting, "the request never reached the key's INSERT"
                    writer.kill()
                    with pytest.raises(httpx.HTTPError):
                        await request
        finally:
            await conn.close()

    asyncio.run(block_key_inserts_then_kill())
    restarted = cluster.writer().wait_ready()
    with restarted.client() as client:
        retried = client.post("/api/v1/repositories", json={"name": "once"}, headers={KEY: "crash"})
        assert retried.status_code == 201, retried.text
        assert "idempotent-replayed" not in retried.headers
        replay = client.post("/api/v1/repositories", json={"name": "once"}, headers={KEY: "crash"})
        assert replay.headers["idempotent-replayed"] == "true"
    assert db_fetch(database_url, "SELECT count(*) FROM arkvory_repositories WHERE name = 'once'")[0][0] == 1


def test_concurrent_replays_of_a_finished_change_all_replay(writer):
    """Only a request still running holds its key: replays of a finished one run side by side."""
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "many"}, headers={KEY: "many"}).status_code == 201
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(
                lambda _: client.post("/api/v1/repositories", json={"name": "many"}, headers={KEY: "many"}),
                range(64),
            ))
    assert {(a.status_code, a.headers.get("idempotent-replayed")) for a in answers} == {(201, "true")}


def test_a_streaming_upload_holds_its_key_while_the_body_arrives(writer, database_url):
    """`holding_key`: a duplicate of an upload whose body is still arriving gets 409 at once
    (it does not stream a second copy); once published, the retry replays the same artifact."""
    import threading

    go_on = threading.Event()

    def slow_body():
        yield b"x" * 1024
        go_on.wait(20)
        yield b"y" * 1024

    url = "/api/v1/repositories/builds/artifacts"
    with writer.client() as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, url, params={"name": "slow"}, content=slow_body(), headers={KEY: "up"})
        # The first body is under way (its key is held before its upload file is made).
        tmp = pathlib.Path(writer.env["ARKVORY_DATA_DIR"]) / "tmp"
        eventually(lambda: tmp.is_dir() and any(p.name.startswith("upload-") for p in tmp.iterdir()), "the first upload receiving")
        started = time.monotonic()
        duplicate = client.post(url, params={"name": "slow"}, content=b"x" * 1024 + b"y" * 1024, headers={KEY: "up"})
        assert time.monotonic() - started < 2
        go_on.set()
        created = first.result(20)
        assert duplicate.status_code == 409 and duplicate.json()["code"] == "idempotency_key_in_use"
        assert created.status_code == 201, created.text
        retry = client.post(url, params={"name": "slow"}, content=b"x" * 1024 + b"y" * 1024, headers={KEY: "up"})
        assert retry.headers["idempotent-replayed"] == "true" and retry.json()["id"] == created.json()["id"]
        other = client.post(url, params={"name": "slow"}, content=b"other bytes", headers={KEY: "up"})
        assert other.status_code == 422
    assert db_fetch(database_url, "SELECT count(*) FROM arkvory_artifacts WHERE name = 'slow'")[0][0] == 1


def test_a_restarted_writer_replays_from_the_table(cluster, database_url):
    """Recorded results live in the database: a new writer (nothing in memory) replays them,
    and still answers 422 for other parameters."""
    first = cluster.writer().wait_ready()
    with first.client() as client:
        created = client.post("/api/v1/repositories", json={"name": "kept"}, headers={KEY: "kept"})
        assert created.status_code == 201
    first.kill()
    second = cluster.writer().wait_ready()
    with second.client() as client:
        replay = client.post("/api/v1/repositories", json={"name": "kept"}, headers={KEY: "kept"})
        assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == created.json() and replay.headers["location"] == created.headers["location"]
        other = client.post("/api/v1/repositories", json={"name": "other-name"}, headers={KEY: "kept"})
        assert other.status_code == 422
    assert repository_count(database_url) == 1


def test_recorded_results_expire_by_deadline_and_stay_bounded():
    from arkvory.writer.idempotency import RecordedResults, _Recorded

    now = [100.0]
    results = RecordedResults(capacity=2, max_body=10, clock=lambda: now[0])
    results.put("p", "a", _Recorded("f", 201, b"{}", {}, deadline=105.0))
    results.put("p", "big", _Recorded("f", 201, b"x" * 11, {}, deadline=105.0))
    assert results.get("p", "a") is not None and results.get("p", "big") is None  # too large to keep
    assert results.get("q", "a") is None  # scoped to the principal
    now[0] = 105.0
    assert results.get("p", "a") is None  # gone at its deadline
    for key in ("k1", "k2", "k3"):
        results.put("p", key, _Recorded("f", 200, None, {}, deadline=200.0))
    assert results.get("p", "k1") is None and results.get("p", "k3") is not None  # oldest evicted
