"""The console's list pages find things over plain HTTP (issue 25): each has a GET form of filters
(no script needed) handed to the API's list, newest first where the list has a time, the pager
keeps the filters and the order, and a value the API refuses is shown on the page with the form.
tests/test_console_filters_browser.py does the same in a real browser."""

from __future__ import annotations

import hashlib
import html
import re
import uuid

import httpx
import pytest

from .console_client import Console, make_account, messages
from .harness import ADMIN_TOKEN, db_execute

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def writer(module_cluster):
    writer = module_cluster.writer().wait_ready()
    make_account(writer.url, "root", admin=True)
    return writer


@pytest.fixture(scope="module")
def admin(writer):
    with Console(writer.url) as console:
        yield console.signed_in("root")


def api(writer) -> httpx.Client:
    return httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)


def rows(page: httpx.Response, table: str) -> list[str]:
    """The row headers (first cells) of `table` on the page, as text."""
    body = page.text.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0] if f'<table id="{table}">' in page.text \
        else page.text.split("<table>", 1)[1].split("</table>", 1)[0]
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r'<th scope="row">(.*?)</th>', body, re.S)]


def next_link(page: httpx.Response) -> str | None:
    found = re.search(r'<a href="([^"]*)" rel="next">', page.text)
    return html.unescape(found.group(1)) if found else None


def search_form(page: httpx.Response) -> str:
    found = re.search(r'<form method="get"[^>]*role="search".*?</form>', page.text, re.S)
    assert found, page.text
    return found.group(0)


def test_artifacts_newest_first_found_by_prefix_and_digest_across_pages(writer, admin, module_database_url):
    repo = f"builds-{uuid.uuid4().hex[:6]}"
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": repo}).status_code == 201
        for number in range(56):
            made = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": f"build_{number:03}.tar"},
                               content=f"build {number}".encode())
            assert made.status_code == 201
        for name in ("buildx.tar", "other.tar"):
            client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": name}, content=name.encode())
    # Upload order is time order, a second apart (the list is by time, then id).
    db_execute(module_database_url,
               "UPDATE arkvory_artifacts SET created_at = timestamptz '2026-01-01 00:00:00+00'"
               " + (CASE WHEN name LIKE 'build\\_%' THEN substr(name, 7, 3)::int ELSE 100 END) * interval '1 second'"
               " WHERE repository_id = (SELECT id FROM arkvory_repositories WHERE name = $1)", repo)
    page = admin.get(f"/console/repositories/{repo}")
    assert page.status_code == 200
    form = search_form(page)
    assert f'action="/console/repositories/{repo}"' in form
    for field in ('name="prefix"', 'name="sha256"', 'name="order"', '<option value="newest" selected>'):
        assert field in form, form
    assert "newest first" in page.text
    shown = rows(page, "artifacts")  # the two of one time first, in either order (their ids decide)
    assert sorted(shown[:2]) == ["buildx.tar", "other.tar"] and shown[2] == "build_055.tar"

    # `_` is a plain character: build_ finds the 56 builds, newest first, over two pages.
    first = admin.get(f"/console/repositories/{repo}", params={"prefix": "build_"})
    assert rows(first, "artifacts") == [f"build_{n:03}.tar" for n in range(55, 5, -1)]
    assert 'value="build_"' in search_form(first)
    link = next_link(first)
    assert link and "prefix=build_" in link and "order=" not in link  # the console's default order needs no parameter
    second = admin.get(link)
    assert rows(second, "artifacts") == [f"build_{n:03}.tar" for n in range(5, -1, -1)]
    assert next_link(second) is None and "First page" in second.text
    oldest = admin.get(f"/console/repositories/{repo}", params={"prefix": "build_", "order": "oldest"})
    assert rows(oldest, "artifacts")[:2] == ["build_000.tar", "build_001.tar"]
    assert "order=oldest" in next_link(oldest) and "oldest first" in oldest.text
    assert '<option value="oldest" selected>' in search_form(oldest)

    digest = hashlib.sha256(b"build 7").hexdigest()
    assert rows(admin.get(f"/console/repositories/{repo}", params={"sha256": digest}), "artifacts") == ["build_007.tar"]
    nothing = admin.get(f"/console/repositories/{repo}", params={"prefix": "zzz"})
    assert "No artifact matches these filters." in nothing.text
    refused = admin.get(f"/console/repositories/{repo}", params={"sha256": "not hex"})
    assert refused.status_code == 400
    assert any("'sha256' must be a SHA-256" in message for message in messages(refused)), messages(refused)
    assert 'value="not hex"' in search_form(refused)  # the form keeps what was typed, to correct it


def test_packages_assets_and_repositories_find_by_their_filters(writer, admin):
    repo = f"find-{uuid.uuid4().hex[:6]}"
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": repo}).status_code == 201
        artifact = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "a"}, content=b"a").json()["id"]
        for group, name in (("org.a", "lib"), ("org.a", "app"), ("org.b", "lib"), ("org.b", "lib_x")):
            body = {"group": group, "name": name, "version": "1", "artifactId": artifact}
            assert client.put(f"/api/v1/repositories/{repo}/packages", json=body).status_code == 201
        for path in ("rel/1", "rel/2", "rel_3", "other"):
            client.put(f"/api/v1/repositories/{repo}/assets", params={"path": path}, json={"artifactId": artifact})
    packages = f"/console/repositories/{repo}/packages"
    page = admin.get(packages, params={"group": "org.b"})
    assert page.status_code == 200 and rows(page, "packages") == ["lib", "lib_x"]
    form = search_form(page)
    assert all(f'name="{field}"' in form for field in ("group", "name", "prefix", "order"))
    assert rows(admin.get(packages, params={"prefix": "lib_"}), "packages") == ["lib_x"]
    assert rows(admin.get(packages, params={"group": "org.a", "name": "lib"}), "packages") == ["lib"]
    assert admin.get(packages, params={"order": "newest"}).status_code == 200
    assets = f"/console/repositories/{repo}/assets"
    assert rows(admin.get(assets, params={"prefix": "rel/"}), "assets") == ["rel/1", "rel/2"]
    assert rows(admin.get(assets, params={"prefix": "rel_"}), "assets") == ["rel_3"]
    repositories = admin.get("/console/repositories", params={"prefix": repo})
    assert rows(repositories, "repositories") == [repo]
    assert "No repository you may read matches this filter." in admin.get("/console/repositories",
                                                                          params={"prefix": "zzz-none"}).text


def test_accounts_tokens_keys_and_tasks_find_by_their_filters(writer, admin):
    stem = f"who{uuid.uuid4().hex[:6]}"
    for name in (f"{stem}-Ann", f"{stem}-bob"):
        make_account(writer.url, name)
    page = admin.get("/console/accounts", params={"prefix": stem.upper()})
    assert rows(page, "accounts") == [f"{stem}-Ann", f"{stem}-bob"]
    newest = admin.get("/console/accounts", params={"prefix": stem, "order": "newest"})
    assert rows(newest, "accounts") == [f"{stem}-bob", f"{stem}-Ann"]
    with Console(writer.url) as mine:
        mine.signed_in(f"{stem}-bob")
        for label in ("ci-1", "ci-2", "laptop"):
            assert mine.submit("/console/tokens", "/console/tokens", label=label, access="read").status_code == 201
        tokens = mine.get("/console/tokens")
        assert rows(tokens, "tokens") == ["laptop", "ci-2", "ci-1"]  # newest first
        assert rows(mine.get("/console/tokens", params={"prefix": "ci-", "order": "oldest"}), "tokens") == ["ci-1", "ci-2"]
    with api(writer) as client:
        for label in (f"{stem}-deploy", f"{stem}-backup"):
            assert client.post("/api/v1/keys", json={"scopes": ["read:*"], "label": label}).status_code == 201
        cleanup = client.post("/api/v1/tasks", json={"kind": "cleanup"}).json()["id"]
        verify = client.post("/api/v1/tasks", json={"kind": "verify"}).json()["id"]
    keys = admin.get("/console/keys", params={"prefix": stem})
    assert rows(keys, "keys") == [f"{stem}-backup", f"{stem}-deploy"]  # newest first
    tasks = admin.get("/console/tasks", params={"kind": "verify"})
    shown = rows(tasks, "tasks")
    assert verify in shown and cleanup not in shown
    form = search_form(tasks)
    assert '<option value="verify" selected>' in form and 'name="status"' in form and 'name="order"' in form
    oldest = rows(admin.get("/console/tasks", params={"order": "oldest", "status": "queued"}), "tasks")
    assert oldest.index(cleanup) < oldest.index(verify)
    assert admin.get("/console/tasks", params={"kind": "nope"}).status_code == 400
