"""No account makes unbounded credentials, and no list of them drops rows silently: live personal
tokens per account are capped (ARKVORY_MAX_TOKENS_PER_ACCOUNT, 409 past it, under concurrency
too; through the API, the console and the CLI), sessions per account too (a login past
ARKVORY_MAX_SESSIONS_PER_ACCOUNT ends the oldest), and the lists of tokens, keys and accounts page
like every other list (`limit`, `cursor`, `nextCursor`)."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared.client import Client

from .console_client import Console, messages
from .harness import ADMIN_TOKEN, db_execute, db_fetch
from .test_accounts import PASSWORD, login, make_account, session_of
from .test_cli import arkvory, assert_exit, cli_env

pytestmark = pytest.mark.timeout(180)

TOKENS = 3
SESSIONS = 2


@pytest.fixture(scope="module")
def writer(module_cluster):
    return module_cluster.writer(
        ARKVORY_MAX_TOKENS_PER_ACCOUNT=str(TOKENS), ARKVORY_MAX_SESSIONS_PER_ACCOUNT=str(SESSIONS)
    ).wait_ready()


@pytest.fixture
def alice(writer) -> tuple[str, str]:
    """A new account for each test (its tokens are its own) and a session of it."""
    name = f"alice-{uuid.uuid4().hex[:8]}"
    make_account(writer, name)
    return name, session_of(writer, name)


@pytest.fixture(scope="module")
def reader_session(writer) -> str:
    """One session for the tests that only read: a login per test of a 27-case table would pass
    the writer's 20 logins per address a minute (writer/identity/login_limits.py) and fail the next login."""
    name = f"reader-{uuid.uuid4().hex[:8]}"
    make_account(writer, name)
    return session_of(writer, name)


def create(writer, token: str, **body) -> httpx.Response:
    with writer.client(token) as client:
        return client.post("/api/v1/tokens", json={"access": "read", **body})


def every_page(writer, token: str, path: str, limit: int) -> list[list[dict]]:
    pages, cursor = [], None
    with writer.client(token) as client:
        while True:
            answer = client.get(path, params={"limit": str(limit), **({"cursor": cursor} if cursor else {})})
            assert answer.status_code == 200, answer.text
            assert set(answer.json()) == {"items", "nextCursor"}
            pages.append(answer.json()["items"])
            cursor = answer.json()["nextCursor"]
            if cursor is None:
                return pages
            assert len(pages) < 1000


# -- the limit on personal tokens ------------------------------------------------------------------


def test_past_the_limit_a_token_is_refused_409_until_one_is_revoked(writer, alice):
    name, session = alice
    made = [create(writer, session, label=f"t{i}") for i in range(TOKENS)]
    assert [m.status_code for m in made] == [201] * TOKENS, [m.text for m in made]
    refused = create(writer, session, label="one too many")
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["code"] == "conflict"
    assert "ARKVORY_MAX_TOKENS_PER_ACCOUNT=3" in body["message"] and "revoke one" in body["message"]
    assert "expired tokens do not count" in body["message"]
    # Another account's tokens are its own share.
    other = f"bob-{uuid.uuid4().hex[:8]}"
    make_account(writer, other)
    assert create(writer, session_of(writer, other)).status_code == 201
    # A revoked token gives its place back.
    with writer.client(session) as client:
        assert client.delete(f"/api/v1/tokens/{made[0].json()['id']}").status_code == 204
    assert create(writer, session).status_code == 201
    assert create(writer, session).status_code == 409


def test_expired_tokens_do_not_count_and_are_forgotten(writer, alice, module_database_url):
    name, session = alice
    for _ in range(TOKENS):
        assert create(writer, session, expiresInSeconds=1).status_code == 201
    time.sleep(1.5)
    assert create(writer, session, label="fresh").status_code == 201
    # The expired ones went with that create: an account's rows stay bounded however many
    # short-lived tokens it makes.
    rows = db_fetch(
        module_database_url,
        "SELECT c.label FROM arkvory_credentials c JOIN arkvory_accounts a ON a.id = c.account_id"
        " WHERE a.name = $1 AND c.kind = 'pat'",
        name,
    )
    assert [r["label"] for r in rows] == ["fresh"]


def test_two_creates_at_once_at_the_limit_less_one_make_one_token(writer, alice, module_database_url):
    name, session = alice
    for _ in range(TOKENS - 1):
        assert create(writer, session).status_code == 201

    async def at_once() -> list[int]:
        # The race made certain: while this lock is held, inserts into the credentials table wait
        # but reads do not, so every create has counted before any has inserted, unless the
        # creates of one account take their turns (the account row's lock) before counting.
        blocker = await asyncpg.connect(module_database_url)
        try:
            held = blocker.transaction()
            await held.start()
            await blocker.execute("LOCK TABLE arkvory_credentials IN SHARE ROW EXCLUSIVE MODE")
            async with httpx.AsyncClient(base_url=writer.url, timeout=30,
                                         headers={"Authorization": f"Bearer {session}"}) as client:
                racers = [
                    asyncio.ensure_future(client.post("/api/v1/tokens", json={"access": "read", "label": f"racer{i}"}))
                    for i in range(8)
                ]
                await asyncio.sleep(1.5)  # well under the writer's 5 s statement timeout
                await held.rollback()
                answers = await asyncio.gather(*racers)
        finally:
            await blocker.close()
        return sorted(a.status_code for a in answers)

    assert asyncio.run(at_once()) == [201] + [409] * 7
    with writer.client(session) as client:
        assert len(client.get("/api/v1/tokens").json()["items"]) == TOKENS


# -- sessions -------------------------------------------------------------------------------------


def test_a_login_past_the_session_limit_ends_the_oldest_session(writer, alice, module_database_url):
    name, first = alice
    later = [session_of(writer, name) for _ in range(SESSIONS)]
    with writer.client(first) as client:
        assert client.get("/api/v1/tokens").status_code == 401  # the oldest one ended
    for session in later:
        with writer.client(session) as client:
            assert client.get("/api/v1/tokens").status_code == 200
    for _ in range(4):
        assert login(writer, name).status_code == 200
    count = db_fetch(
        module_database_url,
        "SELECT count(*) AS n FROM arkvory_credentials c JOIN arkvory_accounts a ON a.id = c.account_id"
        " WHERE a.name = $1 AND c.kind = 'session'",
        name,
    )
    assert count[0]["n"] == SESSIONS


# -- lists that page --------------------------------------------------------------------------------


def test_the_token_list_pages_oldest_first(writer, alice):
    name, session = alice
    ids = [create(writer, session, label=f"t{i}").json()["id"] for i in range(TOKENS)]
    pages = every_page(writer, session, "/api/v1/tokens", 2)
    assert [len(p) for p in pages] == [2, 1]
    assert [t["id"] for p in pages for t in p] == ids
    with writer.client(session) as client:
        assert client.get("/api/v1/tokens").json()["nextCursor"] is None  # 3 fit the default page
    # The client library (and so `arkvory token list`) follows the pages.
    with Client([writer.url], session) as client:
        assert [t["id"] for t in client.list_tokens(page_size=1)] == ids


def test_the_key_and_account_lists_page(writer):
    with writer.client(ADMIN_TOKEN) as admin:
        keys = [admin.post("/api/v1/keys", json={"scopes": ["read:*"], "label": f"k{i}"}).json()["id"] for i in range(3)]
    pages = every_page(writer, ADMIN_TOKEN, "/api/v1/keys", 2)
    assert all(len(p) <= 2 for p in pages)
    listed = [k["id"] for p in pages for k in p]
    assert len(listed) == len(set(listed)) and [k for k in listed if k in keys] == keys
    names = [f"pager-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for name in names:
        make_account(writer, name)
    pages = every_page(writer, ADMIN_TOKEN, "/api/v1/accounts", 2)
    assert all(len(p) <= 2 for p in pages) and len(pages) >= 2
    listed = [a["name"] for p in pages for a in p]
    assert listed == sorted(listed) and len(listed) == len(set(listed)) and set(names) <= set(listed)


@pytest.mark.parametrize("path", ["/api/v1/tokens", "/api/v1/keys", "/api/v1/accounts"])
@pytest.mark.parametrize("query", [
    {"limit": "0"}, {"limit": "1001"}, {"limit": "-1"}, {"limit": "x"}, {"cursor": "nonsense"},
    {"cursor": "W10"},  # []
    {"cursor": "WyJ4IiwgInkiXQ"},  # ["x", "y"]
    {"cursor": "WyIyMDI2LTAxLTAxVDAwOjAwOjAwIiwgIjAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMCJd"},  # no zone
    {"cursor": "A" * 5000},
])
def test_a_bad_page_parameter_is_400(writer, reader_session, path, query):
    token = reader_session if path == "/api/v1/tokens" else ADMIN_TOKEN
    with writer.client(token) as client:
        answer = client.get(path, params=query)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_input"


# -- the console and the CLI ------------------------------------------------------------------------


def test_the_console_shows_the_limit_and_pages_tokens(writer, alice):
    name, session = alice
    with Console(writer.url) as console:
        console.signed_in(name, PASSWORD)
        for i in range(TOKENS):
            assert console.submit("/console/tokens", "/console/tokens", access="read", label=f"c{i}").status_code == 201
        refused = console.submit("/console/tokens", "/console/tokens", access="read", label="too many")
        assert refused.status_code == 409
        (shown,) = messages(refused)
        assert "revoke one" in shown and "ARKVORY_MAX_TOKENS_PER_ACCOUNT" in shown
        page = console.get("/console/tokens")
        assert page.text.count("data-token=") == TOKENS and 'rel="next"' not in page.text


def test_the_console_pages_accounts_and_keys(writer, module_cluster):
    # 51 accounts: one made through the API, 50 copies of it in SQL (each API create hashes a
    # password with scrypt at N = 2**17, ~0.4 s of CPU; the pages are what this test is about).
    first = f"many-{uuid.uuid4().hex[:8]}"
    make_account(writer, first)
    db_execute(
        module_cluster.database_url,
        "INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p)"
        " SELECT gen_random_uuid(), name || '-' || g, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p"
        " FROM arkvory_accounts, generate_series(1, 50) AS g WHERE name = $1",
        first,
    )
    with writer.client(ADMIN_TOKEN) as admin:
        for _ in range(51):
            assert admin.post("/api/v1/keys", json={"scopes": ["read:*"]}).status_code == 201
    root = f"root-{uuid.uuid4().hex[:8]}"
    make_account(writer, root, admin=True)
    with Console(writer.url) as console:
        console.signed_in(root, PASSWORD)
        first = console.get("/console/accounts")
        assert first.status_code == 200 and 'rel="next"' in first.text
        following = first.text.split('rel="next"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
        second = console.get(following.replace("&amp;", "&"))
        assert second.status_code == 200 and "First page" in second.text
        keys = console.get("/console/keys")
        assert keys.status_code == 200 and keys.text.count("data-key=") == 50 and 'rel="next"' in keys.text


def test_token_create_past_the_limit_prints_the_servers_message(writer, alice, tmp_path):
    name, session = alice
    home = tmp_path / "home"
    home.mkdir()
    env = cli_env(home, writer.url, token=session)
    for _ in range(TOKENS):
        assert_exit(arkvory(env, tmp_path, "token", "create", "--access", "read"), 0)
    refused = arkvory(env, tmp_path, "token", "create", "--access", "read")
    assert_exit(refused, 6)
    assert "ARKVORY_MAX_TOKENS_PER_ACCOUNT" in refused.stderr and "arkvory token revoke ID" in refused.stderr
    assert "pat_" not in refused.stdout
