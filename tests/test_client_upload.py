"""The client's uploads against a real writer (SPEC §6, §10): one Idempotency-Key per logical
upload, kept beside the file, so an upload interrupted anywhere (the client killed, the writer
killed mid-part) and run again makes exactly one artifact and sends only the missing parts; a
part damaged in flight is sent again alone; the same upload run twice stores one artifact.

Requests go through tests/clientproxy.py, which counts them and injects the faults.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from arkvory.shared.client import Client, RetryPolicy, errors
from arkvory.shared.client.upload import state_path

from .clientproxy import Flip, HttpFaultProxy, OnRequestBody
from .harness import ADMIN_TOKEN, READER_TOKEN, db_fetch

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
QUICK = RetryPolicy(max_attempts=8, max_total_seconds=60, backoff_initial=0.2, backoff_max=1.0)
SIZE = 5 * MiB + 1234  # six 1 MiB parts, the last one short
PART = 1 * MiB


class Interrupted(Exception):
    """Stands for the client process being killed."""


@pytest.fixture
def writer(cluster):
    process = cluster.writer().wait_ready()
    with process.client() as http:
        assert http.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    return process


@pytest.fixture
def proxy(writer):
    with HttpFaultProxy(writer.port) as running:
        yield running


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "app.tar.gz"
    path.write_bytes(os.urandom(SIZE))
    return path


def artifacts_in(writer) -> list[dict]:
    with writer.client() as http:
        return http.get("/api/v1/repositories/builds/artifacts").json()["items"]


def sessions_in(database_url: str) -> int:
    return db_fetch(database_url, "SELECT count(*) AS n FROM arkvory_uploads")[0]["n"]


def part_puts(proxy: HttpFaultProxy) -> list[int]:
    return [int(e.target.rsplit("/", 1)[1]) for e in proxy.requests_to("/parts/", "PUT")]


def test_one_upload_sends_parts_with_their_digests_and_removes_its_key_file(writer, proxy, source):
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        artifact = client.upload("builds", source, part_size=PART, media_type="application/gzip")
    data = source.read_bytes()
    assert artifact["sha256"] == hashlib.sha256(data).hexdigest() and artifact["size"] == SIZE
    assert artifact["name"] == "app.tar.gz" and artifact["mediaType"] == "application/gzip"
    assert sorted(part_puts(proxy)) == list(range(6))
    for exchange in proxy.requests_to("/parts/", "PUT"):
        index = int(exchange.target.rsplit("/", 1)[1])
        assert exchange.headers["x-content-sha256"] == hashlib.sha256(data[index * PART:(index + 1) * PART]).hexdigest()
    (create,) = proxy.requests_to("/uploads", "POST")[:1]
    assert create.headers["idempotency-key"]
    assert not state_path(source).exists()


@pytest.mark.parametrize("stop_at", ["session created", "two parts sent", "every part sent"])
def test_an_upload_interrupted_and_run_again_makes_one_artifact_and_skips_stored_parts(
    writer, proxy, source, database_url, stop_at
):
    threshold = {"session created": 0, "two parts sent": 2 * PART, "every part sent": SIZE}[stop_at]

    def interrupt(done: int, total: int | None) -> None:
        if done >= threshold:
            raise Interrupted

    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(Interrupted):
            client.upload("builds", source, part_size=PART, progress=interrupt)
        saved = json.loads(state_path(source).read_text())
        assert saved["session"] and saved["size"] == SIZE and saved["mtime_ns"] == source.stat().st_mtime_ns
        with writer.client() as http:
            stored = set(http.get(f"/api/v1/repositories/builds/uploads/{saved['session']}").json()["receivedParts"])
        sent_before = len(part_puts(proxy))
        artifact = client.upload("builds", source, part_size=PART)

    assert [a["id"] for a in artifacts_in(writer)] == [artifact["id"]]
    assert artifact["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert sessions_in(database_url) == 1  # the re-run resumed the same session (same key)
    resent = part_puts(proxy)[sent_before:]
    assert set(resent) == set(range(6)) - stored and len(resent) == len(set(resent))
    creates = proxy.requests_to("/uploads", "POST")
    creates = [e for e in creates if e.target.endswith("/uploads")]
    assert len(creates) == 2 and creates[0].headers["idempotency-key"] == creates[1].headers["idempotency-key"]
    assert not state_path(source).exists()


def test_killed_after_complete_before_the_key_file_went_gives_the_same_artifact(writer, proxy, source, database_url):
    kept = {}

    def keep_the_key_file(done: int, total: int | None) -> None:
        if done == total:
            kept["text"] = state_path(source).read_text()

    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        first = client.upload("builds", source, part_size=PART, progress=keep_the_key_file)
        state_path(source).write_text(kept["text"])  # as if killed before removing it
        second = client.upload("builds", source, part_size=PART)
    assert second["id"] == first["id"]
    assert len(artifacts_in(writer)) == 1 and sessions_in(database_url) == 1
    assert not state_path(source).exists()


def test_the_same_upload_run_twice_stores_one_artifact_and_a_changed_file_a_new_one(writer, proxy, source):
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        first = client.upload("builds", source, part_size=PART, asset="latest/app.tar.gz")
        puts = len(part_puts(proxy))
        again = client.upload("builds", source, part_size=PART, asset="latest/app.tar.gz")
        assert again["id"] == first["id"] and len(part_puts(proxy)) == puts
        assert len(artifacts_in(writer)) == 1

        source.write_bytes(os.urandom(SIZE))
        changed = client.upload("builds", source, part_size=PART, asset="latest/app.tar.gz")
    assert changed["id"] != first["id"] and changed["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert len(artifacts_in(writer)) == 2
    with writer.client() as http:
        assert http.get("/api/v1/repositories/builds/asset/content", params={"path": "latest/app.tar.gz"}).content == source.read_bytes()


def test_a_part_damaged_in_flight_is_sent_again_alone(writer, proxy, source):
    proxy.flips.append(Flip("/parts/3", offset=4242))
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        artifact = client.upload("builds", source, part_size=PART)
    assert artifact["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    tries = proxy.requests_to("/parts/3", "PUT")
    assert [e.status for e in tries] == [422, 200]
    assert sorted(part_puts(proxy)) == [0, 1, 2, 3, 3, 4, 5]


def test_the_writer_killed_mid_part_and_restarted_the_upload_still_makes_one_artifact(
    cluster, writer, proxy, source, database_url
):
    restarted = []

    def kill_and_restart() -> None:
        writer.kill()
        env = {k: v for k, v in writer.env.items() if k.startswith("ARKVORY_")}

        def restart() -> None:
            restarted.append(cluster.start("writer2", **env).wait_ready())

        threading.Thread(target=restart, daemon=True).start()

    proxy.body_hooks.append(OnRequestBody("/parts/2", after_bytes=PART // 2, then=kill_and_restart))
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        artifact = client.upload("builds", source, part_size=PART)
    assert restarted, "the writer was not restarted"
    assert artifact["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert len(artifacts_in(restarted[0])) == 1 and sessions_in(database_url) == 1
    assert proxy.requests_to("/parts/2", "PUT")[0].cut
    assert not state_path(source).exists()


def test_upload_errors_map_to_exit_codes(writer, proxy, source, tmp_path):
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(errors.LocalIOError) as raised:
            client.upload("builds", tmp_path / "missing.bin")
        assert raised.value.exit_code == 8
        with pytest.raises(errors.NotFoundError):
            client.upload("nope", source, part_size=PART)
    with Client(proxy.url, "arkvory_key_wrong", retry=QUICK) as client:
        with pytest.raises(errors.AuthError):
            client.upload("builds", source, part_size=PART)


def test_parts_of_other_bytes_under_the_same_size_and_mtime_never_leave_a_wrong_artifact(writer, proxy, source):
    def interrupt(done: int, total: int | None) -> None:
        if done >= 2 * PART:
            raise Interrupted

    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(Interrupted):
            client.upload("builds", source, part_size=PART, progress=interrupt)
        # The file is rewritten in place and its mtime put back: the key file still matches,
        # the parts stored so far are of the old bytes.
        stat = source.stat()
        source.write_bytes(os.urandom(SIZE))
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with pytest.raises(errors.IntegrityError) as raised:
            client.upload("builds", source, part_size=PART)
        assert raised.value.exit_code == 5
        assert artifacts_in(writer) == [] and not state_path(source).exists()
        artifact = client.upload("builds", source, part_size=PART)
    assert artifact["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert [a["id"] for a in artifacts_in(writer)] == [artifact["id"]]


def test_a_reader_is_never_told_that_a_put_of_stored_bytes_worked(writer, proxy, source, database_url):
    """The same name and SHA-256 exist already: only a principal that may write gets "done";
    a reader gets the writer's 403. The writer's own re-run still makes no second artifact and
    leaves no upload session open."""
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        stored = client.upload("builds", source, part_size=PART)
    with Client(proxy.url, READER_TOKEN, retry=QUICK) as reader:
        with pytest.raises(errors.AuthError) as raised:
            reader.upload("builds", source, part_size=PART)
    assert raised.value.exit_code == 3 and raised.value.status == 403
    assert not state_path(source).exists()
    puts = len(part_puts(proxy))
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        again = client.upload("builds", source, part_size=PART, asset="latest/app.tar.gz")
    assert again["id"] == stored["id"] and len(part_puts(proxy)) == puts
    assert [a["id"] for a in artifacts_in(writer)] == [stored["id"]]
    assert db_fetch(database_url, "SELECT count(*) AS n FROM arkvory_uploads WHERE status = 'open'")[0]["n"] == 0
    assert not state_path(source).exists()
    with writer.client() as http:
        assert http.get("/api/v1/repositories/builds/asset", params={"path": "latest/app.tar.gz"}).json()[
            "artifactId"
        ] == stored["id"]


def test_a_rerun_of_a_stored_file_reserves_nothing(cluster, source):
    """Issue 13 item 10: the client learns that its file is stored already without opening
    (and so preallocating) a session: it works even when the principal's reservation is
    full, and the writer sees no session created."""
    writer = cluster.writer(ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL=str(SIZE)).wait_ready()
    with writer.client() as http:
        assert http.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    with HttpFaultProxy(writer.port) as proxy:
        with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
            stored = client.upload("builds", source, part_size=PART)
            with writer.client() as http:  # another upload in progress holds the whole share
                held = http.post("/api/v1/repositories/builds/uploads", json={"name": "other", "size": SIZE},
                                 headers={"Idempotency-Key": "held"})
                assert held.status_code == 201, held.text
            creates = len(proxy.requests_to("/uploads", "POST"))
            again = client.upload("builds", source, part_size=PART)
        assert again["id"] == stored["id"]
        assert len(proxy.requests_to("/uploads", "POST")) == creates
    assert not state_path(source).exists()
