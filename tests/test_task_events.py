"""Task events (SPEC §7): numbers 1, 2, 3... without a gap under concurrent writers, the JSON
form, and the live `text/event-stream` on a real writer (follows live, resumes from
Last-Event-ID, ends when the task ends or the writer drains), plus the hub's fan-out, its
reconnection after a cut and the polling that covers a lost NOTIFY."""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
import time
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared.errors import Busy
from arkvory.writer.tasks import store
from arkvory.writer.tasks.stream import TaskEventHub, frames

from .harness import ADMIN_TOKEN

pytestmark = pytest.mark.timeout(120)


async def new_task(conn: asyncpg.Connection, key: str | None = None) -> uuid.UUID:
    async with conn.transaction():
        task = await store.insert_task(
            conn, kind="cleanup", params={}, on_restart="retry", definition_version=None,
            definition_hash="0" * 64, budget={}, idempotency_key=key, created_by="test",
        )
    return task["id"]


def run(database_url, work):
    async def main():
        conn = await asyncpg.connect(database_url)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(main())


@pytest.fixture
def schema(cluster, database_url):
    """A migrated database; the writer that migrated it keeps running."""
    return cluster.writer().wait_ready()


# -- numbering -------------------------------------------------------------------------------------


def test_events_are_gapless_under_concurrent_writers(schema, database_url):
    async def scenario(conn):
        task_id = await new_task(conn)
        writers = [await asyncpg.connect(database_url) for _ in range(12)]
        try:
            async def progress(c, n):
                written = 0
                for i in range(15):
                    if await store.append_event(c, task_id, "task.progress", {"n": n, "i": i}):
                        written += 1
                return written

            async def transitions(c):
                moved = 0
                for source, target in (("queued", "loading"), ("loading", "running")):
                    if await store.transition(c, task_id, allowed_from=(source,), to=target, event=f"task.{target}"):
                        moved += 1
                return moved

            counts = await asyncio.gather(*(progress(c, n) for n, c in enumerate(writers[:10])),
                                          transitions(writers[10]), transitions(writers[11]))
        finally:
            for c in writers:
                await c.close()
        seqs = [r["seq"] for r in await conn.fetch(
            "SELECT seq FROM arkvory_task_events WHERE task_id = $1 ORDER BY seq", task_id)]
        last = await conn.fetchval("SELECT last_event FROM arkvory_tasks WHERE id = $1", task_id)
        return seqs, last, sum(counts)

    seqs, last, written = run(database_url, scenario)
    assert written == 150 + 2  # every progress event and each transition exactly once
    assert seqs == list(range(1, written + 2))  # +1: task.queued
    assert last == len(seqs)


# -- the JSON form ---------------------------------------------------------------------------------


def test_events_as_json_pages_by_number(schema, database_url):
    async def scenario(conn):
        task_id = await new_task(conn)
        for i in range(6):
            await store.append_event(conn, task_id, "task.progress", {"i": i})
        return task_id

    task_id = run(database_url, scenario)
    with schema.client() as client:
        whole = client.get(f"/api/v1/tasks/{task_id}/events")
        assert whole.status_code == 200, whole.text
        body = whole.json()
        assert [e["seq"] for e in body["items"]] == list(range(1, 8))
        assert body["items"][0]["type"] == "task.queued" and body["items"][1]["data"] == {"i": 0}
        assert body["next_after"] == 7 and body["status"] == "queued" and body["last_event"] == 7
        part = client.get(f"/api/v1/tasks/{task_id}/events", params={"after": 2, "limit": 3}).json()
        assert [e["seq"] for e in part["items"]] == [3, 4, 5] and part["next_after"] == 5
        empty = client.get(f"/api/v1/tasks/{task_id}/events", params={"after": 99}).json()
        assert empty["items"] == [] and empty["next_after"] == 99
        for bad in ({"after": "-1"}, {"after": "x"}, {"after": "99999999999"}, {"limit": "0"}):
            answer = client.get(f"/api/v1/tasks/{task_id}/events", params=bad)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", bad


# -- the live stream on a writer ---------------------------------------------------------------------


def parse_sse(lines):
    """Events of a text/event-stream as dicts (id, event, data); comments are skipped."""
    event: dict[str, str] = {}
    for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            event[field] = value[1:] if value.startswith(" ") else value


class StreamReader:
    """Reads one event stream in a thread; `events` receives each event, then None at its end."""

    def __init__(self, url: str, task_id, after: int | None = None, last_event_id: str | None = None) -> None:
        self.events: queue.Queue = queue.Queue()
        self.status: int | None = None
        self.error: BaseException | None = None  # a stream cut instead of ended
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        params = {"after": after} if after is not None else {}
        self._thread = threading.Thread(target=self._read, args=(url, task_id, headers, params), daemon=True)
        self._thread.start()

    def _read(self, url, task_id, headers, params):
        try:
            with httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=40)) as client:
                with client.stream("GET", f"/api/v1/tasks/{task_id}/events", headers=headers, params=params) as answer:
                    self.status = answer.status_code
                    self.content_type = answer.headers.get("content-type", "")
                    for event in parse_sse(answer.iter_lines()):
                        if "id" in event:
                            self.events.put(event)
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.events.put(None)

    def next(self, timeout: float = 10.0):
        return self.events.get(timeout=timeout)

    def join(self, timeout: float = 15.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"


def test_stream_follows_live_and_ends_with_the_task(schema, database_url):
    task_id = run(database_url, new_task)
    reader = StreamReader(schema.url, task_id)
    first = reader.next()
    assert reader.status == 200 and reader.content_type.startswith("text/event-stream")
    assert (first["id"], first["event"]) == ("1", "task.queued")

    async def live(conn):
        delays = []
        steps = [("transition", "queued", "running"), ("progress", None, None), ("progress", None, None),
                 ("transition", "running", "completed")]
        for number, (what, source, target) in enumerate(steps, start=2):
            await asyncio.sleep(0.3)
            sent = time.monotonic()
            if what == "progress":
                await store.append_event(conn, task_id, "task.progress", {"step": number})
            else:
                await store.transition(conn, task_id, allowed_from=(source,), to=target, event=f"task.{target}")
            event = await asyncio.to_thread(reader.next)
            delays.append(time.monotonic() - sent)
            assert event is not None and event["id"] == str(number), event
        return delays

    delays = run(database_url, live)
    assert reader.next() is None  # completed and every event sent: the stream ended
    reader.join()
    assert reader.error is None
    # Woken by NOTIFY, not by the 3 s safety poll (tolerant of a loaded machine).
    assert sorted(delays)[len(delays) // 2] < 1.5, delays


def test_stream_resumes_after_last_event_id(schema, database_url):
    async def scenario(conn):
        task_id = await new_task(conn)
        for i in range(4):
            await store.append_event(conn, task_id, "task.progress", {"i": i})
        await store.transition(conn, task_id, allowed_from=("queued",), to="failed", event="task.failed")
        return task_id

    task_id = run(database_url, scenario)
    # Last-Event-ID wins over ?after=.
    reader = StreamReader(schema.url, task_id, after=1, last_event_id="3")
    got = []
    while (event := reader.next()) is not None:
        got.append((event["id"], event["event"]))
    reader.join()
    assert got == [("4", "task.progress"), ("5", "task.progress"), ("6", "task.failed")]
    # Resuming after the last event of a finished task: nothing more, the stream ends at once.
    done = StreamReader(schema.url, task_id, last_event_id="6")
    assert done.next() is None and done.status == 200
    with schema.client() as client:
        bad = client.get(f"/api/v1/tasks/{task_id}/events", headers={"Accept": "text/event-stream", "Last-Event-ID": "x"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"
        missing = client.get(f"/api/v1/tasks/{uuid.uuid4()}/events", headers={"Accept": "text/event-stream"})
        assert missing.status_code == 404


def test_streams_end_when_the_writer_drains(cluster, database_url):
    writer = cluster.writer().wait_ready()
    task_id = run(database_url, new_task)
    readers = [StreamReader(writer.url, task_id) for _ in range(3)]
    for reader in readers:
        assert reader.next()["id"] == "1"
    started = time.monotonic()
    writer.signal(signal.SIGTERM)
    for reader in readers:
        assert reader.next(timeout=15) is None
        reader.join()
        assert reader.error is None  # ended by the writer, not cut by the server's shutdown
    # Before the server's own 5 s grace period would have cut them.
    assert time.monotonic() - started < 4
    assert writer.wait_exit(30) == 0


# -- the hub, in process -------------------------------------------------------------------------------


def test_one_listener_wakes_every_follower_and_survives_a_cut(schema, database_url, db_proxy):
    async def scenario(conn):
        hub = TaskEventHub(db_proxy.url_for(database_url))
        runner = asyncio.create_task(hub.run())
        try:
            deadline = time.monotonic() + 10
            while not hub.listening:
                assert time.monotonic() < deadline, "the hub never listened"
                await asyncio.sleep(0.05)
            task_id, other_id = await new_task(conn), await new_task(conn)
            await asyncio.sleep(0.5)  # their own task.queued notifications come and go first
            followers = [hub.subscribe(task_id) for _ in range(5)]
            bystander = hub.subscribe(other_id)
            assert hub.active == 6
            await store.append_event(conn, task_id, "task.progress", {})
            await asyncio.wait_for(asyncio.gather(*(f.wake.wait() for f in followers)), 5)
            await asyncio.sleep(0.3)
            assert not bystander.wake.is_set()  # only the task's own followers

            # Cut the listener off: a NOTIFY sent meanwhile is lost, the reconnect wakes everyone.
            for f in followers:
                f.wake.clear()
            db_proxy.cut()
            deadline = time.monotonic() + 10
            while hub.listening:
                assert time.monotonic() < deadline, "the hub did not notice the cut"
                await asyncio.sleep(0.05)
            await store.append_event(conn, task_id, "task.progress", {})
            await asyncio.wait_for(asyncio.gather(*(f.wake.wait() for f in followers)), 15)
            assert hub.listening and hub.reconnects >= 1
            for s in [*followers, bystander]:
                s.release()
            assert hub.active == 0
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    run(database_url, scenario)


def test_the_stream_bound_answers_busy(schema):
    hub = TaskEventHub("postgresql://unused", max_streams=2)
    first, second = hub.subscribe(uuid.uuid4()), hub.subscribe(uuid.uuid4())
    with pytest.raises(Busy):
        hub.subscribe(uuid.uuid4())
    first.release()
    first.release()  # twice is harmless
    third = hub.subscribe(uuid.uuid4())
    hub.close()
    with pytest.raises(Busy):
        hub.subscribe(uuid.uuid4())  # closing: no new streams
    second.release(), third.release()
    assert hub.active == 0


def test_a_stream_without_notifications_still_gets_every_event(schema, database_url):
    """The hub never listens here (as if every NOTIFY were lost): polling delivers, in order,
    and the keep-alive comment is sent while nothing happens."""

    async def scenario(conn):
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
        hub = TaskEventHub(database_url)  # not running
        task_id = await new_task(conn)
        subscription = hub.subscribe(task_id)
        received: list[bytes] = []

        async def consume():
            async for chunk in frames(pool, subscription, 0, poll_s=0.2, keepalive_s=0.3):
                received.append(chunk)

        consumer = asyncio.create_task(consume())
        try:
            await asyncio.sleep(0.5)
            for i in range(3):
                await store.append_event(conn, task_id, "task.progress", {"i": i})
            await store.transition(conn, task_id, allowed_from=("queued",), to="cancelled", event="task.cancelled")
            await asyncio.wait_for(consumer, 10)
        finally:
            consumer.cancel()
            subscription.release()
            await pool.close()
        return b"".join(received).decode()

    text = run(database_url, scenario)
    ids = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("id: ")]
    assert ids == ["1", "2", "3", "4", "5"]
    assert ": keep-alive" in text
    assert text.startswith("retry: ")


def test_a_client_that_leaves_gives_its_place_back(schema, database_url):
    task_id = run(database_url, new_task)

    def streams_open() -> float:
        with schema.client() as client:
            text = client.get("/health/metrics").text
        lines = [line for line in text.splitlines() if line.startswith("arkvory_task_event_streams ")]
        assert len(lines) == 1, text
        return float(lines[0].split()[1])

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "text/event-stream"}
    with httpx.Client(base_url=schema.url, timeout=10) as client:
        for _ in range(3):
            with client.stream("GET", f"/api/v1/tasks/{task_id}/events", headers=headers) as answer:
                assert answer.status_code == 200
                lines = answer.iter_lines()  # kept: a dropped iterator closes the response
                assert next(lines).startswith("retry:")
                opened = streams_open()
                assert opened >= 1, opened
            client.close()  # the connection goes, not only the response
            client = httpx.Client(base_url=schema.url, timeout=10)
    deadline = time.monotonic() + 10
    while streams_open() != 0:
        assert time.monotonic() < deadline, "streams of departed clients still counted"
        time.sleep(0.2)


def test_head_never_opens_a_stream(schema, database_url):
    task_id = run(database_url, new_task)
    with schema.client() as client:
        for _ in range(3):
            answer = client.head(f"/api/v1/tasks/{task_id}/events", headers={"Accept": "text/event-stream"})
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
        text = client.get("/health/metrics").text
    assert "arkvory_task_event_streams 0.0" in text.splitlines()


def test_streams_beyond_the_bound_get_503_busy(schema, database_url):
    from arkvory.writer.tasks.stream import MAX_STREAMS

    task_id = run(database_url, new_task)

    async def scenario():
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Accept": "text/event-stream"}
        limits = httpx.Limits(max_connections=MAX_STREAMS + 2)
        async with httpx.AsyncClient(base_url=schema.url, timeout=30, limits=limits, headers=headers) as client:
            opened = []
            try:
                for _ in range(MAX_STREAMS):
                    request = client.build_request("GET", f"/api/v1/tasks/{task_id}/events")
                    answer = await client.send(request, stream=True)
                    assert answer.status_code == 200
                    opened.append(answer)
                refused = await client.get(f"/api/v1/tasks/{task_id}/events")
                # The JSON form is not bounded by the streams.
                plain = await client.get(f"/api/v1/tasks/{task_id}/events", headers={"Accept": "application/json"})
            finally:
                for answer in opened:
                    await answer.aclose()
            return refused, plain

    refused, plain = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.json()["code"] == "busy", refused.text
    assert "retry-after" in refused.headers
    assert plain.status_code == 200
