"""The audit trail (writer/audit/) on a real writer and PostgreSQL: every change family makes
exactly one entry with the right fields, no secret ever lands in the table, a change rolled
back leaves none and an entry that cannot be written rolls its change back, refusals are
recorded within their bound, the list filters and pages for administrators only, admin tools
record themselves, and the cleanup prunes within its budget.

One writer serves the module (sign-up allowed); each test tells its entries apart by request
id or by names of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import subprocess
import sys
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared.settings import Settings
from arkvory.shared.storage import Storage
from arkvory.writer.app import ROUTE_MODULES
from arkvory.writer.audit.actions import ACTION_NAMES, ACTIONS, TOOL_ACTIONS, UNAUDITED
from arkvory.writer.maintenance import cleanup
from arkvory.writer.worker.offline import OfflineContext

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, ROOT, db_execute, db_fetch, eventually

pytestmark = pytest.mark.timeout(240)

# Recognizable secrets: none of them may appear anywhere in the audit table.
ALICE_PASSWORD = "alice-Pw-9f3e1c77d2"
ALICE_NEW_PASSWORD = "alice-NewPw-5b8a0e44"
BOB_PASSWORD = "bob-Pw-a1b2c3d4e5f6"
CAROL_PASSWORD = "carol-Pw-77aa88bb99"


@pytest.fixture(scope="module")
def writer(module_cluster):
    return module_cluster.writer(ARKVORY_ALLOW_SIGNUP="true").wait_ready()


def entries(url: str, request_id: str) -> list:
    return db_fetch(url, "SELECT * FROM arkvory_audit WHERE request_id = $1", request_id)


class Story:
    """Every kind of change, made once through the API; what each should have recorded."""

    def __init__(self, writer) -> None:
        self.writer = writer
        self.expected: list[tuple[httpx.Response, dict]] = []
        self.secrets: list[str] = [ALICE_PASSWORD, ALICE_NEW_PASSWORD, BOB_PASSWORD, CAROL_PASSWORD, ADMIN_TOKEN]

    def client(self, token: str | None) -> httpx.Client:
        return self.writer.client(token)

    def change(self, token: str | None, method: str, path: str, status: int, expect: dict, **kwargs) -> httpx.Response:
        with self.client(token) as client:
            answer = client.request(method, path, **kwargs)
        assert answer.status_code == status, (method, path, answer.text)
        self.expected.append((answer, expect))
        return answer

    def secret_token(self, token: str) -> str:
        self.secrets += [token, token.split(".", 1)[-1], hashlib.sha256(token.encode()).hexdigest()]
        return token


def run_story(writer) -> Story:
    s = Story(writer)
    admin = {"actor_kind": "key", "actor_id": "key:admin", "actor_name": "admin", "credential_id": None}
    repo = f"audit-{uuid.uuid4().hex[:8]}"
    s.change(ADMIN_TOKEN, "POST", "/api/v1/accounts", 201, {**admin, "action": "account.create", "target": "alice"},
             json={"name": "alice", "password": ALICE_PASSWORD, "admin": True})
    s.change(ADMIN_TOKEN, "POST", "/api/v1/accounts", 201, {**admin, "action": "account.create", "target": "bob"},
             json={"name": "bob", "password": BOB_PASSWORD})
    signed_in = s.change(None, "POST", "/api/v1/login", 200, {"action": "account.sign-in", "actor_name": "alice",
                         "actor_kind": "account", "credential_kind": "session"},
                         json={"name": "alice", "password": ALICE_PASSWORD})
    session = s.secret_token(signed_in.json()["token"])
    alice_id = signed_in.json()["account"]["id"]
    alice = {"actor_kind": "account", "actor_id": f"account:{alice_id}", "actor_name": "alice",
             "credential_kind": "session", "credential_id": signed_in.json()["sessionId"]}
    s.expected[-1][1].update(actor_id=alice["actor_id"], credential_id=alice["credential_id"])
    s.change(session, "POST", "/api/v1/repositories", 201,
             {**alice, "action": "repository.create", "repository": repo, "target": repo}, json={"name": repo})
    made = s.change(session, "POST", "/api/v1/tokens", 201, {**alice, "action": "token.create"},
                    json={"label": "ci", "access": "read-write", "password": ALICE_PASSWORD})
    pat = s.secret_token(made.json()["token"])
    s.expected[-1][1].update(target=made.json()["id"])
    by_pat = {**alice, "credential_kind": "pat", "credential_id": made.json()["id"]}
    uploaded = s.change(pat, "POST", f"/api/v1/repositories/{repo}/artifacts", 201,
                        {**by_pat, "action": "artifact.upload", "repository": repo},
                        params={"name": "one.bin"}, content=b"one" * 100)
    first = uploaded.json()["id"]
    s.expected[-1][1]["target"] = first
    s.change(pat, "PATCH", f"/api/v1/repositories/{repo}", 200,
             {**by_pat, "action": "repository.update", "repository": repo, "target": repo}, json={"public": True})
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/permissions/bob", 200,
             {**by_pat, "action": "permission.set", "repository": repo, "target": "bob"}, json={"level": "write"})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/permissions/bob", 204,
             {**by_pat, "action": "permission.remove", "repository": repo, "target": "bob"})
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/packages", 201,
             {**by_pat, "action": "package.register", "repository": repo, "target": "g/n/1.0"},
             json={"group": "g", "name": "n", "version": "1.0", "artifactId": first})
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/assets", 200,
             {**by_pat, "action": "asset.point", "repository": repo, "target": "latest/one.bin"},
             params={"path": "latest/one.bin"}, json={"artifactId": first})
    # A resumable upload: created, its content sent (not audited: the completion is), completed.
    content = b"two" * 1000
    opened = s.change(pat, "POST", f"/api/v1/repositories/{repo}/uploads", 201,
                      {**by_pat, "action": "upload.create", "repository": repo},
                      json={"name": "two.bin", "size": len(content)}, headers={"Idempotency-Key": "up-1"})
    session_id = opened.json()["id"]
    s.expected[-1][1]["target"] = session_id
    with s.client(pat) as client:
        sent = client.put(f"/api/v1/repositories/{repo}/uploads/{session_id}/content", content=content)
    assert sent.status_code == 200, sent.text
    assert entries(writer_url(s), sent.headers["x-request-id"]) == []
    completed = s.change(pat, "POST", f"/api/v1/repositories/{repo}/uploads/{session_id}/complete", 201,
                         {**by_pat, "action": "upload.complete", "repository": repo})
    second = completed.json()["id"]
    s.expected[-1][1]["target"] = second
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/assets", 200,
             {**by_pat, "action": "asset.point", "repository": repo, "target": "latest/one.bin"},
             params={"path": "latest/one.bin"}, json={"artifactId": second})
    history = db_fetch(writer_url(s), "SELECT min(id) AS id FROM arkvory_asset_history WHERE path = 'latest/one.bin'")
    s.change(pat, "POST", f"/api/v1/repositories/{repo}/asset/restore", 200,
             {**by_pat, "action": "asset.restore", "repository": repo, "target": "latest/one.bin"},
             params={"path": "latest/one.bin"}, json={"historyId": history[0]["id"]})
    abandoned = s.change(pat, "POST", f"/api/v1/repositories/{repo}/uploads", 201,
                         {**by_pat, "action": "upload.create", "repository": repo},
                         json={"name": "three.bin", "size": 10}, headers={"Idempotency-Key": "up-2"})
    s.expected[-1][1]["target"] = abandoned.json()["id"]
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/uploads/{abandoned.json()['id']}", 204,
             {**by_pat, "action": "upload.delete", "repository": repo, "target": abandoned.json()["id"]})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/asset", 204,
             {**by_pat, "action": "asset.delete", "repository": repo, "target": "latest/one.bin"},
             params={"path": "latest/one.bin"})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/package", 204,
             {**by_pat, "action": "package.delete", "repository": repo, "target": "g/n/1.0"},
             params={"group": "g", "name": "n", "version": "1.0"})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/artifacts/{second}", 204,
             {**by_pat, "action": "artifact.delete", "repository": repo, "target": second})
    # A managed key made by the session (tied to it), used, then revoked; another adopted.
    key_made = s.change(session, "POST", "/api/v1/keys", 201, {**alice, "action": "key.create"},
                        json={"scopes": [f"write:{repo}"], "label": "deploy"})
    key = s.secret_token(key_made.json()["token"])
    s.expected[-1][1]["target"] = key_made.json()["id"]
    by_key = {"actor_kind": "service", "actor_id": f"service:{key_made.json()['id']}", "actor_name": "deploy",
              "credential_kind": "service_key", "credential_id": key_made.json()["id"]}
    s.change(key, "POST", f"/api/v1/repositories/{repo}/artifacts", 201,
             {**by_key, "action": "artifact.upload", "repository": repo}, params={"name": "k.bin"}, content=b"k")
    s.expected[-1][1]["target"] = s.expected[-1][0].json()["id"]
    s.change(session, "DELETE", f"/api/v1/keys/{key_made.json()['id']}", 204,
             {**alice, "action": "key.revoke", "target": key_made.json()["id"]})
    s.change(session, "DELETE", f"/api/v1/tokens/{made.json()['id']}", 204,
             {**alice, "action": "token.revoke", "target": made.json()["id"]})
    kept = s.change(session, "POST", "/api/v1/keys", 201, {**alice, "action": "key.create"},
                    json={"scopes": ["read:*"], "label": "kept", "password": ALICE_PASSWORD})
    s.secret_token(kept.json()["token"])
    s.expected[-1][1]["target"] = kept.json()["id"]
    s.change(session, "POST", "/api/v1/account/password", 204,
             {**alice, "action": "account.password-change", "target": "alice"},
             json={"oldPassword": ALICE_PASSWORD, "newPassword": ALICE_NEW_PASSWORD})
    s.change(ADMIN_TOKEN, "POST", "/api/v1/accounts/alice/disable", 200,
             {**admin, "action": "account.disable", "target": "alice"})
    s.change(ADMIN_TOKEN, "POST", f"/api/v1/keys/{kept.json()['id']}/adopt", 200,
             {**admin, "action": "key.adopt", "target": kept.json()["id"]}, json={})
    s.change(ADMIN_TOKEN, "POST", "/api/v1/accounts/alice/enable", 200,
             {**admin, "action": "account.enable", "target": "alice"})
    # Tasks, by the admin key (no worker runs here: a queued task is cancelled at once).
    dispatched = s.change(ADMIN_TOKEN, "POST", "/api/v1/tasks", 202, {**admin, "action": "task.dispatch"},
                          json={"kind": "cleanup", "params": {"grace_seconds": 3600}})
    s.expected[-1][1]["target"] = dispatched.json()["id"]
    s.change(ADMIN_TOKEN, "POST", f"/api/v1/tasks/{dispatched.json()['id']}/cancel", 200,
             {**admin, "action": "task.cancel", "target": dispatched.json()["id"]})
    # Sign-up, then a sign-in and sign-out of the new account.
    registered = s.change(None, "POST", "/api/v1/register", 201, {"action": "account.register", "target": "carol",
                          "actor_kind": "account", "actor_name": "carol", "credential_id": None},
                          json={"name": "carol", "password": CAROL_PASSWORD})
    s.expected[-1][1]["actor_id"] = f"account:{registered.json()['id']}"
    carol_in = s.change(None, "POST", "/api/v1/login", 200, {"action": "account.sign-in", "actor_name": "carol"},
                        json={"name": "carol", "password": CAROL_PASSWORD})
    carol_session = s.secret_token(carol_in.json()["token"])
    s.change(carol_session, "POST", "/api/v1/logout", 204, {"action": "account.sign-out", "actor_name": "carol",
             "credential_kind": "session", "credential_id": carol_in.json()["sessionId"]})
    s.change(ADMIN_TOKEN, "DELETE", f"/api/v1/repositories/{repo}", 204,
             {**admin, "action": "repository.delete", "repository": repo, "target": repo}, params={"force": "true"})
    return s


def writer_url(story: Story) -> str:
    return story.writer.env["ARKVORY_DATABASE_URL"]


@pytest.fixture(scope="module")
def story(writer) -> Story:
    return run_story(writer)


def test_every_change_family_makes_exactly_one_entry_with_its_fields(story):
    url = writer_url(story)
    for answer, expect in story.expected:
        found = entries(url, answer.headers["x-request-id"])
        assert len(found) == 1, (expect["action"], found)
        entry = dict(found[0])
        assert entry["outcome"] == "ok" and entry["status"] == answer.status_code, entry
        assert entry["client_address"] == "127.0.0.1", entry
        for field, value in expect.items():
            got = entry[field]
            assert (str(got) if isinstance(got, uuid.UUID) else got) == value, (expect["action"], field, entry)
    # Every action a route records was made above.
    route_actions = {action.name for action in ACTIONS.values()}
    assert route_actions <= {expect["action"] for _, expect in story.expected}


def test_no_secret_anywhere_in_the_audit_table(story):
    # The whole table as text, every column of every row.
    text = "\n".join(r["t"] for r in db_fetch(writer_url(story), "SELECT t::text AS t FROM arkvory_audit t"))
    assert "alice" in text  # the table is not empty, and names are kept
    for secret in story.secrets:
        assert secret not in text, secret
    # Nor a password's hash or salt.
    for row in db_fetch(writer_url(story), "SELECT password_hash, password_salt FROM arkvory_accounts"):
        assert bytes(row["password_hash"]).hex() not in text and bytes(row["password_salt"]).hex() not in text


def test_a_label_holding_a_token_is_not_recorded(writer):
    with writer.client(ADMIN_TOKEN) as client:
        sneaky = client.post("/api/v1/keys", json={"scopes": ["read:*"], "label": f"copy of {ADMIN_TOKEN}"})
        assert sneaky.status_code == 201, sneaky.text
    entry = entries(writer.env["ARKVORY_DATABASE_URL"], sneaky.headers["x-request-id"])[0]
    assert ADMIN_TOKEN not in entry["details"] and "not recorded" in entry["details"]


def test_every_change_route_of_the_writer_has_its_action():
    routes = {(method, route.path) for module in ROUTE_MODULES for route in module.routes
              for method in (route.methods or ()) if method not in ("GET", "HEAD")}
    assert routes - set(ACTIONS) - UNAUDITED == set(), "name the action of each new change route in writer/audit/actions.py"
    assert set(ACTIONS) - routes == set()
    assert set(TOOL_ACTIONS) <= set(ACTION_NAMES)


def test_a_rolled_back_change_leaves_no_entry_and_an_unwritable_entry_rolls_its_change_back(writer):
    url = writer.env["ARKVORY_DATABASE_URL"]
    fail = "CREATE FUNCTION pg_temp_fail() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'injected'; END$$"
    db_execute(url, fail.replace("pg_temp_fail", "audit_test_fail"))
    try:
        # The change's own table refuses at the end of its transaction: no entry.
        db_execute(url, "CREATE CONSTRAINT TRIGGER audit_test_late AFTER INSERT ON arkvory_repositories"
                        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_test_fail()")
        with writer.client(ADMIN_TOKEN) as client:
            refused = client.post("/api/v1/repositories", json={"name": "rolled-back"})
        assert refused.status_code == 500
        db_execute(url, "DROP TRIGGER audit_test_late ON arkvory_repositories")
        assert entries(url, refused.headers["x-request-id"]) == []
        assert not db_fetch(url, "SELECT 1 FROM arkvory_repositories WHERE name = 'rolled-back'")
        # The entry cannot be written: the change does not happen either.
        db_execute(url, "CREATE TRIGGER audit_test_entry BEFORE INSERT ON arkvory_audit"
                        " FOR EACH ROW EXECUTE FUNCTION audit_test_fail()")
        with writer.client(ADMIN_TOKEN) as client:
            refused = client.post("/api/v1/repositories", json={"name": "never-audited"})
            kept_out = client.post("/api/v1/accounts", json={"name": "never-audited", "password": BOB_PASSWORD})
        assert refused.status_code == 500 and kept_out.status_code == 500
        assert not db_fetch(url, "SELECT 1 FROM arkvory_repositories WHERE name = 'never-audited'")
        assert not db_fetch(url, "SELECT 1 FROM arkvory_accounts WHERE name = 'never-audited'")
    finally:
        db_execute(url, "DROP TRIGGER IF EXISTS audit_test_late ON arkvory_repositories")
        db_execute(url, "DROP TRIGGER IF EXISTS audit_test_entry ON arkvory_audit")
        db_execute(url, "DROP FUNCTION audit_test_fail()")
    with writer.client(ADMIN_TOKEN) as client:
        done = client.post("/api/v1/repositories", json={"name": "never-audited"})
    assert done.status_code == 201 and len(entries(url, done.headers["x-request-id"])) == 1


def test_a_replayed_change_adds_no_entry(writer):
    url = writer.env["ARKVORY_DATABASE_URL"]
    with writer.client(ADMIN_TOKEN) as client:
        answers = [client.post("/api/v1/repositories", json={"name": "replayed"}, headers={"Idempotency-Key": "rp"})
                   for _ in range(3)]
    assert [a.status_code for a in answers] == [201] * 3
    assert [len(entries(url, a.headers["x-request-id"])) for a in answers] == [1, 0, 0]
