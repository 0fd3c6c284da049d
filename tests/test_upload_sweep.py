"""The sweep of abandoned uploads (shared/storage/upload_files.py) against uploads in progress in
a real writer: the worker's cleanup, a separate process that sees nothing of the writer's memory, never
removes a session whose part is being received or that is being completed, keeps a session
completed between its look and its delete, and leaves a slow one-shot upload's temp file alone.
Races are pinned with row locks held by the test and with bodies the test sends in halves."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import socket
import sys
import threading
import time
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared.storage import Storage
from arkvory.writer.uploads.sessions import remove_sessions, sweep_expired_uploads

from .harness import ADMIN_TOKEN, db_execute, db_fetch
from .rawhttp import read_response, status_of
from .test_cleanup import run_cleanup

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BASE = "/api/v1/repositories/builds/uploads"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def start_writer(cluster, **env: str):
    writer = cluster.writer(**env).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    return writer


def create_session(writer, data: bytes) -> dict:
    descriptor = {"name": "app.bin", "size": len(data), "sha256": sha(data), "partSize": MiB}
    with writer.client() as client:
        answer = client.post(BASE, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert answer.status_code == 201, answer.text
    return answer.json()


def put_part(client: httpx.Client, session: dict, index: int, data: bytes) -> httpx.Response:
    part = data[index * MiB:(index + 1) * MiB]
    return client.put(f"{BASE}/{session['id']}/parts/{index}", content=part, headers={"X-Content-SHA256": sha(part)})


def request_head(request_line: str, length: int, **headers: str) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        f"{extra}Content-Length: {length}\r\n\r\n"
    ).encode()


def answer_status(sock: socket.socket) -> int:
    return status_of(read_response(sock))


def open_in(pid: int, path: pathlib.Path) -> bool:
    """Whether process `pid` has `path` open (it is receiving into it)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def wait_for(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout} s"
        time.sleep(0.02)


async def wait_for_lock_wait(conn: asyncpg.Connection, query_start: str, timeout: float = 10.0) -> None:
    """Until a backend running a statement that starts with `query_start` waits for a lock."""
    deadline = time.monotonic() + timeout
    while not await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND ltrim(query, E' \\n') LIKE $1 || '%'",
        query_start,
    ):
        assert time.monotonic() < deadline, f"nobody waits in {query_start!r}"
        await asyncio.sleep(0.02)


def session_row(cluster, session: dict) -> list[dict]:
    rows = db_fetch(cluster.database_url, "SELECT status FROM arkvory_uploads WHERE id = $1", uuid.UUID(session["id"]))
    return [dict(row) for row in rows]


def test_the_workers_sweep_leaves_a_session_whose_part_is_being_received(cluster):
    """A part takes longer than the session has left: the session expires while the writer
    receives it. The worker's cleanup runs then: the session (row and file) stays, the part is
    recorded, and the upload completes. (Before, the sweep deleted both under the writer.)"""
    writer = start_writer(cluster)
    data = os.urandom(2 * MiB)
    session = create_session(writer, data)
    path = cluster.data_dir / "uploads" / session["id"]
    part = data[:MiB]
    with socket.create_connection(("127.0.0.1", writer.port), timeout=30) as sock:
        head = request_head(f"PUT {BASE}/{session['id']}/parts/0", MiB, **{"X-Content-SHA256": sha(part)})
        sock.sendall(head + part[: MiB // 2])
        wait_for(lambda: open_in(writer.proc.pid, path), "the writer receives the part")
        db_execute(cluster.database_url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'")
        result, _ = asyncio.run(run_cleanup(cluster, {"grace_seconds": 0}))
        assert result["steps"]["upload_sessions"]["sessions"] == 0, result
        assert session_row(cluster, session) == [{"status": "open"}] and path.is_file()
        sock.sendall(part[MiB // 2:])
        assert answer_status(sock) == 200
    with writer.client() as client:
        assert put_part(client, session, 1, data).status_code == 200
        done = client.post(f"{BASE}/{session['id']}/complete")
        assert done.status_code == 201, done.text
        assert client.get(f"/api/v1/repositories/builds/artifacts/{done.json()['id']}/content").content == data


def test_a_session_being_completed_is_not_swept_and_a_repeated_complete_replays(cluster):
    """The session expires just as `complete` runs, and the worker's sweep comes while the
    publishing transaction is open (the test holds row locks to stop it there): the sweep
    leaves the session; once published, a repeated complete replays the artifact. (Before, the
    sweep's delete waited for the publication's row lock, then deleted the completed row, and
    the repeat answered 404.)"""
    writer = start_writer(cluster)
    data = os.urandom(2 * MiB)
    session = create_session(writer, data)
    with writer.client() as client:
        assert put_part(client, session, 0, data).status_code == 200
        assert put_part(client, session, 1, data).status_code == 200
    session_id = uuid.UUID(session["id"])

    async def scenario() -> httpx.Response:
        expiring = await asyncpg.connect(cluster.database_url)
        parts = await asyncpg.connect(cluster.database_url)
        observer = await asyncpg.connect(cluster.database_url)
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        try:
            async with httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=30) as http:
                # The session expires, uncommitted: complete reads it unexpired, then waits for
                # this row lock inside its publishing transaction.
                expire = expiring.transaction()
                await expire.start()
                await expiring.execute(
                    "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second' WHERE id = $1", session_id
                )
                completing = asyncio.create_task(http.post(f"{BASE}/{session_id}/complete"))
                await wait_for_lock_wait(observer, "SELECT status FROM arkvory_uploads")
                # Stop the publication again after it marked the session completed.
                hold = parts.transaction()
                await hold.start()
                await parts.execute("SELECT 1 FROM arkvory_upload_parts WHERE upload_id = $1 FOR UPDATE", session_id)
                await expire.commit()
                await wait_for_lock_wait(observer, "DELETE FROM arkvory_upload_parts")
                sweep = asyncio.create_task(sweep_expired_uploads(pool, Storage(cluster.data_dir)))
                await asyncio.wait({sweep}, timeout=2)
                await hold.rollback()
                assert await sweep == 0
                assert (await completing).status_code == 201
                return await http.post(f"{BASE}/{session_id}/complete")
        finally:
            for conn in (expiring, parts, observer):
                await conn.close()
            await pool.close()

    again = asyncio.run(scenario())
    assert again.status_code == 200, again.text
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json()["sha256"] == sha(data)
    assert session_row(cluster, session) == [{"status": "completed"}]


def test_a_session_completed_between_the_sweeps_look_and_its_delete_is_kept(cluster):
    """The sweep looked (the session was expired and open), then the session was completed
    (here by the test, with the publication's own UPDATE, committed while the sweep's delete
    waits for its row): the delete re-checks expiry in the same statement and keeps it."""
    writer = start_writer(cluster)
    session = create_session(writer, os.urandom(1000))
    session_id = uuid.UUID(session["id"])
    db_execute(cluster.database_url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'")

    async def scenario() -> int:
        publishing = await asyncpg.connect(cluster.database_url)
        observer = await asyncpg.connect(cluster.database_url)
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        try:
            tx = publishing.transaction()
            await tx.start()
            await publishing.execute(
                "UPDATE arkvory_uploads SET status = 'completed', expires_at = now() + interval '1 hour'"
                " WHERE id = $1", session_id,
            )
            sweep = asyncio.create_task(sweep_expired_uploads(pool, Storage(cluster.data_dir)))
            await wait_for_lock_wait(observer, "DELETE FROM arkvory_uploads")
            await tx.commit()
            return await sweep
        finally:
            await publishing.close()
            await observer.close()
            await pool.close()

    assert asyncio.run(scenario()) == 0
    assert session_row(cluster, session) == [{"status": "completed"}]


def test_the_sweep_leaves_the_temp_file_of_a_slow_one_shot_upload(cluster):
    """A one-shot upload sends slowly: its temp file has not been written for longer than the
    sweep's age limit (a write happens per 2 MiB). The worker's cleanup leaves it, and the
    upload completes with the right bytes. (Before, the file was removed mid-stream.)"""
    writer = start_writer(cluster)
    data = os.urandom(3 * MiB)
    tmp = cluster.data_dir / "tmp"
    with socket.create_connection(("127.0.0.1", writer.port), timeout=30) as sock:
        sock.sendall(request_head("POST /api/v1/repositories/builds/artifacts?name=slow.bin", len(data)) + data[:MiB])
        wait_for(lambda: any(open_in(writer.proc.pid, p) for p in tmp.glob("upload-*")), "the writer receives")
        (temp,) = list(tmp.glob("upload-*"))
        two_hours_ago = time.time() - 7200
        os.utime(temp, (two_hours_ago, two_hours_ago))
        result, _ = asyncio.run(run_cleanup(cluster, {"grace_seconds": 0}))
        assert result["steps"]["upload_sessions"]["temp_files"] == 0, result
        assert temp.is_file()
        sock.sendall(data[MiB:])
        assert answer_status(sock) == 201
    rows = db_fetch(cluster.database_url, "SELECT id, sha256 FROM arkvory_artifacts")
    assert [r["sha256"] for r in rows] == [sha(data)]
    with writer.client() as client:
        assert client.get(f"/api/v1/repositories/builds/artifacts/{rows[0]['id']}/content").content == data


# -- item 5: unlinks off the event loop ----------------------------------------------------------

_unlinks: list[tuple[str, bool]] | None = None  # (path, on the main thread) while a test records


def _record_unlink(event: str, args: tuple) -> None:
    if event == "os.remove" and _unlinks is not None:
        _unlinks.append((os.fsencode(args[0]).decode(), threading.current_thread() is threading.main_thread()))


_hooked = False


def _recording_unlinks() -> list[tuple[str, bool]]:
    global _unlinks, _hooked
    if not _hooked:
        sys.addaudithook(_record_unlink)  # cannot be removed: inert while `_unlinks` is None
        _hooked = True
    _unlinks = []
    return _unlinks


def test_upload_files_are_unlinked_off_the_event_loop(cluster):
    """Freeing a preallocated multi-GiB session file can take seconds, long enough to stall
    downloads and the read-pin flusher: every removal of upload files unlinks in a worker
    thread, never on the event loop. Here the loop is the test's (the main thread), driving the
    functions the writer's routes and the worker's cleanup call."""
    global _unlinks
    writer = start_writer(cluster)
    sessions = [create_session(writer, os.urandom(1000)) for _ in range(2)]
    db_execute(cluster.database_url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'")
    uploads = cluster.data_dir / "uploads"
    orphan = uploads / str(uuid.uuid4())  # a session file without a session
    orphan.write_bytes(b"left by a crash")
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    by_route, by_sweep = (str(uploads / s["id"]) for s in sessions)

    async def scenario() -> None:
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        try:
            storage = Storage(cluster.data_dir)
            async with pool.acquire() as conn:
                await remove_sessions(conn, storage, [uuid.UUID(sessions[0]["id"])])  # as on access
            assert await sweep_expired_uploads(pool, storage, orphans_older_than_s=60) == 2  # as the worker
        finally:
            await pool.close()

    recorded = _recording_unlinks()
    try:
        asyncio.run(scenario())
    finally:
        _unlinks = None
    unlinked = dict(recorded)
    assert set(unlinked) == {by_route, by_sweep, str(orphan)}, recorded
    on_the_loop = [path for path, on_loop in recorded if on_loop]
    assert on_the_loop == [], f"unlinked on the event loop: {on_the_loop}"
    assert list(uploads.iterdir()) == []


_MAIN_THREAD_UNLINKS = '''
import os, sys, threading
_log = os.environ["TEST_UNLINK_LOG"]
def _hook(event, args):
    if event == "os.remove" and threading.current_thread() is threading.main_thread():
        with open(_log, "a") as out:
            out.write(os.fsdecode(args[0]) + "\\n")
sys.addaudithook(_hook)
'''


def test_the_writer_unlinks_upload_files_off_its_event_loop(cluster, tmp_path):
    """The same for a real writer, on every path that removes an upload file: a DELETE, an
    expired session found on access, a complete, a one-shot upload published or cut, and the
    sweep at start. A `sitecustomize` audit hook in the writer logs each unlink made on its main
    thread (the event loop's); the log stays empty."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_MAIN_THREAD_UNLINKS)
    log = tmp_path / "unlinks-on-the-loop.log"
    log.touch()
    env = {"PYTHONPATH": str(hooks), "TEST_UNLINK_LOG": str(log)}
    writer = start_writer(cluster, **env)
    data = os.urandom(MiB + 10)
    with writer.client() as client:
        deleted = create_session(writer, data)
        assert client.delete(f"{BASE}/{deleted['id']}").status_code == 204
        expired = create_session(writer, data)
        db_execute(cluster.database_url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'"
                   " WHERE id = $1", uuid.UUID(expired["id"]))
        assert client.get(f"{BASE}/{expired['id']}").status_code == 404
        completed = create_session(writer, data)
        assert client.put(f"{BASE}/{completed['id']}/content", content=data).status_code == 200
        assert client.post(f"{BASE}/{completed['id']}/complete").status_code == 201
        one_shot = client.post("/api/v1/repositories/builds/artifacts", params={"name": "x"}, content=data)
        assert one_shot.status_code == 201
    with socket.create_connection(("127.0.0.1", writer.port), timeout=30) as sock:
        sock.sendall(request_head("POST /api/v1/repositories/builds/artifacts?name=cut", len(data)) + data[:1000])
        wait_for(lambda: any(open_in(writer.proc.pid, p) for p in (cluster.data_dir / "tmp").glob("upload-*")),
                 "the writer receives")
    wait_for(lambda: not list((cluster.data_dir / "tmp").iterdir()), "the cut body's temp file is removed")
    writer.kill()
    old = time.time() - 3600
    for crashed in (cluster.data_dir / "tmp" / "upload-crashed", cluster.data_dir / "uploads" / str(uuid.uuid4())):
        crashed.write_bytes(b"left by a crash")
        os.utime(crashed, (old, old))
    writer = cluster.writer(**env).wait_ready()  # sweeps at start
    assert list((cluster.data_dir / "uploads").iterdir()) == []
    assert list((cluster.data_dir / "tmp").iterdir()) == []
    on_the_loop = [line for line in log.read_text().splitlines() if line.startswith(str(cluster.data_dir))]
    assert on_the_loop == [], f"unlinked on the writer's event loop: {on_the_loop}"
