"""A browser without the browser, for the console's tests: a cookie jar, the CSRF token and
idempotency key of the form a page holds, and the messages a page shows."""

from __future__ import annotations

import html
import html.parser
import re

import httpx

from .harness import ADMIN_TOKEN

PASSWORD = "console test password"
_CSRF = re.compile(r'name="csrf" value="([^"]*)"')
_KEY = re.compile(r'name="key" value="([^"]*)"')
_MESSAGE = re.compile(r'<p class="(error|notice)" role="(?:alert|status)">(.*?)</p>', re.S)


def make_account(writer_url: str, name: str, password: str = PASSWORD, admin: bool = False, **client) -> None:
    with httpx.Client(base_url=writer_url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30, **client) as api:
        answer = api.post("/api/v1/accounts", json={"name": name, "password": password, "admin": admin})
    assert answer.status_code == 201, answer.text


class Console:
    def __init__(self, base_url: str, **client) -> None:
        self.http = httpx.Client(base_url=base_url, follow_redirects=False, timeout=30, **client)

    def __enter__(self) -> Console:
        return self

    def __exit__(self, *exc) -> None:
        self.http.close()

    @property
    def session(self) -> str | None:
        return self.http.cookies.get("arkvory_session")

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def sign_in(self, name: str, password: str = PASSWORD) -> httpx.Response:
        form = self.get("/console/sign-in")
        assert form.status_code == 200, form.text
        return self.http.post("/console/sign-in", data={"csrf": csrf_of(form), "name": name, "password": password})

    def signed_in(self, name: str, password: str = PASSWORD) -> Console:
        answer = self.sign_in(name, password)
        assert answer.status_code == 303 and self.session, answer.text
        return self

    def submit(self, page: str, action: str, **fields: str) -> httpx.Response:
        """Post a form of `page` to `action` as a browser would: with the page's CSRF token and a
        fresh idempotency key from the page."""
        shown = self.get(page)
        assert shown.status_code == 200, shown.text
        data = {"csrf": csrf_of(shown), "key": key_of(shown), **fields}
        return self.http.post(action, data={k: v for k, v in data.items() if v is not None})


def csrf_of(page: httpx.Response) -> str:
    found = _CSRF.search(page.text)
    assert found, page.text
    return html.unescape(found.group(1))


def key_of(page: httpx.Response) -> str | None:
    found = _KEY.search(page.text)
    return html.unescape(found.group(1)) if found else None


def messages(page: httpx.Response) -> list[str]:
    """The notices and errors a page shows, as text."""
    return [html.unescape(text).strip() for _, text in _MESSAGE.findall(page.text)]


class Scripts(html.parser.HTMLParser):
    """Every <script> (its src and inline text), every on* attribute, every URL of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str | None] = []
        self.inline: list[str] = []
        self.handlers: list[tuple[str, str]] = []
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "script":
            self.sources.append(attributes.get("src"))
            self._in_script = True
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append((name, value or ""))
            if name in ("href", "src", "action") and value is not None:
                self.urls.append(value)
            if name in ("href", "src", "action") and (value or "").lower().startswith("javascript:"):
                self.handlers.append((name, value or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(data)


def scripts_of(text: str) -> Scripts:
    parser = Scripts()
    parser.feed(text)
    parser.close()
    return parser
