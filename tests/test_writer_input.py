"""Hostile input to a standalone writer never gives a 500, and no body is read or parsed
before it is known to be small, shallow, from an authenticated caller and still arriving."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import urllib.parse
import uuid

import asyncpg
import httpx
import pytest

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, db_execute, db_fetch, eventually
from .rawhttp import complete, read_response, status_of

pytestmark = pytest.mark.timeout(120)

DEEP = b"[" * 200_000


def raw_exchange(port: int, request: bytes, *, then_wait: float = 10.0) -> bytes:
    """Send `request` as is, then read what the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=then_wait) as sock:
        sock.sendall(request)
        received = b""
        try:
            while not complete(received):
                data = sock.recv(65536)
                if not data:
                    break
                received += data
        except TimeoutError:
            pass
    return received


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_RECEIVE_TIMEOUT_SECONDS="2", ARKVORY_MAX_UPLOADS="1").wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
        assert client.post("/api/v1/repositories", json={"name": "other"}).status_code == 201
    return writer


def upload(client: httpx.Client, repo: str = "priv", body: bytes = b"bytes", **params) -> httpx.Response:
    return client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "f.bin", **params}, content=body)


def assert_error(answer: httpx.Response, status: int, code: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == code, answer.text


# -- JSON bodies: authenticated, then bounded in size and depth --------------------------------


def test_a_declared_length_above_the_cap_is_refused_before_a_byte_is_read(writer):
    request = (
        b"POST /api/v1/repositories HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {ADMIN_TOKEN}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_exchange(writer.port, request, then_wait=10)
    assert status_of(answer) == 413
    assert b'"payload_too_large"' in answer and b"connection: close" in answer.lower()
    assert time.monotonic() - started < 5  # the old code waited for a body that never came


def test_a_sent_body_above_the_cap_is_413(writer):
    with writer.client() as client:
        def chunks():
            for _ in range(40):
                yield b" " * 64 * 1024  # 2.5 MiB of whitespace, chunked: no length declared
        answer = client.post("/api/v1/repositories", content=chunks())
    assert_error(answer, 413, "payload_too_large")


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/v1/repositories"),
        ("PATCH", "/api/v1/repositories/priv"),
        ("PUT", "/api/v1/repositories/priv/packages"),
        ("PUT", "/api/v1/repositories/priv/assets?path=a"),
    ],
)
def test_deeply_nested_json_is_400_on_every_json_route(writer, method, path):
    with writer.client() as client:
        answer = client.request(method, path, content=DEEP)
        assert_error(answer, 400, "invalid_input")
        shallow_enough = b'{"x": ' + b"[" * 31 + b"]" * 31 + b"}"
        assert client.request(method, path, content=shallow_enough).status_code in (400, 404)


def test_anonymous_and_unauthorized_json_requests_are_refused_before_the_body(writer):
    """A 1 MiB-capped body is never read for a caller who may not do the thing: the answer
    comes while the declared (huge) body has not been sent at all."""
    for token, status in ((None, 401), (READER_TOKEN, 403)):
        auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        request = (
            b"POST /api/v1/repositories HTTP/1.1\r\nHost: x\r\n" + auth
            + b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n["
        )
        assert status_of(raw_exchange(writer.port, request, then_wait=10)) == status
    with writer.client(None) as client:
        assert_error(client.patch("/api/v1/repositories/priv", content=DEEP), 401, "unauthorized")
    with writer.client(OTHER_TOKEN) as client:
        assert_error(client.patch("/api/v1/repositories/priv", content=DEEP), 404, "not_found")


# -- names, paths and media types ---------------------------------------------------------------


def test_repository_names_are_full_matches(writer):
    with writer.client() as client:
        for name in ["pub\n", "pub\x00", "-x", "a" * 101, "ab/c"]:
            assert_error(client.post("/api/v1/repositories", json={"name": name}), 400, "invalid_input")


def test_artifact_names_are_file_names(writer):
    with writer.client() as client:
        for name in [".", "..", "a/b", "a\\b", "a\x00b", "a\x01b", "line\n", "x" * 256]:
            assert_error(upload(client, name=name), 400, "invalid_input")
        assert upload(client, name="ok name.tar.gz").status_code == 201


CONTROL_QUERIES = [
    "asset/content?path=a%00",
    "asset/content?path=a%01b",
    "packages/content?group=g%00&name=n&version=1",
    "packages/content?group=g&name=n%00&version=1",
    "packages/content?group=g&name=n&version=1%00",
]


def test_control_characters_in_content_lookups_are_400_before_any_query(writer):
    """On private and missing repositories too, with and without credentials."""
    for token in (None, ADMIN_TOKEN):
        with writer.client(token) as client:
            for repo in ("priv", "missing"):
                for query in CONTROL_QUERIES:
                    for method in ("GET", "HEAD"):
                        answer = client.request(method, f"/api/v1/repositories/{repo}/{query}")
                        assert answer.status_code == 400, (method, repo, query)
                        if method == "GET":
                            assert answer.json()["code"] == "invalid_input"


@pytest.mark.parametrize("field", ["group", "name", "version"])
def test_control_characters_in_package_fields_are_400(writer, field):
    with writer.client() as client:
        artifact = upload(client).json()
        body = {"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"], field: "x\x00"}
        assert_error(client.put("/api/v1/repositories/priv/packages", json=body), 400, "invalid_input")
        # A lone surrogate (legal in JSON's \\u escapes) cannot be encoded for the database.
        body[field] = "\ud800"
        escaped = json.dumps(body).encode()
        assert_error(client.put("/api/v1/repositories/priv/packages", content=escaped), 400, "invalid_input")
        assert_error(
            client.put("/api/v1/repositories/priv/assets", params={"path": "a\x00"}, json={"artifactId": artifact["id"]}),
            400,
            "invalid_input",
        )


def test_invalid_media_types_are_refused_at_upload(writer):
    with writer.client() as client:
        for media_type in ["\u0436/x", "text/plain\r\nX-Evil: 1", "text/plain\x01", "text", "a/b c", "a/b;c"]:
            assert_error(upload(client, mediaType=media_type), 400, "invalid_input")
        answer = client.post(
            "/api/v1/repositories/priv/artifacts", params={"name": "f"},
            content=b"x", headers={"Content-Type": "text plain"},
        )
        assert_error(answer, 400, "invalid_input")


def test_content_type_is_the_media_type_when_no_parameter_is_given(writer):
    with writer.client() as client:
        typed = client.post(
            "/api/v1/repositories/priv/artifacts", params={"name": "a.gz"},
            content=b"gz", headers={"Content-Type": "application/gzip"},
        ).json()
        assert typed["mediaType"] == "application/gzip"
        param = upload(client, mediaType="text/plain; charset=utf-8").json()
        assert param["mediaType"] == "text/plain; charset=utf-8"
        form = client.post(
            "/api/v1/repositories/priv/artifacts", params={"name": "b"},
            content=b"b", headers={"Content-Type": "application/x-www-form-urlencoded"},
        ).json()
        assert form["mediaType"] == "application/octet-stream"
        multipart = client.post(
            "/api/v1/repositories/priv/artifacts", params={"name": "c"},
            content=b"c", headers={"Content-Type": "multipart/form-data; boundary=x"},
        )
        assert multipart.status_code < 500
        download = client.get(f"/api/v1/repositories/priv/artifacts/{typed['id']}/content")
        assert download.headers["Content-Type"] == "application/gzip"


def test_absurdly_long_range_numbers_never_give_500(writer):
    with writer.client() as client:
        artifact = upload(client, body=b"0123456789").json()
        path = f"/api/v1/repositories/priv/artifacts/{artifact['id']}/content"
        for header in ("bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000):
            answer = client.get(path, headers={"Range": header})
            assert answer.status_code in (200, 206), answer.text
            assert answer.content == b"0123456789"
        assert_error(client.get(path, headers={"Range": "bytes=" + "9" * 5000 + "-"}), 416, "range_not_satisfiable")


# -- the HTTP edge ---------------------------------------------------------------------------------


def test_405_lists_every_method_of_the_path(writer):
    with writer.client() as client:
        answer = client.request("OPTIONS", "/api/v1/repositories")
        assert_error(answer, 405, "method_not_allowed")
        assert answer.headers["Allow"] == "GET, HEAD, POST"
        answer = client.request("POST", "/api/v1/repositories/priv")
        assert answer.headers["Allow"] == "GET, HEAD, PATCH, DELETE"
        assert "Retry-After" not in answer.headers


def test_a_trailing_slash_is_an_unknown_route_not_a_redirect(writer):
    with writer.client() as client:
        assert_error(client.get("/api/v1/repositories/"), 404, "not_found")
        assert_error(client.get("/api/v1/repositories/priv/artifacts/"), 404, "not_found")


def test_duplicate_authorization_headers_are_400(writer):
    request = (
        b"GET /api/v1/repositories HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {READER_TOKEN}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode()
    )
    answer = raw_exchange(writer.port, request)
    assert status_of(answer) == 400 and b'"invalid_input"' in answer


def test_foreign_key_race_is_409_not_500(writer, cluster):
    """The artifact exists when the route checks it and is deleted (by another transaction,
    here the test's) before the asset row's foreign key is checked."""
    with writer.client() as client:
        artifact = upload(client).json()
    database_url = cluster.database_url

    async def race() -> httpx.Response:
        conn = await asyncpg.connect(database_url)
        observer = await asyncpg.connect(database_url)
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.execute("DELETE FROM arkvory_artifacts WHERE id = $1", uuid.UUID(artifact["id"]))
            answer: list[httpx.Response] = []

            def point_asset() -> None:
                with writer.client() as client:
                    answer.append(client.put(
                        "/api/v1/repositories/priv/assets", params={"path": "p"}, json={"artifactId": artifact["id"]}
                    ))

            thread = threading.Thread(target=point_asset)
            thread.start()
            # Commit only once the writer's insert waits for our row lock (its FK check).
            # (Asked on another connection: a transaction sees one snapshot of pg_stat_activity.)
            for _ in range(100):
                waiting = await observer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE 'INSERT INTO arkvory_assets%'"
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "the writer's insert never waited for the deleted row"
            await tx.commit()
            await asyncio.to_thread(thread.join, 30)
            return answer[0]
        finally:
            await conn.close()
            await observer.close()

    assert_error(asyncio.run(race()), 409, "conflict")


def test_too_many_connections_is_503_with_retry_after(cluster):
    """A database that refuses new connections (here a role's connection limit: SQLSTATE
    53300, TooManyConnectionsError) answers 503 `unavailable` with Retry-After, not 500."""
    role = f"limited_{uuid.uuid4().hex[:8]}"
    database = urllib.parse.urlsplit(cluster.database_url).path.lstrip("/")
    db_execute(cluster.database_url, f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    db_execute(cluster.database_url, f'ALTER DATABASE "{database}" OWNER TO {role}')
    parts = urllib.parse.urlsplit(cluster.database_url)
    netloc = f"{role}:pw@{parts.hostname}:{parts.port}"
    writer = cluster.writer(ARKVORY_DATABASE_URL=urllib.parse.urlunsplit(parts._replace(netloc=netloc))).wait_ready()
    with writer.client() as client:
        assert client.get("/api/v1/repositories").status_code == 200
    # No new connection for this role from now on; end the pooled ones so the pool must open one.
    db_execute(cluster.database_url, f"ALTER ROLE {role} CONNECTION LIMIT 0")
    db_execute(
        cluster.database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE usename = $1 AND application_name NOT LIKE 'arkvory-%'",
        role,
    )
    eventually(  # pg_terminate_backend only signals: each backend exits a moment later
        lambda: not db_fetch(
            cluster.database_url,
            "SELECT 1 FROM pg_stat_activity WHERE usename = $1 AND application_name NOT LIKE 'arkvory-%'",
            role,
        ),
        "the pooled connections ended",
    )
    with writer.client() as client:
        answer = client.get("/api/v1/repositories")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "unavailable"
    assert "Retry-After" in answer.headers


# -- uploads: a silent body is cut and frees its place -----------------------------------------


def test_a_silent_upload_is_cut_after_the_receive_timeout_and_frees_its_place(writer, cluster):
    """ARKVORY_RECEIVE_TIMEOUT_SECONDS=2, ARKVORY_MAX_UPLOADS=1: an upload that declared
    1,000,000 bytes and sent 10 holds the only place; within the timeout (plus margin) it gets
    408, its temp file is gone, and the next upload gets the place."""
    tmp = cluster.data_dir / "tmp"
    request = (
        b"POST /api/v1/repositories/priv/artifacts?name=slow HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: 1000000\r\n\r\n".encode()
    )
    with socket.create_connection(("127.0.0.1", writer.port), timeout=15) as sock:
        sock.sendall(request + b"0123456789")
        deadline = time.monotonic() + 5
        while not [p for p in tmp.iterdir() if p.name.startswith("upload-")]:
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.05)
        with writer.client() as client:
            assert_error(upload(client), 503, "busy")  # the one place is taken
        started = time.monotonic()
        # The whole answer: its body may come in a later read than its head. (The old code
        # waited here for as long as the socket stayed open.)
        answer = read_response(sock)
        waited = time.monotonic() - started
    assert status_of(answer) == 408 and b'"request_timeout"' in answer
    assert waited < 2 + 3
    assert not [p for p in tmp.iterdir() if p.name.startswith("upload-")]
    with writer.client() as client:
        assert upload(client).status_code == 201
    aborts = 'arkvory_transfer_aborts_total{direction="upload",reason="receive_timeout"}'
    with writer.client() as client:
        assert f"{aborts} 1.0" in client.get("/health/metrics").text


def test_stale_upload_temp_files_are_removed_at_start(cluster):
    writer = cluster.writer().wait_ready()
    writer.kill()
    tmp = cluster.data_dir / "tmp"
    stale, fresh, other = tmp / "upload-stale", tmp / "upload-fresh", tmp / "keep-me"
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    cluster.writer(ARKVORY_RECEIVE_TIMEOUT_SECONDS="60").wait_ready()
    assert not stale.exists()
    assert fresh.exists() and other.exists()


# -- uploads: a principal's share of the places, and a minimum rate ------------------------------


def trickle(sock: socket.socket, stop: threading.Event, every_s: float = 0.5) -> None:
    """Send one byte every `every_s` (well within the receive timeout) until told to stop."""
    try:
        while not stop.wait(every_s):
            sock.sendall(b"x")
    except OSError:
        pass  # the server answered and closed


def held_upload(port: int, repo: str = "priv", length: int = 1_000_000) -> socket.socket:
    """A one-shot upload that has sent its head and 10 bytes: it holds an upload place."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(
        f"POST /api/v1/repositories/{repo}/artifacts?name=slow HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {length}\r\n\r\n0123456789".encode()
    )
    return sock


def wait_for_temp_files(tmp, count: int) -> None:
    deadline = time.monotonic() + 5
    while len([p for p in tmp.iterdir() if p.name.startswith("upload-")]) < count:
        assert time.monotonic() < deadline, "the upload never started"
        time.sleep(0.05)


def test_one_principal_holds_at_most_its_share_of_the_upload_places(cluster):
    """Issue 13 item 11: ARKVORY_MAX_UPLOADS=2 (so 1 per principal): while one slow upload of
    the admin holds a place, the admin's next upload is 503 busy naming the per-principal
    limit, with Retry-After, and another principal still gets the other place."""
    writer = cluster.writer(ARKVORY_MAX_UPLOADS="2", ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND="0").wait_ready()
    with writer.client() as client:
        for name in ("priv", "other"):
            assert client.post("/api/v1/repositories", json={"name": name}).status_code == 201
    with held_upload(writer.port):
        wait_for_temp_files(cluster.data_dir / "tmp", 1)
        with writer.client() as client:
            answer = upload(client)
            assert_error(answer, 503, "busy")
            assert "ARKVORY_MAX_UPLOADS_PER_PRINCIPAL" in answer.json()["message"]
            assert int(answer.headers["Retry-After"]) > 0
        with writer.client(OTHER_TOKEN) as other:
            assert upload(other, repo="other").status_code == 201
    with writer.client() as client:  # the cut upload gave its place back
        deadline = time.monotonic() + 5
        while (answer := upload(client)).status_code == 503:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.1)
        assert answer.status_code == 201, answer.text


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_an_upload_below_the_minimum_rate_is_cut_after_its_grace_and_frees_its_place(cluster):
    """Issue 13 item 11: one byte every 0.5 s never trips the receive timeout (2 s) but is far
    below ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND: once the grace (the receive timeout here, being
    shorter than 10 s) is spent it gets 408, its place is free and the cut is counted."""
    writer = cluster.writer(
        ARKVORY_RECEIVE_TIMEOUT_SECONDS="2", ARKVORY_MAX_UPLOADS="1", ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND="100000",
    ).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
    stop = threading.Event()
    with held_upload(writer.port) as sock:
        sender = threading.Thread(target=trickle, args=(sock, stop))
        started = time.monotonic()
        sender.start()
        try:
            answer = read_response(sock)
        finally:
            stop.set()
            sender.join(5)
        took = time.monotonic() - started
    assert status_of(answer) == 408 and b'"request_timeout"' in answer, answer[:300]
    assert b"ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND" in answer
    assert 1.5 < took < 8, took
    assert not [p for p in (cluster.data_dir / "tmp").iterdir() if p.name.startswith("upload-")]
    with writer.client() as client:
        assert upload(client).status_code == 201
        metrics = client.get("/health/metrics").text
    assert 'arkvory_transfer_aborts_total{direction="upload",reason="min_rate"} 1.0' in metrics


def test_a_resumable_content_put_cut_for_its_rate_keeps_the_parts_that_arrived(cluster):
    """The same cut on `PUT …/uploads/{id}/content`: a first part that arrived at full speed is
    kept (a fast start buys at most the grace, not hours of trickling)."""
    writer = cluster.writer(
        ARKVORY_RECEIVE_TIMEOUT_SECONDS="2", ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND="100000",
    ).wait_ready()
    MiB = 1024 * 1024
    data = os.urandom(2 * MiB)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
        session = client.post(
            "/api/v1/repositories/priv/uploads", json={"name": "a", "size": len(data), "partSize": MiB},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        ).json()
    path = f"/api/v1/repositories/priv/uploads/{session['id']}"
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", writer.port), timeout=20) as sock:
        sock.sendall(
            f"PUT {path}/content HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:MiB]
        )
        sender = threading.Thread(target=trickle, args=(sock, stop))
        started = time.monotonic()
        sender.start()
        try:
            answer = read_response(sock)
        finally:
            stop.set()
            sender.join(5)
        took = time.monotonic() - started
    assert status_of(answer) == 408 and b"ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND" in answer, answer[:300]
    assert took < 8, took
    with writer.client() as client:
        assert client.get(path).json()["receivedParts"] == [0]


def test_the_minimum_rate_banks_at_most_its_grace_of_credit():
    """MinimumRate alone, with the waits given (no clock): the grace is free, a steady body at
    the rate never runs out, and a fast start buys at most the grace, not hours."""
    from arkvory.shared.http.bodies import MinimumRate

    rate = MinimumRate(1000, grace_s=10)
    rate.received(0, 9.5)
    assert rate.seconds_left() == pytest.approx(0.5)
    for _ in range(100):
        rate.received(1000, 1.0)  # exactly the rate
    assert rate.seconds_left() == pytest.approx(0.5)
    rate.received(10**9, 0.0)  # a gigabyte at once: credit for the grace only
    assert rate.seconds_left() == pytest.approx(10)
    rate.received(1, 10.0)  # then a trickle: out of time
    assert rate.seconds_left() == pytest.approx(0.001)
