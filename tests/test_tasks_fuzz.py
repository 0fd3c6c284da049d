"""Hostile input to the task routes of a live writer (hypothesis, derandomized, bounded):
dispatch bodies, task ids and sub-paths, list and event query parameters, Accept, Last-Event-ID
and Idempotency-Key headers. Never a 5xx except a documented 503 with Retry-After; every error
is JSON with a `code`. The writer is still ready at the end."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import uuid

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from arkvory.writer.tasks import store

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, Cluster

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def site(postgres, module_tmp_path):
    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    cluster = Cluster(database_url, module_tmp_path)
    try:
        writer = cluster.writer().wait_ready()
        with writer.client() as client:
            queued = client.post("/api/v1/tasks", json={"kind": "cleanup"}).json()["id"]
            finished = client.post("/api/v1/tasks", json={"kind": "verify"}).json()["id"]

        async def finish():
            conn = await asyncpg.connect(database_url)
            try:
                await store.transition(conn, uuid.UUID(finished), allowed_from=("queued",), to="completed",
                                       event="task.completed")
            finally:
                await conn.close()

        asyncio.run(finish())
        with httpx.Client(base_url=writer.url, timeout=20) as client:
            yield {"writer": writer, "client": client, "ids": [queued, finished]}
    finally:
        cluster.close()


NASTY = ["\x00", "\x01", "\n", "\x7f", "\u0436", "\ud800", "/", "..", ".", "%", "%00", "?", "#", " ", "'", '"', "{", "-1",
         "9" * 40, "1e999", "NaN"]
texts = st.one_of(
    st.text(max_size=30),
    st.lists(st.sampled_from(NASTY + ["a", "cleanup", "verify", "queued", "1", "0"]), max_size=5).map("".join),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
dispatch_bodies = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.one_of(st.sampled_from(["cleanup", "verify"]), texts, json_values)},
        optional={
            "params": st.one_of(st.just({}), json_values),
            "on_restart": st.one_of(st.sampled_from(["fail", "retry", "resume"]), texts, json_values),
            "version": st.one_of(texts, json_values),
            "budget": st.one_of(
                st.dictionaries(st.sampled_from(["max_items", "max_bytes", "max_transitions", "max_cost_units",
                                                 "max_state_bytes", "max_x"]), json_values, max_size=3),
                json_values,
            ),
            "extra": json_values,
        },
    ).map(lambda d: json.dumps(d).encode("utf-8", "surrogatepass")),
    json_values.map(lambda d: json.dumps(d).encode("utf-8", "surrogatepass")),
    st.binary(max_size=100),
    st.sampled_from([
        b'{"kind": "cleanup", "budget": {"max_items": NaN}}', b'{"kind": "cleanup", "params": {"x": Infinity}}',
        b'{"kind": "cleanup", "params": {"x": 1e400}}', b'{"kind": "cleanup", "params": {"x": "\\u0000"}}',
        b'{"kind": "cleanup", "params": {"x": "\\ud800"}}', b'{"kind": "cleanup", "version": "\\ud800"}',
        b"[" * 5000 + b"]" * 5000, b'{"kind": "cleanup", "params": ' + b'{"a":' * 40 + b"1" + b"}" * 41,
    ]),
)
visible = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=70)
headers = st.dictionaries(
    st.sampled_from(["Accept", "Last-Event-ID", "Idempotency-Key", "Content-Type"]),
    st.one_of(visible, st.sampled_from(["text/event-stream", "application/json, text/event-stream", "0", "7",
                                        "-1", "99999999999", "schedule:cleanup:1"])),
    max_size=3,
)
tokens = st.sampled_from([ADMIN_TOKEN, ADMIN_TOKEN, ADMIN_TOKEN, READER_TOKEN, OTHER_TOKEN, None, "garbage"])
queries = st.dictionaries(
    st.sampled_from(["kind", "status", "limit", "cursor", "after", "order", "x"]),
    st.one_of(texts, st.sampled_from(["cleanup", "queued", "completed", "1", "1000", "1001", "0", "newest", "oldest",
                                      "WyJ4IiwieSJd", "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwieCJd"])),
    max_size=3,
)


def encode(value: str) -> str:
    return urllib.parse.quote(value.encode("utf-8", "surrogatepass"), safe="")


def send(site, method: str, path: str, query: dict, header_map: dict, token, body: bytes | None) -> None:
    url = path + ("?" + "&".join(f"{encode(k)}={encode(v)}" for k, v in query.items()) if query else "")
    sent = {name: value.strip() for name, value in header_map.items()}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    client: httpx.Client = site["client"]
    with client.stream(method, url, headers=sent, content=body) as answer:
        status = answer.status_code
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            assert status == 200
            return  # a live stream: leaving closes it
        text = answer.read().decode("utf-8", "replace")
    if status >= 500:
        assert status == 503 and "retry-after" in answer.headers, (method, url, status, text)
    if status >= 400 and method != "HEAD":
        assert answer.headers.get("content-type", "").startswith("application/json"), (status, text)
        assert isinstance(json.loads(text).get("code"), str), text


@FUZZ
@given(body=dispatch_bodies, header_map=headers, token=tokens)
@example(body=b'{"kind": "cleanup", "budget": {"max_items": 1e23}}', header_map={}, token=ADMIN_TOKEN)
@example(body=b'{"kind": "cleanup"}', header_map={"Idempotency-Key": "schedule:cleanup:1"}, token=ADMIN_TOKEN)
def test_dispatch_bodies(site, body, header_map, token):
    send(site, "POST", "/api/v1/tasks", {}, {"Content-Type": "application/json", **header_map}, token, body)


@FUZZ
@given(target=st.one_of(st.sampled_from(["queued", "finished", "unknown"]), texts),
       suffix=st.sampled_from(["", "/events", "/cancel", "/x", "/events/"]),
       method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE"]),
       query=queries, header_map=headers, token=tokens)
@example(target="queued", suffix="/events", method="GET", query={"after": "0"},
         header_map={"Accept": "text/event-stream", "Last-Event-ID": "99999999999"}, token=ADMIN_TOKEN)
def test_task_ids_and_sub_routes(site, target, suffix, method, query, header_map, token):
    known = {"queued": site["ids"][0], "finished": site["ids"][1], "unknown": str(uuid.uuid4())}
    task = known.get(target, target)
    body = b"{}" if method in ("POST", "PUT") else None
    send(site, method, f"/api/v1/tasks/{encode(task)}{suffix}", query, header_map, token, body)


@FUZZ
@given(query=queries, header_map=headers, token=tokens)
def test_list_queries(site, query, header_map, token):
    send(site, "GET", "/api/v1/tasks", query, header_map, token, None)


def test_the_writer_still_serves_after_the_fuzz(site):
    assert site["writer"].status() == (200, "ready")
    with site["writer"].client() as client:
        assert client.get("/api/v1/tasks", params={"limit": 1}).status_code == 200
