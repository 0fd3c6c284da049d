"""Accounts on a real writer: the first administrator from the command line, login and its
cookie, no account enumeration, rate limits, password change, disable, logout, sign-up."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import httpx
import pytest

from .harness import ADMIN_TOKEN, ROOT, db_fetch

pytestmark = pytest.mark.timeout(180)

PASSWORD = "correct horse battery"


def create_user(cluster, name: str, password: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "create-user", name, *extra],
        env=cluster.base_env(),
        cwd=ROOT,
        input=password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_account(writer, name: str, password: str = PASSWORD, admin: bool = False) -> None:
    with writer.client(ADMIN_TOKEN) as client:
        answer = client.post("/api/v1/accounts", json={"name": name, "password": password, "admin": admin})
    assert answer.status_code == 201, answer.text


def login(writer, name: str, password: str = PASSWORD) -> httpx.Response:
    with writer.client(None) as client:
        return client.post("/api/v1/login", json={"name": name, "password": password})


def session_of(writer, name: str, password: str = PASSWORD) -> str:
    answer = login(writer, name, password)
    assert answer.status_code == 200, answer.text
    return answer.json()["token"]


@pytest.fixture
def writer(cluster):
    return cluster.writer().wait_ready()


def test_first_administrator_from_create_user_with_the_password_on_stdin(cluster, writer):
    made = create_user(cluster, "root", PASSWORD, "--admin")
    assert made.returncode == 0, made.stderr
    # The password is never an argument: a second positional word is a usage error.
    refused = create_user(cluster, "other", "", PASSWORD)
    assert refused.returncode == 2
    short = create_user(cluster, "other", "short")
    assert short.returncode == 2 and "standard input" in short.stderr
    again = create_user(cluster, "root", PASSWORD)
    assert again.returncode == 1 and "already exists" in again.stderr

    stored = db_fetch(cluster.database_url, "SELECT password_hash, password_salt, scrypt_n FROM arkvory_accounts")
    assert len(stored) == 1 and PASSWORD.encode() not in bytes(stored[0]["password_hash"])
    assert stored[0]["scrypt_n"] >= 2**14

    answer = login(writer, "root")
    assert answer.status_code == 200, answer.text
    token = answer.json()["token"]
    assert token.startswith("dps_") and answer.json()["account"]["admin"] is True
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"arkvory_session={token};")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain HTTP here; set when the writer serves TLS
    # Only the digest of the session is stored.
    digests = db_fetch(cluster.database_url, "SELECT digest FROM arkvory_credentials WHERE kind = 'session'")
    assert [bytes(r["digest"]) for r in digests] != [token.encode()]

    # The session is an administrator's: bearer and cookie both work.
    with writer.client(token) as client:
        assert client.post("/api/v1/repositories", json={"name": "by-root"}).status_code == 201
    with httpx.Client(base_url=writer.url, cookies={"arkvory_session": token}, timeout=10) as client:
        assert client.get("/api/v1/repositories/by-root").status_code == 200
        assert client.get("/api/v1/accounts").status_code == 200


def test_a_failed_login_does_not_reveal_whether_the_account_exists(writer):
    make_account(writer, "alice")
    known, unknown = [], []
    answers = []
    for round_ in range(4):
        for name, times in (("alice", known), (f"nobody{round_}", unknown)):
            started = time.perf_counter()
            answer = login(writer, name, "wrong password!")
            times.append(time.perf_counter() - started)
            answers.append(answer)
    assert {a.status_code for a in answers} == {401}
    assert {a.json()["message"] for a in answers} == {"wrong account name or password"}
    # An unknown name is hashed against a dummy: it costs the same scrypt, not a quick "no".
    assert statistics.median(unknown) > 0.5 * statistics.median(known), (known, unknown)


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_login_attempts_are_limited_per_account_and_per_address(writer):
    make_account(writer, "alice")
    make_account(writer, "bob")
    for _ in range(5):
        assert login(writer, "alice", "wrong password!").status_code == 401
    limited = login(writer, "alice")  # even the right password waits now
    assert limited.status_code == 429
    assert limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # The limit is the account's: bob, from the same address, still logs in.
    assert login(writer, "bob").status_code == 200
    # The address has its own limit (20 a minute), whatever names it tries.
    statuses = [login(writer, f"guess{i}", "wrong password!").status_code for i in range(14)]
    assert statuses[:13] == [401] * 13 and statuses[13] == 429, statuses


def test_password_change_needs_the_old_password_and_ends_other_sessions(writer):
    make_account(writer, "alice")
    first, second = session_of(writer, "alice"), session_of(writer, "alice")
    new_password = "a new and longer password"
    with writer.client(first) as client:
        wrong = client.post("/api/v1/account/password", json={"oldPassword": "not it at all", "newPassword": new_password})
        assert wrong.status_code == 401
        changed = client.post("/api/v1/account/password", json={"oldPassword": PASSWORD, "newPassword": new_password})
        assert changed.status_code == 204, changed.text
        assert client.get("/api/v1/tokens").status_code == 200  # this session goes on
    with writer.client(second) as client:
        assert client.get("/api/v1/tokens").status_code == 401
    assert login(writer, "alice").status_code == 401
    assert login(writer, "alice", new_password).status_code == 200


def test_disabling_an_account_ends_its_sessions_and_tokens_at_once(writer):
    make_account(writer, "alice")
    session = session_of(writer, "alice")
    with writer.client(session) as client:
        pat = client.post("/api/v1/tokens", json={"access": "read-write"}).json()["token"]
        assert client.get("/api/v1/tokens").status_code == 200
    with writer.client(pat) as client:
        assert client.get("/api/v1/tokens").status_code == 200
    with writer.client(session) as client:
        assert client.post("/api/v1/accounts/alice/disable").status_code == 403  # admins only
    with writer.client(ADMIN_TOKEN) as client:
        disabled = client.post("/api/v1/accounts/alice/disable")
        assert disabled.status_code == 200 and disabled.json()["disabled"] is True
    for token in (session, pat):
        with writer.client(token) as client:
            assert client.get("/api/v1/tokens").status_code == 401
    failed = login(writer, "alice")
    assert failed.status_code == 401 and failed.json()["message"] == "wrong account name or password"
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/accounts/alice/enable").status_code == 200
    assert login(writer, "alice").status_code == 200


def test_logout_ends_the_session_and_clears_the_cookie(writer):
    make_account(writer, "alice")
    session = session_of(writer, "alice")
    with writer.client(session) as client:
        answer = client.post("/api/v1/logout")
        assert answer.status_code == 204
        assert answer.headers["set-cookie"].startswith("arkvory_session=;")
        assert "Max-Age=0" in answer.headers["set-cookie"]
        assert client.get("/api/v1/tokens").status_code == 401
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/logout").status_code == 400  # a key is not a session


def test_registration_only_when_signup_is_allowed(cluster):
    closed = cluster.writer().wait_ready()
    with closed.client(None) as client:
        refused = client.post("/api/v1/register", json={"name": "eve", "password": PASSWORD})
    assert refused.status_code == 404 and refused.json()["code"] == "not_found"
    closed.close()

    open_ = cluster.writer(ARKVORY_ALLOW_SIGNUP="true").wait_ready()
    with open_.client(None) as client:
        made = client.post("/api/v1/register", json={"name": "eve", "password": PASSWORD})
        assert made.status_code == 201, made.text
        assert made.json()["admin"] is False
        assert client.post("/api/v1/register", json={"name": "eve", "password": PASSWORD}).status_code == 409
        assert client.post("/api/v1/register", json={"name": "mallory", "password": "short"}).status_code == 400
    assert login(open_, "eve").status_code == 200
