"""Resumable uploads on a real writer: parts in any order, cuts and crashes at every point, then a
resume that publishes exactly one artifact with the right digest; hashes checked per part."""

from __future__ import annotations

import hashlib
import os
import pathlib
import socket
import threading
import time
import uuid

import httpx
import pytest

from .harness import ADMIN_TOKEN, OTHER_TOKEN, db_fetch
from .rawhttp import read_response, status_of

pytestmark = pytest.mark.timeout(180)

MiB = 1024 * 1024
BASE = "/api/v1/repositories/builds/uploads"


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_RECEIVE_TIMEOUT_SECONDS="3").wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    return writer


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def create(client: httpx.Client, data: bytes, key: str | None = None, **extra) -> dict:
    descriptor = {"name": "app.bin", "size": len(data), "sha256": sha(data), "partSize": MiB, **extra}
    answer = client.post(BASE, json=descriptor, headers={"Idempotency-Key": key or uuid.uuid4().hex})
    assert answer.status_code == 201, answer.text
    return answer.json()


def put_part(client: httpx.Client, session: dict, index: int, data: bytes, digest: str | None = None):
    part = data[index * MiB:(index + 1) * MiB]
    return client.put(
        f"{BASE}/{session['id']}/parts/{index}",
        content=part,
        headers={"X-Content-SHA256": digest or sha(part), "Content-Type": "application/octet-stream"},
    )


def complete(client: httpx.Client, session: dict, **kwargs) -> httpx.Response:
    return client.post(f"{BASE}/{session['id']}/complete", **kwargs)


def artifacts(database_url: str) -> list:
    return db_fetch(database_url, "SELECT id, sha256, size FROM arkvory_artifacts")


def assert_one_artifact(writer, database_url: str, data: bytes) -> None:
    rows = artifacts(database_url)
    assert len(rows) == 1, rows
    assert rows[0]["sha256"] == sha(data) and rows[0]["size"] == len(data)
    with writer.client() as client:
        body = client.get(f"/api/v1/repositories/builds/artifacts/{rows[0]['id']}/content").content
    assert body == data


def request_head(request_line: str, length: int, digest: str | None = None) -> bytes:
    extra = f"X-Content-SHA256: {digest}\r\n" if digest else ""
    return (
        f"{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        f"{extra}Content-Length: {length}\r\n\r\n"
    ).encode()


def send_and_leave(port: int, request_line: str, body: bytes, length: int | None = None, digest=None) -> None:
    """A client that sends a request head and `body` (maybe less than `length`), then goes away."""
    head = request_head(request_line, len(body) if length is None else length, digest)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        time.sleep(0.3)  # let the server take in what was sent before the cut


def send_half_a_part(port: int, session: dict, index: int, part: bytes) -> None:
    half = part[: len(part) // 2]
    send_and_leave(port, f"PUT {BASE}/{session['id']}/parts/{index}", half, len(part), sha(part))


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_parts_in_any_order_an_identical_resend_and_a_repeated_complete_make_one_artifact(writer, database_url):
    data = os.urandom(3 * MiB + 1234)
    with writer.client() as client:
        session = create(client, data)
        assert session["partCount"] == 4 and session["receivedParts"] == [] and session["status"] == "open"
        for index in (3, 1, 0, 2):
            answer = put_part(client, session, index, data)
            assert answer.status_code == 200, answer.text
            assert answer.json()["alreadyReceived"] is False
        again = put_part(client, session, 1, data)
        assert again.status_code == 200 and again.json()["alreadyReceived"] is True
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == [0, 1, 2, 3]
        first = complete(client, session)
        assert first.status_code == 201, first.text
        assert first.json()["sha256"] == sha(data) and first.json()["size"] == len(data)
        repeat = complete(client, session)
        assert repeat.status_code == 200 and repeat.json() == first.json()
        assert repeat.headers["Idempotent-Replayed"] == "true"
        assert client.get(f"{BASE}/{session['id']}").json()["status"] == "completed"
    assert_one_artifact(writer, database_url, data)
    # Nothing of the session is left on disk once it is published.
    assert list((pathlib.Path(writer.env["ARKVORY_DATA_DIR"]) / "uploads").iterdir()) == []


def test_whole_content_put_publishes_and_checks_the_declared_digest(writer, database_url):
    data = os.urandom(2 * MiB + 7)
    with writer.client() as client:
        session = create(client, data)
        answer = client.put(f"{BASE}/{session['id']}/content", content=data)
        assert answer.status_code == 200, answer.text
        assert answer.json()["receivedParts"] == [0, 1, 2]
        assert complete(client, session).status_code == 201
        wrong = create(client, data, sha256=sha(b"other"))
        answer = client.put(f"{BASE}/{wrong['id']}/content", content=data)
        assert answer.status_code == 422 and answer.json()["code"] == "digest_mismatch"
        assert complete(client, wrong).status_code == 409  # nothing was kept: parts missing
    assert_one_artifact(writer, database_url, data)


def test_wrong_part_hash_is_422_and_other_bytes_for_a_sent_part_409(writer, database_url):
    data = os.urandom(2 * MiB)
    with writer.client() as client:
        session = create(client, data)
        wrong = put_part(client, session, 0, data, digest=sha(b"not these bytes"))
        assert wrong.status_code == 422 and wrong.json()["code"] == "digest_mismatch", wrong.text
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == []
        assert put_part(client, session, 0, data).status_code == 200
        other = os.urandom(MiB)
        answer = client.put(
            f"{BASE}/{session['id']}/parts/0", content=other, headers={"X-Content-SHA256": sha(other)}
        )
        assert answer.status_code == 409 and answer.json()["code"] == "conflict", answer.text
        # The same via a whole-content PUT: the received part is compared, never overwritten.
        changed = other + data[MiB:]
        answer = client.put(f"{BASE}/{session['id']}/content", content=changed)
        assert answer.status_code == 409, answer.text
        assert put_part(client, session, 1, data).status_code == 200
        assert complete(client, session).status_code == 201
    assert_one_artifact(writer, database_url, data)


def test_an_upload_cut_at_every_point_resumes_into_exactly_one_artifact(writer, database_url):
    data = os.urandom(3 * MiB + 99)
    with writer.client() as client:
        # Cut before the first byte: the create's answer was lost; the retry replays it.
        key = uuid.uuid4().hex
        session = create(client, data, key=key)
        replay = client.post(
            BASE, json={"name": "app.bin", "size": len(data), "sha256": sha(data), "partSize": MiB},
            headers={"Idempotency-Key": key},
        )
        assert replay.status_code == 201 and replay.json()["id"] == session["id"]
        assert replay.headers["Idempotent-Replayed"] == "true"
        # Cut before the first byte of a part (its head only), then in the middle of one:
        # nothing of either counts.
        send_and_leave(writer.port, f"PUT {BASE}/{session['id']}/parts/0", b"", MiB, sha(data[:MiB]))
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == []
        # (409 while the server has not yet noticed that the cut request's client went away)
        wait_for(lambda: put_part(client, session, 0, data).status_code == 200)
        send_half_a_part(writer.port, session, 1, data[MiB:2 * MiB])
        wait_for(lambda: not client.get(f"{BASE}/{session['id']}").json()["receivedParts"][1:])
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == [0]
        # Resume: the session says what is missing; after all parts, cut before complete.
        missing = set(range(4)) - set(client.get(f"{BASE}/{session['id']}").json()["receivedParts"])
        for index in sorted(missing):
            wait_for(lambda: put_part(client, session, index, data).status_code == 200)
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == [0, 1, 2, 3]
        # Cut during complete: the client sends it and goes away at once; the retry (which may
        # arrive while the first still runs) gets the same artifact.
        send_and_leave(writer.port, f"POST {BASE}/{session['id']}/complete", b"")
        answer = complete(client, session)
        assert answer.status_code in (200, 201), answer.text
        assert answer.json()["sha256"] == sha(data)
        assert complete(client, session).json()["id"] == answer.json()["id"]
    assert_one_artifact(writer, database_url, data)


def test_kill_9_of_the_writer_mid_upload_then_restart_and_resume_makes_one_artifact(cluster, database_url):
    data = os.urandom(4 * MiB + 5)
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        session = create(client, data)
        assert put_part(client, session, 2, data).status_code == 200
        assert put_part(client, session, 0, data).status_code == 200
    head = request_head(f"PUT {BASE}/{session['id']}/parts/1", MiB, sha(data[MiB:2 * MiB]))
    with socket.create_connection(("127.0.0.1", writer.port), timeout=10) as sock:
        sock.sendall(head + data[MiB:MiB + MiB // 2])
        time.sleep(0.3)
        writer.kill()  # SIGKILL in the middle of a part
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        state = client.get(f"{BASE}/{session['id']}").json()
        assert state["receivedParts"] == [0, 2]
        for index in set(range(state["partCount"])) - set(state["receivedParts"]):
            assert put_part(client, session, index, data).status_code == 200
    # SIGKILL again, this time just after complete was sent: before or after its commit, the
    # next writer's complete publishes (or returns) the one artifact.
    with socket.create_connection(("127.0.0.1", writer.port), timeout=10) as sock:
        sock.sendall(request_head(f"POST {BASE}/{session['id']}/complete", 0))
        time.sleep(0.02)
        writer.kill()
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        answer = complete(client, session)
        assert answer.status_code in (200, 201), answer.text
    assert_one_artifact(writer, database_url, data)
    assert list((cluster.data_dir / "uploads").iterdir()) == []


def test_a_session_needs_a_key_a_valid_descriptor_and_belongs_to_its_creator(writer, database_url):
    data = os.urandom(MiB)
    with writer.client() as client:
        no_key = client.post(BASE, json={"name": "a", "size": 1})
        assert no_key.status_code == 400 and no_key.json()["code"] == "invalid_input"
        key = uuid.uuid4().hex
        session = create(client, data, key=key)
        other = client.post(BASE, json={"name": "b", "size": 1}, headers={"Idempotency-Key": key})
        assert other.status_code == 422 and other.json()["code"] == "IdempotentParameterMismatch"
        for bad in ({"name": "a/b", "size": 1}, {"name": "a", "size": -1}, {"name": "a", "size": 1, "partSize": 10},
                    {"name": "a", "size": 1, "sha256": "xyz"}, {"name": "a", "size": True}):
            answer = client.post(BASE, json=bad, headers={"Idempotency-Key": uuid.uuid4().hex})
            assert answer.status_code == 400, (bad, answer.text)
        too_big = client.post(BASE, json={"name": "a", "size": 2**60}, headers={"Idempotency-Key": "k2"})
        assert too_big.status_code == 413 and too_big.json()["code"] == "payload_too_large"
        assert put_part(client, session, 5, data).status_code == 400  # past the last part
        assert client.put(f"{BASE}/{session['id']}/parts/0", content=b"x").status_code == 400  # no hash
        assert client.get(f"{BASE}/not-a-uuid").status_code == 400
        empty = create(client, b"")
        assert empty["partCount"] == 0
        published = complete(client, empty)
        assert published.status_code == 201 and published.json()["sha256"] == sha(b"")
    with writer.client(OTHER_TOKEN) as stranger:
        assert stranger.get(f"{BASE}/{session['id']}").status_code in (403, 404)
    with writer.client() as client:
        assert client.delete(f"{BASE}/{session['id']}").status_code == 204
        assert client.get(f"{BASE}/{session['id']}").status_code == 404
    assert db_fetch(database_url, "SELECT id FROM arkvory_uploads WHERE status = 'open'") == []


def test_an_expired_session_is_404_and_its_bytes_are_removed(cluster, database_url):
    writer = cluster.writer(ARKVORY_UPLOAD_EXPIRY="2s").wait_ready()
    data = os.urandom(2 * MiB)
    uploads = cluster.data_dir / "uploads"
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        abandoned = create(client, data)
        session = create(client, data)
        assert put_part(client, session, 0, data).status_code == 200
        assert len(list(uploads.iterdir())) == 2
        time.sleep(2.5)
        assert client.get(f"{BASE}/{session['id']}").status_code == 404
        assert put_part(client, session, 1, data).status_code == 404
        assert not (uploads / session["id"]).exists()
    # The other abandoned one (never accessed again) is removed when the next writer starts,
    # before it serves; so is a session file without a session (a crash before its create
    # committed), once older than the receive timeout.
    orphan = uploads / str(uuid.uuid4())
    orphan.write_bytes(b"left by a crash")
    os.utime(orphan, (time.time() - 600, time.time() - 600))
    assert (uploads / abandoned["id"]).exists()
    writer.kill()
    writer = cluster.writer(ARKVORY_UPLOAD_EXPIRY="2s").wait_ready()
    assert list(uploads.iterdir()) == []
    assert db_fetch(database_url, "SELECT id FROM arkvory_uploads") == []
    with writer.client() as client:
        fresh = create(client, data)
        assert (uploads / fresh["id"]).exists()
    assert artifacts(database_url) == []


def test_a_multipart_form_to_a_part_is_415(writer):
    data = os.urandom(MiB)
    with writer.client() as client:
        session = create(client, data)
        answer = client.put(f"{BASE}/{session['id']}/parts/0", files={"file": data},
                            headers={"X-Content-SHA256": sha(data)})
        assert answer.status_code == 415, answer.text
        assert "--data-binary" in answer.json()["message"]
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == []


def test_one_principal_has_at_most_100_open_sessions(writer):
    with writer.client() as client:
        sessions = [create(client, b"x") for _ in range(100)]
        answer = client.post(BASE, json={"name": "one-more", "size": 1}, headers={"Idempotency-Key": "k"})
        assert answer.status_code == 409 and "at most 100" in answer.json()["message"], answer.text
        assert client.delete(f"{BASE}/{sessions[0]['id']}").status_code == 204
        answer = client.post(BASE, json={"name": "one-more", "size": 1}, headers={"Idempotency-Key": "k"})
        assert answer.status_code == 201, answer.text


def test_hashing_a_large_upload_does_not_stall_the_event_loop(writer):
    """A 512 MiB complete whose whole file must be hashed then (parts sent last-first, so no
    prefix was hashed early) leaves /health/live answering quickly throughout: inline, the
    hash alone would block the loop for most of a second."""
    part = os.urandom(64 * MiB)
    count = 8
    size = count * len(part)
    whole = hashlib.sha256()
    for _ in range(count):
        whole.update(part)
    with writer.client(timeout=120) as client:
        answer = client.post(BASE, json={"name": "big", "size": size, "partSize": len(part)},
                             headers={"Idempotency-Key": uuid.uuid4().hex})
        session = answer.json()
        for index in reversed(range(count)):
            answer = client.put(f"{BASE}/{session['id']}/parts/{index}", content=part,
                                headers={"X-Content-SHA256": sha(part)})
            assert answer.status_code == 200, answer.text
        latencies: list[float] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=writer.url, timeout=10) as prober:
                while not done.is_set():
                    started = time.monotonic()
                    assert prober.get("/health/live").status_code == 200
                    latencies.append(time.monotonic() - started)
                    time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            time.sleep(0.2)
            started = time.monotonic()
            answer = complete(client, session)
            took = time.monotonic() - started
        finally:
            done.set()
            prober.join(10)
        assert answer.status_code == 201 and answer.json()["sha256"] == whole.hexdigest()
    print(f"complete took {took:.2f} s; /health/live max {max(latencies) * 1000:.0f} ms over {len(latencies)}")
    assert max(latencies) < 0.25, sorted(latencies)[-5:]


def test_random_input_to_the_upload_routes_never_gets_a_5xx(writer):
    """Hypothesis (derandomized, bounded): random descriptors, ids, part indexes, hashes, keys
    and bodies; every answer is below 500 (or a 503 with Retry-After) and errors are JSON."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    with writer.client() as client:
        session = create(client, os.urandom(2 * MiB))
    text = st.text(max_size=40)
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=8,
    )
    descriptors = st.fixed_dictionaries(
        {}, optional={"name": json_values | text, "size": json_values | st.integers(-5, 2**64),
                      "sha256": json_values | st.just("a" * 64), "mediaType": json_values | text,
                      "partSize": json_values | st.integers(0, 2**40)},
    )
    ids = st.sampled_from([session["id"], str(uuid.uuid4()), "x", "%00", "..", "0" * 300])
    indexes = st.sampled_from(["0", "1", "2", "-1", "99999", "1e3", "٣", "0x1", "9" * 30])
    hashes = st.none() | st.sampled_from(["a" * 64, "z" * 64, "", "A" * 64, "a" * 65])
    keys = st.none() | st.sampled_from(["k", "", "k" * 65, "ключ", "k k"])
    problems: list[str] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(which=st.sampled_from(["create", "part", "content", "complete", "get", "delete"]),
           descriptor=descriptors, upload_id=ids, index=indexes, digest=hashes, key=keys,
           body=st.binary(max_size=2000))
    def check(which, descriptor, upload_id, index, digest, key, body):
        headers = {}
        if key is not None:
            headers["Idempotency-Key"] = key.encode("utf-8")  # raw bytes on the wire
        if digest is not None:
            headers["X-Content-SHA256"] = digest
        url = f"{BASE}/{upload_id}"
        if which == "create":
            answer = http.post(BASE, json=descriptor, headers=headers)
        elif which == "part":
            answer = http.put(f"{url}/parts/{index}", content=body, headers=headers)
        elif which == "content":
            answer = http.put(f"{url}/content", content=body, headers=headers)
        elif which == "complete":
            answer = http.post(f"{url}/complete", headers=headers)
        elif which == "get":
            answer = http.get(url)
        else:
            answer = http.delete(url, headers=headers)
        if answer.status_code >= 500 and not (answer.status_code == 503 and "retry-after" in answer.headers):
            problems.append(f"{which} {upload_id} {index} {descriptor!r} -> {answer.status_code} {answer.text[:200]}")
        elif answer.status_code >= 400:
            assert answer.json()["code"], answer.text

    with writer.client() as http:
        check()
    assert not problems, "\n".join(problems[:10])


def test_a_silent_part_is_cut_after_the_receive_timeout_and_frees_its_place(writer):
    """ARKVORY_RECEIVE_TIMEOUT_SECONDS=3: a part whose client stops sending gets 408, is not
    recorded, and neither its claim nor its upload place outlives it."""
    data = os.urandom(MiB)
    with writer.client() as client:
        session = create(client, data)
        head = request_head(f"PUT {BASE}/{session['id']}/parts/0", MiB, sha(data))
        with socket.create_connection(("127.0.0.1", writer.port), timeout=15) as sock:
            sock.sendall(head + data[: MiB // 4])
            answer = read_response(sock)
        assert status_of(answer) == 408 and b'"request_timeout"' in answer, answer[:300]
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == []
        assert put_part(client, session, 0, data).status_code == 200


def test_parts_and_one_shot_uploads_share_the_upload_places(cluster):
    writer = cluster.writer(ARKVORY_MAX_UPLOADS="1", ARKVORY_RECEIVE_TIMEOUT_SECONDS="3").wait_ready()
    data = os.urandom(2 * MiB)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        session = create(client, data)
        head = request_head(f"PUT {BASE}/{session['id']}/parts/0", MiB, sha(data[:MiB]))
        with socket.create_connection(("127.0.0.1", writer.port), timeout=15) as sock:
            sock.sendall(head + data[:1000])  # holds the one place until the receive timeout
            time.sleep(0.3)
            busy = client.post("/api/v1/repositories/builds/artifacts", params={"name": "f"}, content=b"x")
            assert busy.status_code == 503 and busy.json()["code"] == "busy" and "retry-after" in busy.headers
            busy = put_part(client, session, 1, data)
            assert busy.status_code == 503 and busy.json()["code"] == "busy"
        wait_for(lambda: put_part(client, session, 1, data).status_code == 200)


def test_a_cut_whole_content_put_keeps_every_part_that_fully_arrived(writer):
    """Issue 13 item 4: cut after 3.5 of 5 parts, the session has parts 0, 1 and 2 (the last
    finished one was still being written when the cut came, and was lost)."""
    data = os.urandom(5 * MiB)
    with writer.client() as client:
        session = create(client, data)
        send_and_leave(writer.port, f"PUT {BASE}/{session['id']}/content", data[: 3 * MiB + MiB // 2], len(data))
        # Once the cut request is over, its claim on every part is released: part 4 goes in.
        wait_for(lambda: put_part(client, session, 4, data).status_code == 200)
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == [0, 1, 2, 4]
        assert put_part(client, session, 3, data).status_code == 200
        assert complete(client, session).status_code == 201


def test_a_whole_content_put_of_other_bytes_than_the_declared_sha256_keeps_nothing(writer, database_url):
    """Issue 14 §4: 422, and as the README says nothing was kept: the right bytes sent next
    are taken (not refused as other bytes for received parts) and publish."""
    data = os.urandom(2 * MiB + 7)
    other = os.urandom(len(data))
    with writer.client() as client:
        session = create(client, data)
        answer = client.put(f"{BASE}/{session['id']}/content", content=other)
        assert answer.status_code == 422 and answer.json()["code"] == "digest_mismatch", answer.text
        assert "nothing was kept" in answer.json()["message"]
        assert client.get(f"{BASE}/{session['id']}").json()["receivedParts"] == []
        answer = client.put(f"{BASE}/{session['id']}/content", content=data)
        assert answer.status_code == 200 and answer.json()["receivedParts"] == [0, 1, 2], answer.text
        assert complete(client, session).status_code == 201
    assert_one_artifact(writer, database_url, data)


def test_a_descriptor_with_an_unknown_field_or_a_bad_name_is_refused_as_a_body_field(writer, database_url):
    """Issue 13 item 16: strict like task bodies (a typo such as `sha265` must not silently
    drop the check it meant), and a bad `name` is reported as the body's field."""
    with writer.client() as client:
        for extra in ({"sha265": "a" * 64}, {"partsize": MiB}, {"Name": "x"}):
            answer = client.post(BASE, json={"name": "a", "size": 1, **extra},
                                 headers={"Idempotency-Key": uuid.uuid4().hex})
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", answer.text
            assert f"unknown field {next(iter(extra))!r}" in answer.json()["message"]
        for name in ("a/b", "", "x\x01"):
            answer = client.post(BASE, json={"name": name, "size": 1}, headers={"Idempotency-Key": uuid.uuid4().hex})
            assert answer.status_code == 400, answer.text
            message = answer.json()["message"]
            assert "'name'" in message and "query" not in message, message
        # The one-shot upload takes its name from the query: said so there.
        answer = client.post("/api/v1/repositories/builds/artifacts", params={"name": "a/b"}, content=b"x")
        assert answer.status_code == 400 and "query parameter 'name'" in answer.json()["message"]
    assert db_fetch(database_url, "SELECT id FROM arkvory_uploads") == []


def test_a_delete_after_or_racing_a_successful_complete_never_makes_the_next_complete_a_404(writer, database_url):
    """Issue 13 item 16: a completed session answers DELETE with 409 and keeps replaying its
    artifact; raced, either the complete published (then the DELETE lost and complete
    replays) or the DELETE won (then complete was refused and no artifact exists)."""
    data = os.urandom(MiB + 1)
    with writer.client() as client:
        session = create(client, data)
        for index in (0, 1):
            assert put_part(client, session, index, data).status_code == 200
        published = complete(client, session)
        assert published.status_code == 201
        answer = client.delete(f"{BASE}/{session['id']}")
        assert answer.status_code == 409 and answer.json()["code"] == "conflict", answer.text
        again = complete(client, session)
        assert again.status_code == 200 and again.json()["id"] == published.json()["id"], again.text
    published_ids = {published.json()["id"]}
    for _ in range(6):
        with writer.client() as client:
            session = create(client, data)
            for index in (0, 1):
                assert put_part(client, session, index, data).status_code == 200
        answers: dict[str, httpx.Response] = {}

        def send(what: str) -> None:
            with writer.client() as own:
                if what == "complete":
                    answers[what] = complete(own, session)
                else:
                    answers[what] = own.delete(f"{BASE}/{session['id']}")

        threads = [threading.Thread(target=send, args=(what,)) for what in ("complete", "delete")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        with writer.client() as client:
            after = complete(client, session)
        if answers["complete"].status_code == 201:
            assert answers["delete"].status_code == 409, answers["delete"].text
            assert after.status_code == 200 and after.json()["id"] == answers["complete"].json()["id"], after.text
            published_ids.add(after.json()["id"])
        else:
            assert answers["complete"].status_code in (404, 409), answers["complete"].text
            assert answers["delete"].status_code == 204, answers["delete"].text
            assert after.status_code == 404, after.text
    assert {str(r["id"]) for r in artifacts(database_url)} == published_ids


def test_one_principal_reserves_at_most_its_share_of_the_disk(cluster, database_url):
    """Issue 13 item 10: ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL (here 3 MiB) bounds what one
    principal's open sessions reserve: beyond it a session is 409 naming the setting (413 when
    it alone is larger), concurrent creates cannot both take the last of it, another principal
    is unaffected, and the caller can list what holds its share."""
    writer = cluster.writer(ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL=str(3 * MiB)).wait_ready()

    def start(client: httpx.Client, size: int, repo: str = "builds") -> httpx.Response:
        return client.post(f"/api/v1/repositories/{repo}/uploads", json={"name": "a", "size": size},
                           headers={"Idempotency-Key": uuid.uuid4().hex})

    with writer.client() as client:
        for repo in ("builds", "other"):
            assert client.post("/api/v1/repositories", json={"name": repo}).status_code == 201
        first = start(client, 2 * MiB)
        assert first.status_code == 201, first.text
        refused = start(client, 2 * MiB)
        assert refused.status_code == 409 and refused.json()["code"] == "conflict", refused.text
        assert "ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL" in refused.json()["message"]
        alone = start(client, 4 * MiB)
        assert alone.status_code == 413 and "ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL" in alone.json()["message"]
        listed = client.get(BASE).json()
        assert [s["id"] for s in listed["items"]] == [first.json()["id"]]
        assert listed["reservedBytes"] == 2 * MiB and listed["maxReservedBytes"] == 3 * MiB
    with writer.client(OTHER_TOKEN) as other:
        assert start(other, 2 * MiB, repo="other").status_code == 201
    with writer.client() as client:
        assert client.delete(f"{BASE}/{first.json()['id']}").status_code == 204
        answers: list[httpx.Response] = []

        def race() -> None:
            with writer.client() as own:
                answers.append(start(own, 2 * MiB))

        threads = [threading.Thread(target=race) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(a.status_code for a in answers) == [201, 409, 409, 409, 409, 409], [a.text for a in answers]
    rows = db_fetch(database_url, "SELECT principal_id, sum(size) AS reserved FROM arkvory_uploads"
                                  " WHERE status = 'open' GROUP BY principal_id ORDER BY principal_id")
    assert [(r["principal_id"], r["reserved"]) for r in rows] == [("key:admin", 2 * MiB), ("key:other", 2 * MiB)]
