"""Repository permissions for accounts on a real writer: read/write/admin levels, their
management API (admin or repository admin only), read-only tokens, changes effective at once."""

from __future__ import annotations

import pytest

from .harness import ADMIN_TOKEN, OTHER_TOKEN
from .test_accounts import make_account, session_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def writer(cluster):
    writer = cluster.writer().wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        for name, public in (("secret", False), ("open", True)):
            assert admin.post("/api/v1/repositories", json={"name": name, "public": public}).status_code == 201
    for name, admin_ in (("alice", False), ("bob", False), ("root", True)):
        make_account(writer, name, admin=admin_)
    return writer


def upload(client, repo: str = "secret"):
    return client.post(f"/api/v1/repositories/{repo}/artifacts?name=x.bin", content=b"x")


def grant(client, account: str, level: str):
    return client.put(f"/api/v1/repositories/secret/permissions/{account}", json={"level": level})


def test_levels_decide_what_an_account_reads_and_writes_at_once(writer):
    alice = session_of(writer, "alice")
    with writer.client(alice) as client, writer.client(ADMIN_TOKEN) as admin:
        assert client.get("/api/v1/repositories/secret").status_code == 404  # cannot tell it exists
        assert client.get("/api/v1/repositories/open").status_code == 200  # public as before
        assert grant(admin, "alice", "read").status_code == 200
        assert client.get("/api/v1/repositories/secret").status_code == 200
        assert upload(client).status_code == 403
        assert grant(admin, "alice", "write").status_code == 200
        assert upload(client).status_code == 201
        assert client.get("/api/v1/repositories/secret/permissions").status_code == 403  # not its admin
        assert admin.delete("/api/v1/repositories/secret/permissions/alice").status_code == 204
        assert client.get("/api/v1/repositories/secret").status_code == 404
        listed = admin.get("/api/v1/repositories").json()["items"]
    assert {r["name"] for r in listed} == {"secret", "open"}


def test_a_repository_admin_manages_its_permissions_and_nothing_more(writer):
    bob = session_of(writer, "bob")
    with writer.client(ADMIN_TOKEN) as admin:
        assert grant(admin, "bob", "admin").status_code == 200
    with writer.client(bob) as client:
        assert grant(client, "alice", "read").status_code == 200
        items = client.get("/api/v1/repositories/secret/permissions").json()["items"]
        assert [(i["account"], i["level"]) for i in items] == [("alice", "read"), ("bob", "admin")]
        assert grant(client, "nobody", "read").status_code == 404
        assert client.put("/api/v1/repositories/secret/permissions/alice", json={"level": "owner"}).status_code == 400
        assert client.get("/api/v1/repositories/open/permissions").status_code == 403
        assert client.post("/api/v1/accounts", json={"name": "x1", "password": "long enough"}).status_code == 403
    alice = session_of(writer, "alice")
    with writer.client(alice) as client:
        assert client.get("/api/v1/repositories/secret").status_code == 200
        # Not readable for her before the grant: a repository she cannot read is 404, not 403.
        assert client.put("/api/v1/repositories/nosuch/permissions/bob", json={"level": "read"}).status_code == 404


def test_a_read_token_never_writes_even_for_an_administrator(writer):
    root = session_of(writer, "root")
    with writer.client(root) as client:
        read = client.post("/api/v1/tokens", json={"access": "read"}).json()["token"]
        read_write = client.post("/api/v1/tokens", json={"access": "read-write"}).json()["token"]
    with writer.client(read) as client:
        assert client.get("/api/v1/repositories/secret").status_code == 200  # an admin reads all
        assert upload(client).status_code == 403
        assert client.post("/api/v1/repositories", json={"name": "new"}).status_code == 403
        assert client.post("/api/v1/tokens", json={"access": "read-write"}).status_code == 403
        assert client.post("/api/v1/keys", json={"scopes": ["admin"]}).status_code == 403
        assert grant(client, "alice", "write").status_code == 403
    with writer.client(read_write) as client:
        assert upload(client).status_code == 201


def set_public(client, public: bool, repo: str = "secret"):
    return client.patch(f"/api/v1/repositories/{repo}", json={"public": public})


def test_making_a_repository_public_or_private_needs_its_admin_not_write(writer):
    """Public is anonymous read for everyone: a decision like granting permissions (issue 13)."""
    with writer.client(ADMIN_TOKEN) as admin:
        assert grant(admin, "alice", "write").status_code == 200
        assert grant(admin, "bob", "admin").status_code == 200
        assert admin.post("/api/v1/repositories", json={"name": "other"}).status_code == 201
    alice, bob, root = (session_of(writer, name) for name in ("alice", "bob", "root"))
    with writer.client(alice) as client:
        refused = set_public(client, True)
        assert refused.status_code == 403 and "admin" in refused.json()["message"], refused.text
    with writer.client(OTHER_TOKEN) as key:  # a write:other service key
        assert upload(key, "other").status_code == 201  # it writes there...
        assert set_public(key, True, "other").status_code == 403  # ...but does not publish it
        assert key.post("/api/v1/repositories", json={"name": "other", "public": True}).status_code == 403
    with writer.client(None) as anonymous:
        assert anonymous.get("/api/v1/repositories/secret").status_code == 401
        assert anonymous.get("/api/v1/repositories/other").status_code == 401
    with writer.client(bob) as client:  # the repository's admin
        assert set_public(client, True).json()["public"] is True
    with writer.client(alice) as client:
        assert set_public(client, False).status_code == 403  # nor private again
    with writer.client(root) as client:  # an administrator account
        assert set_public(client, False).json()["public"] is False
    with writer.client(ADMIN_TOKEN) as admin:
        assert set_public(admin, True, "other").json()["public"] is True
