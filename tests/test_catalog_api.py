"""The catalog API on a live writer: packages, assets with history, repository deletion with its
safeguard, keyset-paginated lists; deletes take effect at once on a gateway too."""

from __future__ import annotations

import pytest

from .harness import OTHER_TOKEN, READER_TOKEN, db_fetch, eventually

pytestmark = pytest.mark.timeout(120)

BASE = "/api/v1/repositories/builds"


@pytest.fixture
def site(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        ids = [
            client.post(f"{BASE}/artifacts", params={"name": f"f{n}"}, content=f"content {n}".encode()).json()["id"]
            for n in range(3)
        ]
    gateway = cluster.gateway(1, shared).wait_ready()
    return writer, gateway, ids


def gone_on(gateway_client, url, **request) -> None:
    """404 on the gateway once its catalog NOTIFY arrived: a moment after the writer's commit."""
    eventually(lambda: gateway_client.get(url, **request).status_code == 404, f"{url} gone on the gateway")


def walk(client, url, limit, **params) -> list[dict]:
    """Every item of a list, page by page, checking page sizes and the last cursor."""
    items, cursor = [], None
    for _ in range(100):
        answer = client.get(url, params={**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["items"]) <= limit
        items += page["items"]
        cursor = page["nextCursor"]
        if cursor is None:
            return items
    raise AssertionError("the list never ended")


def test_packages_register_list_show_delete(site):
    writer, gateway, (a, b, _) = site
    with writer.client() as client, gateway.client() as read:
        for version in ("1.0", "1.1", "2.0"):
            assert client.put(f"{BASE}/packages", json={"group": "g", "name": "app", "version": version, "artifactId": a}).status_code == 201
        assert client.put(f"{BASE}/packages", json={"group": "g", "name": "lib", "version": "1", "artifactId": b}).status_code == 201
        assert client.put(f"{BASE}/packages", json={"group": "a", "name": "z", "version": "9", "artifactId": b}).status_code == 201
        # Immutable: the same artifact answers the existing version, another one 409.
        same = client.put(f"{BASE}/packages", json={"group": "g", "name": "app", "version": "1.0", "artifactId": a})
        assert same.status_code == 200 and same.json()["artifactId"] == a
        other = client.put(f"{BASE}/packages", json={"group": "g", "name": "app", "version": "1.0", "artifactId": b})
        assert other.status_code == 409 and other.json()["code"] == "conflict"

        everything = walk(client, f"{BASE}/packages", 2)
        assert [(p["group"], p["name"], p["version"]) for p in everything] == [
            ("a", "z", "9"), ("g", "app", "1.0"), ("g", "app", "1.1"), ("g", "app", "2.0"), ("g", "lib", "1"),
        ]
        assert [p["version"] for p in walk(client, f"{BASE}/packages", 1, group="g", name="app")] == ["1.0", "1.1", "2.0"]

        coordinates = {"group": "g", "name": "app", "version": "1.1"}
        shown = client.get(f"{BASE}/package", params=coordinates)
        assert shown.status_code == 200 and shown.json()["artifactId"] == a and shown.json()["publishedAt"]
        assert read.get(f"{BASE}/packages/content", params=coordinates).content == b"content 0"

        assert client.delete(f"{BASE}/package", params=coordinates).status_code == 204
        assert client.get(f"{BASE}/package", params=coordinates).status_code == 404
        assert client.delete(f"{BASE}/package", params=coordinates).status_code == 404
        # Gone on the gateway too as soon as its catalog NOTIFY arrives (asynchronous: a moment
        # after the writer's commit), and the artifact stays.
        gone_on(read, f"{BASE}/packages/content", params=coordinates)
        assert client.get(f"{BASE}/artifacts/{a}").status_code == 200
        assert client.get(f"{BASE}/package", params={"group": "g", "name": "app"}).status_code == 400


def test_assets_repoint_history_restore_delete(site):
    writer, gateway, (a, b, c) = site
    with writer.client() as client, gateway.client() as read:
        for target in (a, b, c):
            pointed = client.put(f"{BASE}/assets", params={"path": "latest/app"}, json={"artifactId": target})
            assert pointed.status_code == 200 and pointed.json()["artifactId"] == target
        client.put(f"{BASE}/assets", params={"path": "latest/lib"}, json={"artifactId": a})
        client.put(f"{BASE}/assets", params={"path": "old/app"}, json={"artifactId": a})

        shown = client.get(f"{BASE}/asset", params={"path": "latest/app"}).json()
        assert shown["artifactId"] == c
        assert [h["artifactId"] for h in shown["history"]] == [c, b, a]  # newest first
        assert len(client.get(f"{BASE}/asset", params={"path": "latest/app", "historyLimit": 1}).json()["history"]) == 1
        assert read.get(f"{BASE}/asset/content", params={"path": "latest/app"}).content == b"content 2"

        first = shown["history"][-1]["id"]
        restored = client.post(f"{BASE}/asset/restore", params={"path": "latest/app"}, json={"historyId": first})
        assert restored.status_code == 200 and restored.json()["artifactId"] == a
        eventually(
            lambda: read.get(f"{BASE}/asset/content", params={"path": "latest/app"}).content == b"content 0",
            "the restored asset served by the gateway (its catalog NOTIFY)",
        )
        again = client.get(f"{BASE}/asset", params={"path": "latest/app"}).json()["history"]
        assert [h["artifactId"] for h in again] == [a, c, b, a]
        # An entry of another path is not this asset's.
        lib_entry = client.get(f"{BASE}/asset", params={"path": "latest/lib"}).json()["history"][0]["id"]
        assert client.post(f"{BASE}/asset/restore", params={"path": "latest/app"}, json={"historyId": lib_entry}).status_code == 404
        assert client.post(f"{BASE}/asset/restore", params={"path": "latest/app"}, json={"historyId": "1"}).status_code == 400

        assert [s["path"] for s in walk(client, f"{BASE}/assets", 1)] == ["latest/app", "latest/lib", "old/app"]
        assert [s["path"] for s in walk(client, f"{BASE}/assets", 5, prefix="latest/")] == ["latest/app", "latest/lib"]

        assert client.delete(f"{BASE}/asset", params={"path": "latest/app"}).status_code == 204
        assert client.get(f"{BASE}/asset", params={"path": "latest/app"}).status_code == 404
        gone_on(read, f"{BASE}/asset/content", params={"path": "latest/app"})
        assert client.get(f"{BASE}/artifacts/{a}").status_code == 200


def test_deleting_a_repository_with_artifacts_needs_force(site, database_url):
    writer, gateway, (a, _, _) = site
    with writer.client() as client, gateway.client() as read:
        refused = client.delete(BASE)
        assert refused.status_code == 409 and "force=true" in refused.json()["message"]
        assert "3 artifact" in refused.json()["message"]
        assert client.delete(BASE, params={"force": "yes"}).status_code == 400
        assert client.get(BASE).status_code == 200
        assert read.get(f"{BASE}/artifacts/{a}/content").status_code == 200

        # Packages and assets pointing at its artifacts go with it.
        assert client.put(f"{BASE}/packages", json={"group": "g", "name": "n", "version": "1", "artifactId": a}).status_code == 201
        assert client.put(f"{BASE}/assets", params={"path": "p"}, json={"artifactId": a}).status_code == 200
        assert client.delete(BASE, params={"force": "true"}).status_code == 204
        for table in ("arkvory_packages", "arkvory_assets", "arkvory_asset_history"):
            assert db_fetch(database_url, f"SELECT count(*) FROM {table}")[0][0] == 0, table
        assert client.get(BASE).status_code == 404
        gone_on(read, f"{BASE}/artifacts/{a}/content")
        # The metadata went; the blobs stay for the cleanup task.
        assert db_fetch(database_url, "SELECT count(*) FROM arkvory_artifacts")[0][0] == 0
        assert db_fetch(database_url, "SELECT count(*) FROM arkvory_blobs")[0][0] == 3

        assert client.post("/api/v1/repositories", json={"name": "empty"}).status_code == 201
        assert client.delete("/api/v1/repositories/empty").status_code == 204
    with writer.client(OTHER_TOKEN) as other:
        assert other.post("/api/v1/repositories", json={"name": "other"}).status_code == 201
        assert other.delete("/api/v1/repositories/other").status_code == 403  # admin only


def test_repository_list_is_paginated_and_filtered(site):
    writer, _, _ = site
    with writer.client() as client:
        for name in ("r-c", "r-a", "r-b", "pub"):
            assert client.post("/api/v1/repositories", json={"name": name, "public": name == "pub"}).status_code == 201
        everything = [r["name"] for r in walk(client, "/api/v1/repositories", 2)]
        assert everything == ["builds", "pub", "r-a", "r-b", "r-c"]
        for bad in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"cursor": "not-a-cursor"}, {"cursor": "W10"}):
            answer = client.get("/api/v1/repositories", params=bad)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", bad
    with writer.client(READER_TOKEN) as reader:
        assert [r["name"] for r in walk(reader, "/api/v1/repositories", 3)] == everything
    with writer.client(OTHER_TOKEN) as other:
        assert other.post("/api/v1/repositories", json={"name": "other"}).status_code == 201
        assert [r["name"] for r in walk(other, "/api/v1/repositories", 1)] == ["other", "pub"]
    with writer.client(None) as anonymous:
        assert [r["name"] for r in walk(anonymous, "/api/v1/repositories", 10)] == ["pub"]


def test_write_refusals_hide_what_the_caller_may_not_read(site):
    writer, _, (a, _, _) = site
    with writer.client(OTHER_TOKEN) as other, writer.client(READER_TOKEN) as reader, writer.client(None) as anonymous:
        body = {"group": "g", "name": "n", "version": "1", "artifactId": a}
        assert other.put(f"{BASE}/packages", json=body).status_code == 404
        assert other.put("/api/v1/repositories/missing/packages", json=body).status_code == 404
        assert reader.put(f"{BASE}/packages", json=body).status_code == 403
        assert anonymous.put(f"{BASE}/packages", json=body).status_code == 401
        assert reader.delete(f"{BASE}/asset", params={"path": "x"}).status_code == 403
