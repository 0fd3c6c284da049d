"""No account makes unbounded credentials: live personal tokens per account are capped
(ARKVORY_MAX_TOKENS_PER_ACCOUNT, 409 past it, under concurrency too; through the API, the
console and the CLI), sessions per account too (a login past ARKVORY_MAX_SESSIONS_PER_ACCOUNT
ends the oldest)."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx
import pytest

from .console_client import Console, messages
from .harness import db_fetch
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


def create(writer, token: str, **body) -> httpx.Response:
    with writer.client(token) as client:
        return client.post("/api/v1/tokens", json={"access": "read", **body})


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
