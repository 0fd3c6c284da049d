"""Every list's order and filters over real HTTP on a live writer (issue 25): newest or oldest first,
paged through more than one page in both orders without a loss or a repeat while rows share a
timestamp; names by exact name, by prefix (where `%` and `_` are plain characters) and artifacts
by SHA-256; packages by group and name; accounts without regard to case; tokens and keys by label;
storage diagnostics by digest prefix."""

from __future__ import annotations

import datetime
import hashlib
import uuid

import pytest

from .harness import db_execute, db_fetch
from .test_catalog_api import walk as walk_pages
from .test_accounts import make_account, session_of

pytestmark = pytest.mark.timeout(180)

LIMIT = 3  # small pages: every list here spans several


@pytest.fixture(scope="module")
def writer(module_cluster):
    return module_cluster.writer().wait_ready()


def walk(client, url: str, **params) -> list[dict]:
    """Every item of a list, page by page, LIMIT a page."""
    return walk_pages(client, url, LIMIT, **params)


def moment(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def check_both_orders(client, url: str, ids: list[str], time_field: str, id_field: str = "id", **params) -> list[dict]:
    """The list in both orders: each exactly `ids` once, oldest first by (time, id), newest first
    its reverse. Returns the oldest-first items."""
    oldest = walk(client, url, order="oldest", **params)
    newest = walk(client, url, order="newest", **params)
    assert len(oldest) > LIMIT  # more than one page
    for items in (oldest, newest):
        seen = [item[id_field] for item in items]
        assert len(seen) == len(set(seen)), "an item repeated across pages"
        assert sorted(seen) == sorted(ids), "an item lost (or foreign) across pages"
    keys = [(moment(item[time_field]), item[id_field]) for item in oldest]
    assert keys == sorted(keys)
    assert newest == oldest[::-1]
    return oldest


def share_timestamps(database_url: str, table: str, column: str, where: str, *args) -> None:
    """Three rows to a timestamp (ties broken by id only), as a busy installation has them."""
    db_execute(
        database_url,
        f"UPDATE {table} t SET {column} = timestamptz '2026-01-01 00:00:00+00' + (r.n / 3) * interval '1 second'"
        f" FROM (SELECT ctid, row_number() OVER (ORDER BY ctid) AS n FROM {table} WHERE {where}) r"
        " WHERE t.ctid = r.ctid",
        *args,
    )


def new_repository(client, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    assert client.post("/api/v1/repositories", json={"name": name}).status_code == 201
    return name


def upload(client, repo: str, name: str, content: bytes) -> dict:
    answer = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": name}, content=content)
    assert answer.status_code == 201, answer.text
    return answer.json()


# -- artifacts -----------------------------------------------------------------------------------


def test_artifacts_newest_or_oldest_first_page_through_shared_timestamps(writer, module_database_url):
    with writer.client() as client:
        repo = new_repository(client, "order")
        made = [upload(client, repo, f"n{i:02}", f"content {i}".encode())["id"] for i in range(14)]
        made += [upload(client, repo, "same.bin", f"same {i}".encode())["id"] for i in range(7)]
        share_timestamps(module_database_url, "arkvory_artifacts", "created_at",
                         "repository_id = (SELECT id FROM arkvory_repositories WHERE name = $1)", repo)
        url = f"/api/v1/repositories/{repo}/artifacts"
        oldest = check_both_orders(client, url, made, "createdAt")
        assert walk(client, url) == oldest  # the API's default stays oldest first
        # A name filter pages in both orders too.
        check_both_orders(client, url, made[14:], "createdAt", name="same.bin")
        check_both_orders(client, url, made[14:], "createdAt", prefix="sam")


def test_artifacts_by_name_prefix_and_sha256(writer):
    with writer.client() as client:
        repo = new_repository(client, "find")
        names = ["a%b.bin", "a_b.bin", "axb.bin", "a%%.bin", "b.bin", "A_B.bin", "\u0436.bin", "\u0436x.bin"]
        made = {name: upload(client, repo, name, name.encode() * 3) for name in names}
        twin = upload(client, repo, "copy-of-b.bin", "b.bin".encode() * 3)
        url = f"/api/v1/repositories/{repo}/artifacts"

        def named(**params) -> list[str]:
            return sorted(item["name"] for item in walk(client, url, **params))

        assert named(prefix="a_") == ["a_b.bin"]  # '_' is not a wildcard
        assert named(prefix="a%") == ["a%%.bin", "a%b.bin"]  # nor is '%'
        assert named(prefix="a") == ["a%%.bin", "a%b.bin", "a_b.bin", "axb.bin"]  # case-sensitive
        assert named(prefix="\u0436") == ["\u0436.bin", "\u0436x.bin"]
        assert named(prefix="zzz") == []
        assert named(name="a_b.bin") == ["a_b.bin"]
        digest = hashlib.sha256(b"b.bin" * 3).hexdigest()
        assert named(sha256=digest) == ["b.bin", "copy-of-b.bin"]
        assert named(sha256=digest.upper()) == ["b.bin", "copy-of-b.bin"]
        assert [i["id"] for i in walk(client, url, sha256=digest, name="copy-of-b.bin")] == [twin["id"]]
        assert named(sha256="0" * 64) == []
        assert made["b.bin"]["sha256"] == digest
        for bad in ({"sha256": "abc"}, {"sha256": "g" * 64}, {"prefix": ""}, {"prefix": "a\x01"}, {"name": ""},
                    {"order": "sideways"}, {"order": "name"}):
            answer = client.get(url, params=bad)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_input", (bad, answer.text)


# -- packages, assets, repositories ----------------------------------------------------------------


def test_package_versions_by_time_by_coordinates_and_by_prefix(writer, module_database_url):
    with writer.client() as client:
        repo = new_repository(client, "packages")
        artifact = upload(client, repo, "p.bin", b"package")["id"]
        coordinates = [(group, name, str(version)) for group in ("org.a", "org_b") for name in ("lib", "lib_x", "app")
                       for version in range(3)]
        for group, name, version in coordinates:
            body = {"group": group, "name": name, "version": version, "artifactId": artifact}
            assert client.put(f"/api/v1/repositories/{repo}/packages", json=body).status_code == 201
        share_timestamps(module_database_url, "arkvory_packages", "published_at",
                         "repository_id = (SELECT id FROM arkvory_repositories WHERE name = $1)", repo)
        url = f"/api/v1/repositories/{repo}/packages"
        by_name = walk(client, url)
        assert [(p["group"], p["name"], p["version"]) for p in by_name] == sorted(coordinates)
        assert walk(client, url, order="name") == by_name
        ids = ["/".join(c) for c in coordinates]
        oldest = walk(client, url, order="oldest")
        newest = walk(client, url, order="newest")
        assert newest == oldest[::-1]
        assert sorted("/".join((p["group"], p["name"], p["version"])) for p in oldest) == sorted(ids)
        keys = [(moment(p["publishedAt"]), p["group"], p["name"], p["version"]) for p in oldest]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)

        def found(**params) -> list[tuple[str, str, str]]:
            return [(p["group"], p["name"], p["version"]) for p in walk(client, url, **params)]

        assert found(group="org_b", name="lib") == [("org_b", "lib", v) for v in "012"]
        assert found(prefix="lib_") == sorted(c for c in coordinates if c[1] == "lib_x")
        assert found(prefix="lib") == sorted(c for c in coordinates if c[1].startswith("lib"))
        assert found(group="org.a", prefix="ap") == [("org.a", "app", v) for v in "012"]
        newest_lib = found(group="org.a", name="lib", order="newest")
        assert sorted(newest_lib) == [("org.a", "lib", v) for v in "012"]
        assert found(group="org%", prefix="l") == []


def test_assets_by_path_prefix_and_their_history_in_either_order(writer):
    with writer.client() as client:
        repo = new_repository(client, "assets")
        first, second = upload(client, repo, "1.bin", b"one")["id"], upload(client, repo, "2.bin", b"two")["id"]
        paths = [f"rel/v{i}/x" for i in range(8)] + ["rel_x", "rel%/y", "other"]
        for path in paths:
            assert client.put(f"/api/v1/repositories/{repo}/assets", params={"path": path},
                              json={"artifactId": first}).status_code == 200
        url = f"/api/v1/repositories/{repo}/assets"
        assert [a["path"] for a in walk(client, url, prefix="rel/")] == sorted(p for p in paths if p.startswith("rel/"))
        assert [a["path"] for a in walk(client, url, prefix="rel_")] == ["rel_x"]
        assert [a["path"] for a in walk(client, url, prefix="rel%")] == ["rel%/y"]
        assert [a["path"] for a in walk(client, url)] == sorted(paths)
        for artifact in (second, first, second):
            client.put(f"/api/v1/repositories/{repo}/assets", params={"path": "other"}, json={"artifactId": artifact})
        shown = f"/api/v1/repositories/{repo}/asset"
        newest = client.get(shown, params={"path": "other"}).json()["history"]
        oldest = client.get(shown, params={"path": "other", "order": "oldest"}).json()["history"]
        assert [h["artifactId"] for h in oldest] == [first, second, first, second]
        assert newest == oldest[::-1]
        assert client.get(shown, params={"path": "other", "order": "oldest", "historyLimit": 1}).json()["history"] == oldest[:1]


def test_repositories_by_name_prefix(writer):
    with writer.client() as client:
        stem = f"pre{uuid.uuid4().hex[:6]}"
        names = [f"{stem}_a", f"{stem}xa", f"{stem}_b", f"{stem}.c", f"{stem}-d"]
        for name in names:
            assert client.post("/api/v1/repositories", json={"name": name}).status_code == 201
        listed = lambda prefix: [r["name"] for r in walk(client, "/api/v1/repositories", prefix=prefix)]  # noqa: E731
        assert listed(stem) == sorted(names)  # byte order: '-' < '.' < '_' < 'x'
        assert listed(f"{stem}_") == [f"{stem}_a", f"{stem}_b"]
        assert listed(f"{stem}_b") == [f"{stem}_b"]


# -- accounts, tokens, keys, tasks, diagnostics --------------------------------------------------------


def test_accounts_by_prefix_without_regard_to_case_and_by_time(writer, module_database_url):
    stem = f"acct{uuid.uuid4().hex[:6]}"
    names = [f"{stem}-{c}" for c in ("b", "A", "c", "D", "e")] + [f"{stem}x"]
    for name in names:
        make_account(writer, name)
    with writer.client() as client:
        found = lambda **params: [a["name"] for a in walk(client, "/api/v1/accounts", **params)]  # noqa: E731
        assert found(prefix=stem.upper() + "-") == [f"{stem}-{c}" for c in ("A", "b", "c", "D", "e")]
        share_timestamps(module_database_url, "arkvory_accounts", "created_at", "name LIKE $1", stem + "%")
        everyone = [a["id"] for a in walk(client, "/api/v1/accounts")]
        check_both_orders(client, "/api/v1/accounts", everyone, "createdAt")


def test_tokens_and_keys_by_label_and_in_either_order(writer, module_database_url):
    account = f"tok{uuid.uuid4().hex[:8]}"
    make_account(writer, account)
    with writer.client(session_of(writer, account)) as mine:
        tokens = [mine.post("/api/v1/tokens", json={"label": label}).json()["id"]
                  for label in ("ci_1", "ci_2", "cix", "deploy", "ci_3")]
        share_timestamps(module_database_url, "arkvory_credentials", "created_at", "kind = 'pat' AND id = ANY($1::uuid[])",
                         tokens)
        check_both_orders(mine, "/api/v1/tokens", tokens, "createdAt")
        assert sorted(t["label"] for t in walk(mine, "/api/v1/tokens", prefix="ci_")) == ["ci_1", "ci_2", "ci_3"]
    with writer.client() as admin:
        stem = f"key{uuid.uuid4().hex[:6]}"
        keys = [admin.post("/api/v1/keys", json={"scopes": ["read:*"], "label": f"{stem}{suffix}"}).json()["id"]
                for suffix in ("_a", "_b", "x", "_c", "_d")]
        share_timestamps(module_database_url, "arkvory_credentials", "created_at", "id = ANY($1::uuid[])", keys)
        everyone = [k["id"] for k in walk(admin, "/api/v1/keys")]
        assert set(keys) <= set(everyone)
        check_both_orders(admin, "/api/v1/keys", everyone, "createdAt")
        labelled = walk(admin, "/api/v1/keys", prefix=f"{stem}_", order="newest")
        assert sorted(k["id"] for k in labelled) == sorted(keys[:2] + keys[3:])


def test_tasks_oldest_first_through_shared_timestamps(writer, module_database_url):
    with writer.client() as client:
        made = [client.post("/api/v1/tasks", json={"kind": kind}).json()["id"] for kind in ("cleanup", "verify") * 4]
        share_timestamps(module_database_url, "arkvory_tasks", "created_at", "id = ANY($1::uuid[])", made)
        everything = [t["id"] for t in walk(client, "/api/v1/tasks")]
        assert set(made) <= set(everything)
        oldest = check_both_orders(client, "/api/v1/tasks", everything, "created_at")
        assert walk(client, "/api/v1/tasks") == oldest[::-1]  # the API's default stays newest first
        verify = walk(client, "/api/v1/tasks", kind="verify", order="oldest")
        assert {t["kind"] for t in verify} == {"verify"} and set(made[1::2]) <= {t["id"] for t in verify}


def test_storage_diagnostics_by_digest_prefix_and_in_either_order(writer, module_database_url):
    digests = [f"{i:02x}" + "ab" * 31 for i in range(0, 256, 23)]
    db_execute(
        module_database_url,
        "INSERT INTO arkvory_storage_diagnostics (sha256, problem, detected_at)"
        " SELECT d, CASE WHEN i % 2 = 0 THEN 'missing' ELSE 'corrupt' END,"
        " timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'"
        " FROM unnest($1::text[]) WITH ORDINALITY AS x(d, i) ON CONFLICT DO NOTHING",
        digests,
    )
    with writer.client() as client:
        url = "/api/v1/storage/diagnostics"
        everything = walk(client, url)
        assert [d["sha256"] for d in everything] == sorted(d["sha256"] for d in everything)
        check_both_orders(client, url, [d["sha256"] for d in everything], "detectedAt", id_field="sha256")
        assert [d["sha256"] for d in walk(client, url, prefix="2E")] == [d for d in digests if d.startswith("2e")]
        # The second digest ("17ab...") is missing, the first ("00ab...") corrupt.
        assert [d["sha256"] for d in walk(client, url, problem="missing", prefix="1")] == [digests[1]]
        assert walk(client, url, problem="corrupt", prefix="1") == []
        assert client.get(url, params={"prefix": "xyz"}).status_code == 400
    assert db_fetch(module_database_url, "SELECT count(*) AS n FROM arkvory_storage_diagnostics")[0]["n"] >= len(digests)
