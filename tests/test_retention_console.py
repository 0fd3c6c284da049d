"""The retention section of a repository's console page (issue 25 item 10) over plain HTTP: the
rule, the preview of the saved rule and of typed limits (paged, keeping the limits), saving
(disabled unless the box is ticked), disabling and deleting, refusals shown as messages, only
for the repository's admins; CSRF on every form; the page's security headers. The same
walk in headless Chromium is tests/test_retention_browser.py. Hostile forms and queries are never
a 500.
"""

from __future__ import annotations

import html
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arkvory.writer.console.security import CONTENT_SECURITY_POLICY

from .console_client import Console, csrf_of, make_account, messages, scripts_of
from .harness import ADMIN_TOKEN, db_execute

pytestmark = pytest.mark.timeout(180)

PAGE = "/console/repositories/builds/retention"


def api(writer) -> httpx.Client:
    return httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)


def uploaded(writer, count: int) -> list[dict]:
    """`count` artifacts in `builds`, the last half an hour old, each an hour older than the next
    (no age limit in whole hours falls on one)."""
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        made = [client.post("/api/v1/repositories/builds/artifacts", params={"name": f"build-{n:03}.tar"},
                            content=b"x" * (n + 1)).json() for n in range(count)]
    db_execute(writer.database_url, "UPDATE arkvory_artifacts a SET created_at = now() - make_interval(mins => 30 + 60 * t.age)"
               " FROM unnest($1::uuid[], $2::integer[]) AS t(id, age) WHERE a.id = t.id",
               [a["id"] for a in made], list(range(count - 1, -1, -1)))
    return made


def rule_of(writer) -> dict | None:
    with api(writer) as client:
        answer = client.get("/api/v1/repositories/builds/retention")
    return answer.json() if answer.status_code == 200 else None


@pytest.fixture
def writer(cluster):
    process = cluster.writer().wait_ready()
    process.database_url = cluster.database_url  # type: ignore[attr-defined]
    return process


@pytest.fixture
def admin(writer):
    make_account(writer.url, "root", admin=True)
    with Console(writer.url) as console:
        yield console.signed_in("root")


def names_listed(page: httpx.Response) -> list[str]:
    table = page.text.split('<table id="retention-preview">', 1)
    if len(table) == 1:
        return []
    return [html.unescape(n) for n in re.findall(r'<th scope="row"><a [^>]*>([^<]*)</a></th>', table[1].split("</table>")[0])]


def test_preview_save_enable_disable_and_delete_a_rule(writer, admin):
    made = uploaded(writer, 60)
    first = admin.get(PAGE)
    assert first.status_code == 200, first.text
    assert 'id="retention-rule">No rule' in first.text and '<table id="retention-preview">' not in first.text
    assert 'href="/console/repositories/builds/retention" aria-current="page">Retention</a>' in first.text

    # Typed limits are previewed, not saved; their pages keep them.
    typed = admin.get(PAGE, params={"keep_newest": "5", "keep_younger_than": ""})
    assert typed.status_code == 200 and "By the limits typed below (not saved)" in typed.text
    assert names_listed(typed) == [a["name"] for a in made[:50]]  # oldest first, 50 a page
    next_link = html.unescape(typed.text.split('rel="next"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0])
    assert "keep_newest=5" in next_link
    assert names_listed(admin.get(next_link)) == [a["name"] for a in made[50:55]]
    assert rule_of(writer) is None
    younger = admin.get(PAGE, params={"keep_newest": "", "keep_younger_than": "30h"})
    assert names_listed(younger) == [a["name"] for a in made[:30]]  # 30.5 and more hours old

    # Saved without the box: disabled.
    saved = admin.submit(PAGE, PAGE, keep_newest="10", keep_younger_than="2d")
    assert saved.status_code == 303 and saved.headers["location"] == PAGE + "?notice=retention-saved"
    assert rule_of(writer)["enabled"] is False
    shown = admin.get(saved.headers["location"])
    assert messages(shown) == ["The retention rule was saved."]
    assert "<strong>Disabled</strong>" in shown.text and "By the saved rule (once enabled)" in shown.text
    assert names_listed(shown) == [a["name"] for a in made[:12]]  # 48.5 and more hours old
    assert 'value="10"' in shown.text and 'value="2d"' in shown.text
    assert 'id="retention-enabled" name="enabled" type="checkbox" value="true" aria-describedby' in shown.text  # not ticked

    enabled = admin.submit(PAGE, PAGE, keep_newest="10", keep_younger_than="2d", enabled="true")
    assert enabled.status_code == 303 and rule_of(writer)["enabled"] is True
    assert "<strong>Enabled</strong>" in admin.get(PAGE).text
    # Disabling and deleting ask first (confirm.py): unconfirmed, the page asks and nothing changes.
    asked = admin.submit(PAGE, PAGE + "/disable")
    assert asked.status_code == 200 and "Disable the retention rule of builds?" in asked.text
    assert rule_of(writer)["enabled"] is True
    disabled = admin.submit(PAGE, PAGE + "/disable", confirm="yes")
    assert disabled.status_code == 303 and disabled.headers["location"] == PAGE + "?notice=retention-disabled"
    assert rule_of(writer) | {"updatedAt": None} == {
        "repository": "builds", "keepNewest": 10, "keepYoungerThanSeconds": 2 * 86400, "enabled": False,
        "updatedAt": None, "lastAppliedAt": None, "deletedTotal": 0}

    # Refusals are messages on the page, never a 500.
    for fields, status, text in (
        ({"keep_newest": "", "keep_younger_than": ""}, 400, "needs 'keepNewest', 'keepYoungerThanSeconds' or both"),
        ({"keep_newest": "0"}, 400, "'keepNewest' must be null or a whole number from 1"),
        ({"keep_newest": "ten"}, 400, "'keep newest' must be a whole number"),
        ({"keep_younger_than": "soon"}, 400, "'keep younger than' must be a duration"),
        ({"keep_younger_than": "5s"}, 400, "'keepYoungerThanSeconds' must be null or a whole number from 60"),
    ):
        refused = admin.submit(PAGE, PAGE, **fields)
        assert refused.status_code == status and text in messages(refused)[0], (fields, messages(refused))
        if any(fields.values()):  # (empty fields preview the saved rule)
            bad_preview = admin.get(PAGE, params=fields)
            assert bad_preview.status_code == status, (fields, bad_preview.text)
    assert rule_of(writer)["keepNewest"] == 10  # unchanged by the refusals

    asked = admin.submit(PAGE, PAGE + "/delete")
    assert asked.status_code == 200 and "Delete the retention rule of builds?" in asked.text
    assert rule_of(writer) is not None
    deleted = admin.submit(PAGE, PAGE + "/delete", confirm="yes")
    assert deleted.status_code == 303 and rule_of(writer) is None
    assert messages(admin.get(deleted.headers["location"])) == ["The retention rule was deleted."]
    for confirmed in ("", "yes"):  # no rule: neither the confirmation page nor the change
        again = admin.submit(f"{PAGE}?keep_newest=1", PAGE + "/delete", confirm=confirmed)
        assert again.status_code == 404 and "has no retention rule" in messages(again)[0], confirmed


def test_only_the_repositorys_admins_see_the_section(writer, admin):
    uploaded(writer, 3)
    make_account(writer.url, "writer-only")
    make_account(writer.url, "repo-admin")
    with api(writer) as client:
        for account, level in (("writer-only", "write"), ("repo-admin", "admin")):
            assert client.put(f"/api/v1/repositories/builds/permissions/{account}", json={"level": level}).status_code == 200
    with Console(writer.url) as writer_only:
        writer_only.signed_in("writer-only")
        assert ">Retention</a>" not in writer_only.get("/console/repositories/builds").text
        refused = writer_only.get(PAGE)
        assert refused.status_code == 403 and "needs its admin permission" in messages(refused)[0]
        page = writer_only.get("/console/repositories/builds")
        forged = writer_only.http.post(PAGE, data={"csrf": page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0],
                                                   "keep_newest": "1", "enabled": "true"})
        assert forged.status_code == 403
    with Console(writer.url) as repo_admin:
        repo_admin.signed_in("repo-admin")
        assert ">Retention</a>" in repo_admin.get("/console/repositories/builds").text
        assert repo_admin.submit(PAGE, PAGE, keep_newest="1", enabled="true").status_code == 303
    assert rule_of(writer)["enabled"] is True
    # Every form needs its CSRF token.
    for path in (PAGE, PAGE + "/disable", PAGE + "/delete"):
        for csrf in (None, "", "x" * 43):
            data = {"keep_newest": "1", "enabled": "true", **({"csrf": csrf} if csrf is not None else {})}
            answer = admin.http.post(path, data=data)
            assert answer.status_code == 403 and "CSRF" in messages(answer)[0], (path, csrf)
    assert rule_of(writer)["keepNewest"] == 1


def test_the_section_sends_its_security_headers_and_no_script(writer, admin):
    made = uploaded(writer, 3)
    with api(writer) as client:
        hostile = client.post("/api/v1/repositories/builds/artifacts", params={"name": "<img src=x onerror=alert(1)>"},
                              content=b"h").json()
    db_execute(writer.database_url, "UPDATE arkvory_artifacts SET created_at = now() - interval '9 days' WHERE id = $1::uuid",
               hostile["id"])
    for params in ({}, {"keep_newest": "1"}, {"keep_newest": "1", "cursor": "bm90LWEtY3Vyc29y"}):
        answer = admin.get(PAGE, params=params)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert answer.headers["cache-control"] == "no-store" and answer.headers["x-frame-options"] == "DENY"
        found = scripts_of(answer.text)
        assert found.inline == [] and found.handlers == [] and found.sources == [], found
        assert "<img src=x" not in answer.text
    listed = admin.get(PAGE, params={"keep_newest": "1"})
    assert names_listed(listed) == ["<img src=x onerror=alert(1)>", made[0]["name"], made[1]["name"]]


# -- hostile input -------------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["", "0", "1", "-1", "60", "59s", "1m", "30d", "99999999999999999999999", "1e9", " 5 d", "\x00", "<script>",
     "5\u0661", "a" * 5000, "true"])
_FIELDS = st.dictionaries(st.sampled_from(["keep_newest", "keep_younger_than", "enabled", "key", "cursor", "x"]),
                          _TEXT, max_size=5)
_SEGMENT = st.sampled_from(["builds", "nope", "..", "%2F", "a" * 300, "<x>"])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(action=st.sampled_from(["", "/disable", "/delete"]), segment=_SEGMENT, fields=_FIELDS, query=_FIELDS)
def test_hostile_retention_forms_and_queries_are_never_a_500(hostile_console, action, segment, fields, query):
    console, csrf = hostile_console
    path = f"/console/repositories/{segment}/retention"
    answer = console.http.post(path + action, data={**fields, "csrf": csrf})
    assert answer.status_code < 500, (path + action, fields, answer.status_code, answer.text[:2000])
    assert answer.headers.get("content-security-policy") == CONTENT_SECURITY_POLICY
    shown = console.get(path, params=query)
    assert shown.status_code < 500, (path, query, shown.text[:2000])


@pytest.fixture
def hostile_console(writer):
    uploaded(writer, 2)
    make_account(writer.url, "fuzz-admin", admin=True)
    with Console(writer.url) as console:
        console.signed_in("fuzz-admin")
        yield console, csrf_of(console.get("/console/"))
