"""The console's publishing, downloads and safeguards over plain HTTP against real processes
(issue 25 §5-7): a package version and an asset published, re-pointed and pointed back from the
console; download URLs and `curl` / `arkvory get` lines through the gateways that run as written
and never hold a key; a confirmation page before every delete, revoke and disable; what an
account that is not an administrator sees; a task's progress bar and its events as sentences;
`/` on the writer. tests/test_console_browser.py walks the same pages in a real browser."""

from __future__ import annotations

import html
import html.parser
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys
import urllib.parse

import httpx
import markupsafe
import pytest

from arkvory.writer.console.task_progress import pairs, sentence

from .console_client import PASSWORD, Console, csrf_of, make_account, messages, scripts_of
from .harness import ADMIN_TOKEN, db_fetch, free_port
from .test_console import admin, api, upload, writer  # noqa: F401  (admin, writer: fixtures)
from .worker_harness import start_worker, wait_for

pytestmark = pytest.mark.timeout(180)

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def text_of(page: httpx.Response, element_id: str) -> str:
    """The text of the element with this id (the download lines are plain text in <code>)."""
    found = re.search(rf'id="{re.escape(element_id)}"[^>]*>(.*?)</', page.text, re.S)
    assert found, (element_id, page.text)
    return html.unescape(found.group(1))


class _FormFields(html.parser.HTMLParser):
    """The action and the inputs (hidden, and ticked boxes) of the form with a given id."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.boxes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form" and attributes.get("id") == self.form_id:
            self.inside, self.action = True, attributes.get("action")
        elif tag == "input" and self.inside and attributes.get("name"):
            if attributes.get("type") == "hidden":
                self.fields[attributes["name"]] = attributes.get("value") or ""
            elif attributes.get("type") == "checkbox":
                self.boxes.append(attributes["name"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


def form_of(page: httpx.Response, form_id: str) -> _FormFields:
    parser = _FormFields(form_id)
    parser.feed(page.text)
    assert parser.action is not None, (form_id, page.text)
    return parser


# -- publishing -------------------------------------------------------------------------------------


def test_a_package_version_is_published_from_an_artifact(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    first, second = upload(writer, "builds", "app.tar", b"first build"), upload(writer, "builds", "app2.tar", b"second")
    artifact_page = admin.get(f"/console/repositories/builds/artifacts/{first['id']}")
    new_form = f"/console/repositories/builds/packages/new?artifact={first['id']}"
    assert f'href="{new_form}"' in artifact_page.text
    form = admin.get(new_form)
    assert form.status_code == 200 and "<h1>Publish a package version</h1>" in form.text
    assert f'value="{first["id"]}"' in form.text and ">app.tar</a>, 11 B" in form.text

    made = admin.submit(new_form, "/console/repositories/builds/packages",
                        group="org.example", name="app", version="1.0", artifact=first["id"])
    assert made.status_code == 303
    assert made.headers["location"] == (
        "/console/repositories/builds/package?group=org.example&name=app&version=1.0&notice=package-published"
    )
    page = admin.get(made.headers["location"])
    assert page.status_code == 200 and messages(page) == ["The package version is published."]
    assert '<dd id="package-group">org.example</dd>' in page.text and '<dd id="package-version">1.0</dd>' in page.text
    assert f'href="/console/repositories/builds/artifacts/{first["id"]}">app.tar</a>' in page.text
    with api(writer) as client:
        published = client.get("/api/v1/repositories/builds/package",
                               params={"group": "org.example", "name": "app", "version": "1.0"}).json()
    assert published["artifactId"] == first["id"]

    # Again with the same artifact: nothing changes, and the page says so.
    again = admin.submit(new_form, "/console/repositories/builds/packages",
                         group="org.example", name="app", version="1.0", artifact=first["id"])
    assert again.status_code == 303 and "notice=package-exists" in again.headers["location"]
    # A version is immutable: another artifact is the API's refusal, shown with what was typed.
    other = admin.submit(new_form, "/console/repositories/builds/packages",
                         group="org.example", name="app", version="1.0", artifact=second["id"])
    assert other.status_code == 409
    assert messages(other) == ["org.example/app/1.0 is already published with another artifact"]
    assert 'value="org.example"' in other.text and f'value="{second["id"]}"' in other.text
    unknown = admin.submit(new_form, "/console/repositories/builds/packages",
                           group="org.example", name="app", version="2.0", artifact="00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 404 and messages(unknown)
    bad = admin.submit(new_form, "/console/repositories/builds/packages", group="g", name="n", version="v", artifact="nope")
    assert bad.status_code == 400 and messages(bad)

    listing = admin.get("/console/repositories/builds/packages")
    assert 'href="/console/repositories/builds/package?group=org.example&amp;name=app&amp;version=1.0">app</a>' in listing.text
    assert 'href="/console/repositories/builds/packages/new"' in listing.text
    # The artifact's page lists where it is used, each a link to its page.
    used = admin.get(f"/console/repositories/builds/artifacts/{first['id']}")
    assert 'href="/console/repositories/builds/package?group=org.example&amp;name=app&amp;version=1.0"' in used.text


def test_an_asset_is_pointed_repointed_and_pointed_back_with_its_history(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    one, two, three = (upload(writer, "builds", f"app-{n}.tar", n.encode() * 10) for n in ("1", "2", "3"))
    new_form = f"/console/repositories/builds/assets/new?artifact={one['id']}"
    assert admin.get(new_form).status_code == 200
    pointed = admin.submit(new_form, "/console/repositories/builds/assets", path="latest/app.tar", artifact=one["id"])
    assert pointed.status_code == 303
    assert pointed.headers["location"] == "/console/repositories/builds/asset?path=latest%2Fapp.tar&notice=asset-pointed"
    page = admin.get(pointed.headers["location"])
    assert messages(page) == ["The asset points at the artifact now."]
    assert '<dd id="asset-path">latest/app.tar</dd>' in page.text and ">app-1.tar</a>" in page.text
    asset_page = "/console/repositories/builds/asset?path=latest%2Fapp.tar"

    # Re-pointed from its own page (the path rides along hidden).
    repoint = form_of(page, "repoint-form")
    assert repoint.action == "/console/repositories/builds/assets" and repoint.fields["path"] == "latest/app.tar"
    moved = admin.http.post(repoint.action, data={**repoint.fields, "artifact": two["id"]})
    assert moved.status_code == 303
    for artifact in (three, one):  # three, then back to one: three is no longer used
        assert admin.submit(asset_page, "/console/repositories/builds/assets", path="latest/app.tar",
                            artifact=artifact["id"]).status_code == 303
    with api(writer) as client:
        history = client.get("/api/v1/repositories/builds/asset", params={"path": "latest/app.tar"}).json()["history"]
        assert [entry["artifactId"] for entry in history] == [one["id"], three["id"], two["id"], one["id"]]
        assert client.delete(f"/api/v1/repositories/builds/artifacts/{three['id']}").status_code == 204
    # A deleted artifact takes its history entries along (writer/catalog/retention.py's
    # delete_unused_artifacts): three's entry is gone from the page.
    kept = [entry for entry in history if entry["artifactId"] != three["id"]]
    page = admin.get(asset_page)
    rows = re.findall(r'<tr data-history="(\d+)">(.*?)</tr>', page.text, re.S)
    assert [int(entry_id) for entry_id, _ in rows] == [entry["id"] for entry in kept]
    assert three["id"] not in page.text
    assert "<strong>current</strong>" in rows[0][1] and "Point back here" not in rows[0][1]
    assert ">app-2.tar</a>" in rows[1][1] and "Point back here" in rows[1][1]

    # Pointed back at an earlier entry's artifact: a new pointing, the history keeps all.
    back = admin.submit(asset_page, "/console/repositories/builds/asset/restore", path="latest/app.tar",
                        history=rows[1][0])
    assert back.status_code == 303 and "notice=asset-restored" in back.headers["location"]
    with api(writer) as client:
        asset = client.get("/api/v1/repositories/builds/asset", params={"path": "latest/app.tar"}).json()
    assert asset["artifactId"] == two["id"] and len(asset["history"]) == 4
    gone = admin.submit(asset_page, "/console/repositories/builds/asset/restore", path="latest/app.tar",
                        history=str(history[1]["id"]))
    assert gone.status_code == 404 and messages(gone) == [f"no history entry {history[1]['id']} for asset 'latest/app.tar'"]
    nonsense = admin.submit(asset_page, "/console/repositories/builds/asset/restore", path="latest/app.tar", history="x1")
    assert nonsense.status_code == 400 and messages(nonsense) == ["the history entry must be a whole number (digits only)"]
    listing = admin.get("/console/repositories/builds/assets")
    assert 'href="/console/repositories/builds/asset?path=latest/app.tar">latest/app.tar</a>' in listing.text


def test_only_a_writer_is_offered_the_publishing_forms(writer):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "team"}).status_code == 201
        assert client.post("/api/v1/repositories", json={"name": "hidden"}).status_code == 201
    artifact = upload(writer, "team", "a.bin", b"a")
    make_account(writer.url, "reader")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/team/permissions/reader", json={"level": "read"}).status_code == 200
        client.put("/api/v1/repositories/team/packages", json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]})
        client.put("/api/v1/repositories/team/assets", params={"path": "p"}, json={"artifactId": artifact["id"]})
    with Console(writer.url) as reader:
        reader.signed_in("reader")
        for path in ("/console/repositories/team/packages/new", "/console/repositories/team/assets/new"):
            refused = reader.get(path)
            assert refused.status_code == 403 and messages(refused) == [
                "publishing to 'team' needs the repository's write permission (forbidden)"]
        for path in ("/console/repositories/hidden/packages/new", "/console/repositories/hidden/assets/new"):
            assert reader.get(path).status_code == 404  # as the API: a repository it may not read is not there
        for path in (f"/console/repositories/team/artifacts/{artifact['id']}", "/console/repositories/team/package?group=g&name=n&version=1",
                     "/console/repositories/team/asset?path=p", "/console/repositories/team/packages", "/console/repositories/team/assets"):
            page = reader.get(path)
            assert page.status_code == 200, path
            assert "/new" not in page.text and "Delete" not in page.text and "repoint-form" not in page.text, path
        csrf = csrf_of(reader.get("/console/repositories"))
        posted = reader.http.post("/console/repositories/team/packages",
                                  data={"csrf": csrf, "group": "g", "name": "n", "version": "2", "artifact": artifact["id"]})
        assert posted.status_code == 403


# -- downloads through the gateways -------------------------------------------------------------------


def _run_line(line: str, cwd: pathlib.Path, token: str | None) -> subprocess.CompletedProcess:
    """A line as a user would paste it into a shell: the venv's `arkvory` first on PATH, the
    token (if any) in ARKVORY_TOKEN, no config file of anyone's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARKVORY_")}
    env.update(PATH=f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '')}", HOME=str(cwd),
               XDG_CONFIG_HOME=str(cwd / ".config"))
    if token is not None:
        env["ARKVORY_TOKEN"] = token
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_download_lines_go_through_the_gateways_run_as_written_and_hold_no_key(cluster, tmp_path):
    gateway_port = free_port()
    shared = cluster.shared_env(slots=2)
    public = f"http://127.0.0.1:{gateway_port}"
    writer = cluster.writer(shared, ARKVORY_PUBLIC_URL=public + "/").wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_PORT=str(gateway_port)).wait_ready()
    make_account(writer.url, "root", admin=True)
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        assert client.post("/api/v1/repositories", json={"name": "open", "public": True}).status_code == 201
    data = os.urandom(300_000)
    private = upload(writer, "builds", "my app.tar", data)
    public_artifact = upload(writer, "open", "readme.txt", b"hello, world")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/builds/packages",
                          json={"group": "org.example", "name": "app", "version": "1.0", "artifactId": private["id"]}).status_code == 201
        assert client.put("/api/v1/repositories/builds/assets", params={"path": "latest/app's.tar"},
                          json={"artifactId": private["id"]}).status_code == 200
    with Console(writer.url) as console:
        console.signed_in("root")
        made = console.submit("/console/tokens", "/console/tokens", access="read", label="lines")
        token = made.text.split('id="new-secret" readonly value="', 1)[1].split('"', 1)[0]
        pages = {
            "artifact": console.get(f"/console/repositories/builds/artifacts/{private['id']}"),
            "package": console.get("/console/repositories/builds/package?group=org.example&name=app&version=1.0"),
            "asset": console.get("/console/repositories/builds/asset?path=" + urllib.parse.quote("latest/app's.tar")),
            "public": console.get(f"/console/repositories/open/artifacts/{public_artifact['id']}"),
        }
        secrets = (token, console.session, ADMIN_TOKEN)
    content = "/api/v1/repositories/builds"
    # (URL, the file curl saves, what `arkvory get` is given), each quoted for the shell
    expected = {
        "artifact": (f"{public}{content}/artifacts/{private['id']}/content", "'my app.tar'", private["id"]),
        "package": (f"{public}{content}/packages/content?group=org.example&name=app&version=1.0", "app",
                    "--package=org.example/app@1.0"),
        "asset": (f"{public}{content}/asset/content?path=latest%2Fapp%27s.tar", "'app'\"'\"'s.tar'",
                  "'--asset=latest/app'\"'\"'s.tar'"),
    }
    for name, (url, saved_as, target) in expected.items():
        page = pages[name]
        assert page.status_code == 200, (name, page.text)
        assert text_of(page, "line-url") == url
        assert text_of(page, "line-curl") == (
            f"curl -fL -o {saved_as} -H \"Authorization: Bearer $ARKVORY_TOKEN\" {shlex.quote(url)}"
        )
        assert text_of(page, "line-arkvory") == f"arkvory get --url {public} builds {target}"
        assert 'id="public-url-unset"' not in page.text  # ARKVORY_PUBLIC_URL is set
        for secret in secrets:
            assert secret not in page.text, name
        # Each line, run as written, fetches the bytes from the gateway.
        for line in ("line-curl", "line-arkvory"):
            workdir = tmp_path / f"{name}-{line}"
            workdir.mkdir()
            ran = _run_line(text_of(page, line), workdir, token)
            assert ran.returncode == 0, (name, line, ran.stdout, ran.stderr)
            saved = [p for p in workdir.iterdir() if p.is_file()]
            assert [p.read_bytes() for p in saved] == [data], (name, line, saved)
        # Without a token the private repository refuses (401, curl exits 22): no key is in the line.
        refused = _run_line(text_of(pages[name], "line-curl"), tmp_path, None)
        assert refused.returncode == 22, (name, refused.stderr)
    public_page = pages["public"]
    public_curl = text_of(public_page, "line-curl")
    assert "Authorization" not in public_curl and "ARKVORY_TOKEN" not in public_page.text.split('id="line-curl"')[1][:400]
    workdir = tmp_path / "public"
    workdir.mkdir()
    assert _run_line(public_curl, workdir, None).returncode == 0
    assert (workdir / "readme.txt").read_bytes() == b"hello, world"
    # The gateway, not the writer, served them.
    served = httpx.get(gateway.url + "/health/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).text
    sent = [float(value) for value in re.findall(r'^arkvory_download_payload_bytes_total\S* (\S+)$', served, re.M)]
    assert sum(sent) >= 6 * len(data), served[:3000]


def test_without_a_public_url_the_lines_use_the_pages_address_and_say_so(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    artifact = upload(writer, "builds", "a.bin", b"a")
    make_account(writer.url, "alice")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/builds/permissions/alice", json={"level": "read"}).status_code == 200
    path = f"/console/repositories/builds/artifacts/{artifact['id']}"
    page = admin.get(path)
    assert text_of(page, "line-url") == f"{writer.url}/api/v1/repositories/builds/artifacts/{artifact['id']}/content"
    assert 'id="public-url-unset"' in page.text and "ARKVORY_PUBLIC_URL is not set" in page.text
    with Console(writer.url) as alice:
        alice.signed_in("alice")
        shown = alice.get(path)
        assert shown.status_code == 200 and "ARKVORY_PUBLIC_URL" not in shown.text  # an operator's matter


# -- confirmations ----------------------------------------------------------------------------------------


def _confirm_on_its_page(console: Console, page_path: str, *, title: str, action: str, tick: bool = False) -> httpx.Response:
    """Open a danger's confirmation page, check what it says, and send its form as a browser
    would (its hidden fields, the box ticked if asked)."""
    page = console.get(page_path)
    assert page.status_code == 200, (page_path, page.text)
    assert f'<h1 id="confirm-heading">{markupsafe.escape(title)}</h1>' in page.text, (page_path, page.text)
    assert scripts_of(page.text).sources == [] and 'id="confirm-cancel"' in page.text
    form = form_of(page, "confirm-form")
    assert form.action == action and form.fields["confirm"] == "yes" and form.fields["csrf"] and form.fields["key"]
    data = dict(form.fields)
    if tick:
        data[form.boxes[0]] = "true"
    return console.http.post(action, data=data)


def test_every_delete_revoke_and_disable_asks_first_and_does_nothing_unconfirmed(writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "doomed"}).status_code == 201
    used, spare = upload(writer, "doomed", "used.bin", b"used"), upload(writer, "doomed", "spare.bin", b"spare")
    make_account(writer.url, "bob")
    make_account(writer.url, "carol")
    with api(writer) as client:
        assert client.put("/api/v1/repositories/doomed/packages",
                          json={"group": "g", "name": "n", "version": "1", "artifactId": used["id"]}).status_code == 201
        assert client.put("/api/v1/repositories/doomed/assets", params={"path": "a/b"}, json={"artifactId": used["id"]}).status_code == 200
        assert client.put("/api/v1/repositories/doomed/members/bob", json={"level": "write"}).status_code == 200
        assert client.put("/api/v1/repositories/doomed/retention",
                          json={"keepNewest": 5, "keepYoungerThanSeconds": None, "enabled": True}).status_code == 200
        key = client.post("/api/v1/keys", json={"scopes": ["read:*"], "label": "deploy key"}).json()
    made = admin.submit("/console/tokens", "/console/tokens", access="read", label="my ci token")
    assert made.status_code == 201
    with api(writer) as client:
        token_id = next(row["id"] for row in db_fetch(writer.env["ARKVORY_DATABASE_URL"],
                                                      "SELECT id::text FROM arkvory_credentials WHERE label = 'my ci token'"))
        still = {
            "artifact": lambda: client.get(f"/api/v1/repositories/doomed/artifacts/{spare['id']}").status_code == 200,
            "package": lambda: client.get("/api/v1/repositories/doomed/package",
                                          params={"group": "g", "name": "n", "version": "1"}).status_code == 200,
            "asset": lambda: client.get("/api/v1/repositories/doomed/asset", params={"path": "a/b"}).status_code == 200,
            "member": lambda: [p["account"] for p in client.get("/api/v1/repositories/doomed/members").json()["items"]] == ["bob"],
            "retention rule's enabling": lambda: client.get("/api/v1/repositories/doomed/retention").json()["enabled"],
            "retention rule": lambda: client.get("/api/v1/repositories/doomed/retention").status_code == 200,
            "account": lambda: not next(a for a in client.get("/api/v1/accounts").json()["items"] if a["name"] == "carol")["disabled"],
            "token": lambda: db_fetch(writer.env["ARKVORY_DATABASE_URL"], "SELECT count(*) AS n FROM arkvory_credentials"
                                      " WHERE id = $1::uuid", token_id)[0]["n"] == 1,
            "key": lambda: any(k["id"] == key["id"] for k in client.get("/api/v1/keys").json()["items"]),
            "repository": lambda: client.get("/api/v1/repositories/doomed").status_code == 200,
        }
        base = "/console/repositories/doomed"
        dangers = [
            # name, the link a page shows, where the form posts, the fields a form sent without confirming, title
            ("artifact", f"{base}/artifacts/{spare['id']}/delete", f"{base}/artifacts/{spare['id']}/delete", {},
             "Delete artifact spare.bin?"),
            ("package", f"{base}/packages/delete?group=g&name=n&version=1", f"{base}/packages/delete",
             {"group": "g", "name": "n", "version": "1"}, "Delete package version g/n 1?"),
            ("asset", f"{base}/assets/delete?path=a%2Fb", f"{base}/assets/delete", {"path": "a/b"}, "Delete asset a/b?"),
            ("member", f"{base}/members/remove?account=bob", f"{base}/members/remove", {"account": "bob"},
             "Remove bob from the members of doomed?"),
            ("retention rule's enabling", f"{base}/retention/disable", f"{base}/retention/disable", {},
             "Disable the retention rule of doomed?"),
            ("retention rule", f"{base}/retention/delete", f"{base}/retention/delete", {},
             "Delete the retention rule of doomed?"),
            ("account", "/console/accounts/carol/disable", "/console/accounts/carol/disable", {}, "Disable account carol?"),
            ("token", f"/console/tokens/{token_id}/revoke", f"/console/tokens/{token_id}/revoke", {},
             "Revoke root's token my ci token?"),
            ("key", f"/console/keys/{key['id']}/revoke", f"/console/keys/{key['id']}/revoke", {}, "Revoke service key deploy key?"),
            ("repository", f"{base}/delete", f"{base}/delete", {"force": "true"}, "Delete repository doomed?"),
        ]
        csrf = csrf_of(admin.get("/console/repositories"))
        for name, link, action, fields, title in dangers:
            assert still[name](), name
            # A form sent without confirming (an old page, a double click, a script): the same
            # confirmation page, and nothing happened.
            unconfirmed = admin.http.post(action, data={"csrf": csrf, **fields})
            assert unconfirmed.status_code == 200, (name, unconfirmed.text)
            assert f'<h1 id="confirm-heading">{markupsafe.escape(title)}</h1>' in unconfirmed.text, name
            assert still[name](), f"{name} changed without a confirmation"
            # Confirmed on its page (GET, then the page's own form).
            done = _confirm_on_its_page(admin, link, title=title, action=action, tick=name == "repository")
            assert done.status_code == 303, (name, done.status_code, done.text)
            assert not still[name](), f"{name} still there after it was confirmed"
    # The pages that hold the danger buttons link to these pages; none posts at once.
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "other"}).status_code == 201
    other = upload(writer, "other", "o.bin", b"o")
    page = admin.get(f"/console/repositories/other/artifacts/{other['id']}")
    assert f'href="/console/repositories/other/artifacts/{other["id"]}/delete"' in page.text
    assert 'action="/console/repositories/other/artifacts/' not in page.text
    repository_page = admin.get("/console/repositories/other")
    assert 'href="/console/repositories/other/delete"' in repository_page.text
    assert 'action="/console/repositories/other/delete"' not in repository_page.text
    # A confirmation page for what is not there, or not readable, is the API's 404.
    assert admin.get(f"/console/repositories/other/artifacts/{spare['id']}/delete").status_code == 404
    assert admin.get("/console/repositories/nope/delete").status_code == 404
    assert admin.get("/console/repositories/other/assets/delete?path=none").status_code == 404


# -- what an account that is not an administrator sees ---------------------------------------------------


def test_an_account_lands_on_repositories_and_sees_no_operator_internals(cluster):
    shared = cluster.shared_env(slots=3)
    writer = cluster.writer(shared, ARKVORY_PUBLIC_URL="https://artifacts.example.test").wait_ready()
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]
    processes = [writer, *gateways]
    make_account(writer.url, "root", admin=True)
    make_account(writer.url, "alice")
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "team"}).status_code == 201
        assert client.put("/api/v1/repositories/team/permissions/alice", json={"level": "write"}).status_code == 200
    artifact = upload(writer, "team", "a.bin", b"alice's bytes")
    with api(writer) as client:
        client.put("/api/v1/repositories/team/packages", json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]})
        client.put("/api/v1/repositories/team/assets", params={"path": "p"}, json={"artifactId": artifact["id"]})
        # One that alice administers: its members and retention tabs are hers too.
        assert client.post("/api/v1/repositories", json={"name": "own"}).status_code == 201
        assert client.put("/api/v1/repositories/own/members/alice", json={"level": "admin"}).status_code == 200
        assert client.put("/api/v1/repositories/own/retention",
                          json={"keepNewest": 3, "keepYoungerThanSeconds": None, "enabled": True}).status_code == 200
    leases = db_fetch(writer.env["ARKVORY_DATABASE_URL"], "SELECT pid, host, url FROM arkvory_gateway_leases")
    assert len(leases) == 3
    with Console(writer.url) as root:
        root.signed_in("root")
        overview = root.get("/console/").text
        assert all(f"<code>{lease['url']}</code>" in overview for lease in leases)  # the operator's page has them
    with Console(writer.url) as alice:
        form = alice.get("/console/sign-in")
        signed = alice.http.post("/console/sign-in", data={"csrf": csrf_of(form), "name": "alice", "password": PASSWORD})
        assert signed.status_code == 303 and signed.headers["location"] == "/console/"
        landing = alice.get("/console/")
        assert landing.status_code == 303 and landing.headers["location"] == "/console/repositories"
        assert alice.get("/console/overview.json").status_code == 403
        team = "/console/repositories/team"
        pages = [
            "/console/repositories", team, f"{team}/packages", f"{team}/assets", f"{team}/artifacts/{artifact['id']}",
            f"{team}/package?group=g&name=n&version=1", f"{team}/asset?path=p", f"{team}/packages/new", f"{team}/assets/new",
            f"{team}/artifacts/{artifact['id']}/delete", f"{team}/packages/delete?group=g&name=n&version=1",
            f"{team}/assets/delete?path=p", "/console/tokens", "/console/no-such-page", "/console/repositories/nope",
            "/console/repositories/own/members", "/console/repositories/own/members/remove?account=alice",
            "/console/repositories/own/retention", "/console/repositories/own/retention/disable",
            "/console/repositories/own/retention/delete", "/console/account/password",
            # The administrators' pages: refused, and the refusal shows nothing of them either.
            "/console/tasks", "/console/accounts", "/console/keys", "/console/audit",
        ]
        forbidden = [str(lease["pid"]) for lease in leases] + [lease["host"] for lease in leases] + [
            lease["url"] for lease in leases] + [f"127.0.0.1:{process.port}" for process in processes] + [socket.gethostname()]
        words = re.compile(r"\b(pid|pids|readiness|lease|leases|slot|host)\b", re.I)
        for path in pages:
            page = alice.get(path)
            assert page.status_code in (200, 403, 404), (path, page.status_code)
            assert "<h1>Overview</h1>" not in page.text, path
            main = page.text.split("<main", 1)[1]
            found = [item for item in forbidden if re.search(rf"(?<![\w.]){re.escape(item)}(?![\w])", page.text)]
            assert not found, (path, found)
            assert not words.search(main), (path, words.search(main).group(0))
            for secret in (alice.session, ADMIN_TOKEN):
                assert secret not in page.text, path
        statuses = {path: alice.get(path).status_code for path in pages if "/own/" in path or path.count("/") == 2}
        assert statuses == {
            **{path: 200 for path in pages if "/own/" in path},
            "/console/repositories": 200, "/console/tokens": 200, "/console/no-such-page": 404,
            "/console/tasks": 403, "/console/accounts": 403, "/console/keys": 403, "/console/audit": 403,
        }, statuses
        nav = alice.get("/console/repositories").text.split("</nav>", 1)[0]
        assert ">Overview<" not in nav and ">Tasks<" not in nav and ">Accounts<" not in nav and ">Audit<" not in nav


# -- the writer's / and a task's page -----------------------------------------------------------------------


def test_the_root_leads_a_browser_to_the_console_and_tells_a_program_where_the_api_is(writer):
    for method in ("GET", "HEAD"):
        browser = httpx.request(method, writer.url + "/", headers={"Accept": BROWSER_ACCEPT}, timeout=10)
        assert browser.status_code == 302 and browser.headers["location"] == "/console/", method
        assert browser.headers["vary"] == "Accept" and browser.content == b""
    followed = httpx.get(writer.url + "/", headers={"Accept": BROWSER_ACCEPT}, timeout=10, follow_redirects=True)
    assert followed.status_code == 200 and "<h1>Sign in</h1>" in followed.text
    for accept in (None, "*/*", "application/json"):
        program = httpx.get(writer.url + "/", headers={"Accept": accept} if accept else {}, timeout=10)
        assert program.status_code == 404 and program.headers["content-type"] == "application/json", accept
        body = program.json()
        assert body["code"] == "not_found" and "/api/v1/" in body["message"] and "/console/" in body["message"]
    assert httpx.head(writer.url + "/", timeout=10).status_code == 404


@pytest.mark.parametrize(("event", "said"), [
    ({"type": "task.queued", "data": {"status": "queued"}}, "Queued: waiting for a worker."),
    ({"type": "task.queued", "data": {"recovered_from": "loading"}}, "Queued again after a worker restart (it was loading)."),
    ({"type": "task.loading", "data": {"status": "loading"}}, "A worker took it."),
    ({"type": "task.running", "data": {"status": "running"}}, "Running."),
    ({"type": "task.running", "data": {"recovered_from": "running", "resumed": True}},
     "Running again from its last checkpoint, after a worker restart."),
    ({"type": "task.progress", "data": {"usage": {"items": 3, "bytes": 2048, "cost_units": 0, "transitions": 4},
                                        "message": "3 blobs checked"}}, "3 blobs checked (so far: items 3, bytes 2048)."),
    ({"type": "task.progress", "data": {"usage": {"transitions": 1}}}, "Progress."),
    ({"type": "task.checkpoint", "data": {"state_bytes": 120, "usage": {}}}, "Checkpoint saved (120 bytes of state)."),
    ({"type": "task.cancelling", "data": {"by": "root"}}, "Cancel asked by root: it stops at its next step."),
    ({"type": "task.cancelled", "data": {}}, "Cancelled."),
    ({"type": "task.completed", "data": {"result": {"checked": 2, "missing": 0, "nested": {"b": True, "a": None}}}},
     "Completed: checked 2, missing 0, nested.a null, nested.b true."),
    ({"type": "task.completed", "data": {"result": {}}}, "Completed."),
    ({"type": "task.failed", "data": {"error_code": "budget_exceeded", "error_message": "max_items 1 > 1"}},
     "Failed: budget_exceeded: max_items 1 > 1."),
    ({"type": "task.something", "data": {"x": [1, "é"]}}, 'task.something: {"x":[1,"é"]}'),
    ({"type": "task.progress", "data": "not an object"}, "Progress."),
])
def test_each_event_is_a_sentence(event, said):
    assert sentence(event) == said


@pytest.mark.parametrize(("value", "said"), [
    (None, "—"), ({}, "none"), ({"grace_seconds": 60}, "grace_seconds 60"),
    ({"b": {"y": 1, "x": False}, "a": "text"}, "a text, b.x false, b.y 1"), (3, "3"),
])
def test_params_and_results_are_name_value_pairs(value, said):
    assert pairs(value) == said


def test_a_task_page_shows_progress_as_a_bar_and_events_as_sentences(cluster, writer, admin):
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    for number in range(3):
        upload(writer, "builds", f"{number}.bin", os.urandom(1000 + number))
    # Queued (no worker yet): the bar waits, and knows its total.
    tasks_page = admin.get("/console/tasks")
    assert '<details class="advanced" id="dispatch-advanced">' in tasks_page.text  # the budget knobs folded away
    assert re.search(r'<details class="advanced" id="dispatch-advanced">\s*<summary>', tasks_page.text)
    dispatched = admin.submit("/console/tasks", "/console/tasks", kind="verify")
    whole = dispatched.headers["location"]
    limited = admin.submit("/console/tasks", "/console/tasks", kind="verify", budget_max_items="1")
    cut = limited.headers["location"]
    refused = admin.submit("/console/tasks", "/console/tasks", kind="verify", budget_max_items="0")
    assert refused.status_code == 400 and '<details class="advanced" id="dispatch-advanced" open>' in refused.text
    queued = admin.get(whole)
    bar = re.search(r"<progress id=\"task-progress\"[^>]*>", queued.text, re.S).group(0)
    assert 'value=' not in bar and 'data-counter="items"' in bar and 'data-total="3"' in bar
    assert text_of(queued, "task-progress-text") == "Queued: waiting for a worker."
    start_worker(cluster, real=True).wait_active()
    wait_for(lambda: "task.completed" in admin.get(whole).text, "the verify completed", timeout=60)
    wait_for(lambda: "task.failed" in admin.get(cut).text, "the limited verify failed", timeout=60)
    done = admin.get(whole)
    assert re.search(r'<progress id="task-progress" class="task" max="1" value="1"', done.text)
    assert text_of(done, "task-progress-text") == "Completed."
    rows = re.findall(r'<tr data-seq="(\d+)"><th scope="row">\d+</th><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td></tr>', done.text)
    said = {kind: html.unescape(text) for _, kind, text in rows}
    assert said["task.queued"] == "Queued: waiting for a worker." and said["task.running"] == "Running."
    assert said["task.completed"].startswith("Completed: ") and "checked 3" in said["task.completed"]
    events_table = done.text.split('<table id="events">', 1)[1].split("</table>", 1)[0]
    assert "{" not in events_table and "<code>" not in events_table  # sentences, not JSON
    assert text_of(done, "task-result").startswith("bytes ") and "checked 3" in text_of(done, "task-result")
    assert "{" not in done.text.split('<dl class="metadata" id="task"', 1)[1].split("</dl>", 1)[0]
    stopped = admin.get(cut)
    assert re.search(r'<progress id="task-progress" class="task" max="3" value="1"', stopped.text)
    assert text_of(stopped, "task-progress-text") == "Stopped (failed) at 1 of 3 blobs checked (33 %)."
    failed = [html.unescape(text) for _, kind, text in re.findall(
        r'<tr data-seq="(\d+)"><th scope="row">\d+</th><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td></tr>', stopped.text)
        if kind == "task.failed"]
    assert len(failed) == 1 and failed[0].startswith("Failed: budget_exceeded: ")
