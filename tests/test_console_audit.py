"""The console's audit page (writer/console/audit.py) over plain HTTP: a change made in the
console is an entry with the session and the browser's address, the GET form filters as the
API does and pages without a script, a filter the API refuses is a message above the form, and
only administrators see the page (and its link)."""

from __future__ import annotations

import html
import re
import urllib.parse

import httpx
import pytest

from arkvory.writer.console.security import CONTENT_SECURITY_POLICY

from .console_client import Console, make_account, messages, scripts_of
from .harness import ADMIN_TOKEN, db_fetch

pytestmark = pytest.mark.timeout(180)

_ROW = re.compile(r"<tr><th scope=\"row\">")
_NEXT = re.compile(r'<a href="([^"]*)" rel="next">')


@pytest.fixture(scope="module")
def writer(module_cluster):
    return module_cluster.writer().wait_ready()


@pytest.fixture(scope="module")
def admin(writer):
    make_account(writer.url, "auditor", admin=True)
    with Console(writer.url) as console:
        yield console.signed_in("auditor")


def rows(page: httpx.Response) -> int:
    return len(_ROW.findall(page.text))


def test_a_console_change_is_an_entry_the_page_shows(writer, admin):
    created = admin.submit("/console/repositories", "/console/repositories", name="from-console")
    assert created.status_code == 303, created.text
    url = writer.env["ARKVORY_DATABASE_URL"]
    [entry] = db_fetch(url, "SELECT * FROM arkvory_audit WHERE action = 'repository.create' AND target = 'from-console'")
    assert entry["actor_name"] == "auditor" and entry["credential_kind"] == "session"
    assert entry["client_address"] == "127.0.0.1" and entry["request_id"] == created.headers["x-request-id"]
    page = admin.get("/console/audit", params={"action": "repository", "principal": "auditor"})
    assert page.status_code == 200, page.text
    assert rows(page) == 1 and "from-console" in page.text and "repository.create" in page.text
    assert entry["request_id"] in page.text
    # Its security headers, and no script at all: the page works without one.
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    found = scripts_of(page.text)
    assert found.inline == [] and found.handlers == [] and found.sources == []
    assert 'href="/console/audit" aria-current="page"' in page.text


def test_the_form_filters_and_pages_without_a_script(writer, admin):
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as api:
        for n in range(55):
            assert api.post("/api/v1/repositories", json={"name": f"paged-{n}"}).status_code == 201
    query = {"principal": "key:admin", "action": "repository.create", "repository": "", "target": "",
             "outcome": "ok", "since": "", "until": "", "order": "oldest"}
    first = admin.get("/console/audit", params=query)
    assert first.status_code == 200 and rows(first) == 50, first.text
    link = html.unescape(_NEXT.search(first.text).group(1))
    assert "Newer entries" in first.text
    # The link keeps the filters (and never a secret).
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["principal"] == ["key:admin"]
    second = admin.get(link)
    assert second.status_code == 200 and rows(second) == 5 and not _NEXT.search(second.text)
    assert "paged-0<" in first.text and "paged-54<" in second.text
    # A time as the form's time field sends it (no seconds, no offset: UTC).
    future = admin.get("/console/audit", params={"since": "2999-01-01T00:00"})
    assert future.status_code == 200 and "No entry matches these filters." in future.text
    # A filter the API refuses: the message, and the form with what was typed.
    bad = admin.get("/console/audit", params={"since": "last tuesday", "target": "kept-typed"})
    assert bad.status_code == 400 and "'since'" in messages(bad)[0]
    assert 'value="kept-typed"' in bad.text and 'id="audit-filters"' in bad.text


def test_only_administrators_see_the_page_and_its_link(writer, admin):
    make_account(writer.url, "plain")
    with Console(writer.url) as plain:
        plain.signed_in("plain")
        page = plain.get("/console/audit")
        assert page.status_code == 403, page.text
        assert "the audit trail needs the admin scope" in messages(page)[0]
        assert 'href="/console/audit"' not in plain.get("/console/repositories").text
    assert 'href="/console/audit"' in admin.get("/console/repositories").text
    with Console(writer.url) as anonymous:
        away = anonymous.get("/console/audit")
        assert away.status_code == 303 and away.headers["location"].startswith("/console/sign-in")
