"""Credentials made by credentials (issue 13, SPEC §5): a new token or key never outlives the
credential that makes it (sessions included) and never has more access than it."""

from __future__ import annotations

import datetime
import time

import pytest

from .harness import ADMIN_TOKEN, OTHER_TOKEN
from .test_accounts import PASSWORD, login, make_account

pytestmark = pytest.mark.timeout(120)

YEAR = 366 * 86400


def expiry(answer) -> datetime.datetime:
    assert answer.status_code == 201, answer.text
    return datetime.datetime.fromisoformat(answer.json()["expiresAt"])


def in_days(days: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=days)


@pytest.fixture
def writer(cluster):
    writer = cluster.writer().wait_ready()
    make_account(writer, "root", admin=True)
    return writer


def test_a_token_is_capped_at_the_expiry_of_the_token_or_session_that_makes_it(writer):
    signed_in = login(writer, "root")
    session, session_expiry = signed_in.json()["token"], datetime.datetime.fromisoformat(signed_in.json()["expiresAt"])
    with writer.client(session) as client:
        from_session = expiry(client.post("/api/v1/tokens", json={"access": "read-write", "expiresInSeconds": YEAR}))
        short = client.post("/api/v1/tokens", json={"access": "read-write", "expiresInSeconds": 3})
    assert from_session <= session_expiry
    short_expiry = expiry(short)
    with writer.client(short.json()["token"]) as client:
        child = client.post("/api/v1/tokens", json={"access": "read-write", "expiresInSeconds": YEAR})
        grandchild_key = client.post("/api/v1/keys", json={"scopes": ["admin"], "expiresInSeconds": YEAR})
    assert expiry(child) <= short_expiry and expiry(grandchild_key) <= short_expiry
    time.sleep(max(0.0, (short_expiry - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 0.3)
    for token in (child.json()["token"], grandchild_key.json()["token"]):
        with writer.client(token) as client:
            assert client.get("/api/v1/repositories").status_code == 401


def test_a_managed_key_is_capped_at_its_maker_and_a_keys_file_key_caps_at_the_maximum(writer):
    with writer.client(ADMIN_TOKEN) as admin:  # a keys-file key has no expiry of its own
        managed = admin.post("/api/v1/keys", json={"scopes": ["admin"], "expiresInSeconds": 60})
        long_lived = expiry(admin.post("/api/v1/keys", json={"scopes": ["read:*"], "expiresInSeconds": YEAR}))
    assert long_lived > in_days(365)
    with writer.client(managed.json()["token"]) as client:
        made = expiry(client.post("/api/v1/keys", json={"scopes": ["read:*"], "expiresInSeconds": YEAR}))
    assert made <= expiry(managed)


def test_a_credential_never_makes_one_with_more_access(writer):
    make_account(writer, "alice")
    session = login(writer, "alice").json()["token"]
    with writer.client(session) as client:
        read = client.post("/api/v1/tokens", json={"access": "read"}).json()["token"]
        assert client.post("/api/v1/keys", json={"scopes": ["read:*"]}).status_code == 403  # not an admin
    with writer.client(read) as client:
        for access in ("read", "read-write"):
            assert client.post("/api/v1/tokens", json={"access": access}).status_code == 403
    with writer.client(OTHER_TOKEN) as key:  # write:other, no account, not an admin
        assert key.post("/api/v1/tokens", json={"access": "read"}).status_code == 403
        assert key.post("/api/v1/keys", json={"scopes": ["write:other"]}).status_code == 403


def test_an_account_that_reenters_its_password_makes_a_token_that_outlives_its_session(writer):
    """The password made the session; re-entered, it makes long-lived tokens the same way."""
    session = login(writer, "root").json()["token"]
    with writer.client(session) as client:
        wrong = client.post("/api/v1/tokens", json={"password": "not the password", "expiresInSeconds": YEAR})
        assert wrong.status_code == 401 and wrong.json()["code"] == "unauthorized"
        token = client.post("/api/v1/tokens", json={"password": PASSWORD, "expiresInSeconds": YEAR})
        key = client.post("/api/v1/keys", json={"scopes": ["read:*"], "password": PASSWORD, "expiresInSeconds": YEAR})
    assert expiry(token) > in_days(365) and expiry(key) > in_days(365)
    with writer.client(ADMIN_TOKEN) as admin:  # a key has no password: what it makes ends with it
        assert admin.post("/api/v1/keys", json={"scopes": ["read:*"], "password": PASSWORD}).status_code == 400
