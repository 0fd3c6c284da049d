"""The artifact API on a real writer: list (pages, name filter), show, delete (metadata at once,
409 while a package or asset uses it), the one-shot upload's Idempotency-Key, size cap and 415."""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest

from .harness import db_fetch

pytestmark = pytest.mark.timeout(120)

ARTIFACTS = "/api/v1/repositories/builds/artifacts"


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_MAX_ARTIFACT_BYTES="100000").wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    return writer


def upload(client: httpx.Client, body: bytes, name: str = "f.bin", **headers) -> httpx.Response:
    return client.post(ARTIFACTS, params={"name": name}, content=body, headers=headers)


def test_list_pages_with_a_cursor_and_filters_by_name(writer):
    with writer.client() as client:
        made = [upload(client, f"body {i}".encode(), name=f"n{i % 2}.bin").json() for i in range(5)]
        seen, cursor = [], None
        while True:
            params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
            page = client.get(ARTIFACTS, params=params).json()
            assert len(page["items"]) <= 2
            seen += page["items"]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert [a["id"] for a in seen] == [a["id"] for a in made]  # oldest first, no gaps or repeats
        named = client.get(ARTIFACTS, params={"name": "n1.bin"}).json()
        assert [a["id"] for a in named["items"]] == [made[1]["id"], made[3]["id"]]
        assert named["nextCursor"] is None
        for bad in ({"limit": "0"}, {"limit": "x"}, {"cursor": "!!"}, {"cursor": "WyJ4IiwieSJd"}, {"name": "\x01"}):
            answer = client.get(ARTIFACTS, params=bad)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", (bad, answer.text)
        shown = client.get(f"{ARTIFACTS}/{made[0]['id']}").json()
        assert shown == made[0]


def test_delete_removes_metadata_at_once_but_not_while_a_package_or_asset_uses_it(writer, database_url):
    with writer.client() as client:
        kept = upload(client, b"kept").json()
        gone = upload(client, b"gone").json()
        assert client.get(f"{ARTIFACTS}/{gone['id']}/content").content == b"gone"
        assert client.delete(f"{ARTIFACTS}/{gone['id']}").status_code == 204
        assert client.get(f"{ARTIFACTS}/{gone['id']}").status_code == 404
        assert client.get(f"{ARTIFACTS}/{gone['id']}/content").status_code == 404
        assert client.delete(f"{ARTIFACTS}/{gone['id']}").status_code == 404
        # The blob stays for the cleanup task of the next issue.
        assert db_fetch(database_url, "SELECT 1 FROM arkvory_blobs WHERE sha256 = $1", gone["sha256"])

        package = {"group": "g", "name": "n", "version": "1", "artifactId": kept["id"]}
        assert client.put("/api/v1/repositories/builds/packages", json=package).status_code in (200, 201)
        answer = client.delete(f"{ARTIFACTS}/{kept['id']}")
        assert answer.status_code == 409 and "package" in answer.json()["message"]
        other = upload(client, b"other").json()
        answer = client.put("/api/v1/repositories/builds/assets", params={"path": "latest"},
                            json={"artifactId": other["id"]})
        assert answer.status_code in (200, 201), answer.text
        answer = client.delete(f"{ARTIFACTS}/{other['id']}")
        assert answer.status_code == 409 and "asset" in answer.json()["message"]
        assert client.get(f"{ARTIFACTS}/{kept['id']}").status_code == 200
        assert client.delete(f"{ARTIFACTS}/not-a-uuid").status_code == 400


def test_a_retried_one_shot_upload_with_the_same_key_makes_one_artifact(writer, database_url):
    with writer.client() as client:
        key = uuid.uuid4().hex
        first = upload(client, b"payload", **{"Idempotency-Key": key})
        assert first.status_code == 201, first.text
        again = upload(client, b"payload", **{"Idempotency-Key": key})
        assert again.status_code == 201 and again.json() == first.json()
        assert again.headers["Idempotent-Replayed"] == "true"
        other = upload(client, b"other bytes", **{"Idempotency-Key": key})
        assert other.status_code == 422 and other.json()["code"] == "IdempotentParameterMismatch"
        bad = upload(client, b"payload", **{"Idempotency-Key": "k" * 65})
        assert bad.status_code == 400
    rows = db_fetch(database_url, "SELECT sha256 FROM arkvory_artifacts")
    assert [r["sha256"] for r in rows] == [hashlib.sha256(b"payload").hexdigest()]


def test_the_size_cap_is_413_declared_or_streamed_and_keeps_nothing(writer, cluster, database_url):
    with writer.client() as client:
        declared = upload(client, b"x" * 100_001)
        assert declared.status_code == 413 and declared.json()["code"] == "payload_too_large"

        def chunks():
            for _ in range(20):
                yield b"y" * 10_000

        streamed = client.post(ARTIFACTS, params={"name": "big"}, content=chunks())
        assert streamed.status_code == 413, streamed.text
        assert upload(client, b"x" * 100_000).status_code == 201  # exactly the cap is fine
    assert len(db_fetch(database_url, "SELECT 1 FROM arkvory_artifacts")) == 1
    assert [p for p in (cluster.data_dir / "tmp").iterdir() if p.name.startswith("upload-")] == []


def test_a_multipart_form_upload_is_415_and_says_to_send_raw_bytes(writer, database_url):
    with writer.client() as client:
        answer = client.post(ARTIFACTS, params={"name": "f"}, files={"file": ("f.bin", b"content")})
        assert answer.status_code == 415, answer.text
        assert "--data-binary" in answer.json()["message"]
        # curl --data-binary's default type is the raw bytes and stays accepted.
        raw = client.post(ARTIFACTS, params={"name": "f"}, content=b"content",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert raw.status_code == 201 and raw.json()["sha256"] == hashlib.sha256(b"content").hexdigest()
    assert len(db_fetch(database_url, "SELECT 1 FROM arkvory_artifacts")) == 1
