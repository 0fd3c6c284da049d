"""The `Authorization` header read into a token (shared/auth/authorization.py): Bearer, or Basic
with the token as the password (issue 25 §9); the 401's challenges (shared/errors.py); and Basic
that a browser added to another site's request (shared/http/basic_from_browsers.py). With real
tools against real processes: tests/test_basic_auth_tools.py."""

from __future__ import annotations

import base64
import uuid

import pytest

from arkvory.shared.auth.authorization import MAX_BASIC_CHARS, presented_token
from arkvory.shared.auth.credentials import CredentialCache, mint, resolve_now
from arkvory.shared.auth.identity import KeyRing, Principal, memo_key, token_digest
from arkvory.shared.errors import ApiError, Unauthorized
from arkvory.shared.http.basic_from_browsers import refusal

pytestmark = pytest.mark.timeout(10)

TOKEN = "arkvory_key_basic_test_token_00000000000000001"


def basic(pair: bytes | str) -> str:
    raw = pair.encode() if isinstance(pair, str) else pair
    return "Basic " + base64.b64encode(raw).decode()


def refused_with(header: str) -> str:
    with pytest.raises(Unauthorized) as caught:
        presented_token(header)
    return caught.value.message


def test_bearer_is_read_as_before():
    assert presented_token(None) is None
    assert presented_token(f"Bearer {TOKEN}") == TOKEN
    assert presented_token(f"bearer   {TOKEN}  ") == TOKEN
    for header in ("Bearer", "Bearer ", "Token abc", "Digest x", "", "basicabc"):
        assert "Bearer" in refused_with(header)


def test_basic_carries_the_token_as_its_password_whatever_the_user_name():
    for user in ("", "alice", "x-token", "ci@example.com", "ж"):
        assert presented_token(basic(f"{user}:{TOKEN}")) == TOKEN
    assert presented_token("basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode()) == TOKEN
    assert presented_token("BASIC  " + base64.b64encode(f"u:{TOKEN}".encode()).decode() + " ") == TOKEN


def test_the_first_colon_splits_user_and_password():
    # RFC 7617: a user name holds no colon, a password may.
    assert presented_token(basic("user:pa:ss:word")) == "pa:ss:word"
    assert presented_token(basic(":" + TOKEN + ":")) == TOKEN + ":"


def test_the_password_is_utf8_or_else_latin1():
    assert presented_token(basic("u:tök€n".encode("utf-8"))) == "tök€n"
    assert presented_token(basic("u:tök".encode("latin-1"))) == "tök"
    # Bytes that are not UTF-8 in the user name are never read.
    assert presented_token(basic(b"\xff\xfe:" + TOKEN.encode())) == TOKEN


@pytest.mark.parametrize("value", [
    "!!!!",                                               # not base64
    "dTp0b2s",                                            # u:tok without its padding
    base64.b64encode(b"u:tok?n>>").decode().replace("+", "-").replace("/", "_"),  # the URL-safe alphabet
    "dTp0b2" + " " + "tlbg==",                             # a space inside
    "dTp0b2\ttlbg==",                                     # a tab inside
    "dTp0b2tlbg==dTp0b2tlbg==",                           # padding in the middle
    "ZHRwMGIydGxiZz09\u00e9",                              # not ASCII
    base64.b64encode(TOKEN.encode()).decode(),            # no colon at all
    base64.b64encode(f"{TOKEN}:".encode()).decode(),       # the token as the user, no password
    base64.b64encode(b"u:tok\x00en").decode(),            # a control character
    base64.b64encode(b"u:token\n").decode(),
    base64.b64encode(b"u:\x7f").decode(),
    base64.b64encode(b"u:" + b"t" * MAX_BASIC_CHARS).decode(),  # too long
])
def test_malformed_basic_is_401_without_repeating_the_value(value):
    message = refused_with(f"Basic {value}")
    assert "base64 of user:token" in message
    assert value not in message and "token\n" not in message


def test_basic_is_bounded_before_it_is_decoded():
    longest = "u:" + "t" * (MAX_BASIC_CHARS * 3 // 4 - 2)
    assert len(base64.b64encode(longest.encode())) == MAX_BASIC_CHARS
    assert presented_token(basic(longest)) == longest[2:]
    refused_with(basic(longest + "ttt"))
    refused_with("Basic " + "A" * 10_000_000)  # refused at once, not decoded


def _ring() -> KeyRing:
    return KeyRing.from_entries([{"id": "ci", "sha256": token_digest(TOKEN), "scopes": ["read:*"]}])


def _listening_cache() -> CredentialCache:
    cache = CredentialCache(clock=lambda: 0.0)
    cache.started_listening()
    return cache


def test_a_keys_file_token_is_one_principal_and_one_memo_entry_either_way():
    ring, cache = _ring(), _listening_cache()
    by_bearer = resolve_now(ring, cache, f"Bearer {TOKEN}")
    by_basic = resolve_now(ring, cache, basic(f"anyone:{TOKEN}"))
    assert by_bearer is by_basic and by_basic is not None and by_basic.id == "key:ci"
    assert list(ring._remembered) == [memo_key(TOKEN)]


def test_a_database_token_sent_as_basic_hits_the_entry_its_bearer_form_made():
    ring, cache = _ring(), _listening_cache()
    token = mint("pat").token
    assert resolve_now(ring, cache, basic(f"alice:{token}")) is None  # unknown here: the database decides
    principal = Principal(id="account:x", kind="account", scopes=frozenset({"read:r"}), credential_id=uuid.uuid4())
    cache.put(memo_key(token), principal, expires_at=10.0, generation=cache.generation)  # as the Bearer form's lookup
    assert resolve_now(ring, cache, basic(f"bob:{token}")) is principal
    assert resolve_now(ring, cache, f"Bearer {token}") is principal
    assert cache.hits == 2


def test_an_account_password_as_the_basic_password_is_refused_as_a_wrong_token():
    ring, cache = _ring(), _listening_cache()
    with pytest.raises(Unauthorized) as wrong_token:
        resolve_now(ring, cache, "Bearer arkvory_key_not_a_known_one")
    with pytest.raises(Unauthorized) as password:
        resolve_now(ring, cache, basic("alice:alice's long password"))
    assert password.value.message == wrong_token.value.message == "the token is not valid"
    assert not ring._remembered  # nothing kept of it


def test_a_401_challenges_for_basic_and_bearer():
    exc = Unauthorized("x")
    assert exc.header_pairs() == [
        ("WWW-Authenticate", 'Basic realm="arkvory", charset="UTF-8"'),
        ("WWW-Authenticate", 'Bearer realm="arkvory"'),
    ]
    # The console's pages send headers(): no Basic dialog over a page with its own sign-in form.
    assert exc.headers() == {"WWW-Authenticate": 'Bearer realm="arkvory"'}
    assert ApiError("y", retry_after=2).header_pairs() == [("Retry-After", "2")]


def _scope(method: str, **headers: str) -> dict:
    pairs = [(name.replace("_", "-").lower().encode(), value.encode()) for name, value in headers.items()]
    return {"type": "http", "method": method, "headers": [(b"authorization", b"Basic dTp0"), *pairs]}


@pytest.mark.parametrize("method, headers", [
    ("GET", {}),                                                      # a program
    ("POST", {}),
    ("GET", {"sec_fetch_site": "same-origin", "sec_fetch_mode": "cors"}),
    ("POST", {"sec_fetch_site": "same-origin", "origin": "http://here"}),
    ("GET", {"sec_fetch_site": "none", "sec_fetch_mode": "navigate"}),   # typed in the address bar
    ("GET", {"sec_fetch_site": "cross-site", "sec_fetch_mode": "navigate"}),  # a link from elsewhere
    ("HEAD", {"sec_fetch_site": "same-site", "sec_fetch_mode": "navigate"}),
    ("GET", {"origin": "http://elsewhere"}),                          # an old browser's read
])
def test_basic_passes_from_programs_and_this_sites_pages(method, headers):
    assert refusal(_scope(method, **headers)) is None


@pytest.mark.parametrize("method, headers", [
    ("GET", {"sec_fetch_site": "cross-site", "sec_fetch_mode": "no-cors"}),    # <img>, <script>
    ("GET", {"sec_fetch_site": "cross-site", "sec_fetch_mode": "cors"}),       # fetch()
    ("GET", {"sec_fetch_site": "same-site", "sec_fetch_mode": "cors"}),        # a sibling subdomain
    ("GET", {"sec_fetch_site": "cross-site"}),
    ("POST", {"sec_fetch_site": "cross-site", "sec_fetch_mode": "navigate"}),  # a form posted across sites
    ("DELETE", {"sec_fetch_site": "same-site", "sec_fetch_mode": "cors"}),
    ("POST", {"origin": "http://elsewhere"}),                                  # an old browser's form
    ("PUT", {"origin": "null"}),
])
def test_basic_a_browser_added_to_another_sites_request_is_403(method, headers):
    refused = refusal(_scope(method, **headers))
    assert refused is not None and refused.status == 403 and "another site" in refused.message


def test_two_sec_fetch_site_headers_are_not_believed():
    scope = _scope("GET", sec_fetch_site="same-origin")
    scope["headers"].append((b"sec-fetch-site", b"same-origin"))
    assert refusal(scope) is not None
