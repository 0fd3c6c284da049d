"""The audit trail (writer/audit/) on a real writer and PostgreSQL: every change family makes
exactly one entry with the right fields, no secret ever lands in the table, a change rolled
back leaves none and an entry that cannot be written rolls its change back, refusals are
recorded within their bound, the list filters and pages for administrators only, admin tools
record themselves, and the cleanup prunes within its budget.

One writer serves the module (sign-up allowed); each test tells its entries apart by request
id or by names of its own.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid

import httpx
import pytest

from arkvory.writer.app import ROUTE_MODULES
from arkvory.writer.audit.actions import ACTION_NAMES, ACTIONS, TOOL_ACTIONS, UNAUDITED

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, ROOT, db_execute, db_fetch, eventually

pytestmark = pytest.mark.timeout(240)

# Recognizable secrets: none of them may appear anywhere in the audit table.
ALICE_PASSWORD = "alice-Pw-9f3e1c77d2"
ALICE_NEW_PASSWORD = "alice-NewPw-5b8a0e44"
BOB_PASSWORD = "bob-Pw-a1b2c3d4e5f6"
CAROL_PASSWORD = "carol-Pw-77aa88bb99"
BOB_RESET_PASSWORD = "bob-Reset-0f1e2d3c4b5a"


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
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/members/bob", 200,
             {**by_pat, "action": "permission.set", "repository": repo, "target": "bob"}, json={"level": "read"})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/members/bob", 204,
             {**by_pat, "action": "permission.remove", "repository": repo, "target": "bob"})
    s.change(pat, "PUT", f"/api/v1/repositories/{repo}/retention", 200,
             {**by_pat, "action": "retention.set", "repository": repo, "target": repo}, json={"keepNewest": 5})
    s.change(pat, "DELETE", f"/api/v1/repositories/{repo}/retention", 204,
             {**by_pat, "action": "retention.delete", "repository": repo, "target": repo})
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
    s.secrets.append(BOB_RESET_PASSWORD)
    s.change(ADMIN_TOKEN, "POST", "/api/v1/accounts/bob/password", 200,
             {**admin, "action": "account.password-reset", "target": "bob"}, json={"password": BOB_RESET_PASSWORD})
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
    s.change(ADMIN_TOKEN, "DELETE", "/api/v1/accounts/carol", 200,
             {**admin, "action": "account.delete", "target": "carol"})
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
        # (a client each: the server closes a connection after its 500)
        with writer.client(ADMIN_TOKEN) as client:
            refused = client.post("/api/v1/repositories", json={"name": "never-audited"})
        with writer.client(ADMIN_TOKEN) as client:
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


# -- refusals -----------------------------------------------------------------------------------


def refusals(url: str, request_id: str) -> list:
    return eventually(lambda: entries(url, request_id), f"the refusal {request_id} recorded")


def test_failed_sign_ins_and_permission_refusals_are_recorded_and_nothing_else(writer):
    url = writer.env["ARKVORY_DATABASE_URL"]
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/accounts", json={"name": "rita", "password": BOB_PASSWORD}).status_code == 201
    typed_as_name = "Rita-Password-typed-in-the-name-field"
    with writer.client(None) as anonymous:
        wrong = anonymous.post("/api/v1/login", json={"name": "RITA", "password": "not her password"})
        unknown = anonymous.post("/api/v1/login", json={"name": typed_as_name, "password": "whatever"})
        no_credentials = anonymous.post("/api/v1/repositories", json={"name": "anon"})
    with writer.client(READER_TOKEN) as reader:
        forbidden = reader.post("/api/v1/repositories", json={"name": "not-yours"})
    assert (wrong.status_code, unknown.status_code, no_credentials.status_code, forbidden.status_code) == (401, 401, 401, 403)
    [entry] = refusals(url, wrong.headers["x-request-id"])
    assert (entry["action"], entry["outcome"], entry["status"], entry["target"]) == ("account.sign-in", "refused", 401, "rita")
    assert (entry["actor_kind"], entry["actor_id"], entry["client_address"]) == ("anonymous", "anonymous", "127.0.0.1")
    [entry] = refusals(url, unknown.headers["x-request-id"])
    assert entry["target"] is None  # a name that is no account's is never kept: it may be a password
    [entry] = refusals(url, forbidden.headers["x-request-id"])
    assert (entry["action"], entry["status"], entry["actor_id"], entry["actor_name"]) == ("repository.create", 403, "key:reader", "reader")
    # A change without credentials is the client's mistake: not recorded.
    assert entries(url, no_credentials.headers["x-request-id"]) == []
    text = "\n".join(r["t"] for r in db_fetch(url, "SELECT t::text AS t FROM arkvory_audit t"))
    assert typed_as_name not in text and "not her password" not in text


def test_refusals_are_recorded_within_their_bound_and_the_rest_counted(writer):
    url = writer.env["ARKVORY_DATABASE_URL"]
    with writer.client(OTHER_TOKEN) as other:
        answers = [other.post("/api/v1/repositories", json={"name": f"flood-{n}"}) for n in range(30)]
    assert {a.status_code for a in answers} == {403}
    ids = [a.headers["x-request-id"] for a in answers]

    def recorded() -> list:
        rows = db_fetch(url, "SELECT request_id, details FROM arkvory_audit WHERE request_id = ANY($1::text[])", ids)
        return rows if len(rows) >= 20 else []

    rows = eventually(recorded, "the first refusals recorded")
    # 20 at once, one more each 30 s: a fast loop gets 20 (21 if it took over 30 s).
    assert 20 <= len(rows) <= 21
    assert {r["request_id"] for r in rows} == set(ids[:len(rows)])
    with writer.client(ADMIN_TOKEN) as admin:
        metrics = admin.get("/health/metrics").text
    assert 'arkvory_audit_refusals_total{recorded="no"}' in metrics


# -- the list -----------------------------------------------------------------------------------


def listing(writer, token: str | None = ADMIN_TOKEN, **query) -> httpx.Response:
    with writer.client(token) as client:
        return client.get("/api/v1/audit", params=query)


def everything(writer, **query) -> list[dict]:
    items, cursor = [], None
    for _ in range(200):
        answer = listing(writer, **query, **({"cursor": cursor} if cursor else {}))
        assert answer.status_code == 200, answer.text
        items += answer.json()["items"]
        cursor = answer.json()["nextCursor"]
        if cursor is None:
            return items
    raise AssertionError("the list did not end")


def test_the_list_filters_and_pages(writer, story):
    repo = story.expected[3][1]["repository"]
    alice = everything(writer, principal="ALICE", limit="3")
    assert alice and {e["actor"]["name"] for e in alice} == {"alice"}
    # Newest first, no entry twice across pages.
    assert [e["id"] for e in alice] == sorted({e["id"] for e in alice}, reverse=True)
    by_id = everything(writer, principal=alice[0]["actor"]["id"])
    assert [e["id"] for e in by_id] == [e["id"] for e in alice]
    oldest = everything(writer, principal="alice", order="oldest", limit="2")
    assert [e["id"] for e in oldest] == [e["id"] for e in reversed(alice)]
    in_repo = everything(writer, repository=repo)
    assert {e["repository"] for e in in_repo} == {repo} and len(in_repo) >= 15
    family = everything(writer, action="repository", repository=repo)
    assert {e["action"] for e in family} == {"repository.create", "repository.update", "repository.delete"}
    package = everything(writer, target="g/n/1.0", repository=repo)
    assert [e["action"] for e in package] == ["package.delete", "package.register"]
    one = everything(writer, action="account.sign-out")
    assert one and all(e["action"] == "account.sign-out" for e in one)
    first = next(e for e in package if e["action"] == "package.register")
    assert first["actor"]["credentialKind"] == "pat" and first["clientAddress"] == "127.0.0.1"
    assert first["details"]["version"] == "1.0" and first["requestId"]
    # A time window: from the package's registration to (not including) its deletion.
    window = everything(writer, repository=repo, since=first["at"], until=package[0]["at"])
    assert window[-1]["id"] == first["id"] and package[0]["id"] not in {e["id"] for e in window}
    assert everything(writer, repository=repo, since="2000-01-01T00:00:00", until="2000-01-02T00:00:00Z") == []
    refused = everything(writer, outcome="refused")
    assert all(e["outcome"] == "refused" for e in refused)


@pytest.mark.parametrize("query, word", [
    ({"sha256": "x"}, "'sha256'"),
    ({"action": "repository.eat"}, "'action'"),
    ({"since": "yesterday"}, "'since'"),
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "'until'"),
    ({"order": "random"}, "'order'"),
    ({"outcome": "maybe"}, "'outcome'"),
    ({"limit": "0"}, "'limit'"),
    ({"cursor": "not-a-cursor"}, "'cursor'"),
    ({"target": "x" * 501}, "'target'"),
])
def test_the_list_refuses_what_it_does_not_know(writer, query, word):
    answer = listing(writer, **query)
    assert answer.status_code == 400 and word in answer.json()["message"], answer.text


def test_the_list_is_for_administrators_only(writer):
    assert listing(writer, None).status_code == 401
    assert listing(writer, READER_TOKEN).status_code == 403
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/accounts", json={"name": "vera", "password": BOB_PASSWORD}).status_code == 201
    with writer.client(None) as anonymous:
        token = anonymous.post("/api/v1/login", json={"name": "vera", "password": BOB_PASSWORD}).json()["token"]
    assert listing(writer, token).status_code == 403
    with writer.client(ADMIN_TOKEN) as client:
        repeated = client.get("/api/v1/audit?action=task&action=key")
    assert repeated.status_code == 400 and "more than once" in repeated.json()["message"]


# -- admin tools --------------------------------------------------------------------------------


def test_admin_tools_record_themselves_as_the_actor(module_cluster, writer):
    url = writer.env["ARKVORY_DATABASE_URL"]
    made = subprocess.run(
        [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "create-user", "tooled"],
        env=module_cluster.base_env(), cwd=ROOT, input=BOB_PASSWORD + "\n", capture_output=True, text=True, timeout=60,
    )
    assert made.returncode == 0, made.stderr
    [entry] = db_fetch(url, "SELECT * FROM arkvory_audit WHERE action = 'account.create' AND target = 'tooled'")
    assert entry["actor_kind"] == "tool" and entry["actor_id"] == "tool:arkvory admin create-user"
    assert "@" in entry["actor_name"] and entry["client_address"] is None and entry["status"] is None
    assert BOB_PASSWORD not in str(dict(entry))
    listed = everything(writer, principal="tool:arkvory admin create-user")
    assert [e["target"] for e in listed] == ["tooled"]


# -- retention ----------------------------------------------------------------------------------


def test_the_cleanup_prunes_entries_past_the_retention_within_its_budget(cluster):
    from .worker_harness import dispatch, start_worker, wait_task

    url = cluster.database_url
    cluster.writer(ARKVORY_CLEANUP_INTERVAL="off").wait_ready()
    start_worker(cluster, real=True, ARKVORY_AUDIT_RETENTION="30d").wait_active()
    insert = ("INSERT INTO arkvory_audit (at, actor_kind, actor_id, action, outcome)"
              " SELECT now() - make_interval(days => $1), 'tool', 'tool:test', 'policy.reset', 'ok'"
              " FROM generate_series(1, $2)")
    db_execute(url, insert, 40, 30)  # past the 30 days
    db_execute(url, insert, 20, 5)  # within them

    def ages() -> tuple[int, int]:
        rows = db_fetch(url, "SELECT count(*) FILTER (WHERE at < now() - interval '30 days') AS old,"
                             " count(*) FILTER (WHERE at >= now() - interval '30 days') AS young FROM arkvory_audit")
        return rows[0]["old"], rows[0]["young"]

    stopped = wait_task(url, dispatch(url, "cleanup", {"grace_seconds": 3600}, budget={"max_items": 20}),
                        ("failed", "completed"))
    assert stopped["status"] == "failed" and stopped["error_message"] == "max_items exceeded: 21 > 20", stopped
    assert stopped["usage"]["items"] == 20 and ages() == (10, 5)
    done = wait_task(url, dispatch(url, "cleanup", {"grace_seconds": 3600}), ("failed", "completed"))
    assert done["status"] == "completed" and done["result"]["steps"]["audit"] == {"pruned": 10}, done
    assert ages() == (0, 5)
