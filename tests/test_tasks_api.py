"""The task API on a live writer (SPEC §7, issue 8): dispatch committed before 202, the status
JSON, idempotent dispatch with keys global across kinds, the definition hash, list filters and
pagination, cancel semantics (and cancel racing completion), permissions, and retention."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import random
import uuid

import asyncpg
import pytest

from arkvory.writer.tasks import store
from arkvory.writer.tasks.definition import canonical_json, definition_hash, normalise
from arkvory.writer.tasks.retention import prune_finished
from arkvory.shared.errors import InvalidInput

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN

pytestmark = pytest.mark.timeout(120)

KEY = "Idempotency-Key"


@pytest.fixture(scope="module")
def writer(module_cluster):
    """One writer for the tests that look only at the tasks they dispatch themselves."""
    return module_cluster.writer().wait_ready()


@pytest.fixture
def fresh_writer(cluster):
    """A writer and database of its own, for a test that counts or lists every task."""
    return cluster.writer().wait_ready()


def dispatch(client, body=None, key=None):
    headers = {KEY: key} if key is not None else {}
    return client.post("/api/v1/tasks", json=body if body is not None else {"kind": "cleanup"}, headers=headers)


def on_connection(database_url, work):
    async def run():
        conn = await asyncpg.connect(database_url)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def move(database_url, task_id, allowed_from, to, event, **fields):
    return on_connection(
        database_url,
        lambda conn: store.transition(
            conn, uuid.UUID(task_id), allowed_from=allowed_from, to=to, event=event, fields=fields or None
        ),
    )


def events_of(database_url, task_id):
    return on_connection(database_url, lambda conn: store.fetch_events(conn, uuid.UUID(task_id)))


# -- dispatch ----------------------------------------------------------------------------------


def test_dispatch_is_committed_with_its_event_before_the_202(writer, module_database_url):
    with writer.client() as client:
        for _ in range(5):
            answer = dispatch(client)
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["id"]

            # Right after the 202, from a connection of our own.
            async def look(conn):
                row = await conn.fetchrow("SELECT status FROM arkvory_tasks WHERE id = $1", uuid.UUID(task_id))
                events = await conn.fetch("SELECT seq, type FROM arkvory_task_events WHERE task_id = $1", uuid.UUID(task_id))
                return row, [tuple(e) for e in events]

            row, events = on_connection(module_database_url, look)
            assert row is not None and row["status"] == "queued"
            assert events == [(1, "task.queued")]
            assert answer.headers["location"] == f"/api/v1/tasks/{task_id}"


def test_status_json_exposes_the_definition_budget_and_times(writer):
    body = {"kind": "verify", "params": {}, "on_restart": "fail", "version": "v1.2 nightly",
            "budget": {"max_items": 10, "max_bytes": 1.0e6}}
    with writer.client() as client:
        answer = dispatch(client, body)
        assert answer.status_code == 202, answer.text
        task = answer.json()
        shown = client.get(answer.headers["location"])
    assert shown.status_code == 200 and shown.json() == task
    assert task["kind"] == "verify" and task["status"] == "queued" and task["on_restart"] == "fail"
    assert task["definition_version"] == "v1.2 nightly"
    assert task["definition_hash"] == definition_hash("verify", "v1.2 nightly", {}, {"max_items": 10, "max_bytes": 1000000})
    assert task["idempotency_key"] is None
    assert task["budget"] == {
        "limits": {"max_items": 10, "max_bytes": 1000000},
        "usage": {"items": 0, "bytes": 0, "transitions": 0, "cost_units": 0, "state_bytes": 0},
    }
    assert task["error"] is None and task["result"] is None and task["attempts"] == 0
    assert task["max_attempts"] == 3
    assert task["created_by"] == "key:admin"
    assert task["created_at"] and task["updated_at"] and task["started_at"] is None and task["finished_at"] is None
    assert task["last_event"] == 1


def test_on_restart_defaults_suit_the_kind(writer):
    with writer.client() as client:
        assert dispatch(client, {"kind": "cleanup"}).json()["on_restart"] == "retry"
        assert dispatch(client, {"kind": "verify"}).json()["on_restart"] == "resume"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"kind": "nope"},
        {"kind": 1},
        {"kind": "cleanup", "on_restart": "later"},
        {"kind": "cleanup", "version": ""},
        {"kind": "cleanup", "version": "x" * 65},
        {"kind": "cleanup", "version": "a\nb"},
        {"kind": "cleanup", "version": 3},
        {"kind": "cleanup", "budget": {"max_items": 0}},
        {"kind": "cleanup", "budget": {"max_things": 1}},
        {"kind": "cleanup", "budget": {"max_items": 1.5}},
        {"kind": "cleanup", "budget": []},
        {"kind": "cleanup", "params": []},
        {"kind": "cleanup", "params": "x"},
        {"kind": "cleanup", "surprise": True},
        # The document types each field: null is not a value of any of them.
        {"kind": "cleanup", "budget": None},
        {"kind": "cleanup", "params": None},
        {"kind": "cleanup", "version": None},
        {"kind": "cleanup", "on_restart": None},
        {"kind": "cleanup", "max_attempts": None},
        {"kind": "cleanup", "max_attempts": 0},
        {"kind": "cleanup", "max_attempts": 11},
        {"kind": "cleanup", "max_attempts": 1.5},
        {"kind": "cleanup", "max_attempts": "3"},
        {"kind": "cleanup", "max_attempts": True},
    ],
)
def test_bad_dispatch_bodies_are_400(writer, body):
    with writer.client() as client:
        answer = dispatch(client, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_input"


def test_numbers_without_one_spelling_are_400(writer):
    with writer.client() as client:
        for raw in (b'{"kind": "cleanup", "budget": {"max_items": NaN}}',
                    b'{"kind": "cleanup", "budget": {"max_items": Infinity}}',
                    b'{"kind": "cleanup", "budget": {"max_items": 1e23}}'):
            answer = client.post("/api/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, (raw, answer.text)
        for key in ("", "x" * 65, "schedule:cleanup:1"):
            answer = dispatch(client, key=key)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", (key, answer.text)


def test_the_same_key_returns_the_original_task(fresh_writer, database_url):
    with fresh_writer.client() as client:
        first = dispatch(client, {"kind": "cleanup", "budget": {"max_items": 10}}, key="nightly-1")
        # Other spellings of the same definition: key order and number formatting do not matter.
        raw = b'{"budget": {"max_items": 1e1}, "kind": "cleanup"}'
        again = client.post("/api/v1/tasks", content=raw, headers={KEY: "nightly-1", "Content-Type": "application/json"})
        third = dispatch(client, {"kind": "cleanup", "budget": {"max_items": 10.0}}, key="nightly-1")
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    for replay in (again, third):
        assert replay.status_code == 202, replay.text
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json()["id"] == first.json()["id"]
        assert replay.headers["location"] == first.headers["location"]
    assert first.json()["idempotency_key"] == "nightly-1"
    count = on_connection(database_url, lambda c: c.fetchval("SELECT count(*) FROM arkvory_tasks"))
    assert count == 1


def test_the_same_key_with_another_definition_is_422_across_kinds(fresh_writer, database_url):
    with fresh_writer.client() as client:
        assert dispatch(client, {"kind": "cleanup"}, key="k").status_code == 202
        for other in ({"kind": "verify"}, {"kind": "cleanup", "budget": {"max_items": 5}},
                      {"kind": "cleanup", "version": "2"}, {"kind": "cleanup", "on_restart": "fail"},
                      {"kind": "cleanup", "max_attempts": 5}):
            answer = dispatch(client, other, key="k")
            assert answer.status_code == 422, (other, answer.text)
            assert answer.json()["code"] == "IdempotentParameterMismatch"
        # Keys are global: another administrator's dispatch with the key gets the same task.
    count = on_connection(database_url, lambda c: c.fetchval("SELECT count(*) FROM arkvory_tasks"))
    assert count == 1


def test_max_attempts_is_dispatched_and_shown_but_not_hashed(writer):
    with writer.client() as client:
        answer = dispatch(client, {"kind": "cleanup", "max_attempts": 5})
        assert answer.status_code == 202, answer.text
        assert client.get(answer.headers["location"]).json()["max_attempts"] == 5
        # It says how crashes are handled, not what the work is: the definition hash is the same.
        assert answer.json()["definition_hash"] == dispatch(client).json()["definition_hash"]
        assert dispatch(client, {"kind": "cleanup", "max_attempts": 1.0}).json()["max_attempts"] == 1


def test_last_event_id_is_checked_in_either_form(writer):
    with writer.client() as client:
        task_id = dispatch(client).json()["id"]
        for accept in ("application/json", "text/event-stream"):
            for bad in ("-1", "x", "2147483648"):
                answer = client.get(f"/api/v1/tasks/{task_id}/events", headers={"Accept": accept, "Last-Event-ID": bad})
                assert answer.status_code == 400, (accept, bad, answer.text)
                assert answer.json()["code"] == "invalid_input" and "Last-Event-ID" in answer.json()["message"]
        fine = client.get(f"/api/v1/tasks/{task_id}/events", headers={"Last-Event-ID": "0"})
        assert fine.status_code == 200 and fine.json()["last_event"] == 1


def test_racing_dispatches_with_one_key_make_one_task(fresh_writer, database_url):
    body = {"kind": "verify", "params": {}}
    for round_number in range(3):
        key = f"race-{round_number}"
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            def send(_):
                with fresh_writer.client() as client:
                    return dispatch(client, body, key=key)
            answers = list(pool.map(send, range(12)))
        assert all(a.status_code == 202 for a in answers), [a.text for a in answers if a.status_code != 202]
        assert len({a.json()["id"] for a in answers}) == 1
        assert sum("idempotent-replayed" not in a.headers for a in answers) == 1
    count = on_connection(database_url, lambda c: c.fetchval("SELECT count(*) FROM arkvory_tasks"))
    assert count == 3


# -- the definition hash -------------------------------------------------------------------------


def test_definition_hash_ignores_key_order_and_number_spelling():
    one = definition_hash("cleanup", None, {"a": 1, "b": [1.5, {"y": 2, "x": 0.5}]}, {"max_items": 3})
    same = definition_hash("cleanup", None, {"b": [1.5, {"x": 5e-1, "y": 2.0}], "a": 1e0}, {"max_items": 3.0})
    assert one == same
    assert one == hashlib.sha256(
        b'{"budget":{"max_items":3},"kind":"cleanup","params":{"a":1,"b":[1.5,{"x":0.5,"y":2}]},"version":null}'
    ).hexdigest()
    assert definition_hash("cleanup", "1", {}, {}) != definition_hash("cleanup", None, {}, {})
    assert definition_hash("verify", None, {}, {}) != definition_hash("cleanup", None, {}, {})
    assert definition_hash("cleanup", None, {"a": 1}, {}) != definition_hash("cleanup", None, {"a": 1.5}, {})
    assert definition_hash("cleanup", None, {"a": "1"}, {}) != definition_hash("cleanup", None, {"a": 1}, {})
    # Stable across runs and processes: a fixed input has a fixed hash.
    assert definition_hash("cleanup", None, {}, {}) == hashlib.sha256(
        b'{"budget":{},"kind":"cleanup","params":{},"version":null}'
    ).hexdigest()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e23, 2.0**53, 2**64, "a\x00", "\ud800", {"k": {1: 2}}])
def test_definition_values_without_one_spelling_are_refused(value):
    with pytest.raises(InvalidInput):
        normalise({"v": value})


def test_canonical_json_is_compact_sorted_ascii():
    assert canonical_json(normalise({"b": 1.0, "a": "\u0436", "c": [True, None]})) == '{"a":"\\u0436","b":1,"c":[true,null]}'
    assert normalise(-0.0) == 0 and normalise(2.0**53 - 1) == 2**53 - 1


# -- reading ---------------------------------------------------------------------------------------


def test_list_filters_and_pages_newest_first(fresh_writer, database_url):
    with fresh_writer.client() as client:
        made = [dispatch(client, {"kind": kind}).json()["id"] for kind in ("cleanup", "verify") * 5]
        move(database_url, made[0], ("queued",), "running", "task.running")
        move(database_url, made[2], ("queued",), "failed", "task.failed", error_code="x", error_message="y")

        everything = client.get("/api/v1/tasks").json()
        assert [t["id"] for t in everything["items"]] == made[::-1]
        assert everything["nextCursor"] is None

        seen, cursor = [], None
        for _ in range(10):
            params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = client.get("/api/v1/tasks", params=params)
            assert page.status_code == 200, page.text
            seen += [t["id"] for t in page.json()["items"]]
            cursor = page.json()["nextCursor"]
            if cursor is None:
                break
        assert seen == made[::-1]

        verify = client.get("/api/v1/tasks", params={"kind": "verify"}).json()["items"]
        assert [t["id"] for t in verify] == made[1::2][::-1]
        running = client.get("/api/v1/tasks", params={"status": "running"}).json()["items"]
        assert [t["id"] for t in running] == [made[0]]
        failed = client.get("/api/v1/tasks", params={"status": "failed", "kind": "cleanup"}).json()["items"]
        assert [t["id"] for t in failed] == [made[2]]
        assert failed[0]["error"] == {"code": "x", "message": "y"} and failed[0]["finished_at"]
        assert client.get("/api/v1/tasks", params={"status": "failed", "kind": "verify"}).json()["items"] == []

        for bad in ({"kind": "x"}, {"status": "done"}, {"limit": 0}, {"cursor": "garbage"},
                    {"cursor": "WyJ4IiwieSJd"}):  # ["x","y"]: a well-formed cursor of nonsense
            answer = client.get("/api/v1/tasks", params=bad)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", (bad, answer.text)


def test_unknown_and_malformed_task_ids(writer):
    with writer.client() as client:
        for path in ("", "/events", "/cancel"):
            method = client.post if path == "/cancel" else client.get
            assert method(f"/api/v1/tasks/{uuid.uuid4()}{path}").status_code == 404
            malformed = method(f"/api/v1/tasks/not-a-uuid{path}")
            assert malformed.status_code == 400 and malformed.json()["code"] == "invalid_input"


def test_only_administrators_use_tasks(writer):
    with writer.client() as admin:
        task_id = dispatch(admin).json()["id"]
    calls = [
        ("POST", "/api/v1/tasks", {"kind": "cleanup"}),
        ("GET", "/api/v1/tasks", None),
        ("GET", f"/api/v1/tasks/{task_id}", None),
        ("GET", f"/api/v1/tasks/{task_id}/events", None),
        ("POST", f"/api/v1/tasks/{task_id}/cancel", None),
    ]
    for token, status, code in ((None, 401, "unauthorized"), (READER_TOKEN, 403, "forbidden"), (OTHER_TOKEN, 403, "forbidden")):
        with writer.client(token) as client:
            for method, path, body in calls:
                answer = client.request(method, path, json=body)
                assert answer.status_code == status, (token, method, path, answer.text)
                assert answer.json()["code"] == code
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.get(f"/api/v1/tasks/{task_id}").json()["status"] == "queued"  # nothing changed


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_follows_the_status(writer, module_database_url):
    with writer.client() as client:
        queued = dispatch(client).json()["id"]
        answer = client.post(f"/api/v1/tasks/{queued}/cancel")
        assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.text
        assert answer.json()["finished_at"]
        assert [e["type"] for e in events_of(module_database_url, queued)] == ["task.queued", "task.cancelled"]

        running = dispatch(client).json()["id"]
        move(module_database_url, running, ("queued",), "running", "task.running")
        first = client.post(f"/api/v1/tasks/{running}/cancel")
        assert first.status_code == 202 and first.json()["status"] == "cancelling", first.text
        again = client.post(f"/api/v1/tasks/{running}/cancel")
        assert again.status_code == 202 and again.json()["status"] == "cancelling"
        assert [e["type"] for e in events_of(module_database_url, running)] == ["task.queued", "task.running", "task.cancelling"]

        done = dispatch(client).json()["id"]
        move(module_database_url, done, ("queued",), "completed", "task.completed")
        refused = client.post(f"/api/v1/tasks/{done}/cancel")
        assert refused.status_code == 409 and refused.json()["code"] == "conflict"
        assert "completed" in refused.json()["message"]
        assert client.post(f"/api/v1/tasks/{queued}/cancel").status_code == 409  # already cancelled

        # With an Idempotency-Key, a retry replays the first answer.
        keyed = dispatch(client).json()["id"]
        one = client.post(f"/api/v1/tasks/{keyed}/cancel", headers={KEY: "c-1"})
        two = client.post(f"/api/v1/tasks/{keyed}/cancel", headers={KEY: "c-1"})
        assert one.status_code == two.status_code == 200 and two.headers["idempotent-replayed"] == "true"


def test_cancel_racing_completion_never_ends_both(fresh_writer, database_url):
    """100 rounds: a cancel over HTTP and a running -> completed transition on another
    connection, released together. Exactly one terminal event per task, agreeing with the row.

    Which side is faster depends on the host (an HTTP cancel took under 0.3 ms on one CI machine,
    so fixed delays of 0-20 ms let the cancel win all 100 rounds). A staircase keeps the race at
    its crossover instead: the head start moves toward the side that lost the last round, so
    rounds land where both transitions meet the row at once, on any host."""
    with fresh_writer.client() as client:
        ids = [dispatch(client).json()["id"] for _ in range(100)]

    async def prepare(conn):
        for task_id in ids:
            await store.transition(conn, uuid.UUID(task_id), allowed_from=("queued",), to="running", event="task.running")

    on_connection(database_url, prepare)

    async def finish(conn, task_id, go, delay):
        """What the worker does: complete the running task; if a cancel got there first, end
        it as cancelled instead."""
        await go.wait()
        await asyncio.sleep(max(delay, 0))
        done = await store.transition(conn, uuid.UUID(task_id), allowed_from=("running",),
                                      to="completed", event="task.completed", fields={"result": {"ok": True}})
        if done is None:
            done = await store.transition(conn, uuid.UUID(task_id), allowed_from=("cancelling",),
                                          to="cancelled", event="task.cancelled")
        return done["status"]

    import httpx

    async def race():
        conn = await asyncpg.connect(database_url)
        rng = random.Random(8)
        outcomes = []
        # The completion's head start in seconds (negative: the cancel waits instead), moved by
        # a step after each round toward the side that lost it, with a little jitter.
        head_start, step = 0.005, 0.001
        try:
            async with httpx.AsyncClient(base_url=fresh_writer.url, timeout=20,
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
                for task_id in ids:
                    go = asyncio.Event()
                    delay = head_start + rng.uniform(-step, step)
                    completion = asyncio.create_task(finish(conn, task_id, go, delay))

                    async def cancel():
                        await go.wait()
                        await asyncio.sleep(max(-delay, 0))
                        return await http.post(f"/api/v1/tasks/{task_id}/cancel")

                    cancelling = asyncio.create_task(cancel())
                    await asyncio.sleep(0)
                    go.set()
                    ended, answer = await asyncio.gather(completion, cancelling)
                    # The cancel's answer agrees with the outcome: 202 (it won) or 409 (too late).
                    assert (answer.status_code, ended) in ((202, "cancelled"), (409, "completed")), answer.text
                    outcomes.append(ended)
                    head_start += -step if ended == "cancelled" else step
                    head_start = min(max(head_start, -0.05), 0.05)
        finally:
            await conn.close()
        return outcomes

    outcomes = asyncio.run(race())

    async def check(conn):
        rows = await conn.fetch("SELECT id, status FROM arkvory_tasks")
        events = await conn.fetch(
            "SELECT task_id, array_agg(type ORDER BY seq) AS types, array_agg(seq ORDER BY seq) AS seqs"
            " FROM arkvory_task_events GROUP BY task_id"
        )
        return {r["id"]: r["status"] for r in rows}, {e["task_id"]: (list(e["types"]), list(e["seqs"])) for e in events}

    statuses, logs = on_connection(database_url, check)
    terminal = {"task.completed", "task.failed", "task.cancelled"}
    assert len(statuses) == 100
    for task_id, status in statuses.items():
        types, seqs = logs[task_id]
        assert seqs == list(range(1, len(seqs) + 1))
        ends = [t for t in types if t in terminal]
        assert len(ends) == 1 and ends[0] == f"task.{status}", (status, types)
        assert ("task.cancelling" in types) == (status == "cancelled"), types
    assert len(outcomes) == 100
    # The race went both ways (the staircase sends it back whenever one side keeps winning).
    assert set(outcomes) == {"cancelled", "completed"}, outcomes


# -- retention -------------------------------------------------------------------------------------


def test_retention_prunes_only_old_finished_tasks(database_url, cluster):
    cluster.writer().wait_ready().kill()  # the schema

    async def scenario(conn):
        made = {}
        for name, status in (("old_done", "completed"), ("old_failed", "failed"), ("old_cancelled", "cancelled"),
                             ("old_running", "running"), ("old_queued", "queued"), ("fresh_done", "completed")):
            async with conn.transaction():
                task = await store.insert_task(conn, kind="cleanup", params={}, on_restart="retry",
                                               definition_version=None, definition_hash="0" * 64, budget={},
                                               idempotency_key=name, created_by="test")
            if status != "queued":
                await store.transition(conn, task["id"], allowed_from=("queued",), to=status, event=f"task.{status}")
            made[name] = task["id"]
        await conn.execute(
            "UPDATE arkvory_tasks SET created_at = now() - interval '30 days',"
            " finished_at = CASE WHEN finished_at IS NULL THEN NULL ELSE now() - interval '8 days' END"
            " WHERE idempotency_key LIKE 'old%'"
        )
        deleted = await prune_finished(conn, 7 * 86400, batch=2)
        left = {r["idempotency_key"] for r in await conn.fetch("SELECT idempotency_key FROM arkvory_tasks")}
        orphans = await conn.fetchval(
            "SELECT count(*) FROM arkvory_task_events e WHERE NOT EXISTS (SELECT 1 FROM arkvory_tasks t WHERE t.id = e.task_id)"
        )
        again = await prune_finished(conn, 7 * 86400)
        return deleted, left, orphans, again

    deleted, left, orphans, again = on_connection(database_url, scenario)
    assert deleted == 3 and again == 0
    assert left == {"old_running", "old_queued", "fresh_done"}
    assert orphans == 0
