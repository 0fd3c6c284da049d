"""The console over plain HTTP against a real writer (issue 15 §1): sign-in and its cookie, CSRF
on every form and on cookie-authorized API changes, the headers of every page, permissions,
escaping, hostile form input, the download, the overview's processes, and no console on a
gateway. tests/test_console_browser.py drives the same pages in a real browser."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
import urllib.parse
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arkvory.writer.console.security import CONTENT_SECURITY_POLICY

from .console_client import PASSWORD, Console, csrf_of, make_account, messages, scripts_of
from .harness import ADMIN_TOKEN, db_fetch
from .worker_harness import start_worker, wait_for

pytestmark = pytest.mark.timeout(180)

HOSTILE = "<script>window.__pwned=1</script>"


@pytest.fixture
def writer(cluster):
    """A writer of its own: for a test that lists every repository or account, or makes names
    another test makes too."""
    return cluster.writer().wait_ready()


@pytest.fixture
def admin(writer):
    make_account(writer.url, "root", admin=True)
    with Console(writer.url) as console:
        yield console.signed_in("root")


@pytest.fixture(scope="module")
def shared_writer(module_cluster):
    """One writer for the tests that look only at what they make themselves, under names of
    their own: each saves a writer's start and the hashing of an account's password."""
    writer = module_cluster.writer().wait_ready()
    make_account(writer.url, "root", admin=True)
    make_account(writer.url, "redirected")
    return writer


@pytest.fixture(scope="module")
def shared_admin(shared_writer):
    with Console(shared_writer.url) as console:
        yield console.signed_in("root")


def api(writer, token: str = ADMIN_TOKEN) -> httpx.Client:
    return httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def upload(writer, repo: str, name: str, data: bytes, token: str = ADMIN_TOKEN) -> dict:
    with api(writer, token) as client:
        answer = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": name}, content=data)
    assert answer.status_code == 201, answer.text
    return answer.json()


# -- signing in and out ----------------------------------------------------------------------------


def test_pages_need_a_signed_in_account_and_the_session_cookie_is_strict(writer):
    make_account(writer.url, "alice")
    with Console(writer.url) as console:
        first = console.get("/console/repositories?cursor=abc")
        assert first.status_code == 303
        assert first.headers["location"] == "/console/sign-in?next=%2Fconsole%2Frepositories%3Fcursor%3Dabc"
        form = console.get("/console/sign-in")
        presession = form.headers["set-cookie"]
        assert presession.startswith("arkvory_console_csrf=")
        for attribute in ("HttpOnly", "SameSite=Strict", "Path=/console/"):
            assert attribute in presession
        wrong = console.http.post("/console/sign-in", data={"csrf": csrf_of(form), "name": "alice", "password": "not the password"})
        assert wrong.status_code == 401
        assert messages(wrong) == ["wrong account name or password"]
        assert "not the password" not in wrong.text
        answer = console.http.post("/console/sign-in", data={
            "csrf": csrf_of(form), "name": "alice", "password": PASSWORD, "next": "/console/tokens",
        })
        assert answer.status_code == 303 and answer.headers["location"] == "/console/tokens"
        cookies = answer.headers.get_list("set-cookie")
        session = next(c for c in cookies if c.startswith("arkvory_session="))
        for attribute in ("HttpOnly", "SameSite=Strict", "Path=/"):
            assert attribute in session
        assert "Secure" not in session  # plain HTTP; see the TLS test
        device = next(c for c in cookies if c.startswith("arkvory_device="))
        assert "Path=/console/sign-in" in device and "HttpOnly" in device
        assert console.get("/console/tokens").status_code == 200
        # Signed in already: the sign-in page sends you on.
        assert console.get("/console/sign-in").headers["location"] == "/console/"


@pytest.mark.parametrize("wanted", ["//elsewhere.example/x", "https://elsewhere.example/", "/api/v1/tokens",
                                    "/console/../api/v1/tokens", "javascript:alert(1)", "/console\\x"])
def test_after_signing_in_the_console_sends_you_only_to_a_console_page(shared_writer, wanted):
    with Console(shared_writer.url) as console:
        form = console.get("/console/sign-in", params={"next": wanted})
        answer = console.http.post("/console/sign-in", data={"csrf": csrf_of(form), "name": "redirected",
                                                             "password": PASSWORD, "next": wanted})
        assert answer.status_code == 303 and answer.headers["location"] == "/console/"


def test_sign_out_ends_the_session_everywhere(writer):
    make_account(writer.url, "alice")
    with Console(writer.url) as console:
        console.signed_in("alice")
        token = console.session
        assert console.get("/console/repositories").status_code == 200
        page = console.get("/console/tokens")
        out = console.http.post("/console/sign-out", data={"csrf": csrf_of(page)})
        assert out.status_code == 303 and out.headers["location"] == "/console/sign-in?notice=signed-out"
        assert any(c.startswith("arkvory_session=;") and "Max-Age=0" in c for c in out.headers.get_list("set-cookie"))
        assert messages(console.get(out.headers["location"])) == ["You are signed out."]
    # The old cookie, sent again by someone who kept it, opens nothing.
    with Console(writer.url) as stale:
        stale.http.cookies.set("arkvory_session", token)
        assert stale.get("/console/").headers["location"] == "/console/sign-in"
    with api(writer, token) as client:
        assert client.get("/api/v1/tokens").status_code == 401
    rows = db_fetch(writer.env["ARKVORY_DATABASE_URL"], "SELECT count(*) AS n FROM arkvory_credentials WHERE kind = 'session'")
    assert rows[0]["n"] == 0


def test_a_token_or_key_in_the_cookie_is_not_a_console_session(shared_writer, shared_admin):
    made = shared_admin.submit("/console/tokens", "/console/tokens", access="read-write", label="ci")
    assert made.status_code == 201
    token = made.text.split('id="new-secret" readonly value="', 1)[1].split('"', 1)[0]
    assert token.startswith("pat_")
    for credential in (token, ADMIN_TOKEN):
        with Console(shared_writer.url) as console:
            console.http.cookies.set("arkvory_session", credential)
            assert console.get("/console/").status_code == 303


# -- CSRF ---------------------------------------------------------------------------------------------

POST_ROUTES = [
    "/console/sign-out",
    "/console/repositories",
    "/console/repositories/builds/visibility",
    "/console/repositories/builds/delete",
    "/console/repositories/builds/packages/delete",
    "/console/repositories/builds/assets/delete",
    "/console/repositories/builds/members",
    "/console/repositories/builds/members/remove",
    "/console/repositories/builds/artifacts/00000000-0000-0000-0000-000000000000/delete",
    "/console/repositories/builds/packages",
    "/console/repositories/builds/assets",
    "/console/repositories/builds/asset/restore",
    "/console/tasks",
    "/console/tasks/00000000-0000-0000-0000-000000000000/cancel",
    "/console/accounts",
    "/console/accounts/root/disable",
    "/console/accounts/root/enable",
    "/console/accounts/root/password",
    "/console/accounts/root/delete",
    "/console/account/password",
    "/console/tokens",
    "/console/tokens/revoke",
    "/console/tokens/00000000-0000-0000-0000-000000000000/revoke",
    "/console/keys",
    "/console/keys/00000000-0000-0000-0000-000000000000/revoke",
    "/console/keys/00000000-0000-0000-0000-000000000000/adopt",
]


def test_every_form_post_without_its_csrf_token_is_403(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    other_session = Console(writer.url)
    make_account(writer.url, "mallory")
    other_session.signed_in("mallory")
    foreign = csrf_of(other_session.get("/console/repositories"))  # a real token, of another session
    for path in POST_ROUTES:
        for csrf in (None, "", "x" * 43, foreign):
            data = {"name": "made-by-forgery", "public": "true", "force": "true", "kind": "verify", "account": "root",
                    "level": "admin", "id": str(uuid.uuid4()), "scopes": "admin", "password": "whatever12",
                    "confirm": "yes", "group": "g", "version": "1", "path": "p", "artifact": str(uuid.uuid4()),
                    "history": "1"}
            if csrf is not None:
                data["csrf"] = csrf
            answer = admin.http.post(path, data=data)
            assert answer.status_code == 403, (path, csrf, answer.status_code, answer.text)
            assert "CSRF" in messages(answer)[0]
    # The sign-in form has its own token, bound to the pre-session cookie.
    with Console(writer.url) as stranger:
        stranger.get("/console/sign-in")
        assert stranger.http.post("/console/sign-in", data={"name": "root", "password": PASSWORD}).status_code == 403
        assert stranger.http.post("/console/sign-in", data={"name": "root", "password": PASSWORD, "csrf": foreign}).status_code == 403
    # Nothing happened: the forged forms changed nothing, and the admin is still signed in.
    with api(writer) as client:
        names = [r["name"] for r in client.get("/api/v1/repositories").json()["items"]]
        assert names == ["builds"]
        assert client.get("/api/v1/repositories/builds").json()["public"] is False
        assert [a["name"] for a in client.get("/api/v1/accounts").json()["items"]] == ["mallory", "root"]
        assert client.get("/api/v1/tasks").json()["items"] == []
    assert admin.get("/console/").status_code == 200
    other_session.http.close()


def test_a_cookie_authorized_api_change_needs_the_csrf_header(writer, admin):
    """What another site could make a browser send (if SameSite did not stop the cookie): the
    cookie alone, no Authorization, a simple content type. Refused before the route runs."""
    session, csrf = admin.session, csrf_of(admin.get("/console/"))
    url = writer.url
    forged = [
        ("POST", "/api/v1/repositories", {"content": b'{"name": "forged"}', "headers": {"Content-Type": "text/plain"}}),
        ("POST", "/api/v1/tokens", {"json": {"access": "read-write"}}),
        ("POST", "/api/v1/accounts", {"json": {"name": "forged", "password": "forged password", "admin": True}}),
        ("POST", "/api/v1/tasks", {"json": {"kind": "cleanup"}}),
        ("POST", "/api/v1/logout", {}),
        ("DELETE", "/api/v1/repositories/anything", {}),
        ("PUT", "/api/v1/repositories/anything/permissions/root", {"json": {"level": "read"}}),
    ]
    for method, path, kwargs in forged:
        for header in ({}, {"X-CSRF-Token": ""}, {"X-CSRF-Token": "forged"}):
            headers = {**kwargs.get("headers", {}), **header}
            answer = httpx.request(method, url + path, cookies={"arkvory_session": session}, timeout=30,
                                   **{**kwargs, "headers": headers})
            assert answer.status_code == 403, (method, path, answer.text)
            assert answer.json()["code"] == "forbidden" and "X-CSRF-Token" in answer.json()["message"]
    # Two tokens in two headers are refused too, even when one is right.
    doubled = httpx.post(url + "/api/v1/repositories", json={"name": "doubled"}, timeout=30,
                         cookies={"arkvory_session": session},
                         headers=[("X-CSRF-Token", csrf), ("X-CSRF-Token", "forged")])
    assert doubled.status_code == 403
    with api(writer) as client:
        assert client.get("/api/v1/repositories").json()["items"] == []
        assert [a["name"] for a in client.get("/api/v1/accounts").json()["items"]] == ["root"]
    # The console's own script sends the token: accepted. Reads need none.
    made = httpx.post(url + "/api/v1/repositories", json={"name": "scripted"}, timeout=30,
                      cookies={"arkvory_session": session}, headers={"X-CSRF-Token": csrf})
    assert made.status_code == 201, made.text
    assert httpx.get(url + "/api/v1/repositories", cookies={"arkvory_session": session}, timeout=30).status_code == 200
    # A bearer decides for itself (no cookie is borrowed): API clients are unchanged.
    with api(writer) as client:
        client.cookies.set("arkvory_session", session)
        assert client.post("/api/v1/repositories", json={"name": "by-key"}).status_code == 201
    # Login authorizes nobody by the cookie: a browser that holds an old one still signs in.
    relogin = httpx.post(url + "/api/v1/login", json={"name": "root", "password": PASSWORD}, timeout=30,
                         cookies={"arkvory_session": session})
    assert relogin.status_code == 200


# -- headers and markup -----------------------------------------------------------------------------


def test_every_page_sends_its_security_headers_and_no_inline_script(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        artifact = upload(writer, "builds", "a.bin", b"bytes")
        task = client.post("/api/v1/tasks", json={"kind": "cleanup"}).json()
        assert client.put("/api/v1/repositories/builds/packages",
                          json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]}).status_code == 201
        assert client.put("/api/v1/repositories/builds/assets", params={"path": "p/q"},
                          json={"artifactId": artifact["id"]}).status_code == 200
        assert client.put("/api/v1/repositories/builds/retention",
                          json={"keepNewest": 5, "keepYoungerThanSeconds": None, "enabled": True}).status_code == 200
        key = client.post("/api/v1/keys", json={"scopes": ["read:*"]}).json()
    make_account(writer.url, "bob")
    make_account(writer.url, "carl")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/builds/members/bob", json={"level": "read"}).status_code == 200
    builds = "<h1>Repository builds</h1>"
    confirm = '<h1 id="confirm-heading">'
    artifact_path = f"/console/repositories/builds/artifacts/{artifact['id']}"
    # Each page with its exact status and something only that page shows when it rendered (a
    # broken page that answered 404 or another page's content would fail here).
    pages = [
        ("/console/", 200, ["<h1>Overview</h1>"]),
        ("/console/repositories", 200, ["<h1>Repositories</h1>", 'href="/console/repositories/builds"']),
        ("/console/repositories/builds", 200,
         [builds, "<h2>Artifacts</h2>", "<caption>Artifacts of builds, newest first</caption>", "a.bin"]),
        ("/console/repositories/builds/packages", 200, [builds, "<h2>Packages</h2>"]),
        ("/console/repositories/builds/assets", 200, [builds, "<h2>Assets</h2>"]),
        ("/console/repositories/builds/members", 200, [builds, "<h2>Members</h2>"]),
        ("/console/repositories/builds/retention", 200, [builds, 'id="retention-state"']),
        ("/console/audit", 200, ["<h1>Audit trail</h1>"]),
        ("/console/accounts/bob/password", 200, ['id="reset-form"']),
        ("/console/accounts/bob/delete", 200, ['id="delete-form"']),
        ("/console/account/password", 200, ["<h1>Your password</h1>"]),
        (f"/console/repositories/builds/artifacts/{artifact['id']}", 200,
         ['<h1>Artifact <span class="name">a.bin</span></h1>', artifact["sha256"]]),
        ("/console/tasks", 200, ["<h1>Tasks</h1>", f'href="/console/tasks/{task["id"]}"']),
        (f"/console/tasks/{task['id']}", 200, [f"<h1>Task <code>{task['id']}</code></h1>", "cleanup"]),
        ("/console/accounts", 200, ["<h1>Accounts</h1>", "root"]),
        ("/console/tokens", 200, ["<h1>Your personal tokens</h1>"]),
        ("/console/keys", 200, ["<h1>Managed service keys</h1>"]),
        ("/console/no-such-page", 404, ["<h1>Not found</h1>", "There is no such console page."]),
        ("/console/repositories/nope", 404, ["<h1>Not found</h1>", "no repository &#39;nope&#39;"]),
        ("/console/sign-in", 303, ["/console/"]),  # signed in already: on to the console
        # publishing (issue 25 §5), downloads through the gateways (§6), confirmations (§7)
        ("/console/repositories/builds/package?group=g&name=n&version=1", 200,
         ['<h1>Package version <span class="name">g/n 1</span></h1>', 'id="line-curl"', "copy.js"]),
        ("/console/repositories/builds/asset?path=p/q", 200,
         ['<h1>Asset <span class="name">p/q</span></h1>', 'id="asset-history"', 'id="line-arkvory"']),
        ("/console/repositories/builds/packages/new", 200, ["<h1>Publish a package version</h1>"]),
        ("/console/repositories/builds/assets/new", 200, ["<h1>Point an asset at an artifact</h1>"]),
        (f"{artifact_path}/delete", 200, [confirm + "Delete artifact a.bin?</h1>"]),
        ("/console/repositories/builds/delete", 200, [confirm + "Delete repository builds?</h1>"]),
        ("/console/repositories/builds/packages/delete?group=g&name=n&version=1", 200, [confirm + "Delete package version g/n 1?</h1>"]),
        ("/console/repositories/builds/assets/delete?path=p/q", 200, [confirm + "Delete asset p/q?</h1>"]),
        ("/console/repositories/builds/members/remove?account=BOB", 200,
         [confirm + "Remove bob from the members of builds?</h1>", "its level (read)"]),
        # an account that is no member: the API's refusal, never a page for a removal that cannot happen
        ("/console/repositories/builds/members/remove?account=carl", 404,
         ["<h1>Not found</h1>", "&#39;carl&#39; has no permission on &#39;builds&#39;"]),
        (f"/console/tasks/{task['id']}/cancel", 200,
         [confirm + f"Cancel the cleanup task {task['id']}?</h1>", "It is queued.", ">Keep it</a>"]),
        ("/console/repositories/builds/retention/disable", 200, [confirm + "Disable the retention rule of builds?</h1>"]),
        ("/console/repositories/builds/retention/delete", 200, [confirm + "Delete the retention rule of builds?</h1>"]),
        ("/console/accounts/bob/disable", 200, [confirm + "Disable account bob?</h1>"]),
        (f"/console/keys/{key['id']}/revoke", 200, [confirm + f"Revoke service key {key['id']}?</h1>"]),
        (f"/console/tokens/{uuid.UUID(int=1)}/revoke", 200, [confirm + f"Revoke token {uuid.UUID(int=1)}?</h1>"]),
    ]
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY and "script-src 'self'" in CONTENT_SECURITY_POLICY
    with Console(writer.url) as anonymous:
        answers = [(path, admin.get(path), status, shows) for path, status, shows in pages]
        answers.append(("/console/sign-in", anonymous.get("/console/sign-in"), 200, ["<h1>Sign in</h1>"]))
    for path, answer, status, shows in answers:
        assert answer.status_code == status, (path, answer.status_code, answer.text)
        if status == 303:
            assert answer.headers["location"] == shows[0], (path, answer.headers["location"])
        else:
            assert "text/html" in answer.headers["content-type"], path
            assert [text for text in shows if text not in answer.text] == [], (path, answer.text)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store", path
        if answer.status_code != 303:
            found = scripts_of(answer.text)
            assert found.inline == [] and found.handlers == [], (path, found.inline, found.handlers)
            assert all(source and source.startswith("/console/static/") for source in found.sources), found.sources
            for url in found.urls:  # no secret in any link or form target
                assert admin.session not in url and "dps_" not in url and "csrf" not in url.lower(), url
            # No secret anywhere on a page: the session, a key, the database's address (nor its
            # host and port, nor its name, which is unique to this test).
            database = urllib.parse.urlsplit(writer.env["ARKVORY_DATABASE_URL"])
            for secret in (admin.session, ADMIN_TOKEN, writer.env["ARKVORY_DATABASE_URL"], database.netloc,
                           database.path.strip("/")):
                assert secret not in answer.text, (path, secret)
    for static in ("console.css", "upload.js", "task-events.js", "overview.js", "copy.js"):
        answer = admin.get(f"/console/static/{static}")
        assert answer.status_code == 200 and answer.headers["x-content-type-options"] == "nosniff"
    # A page that shows a new secret is never stored.
    made = admin.submit("/console/tokens", "/console/tokens", access="read")
    assert made.status_code == 201 and made.headers["cache-control"] == "no-store"


def test_what_users_typed_is_shown_as_text(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    hostile_name = '<img src=x onerror="window.__pwned=1">"&\''
    artifact = upload(writer, "builds", hostile_name, b"data")
    made = admin.submit("/console/tokens", "/console/tokens", access="read", label=HOSTILE)
    assert made.status_code == 201
    listing = admin.get("/console/repositories/builds")
    page = admin.get(f"/console/repositories/builds/artifacts/{artifact['id']}")
    tokens = admin.get("/console/tokens")
    for answer, raw in ((listing, hostile_name), (page, hostile_name), (tokens, HOSTILE), (made, HOSTILE)):
        assert raw not in answer.text
        assert "<img src=x" not in answer.text and "<script>window" not in answer.text
        assert scripts_of(answer.text).handlers == []
    assert "&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;&#34;&amp;&#39;" in page.text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in tokens.text


# -- permissions ------------------------------------------------------------------------------------


def test_a_user_sees_only_what_the_api_lets_it_read(writer):
    with api(writer) as client:
        for name, public in (("team", False), ("secret", False), ("open", True)):
            assert client.post("/api/v1/repositories", json={"name": name, "public": public}).status_code == 201
    hidden = upload(writer, "secret", "classified.bin", b"classified bytes")
    make_account(writer.url, "alice")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/team/permissions/alice", json={"level": "read"}).status_code == 200
    with Console(writer.url) as alice:
        alice.signed_in("alice")
        listing = alice.get("/console/repositories").text
        assert "/console/repositories/team" in listing and "/console/repositories/open" in listing
        assert "secret" not in listing
        for path in ("/console/repositories/secret", f"/console/repositories/secret/artifacts/{hidden['id']}",
                     f"/console/repositories/secret/artifacts/{hidden['id']}/download", "/console/repositories/secret/assets"):
            answer = alice.get(path)
            assert answer.status_code == 404, (path, answer.status_code)
            assert "classified" not in answer.text
        # A reader is offered no change, and the API refuses one anyway.
        team = alice.get("/console/repositories/team").text
        assert "upload-form" not in team and "/delete" not in team and "/visibility" not in team
        assert "Tasks" not in listing and "Overview" not in listing  # administrators' sections are not offered
        csrf = csrf_of(alice.get("/console/repositories"))
        for confirmed in ({}, {"confirm": "yes"}):  # refused, whether it was confirmed or not
            forced = alice.http.post("/console/repositories/team/delete", data={"csrf": csrf, "force": "true", **confirmed})
            assert forced.status_code == 403, forced.text
        assert alice.get("/console/repositories/team/delete").status_code == 403
        for path in ("/console/tasks", "/console/accounts", "/console/keys"):
            refused = alice.get(path)
            assert refused.status_code == 403, path
            assert "administrators" in " ".join(messages(refused)) or "admin scope" in " ".join(messages(refused))
    with api(writer) as client:
        assert client.get("/api/v1/repositories/team").status_code == 200


# -- what the pages do --------------------------------------------------------------------------------


def test_repositories_artifacts_and_refusals_as_messages(writer, admin):
    created = admin.submit("/console/repositories", "/console/repositories", name="builds")
    assert created.status_code == 303 and created.headers["location"] == "/console/repositories/builds?notice=repository-created"
    assert messages(admin.get(created.headers["location"])) == ["The repository was created."]
    again = admin.submit("/console/repositories", "/console/repositories", name="builds")
    assert again.status_code == 409 and messages(again) == ["repository 'builds' already exists"]
    bad = admin.submit("/console/repositories", "/console/repositories", name="no/slashes")
    assert bad.status_code == 400 and "repository names are" in messages(bad)[0]

    data = os.urandom(200_000)
    artifact = upload(writer, "builds", "app.tar", data)
    with api(writer) as client:
        assert client.put("/api/v1/repositories/builds/packages", json={
            "group": "org", "name": "app", "version": "1.0", "artifactId": artifact["id"]}).status_code == 201
        assert client.put("/api/v1/repositories/builds/assets", params={"path": "latest/app.tar"},
                          json={"artifactId": artifact["id"]}).status_code == 200
    page = admin.get(f"/console/repositories/builds/artifacts/{artifact['id']}")
    assert artifact["sha256"] in page.text and "latest/app.tar" in page.text and "1.0" in page.text
    assert "200000 B" in page.text

    # The API's refusals, as the API words them.
    used = admin.submit(f"/console/repositories/builds/artifacts/{artifact['id']}",
                        f"/console/repositories/builds/artifacts/{artifact['id']}/delete", confirm="yes")
    assert used.status_code == 409 and "still used by a package version" in messages(used)[0]
    holding = admin.submit("/console/repositories/builds", "/console/repositories/builds/delete", confirm="yes")
    assert holding.status_code == 409 and "still holds 1 artifact" in messages(holding)[0]

    assert admin.get("/console/repositories/builds/packages").status_code == 200
    gone = admin.submit("/console/repositories/builds/packages", "/console/repositories/builds/packages/delete",
                        group="org", name="app", version="1.0", confirm="yes")
    assert gone.status_code == 303
    gone = admin.submit("/console/repositories/builds/assets", "/console/repositories/builds/assets/delete", path="latest/app.tar",
                        confirm="yes")
    assert gone.status_code == 303
    deleted = admin.submit(f"/console/repositories/builds/artifacts/{artifact['id']}",
                           f"/console/repositories/builds/artifacts/{artifact['id']}/delete", confirm="yes")
    assert deleted.status_code == 303 and "notice=artifact-deleted" in deleted.headers["location"]

    public = admin.submit("/console/repositories/builds", "/console/repositories/builds/visibility", public="true")
    assert public.status_code == 303
    with api(writer) as client:
        assert client.get("/api/v1/repositories/builds").json()["public"] is True
    make_account(writer.url, "bob")
    granted = admin.submit("/console/repositories/builds/members", "/console/repositories/builds/members",
                           account="bob", level="write")
    assert granted.status_code == 303
    assert "bob" in admin.get("/console/repositories/builds/members").text
    nobody = admin.submit("/console/repositories/builds/members", "/console/repositories/builds/members",
                          account="nobody", level="read")
    assert nobody.status_code == 404 and messages(nobody) == ["no account 'nobody'"]
    removed = admin.submit("/console/repositories/builds/members", "/console/repositories/builds/members/remove",
                           account="bob", confirm="yes")
    assert removed.status_code == 303
    dropped = admin.submit("/console/repositories/builds", "/console/repositories/builds/delete", force="true", confirm="yes")
    assert dropped.status_code == 303 and dropped.headers["location"] == "/console/repositories?notice=repository-deleted"


def test_a_form_sent_twice_is_one_change(shared_writer, shared_admin):
    page = shared_admin.get("/console/repositories")
    form = {"csrf": csrf_of(page), "key": page.text.split('name="key" value="', 1)[1].split('"', 1)[0], "name": "once"}
    first = shared_admin.http.post("/console/repositories", data=form)
    second = shared_admin.http.post("/console/repositories", data=form)  # a double click, a reload
    assert first.status_code == second.status_code == 303


def test_paging_through_a_long_list(writer, admin):
    with api(writer) as client:
        for number in range(53):
            assert client.post("/api/v1/repositories", json={"name": f"r{number:03}"}).status_code == 201
    first = admin.get("/console/repositories")
    assert "r049" in first.text and "r050" not in first.text
    next_link = first.text.split('rel="next"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
    second = admin.get(next_link.replace("&amp;", "&"))
    assert "r050" in second.text and "r052" in second.text and "r049" not in second.text
    assert 'rel="next"' not in second.text
    assert admin.get("/console/repositories?cursor=not-a-cursor").status_code == 400


def test_the_download_link_carries_no_key_and_is_the_content_route(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    data = os.urandom(3 * 1024 * 1024 + 5)
    artifact = upload(writer, "builds", "big.bin", data)
    page = admin.get(f"/console/repositories/builds/artifacts/{artifact['id']}")
    link = f"/console/repositories/builds/artifacts/{artifact['id']}/download"
    assert f'href="{link}"' in page.text
    whole = admin.get(link)
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["etag"] == f'"sha256:{artifact["sha256"]}"'
    assert 'filename="big.bin"' in whole.headers["content-disposition"]
    assert whole.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    part = admin.get(link, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert admin.http.head(link).headers["content-length"] == str(len(data))
    assert admin.get(link, headers={"If-None-Match": whole.headers["etag"]}).status_code == 304
    # Without the cookie: to the sign-in page, never the bytes.
    anonymous = httpx.get(writer.url + link, timeout=30)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/console/sign-in")
    missing = admin.get(f"/console/repositories/builds/artifacts/{uuid.uuid4()}/download")
    assert missing.status_code == 404 and "text/html" in missing.headers["content-type"] and messages(missing)
    bad = admin.get("/console/repositories/builds/artifacts/not-a-uuid/download")
    assert bad.status_code == 400 and "text/html" in bad.headers["content-type"]


def test_the_upload_form_works_without_its_script(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    page = admin.get("/console/repositories/builds")
    csrf = csrf_of(page)
    data = os.urandom(700_000)
    sent = admin.http.post("/console/repositories/builds/upload", data={"csrf": csrf, "name": "plain.bin"},
                           files={"file": ("ignored.bin", data, "application/x-test")})
    assert sent.status_code == 303, sent.text
    artifact_page = admin.get(sent.headers["location"])
    assert messages(artifact_page) == ["The file was uploaded."] and "plain.bin" in artifact_page.text
    with api(writer) as client:
        (item,) = client.get("/api/v1/repositories/builds/artifacts").json()["items"]
        assert item["name"] == "plain.bin" and item["mediaType"] == "application/x-test" and item["size"] == len(data)
        assert client.get(f"/api/v1/repositories/builds/artifacts/{item['id']}/content").content == data
    # The file's own name when no name is given.
    named = admin.http.post("/console/repositories/builds/upload", data={"csrf": csrf},
                            files={"file": ("own-name.txt", b"text", "text/plain")})
    assert named.status_code == 303
    # The token must come before the file: never a file streamed for a forged form.
    forged = admin.http.post("/console/repositories/builds/upload", files={"file": ("x.bin", b"x")})
    assert forged.status_code == 403
    late = admin.http.post("/console/repositories/builds/upload",
                           files=[("file", ("x.bin", b"x", "application/octet-stream")), ("csrf", (None, csrf))])
    # Refused either way: 400 when one read holds the field after the file, 403 when the file began first.
    assert late.status_code in (400, 403)
    bad_name = admin.http.post("/console/repositories/builds/upload", data={"csrf": csrf, "name": "a/b"},
                               files={"file": ("x.bin", b"x")})
    assert bad_name.status_code == 400 and "file name" in messages(bad_name)[0]
    not_multipart = admin.http.post("/console/repositories/builds/upload", data={"csrf": csrf})
    assert not_multipart.status_code == 415
    with api(writer) as client:
        assert len(client.get("/api/v1/repositories/builds/artifacts").json()["items"]) == 2


def test_tasks_dispatch_cancel_and_a_task_page(shared_writer, shared_admin):
    refused = shared_admin.submit("/console/tasks", "/console/tasks", kind="verify", param_bytes_per_second="12abc")
    assert refused.status_code == 400 and messages(refused) == ["bytes_per_second must be a whole number (digits only)"]
    assert 'value="12abc"' in refused.text  # the form keeps what was typed
    too_big = shared_admin.submit("/console/tasks", "/console/tasks", kind="cleanup", budget_max_items="0")
    assert too_big.status_code == 400 and "budget.max_items" in messages(too_big)[0]
    wrong_kind = shared_admin.submit("/console/tasks", "/console/tasks", kind="cleanup", param_bytes_per_second="5")
    assert wrong_kind.status_code == 400 and "unknown cleanup param" in messages(wrong_kind)[0]
    dispatched = shared_admin.submit("/console/tasks", "/console/tasks", kind="verify", param_bytes_per_second="1048576",
                              budget_max_items="10", budget_max_bytes="1000000", on_restart="fail", version="v1")
    assert dispatched.status_code == 303
    task_path = dispatched.headers["location"]
    task_id = task_path.rsplit("/", 1)[1]
    with api(shared_writer) as client:
        task = client.get(f"/api/v1/tasks/{task_id}").json()
    assert task["params"] == {"bytes_per_second": 1048576} and task["budget"]["limits"] == {"max_items": 10, "max_bytes": 1000000}
    assert task["on_restart"] == "fail" and task["definition_version"] == "v1" and task["idempotency_key"].startswith("console-")
    page = shared_admin.get(task_path)
    assert page.status_code == 200 and "task.queued" in page.text and 'src="/console/static/task-events.js"' in page.text
    assert 'data-after="1"' in page.text
    listed = shared_admin.get("/console/tasks", params={"kind": "verify", "status": "queued"})
    assert task_id in listed.text
    assert task_id not in shared_admin.get("/console/tasks", params={"status": "completed"}).text
    assert shared_admin.get("/console/tasks", params={"status": "bogus"}).status_code == 400
    # The cancel asks first: the page's link leads to a confirmation, and a form sent without
    # confirm=yes gets that page and cancels nothing.
    assert f'href="{task_path}/cancel"' in page.text
    unconfirmed = shared_admin.submit(task_path, f"{task_path}/cancel")
    assert unconfirmed.status_code == 200 and f"Cancel the verify task {task_id}?" in unconfirmed.text
    with api(shared_writer) as client:
        assert client.get(f"/api/v1/tasks/{task_id}").json()["status"] == "queued"
    cancelled = shared_admin.submit(f"{task_path}/cancel", f"{task_path}/cancel", confirm="yes")
    assert cancelled.status_code == 303 and "notice=task-cancelled" in cancelled.headers["location"]
    again = shared_admin.submit("/console/tasks", f"{task_path}/cancel", confirm="yes")
    assert again.status_code == 409 and "already cancelled" in messages(again)[0]
    late = shared_admin.get(f"{task_path}/cancel")  # no confirmation for what cannot happen
    assert late.status_code == 409 and "already cancelled" in late.text
    finished = shared_admin.get(task_path)
    assert "task.cancelled" in finished.text and "task-events.js" not in finished.text


def test_accounts_tokens_and_keys(writer, admin):
    created = admin.submit("/console/accounts", "/console/accounts", name="carol", password="carol's password")
    assert created.status_code == 303
    short = admin.submit("/console/accounts", "/console/accounts", name="dave", password="short")
    assert short.status_code == 400 and 'value="short"' not in short.text  # a password is never sent back
    disabled = admin.submit("/console/accounts", "/console/accounts/carol/disable", confirm="yes")
    assert disabled.status_code == 303
    with Console(writer.url) as carol:
        assert carol.sign_in("carol", "carol's password").status_code == 401
    assert admin.submit("/console/accounts", "/console/accounts/carol/enable").status_code == 303
    with Console(writer.url) as carol:
        carol.signed_in("carol", "carol's password")
        made = carol.submit("/console/tokens", "/console/tokens", label="ci", access="read-write", expires_days="30")
        assert made.status_code == 201
        secret = made.text.split('id="new-secret" readonly value="', 1)[1].split('"', 1)[0]
        assert secret.startswith("pat_")
        assert secret not in carol.get("/console/tokens").text  # shown once
        with api(writer, secret) as client:
            assert client.get("/api/v1/tokens").status_code == 200
            token_id = client.get("/api/v1/tokens").json()["items"][0]["id"]
    # An administrator sees every account's tokens, and revokes anyone's.
    every = admin.get("/console/accounts")
    assert f'data-token="{token_id}"' in every.text and "carol" in every.text and secret not in every.text
    revoked = admin.submit("/console/accounts", f"/console/tokens/{token_id}/revoke", back="accounts", confirm="yes")
    assert revoked.status_code == 303 and revoked.headers["location"] == "/console/accounts?notice=token-revoked"
    again = admin.submit("/console/tokens", "/console/tokens/revoke", id=token_id, confirm="yes")
    assert again.status_code == 404 and messages(again) == [f"no token {token_id}"]
    with api(writer, secret) as client:
        assert client.get("/api/v1/tokens").status_code == 401
    key = admin.submit("/console/keys", "/console/keys", label="deploy", scopes="read:* write:builds", expires_days="7")
    assert key.status_code == 201
    key_secret = key.text.split('id="new-secret" readonly value="', 1)[1].split('"', 1)[0]
    with api(writer, key_secret) as client:
        assert client.get("/api/v1/repositories").status_code == 200
    listing = admin.get("/console/keys").text
    key_id = listing.split('data-key="', 1)[1].split('"', 1)[0]
    assert admin.submit("/console/keys", f"/console/keys/{key_id}/revoke", confirm="yes").status_code == 303
    with api(writer, key_secret) as client:
        assert client.get("/api/v1/repositories").status_code == 401
    bad = admin.submit("/console/keys", "/console/keys", scopes="root:everything")
    assert bad.status_code == 400 and "'scopes' must be" in messages(bad)[0]


# -- the overview ------------------------------------------------------------------------------------


def test_the_overview_shows_every_process_its_trust_and_the_worker(cluster):
    shared = cluster.shared_env(slots=3)
    writer = cluster.writer(shared).wait_ready()
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]
    make_account(writer.url, "root", admin=True)
    with Console(writer.url) as console:
        console.signed_in("root")
        page = console.get("/console/").text
        for process in (writer, *gateways):
            assert f"<code>http://127.0.0.1:{process.port}</code>" in page
        assert page.count(">ready<") == 3
        assert "No worker is active" in page
        live = console.get("/console/overview.json").json()
        assert [p["key"] for p in live["processes"]] == ["slot-0", "slot-1", "slot-2"]
        for process in live["processes"]:
            assert process["status"] == "ready" and 0 < process["trustLeft"] <= 8 and process["reservationLeft"] > 0
            assert process["bytesPerSecond"] == 64 * 1024 * 1024 // 3
        first = start_worker(cluster, real=True).wait_active()
        second = start_worker(cluster, "standby", real=True)
        wait_for(lambda: "standby" in console.get("/console/").text, "a standby worker on the overview")
        page = console.get("/console/").text
        assert "A worker is <strong>active</strong>" in page
        assert page.count("<td>active</td>") == 1 and page.count("<td>standby</td>") == 1
        assert f"pid {first.proc.pid}" in page and f"pid {second.proc.pid}" in page
        # A gateway that stops answering is unreachable, its lease still listed until it expires.
        gateways[1].kill()
        row = next(p for p in console.get("/console/overview.json").json()["processes"] if p["key"] == "slot-2")
        assert row["reachable"] is False and row["status"].startswith("unreachable")
        assert row["trustLeft"] is None and row["reservationLeft"] is not None


def test_a_standalone_writer_has_an_overview_too(shared_writer, shared_admin):
    page = shared_admin.get("/console/").text
    assert "standalone" in page and ">ready<" in page


def test_a_database_outage_is_a_page_to_retry_never_a_500(cluster, db_proxy):
    writer = cluster.writer(ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url)).wait_ready()
    make_account(writer.url, "root", admin=True)
    with Console(writer.url) as console:
        console.signed_in("root")
        db_proxy.refuse()
        for path in ("/console/", "/console/repositories", "/console/tokens"):
            answer = console.get(path)
            assert answer.status_code == 503, (path, answer.status_code, answer.text[:500])
            assert "text/html" in answer.headers["content-type"] and answer.headers["retry-after"]
            assert messages(answer)
        db_proxy.resume()
        wait_for(lambda: console.get("/console/repositories").status_code == 200, "the console back", timeout=30)
    assert "Traceback" not in writer.stderr, writer.stderr


# -- TLS ------------------------------------------------------------------------------------------------


def test_cookies_are_secure_when_the_writer_serves_tls(cluster, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    writer = cluster.start("tls-writer", ARKVORY_ROLE="api", ARKVORY_TLS_CERT_FILE=str(cert), ARKVORY_TLS_KEY_FILE=str(key))
    url = f"https://127.0.0.1:{writer.port}"
    context = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health/status", verify=context, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert writer.proc.poll() is None and time.monotonic() < deadline, writer.stderr
        time.sleep(0.1)
    make_account(url, "root", admin=True, verify=context)
    with Console(url, verify=context) as console:
        form = console.get("/console/sign-in")
        assert "Secure" in form.headers["set-cookie"]
        answer = console.http.post("/console/sign-in", data={"csrf": csrf_of(form), "name": "root", "password": PASSWORD})
        assert answer.status_code == 303
        cookies = answer.headers.get_list("set-cookie")
        assert len(cookies) == 2 and all("; Secure" in c and "HttpOnly" in c and "SameSite=Strict" in c for c in cookies)
        assert console.get("/console/").status_code == 200  # its own readiness, read in-process


# -- a gateway has none ----------------------------------------------------------------------------------


def test_a_gateway_has_no_console(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    for path in ("/console/", "/console", "/console/sign-in", "/console/static/console.css", "/console/repositories"):
        answer = httpx.get(gateway.url + path, timeout=10)
        assert answer.status_code == 404 and answer.json()["code"] == "not_found", path
        assert "text/html" not in answer.headers["content-type"]
    # A browser asks for HTML by name: a page it can read says the console is on the writer
    # (404 all the same: nothing is served here), and sends it nowhere it cannot know.
    browser = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    for path in ("/console/", "/console", "/console/sign-in", "/console/repositories/x?y=<z>", "/"):
        page = httpx.get(gateway.url + path, headers=browser, timeout=10)
        assert page.status_code == 404 and page.headers["content-type"] == "text/html; charset=utf-8", path
        assert "<h1>The console is on the writer</h1>" in page.text and "location" not in page.headers
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        found = scripts_of(page.text)
        assert found.sources == [] and found.inline == [] and found.urls == [] and "<z>" not in page.text
        assert page.headers["x-request-id"]
        head = httpx.head(gateway.url + path, headers=browser, timeout=10)
        assert head.status_code == 404 and head.content == b""
    assert httpx.get(gateway.url + "/", timeout=10).json()["code"] == "not_found"  # a program: JSON
    posted = httpx.post(gateway.url + "/console/sign-in", data={"name": "root", "password": PASSWORD}, timeout=10)
    assert posted.status_code == 405 and posted.json()["code"] == "read_only"


# -- hostile input ---------------------------------------------------------------------------------------

_FIELDS = ["csrf", "key", "name", "public", "force", "account", "level", "group", "version", "path", "kind",
           "param_grace_seconds", "param_bytes_per_second", "budget_max_items", "budget_max_bytes", "on_restart",
           "max_attempts", "password", "admin", "label", "access", "expires_days", "scopes", "id", "next", "confirm",
           "artifact", "history", "lifetime", "current_password", "new_password", "new_password_again", "password_again"]
_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=80) | st.sampled_from(
    ["", "0", "-1", "99999999999999999999999", "1e9", "true", "yes", "../..", "/", "%00", "\x00", "<script>", "verify",
     "cleanup", "read", "admin", "read:*", "\u202e", "a" * 5000, "00000000-0000-0000-0000-000000000000"])
_TARGETS = [
    "/console/repositories", "/console/repositories/{x}/visibility", "/console/repositories/{x}/delete",
    "/console/repositories/{x}/members", "/console/repositories/{x}/members/remove",
    "/console/repositories/{x}/packages/delete", "/console/repositories/{x}/assets/delete",
    "/console/repositories/{x}/artifacts/{x}/delete", "/console/tasks", "/console/tasks/{x}/cancel",
    "/console/repositories/{x}/packages", "/console/repositories/{x}/assets", "/console/repositories/{x}/asset/restore",
    "/console/accounts/{x}/disable",
    "/console/accounts/{x}/enable", "/console/tokens", "/console/tokens/revoke", "/console/tokens/{x}/revoke",
    "/console/keys", "/console/keys/{x}/revoke", "/console/keys/{x}/adopt", "/console/sign-in",
    "/console/accounts/{x}/password", "/console/accounts/{x}/delete", "/console/account/password",
]
_PAGES = ["/console/repositories/{x}", "/console/repositories/{x}/packages", "/console/repositories/{x}/assets",
          "/console/repositories/{x}/members", "/console/repositories/{x}/permissions",
          "/console/repositories/{x}/artifacts/{x}", "/console/accounts/{x}/password", "/console/accounts/{x}/delete",
          "/console/account/password",
          "/console/repositories/{x}/artifacts/{x}/download", "/console/tasks/{x}", "/console/repositories",
          "/console/tasks", "/console/sign-in", "/console/accounts", "/console/tokens", "/console/keys",
          "/console/repositories/{x}/package", "/console/repositories/{x}/asset",
          "/console/repositories/{x}/packages/new", "/console/repositories/{x}/assets/new",
          "/console/repositories/{x}/delete", "/console/repositories/{x}/packages/delete",
          "/console/repositories/{x}/assets/delete", "/console/repositories/{x}/members/remove",
          "/console/repositories/{x}/retention/disable", "/console/repositories/{x}/retention/delete",
          "/console/repositories/{x}/artifacts/{x}/delete", "/console/accounts/{x}/disable", "/console/tokens/{x}/revoke",
          "/console/tokens/revoke", "/console/keys/{x}/revoke", "/"]
_SEGMENT = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="/?#"), min_size=1, max_size=40) | st.sampled_from(
    ["builds", "..", ".", "%2F", "00000000-0000-0000-0000-000000000000", "a" * 300, "<x>"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    target=st.sampled_from(_TARGETS),
    segment=_SEGMENT,
    fields=st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=10), _TEXT, max_size=8),
    with_token=st.booleans(),
)
def test_hostile_form_input_is_never_a_500(fuzz_console, target, segment, fields, with_token):
    console, csrf, presession_csrf = fuzz_console
    path = target.replace("{x}", _quote(segment))
    data = dict(fields)
    if with_token:
        data["csrf"] = presession_csrf if target == "/console/sign-in" else csrf
    answer = console.http.post(path, data=data)
    assert answer.status_code < 500 or answer.status_code == 503, (path, data, answer.status_code, answer.text[:2000])
    if "text/html" in answer.headers.get("content-type", ""):
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "<script>" not in answer.text.split("</main>")[0].split("<main")[-1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    page=st.sampled_from(_PAGES),
    segment=_SEGMENT,
    query=st.dictionaries(st.sampled_from(["cursor", "kind", "status", "next", "notice", "x", "prefix", "sha256", "order",
                                           "group", "name", "version", "path", "artifact", "account", "id", "force"]),
                          _TEXT, max_size=4),
    body=st.binary(max_size=300),
)
def test_hostile_pages_and_raw_bodies_are_never_a_500(fuzz_console, page, segment, query, body):
    console, csrf, _ = fuzz_console
    path = page.replace("{x}", _quote(segment))
    shown = console.get(path, params=query)
    assert shown.status_code < 500 or shown.status_code == 503, (path, query, shown.text[:2000])
    raw = console.http.post("/console/repositories", content=b"csrf=" + csrf.encode() + b"&" + body,
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert raw.status_code < 500, (body, raw.text[:2000])
    multipart = console.http.post("/console/repositories/builds/upload", content=body,
                                  headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert multipart.status_code < 500, (body, multipart.text[:2000])


def _quote(segment: str) -> str:
    import urllib.parse

    return urllib.parse.quote(segment, safe="")


@pytest.fixture
def fuzz_console(writer):
    make_account(writer.url, "fuzz-admin-7f3", admin=True)
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    with Console(writer.url) as console:
        presession_csrf = csrf_of(console.get("/console/sign-in"))
        console.signed_in("fuzz-admin-7f3")
        yield console, csrf_of(console.get("/console/")), presession_csrf
