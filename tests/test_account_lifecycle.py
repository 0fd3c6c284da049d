"""Accounts that can be recovered and deleted, on a real writer and gateway (issue 25 §1): an
administrator's password reset and the change it forces at the next sign-in, deleting an account
(its credentials end on every process, the keys it made are suspended, its permissions go, its
artifacts say who uploaded them), what keeps an installation from locking itself out, and who
uploaded each artifact."""

from __future__ import annotations

import concurrent.futures
import uuid

import pytest

from .harness import ADMIN_TOKEN, db_execute, db_fetch, eventually
from .test_accounts import PASSWORD, login, make_account, session_of

pytestmark = pytest.mark.timeout(240)

GIVEN = "a password the admin chose"
OWN = "my very own password"


@pytest.fixture
def site(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
    make_account(writer, "root", admin=True)
    make_account(writer, "alice")
    return writer, gateway


def grant(writer, account: str, level: str, repo: str = "builds", token: str = ADMIN_TOKEN):
    with writer.client(token) as client:
        return client.put(f"/api/v1/repositories/{repo}/members/{account}", json={"level": level})


def upload(process, token: str, repo: str = "builds", data: bytes = b"hello"):
    with process.client(token) as client:
        return client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "x.bin"}, content=data)


def content_status(process, token: str, artifact_id: str, repo: str = "builds") -> int:
    with process.client(token) as client:
        return client.get(f"/api/v1/repositories/{repo}/artifacts/{artifact_id}/content").status_code


def token_of(writer, session: str, password: str | None = None) -> dict:
    body = {"access": "read-write"} | ({"password": password} if password else {})
    with writer.client(session) as client:
        answer = client.post("/api/v1/tokens", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


# -- a reset, and the change it forces ---------------------------------------------------------------


def test_a_reset_ends_the_sessions_and_the_next_sign_in_may_only_set_a_new_password(site):
    writer, gateway = site
    assert grant(writer, "alice", "write").status_code == 200
    session = session_of(writer, "alice")
    tied = token_of(writer, session)["token"]  # made without the password: ends with the session
    kept = token_of(writer, session, PASSWORD)["token"]  # with it: a CI token, outlives the session
    artifact = upload(writer, kept).json()
    root = session_of(writer, "root")
    with writer.client(root) as client:
        reset = client.post("/api/v1/accounts/alice/password", json={"password": GIVEN})
    assert reset.status_code == 200, reset.text
    assert reset.json()["mustChangePassword"] is True and reset.json()["sessionsEnded"] == 1
    assert reset.headers["cache-control"] == "no-store"
    for token in (session, tied):
        with writer.client(token) as client:
            assert client.get("/api/v1/tokens").status_code == 401
        assert content_status(gateway, token, artifact["id"]) == 401
    # The token made with the password is the account's own doing: a build goes on.
    assert content_status(gateway, kept, artifact["id"]) == 200
    with writer.client(kept) as client:
        assert client.get("/api/v1/tokens").status_code == 200

    assert login(writer, "alice").status_code == 401  # the old password is gone
    signed_in = login(writer, "alice", GIVEN)
    assert signed_in.status_code == 200
    assert signed_in.json()["mustChangePassword"] is True and signed_in.json()["account"]["mustChangePassword"] is True
    restricted = signed_in.json()["token"]
    with writer.client(restricted) as client:
        for method, path, body in (("GET", "/api/v1/tokens", None), ("POST", "/api/v1/tokens", {"access": "read"}),
                                   ("GET", "/api/v1/repositories/builds", None),
                                   ("POST", "/api/v1/tokens", {"access": "read", "password": GIVEN})):
            refused = client.request(method, path, json=body)
            assert refused.status_code == 403 and refused.json()["code"] == "password_change_required", (path, refused.text)
            assert "arkvory password" in refused.json()["message"]
    # On a gateway it holds no permission: the private repository is not there for it.
    assert content_status(gateway, restricted, artifact["id"]) == 404
    with writer.client(restricted) as client:
        same = client.post("/api/v1/account/password", json={"oldPassword": GIVEN, "newPassword": GIVEN})
        assert same.status_code == 400 and "differ" in same.json()["message"]
        changed = client.post("/api/v1/account/password", json={"oldPassword": GIVEN, "newPassword": OWN})
        assert changed.status_code == 204, changed.text
        # The same session goes on with the account's permissions, at once.
        assert client.get("/api/v1/tokens").status_code == 200
        assert client.get("/api/v1/repositories/builds").status_code == 200
    assert eventually(lambda: content_status(gateway, restricted, artifact["id"]) == 200, "the gateway heard of it")
    again = login(writer, "alice", OWN)
    assert again.status_code == 200 and again.json()["mustChangePassword"] is False
    assert login(writer, "alice", GIVEN).status_code == 401


def test_a_reset_session_may_log_out_and_who_may_reset_what(site):
    writer, _ = site
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/accounts/alice/password", json={"password": GIVEN}).status_code == 200
        listed = {a["name"]: a for a in admin.get("/api/v1/accounts").json()["items"]}
        assert listed["alice"]["mustChangePassword"] is True and listed["root"]["mustChangePassword"] is False
        assert admin.post("/api/v1/accounts/ALICE/password", json={"password": "short"}).status_code == 400
        assert admin.post("/api/v1/accounts/nobody/password", json={"password": GIVEN}).status_code == 404
        assert admin.post("/api/v1/accounts/alice/password", json={}).status_code == 400
    restricted = session_of(writer, "alice", GIVEN)
    with writer.client(restricted) as client:
        assert client.post("/api/v1/logout").status_code == 204
        assert client.get("/api/v1/tokens").status_code == 401
    root = session_of(writer, "root")
    alice = session_of(writer, "alice", GIVEN)
    with writer.client(alice) as client:
        refused = client.post("/api/v1/accounts/root/password", json={"password": GIVEN})
        assert refused.status_code == 403 and refused.json()["code"] == "password_change_required"
        assert client.post("/api/v1/account/password", json={"oldPassword": GIVEN, "newPassword": OWN}).status_code == 204
        not_admin = client.post("/api/v1/accounts/root/password", json={"password": GIVEN})
        assert not_admin.status_code == 403 and not_admin.json()["code"] == "forbidden"
    with writer.client(root) as client:
        own = client.post("/api/v1/accounts/root/password", json={"password": GIVEN})
        assert own.status_code == 403 and "/api/v1/account/password" in own.json()["message"]
        assert client.get("/api/v1/tokens").status_code == 200  # root's own session goes on


# -- deleting an account --------------------------------------------------------------------------------


def test_deleting_an_account_ends_its_credentials_everywhere_and_keeps_its_artifacts(site, cluster):
    writer, gateway = site
    make_account(writer, "carol", admin=True)
    assert grant(writer, "alice", "write").status_code == 200
    alice = session_of(writer, "alice")
    pat = token_of(writer, alice, PASSWORD)["token"]
    artifact = upload(writer, pat).json()
    assert artifact["uploadedBy"]["kind"] == "account" and artifact["uploadedBy"]["name"] == "alice"
    alice_id = artifact["uploadedBy"]["id"]
    with writer.client(session_of(writer, "carol")) as client:  # keys carol made, with and without the password
        made = [client.post("/api/v1/keys", json={"scopes": ["read:*"], "label": f"ci-{n}", **extra}).json()
                for n, extra in enumerate(({"password": PASSWORD}, {}))]
    for key in made:
        assert content_status(gateway, key["token"], artifact["id"]) == 200
    assert content_status(gateway, pat, artifact["id"]) == 200

    with writer.client(ADMIN_TOKEN) as admin:
        shown = admin.get("/api/v1/accounts/alice").json()
        assert shown["holds"] == {"sessions": 1, "tokens": 1, "keysMade": 0, "repositories": 1}
        deleted = admin.delete("/api/v1/accounts/alice", headers={"Idempotency-Key": "delete-alice"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"id": alice_id, "name": "alice", "deleted": True, "ended": shown["holds"]}
        replay = admin.delete("/api/v1/accounts/alice", headers={"Idempotency-Key": "delete-alice"})
        assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
        assert admin.delete("/api/v1/accounts/alice").status_code == 404
        assert admin.get("/api/v1/accounts/alice").status_code == 404
        carol = admin.get("/api/v1/accounts/carol").json()["holds"]
        assert carol["keysMade"] == 2
        assert admin.delete("/api/v1/accounts/carol").json()["ended"]["keysMade"] == 2
    # Every credential of the account is refused at once, on the writer and on the gateway.
    for token in (alice, pat):
        with writer.client(token) as client:
            assert client.get("/api/v1/tokens").status_code == 401
        assert eventually(lambda: content_status(gateway, token, artifact["id"]) == 401, "refused on the gateway")
    assert login(writer, "alice").status_code == 401
    # The keys carol made are suspended, the one made without the password too, until adopted.
    for key in made:
        assert eventually(lambda: content_status(gateway, key["token"], artifact["id"]) == 401, "the key suspended")
    with writer.client(ADMIN_TOKEN) as admin:
        keys = {k["id"]: k for k in admin.get("/api/v1/keys").json()["items"]}
        assert all(keys[k["id"]]["suspendedAt"] and keys[k["id"]]["makerAccount"] is None for k in made)
        assert admin.post(f"/api/v1/keys/{made[1]['id']}/adopt", json={}).status_code == 200
        assert admin.get("/api/v1/repositories/builds/members").json()["items"] == []
        # The artifact stays and says who uploaded it; a new "alice" is someone else.
        kept = admin.get(f"/api/v1/repositories/builds/artifacts/{artifact['id']}").json()
        assert kept["uploadedBy"] == {"kind": "account", "id": alice_id, "name": "alice"}
    assert content_status(gateway, made[1]["token"], artifact["id"]) == 200
    make_account(writer, "alice")
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.get("/api/v1/accounts/alice").json()["id"] != alice_id
    assert db_fetch(cluster.database_url, "SELECT count(*) AS n FROM arkvory_repository_permissions")[0]["n"] == 0


def test_deleting_an_account_expires_its_open_uploads(site, cluster):
    writer, _ = site
    assert grant(writer, "alice", "write").status_code == 200
    alice = session_of(writer, "alice")
    with writer.client(alice) as client:
        started = client.post("/api/v1/repositories/builds/uploads", json={"name": "big.bin", "size": 10},
                              headers={"Idempotency-Key": "u1"})
    assert started.status_code == 201, started.text
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.delete("/api/v1/accounts/alice").status_code == 200
    rows = db_fetch(cluster.database_url, "SELECT expires_at <= now() AS expired FROM arkvory_uploads")
    assert [r["expired"] for r in rows] == [True]


# -- no lockout ------------------------------------------------------------------------------------------


def test_no_account_removes_itself_nor_anyone_but_a_keys_file_key_the_last_admin(site):
    writer, _ = site
    root = session_of(writer, "root")
    with writer.client(root) as client:
        for verb, request in (("delete", lambda: client.delete("/api/v1/accounts/root")),
                              ("disable", lambda: client.post("/api/v1/accounts/root/disable"))):
            refused = request()
            assert refused.status_code == 403 and f"cannot {verb} itself" in refused.json()["message"], refused.text
        key = client.post("/api/v1/keys", json={"scopes": ["admin"], "password": PASSWORD}).json()["token"]
    with writer.client(key) as client:  # a managed admin key made by root: it would go with root
        for refused in (client.delete("/api/v1/accounts/root"), client.post("/api/v1/accounts/root/disable")):
            assert refused.status_code == 409 and "last enabled administrator" in refused.json()["message"], refused.text
    make_account(writer, "ops", admin=True)
    with writer.client(session_of(writer, "ops")) as client:
        assert client.post("/api/v1/accounts/root/disable").status_code == 200
        # root is disabled: ops is the last enabled administrator account now.
        assert client.delete("/api/v1/accounts/root").status_code == 200
    with writer.client(key) as client:
        assert client.get("/api/v1/accounts").status_code == 401  # root's key went with root
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.delete("/api/v1/accounts/ops").status_code == 200  # the operator's own key may
        assert {a["name"] for a in admin.get("/api/v1/accounts").json()["items"]} == {"alice"}
        # ...and makes an administrator again: the installation was never locked out.
        assert admin.post("/api/v1/accounts", json={"name": "root", "password": PASSWORD, "admin": True}).status_code == 201
    assert login(writer, "root").status_code == 200


def test_two_administrators_removing_each_other_at_once_leave_one(site):
    writer, _ = site
    with writer.client(ADMIN_TOKEN) as admin:  # root goes: the two below are the only administrators
        assert admin.delete("/api/v1/accounts/root").status_code == 200
    for round_ in range(3):
        names = [f"a{round_}", f"b{round_}"]
        for name in names:
            make_account(writer, name, admin=True)
        sessions = [session_of(writer, name) for name in names]
        verbs = [("DELETE", ""), ("POST", "/disable")][round_ % 2]

        def remove(me: int):
            with writer.client(sessions[me]) as client:
                return client.request(verbs[0], f"/api/v1/accounts/{names[1 - me]}{verbs[1]}").status_code

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            statuses = sorted(pool.map(remove, (0, 1)))
        assert statuses[0] == 200 and statuses[1] in (401, 409), statuses
        with writer.client(ADMIN_TOKEN) as admin:
            left = [a for a in admin.get("/api/v1/accounts").json()["items"] if a["admin"] and not a["disabled"]]
            assert len(left) == 1, left
            for name in names:  # the next round's pair are the only administrators again
                admin.delete(f"/api/v1/accounts/{name}")


# -- who uploaded it -------------------------------------------------------------------------------------


def test_every_artifact_says_who_uploaded_it_and_older_ones_say_nothing(site, cluster):
    writer, _ = site
    by_key = upload(writer, ADMIN_TOKEN, data=b"from the keys file").json()
    assert by_key["uploadedBy"] == {"kind": "key", "id": "admin", "name": "admin"}
    with writer.client(ADMIN_TOKEN) as admin:
        labelled = admin.post("/api/v1/keys", json={"scopes": ["write:builds"], "label": "ci-deploy"}).json()
        plain = admin.post("/api/v1/keys", json={"scopes": ["write:builds"]}).json()
    assert upload(writer, labelled["token"], data=b"ci").json()["uploadedBy"] == {
        "kind": "service", "id": labelled["id"], "name": "ci-deploy"}
    assert upload(writer, plain["token"], data=b"plain").json()["uploadedBy"] == {
        "kind": "service", "id": plain["id"], "name": None}
    # A session's complete records the session's principal, an account here.
    assert grant(writer, "alice", "write").status_code == 200
    alice = session_of(writer, "alice")
    with writer.client(alice) as client:
        started = client.post("/api/v1/repositories/builds/uploads", json={"name": "s.bin", "size": 3},
                              headers={"Idempotency-Key": "s1"}).json()
        base = f"/api/v1/repositories/builds/uploads/{started['id']}"
        assert client.put(f"{base}/content", content=b"abc").status_code in (200, 204)
        completed = client.post(f"{base}/complete")
        assert completed.status_code == 201, completed.text
        assert completed.json()["uploadedBy"]["kind"] == "account" and completed.json()["uploadedBy"]["name"] == "alice"
        again = client.post(f"{base}/complete").json()  # the repeat says the same
        assert again["uploadedBy"] == completed.json()["uploadedBy"]
        listed = client.get("/api/v1/repositories/builds/artifacts").json()["items"]
    assert {a["id"]: a["uploadedBy"]["kind"] for a in listed} == {
        by_key["id"]: "key", completed.json()["id"]: "account",
        **{a["id"]: "service" for a in listed if a["uploadedBy"]["kind"] == "service"}}
    # An artifact uploaded before migration 0019 has no record: unknown.
    db_execute(cluster.database_url, "UPDATE arkvory_artifacts SET uploaded_by_kind = NULL, uploaded_by_id = NULL,"
               " uploaded_by_name = NULL WHERE id = $1", uuid.UUID(by_key["id"]))
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.get(f"/api/v1/repositories/builds/artifacts/{by_key['id']}").json()["uploadedBy"] is None
