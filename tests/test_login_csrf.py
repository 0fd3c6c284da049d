"""Login CSRF (issue 22 §2, SPEC §5): `POST /api/v1/login` and `/register` take only
`application/json` and refuse another site's request (`Origin`, `Sec-Fetch-Site`), so no page
can sign a visitor's browser in as its author. Real HTTP to a real writer, for every shape a
cross-site form or script can send; and what must keep working: programs, the writer's own
origin (also behind a balancer), the console's sign-in form."""

from __future__ import annotations

import itertools

import httpx
import pytest

from .console_client import Console, csrf_of
from .harness import db_fetch
from .test_accounts import PASSWORD, make_account

pytestmark = pytest.mark.timeout(180)

BODY = '{"name": "root", "password": "%s"}' % PASSWORD
_addresses = (f"198.51.100.{i}" for i in itertools.count(1))


@pytest.fixture(scope="module")
def writer(module_cluster):
    """Behind a balancer (the test itself, 127.0.0.1): each request says its own client address,
    so the per-address login limit is no part of these tests."""
    writer = module_cluster.writer(ARKVORY_TRUSTED_PROXIES="127.0.0.1", ARKVORY_ALLOW_SIGNUP="true").wait_ready()
    make_account(writer, "root", admin=True)
    writer.database_url = module_cluster.database_url
    return writer


def post(writer, path: str, content: str | bytes, headers: dict[str, str] | list[tuple[str, str]]) -> httpx.Response:
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    with httpx.Client(base_url=writer.url, timeout=30) as client:
        return client.post(path, content=content, headers=[("X-Forwarded-For", next(_addresses)), *pairs])


def sessions(writer) -> int:
    return db_fetch(writer.database_url, "SELECT count(*) AS n FROM arkvory_credentials WHERE kind = 'session'")[0]["n"]


JSON = {"Content-Type": "application/json"}
OTHER_SITE = [
    # What an HTML form can send: no preflight, so these reach the server from any page.
    pytest.param(BODY, {"Content-Type": "text/plain"}, 415, id="json-as-text/plain"),
    pytest.param(BODY, {"Content-Type": "text/plain; charset=utf-8"}, 415, id="json-as-text/plain-charset"),
    pytest.param(f"name=root&password={PASSWORD}", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
                 id="urlencoded-form"),
    pytest.param('--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nroot\r\n--b--\r\n',
                 {"Content-Type": "multipart/form-data; boundary=b"}, 415, id="multipart-form"),
    pytest.param(BODY, {}, 415, id="no-content-type"),
    pytest.param(BODY, {"Content-Type": "application/jsonp"}, 415, id="not-quite-json"),
    # JSON, but the browser says which page sent it.
    pytest.param(BODY, {**JSON, "Origin": "https://attacker.example"}, 403, id="foreign-origin"),
    pytest.param(BODY, {**JSON, "Origin": "null"}, 403, id="null-origin"),
    pytest.param(BODY, {**JSON, "Origin": "http://localhost"}, 403, id="another-host-name"),
    pytest.param(BODY, {**JSON, "Origin": "http://127.0.0.1:1"}, 403, id="same-host-other-port"),
    pytest.param(BODY, {**JSON, "Origin": "not a url"}, 403, id="malformed-origin"),
    pytest.param(BODY, {**JSON, "Sec-Fetch-Site": "cross-site"}, 403, id="sec-fetch-site-cross-site"),
    pytest.param(BODY, {**JSON, "Sec-Fetch-Site": "same-site"}, 403, id="sec-fetch-site-same-site"),
    # The refusal comes before the body is read: a form is refused as from another site too.
    pytest.param(f"name=root&password={PASSWORD}",
                 {"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "cross-site"}, 403,
                 id="cross-site-form"),
]


@pytest.mark.parametrize("path", ["/api/v1/login", "/api/v1/register"])
@pytest.mark.parametrize(("body", "headers", "status"), OTHER_SITE)
def test_another_sites_request_signs_no_one_in(writer, path, body, headers, status):
    before = sessions(writer)
    if path == "/api/v1/register":
        body = body.replace("root", "mallory")
    answer = post(writer, path, body, headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == {403: "forbidden", 415: "unsupported_media_type"}[status]
    assert "set-cookie" not in answer.headers
    assert sessions(writer) == before
    assert not db_fetch(writer.database_url, "SELECT 1 FROM arkvory_accounts WHERE name = 'mallory'")


def test_the_writers_own_origin_and_programs_sign_in(writer):
    own = f"http://127.0.0.1:{writer.port}"
    for headers in (
        JSON,  # a program: no Origin, no Sec-Fetch-Site
        {"Content-Type": "application/json; charset=utf-8"},
        {**JSON, "Origin": own, "Sec-Fetch-Site": "same-origin"},  # a script on the writer's own pages
        {**JSON, "Sec-Fetch-Site": "none"},
    ):
        answer = post(writer, "/api/v1/login", BODY, headers)
        assert answer.status_code == 200, (headers, answer.text)
        assert answer.headers["set-cookie"].startswith("arkvory_session=")


def test_behind_a_balancer_the_origin_is_the_host_the_browser_asked_for(writer):
    # nginx passes `Host: $host`: the name without the port, and the scheme it ended TLS for.
    balanced = {**JSON, "Host": "Arkvory.Example", "Origin": "https://arkvory.example:8443"}
    assert post(writer, "/api/v1/login", BODY, balanced).status_code == 200
    # A balancer that says the host in X-Forwarded-Host is believed (127.0.0.1 is trusted here)...
    forwarded = {**JSON, "X-Forwarded-Host": "arkvory.example:8443", "Origin": "https://arkvory.example:8443"}
    assert post(writer, "/api/v1/login", BODY, forwarded).status_code == 200
    # ...and then the port it names counts, as does the host name.
    for origin in ("https://arkvory.example", "https://other.example:8443"):
        refused = post(writer, "/api/v1/login", BODY, {**forwarded, "Origin": origin})
        assert refused.status_code == 403, (origin, refused.text)
    # Two Origin headers are no origin at all.
    twice = [*JSON.items(), ("Origin", f"http://127.0.0.1:{writer.port}"), ("Origin", "https://attacker.example")]
    assert post(writer, "/api/v1/login", BODY, twice).status_code == 403


def test_x_forwarded_host_from_anyone_else_is_not_believed(cluster):
    writer = cluster.writer().wait_ready()  # no trusted balancer: the test is a client like any other
    make_account(writer, "root", admin=True)
    lying = {**JSON, "X-Forwarded-Host": "attacker.example", "Origin": "https://attacker.example"}
    assert post(writer, "/api/v1/login", BODY, lying).status_code == 403
    own = {**JSON, "X-Forwarded-Host": "attacker.example", "Origin": f"http://127.0.0.1:{writer.port}"}
    assert post(writer, "/api/v1/login", BODY, own).status_code == 200


def test_the_consoles_sign_in_form_still_signs_in_as_a_browser_posts_it(writer):
    """The console's form posts urlencoded to its own route with its CSRF token (no script
    needed); the console then calls the API in-process, with JSON and without the browser's
    Origin. A browser sends Origin and Sec-Fetch-Site with the form: they change nothing."""
    own = f"http://127.0.0.1:{writer.port}"
    with Console(writer.url, headers={"X-Forwarded-For": "198.51.100.250"}) as console:
        form = console.get("/console/sign-in")
        answer = console.http.post(
            "/console/sign-in", data={"csrf": csrf_of(form), "name": "ROOT", "password": PASSWORD},
            headers={"Origin": own, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"},
        )
        assert answer.status_code == 303 and console.session, answer.text
        assert console.get("/console/").status_code == 200
